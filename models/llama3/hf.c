/* hf.c — safetensors reader/writer for Hugging Face Llama checkpoints (see hf.h).
 *
 * safetensors: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {...}},
 * then the raw little-endian row-major data. Tensors stream through a bounded host
 * buffer a block of rows at a time, so an 8B checkpoint never needs a second copy
 * of a whole embedding in memory. */
#include "models/llama3/hf.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/ops_math.h"
#include "util/file.h"

/* host staging: blocks of rows of about this many elements (at least one row) */
#define HF_CHUNK_ELEMS ((size_t)1 << 22)

/* Elements the staging buffers must hold: a block, or one row if rows are longer. */
static size_t staging_elems(const llama3_model *m) {
    size_t n = HF_CHUNK_ELEMS;
    for (int i = 0; i < m->n_params; i++) {
        const llama3_param *p = &m->params[i];
        size_t cols = p->ndim == 2 ? (size_t)p->shape[1] : 1;
        if (cols > n) n = cols;
    }
    return n;
}

/* ----------------------------------------------------------------------------
 * names and the rotary permutation */

int llama3_hf_name(const char *name, char *out, size_t outlen) {
    static const struct {
        const char *tt, *hf;
    } block[] = {
        {"attention.wq.weight", "self_attn.q_proj.weight"},     {"attention.wk.weight", "self_attn.k_proj.weight"},
        {"attention.wv.weight", "self_attn.v_proj.weight"},     {"attention.wo.weight", "self_attn.o_proj.weight"},
        {"feed_forward.w1.weight", "mlp.gate_proj.weight"},     {"feed_forward.w2.weight", "mlp.down_proj.weight"},
        {"feed_forward.w3.weight", "mlp.up_proj.weight"},       {"attention_norm.weight", "input_layernorm.weight"},
        {"ffn_norm.weight", "post_attention_layernorm.weight"},
    };
    if (!strcmp(name, "tok_embeddings.weight")) return snprintf(out, outlen, "model.embed_tokens.weight") < 0;
    if (!strcmp(name, "norm.weight")) return snprintf(out, outlen, "model.norm.weight") < 0;
    if (!strcmp(name, "output.weight")) return snprintf(out, outlen, "lm_head.weight") < 0;
    int layer = -1, used = 0;
    if (sscanf(name, "layers.%d.%n", &layer, &used) == 1 && used > 0) {
        for (size_t i = 0; i < sizeof block / sizeof block[0]; i++)
            if (!strcmp(name + used, block[i].tt)) {
                snprintf(out, outlen, "model.layers.%d.%s", layer, block[i].hf);
                return 0;
            }
    }
    return -1;
}

/* Heads whose rows are permuted (q: n_heads, k: n_kv_heads), 0 for other tensors. */
static int permuted_heads(const llama3_model *m, const llama3_param *p) {
    size_t len = strlen(p->name);
    const char *q = "attention.wq.weight", *k = "attention.wk.weight";
    if (len >= strlen(q) && !strcmp(p->name + len - strlen(q), q)) return m->args.n_heads;
    if (len >= strlen(k) && !strcmp(p->name + len - strlen(k), k)) return m->args.n_kv_heads;
    return 0;
}

/* Model (interleaved-pair) row of HF (rotate-half) row r. */
static int64_t meta_row(int64_t r, int64_t hd) {
    int64_t h = r / hd, j = r % hd, half = hd / 2;
    int64_t t = j / half, i = j % half;
    return h * hd + 2 * i + t;
}

static void param_rows_cols(const llama3_param *p, int64_t *rows, int64_t *cols) {
    *rows = p->shape[0];
    *cols = p->ndim == 2 ? p->shape[1] : 1;
}

/* ----------------------------------------------------------------------------
 * dtypes */

typedef enum { ST_F32, ST_BF16, ST_F16 } st_dtype;

static int parse_dtype(const char *s, st_dtype *t, size_t *size) {
    if (!strcmp(s, "F32")) *t = ST_F32, *size = 4;
    else if (!strcmp(s, "BF16")) *t = ST_BF16, *size = 2;
    else if (!strcmp(s, "F16")) *t = ST_F16, *size = 2;
    else return -1;
    return 0;
}

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (e == 0) { /* zero and subnormals: mant * 2^-24, exact in fp32 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (e == 31) return tetra_bits_f32(sign | 0x7f800000u | (mant << 13));
    return tetra_bits_f32(sign | ((e + 112u) << 23) | (mant << 13));
}

static void decode(float *out, const unsigned char *in, size_t n, st_dtype t) {
    if (t == ST_F32) {
        memcpy(out, in, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t v = (uint16_t)(in[2 * i] | (in[2 * i + 1] << 8));
        out[i] = t == ST_BF16 ? tetra_bf16_to_f32(v) : f16_to_f32(v);
    }
}

/* ----------------------------------------------------------------------------
 * loading */

/* Where one parameter's tensor lies. */
typedef struct {
    int file;      /* index into files, -1: not seen yet */
    uint64_t data; /* absolute file offset of its first byte */
    st_dtype dtype;
    size_t dsize;
} hf_loc;

struct llama3_hf_reader {
    llama3_model full; /* the whole model's declaration (names, global shapes), no storage */
    char (*hf)[128];   /* [n_params] HF names */
    hf_loc *loc;       /* [n_params] */
    int n_files;
    char **files;
    int *fds;             /* [n_files] open while the reader is */
    unsigned char *bytes; /* staging: raw elements */
};

static int fmt_shape(char *out, size_t n, json_t *shape) {
    size_t used = (size_t)snprintf(out, n, "[");
    for (size_t i = 0; i < json_array_size(shape) && used < n; i++)
        used += (size_t)snprintf(out + used, n - used, "%s%lld", i ? ", " : "",
                                 (long long)json_integer_value(json_array_get(shape, i)));
    if (used < n) snprintf(out + used, n - used, "]");
    return 0;
}

/* Check one header entry against the model and record where its data is. */
static int index_tensor(llama3_hf_reader *rd, int fi, uint64_t data_start, uint64_t data_size, const char *name,
                        json_t *info, char *err, size_t errlen) {
    const llama3_model *m = &rd->full;
    const char *file = rd->files[fi];
    const char *dtype = json_string_value(json_object_get(info, "dtype"));
    json_t *shape = json_object_get(info, "shape"), *offs = json_object_get(info, "data_offsets");
    if (!dtype || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2) {
        snprintf(err, errlen, "%s: tensor '%s' has a malformed header entry", file, name);
        return -1;
    }
    int idx = -1;
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(rd->hf[i], name)) {
            idx = i;
            break;
        }
    if (idx < 0) {
        size_t len = strlen(name);
        const char *inv = "rotary_emb.inv_freq"; /* a buffer older transformers saved; recomputed here */
        if (len >= strlen(inv) && !strcmp(name + len - strlen(inv), inv)) return 0;
        snprintf(err, errlen, "%s: unexpected tensor '%s' (not a parameter of the %s model)", file, name,
                 m->args.flavor ? m->args.flavor : "llama3");
        return -1;
    }
    const llama3_param *p = &m->params[idx];
    if (rd->loc[idx].file >= 0) {
        snprintf(err, errlen, "%s: tensor '%s' appears twice (also in %s)", file, name, rd->files[rd->loc[idx].file]);
        return -1;
    }
    st_dtype t;
    size_t ds;
    if (parse_dtype(dtype, &t, &ds) != 0) {
        snprintf(err, errlen, "%s: tensor '%s' has dtype %s; expected F32, BF16 or F16", file, name, dtype);
        return -1;
    }
    int shape_ok = (int)json_array_size(shape) == p->ndim;
    for (int d = 0; shape_ok && d < p->ndim; d++) {
        json_t *e = json_array_get(shape, (size_t)d);
        shape_ok = json_is_integer(e) && json_integer_value(e) == p->shape[d];
    }
    if (!shape_ok) {
        char got[128], want[64];
        fmt_shape(got, sizeof got, shape);
        if (p->ndim == 2) snprintf(want, sizeof want, "[%lld, %lld]", (long long)p->shape[0], (long long)p->shape[1]);
        else snprintf(want, sizeof want, "[%lld]", (long long)p->shape[0]);
        snprintf(err, errlen, "%s: tensor '%s' has shape %s, expected %s for %s of the %s model", file, name, got, want,
                 p->name, m->args.flavor ? m->args.flavor : "llama3");
        return -1;
    }
    json_t *jb = json_array_get(offs, 0), *je = json_array_get(offs, 1);
    if (!json_is_integer(jb) || !json_is_integer(je)) {
        snprintf(err, errlen, "%s: tensor '%s' has malformed data_offsets", file, name);
        return -1;
    }
    int64_t b = json_integer_value(jb), e = json_integer_value(je);
    if (b < 0 || e < b || (uint64_t)e > data_size || (uint64_t)(e - b) != (uint64_t)p->numel * ds) {
        snprintf(err, errlen,
                 "%s: tensor '%s' has data_offsets [%lld, %lld] inconsistent with %zu %s elements "
                 "and %llu data bytes",
                 file, name, (long long)b, (long long)e, p->numel, dtype, (unsigned long long)data_size);
        return -1;
    }
    rd->loc[idx].file = fi;
    rd->loc[idx].data = data_start + (uint64_t)b;
    rd->loc[idx].dtype = t;
    rd->loc[idx].dsize = ds;
    return 0;
}

static int index_file(llama3_hf_reader *rd, int fi, char *err, size_t errlen) {
    const char *file = rd->files[fi];
    int fd = open(file, O_RDONLY);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open '%s': %s", file, strerror(errno));
        return -1;
    }
    rd->fds[fi] = fd;
    int rc = -1;
    json_t *root = NULL;
    char *hdr = NULL;
    struct stat st;
    unsigned char len8[8];
    if (fstat(fd, &st) != 0 || st.st_size < 8 || util_pread_all(fd, len8, 8, 0) != 0) {
        snprintf(err, errlen, "%s: not a safetensors file (shorter than its 8-byte header length)", file);
        goto done;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | len8[i];
    if (n < 2 || n > 100000000ull || 8 + n > (uint64_t)st.st_size) {
        snprintf(err, errlen, "%s: not a safetensors file (header length %llu, file size %lld)", file,
                 (unsigned long long)n, (long long)st.st_size);
        goto done;
    }
    hdr = malloc((size_t)n);
    if (!hdr || util_pread_all(fd, hdr, (size_t)n, 8) != 0) {
        snprintf(err, errlen, "%s: cannot read the header", file);
        goto done;
    }
    json_error_t jerr;
    root = json_loadb(hdr, (size_t)n, 0, &jerr);
    if (!root || !json_is_object(root)) {
        snprintf(err, errlen, "%s: header is not a JSON object: %s", file, root ? "" : jerr.text);
        goto done;
    }
    const uint64_t data_start = 8 + n, data_size = (uint64_t)st.st_size - data_start;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        if (!json_is_object(val)) {
            snprintf(err, errlen, "%s: tensor '%s' has a malformed header entry", file, key);
            goto done;
        }
        if (index_tensor(rd, fi, data_start, data_size, key, val, err, errlen) != 0) goto done;
    }
    rc = 0;
done:
    json_decref(root);
    free(hdr);
    return rc;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* The shard files an index names (each once, in order of first appearance). */
static int index_files(const char *index, const char *dir, char ***files, int *n_files, char *err, size_t errlen) {
    json_error_t jerr;
    json_t *root = json_load_file(index, 0, &jerr);
    json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        snprintf(err, errlen, "%s: not a safetensors index (%s)", index, root ? "no \"weight_map\" object" : jerr.text);
        json_decref(root);
        return -1;
    }
    size_t cap = json_object_size(wm);
    char **list = calloc(cap ? cap : 1, sizeof *list);
    int nf = 0;
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        const char *f = json_string_value(val);
        if (!f) {
            snprintf(err, errlen, "%s: weight_map entry '%s' is not a file name", index, key);
            for (int i = 0; i < nf; i++) free(list[i]);
            free(list);
            json_decref(root);
            return -1;
        }
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", dir, f);
        int seen = 0;
        for (int i = 0; i < nf && !seen; i++) seen = !strcmp(list[i], full);
        if (!seen) list[nf++] = strdup(full);
    }
    json_decref(root);
    *files = list;
    *n_files = nf;
    return 0;
}

/* The files a path names: a safetensors file, a folder with model.safetensors, or an
 * index (a folder holding model.safetensors.index.json, or the index file itself). */
static int list_files(const char *path, char ***files, int *n_files, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    char buf[4096];
    if (S_ISDIR(st.st_mode)) {
        snprintf(buf, sizeof buf, "%s/model.safetensors.index.json", path);
        if (stat(buf, &st) == 0) return index_files(buf, path, files, n_files, err, errlen);
        snprintf(buf, sizeof buf, "%s/model.safetensors", path);
        if (stat(buf, &st) != 0) {
            snprintf(err, errlen, "'%s' holds neither model.safetensors nor model.safetensors.index.json", path);
            return -1;
        }
    } else if (ends_with(path, ".index.json")) {
        snprintf(buf, sizeof buf, "%s", path);
        char *slash = strrchr(buf, '/');
        if (slash) *slash = '\0';
        else snprintf(buf, sizeof buf, ".");
        return index_files(path, buf, files, n_files, err, errlen);
    } else {
        snprintf(buf, sizeof buf, "%s", path);
    }
    *files = calloc(1, sizeof **files);
    if (!*files) return -1;
    (*files)[0] = strdup(buf);
    *n_files = 1;
    return 0;
}

void llama3_hf_close(llama3_hf_reader *rd) {
    if (!rd) return;
    for (int f = 0; f < rd->n_files; f++) {
        if (rd->fds && rd->fds[f] >= 0) close(rd->fds[f]);
        free(rd->files[f]);
    }
    free(rd->files);
    free(rd->fds);
    free(rd->hf);
    free(rd->loc);
    free(rd->bytes);
    llama3_model_free(&rd->full);
    free(rd);
}

llama3_hf_reader *llama3_hf_open(const llama3_args *a, const char *path, char *err, size_t errlen) {
    llama3_hf_reader *rd = calloc(1, sizeof *rd);
    if (!rd) {
        snprintf(err, errlen, "llama3 HF load: out of host memory");
        return NULL;
    }
    const tetra_ops *ops = ops_cpu();
    llama3_layout full = llama3_layout_full(a);
    if (llama3_model_init_layout(&rd->full, a, &full, LLAMA3_STORAGE_NONE, 1, ops, err, errlen) != 0) {
        free(rd);
        return NULL;
    }
    const llama3_model *m = &rd->full;
    if (list_files(path, &rd->files, &rd->n_files, err, errlen) != 0) goto fail;
    rd->fds = malloc((size_t)rd->n_files * sizeof *rd->fds);
    rd->hf = calloc((size_t)m->n_params, sizeof *rd->hf);
    rd->loc = calloc((size_t)m->n_params, sizeof *rd->loc);
    rd->bytes = malloc(HF_CHUNK_ELEMS * sizeof(float));
    if (!rd->fds || !rd->hf || !rd->loc || !rd->bytes) {
        snprintf(err, errlen, "llama3 HF load: out of host memory");
        goto fail;
    }
    for (int f = 0; f < rd->n_files; f++) rd->fds[f] = -1;
    for (int i = 0; i < m->n_params; i++) {
        llama3_hf_name(m->params[i].name, rd->hf[i], sizeof rd->hf[i]);
        rd->loc[i].file = -1;
    }
    for (int f = 0; f < rd->n_files; f++)
        if (index_file(rd, f, err, errlen) != 0) goto fail;
    for (int i = 0; i < m->n_params; i++) {
        if (rd->loc[i].file >= 0) continue;
        snprintf(err, errlen, "%s: missing tensor '%s' (%s of the %s model)%s", path, rd->hf[i], m->params[i].name,
                 m->args.flavor ? m->args.flavor : "llama3",
                 !strcmp(rd->hf[i], "lm_head.weight") ? "; tied embeddings are not supported" : "");
        goto fail;
    }
    return rd;
fail:
    llama3_hf_close(rd);
    return NULL;
}

/* HF (rotate-half) row of model (interleaved-pair) row r: the inverse of meta_row. */
static int64_t hf_row(int64_t r, int64_t hd) {
    int64_t h = r / hd, j = r % hd, half = hd / 2;
    int64_t i = j / 2, t = j % 2;
    return h * hd + t * half + i;
}

int llama3_hf_read(llama3_hf_reader *rd, const char *name, size_t start, size_t count, float *out, char *err,
                   size_t errlen) {
    const llama3_model *m = &rd->full;
    const llama3_param *p = llama3_find_param(m, name);
    if (!p || start > p->numel || count > p->numel - start) {
        snprintf(err, errlen, "llama3 HF load: no elements [%zu, %zu) of '%s'", start, start + count, name);
        return -1;
    }
    const int idx = (int)(p - m->params);
    const hf_loc *loc = &rd->loc[idx];
    const char *file = rd->files[loc->file];
    const int fd = rd->fds[loc->file];
    int64_t rows, cols;
    param_rows_cols(p, &rows, &cols);
    const int heads = permuted_heads(m, p);
    const int64_t hd = heads ? rows / heads : 0;
    size_t done = 0;
    while (done < count) {
        /* a run: contiguous in the file (up to a row end when rows are permuted) */
        const size_t g = start + done;
        size_t run = count - done;
        uint64_t src = g;
        if (heads) {
            const size_t r = g / (size_t)cols, c = g % (size_t)cols;
            if (run > (size_t)cols - c) run = (size_t)cols - c;
            src = (uint64_t)hf_row((int64_t)r, hd) * (uint64_t)cols + c;
        }
        if (run > HF_CHUNK_ELEMS) run = HF_CHUNK_ELEMS;
        errno = 0;
        if (util_pread_all(fd, rd->bytes, run * loc->dsize, loc->data + src * loc->dsize) != 0) {
            snprintf(err, errlen, "%s: cannot read tensor '%s': %s", file, rd->hf[idx],
                     errno ? strerror(errno) : "file truncated");
            return -1;
        }
        decode(out + done, rd->bytes, run, loc->dtype);
        done += run;
    }
    return 0;
}

int llama3_load_hf(llama3_model *m, const char *path, char *err, size_t errlen) {
    if (!m->own_storage) {
        snprintf(err, errlen, "llama3_load_hf: the model has no storage of its own (read pieces with llama3_hf_read)");
        return -1;
    }
    llama3_hf_reader *rd = llama3_hf_open(&m->args, path, err, errlen);
    if (!rd) return -1;
    float *host = malloc(HF_CHUNK_ELEMS * sizeof(float));
    int rc = host ? 0 : -1;
    if (!host) snprintf(err, errlen, "llama3 HF load: out of host memory");
    for (int i = 0; i < m->n_params && rc == 0; i++) {
        const llama3_param *p = &m->params[i];
        const size_t cols = p->ndim == 2 ? (size_t)p->shape[1] : 1, bcols = p->ndim == 2 ? (size_t)p->box_shape[1] : 1;
        /* the rank's box, a run of rows at a time (whole rows: one run) */
        const size_t runs = bcols == cols ? 1 : (size_t)p->box_shape[0];
        const size_t run_len = bcols == cols ? p->numel : bcols;
        for (size_t r = 0; r < runs && rc == 0; r++) {
            const size_t g0 = bcols == cols ? (size_t)p->box_start[0] * cols
                                            : ((size_t)p->box_start[0] + r) * cols + (size_t)p->box_start[1];
            for (size_t s = 0; s < run_len && rc == 0; s += HF_CHUNK_ELEMS) {
                size_t cnt = run_len - s < HF_CHUNK_ELEMS ? run_len - s : HF_CHUNK_ELEMS;
                rc = llama3_hf_read(rd, p->name, g0 + s, cnt, host, err, errlen);
                if (rc == 0) m->ops->copy_h2d(m->param_mem + p->offset + r * run_len + s, host, cnt * sizeof(float));
            }
        }
    }
    free(host);
    llama3_hf_close(rd);
    if (rc == 0) llama3_sync_compute_params(m);
    return rc;
}

/* ----------------------------------------------------------------------------
 * saving */

typedef struct {
    const char *hf;
    int idx;
} name_idx;

static int cmp_name_idx(const void *a, const void *b) {
    return strcmp(((const name_idx *)a)->hf, ((const name_idx *)b)->hf);
}

int llama3_save_hf_buffer(const llama3_model *m, const float *buf, const char *path, const char *dtype, char *err,
                          size_t errlen) {
    int bf16;
    if (!strcmp(dtype, "float32") || !strcmp(dtype, "F32")) bf16 = 0;
    else if (!strcmp(dtype, "bfloat16") || !strcmp(dtype, "BF16")) bf16 = 1;
    else {
        snprintf(err, errlen, "llama3 HF save: dtype '%s' not supported (float32 or bfloat16)", dtype);
        return -1;
    }
    const size_t ds = bf16 ? 2 : 4;
    if (!m->layout.has_embedding || !m->layout.has_head || m->layout.layer_start != 0 ||
        m->layout.layer_end != m->args.n_layers || m->layout.tp_size != 1) {
        snprintf(err, errlen, "llama3 HF save: needs the whole model, not a stage or tensor-parallel shard");
        return -1;
    }
    int rc = -1;
    char(*hf)[128] = calloc((size_t)m->n_params, sizeof *hf);
    name_idx *order = calloc((size_t)m->n_params, sizeof *order);
    float *host = malloc(staging_elems(m) * sizeof(float));
    uint16_t *half = malloc(staging_elems(m) * sizeof(uint16_t));
    json_t *root = json_object();
    char *hdr = NULL;
    FILE *f = NULL;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (!hf || !order || !host || !half || !root) {
        snprintf(err, errlen, "llama3 HF save: out of host memory");
        goto done;
    }

    /* header: tensors in name order (the order the safetensors writer uses), packed */
    for (int i = 0; i < m->n_params; i++) {
        llama3_hf_name(m->params[i].name, hf[i], sizeof hf[i]);
        order[i].hf = hf[i];
        order[i].idx = i;
    }
    qsort(order, (size_t)m->n_params, sizeof *order, cmp_name_idx);
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    uint64_t off = 0;
    for (int j = 0; j < m->n_params; j++) {
        const llama3_param *p = &m->params[order[j].idx];
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        for (int d = 0; d < p->ndim; d++) json_array_append_new(shape, json_integer(p->shape[d]));
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += (uint64_t)p->numel * ds;
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_object_set_new(e, "dtype", json_string(bf16 ? "BF16" : "F32"));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        json_object_set_new(root, order[j].hf, e);
    }
    hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!hdr) {
        snprintf(err, errlen, "llama3 HF save: cannot encode the header");
        goto done;
    }
    size_t hlen = strlen(hdr), pad = (8 - hlen % 8) % 8; /* data starts 8-byte aligned */
    uint64_t n = hlen + pad;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(n >> (8 * i));

    f = fopen(tmp, "wb");
    if (!f) {
        snprintf(err, errlen, "cannot write '%s': %s", tmp, strerror(errno));
        goto done;
    }
    int bad = fwrite(len8, 1, 8, f) != 8 || fwrite(hdr, 1, hlen, f) != hlen;
    for (size_t i = 0; i < pad && !bad; i++) bad = fputc(' ', f) == EOF;
    for (int j = 0; j < m->n_params && !bad; j++) {
        const llama3_param *p = &m->params[order[j].idx];
        int64_t rows, cols;
        param_rows_cols(p, &rows, &cols);
        const int heads = permuted_heads(m, p);
        const int64_t hd = heads ? rows / heads : 0;
        const int64_t block_rows = (int64_t)HF_CHUNK_ELEMS / cols > 0 ? (int64_t)HF_CHUNK_ELEMS / cols : 1;
        const float *src = buf + p->offset;
        for (int64_t r0 = 0; r0 < rows && !bad; r0 += block_rows) {
            int64_t nr = rows - r0 < block_rows ? rows - r0 : block_rows;
            size_t ne = (size_t)nr * (size_t)cols;
            if (!heads) {
                m->ops->copy_d2h(host, src + (size_t)r0 * (size_t)cols, ne * sizeof(float));
            } else {
                for (int64_t r = 0; r < nr; r++)
                    m->ops->copy_d2h(host + (size_t)r * cols, src + (size_t)meta_row(r0 + r, hd) * (size_t)cols,
                                     (size_t)cols * sizeof(float));
            }
            if (bf16) {
                for (size_t i = 0; i < ne; i++) half[i] = tetra_f32_to_bf16(host[i]);
                bad = fwrite(half, 2, ne, f) != ne;
            } else {
                bad = fwrite(host, 4, ne, f) != ne;
            }
        }
    }
    bad |= fflush(f) != 0;
    bad |= fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    f = NULL;
    if (bad || rename(tmp, path) != 0) {
        snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
        unlink(tmp);
        goto done;
    }
    rc = 0;
done:
    if (f) {
        fclose(f);
        unlink(tmp);
    }
    free(hdr);
    json_decref(root);
    free(hf);
    free(order);
    free(host);
    free(half);
    return rc;
}

int llama3_save_hf(const llama3_model *m, const char *path, const char *dtype, char *err, size_t errlen) {
    return llama3_save_hf_buffer(m, m->param_mem, path, dtype, err, errlen);
}
