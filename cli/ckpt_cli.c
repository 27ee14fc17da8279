/* ckpt_cli.c — `tetra checkpoint` (see ckpt_cli.h). */
#include "cli/ckpt_cli.h"

#include <ctype.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "models/llama3/hf_checkpoint.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: tetra checkpoint <command> ...\n"
            "\n"
            "  inspect PATH [--chunks] [--no-verify]\n"
            "      PATH = a step folder (step-N): its training state, every tensor (dtype, shape,\n"
            "      size, chunks) and a CRC-32C check of every chunk; or a checkpoint folder: its\n"
            "      steps, each checked. Exit status 1 on any damage, naming file and tensor.\n"
            "  export --hf OUT_DIR [--dtype float32|bfloat16|float16] [--max-shard-size 5GB] [--force] PATH\n"
            "      Hugging Face Llama safetensors (q/k rotary permutation applied) + config.json;\n"
            "      sharded with model.safetensors.index.json above the shard size. PATH = a step\n"
            "      folder, or a checkpoint folder (its newest complete step).\n"
            "  import --hf SRC OUT_FOLDER [--flavor NAME] [--step N] [--force]\n"
            "      Hugging Face Llama weights (file, folder or index) into a model-only tetra\n"
            "      checkpoint OUT_FOLDER/step-N (default step 0), e.g. to start training from it\n"
            "      with checkpoint.initial_load_path. The flavor is found from config.json.\n");
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void human(char *out, size_t n, double bytes) {
    if (bytes >= 1024.0 * 1024 * 1024) ck_snprintf(out, n, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    else if (bytes >= 1024.0 * 1024) ck_snprintf(out, n, "%.2f MiB", bytes / (1024.0 * 1024));
    else if (bytes >= 1024.0) ck_snprintf(out, n, "%.1f KiB", bytes / 1024.0);
    else ck_snprintf(out, n, "%.0f B", bytes);
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int has_file(const char *dir, const char *name) {
    char p[4300];
    ck_snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return stat(p, &st) == 0;
}

static const char *jstr(json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "?";
}

static void print_state(const ck_meta *m) {
    json_t *ts = json_object_get(m->state, "train_state"), *par = json_object_get(m->state, "parallelism");
    json_t *dl = json_object_get(m->state, "dataloader"), *lr = json_object_get(m->state, "lr_scheduler");
    json_t *opt = json_object_get(m->state, "optimizer"), *model = json_object_get(m->state, "model");
    if (json_is_object(model)) printf("model: %s %s\n", jstr(model, "name"), jstr(model, "flavor"));
    if (json_is_object(par))
        printf("saved under: world %lld = pp %lld x dp_replicate %lld x dp_shard %lld x cp %lld x tp %lld\n",
               (long long)json_integer_value(json_object_get(par, "world")),
               (long long)json_integer_value(json_object_get(par, "pp")),
               (long long)json_integer_value(json_object_get(par, "dp_replicate")),
               (long long)json_integer_value(json_object_get(par, "dp_shard")),
               (long long)json_integer_value(json_object_get(par, "cp")),
               (long long)json_integer_value(json_object_get(par, "tp")));
    if (json_is_object(ts))
        printf("train_state: step %lld, tokens seen %lld\n", (long long)json_integer_value(json_object_get(ts, "step")),
               (long long)json_integer_value(json_object_get(ts, "tokens_seen")));
    if (json_is_object(lr))
        printf("lr_scheduler: count %lld\n", (long long)json_integer_value(json_object_get(lr, "count")));
    if (json_is_object(opt))
        printf("optimizer: %s, step %lld\n", jstr(opt, "name"),
               (long long)json_integer_value(json_object_get(opt, "step")));
    if (json_is_object(dl))
        printf("dataloader: position %lld windows (global batch %lld sequences of %lld tokens)\n",
               (long long)json_integer_value(json_object_get(dl, "position")),
               (long long)json_integer_value(json_object_get(dl, "global_batch_size")),
               (long long)json_integer_value(json_object_get(dl, "seq_len")));
}

/* One step folder. Returns 0 when everything checks out. */
static int inspect_step(const char *dir, int show_tensors, int show_chunks, int verify) {
    char err[2048];
    ckpt_reader *r = ckpt_reader_open(dir, err, sizeof err);
    if (!r) {
        fprintf(stderr, "FAIL %s\n", err);
        return 1;
    }
    const ck_meta *m = ckpt_reader_meta(r);
    uint64_t total = 0, data = 0;
    int n_chunks = 0;
    for (int i = 0; i < m->n_files; i++) total += m->files[i].size;
    for (int i = 0; i < m->n_tensors; i++) {
        data += (uint64_t)ck_tensor_numel(&m->tensors[i]) * tetra_dtype_size(m->tensors[i].dtype);
        n_chunks += m->tensors[i].n_chunks;
    }
    char hb[32];
    human(hb, sizeof hb, (double)total);
    printf("checkpoint %s: step %" PRId64 ", %s, %d tensors in %d chunks, %d files, %s\n", dir, m->step,
           m->model_only ? "model weights only" : "model + optimizer state", m->n_tensors, n_chunks, m->n_files, hb);
    if (show_tensors) {
        print_state(m);
        printf("%-58s %-9s %-16s %11s %6s\n", "tensor", "dtype", "shape", "size", "chunks");
        for (int i = 0; i < m->n_tensors; i++) {
            const ck_tensor *t = &m->tensors[i];
            char shape[64];
            size_t o = (size_t)ck_snprintf(shape, sizeof shape, "[");
            for (int d = 0; d < t->ndim && o < sizeof shape; d++)
                o += (size_t)ck_snprintf(shape + o, sizeof shape - o, "%s%" PRId64, d ? ", " : "", t->shape[d]);
            if (o < sizeof shape) ck_snprintf(shape + o, sizeof shape - o, "]");
            human(hb, sizeof hb, (double)ck_tensor_numel(t) * (double)tetra_dtype_size(t->dtype));
            printf("%-58s %-9s %-16s %11s %6d\n", t->name, tetra_dtype_name(t->dtype), shape, hb, t->n_chunks);
            for (int c = 0; show_chunks && c < t->n_chunks; c++) {
                const ck_chunk *ch = &t->chunks[c];
                printf("    chunk %d: %s bytes %" PRIu64 "..%" PRIu64 ", elements [%" PRIu64 ", %" PRIu64
                       ") of box at [%" PRId64 ", ...], crc32c %08x\n",
                       c, m->files[ch->file].name, ch->offset, ch->offset + ch->length, ch->start,
                       ch->start + ch->count, ch->box_start[0], ch->crc);
            }
        }
    }
    int bad = 0;
    if (verify) {
        double t0 = now_s();
        for (int i = 0; i < m->n_tensors; i++)
            for (int c = 0; c < m->tensors[i].n_chunks; c++)
                if (ckpt_reader_verify_chunk(r, &m->tensors[i], c, err, sizeof err)) {
                    fprintf(stderr, "FAIL %s\n", err);
                    bad++;
                }
        /* every element of every tensor held by exactly its chunks */
        for (int i = 0; i < m->n_tensors; i++) {
            const ck_tensor *t = &m->tensors[i];
            ck_region whole;
            memset(&whole, 0, sizeof whole);
            for (int d = 0; d < t->ndim; d++) whole.box_shape[d] = t->shape[d];
            whole.count = (uint64_t)ck_tensor_numel(t);
            uint64_t cov = 0;
            for (int c = 0; c < t->n_chunks; c++) {
                ck_region src = ck_region_of_chunk(t->ndim, &t->chunks[c]);
                cov += ck_overlap(t->ndim, &src, &whole, NULL, NULL);
            }
            if (cov != whole.count) {
                fprintf(stderr, "FAIL checkpoint %s: tensor '%s': chunks hold %" PRIu64 " of %" PRIu64 " elements\n",
                        dir, t->name, cov, whole.count);
                bad++;
            }
        }
        double dt = now_s() - t0;
        human(hb, sizeof hb, (double)data);
        if (bad) printf("verify: %d problem%s in %s\n", bad, bad == 1 ? "" : "s", dir);
        else
            printf("verify: %d chunks, %s, every CRC-32C matches (%.2f s, %.0f MB/s)\n", n_chunks, hb, dt,
                   dt > 0 ? (double)data / dt / 1e6 : 0.0);
    }
    ckpt_reader_close(r);
    return bad ? 1 : 0;
}

static int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    int chunks = 0, verify = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--chunks")) chunks = 1;
        else if (!strcmp(argv[i], "--no-verify")) verify = 0;
        else if (argv[i][0] == '-') {
            fprintf(stderr, "tetra checkpoint inspect: unknown option '%s'\n", argv[i]);
            return 2;
        } else path = argv[i];
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    if (!is_dir(path)) {
        fprintf(stderr, "tetra checkpoint inspect: '%s' is not a folder\n", path);
        return 1;
    }
    if (has_file(path, "metadata.json")) return inspect_step(path, 1, chunks, verify);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (ck_parse_step_dir(base) >= 0) {
        if (has_file(path, "model.safetensors") || has_file(path, "model.safetensors.index.json")) {
            printf("%s: a Hugging Face export (safetensors + config.json), not a tetra checkpoint\n", path);
            return 0;
        }
        fprintf(stderr, "FAIL checkpoint %s: %s/metadata.json is missing; not a complete checkpoint\n", path, path);
        return 1;
    }
    /* a checkpoint folder */
    ckpt_entry *l = NULL;
    int n = 0;
    char err[2048];
    if (ckpt_scan(path, &l, &n, err, sizeof err)) {
        fprintf(stderr, "FAIL %s\n", err);
        return 1;
    }
    if (n == 0) printf("%s: no checkpoints\n", path);
    else printf("%s: %d step folder%s\n", path, n, n == 1 ? "" : "s");
    int bad = 0;
    for (int i = 0; i < n; i++) {
        char p[4300];
        ck_snprintf(p, sizeof p, "%s/%s", path, l[i].name);
        if (l[i].kind == CKPT_HF) {
            printf("%s: a Hugging Face export (last_save_in_hf)\n", p);
        } else if (l[i].kind == CKPT_DAMAGED) {
            fprintf(stderr, "FAIL checkpoint %s: %s/metadata.json is missing; not a complete checkpoint\n", p, p);
            bad++;
        } else {
            bad += inspect_step(p, chunks, chunks, verify);
        }
    }
    free(l);
    return bad ? 1 : 0;
}

static int parse_size(const char *s, uint64_t *out) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (!end || end == s || v <= 0) return -1;
    while (*end == ' ') end++;
    char unit[8] = {0};
    for (int i = 0; end[i] && i < 7; i++) unit[i] = (char)toupper((unsigned char)end[i]);
    double mul = 1;
    if (!*unit || !strcmp(unit, "B")) mul = 1;
    else if (!strcmp(unit, "KB")) mul = 1e3;
    else if (!strcmp(unit, "MB")) mul = 1e6;
    else if (!strcmp(unit, "GB")) mul = 1e9;
    else if (!strcmp(unit, "KIB")) mul = 1024.0;
    else if (!strcmp(unit, "MIB")) mul = 1024.0 * 1024;
    else if (!strcmp(unit, "GIB")) mul = 1024.0 * 1024 * 1024;
    else return -1;
    *out = (uint64_t)(v * mul);
    return *out > 0 ? 0 : -1;
}

/* A path that does not exist, or an empty folder. */
static int dir_empty_or_absent(const char *path) {
    DIR *d = opendir(path);
    if (!d) return access(path, F_OK) != 0;
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d))) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

static int cmd_export(int argc, char **argv) {
    const char *out = NULL, *path = NULL, *dtype = "float32";
    uint64_t max_shard = 0;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--force")) force = 1;
        else if (!strcmp(argv[i], "--hf") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = argv[++i];
        else if (!strcmp(argv[i], "--max-shard-size") && i + 1 < argc) {
            if (parse_size(argv[++i], &max_shard)) {
                fprintf(stderr,
                        "tetra checkpoint export: --max-shard-size '%s' is not a size (e.g. 5GB, 500MB, 2GiB)\n",
                        argv[i]);
                return 2;
            }
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "tetra checkpoint export: unknown option '%s'\n", argv[i]);
            return 2;
        } else path = argv[i];
    }
    if (!out || !path) {
        usage(stderr);
        return 2;
    }
    llama3_hf_options o;
    memset(&o, 0, sizeof o);
    if (ck_dtype_parse(dtype, &o.dtype)) {
        fprintf(stderr, "tetra checkpoint export: --dtype '%s' is not float32, bfloat16 or float16\n", dtype);
        return 2;
    }
    o.max_shard_bytes = max_shard;
    char err[2048], step_dir[4300];
    ck_snprintf(step_dir, sizeof step_dir, "%s", path);
    if (is_dir(path) && !has_file(path, "metadata.json")) {
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        if (ck_parse_step_dir(base) >= 0) {
            fprintf(stderr,
                    "tetra checkpoint export: checkpoint %s: %s/metadata.json is missing; not a complete "
                    "checkpoint\n",
                    path, path);
            return 1;
        }
        /* a checkpoint folder: its newest complete checkpoint (model-only final saves included) */
        ckpt_entry *l = NULL;
        int n = 0;
        if (ckpt_scan(path, &l, &n, err, sizeof err)) {
            fprintf(stderr, "tetra checkpoint export: %s\n", err);
            return 1;
        }
        int pick = -1;
        for (int i = 0; i < n; i++)
            if (l[i].kind == CKPT_COMPLETE) pick = i;
        if (pick < 0) {
            fprintf(stderr, "tetra checkpoint export: no complete checkpoint in '%s'\n", path);
            free(l);
            return 1;
        }
        ck_snprintf(step_dir, sizeof step_dir, "%s/%s", path, l[pick].name);
        free(l);
    }
    if (!force && !dir_empty_or_absent(out)) {
        fprintf(stderr,
                "tetra checkpoint export: %s exists and is not empty; pass --force to write the export into it "
                "(its model.safetensors, index and config.json are replaced)\n",
                out);
        return 1;
    }
    double t0 = now_s();
    if (llama3_hf_export(step_dir, out, &o, err, sizeof err)) {
        fprintf(stderr, "tetra checkpoint export: %s\n", err);
        return 1;
    }
    printf("exported %s to %s (%s) in %.2f s\n", step_dir, out, tetra_dtype_name(o.dtype), now_s() - t0);
    return 0;
}

static int cmd_import(int argc, char **argv) {
    const char *src = NULL, *out = NULL, *flavor = NULL;
    int64_t step = 0;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--force")) force = 1;
        else if (!strcmp(argv[i], "--hf") && i + 1 < argc) src = argv[++i];
        else if (!strcmp(argv[i], "--flavor") && i + 1 < argc) flavor = argv[++i];
        else if (!strcmp(argv[i], "--step") && i + 1 < argc) step = atoll(argv[++i]);
        else if (argv[i][0] == '-') {
            fprintf(stderr, "tetra checkpoint import: unknown option '%s'\n", argv[i]);
            return 2;
        } else out = argv[i];
    }
    if (!src || !out || step < 0) {
        usage(stderr);
        return 2;
    }
    char err[2048], target[4200];
    ck_snprintf(target, sizeof target, "%s/step-%" PRId64, out, step);
    if (!force && !dir_empty_or_absent(target)) {
        fprintf(stderr,
                "tetra checkpoint import: %s already exists and would be replaced; pass --force to replace it, "
                "or choose another --step\n",
                target);
        return 1;
    }
    if (llama3_hf_import(src, out, step, flavor, err, sizeof err)) {
        fprintf(stderr, "tetra checkpoint import: %s\n", err);
        return 1;
    }
    printf("imported %s into %s/step-%" PRId64 " (model weights only)\n", src, out, step);
    return 0;
}

int ckpt_cli_main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(argv[1], "export")) return cmd_export(argc - 1, argv + 1);
    if (!strcmp(argv[1], "import")) return cmd_import(argc - 1, argv + 1);
    fprintf(stderr, "tetra checkpoint: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
