/* metrics.c — the TorchTitan-style step line, metrics.jsonl and TensorBoard
 * scalars (see metrics.h and docs/metrics.md). */
#include "telemetry/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <unistd.h>

#include "telemetry/log.h"
#include "telemetry/tb_writer.h"

struct metrics_logger {
    FILE *jsonl;
    char *jsonl_path;
    tb_writer *tb;
    int color;
    int jsonl_warned, tb_warned;
};

/* TorchTitan's colours (torchtitan/tools/utils.py Color). */
#define C_RED "\033[31m"
#define C_GREEN "\033[32m"
#define C_YELLOW "\033[33m"
#define C_BLUE "\033[34m"
#define C_MAGENTA "\033[35m"
#define C_CYAN "\033[36m"
#define C_ORANGE "\033[38;2;180;60;0m"
#define C_TURQUOISE "\033[38;2;54;234;195m"
#define C_RESET "\033[39m"

static double wall_now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

static char *join_path(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 2);
    if (!p) return NULL;
    memcpy(p, a, la);
    size_t n = la;
    if (la && a[la - 1] != '/') p[n++] = '/';
    memcpy(p + n, b, lb + 1);
    return p;
}

/* ---- formatting ----------------------------------------------------------- */

char *metrics_format_grouped(char *out, size_t outlen, double v, int decimals) {
    if (outlen == 0) return out;
    if (isnan(v)) {
        snprintf(out, outlen, "nan");
        return out;
    }
    if (isinf(v)) {
        snprintf(out, outlen, v < 0 ? "-inf" : "inf");
        return out;
    }
    char plain[400];
    snprintf(plain, sizeof plain, "%.*f", decimals < 0 ? 0 : decimals, v);
    const char *digits = plain[0] == '-' ? plain + 1 : plain;
    size_t int_len = strcspn(digits, ".");
    char grouped[520];
    size_t n = 0;
    if (plain[0] == '-') grouped[n++] = '-';
    for (size_t i = 0; i < int_len; i++) {
        if (i > 0 && (int_len - i) % 3 == 0) grouped[n++] = ',';
        grouped[n++] = digits[i];
    }
    snprintf(grouped + n, sizeof grouped - n, "%s", digits + int_len);
    snprintf(out, outlen, "%s", grouped);
    return out;
}

/* Shortest decimal that reads back as the same double; null for NaN/inf. */
static void json_number(FILE *f, double v) {
    if (!isfinite(v)) {
        fputs("null", f);
        return;
    }
    char b[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, v);
        if (strtod(b, NULL) == v) break;
    }
    /* keep floats recognisable as floats: 2 -> 2.0 */
    if (!strpbrk(b, ".eE")) strcat(b, ".0");
    fputs(b, f);
}

static void jsonl_failed(metrics_logger *m) {
    if (!m->jsonl_warned) log_warn("cannot write %s: %s", m->jsonl_path, strerror(errno));
    m->jsonl_warned = 1;
}

static void tb_failed(metrics_logger *m) {
    if (!m->tb_warned) log_warn("cannot write TensorBoard file %s: %s", tb_writer_path(m->tb), strerror(errno));
    m->tb_warned = 1;
}

/* ---- resume: drop records of steps that will be run again ------------------ */

static int truncate_jsonl(const char *path, int64_t first_step, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return 0;
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap + 1);
    size_t got;
    while (text && (got = fread(text + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *t = realloc(text, cap * 2 + 1);
            if (!t) {
                free(text);
                text = NULL;
                break;
            }
            text = t;
            cap *= 2;
        }
    }
    int read_err = ferror(f);
    fclose(f);
    if (!text || read_err) {
        free(text);
        snprintf(err, errlen, "cannot read %s", path);
        return -1;
    }
    text[len] = '\0';

    size_t plen = strlen(path) + 8;
    char *tmp = malloc(plen);
    if (!tmp) {
        free(text);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(tmp, plen, "%s.tmp", path);
    FILE *out = fopen(tmp, "wb");
    if (!out) {
        snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        free(tmp);
        free(text);
        return -1;
    }
    size_t kept = 0, dropped = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        if (!nl) {
            dropped++;
            break;
        } /* torn last line */
        *nl = '\0';
        json_error_t jerr;
        json_t *obj = json_loads(line, 0, &jerr);
        json_t *st = obj && json_is_object(obj) ? json_object_get(obj, "step") : NULL;
        if (st && json_is_integer(st) && json_integer_value(st) < first_step) {
            fputs(line, out);
            fputc('\n', out);
            kept++;
        } else if (line[0]) {
            dropped++;
        }
        json_decref(obj);
        line = nl + 1;
    }
    free(text);
    int bad = fflush(out) != 0 || ferror(out);
    if (fclose(out) != 0) bad = 1;
    if (bad || rename(tmp, path) != 0) {
        snprintf(err, errlen, "cannot rewrite %s: %s", path, strerror(errno));
        remove(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    if (dropped && kept)
        log_info("metrics: kept %zu records of %s before step %" PRId64 ", dropped %zu", kept, path, first_step,
                 dropped);
    else if (dropped && first_step == 1)
        log_info("metrics: a fresh run starts a new %s (the %zu records of an earlier run there are replaced)", path,
                 dropped);
    return 0;
}

/* ---- open / close --------------------------------------------------------- */

metrics_logger *metrics_open_at(const char *dump_folder, int enable_tensorboard, const char *tb_folder, int color,
                                int64_t first_step, char *err, size_t errlen) {
    if (!dump_folder || !dump_folder[0]) dump_folder = ".";
    if (tb_make_dirs(dump_folder) != 0) {
        snprintf(err, errlen, "cannot create dump folder %s: %s", dump_folder, strerror(errno));
        return NULL;
    }
    metrics_logger *m = calloc(1, sizeof *m);
    if (!m || !(m->jsonl_path = join_path(dump_folder, "metrics.jsonl"))) {
        free(m);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    m->color = color;
    if (first_step > 0 && truncate_jsonl(m->jsonl_path, first_step, err, errlen) != 0) {
        metrics_close(m);
        return NULL;
    }
    m->jsonl = fopen(m->jsonl_path, "a");
    if (!m->jsonl) {
        snprintf(err, errlen, "cannot open %s: %s", m->jsonl_path, strerror(errno));
        metrics_close(m);
        return NULL;
    }
    if (enable_tensorboard) {
        if (!tb_folder || !tb_folder[0]) tb_folder = "tb";
        char *dir = tb_folder[0] == '/' ? strdup(tb_folder) : join_path(dump_folder, tb_folder);
        if (!dir) {
            snprintf(err, errlen, "out of memory");
            metrics_close(m);
            return NULL;
        }
        m->tb = tb_writer_open(dir, err, errlen);
        free(dir);
        if (!m->tb) {
            metrics_close(m);
            return NULL;
        }
        if (first_step > 0 && tb_writer_session_start(m->tb, first_step, -1) != 0) {
            snprintf(err, errlen, "cannot write TensorBoard file %s: %s", tb_writer_path(m->tb), strerror(errno));
            metrics_close(m);
            return NULL;
        }
        log_info("TensorBoard logging enabled. Logs will be saved at %s", tb_writer_path(m->tb));
    }
    return m;
}

metrics_logger *metrics_open(const char *dump_folder, int enable_tensorboard, const char *tb_folder, int color,
                             char *err, size_t errlen) {
    return metrics_open_at(dump_folder, enable_tensorboard, tb_folder, color, 0, err, errlen);
}

const char *metrics_jsonl_path(const metrics_logger *m) { return m->jsonl_path; }
const char *metrics_tb_path(const metrics_logger *m) { return m->tb ? tb_writer_path(m->tb) : NULL; }

void metrics_close(metrics_logger *m) {
    if (!m) return;
    if (m->jsonl && fclose(m->jsonl) != 0) jsonl_failed(m);
    if (m->tb && tb_writer_close(m->tb) != 0 && !m->tb_warned)
        log_warn("TensorBoard file was not completely written: %s", strerror(errno));
    free(m->jsonl_path);
    free(m);
}

/* ---- logging -------------------------------------------------------------- */

void metrics_log_step(metrics_logger *m, const metrics_step *s) {
    double wt = wall_now();
    const int c = m->color;
    char tps[64], tflops[64], line[768], computed[64] = "";
    metrics_format_grouped(tps, sizeof tps, s->tps, 0);
    metrics_format_grouped(tflops, sizeof tflops, s->tflops, 2);
    const int has_computed = s->mfu_computed > 0.0; /* 0 or NaN: not known */
    if (has_computed) snprintf(computed, sizeof computed, "  mfu(computed): %.2f%%", s->mfu_computed);
    snprintf(line, sizeof line,
             "%sstep: %2" PRId64 "  "
             "%sloss: %7.4f  "
             "%sgrad_norm: %7.4f  "
             "%slr: %.4e  "
             "%smemory: %5.2fGiB(%.2f%%)  "
             "%stps: %s  "
             "%stflops: %s  "
             "%smfu: %.2f%%%s%s",
             c ? C_RED : "", s->step, c ? C_GREEN : "", s->loss, c ? C_ORANGE : "", s->grad_norm, c ? C_YELLOW : "",
             s->lr, c ? C_TURQUOISE : "", s->mem_gib, s->mem_pct, c ? C_BLUE : "", tps, c ? C_CYAN : "", tflops,
             c ? C_MAGENTA : "", s->mfu, computed, c ? C_RESET : "");
    log_info("%s", line);

    if (m->jsonl) {
        FILE *f = m->jsonl;
        fprintf(f, "{\"step\":%" PRId64 ",\"loss\":", s->step);
        json_number(f, s->loss);
        fputs(",\"max_loss\":", f);
        json_number(f, s->max_loss);
        fputs(",\"grad_norm\":", f);
        json_number(f, s->grad_norm);
        fputs(",\"lr\":", f);
        json_number(f, s->lr);
        fputs(",\"tps\":", f);
        json_number(f, s->tps);
        fputs(",\"tflops\":", f);
        json_number(f, s->tflops);
        fputs(",\"mfu\":", f);
        json_number(f, s->mfu);
        if (has_computed) {
            fputs(",\"tflops_computed\":", f);
            json_number(f, s->tflops_computed);
            fputs(",\"mfu_computed\":", f);
            json_number(f, s->mfu_computed);
        }
        fputs(",\"mem_gib\":", f);
        json_number(f, s->mem_gib);
        fputs(",\"mem_pct\":", f);
        json_number(f, s->mem_pct);
        fputs(",\"step_time_s\":", f);
        json_number(f, s->step_time_s);
        fputs(",\"data_time_s\":", f);
        json_number(f, s->data_time_s);
        fputs(",\"host_waits\":", f);
        json_number(f, s->host_waits);
        fprintf(f, ",\"tokens_seen\":%" PRId64 ",\"time\":", s->tokens_seen);
        json_number(f, wt);
        fputs("}\n", f);
        if (fflush(f) != 0 || ferror(f)) jsonl_failed(m);
    }

    if (m->tb) {
        const char *tags[15];
        float vals[15];
        int n = 0;
#define ADD(tag, v) (tags[n] = (tag), vals[n] = (float)(v), n++)
        ADD("loss_metrics/global_avg_loss", s->loss);
        if (!isnan(s->max_loss) || isnan(s->loss)) ADD("loss_metrics/global_max_loss", s->max_loss);
        ADD("grad_norm", s->grad_norm);
        ADD("lr", s->lr);
        ADD("throughput(tps)", s->tps);
        ADD("tflops", s->tflops);
        ADD("mfu(%)", s->mfu);
        if (has_computed) {
            ADD("tflops_computed", s->tflops_computed);
            ADD("mfu_computed(%)", s->mfu_computed);
        }
        ADD("time_metrics/end_to_end(s)", s->step_time_s);
        ADD("time_metrics/data_loading(s)", s->data_time_s);
        ADD("time_metrics/data_loading(%)", s->step_time_s > 0 ? 100.0 * s->data_time_s / s->step_time_s : 0.0);
        ADD("memory/max_active(GiB)", s->mem_gib);
        ADD("memory/max_active(%)", s->mem_pct);
        ADD("n_tokens_seen", (double)s->tokens_seen);
#undef ADD
        if (tb_writer_add_scalars(m->tb, s->step, wt, n, tags, vals) != 0) tb_failed(m);
    }
}

void metrics_log_validation(metrics_logger *m, int64_t step, double loss, double step_time_s) {
    double wt = wall_now();
    const int c = m->color;
    log_info("%svalidate step: %2" PRId64 "  %sloss: %7.4f  %stime: %.2fs%s", c ? C_YELLOW : "", step, c ? C_GREEN : "",
             loss, c ? C_BLUE : "", step_time_s, c ? C_RESET : "");
    if (m->jsonl) {
        FILE *f = m->jsonl;
        fprintf(f, "{\"step\":%" PRId64 ",\"validation_loss\":", step);
        json_number(f, loss);
        fputs(",\"validation_time_s\":", f);
        json_number(f, step_time_s);
        fputs(",\"time\":", f);
        json_number(f, wt);
        fputs("}\n", f);
        if (fflush(f) != 0 || ferror(f)) jsonl_failed(m);
    }
    if (m->tb && tb_writer_add_scalar(m->tb, step, wt, "validation_metrics/loss", (float)loss) != 0) tb_failed(m);
}

void metrics_log_mix(metrics_logger *m, int64_t step, const char *mix_json, int n, const double *shares) {
    const double wt = wall_now();
    if (m->jsonl) {
        FILE *f = m->jsonl;
        fprintf(f, "{\"step\":%" PRId64 ",\"data_mix\":%s,\"time\":", step, mix_json);
        json_number(f, wt);
        fputs("}\n", f);
        if (fflush(f) != 0 || ferror(f)) jsonl_failed(m);
    }
    for (int i = 0; m->tb && i < n; i++) {
        char tag[64];
        snprintf(tag, sizeof tag, "data_mix/share_%d", i);
        if (tb_writer_add_scalar(m->tb, step, wt, tag, (float)shares[i]) != 0) {
            tb_failed(m);
            break;
        }
    }
}

/* ---- memory --------------------------------------------------------------- */

int64_t metrics_peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
    return (int64_t)ru.ru_maxrss * 1024; /* Linux reports kilobytes */
}

double metrics_gpu_peak_bf16(const char *device_name) {
    /* the more specific names first: "H100 NVL" and "H100 PCIe" before "H100" */
    static const struct {
        const char *name;
        double flops;
    } table[] = {
        {"A100", 312e12}, {"H100 NVL", 835e12}, {"H100 PCIe", 756e12}, {"H100", 989e12},
        {"H200", 989e12}, {"B200", 2.25e15},    {"L40S", 362e12},
    };
    if (!device_name) return 0.0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strstr(device_name, table[i].name)) return table[i].flops;
    return 0.0;
}

int64_t metrics_host_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return -1;
    return (int64_t)pages * (int64_t)page;
}

void metrics_log_peak_rss(void) {
    int64_t rss = metrics_peak_rss_bytes(), host = metrics_host_memory_bytes();
    if (rss < 0) return;
    double gib = (double)rss / (1024.0 * 1024.0 * 1024.0);
    if (host > 0)
        log_info("peak resident memory: %.2f GiB (%.2f%% of host memory)", gib, 100.0 * (double)rss / (double)host);
    else log_info("peak resident memory: %.2f GiB", gib);
}
