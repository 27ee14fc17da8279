/* hf_checkpoint.c — Hugging Face safetensors export/import for tetra checkpoints (see hf_checkpoint.h). */
#include "models/llama3/hf_checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "models/llama3/hf.h"
#include "models/llama3/model.h"
#include "util/file.h"

#define BLOCK_ELEMS ((uint64_t)1 << 22)

static const char *st_dtype(tetra_dtype t) { return t == TETRA_BF16 ? "BF16" : t == TETRA_F16 ? "F16" : "F32"; }

json_t *llama3_ckpt_model_json(const llama3_args *a, int max_seq_len) {
    json_t *m = json_object();
    json_object_set_new(m, "name", json_string("llama3"));
    json_object_set_new(m, "flavor", json_string(a->flavor ? a->flavor : ""));
    json_object_set_new(m, "dim", json_integer(a->dim));
    json_object_set_new(m, "n_layers", json_integer(a->n_layers));
    json_object_set_new(m, "n_heads", json_integer(a->n_heads));
    json_object_set_new(m, "n_kv_heads", json_integer(a->n_kv_heads));
    json_object_set_new(m, "vocab_size", json_integer(a->vocab_size));
    json_object_set_new(m, "multiple_of", json_integer(a->multiple_of));
    json_object_set_new(m, "ffn_dim_multiplier", json_real(a->ffn_dim_multiplier));
    json_object_set_new(m, "ffn_hidden", json_integer((json_int_t)llama3_ffn_hidden(a)));
    json_object_set_new(m, "norm_eps", json_real(a->norm_eps));
    json_object_set_new(m, "rope_theta", json_real(a->rope_theta));
    if (a->rope_scaling_factor > 0) {
        json_t *rs = json_object();
        json_object_set_new(rs, "factor", json_real(a->rope_scaling_factor));
        json_object_set_new(rs, "low_freq_factor", json_real(a->rope_low_freq_factor));
        json_object_set_new(rs, "high_freq_factor", json_real(a->rope_high_freq_factor));
        json_object_set_new(rs, "original_max_position_embeddings", json_integer(a->rope_original_max_pos));
        json_object_set_new(m, "rope_scaling", rs);
    }
    json_object_set_new(m, "max_seq_len", json_integer(max_seq_len));
    return m;
}

static int64_t jint(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

static double jnum(json_t *o, const char *k, double def) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : def;
}

json_t *llama3_hf_config_json(json_t *model, tetra_dtype dtype, int64_t bos_id, int64_t eos_id) {
    json_t *c = json_object(), *arch = json_array();
    int64_t dim = jint(model, "dim"), nh = jint(model, "n_heads");
    json_array_append_new(arch, json_string("LlamaForCausalLM"));
    json_object_set_new(c, "architectures", arch);
    json_object_set_new(c, "model_type", json_string("llama"));
    json_object_set_new(c, "hidden_size", json_integer((json_int_t)dim));
    json_object_set_new(c, "intermediate_size", json_integer((json_int_t)jint(model, "ffn_hidden")));
    json_object_set_new(c, "num_attention_heads", json_integer((json_int_t)nh));
    json_object_set_new(c, "num_key_value_heads", json_integer((json_int_t)jint(model, "n_kv_heads")));
    json_object_set_new(c, "num_hidden_layers", json_integer((json_int_t)jint(model, "n_layers")));
    json_object_set_new(c, "head_dim", json_integer((json_int_t)(nh > 0 ? dim / nh : 0)));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "rms_norm_eps", json_real(jnum(model, "norm_eps", 1e-5)));
    json_object_set_new(c, "rope_theta", json_real(jnum(model, "rope_theta", 500000.0)));
    json_t *rs = json_object_get(model, "rope_scaling");
    if (json_is_object(rs)) {
        json_t *o = json_object();
        json_object_set_new(o, "factor", json_real(jnum(rs, "factor", 8.0)));
        json_object_set_new(o, "low_freq_factor", json_real(jnum(rs, "low_freq_factor", 1.0)));
        json_object_set_new(o, "high_freq_factor", json_real(jnum(rs, "high_freq_factor", 4.0)));
        json_object_set_new(o, "original_max_position_embeddings",
                            json_integer((json_int_t)jint(rs, "original_max_position_embeddings")));
        json_object_set_new(o, "rope_type", json_string("llama3"));
        json_object_set_new(c, "rope_scaling", o);
    } else {
        json_object_set_new(c, "rope_scaling", json_null());
    }
    json_object_set_new(c, "vocab_size", json_integer((json_int_t)jint(model, "vocab_size")));
    json_object_set_new(c, "max_position_embeddings", json_integer((json_int_t)jint(model, "max_seq_len")));
    json_object_set_new(c, "attention_bias", json_false());
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    json_object_set_new(c, "mlp_bias", json_false());
    json_object_set_new(c, "initializer_range", json_real(0.02));
    json_object_set_new(c, "pretraining_tp", json_integer(1));
    json_object_set_new(c, "tie_word_embeddings", json_false());
    json_object_set_new(c, "use_cache", json_true());
    json_object_set_new(c, "torch_dtype", json_string(tetra_dtype_name(dtype)));
    if (bos_id >= 0) json_object_set_new(c, "bos_token_id", json_integer((json_int_t)bos_id));
    if (eos_id >= 0) json_object_set_new(c, "eos_token_id", json_integer((json_int_t)eos_id));
    return c;
}

/* ----------------------------------------------------------------------------
 * export */

typedef struct {
    const ck_tensor *t;
    char hf[160];
    int heads; /* rows permuted in groups of head_dim (q: n_heads, k: n_kv_heads), 0 otherwise */
    uint64_t bytes;
    int shard;
} ex_tensor;

static int cmp_ex(const void *a, const void *b) {
    return strcmp(((const ex_tensor *)a)->hf, ((const ex_tensor *)b)->hf);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int write_json_file(const char *path, json_t *j, char *err, size_t errlen) {
    char tmp[4200];
    ck_snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    FILE *f = text ? fopen(tmp, "wb") : NULL;
    int bad = !f;
    if (f) {
        bad |= fputs(text, f) == EOF || fputc('\n', f) == EOF;
        bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
        bad |= fclose(f) != 0;
    }
    free(text);
    if (bad || rename(tmp, path) != 0) {
        ck_snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* One tensor, streamed in blocks of rows (whole heads for q/k). */
static int write_tensor(ckpt_reader *r, const ex_tensor *e, FILE *f, tetra_dtype dt, float *buf, float *perm,
                        unsigned char *bytes, const char *path, char *err, size_t errlen) {
    const ck_tensor *t = e->t;
    const int64_t rows = t->shape[0];
    int64_t cols = 1;
    for (int d = 1; d < t->ndim; d++) cols *= t->shape[d];
    const int64_t unit = e->heads ? rows / e->heads : 1; /* rows that move together */
    int64_t per = (int64_t)(BLOCK_ELEMS / (uint64_t)(cols * unit));
    if (per < 1) per = 1;
    const int64_t block_rows = per * unit;
    const size_t es = tetra_dtype_size(dt);
    for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
        int64_t nr = rows - r0 < block_rows ? rows - r0 : block_rows;
        ck_region want;
        memset(&want, 0, sizeof want);
        for (int d = 0; d < t->ndim; d++) want.box_shape[d] = t->shape[d];
        want.start = (uint64_t)(r0 * cols);
        want.count = (uint64_t)(nr * cols);
        if (ckpt_reader_read_region(r, t, &want, buf, err, errlen)) return -1;
        const float *src = buf;
        if (e->heads) {
            const int64_t hd = unit, half = hd / 2;
            for (int64_t hr = 0; hr < nr; hr++) { /* HF row hr of the block <- interleaved row */
                int64_t h = hr / hd, j = hr % hd, tt = j / half, i = j % half;
                int64_t mr = h * hd + 2 * i + tt;
                memcpy(perm + hr * cols, buf + mr * cols, (size_t)cols * sizeof(float));
            }
            src = perm;
        }
        size_t n = (size_t)(nr * cols);
        ck_encode(bytes, src, n, dt);
        if (fwrite(bytes, es, n, f) != n) {
            ck_snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* State shared by the phases of llama3_hf_export. */
typedef struct exporter {
    ckpt_reader *r;
    const char *step_dir, *out_dir;
    tetra_dtype dt;
    ex_tensor *ex; /* the model tensors, then sorted by Hugging Face name */
    int n, n_shards;
    uint64_t total;   /* bytes of all tensors */
    int64_t max_unit; /* most elements that must move together (whole heads for q/k) */
    float *buf, *perm;
    unsigned char *bytes;
    int quiet;
    char *err;
    size_t errlen;
} exporter;

/* The checkpoint's model tensors with their Hugging Face names, head counts (q/k rows are permuted
 * by head) and sizes in the export dtype. */
static int collect_tensors(exporter *X, const ck_meta *m, int64_t n_heads, int64_t n_kv) {
    X->max_unit = 1;
    for (int i = 0; i < m->n_tensors; i++) {
        const ck_tensor *t = &m->tensors[i];
        if (strncmp(t->name, "model/", 6) != 0) continue;
        const char *name = t->name + 6;
        ex_tensor *e = &X->ex[X->n];
        e->t = t;
        if (llama3_hf_name(name, e->hf, sizeof e->hf) != 0) {
            ck_snprintf(X->err, X->errlen, "checkpoint %s: tensor '%s' has no Hugging Face Llama name", X->step_dir,
                        t->name);
            return -1;
        }
        e->heads = ends_with(name, "attention.wq.weight") ? (int)n_heads
            : ends_with(name, "attention.wk.weight")      ? (int)n_kv
                                                          : 0;
        if (e->heads && (t->ndim != 2 || t->shape[0] % e->heads != 0 || (t->shape[0] / e->heads) % 2 != 0)) {
            ck_snprintf(X->err, X->errlen,
                        "checkpoint %s: tensor '%s' [%" PRId64 " rows] does not split into %d heads of even "
                        "size",
                        X->step_dir, t->name, t->shape[0], e->heads);
            return -1;
        }
        e->bytes = (uint64_t)ck_tensor_numel(t) * tetra_dtype_size(X->dt);
        int64_t cols = 1;
        for (int d = 1; d < t->ndim; d++) cols *= t->shape[d];
        int64_t unit = e->heads ? t->shape[0] / e->heads : 1;
        if (unit * cols > X->max_unit) X->max_unit = unit * cols;
        X->n++;
    }
    if (X->n == 0) {
        ck_snprintf(X->err, X->errlen, "checkpoint %s holds no model tensors", X->step_dir);
        return -1;
    }
    return 0;
}

/* shards: greedy in name order, a new one when the next tensor would pass the limit */
static void assign_shards(exporter *X, uint64_t max_shard) {
    uint64_t cur = 0;
    X->n_shards = 1;
    X->total = 0;
    for (int i = 0; i < X->n; i++) {
        if (cur > 0 && cur + X->ex[i].bytes > max_shard) {
            X->n_shards++;
            cur = 0;
        }
        X->ex[i].shard = X->n_shards - 1;
        cur += X->ex[i].bytes;
        X->total += X->ex[i].bytes;
    }
}

/* Shard s's safetensors header (compact JSON, malloc'ed; NULL on out-of-memory); its tensors also go
 * into the index's weight map under fname. */
static char *shard_header(const exporter *X, int s, const char *fname, json_t *wmap) {
    json_t *hdr = json_object(), *hm = json_object();
    json_object_set_new(hm, "format", json_string("pt"));
    json_object_set_new(hdr, "__metadata__", hm);
    uint64_t off = 0;
    for (int i = 0; i < X->n; i++) {
        const ex_tensor *e = &X->ex[i];
        if (e->shard != s) continue;
        json_t *te = json_object(), *shape = json_array(), *offs = json_array();
        for (int d = 0; d < e->t->ndim; d++) json_array_append_new(shape, json_integer(e->t->shape[d]));
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += e->bytes;
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_object_set_new(te, "dtype", json_string(st_dtype(X->dt)));
        json_object_set_new(te, "shape", shape);
        json_object_set_new(te, "data_offsets", offs);
        json_object_set_new(hdr, e->hf, te);
        json_object_set_new(wmap, e->hf, json_string(fname));
    }
    char *htext = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(hdr);
    return htext;
}

/* Open tmp and write the safetensors preamble: the header's length (little-endian u64), then the header
 * padded with spaces to a multiple of 8. NULL with err set on failure (tmp removed). */
static FILE *open_shard(exporter *X, const char *tmp, const char *htext) {
    size_t hlen = strlen(htext), pad = (8 - hlen % 8) % 8;
    uint64_t hn = hlen + pad;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(hn >> (8 * i));
    FILE *f = fopen(tmp, "wb");
    int bad = !f;
    if (f) {
        bad |= fwrite(len8, 1, 8, f) != 8 || fwrite(htext, 1, hlen, f) != hlen;
        for (size_t i = 0; i < pad && !bad; i++) bad = fputc(' ', f) == EOF;
    }
    if (bad) {
        ck_snprintf(X->err, X->errlen, "cannot write '%s': %s", tmp, strerror(errno));
        if (f) fclose(f);
        unlink(tmp);
        return NULL;
    }
    return f;
}

/* Write shard s (of n_shards) under a temporary name, then rename it into place. */
static int write_shard(exporter *X, int s, json_t *wmap) {
    char fname[128], path[4300], tmp[4400];
    if (X->n_shards == 1) ck_snprintf(fname, sizeof fname, "model.safetensors");
    else ck_snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, X->n_shards);
    ck_snprintf(path, sizeof path, "%s/%s", X->out_dir, fname);
    ck_snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    char *htext = shard_header(X, s, fname, wmap);
    if (!htext) {
        ck_snprintf(X->err, X->errlen, "checkpoint export: out of host memory");
        return -1;
    }
    FILE *f = open_shard(X, tmp, htext);
    free(htext);
    if (!f) return -1;
    for (int i = 0; i < X->n; i++) {
        if (X->ex[i].shard != s) continue;
        if (write_tensor(X->r, &X->ex[i], f, X->dt, X->buf, X->perm, X->bytes, tmp, X->err, X->errlen)) {
            fclose(f);
            unlink(tmp);
            return -1;
        }
    }
    int bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        ck_snprintf(X->err, X->errlen, "cannot write '%s': %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    if (!X->quiet) printf("wrote %s\n", path);
    return 0;
}

/* The block buffers: at least BLOCK_ELEMS elements and one whole unit, plus a unit of slack. */
static int alloc_blocks(exporter *X) {
    uint64_t block = BLOCK_ELEMS > (uint64_t)X->max_unit ? BLOCK_ELEMS : (uint64_t)X->max_unit;
    block += (uint64_t)X->max_unit; /* a block rounds down to whole units, at least one */
    X->buf = malloc((size_t)block * sizeof(float));
    X->perm = malloc((size_t)block * sizeof(float));
    X->bytes = malloc((size_t)block * sizeof(float));
    return X->buf && X->perm && X->bytes ? 0 : -1;
}

/* The shards, then (when there are several) model.safetensors.index.json. */
static int write_shards(exporter *X) {
    json_t *index = json_object();
    json_t *meta = json_object(), *wmap = json_object();
    json_object_set_new(meta, "total_size", json_integer((json_int_t)X->total));
    json_object_set_new(index, "metadata", meta);
    json_object_set_new(index, "weight_map", wmap);
    int rc = 0;
    for (int s = 0; s < X->n_shards && !rc; s++) rc = write_shard(X, s, wmap);
    if (!rc && X->n_shards > 1) {
        char p[4300];
        ck_snprintf(p, sizeof p, "%s/model.safetensors.index.json", X->out_dir);
        rc = write_json_file(p, index, X->err, X->errlen);
        if (!rc && !X->quiet) printf("wrote %s\n", p);
    }
    json_decref(index);
    return rc;
}

int llama3_hf_export(const char *step_dir, const char *out_dir, const llama3_hf_options *o, char *err, size_t errlen) {
    const uint64_t max_shard = o->max_shard_bytes ? o->max_shard_bytes : LLAMA3_HF_DEFAULT_SHARD_BYTES;
    ckpt_reader *r = ckpt_reader_open(step_dir, err, errlen);
    if (!r) return -1;
    const ck_meta *m = ckpt_reader_meta(r);
    json_t *model = json_object_get(m->state, "model");
    int64_t n_heads = jint(model, "n_heads"), n_kv = jint(model, "n_kv_heads");
    int rc = -1;
    exporter X = {.r = r,
                  .step_dir = step_dir,
                  .out_dir = out_dir,
                  .dt = o->dtype,
                  .quiet = o->quiet,
                  .err = err,
                  .errlen = errlen};
    X.ex = calloc((size_t)(m->n_tensors ? m->n_tensors : 1), sizeof *X.ex);
    json_t *config = NULL;
    if (!json_is_object(model) || n_heads <= 0 || n_kv <= 0) {
        ck_snprintf(err, errlen,
                    "checkpoint %s: metadata.json has no \"model\" description (n_heads, n_kv_heads, ...) "
                    "to export from",
                    step_dir);
        goto done;
    }
    if (!X.ex) goto oom;
    if (collect_tensors(&X, m, n_heads, n_kv)) goto done;
    qsort(X.ex, (size_t)X.n, sizeof *X.ex, cmp_ex);
    assign_shards(&X, max_shard);
    if (alloc_blocks(&X)) goto oom;
    if (util_mkdir_p(out_dir) != 0) {
        ck_snprintf(err, errlen, "cannot create '%s': %s", out_dir, strerror(errno));
        goto done;
    }
    if (write_shards(&X)) goto done;
    json_t *tok = json_object_get(m->state, "tokenizer");
    config = llama3_hf_config_json(model, X.dt, json_is_object(tok) ? jint(tok, "bos_id") : -1,
                                   json_is_object(tok) ? jint(tok, "eos_id") : -1);
    char p[4300];
    ck_snprintf(p, sizeof p, "%s/config.json", out_dir);
    if (write_json_file(p, config, err, errlen)) goto done;
    if (!o->quiet) printf("wrote %s\n", p);
    rc = 0;
    goto done;
oom:
    ck_snprintf(err, errlen, "checkpoint export: out of host memory");
done:
    json_decref(config);
    free(X.ex);
    free(X.buf);
    free(X.perm);
    free(X.bytes);
    ckpt_reader_close(r);
    return rc;
}

/* ----------------------------------------------------------------------------
 * import */

/* The flavor whose shapes config.json describes. */
static int match_flavor(const char *hf_path, char *out, size_t n, char *err, size_t errlen) {
    char dir[4096], cfgp[4200];
    struct stat st;
    ck_snprintf(dir, sizeof dir, "%s", hf_path);
    if (stat(hf_path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        else ck_snprintf(dir, sizeof dir, ".");
    }
    ck_snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    json_error_t jerr;
    json_t *c = json_load_file(cfgp, 0, &jerr);
    if (!c) {
        ck_snprintf(err, errlen, "cannot read %s (%s); name the model with --flavor", cfgp, jerr.text);
        return -1;
    }
    char names[256];
    ck_snprintf(names, sizeof names, "%s", llama3_flavor_names());
    char *save = NULL;
    int found = 0;
    for (char *tok = strtok_r(names, ", ", &save); tok && !found; tok = strtok_r(NULL, ", ", &save)) {
        llama3_args a;
        if (llama3_flavor(tok, &a) != 0) continue;
        if (jint(c, "hidden_size") == a.dim && jint(c, "num_hidden_layers") == a.n_layers &&
            jint(c, "num_attention_heads") == a.n_heads && jint(c, "num_key_value_heads") == a.n_kv_heads &&
            jint(c, "vocab_size") == a.vocab_size && jint(c, "intermediate_size") == llama3_ffn_hidden(&a)) {
            ck_snprintf(out, n, "%s", tok);
            found = 1;
        }
    }
    if (!found)
        ck_snprintf(err, errlen,
                    "%s: no known flavor (%s) has hidden_size %" PRId64 ", %" PRId64 " layers, %" PRId64
                    " heads, %" PRId64 " KV heads, vocab %" PRId64 ", intermediate_size %" PRId64,
                    cfgp, llama3_flavor_names(), jint(c, "hidden_size"), jint(c, "num_hidden_layers"),
                    jint(c, "num_attention_heads"), jint(c, "num_key_value_heads"), jint(c, "vocab_size"),
                    jint(c, "intermediate_size"));
    json_decref(c);
    return found ? 0 : -1;
}

int llama3_hf_import(const char *hf_path, const char *ckpt_dir, int64_t step, const char *flavor, char *err,
                     size_t errlen) {
    char fl[64];
    if (flavor) ck_snprintf(fl, sizeof fl, "%s", flavor);
    else if (match_flavor(hf_path, fl, sizeof fl, err, errlen)) return -1;
    llama3_args a;
    if (llama3_flavor(fl, &a) != 0) {
        ck_snprintf(err, errlen, "unknown flavor '%s' (known: %s)", fl, llama3_flavor_names());
        return -1;
    }
    const tetra_ops *ops = ops_get("cpu", err, errlen);
    if (!ops) return -1;
    llama3_model model;
    if (llama3_model_init(&model, &a, 16, ops, err, errlen)) return -1;
    int rc = -1;
    dt_tensor *ts = calloc((size_t)model.n_params, sizeof *ts);
    ckpt_saver *sv = NULL;
    json_t *state = NULL;
    if (!ts) {
        ck_snprintf(err, errlen, "out of host memory");
        goto done;
    }
    if (llama3_load_hf(&model, hf_path, err, errlen)) goto done;
    for (int i = 0; i < model.n_params; i++) {
        const llama3_param *p = &model.params[i];
        dt_tensor *t = &ts[i];
        ck_snprintf(t->name, sizeof t->name, "%s", p->name);
        t->dtype = TETRA_F32;
        t->ndim = p->ndim;
        t->numel = p->numel;
        for (int d = 0; d < p->ndim; d++) t->shape[d] = t->box_shape[d] = p->shape[d];
        t->n_pieces = 1;
        t->piece.start = 0;
        t->piece.count = p->numel;
        t->piece.local_offset = p->offset;
    }
    ckpt_saver_options so;
    memset(&so, 0, sizeof so);
    so.dir = ckpt_dir;
    so.ops = ops;
    so.rank = 0;
    so.world = 1;
    so.writer = 1;
    sv = ckpt_saver_create(&so, err, errlen);
    if (!sv) goto done;
    state = json_object();
    json_t *tsj = json_object();
    json_object_set_new(tsj, "step", json_integer((json_int_t)step));
    json_object_set_new(tsj, "tokens_seen", json_integer(0));
    json_object_set_new(state, "train_state", tsj);
    json_object_set_new(state, "model", llama3_ckpt_model_json(&a, a.rope_original_max_pos));
    json_t *src = json_object();
    json_object_set_new(src, "imported_from", json_string(hf_path));
    json_object_set_new(state, "source", src);
    ckpt_group g = {"model/", ts, model.n_params, model.param_mem, 0};
    ckpt_save_request rq;
    memset(&rq, 0, sizeof rq);
    rq.step = step;
    rq.groups = &g;
    rq.n_groups = 1;
    rq.dtype = TETRA_F32;
    rq.model_only = 1;
    rq.state = state;
    rq.sync = 1;
    rc = ckpt_save(sv, &rq, err, errlen);
done:
    json_decref(state);
    ckpt_saver_free(sv);
    free(ts);
    llama3_model_free(&model);
    return rc;
}
