/* hw.c — hardware profiles: read, list and write (hw.h). */
#include "plan/hw.h"

#include "config/config.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/toml.h"
#include "util/err.h"

#define GIB 1073741824.0 /* memory sizes are GiB in the file, bytes in plan_hw */

typedef enum { KIND_STRING, KIND_NUMBER, KIND_INT, KIND_BOOL } hw_kind;

/* What a value may be: rates and sizes that everything divides by must be > 0;
 * an fp8 rate of 0 says "no fp8" and a reserve may be 0; efficiencies are
 * fractions of a peak, so above 1 is a unit mistake rather than a fast device. */
typedef enum { RANGE_ANY, RANGE_POSITIVE, RANGE_NONNEG, RANGE_FRACTION, RANGE_FRACTION0, RANGE_COUNT } hw_range;

typedef struct {
    const char *key;
    hw_kind kind;
    hw_range range;
    size_t off;   /* into plan_hw */
    size_t cap;   /* strings: the buffer's size */
    double unit;  /* struct value = file value x unit */
    int optional; /* may be left out (hw.h says which and why) */
} hw_key;

#define HW_STR(k, f, r)                                                                                                \
    { k, KIND_STRING, r, offsetof(plan_hw, f), sizeof(((plan_hw *)0)->f), 1.0, 0 }
#define HW_NUM(k, f, r, u)                                                                                             \
    { k, KIND_NUMBER, r, offsetof(plan_hw, f), 0, u, 0 }

/* The file's keys, in the order plan_hw_write writes them. */
static const hw_key hw_keys[] = {
    HW_STR("name", name, RANGE_POSITIVE), /* positive: not empty */
    HW_STR("description", description, RANGE_ANY),
    HW_NUM("peak_bf16_flops", peak_bf16_flops, RANGE_POSITIVE, 1.0),
    HW_NUM("peak_fp8_flops", peak_fp8_flops, RANGE_NONNEG, 1.0),
    HW_NUM("peak_fp32_flops", peak_fp32_flops, RANGE_POSITIVE, 1.0),
    HW_NUM("memory_gib", memory_bytes, RANGE_POSITIVE, GIB),
    HW_NUM("memory_bandwidth", memory_bandwidth, RANGE_POSITIVE, 1.0),
    HW_NUM("intra_node_bandwidth", intra_node_bandwidth, RANGE_POSITIVE, 1.0),
    HW_NUM("inter_node_bandwidth", inter_node_bandwidth, RANGE_POSITIVE, 1.0),
    {"gpus_per_node", KIND_INT, RANGE_COUNT, offsetof(plan_hw, gpus_per_node), 0, 1.0, 0},
    HW_NUM("gemm_efficiency", gemm_efficiency, RANGE_FRACTION, 1.0),
    HW_NUM("fp8_gemm_efficiency", fp8_gemm_efficiency, RANGE_FRACTION0, 1.0),
    HW_NUM("attention_efficiency", attention_efficiency, RANGE_FRACTION, 1.0),
    HW_NUM("comm_efficiency", comm_efficiency, RANGE_FRACTION, 1.0),
    HW_NUM("inter_node_comm_efficiency", inter_node_comm_efficiency, RANGE_FRACTION, 1.0),
    HW_NUM("memory_efficiency", memory_efficiency, RANGE_FRACTION, 1.0),
    HW_NUM("reserved_memory_gib", reserved_bytes, RANGE_NONNEG, GIB),
    {"nvswitch", KIND_BOOL, RANGE_ANY, offsetof(plan_hw, nvswitch), 0, 1.0, 1},
};
enum { HW_NKEYS = (int)(sizeof hw_keys / sizeof hw_keys[0]) };

/* Devices per node beyond this are a typo (and would overflow rank arithmetic). */
#define HW_MAX_PER_NODE 65536

enum { HW_MAX_FILE = 1 << 20, HW_MAX_PROFILES = 256 };

static double *num_field(plan_hw *hw, const hw_key *k) { return (double *)((char *)hw + k->off); }
static double num_value(const plan_hw *hw, const hw_key *k) { return *(const double *)((const char *)hw + k->off); }

/* Why a number (in file units) is not acceptable for k, or NULL. */
static const char *range_problem(const hw_key *k, double v) {
    if (!isfinite(v)) return "must be a finite number";
    switch (k->range) {
    case RANGE_POSITIVE: return v > 0 ? NULL : "must be > 0";
    case RANGE_NONNEG: return v >= 0 ? NULL : "must be >= 0";
    case RANGE_FRACTION: return v > 0 && v <= 1 ? NULL : "must be a fraction in (0, 1]";
    case RANGE_FRACTION0: return v >= 0 && v <= 1 ? NULL : "must be a fraction in [0, 1]";
    case RANGE_COUNT: return v >= 1 && v <= HW_MAX_PER_NODE ? NULL : "must be between 1 and 65536";
    case RANGE_ANY: return NULL;
    }
    return NULL;
}

/* The known key nearest to `key`, or NULL when none is close enough to be a typo. */
static const char *nearest_key(const char *key) {
    size_t best = (size_t)-1;
    const char *which = NULL;
    for (int i = 0; i < HW_NKEYS; i++) {
        size_t d = cfg_edit_distance(key, hw_keys[i].key);
        if (d < best) {
            best = d;
            which = hw_keys[i].key;
        }
    }
    return best <= strlen(key) / 3 + 2 ? which : NULL;
}

static const char *article(const char *noun) { return strchr("aeiou", noun[0]) ? "an" : "a"; }

static char *read_file(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        util_set_err(err, errlen, "cannot open hardware profile %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(HW_MAX_FILE + 1);
    if (!buf) {
        fclose(f);
        util_set_err(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    size_t n = fread(buf, 1, HW_MAX_FILE + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        util_set_err(err, errlen, "cannot read hardware profile %s", path);
        return NULL;
    }
    if (n > HW_MAX_FILE) {
        free(buf);
        util_set_err(err, errlen, "%s: larger than %d bytes; a hardware profile is a few lines", path, HW_MAX_FILE);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* One root entry into hw; 0 or -1 with err naming path:line and the key. */
static int take_entry(const char *path, const toml_entry *e, const hw_key *k, plan_hw *hw, char *err, size_t errlen) {
    const toml_value *v = e->value;
    const char *tn = toml_type_name(v->type);
    if (k->kind == KIND_STRING) {
        if (v->type != TOML_STRING) {
            util_set_err(err, errlen, "%s:%d: %s must be a string, not %s %s", path, e->line, k->key, article(tn), tn);
            return -1;
        }
        if (strlen(v->u.s.ptr) != v->u.s.len || v->u.s.len >= k->cap) {
            util_set_err(err, errlen, "%s:%d: %s must be at most %zu bytes without NUL characters", path, e->line,
                         k->key, k->cap - 1);
            return -1;
        }
        if (k->range == RANGE_POSITIVE && v->u.s.len == 0) {
            util_set_err(err, errlen, "%s:%d: %s must not be empty", path, e->line, k->key);
            return -1;
        }
        memcpy((char *)hw + k->off, v->u.s.ptr, v->u.s.len + 1);
        return 0;
    }
    if (k->kind == KIND_BOOL) {
        if (v->type != TOML_BOOLEAN) {
            util_set_err(err, errlen, "%s:%d: %s must be true or false, not %s %s", path, e->line, k->key, article(tn),
                         tn);
            return -1;
        }
        *(int *)((char *)hw + k->off) = v->u.b != 0;
        return 0;
    }
    double x;
    if (k->kind == KIND_INT) {
        if (v->type != TOML_INTEGER) {
            util_set_err(err, errlen, "%s:%d: %s must be an integer, not %s %s", path, e->line, k->key, article(tn),
                         tn);
            return -1;
        }
        x = (double)v->u.i;
    } else if (v->type == TOML_INTEGER) {
        x = (double)v->u.i; /* "memory_gib = 80" is a number like any other */
    } else if (v->type == TOML_FLOAT) {
        x = v->u.f;
    } else {
        util_set_err(err, errlen, "%s:%d: %s must be a number, not %s %s", path, e->line, k->key, article(tn), tn);
        return -1;
    }
    const char *why = range_problem(k, x);
    if (why) {
        util_set_err(err, errlen, "%s:%d: %s %s (got %g)", path, e->line, k->key, why, x);
        return -1;
    }
    if (k->kind == KIND_INT) hw->gpus_per_node = (int)v->u.i;
    else *num_field(hw, k) = x * k->unit;
    return 0;
}

/* Checks between keys, once each is valid on its own. */
static const char *cross_problem(const plan_hw *hw) {
    if (hw->reserved_bytes >= hw->memory_bytes) return "reserved_memory_gib must be less than memory_gib";
    return NULL;
}

static int load_file(const char *path, plan_hw *out, char *err, size_t errlen) {
    if (strlen(path) >= sizeof out->path) {
        util_set_err(err, errlen, "hardware profile path longer than %zu bytes: %.64s...", sizeof out->path - 1, path);
        return -1;
    }
    size_t len = 0;
    char *text = read_file(path, &len, err, errlen);
    if (!text) return -1;
    char perr[512];
    toml_value *root = toml_parse(text, len, perr, sizeof perr);
    free(text);
    if (!root) {
        util_set_err(err, errlen, "%s:%s", path, perr);
        return -1;
    }
    plan_hw hw;
    memset(&hw, 0, sizeof hw);
    int seen[HW_NKEYS] = {0}, rc = 0, reserved_line = 0;
    for (size_t i = 0; i < root->u.tab.n && rc == 0; i++) {
        const toml_entry *e = &root->u.tab.entries[i];
        int which = -1;
        for (int j = 0; j < HW_NKEYS; j++)
            if (strlen(e->key) == e->key_len && !strcmp(e->key, hw_keys[j].key)) which = j;
        if (which < 0) {
            const char *near = nearest_key(e->key);
            if (e->value->type == TOML_TABLE)
                util_set_err(err, errlen, "%s:%d: unknown table [%s]: a hardware profile is one flat table of keys",
                             path, e->line, e->key);
            else if (near)
                util_set_err(err, errlen, "%s:%d: unknown key '%s' (did you mean %s?)", path, e->line, e->key, near);
            else
                util_set_err(err, errlen, "%s:%d: unknown key '%s' (configs/hardware/h100-sxm.toml shows every key)",
                             path, e->line, e->key);
            rc = -1;
            break;
        }
        seen[which] = 1;
        if (hw_keys[which].off == offsetof(plan_hw, reserved_bytes)) reserved_line = e->line;
        rc = take_entry(path, e, &hw_keys[which], &hw, err, errlen);
    }
    toml_free(root);
    if (rc) return -1;

    char missing[512] = "";
    int nmissing = 0;
    for (int j = 0; j < HW_NKEYS; j++)
        if (!seen[j] && !hw_keys[j].optional) {
            size_t used = strlen(missing);
            snprintf(missing + used, sizeof missing - used, "%s%s", nmissing ? ", " : "", hw_keys[j].key);
            nmissing++;
        }
    if (nmissing) {
        util_set_err(err, errlen, "%s: missing key%s %s (every key of a hardware profile is required)", path,
                     nmissing > 1 ? "s" : "", missing);
        return -1;
    }
    const char *why = cross_problem(&hw);
    if (why) {
        util_set_err(err, errlen, "%s:%d: %s (%g >= %g)", path, reserved_line, why, hw.reserved_bytes / GIB,
                     hw.memory_bytes / GIB);
        return -1;
    }
    snprintf(hw.path, sizeof hw.path, "%s", path);
    *out = hw;
    return 0;
}

/* ---- the search path ------------------------------------------------------ */

typedef struct {
    const char *dir;
    int from_env; /* an error names the variable it came from */
} hw_dir;

static int search_dirs(hw_dir *d) {
    int n = 0;
    const char *env = getenv("TETRA_HARDWARE_DIR");
    if (env && *env) d[n++] = (hw_dir){env, 1};
    d[n++] = (hw_dir){"configs/hardware", 0};
#ifdef TETRA_SOURCE_DIR
    d[n++] = (hw_dir){TETRA_SOURCE_DIR "/configs/hardware", 0};
#endif
    return n;
}

static int is_dir(const char *path, struct stat *st) { return stat(path, st) == 0 && S_ISDIR(st->st_mode); }

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The profile names in dir, sorted, joined with ", " into buf. -1 when dir cannot be read. */
static int list_dir(const char *dir, char *buf, size_t n) {
    if (n) buf[0] = 0;
    DIR *dp = opendir(dir);
    if (!dp) return -1;
    char *names[HW_MAX_PROFILES];
    int count = 0;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL && count < HW_MAX_PROFILES) {
        size_t len = strlen(de->d_name);
        if (de->d_name[0] == '.' || len <= 5 || strcmp(de->d_name + len - 5, ".toml") != 0) continue;
        char *s = malloc(len - 4);
        if (!s) break;
        memcpy(s, de->d_name, len - 5);
        s[len - 5] = 0;
        names[count++] = s;
    }
    closedir(dp);
    qsort(names, (size_t)count, sizeof names[0], cmp_str);
    size_t used = 0;
    for (int i = 0; i < count; i++) {
        if (n > used) used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "", names[i]);
        free(names[i]);
    }
    return count;
}

void plan_hw_list(char *buf, size_t n) {
    if (!buf || n == 0) return;
    buf[0] = 0;
    hw_dir d[3];
    int nd = search_dirs(d);
    struct stat st;
    for (int i = 0; i < nd; i++)
        if (is_dir(d[i].dir, &st)) {
            list_dir(d[i].dir, buf, n);
            return;
        }
}

static int is_path(const char *name) {
    size_t len = strlen(name);
    return strchr(name, '/') != NULL || (len >= 5 && !strcmp(name + len - 5, ".toml"));
}

int plan_hw_load(const char *name, plan_hw *out, char *err, size_t errlen) {
    if (!name || !*name) {
        util_set_err(err, errlen, "empty hardware profile name");
        return -1;
    }
    if (is_path(name)) return load_file(name, out, err, errlen);

    hw_dir d[3];
    int nd = search_dirs(d);
    struct stat seen_st[3];
    int nseen = 0;
    char looked[2048] = "";
    size_t used = 0;
    for (int i = 0; i < nd; i++) {
        struct stat st;
        int exists = is_dir(d[i].dir, &st);
        /* ./configs/hardware is the source tree's when run from it: name it once */
        int dup = 0;
        for (int j = 0; exists && j < nseen; j++)
            dup |= seen_st[j].st_dev == st.st_dev && seen_st[j].st_ino == st.st_ino;
        if (dup) continue;
        if (exists) seen_st[nseen++] = st;
        char path[1200];
        snprintf(path, sizeof path, "%s/%s.toml", d[i].dir, name);
        struct stat fst;
        if (exists && stat(path, &fst) == 0) return load_file(path, out, err, errlen);
        char found[1024];
        int count = exists ? list_dir(d[i].dir, found, sizeof found) : -1;
        if (used < sizeof looked)
            used += (size_t)snprintf(looked + used, sizeof looked - used, "%s%s%s: %s", i ? "; " : "",
                                     d[i].from_env ? "$TETRA_HARDWARE_DIR=" : "", d[i].dir,
                                     !exists          ? "no such directory"
                                         : count <= 0 ? "no profiles"
                                                      : found);
    }
    util_set_err(err, errlen, "no hardware profile '%s' (a name, or a path to a .toml file); looked in %s", name,
                 looked);
    return -1;
}

/* ---- writing ------------------------------------------------------------- */

static void write_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f); /* UTF-8 passes through: the strings came from UTF-8 TOML or from us */
    }
    fputc('"', f);
}

int plan_hw_write(const plan_hw *hw, const char *path, char *err, size_t errlen) {
    /* Refuse what plan_hw_load would refuse, so a written profile always loads. */
    for (int j = 0; j < HW_NKEYS; j++) {
        const hw_key *k = &hw_keys[j];
        if (k->kind == KIND_STRING) {
            size_t len = strnlen((const char *)hw + k->off, k->cap);
            if (len >= k->cap || (k->range == RANGE_POSITIVE && len == 0)) {
                util_set_err(err, errlen, "cannot write hardware profile %s: %s must be %s %zu bytes", path, k->key,
                             k->range == RANGE_POSITIVE ? "1 to" : "at most", k->cap - 1);
                return -1;
            }
            continue;
        }
        if (k->kind == KIND_BOOL) continue;
        double x = k->kind == KIND_INT ? (double)hw->gpus_per_node : num_value(hw, k) / k->unit;
        const char *why = range_problem(k, x);
        if (why) {
            util_set_err(err, errlen, "cannot write hardware profile %s: %s %s (got %g)", path, k->key, why, x);
            return -1;
        }
    }
    const char *why = cross_problem(hw);
    if (why) {
        util_set_err(err, errlen, "cannot write hardware profile %s: %s", path, why);
        return -1;
    }

    char tmp[1200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        util_set_err(err, errlen, "hardware profile path too long: %.64s...", path);
        return -1;
    }
    FILE *f = fopen(tmp, "w");
    if (!f) {
        util_set_err(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    fputs("# Hardware profile for `tetra plan`, written by tetra. Rates are per device (FLOP/s,\n"
          "# bytes/s), memory sizes in GiB (2^30 bytes); efficiencies are fractions of those rates.\n",
          f);
    for (int j = 0; j < HW_NKEYS; j++) {
        const hw_key *k = &hw_keys[j];
        fprintf(f, "%s = ", k->key);
        if (k->kind == KIND_STRING) {
            write_string(f, (const char *)hw + k->off);
        } else if (k->kind == KIND_INT) {
            fprintf(f, "%d", hw->gpus_per_node);
        } else if (k->kind == KIND_BOOL) {
            fputs(*(const int *)((const char *)hw + k->off) ? "true" : "false", f);
        } else {
            char num[40];
            /* the shortest text that reads back exactly; x / 2^30 and back is exact too */
            toml_format_float(num_value(hw, k) / k->unit, num, sizeof num);
            fputs(num, f);
        }
        fputc('\n', f);
    }
    int bad = ferror(f) != 0;
    if (fclose(f) != 0) bad = 1;
    if (bad || rename(tmp, path) != 0) {
        util_set_err(err, errlen, "cannot write %s: %s", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

int plan_hw_is_host(const plan_hw *hw) { return hw->peak_fp8_flops <= 0 && !strncmp(hw->name, "cpu", 3); }
