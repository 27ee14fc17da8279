/* ckpt_format.c — checkpoint metadata, dtypes and the overlap math (see ckpt_format.h). */
#include "checkpoint/ckpt_format.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/crc32c.h"
#include "kernels/ops_math.h"

int ck_snprintf(char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    return r;
}

/* ----------------------------------------------------------------------------
 * dtypes */

int ck_dtype_parse(const char *s, tetra_dtype *t) {
    if (!s) return -1;
    if (!strcmp(s, "float32") || !strcmp(s, "F32") || !strcmp(s, "fp32")) *t = TETRA_F32;
    else if (!strcmp(s, "bfloat16") || !strcmp(s, "BF16") || !strcmp(s, "bf16")) *t = TETRA_BF16;
    else if (!strcmp(s, "float16") || !strcmp(s, "F16") || !strcmp(s, "fp16")) *t = TETRA_F16;
    else return -1;
    return 0;
}

uint16_t ck_f32_to_f16(float x) {
    uint32_t u = tetra_f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u)); /* inf / NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: overflow to inf */
    if (a < 0x38800000u) {                                   /* below 2^-14: subnormal half (or zero) */
        if (a < 0x33000000u) return (uint16_t)sign;          /* below 2^-25: rounds to 0 */
        uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14 + (127 - e) - 1 ... */
        /* value = mant * 2^(e-150); half subnormal unit = 2^-24 -> q = mant >> (126 - e) */
        uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round to nearest even at bit 13 */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float ck_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (e == 0) {
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (e == 31) return tetra_bits_f32(sign | 0x7f800000u | (mant << 13));
    return tetra_bits_f32(sign | ((e + 112u) << 23) | (mant << 13));
}

void ck_encode(void *dst, const float *src, size_t n, tetra_dtype t) {
    if (t == TETRA_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    unsigned char *o = dst;
    for (size_t i = 0; i < n; i++) {
        uint16_t v = t == TETRA_BF16 ? tetra_f32_to_bf16(src[i]) : ck_f32_to_f16(src[i]);
        o[2 * i] = (unsigned char)(v & 0xff);
        o[2 * i + 1] = (unsigned char)(v >> 8);
    }
}

void ck_decode(float *dst, const void *src, size_t n, tetra_dtype t) {
    if (t == TETRA_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    const unsigned char *p = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t v = (uint16_t)(p[2 * i] | (p[2 * i + 1] << 8));
        dst[i] = t == TETRA_BF16 ? tetra_bf16_to_f32(v) : ck_f16_to_f32(v);
    }
}

/* ----------------------------------------------------------------------------
 * metadata */

void ck_meta_init(ck_meta *m) {
    memset(m, 0, sizeof *m);
    m->step = -1;
    m->state = json_object();
}

void ck_meta_free(ck_meta *m) {
    for (int i = 0; i < m->n_tensors; i++) free(m->tensors[i].chunks);
    free(m->index);
    free(m->tensors);
    free(m->files);
    json_decref(m->state);
    memset(m, 0, sizeof *m);
}

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

int ck_meta_file(ck_meta *m, const char *name) {
    for (int i = 0; i < m->n_files; i++)
        if (!strcmp(m->files[i].name, name)) return i;
    if (grow((void **)&m->files, &m->cap_files, m->n_files + 1, sizeof *m->files)) return -1;
    ck_file *f = &m->files[m->n_files];
    memset(f, 0, sizeof *f);
    ck_snprintf(f->name, sizeof f->name, "%s", name);
    return m->n_files++;
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Slot of name in the index: where it is, or the empty slot where it would go. */
static int index_slot(const ck_meta *m, const char *name) {
    int mask = m->index_cap - 1, i = (int)(name_hash(name) & (uint64_t)mask);
    while (m->index[i] && strcmp(m->tensors[m->index[i] - 1].name, name) != 0) i = (i + 1) & mask;
    return i;
}

static int index_rebuild(ck_meta *m, int cap) {
    int *idx = calloc((size_t)cap, sizeof *idx);
    if (!idx) return -1;
    free(m->index);
    m->index = idx;
    m->index_cap = cap;
    for (int t = 0; t < m->n_tensors; t++) m->index[index_slot(m, m->tensors[t].name)] = t + 1;
    return 0;
}

int ck_meta_tensor(ck_meta *m, const char *name, tetra_dtype dtype, int ndim, const int64_t *shape) {
    const ck_tensor *have = ck_meta_find(m, name);
    if (have) return (int)(have - m->tensors);
    if (2 * (m->n_tensors + 1) > m->index_cap && index_rebuild(m, m->index_cap ? 2 * m->index_cap : 256)) return -1;
    if (grow((void **)&m->tensors, &m->cap_tensors, m->n_tensors + 1, sizeof *m->tensors)) return -1;
    ck_tensor *t = &m->tensors[m->n_tensors];
    memset(t, 0, sizeof *t);
    ck_snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim && d < DT_MAX_DIMS; d++) t->shape[d] = shape[d];
    m->index[index_slot(m, name)] = m->n_tensors + 1;
    return m->n_tensors++;
}

int ck_tensor_add_chunk(ck_tensor *t, const ck_chunk *c) {
    if (grow((void **)&t->chunks, &t->cap_chunks, t->n_chunks + 1, sizeof *t->chunks)) return -1;
    t->chunks[t->n_chunks++] = *c;
    return 0;
}

const ck_tensor *ck_meta_find(const ck_meta *m, const char *name) {
    if (!m->index_cap) return NULL;
    int slot = m->index[index_slot(m, name)];
    return slot ? &m->tensors[slot - 1] : NULL;
}

size_t ck_tensor_numel(const ck_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

static json_t *int_array(const int64_t *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer((json_int_t)v[i]));
    return a;
}

static json_t *chunk_json(const ck_chunk *c, int ndim) {
    char crc[16];
    ck_snprintf(crc, sizeof crc, "%08" PRIx32, c->crc);
    json_t *o = json_object();
    json_object_set_new(o, "file", json_integer(c->file));
    json_object_set_new(o, "offset", json_integer((json_int_t)c->offset));
    json_object_set_new(o, "length", json_integer((json_int_t)c->length));
    json_object_set_new(o, "box_start", int_array(c->box_start, ndim));
    json_object_set_new(o, "box_shape", int_array(c->box_shape, ndim));
    json_object_set_new(o, "start", json_integer((json_int_t)c->start));
    json_object_set_new(o, "count", json_integer((json_int_t)c->count));
    json_object_set_new(o, "crc32c", json_string(crc));
    return o;
}

static json_t *tensors_json(const ck_meta *m) {
    json_t *ts = json_object();
    for (int i = 0; i < m->n_tensors; i++) {
        const ck_tensor *t = &m->tensors[i];
        json_t *o = json_object(), *ch = json_array();
        json_object_set_new(o, "dtype", json_string(tetra_dtype_name(t->dtype)));
        json_object_set_new(o, "shape", int_array(t->shape, t->ndim));
        for (int c = 0; c < t->n_chunks; c++) json_array_append_new(ch, chunk_json(&t->chunks[c], t->ndim));
        json_object_set_new(o, "chunks", ch);
        json_object_set_new(ts, t->name, o);
    }
    return ts;
}

json_t *ck_meta_to_json(const ck_meta *m) {
    json_t *root = json_object();
    json_object_set_new(root, "format", json_string(CK_FORMAT_NAME));
    json_object_set_new(root, "version", json_integer(CK_FORMAT_VERSION));
    json_object_set_new(root, "step", json_integer((json_int_t)m->step));
    json_object_set_new(root, "model_only", json_boolean(m->model_only));
    const char *key;
    json_t *val;
    json_object_foreach(m->state, key, val) json_object_set(root, key, val);
    json_t *files = json_array();
    for (int i = 0; i < m->n_files; i++) {
        json_t *f = json_object();
        json_object_set_new(f, "name", json_string(m->files[i].name));
        json_object_set_new(f, "size", json_integer((json_int_t)m->files[i].size));
        json_array_append_new(files, f);
    }
    json_object_set_new(root, "files", files);
    json_object_set_new(root, "tensors", tensors_json(m));
    return root;
}

static int get_u64(json_t *o, const char *k, uint64_t *out) {
    json_t *v = json_object_get(o, k);
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int get_dims(json_t *o, const char *k, int ndim, int64_t *out, int allow_zero) {
    json_t *a = json_object_get(o, k);
    if (!json_is_array(a) || (int)json_array_size(a) != ndim) return -1;
    for (int d = 0; d < ndim; d++) {
        json_t *e = json_array_get(a, (size_t)d);
        if (!json_is_integer(e) || json_integer_value(e) < (allow_zero ? 0 : 1)) return -1;
        out[d] = (int64_t)json_integer_value(e);
    }
    return 0;
}

/* Chunks of one tensor from JSON (files must already be known for bounds). */
static int parse_tensor(ck_meta *m, const char *name, json_t *o, const char *where, int check_files, char *err,
                        size_t errlen) {
    const char *dts = json_string_value(json_object_get(o, "dtype"));
    json_t *shape = json_object_get(o, "shape"), *chunks = json_object_get(o, "chunks");
    tetra_dtype dt;
    int64_t sh[DT_MAX_DIMS] = {0};
    int ndim = json_is_array(shape) ? (int)json_array_size(shape) : -1;
    if (!dts || ck_dtype_parse(dts, &dt) || ndim < 1 || ndim > DT_MAX_DIMS || get_dims(o, "shape", ndim, sh, 0) ||
        !json_is_array(chunks)) {
        ck_snprintf(err, errlen, "%s: tensor '%s' has a malformed entry (dtype, shape or chunks)", where, name);
        return -1;
    }
    int ti = ck_meta_tensor(m, name, dt, ndim, sh);
    if (ti < 0) {
        ck_snprintf(err, errlen, "%s: out of memory", where);
        return -1;
    }
    ck_tensor *t = &m->tensors[ti];
    if (t->dtype != dt || t->ndim != ndim || memcmp(t->shape, sh, sizeof(int64_t) * (size_t)ndim) != 0) {
        ck_snprintf(err, errlen, "%s: tensor '%s' is described twice with different dtype or shape", where, name);
        return -1;
    }
    const size_t es = tetra_dtype_size(dt);
    size_t ci;
    json_t *cj;
    json_array_foreach(chunks, ci, cj) {
        ck_chunk c;
        memset(&c, 0, sizeof c);
        uint64_t file = 0;
        const char *crc = json_string_value(json_object_get(cj, "crc32c"));
        char *end = NULL;
        int bad = !json_is_object(cj) || get_u64(cj, "file", &file) || get_u64(cj, "offset", &c.offset) ||
            get_u64(cj, "length", &c.length) || get_u64(cj, "start", &c.start) || get_u64(cj, "count", &c.count) ||
            get_dims(cj, "box_start", ndim, c.box_start, 1) || get_dims(cj, "box_shape", ndim, c.box_shape, 0) ||
            !crc || strlen(crc) != 8;
        if (!bad) {
            errno = 0;
            unsigned long v = strtoul(crc, &end, 16);
            bad = errno != 0 || *end != '\0';
            c.crc = (uint32_t)v;
        }
        if (bad) {
            ck_snprintf(err, errlen, "%s: tensor '%s' chunk %zu is malformed", where, name, ci);
            return -1;
        }
        c.file = (int)file;
        /* the box lies inside the tensor, the range inside the box, the bytes match the count */
        uint64_t box = 1;
        for (int d = 0; d < ndim; d++) {
            if (c.box_start[d] + c.box_shape[d] > sh[d]) bad = 1;
            box *= (uint64_t)c.box_shape[d];
        }
        if (bad || c.start + c.count > box || c.length != c.count * es) {
            ck_snprintf(err, errlen,
                        "%s: tensor '%s' chunk %zu is inconsistent (elements [%" PRIu64 ", %" PRIu64 ") of a %" PRIu64
                        "-element box, %" PRIu64 " bytes for %s)",
                        where, name, ci, c.start, c.start + c.count, box, c.length, tetra_dtype_name(dt));
            return -1;
        }
        if (check_files) {
            if (c.file < 0 || c.file >= m->n_files) {
                ck_snprintf(err, errlen, "%s: tensor '%s' chunk %zu names file #%d of %d", where, name, ci, c.file,
                            m->n_files);
                return -1;
            }
            if (c.offset + c.length > m->files[c.file].size) {
                ck_snprintf(err, errlen,
                            "%s: tensor '%s' chunk %zu (bytes %" PRIu64 "..%" PRIu64
                            ") lies past the end of %s (%" PRIu64 " bytes)",
                            where, name, ci, c.offset, c.offset + c.length, m->files[c.file].name,
                            m->files[c.file].size);
                return -1;
            }
        }
        if (ck_tensor_add_chunk(t, &c)) {
            ck_snprintf(err, errlen, "%s: out of memory", where);
            return -1;
        }
    }
    return 0;
}

int ck_meta_from_json(ck_meta *m, json_t *root, const char *where, char *err, size_t errlen) {
    if (!json_is_object(root)) {
        ck_snprintf(err, errlen, "%s: not a JSON object", where);
        return -1;
    }
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!fmt || strcmp(fmt, CK_FORMAT_NAME) != 0) {
        ck_snprintf(err, errlen, "%s: not a tetra checkpoint (\"format\" is not \"%s\")", where, CK_FORMAT_NAME);
        return -1;
    }
    json_t *ver = json_object_get(root, "version");
    if (!json_is_integer(ver) || json_integer_value(ver) != CK_FORMAT_VERSION) {
        ck_snprintf(err, errlen, "%s: checkpoint format version %lld is not supported (this build reads version %d)",
                    where, json_is_integer(ver) ? (long long)json_integer_value(ver) : -1LL, CK_FORMAT_VERSION);
        return -1;
    }
    json_t *step = json_object_get(root, "step"), *files = json_object_get(root, "files"),
           *tensors = json_object_get(root, "tensors");
    if (!json_is_integer(step) || !json_is_array(files) || !json_is_object(tensors)) {
        ck_snprintf(err, errlen, "%s: missing \"step\", \"files\" or \"tensors\"", where);
        return -1;
    }
    m->step = (int64_t)json_integer_value(step);
    if (m->step < 0) {
        ck_snprintf(err, errlen, "%s: \"step\" is %lld; a checkpoint's step is >= 0 (the metadata was edited?)", where,
                    (long long)m->step);
        return -1;
    }
    m->model_only = json_is_true(json_object_get(root, "model_only"));
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f) {
        const char *name = json_string_value(json_object_get(f, "name"));
        uint64_t size;
        if (!name || strchr(name, '/') || get_u64(f, "size", &size)) {
            ck_snprintf(err, errlen, "%s: file entry %zu is malformed", where, i);
            return -1;
        }
        int fi = ck_meta_file(m, name);
        if (fi < 0) {
            ck_snprintf(err, errlen, "%s: out of memory", where);
            return -1;
        }
        m->files[fi].size = size;
    }
    const char *key;
    json_t *val;
    json_object_foreach(tensors, key, val) {
        if (parse_tensor(m, key, val, where, 1, err, errlen)) return -1;
    }
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "format") || !strcmp(key, "version") || !strcmp(key, "step") || !strcmp(key, "model_only") ||
            !strcmp(key, "files") || !strcmp(key, "tensors"))
            continue;
        json_object_set(m->state, key, val);
    }
    return 0;
}

/* One counter of the training state: absent is fine, else an integer in [0, max]. */
static int check_counter(const ck_meta *m, const char *obj, const char *key, int64_t max, const char *where, char *err,
                         size_t errlen) {
    json_t *o = json_object_get(m->state, obj), *v = json_object_get(o, key);
    if (!v) return 0;
    if (!json_is_integer(v)) {
        ck_snprintf(err, errlen, "%s: %s.%s is not an integer; the metadata was edited or damaged", where, obj, key);
        return -1;
    }
    const int64_t x = (int64_t)json_integer_value(v);
    if (x < 0 || x > max) {
        ck_snprintf(err, errlen,
                    "%s: %s.%s is %" PRId64 "; it counts steps or tokens, so it lies in [0, %" PRId64
                    "] (the metadata was edited or damaged)",
                    where, obj, key, x, max);
        return -1;
    }
    return 0;
}

int ck_meta_check_state(const ck_meta *m, const char *where, char *err, size_t errlen) {
    static const struct {
        const char *obj, *key;
        int64_t max;
    } counters[] = {
        {"train_state", "step", INT64_MAX},    {"train_state", "tokens_seen", INT64_MAX},
        {"lr_scheduler", "count", INT64_MAX},  {"optimizer", "step", INT32_MAX}, /* AdamW's step is an int */
        {"dataloader", "position", INT64_MAX},
    };
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        if (check_counter(m, counters[i].obj, counters[i].key, counters[i].max, where, err, errlen)) return -1;
    json_t *ts = json_object_get(json_object_get(m->state, "train_state"), "step");
    if (ts && (int64_t)json_integer_value(ts) != m->step) {
        ck_snprintf(err, errlen,
                    "%s: train_state.step is %" PRId64 " but \"step\" is %" PRId64 "; a save records "
                    "one step in both (the metadata was edited or damaged)",
                    where, (int64_t)json_integer_value(ts), m->step);
        return -1;
    }
    return 0;
}

/* CRC-32C of the metadata as compact JSON in its own key order, without the checksum
 * itself: a hand edit or a damaged byte changes it. */
static int meta_crc(json_t *root, uint32_t *crc) {
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) return -1;
    *crc = crc32c(0, text, strlen(text));
    free(text);
    return 0;
}

int ck_meta_write(const ck_meta *m, const char *path, char *err, size_t errlen) {
    json_t *root = ck_meta_to_json(m);
    uint32_t crc = 0;
    if (root && !meta_crc(root, &crc)) json_object_set_new(root, "metadata_crc32c", json_integer((json_int_t)crc));
    char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text) {
        ck_snprintf(err, errlen, "%s: cannot encode the metadata", path);
        return -1;
    }
    FILE *f = fopen(path, "wb");
    int bad = !f;
    if (f) {
        size_t n = strlen(text);
        bad |= fwrite(text, 1, n, f) != n || fputc('\n', f) == EOF;
        bad |= fflush(f) != 0;
        bad |= fsync(fileno(f)) != 0;
        bad |= fclose(f) != 0;
    }
    free(text);
    if (bad) {
        ck_snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int ck_meta_read(ck_meta *m, const char *path, char *err, size_t errlen) {
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        if (access(path, F_OK) != 0) ck_snprintf(err, errlen, "%s is missing: %s", path, strerror(errno));
        else
            ck_snprintf(err, errlen, "%s: not valid JSON (line %d: %s); the metadata file is damaged", path, jerr.line,
                        jerr.text);
        return -1;
    }
    /* checkpoints written before the checksum existed have none */
    json_t *sum = json_object_get(root, "metadata_crc32c");
    if (sum) {
        const json_int_t want = json_is_integer(sum) ? json_integer_value(sum) : -1;
        json_object_del(root, "metadata_crc32c");
        uint32_t got = 0;
        if (meta_crc(root, &got) || want != (json_int_t)got) {
            ck_snprintf(err, errlen,
                        "%s: the metadata checksum does not match (recorded %lld, computed %u): the file "
                        "was edited or damaged",
                        path, (long long)want, got);
            json_decref(root);
            return -1;
        }
    }
    int rc = ck_meta_from_json(m, root, path, err, errlen);
    json_decref(root);
    return rc;
}

/* ---- gathering chunk lists ---- */

char *ck_chunks_serialise(const ck_meta *local, uint64_t file_size, const char *error) {
    json_t *root = json_object();
    if (error) json_object_set_new(root, "error", json_string(error));
    json_object_set_new(root, "size", json_integer((json_int_t)file_size));
    json_object_set_new(root, "tensors", tensors_json(local));
    char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    return s;
}

int ck_chunks_merge(ck_meta *m, const char *text, const char *file, int *failed, char *err, size_t errlen) {
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    json_t *ts = root ? json_object_get(root, "tensors") : NULL;
    uint64_t size = 0;
    if (!json_is_object(ts) || get_u64(root, "size", &size)) {
        ck_snprintf(err, errlen, "the chunk list for %s is malformed", file);
        json_decref(root);
        return -1;
    }
    const char *e = json_string_value(json_object_get(root, "error"));
    if (e) {
        *failed = 1;
        ck_snprintf(err, errlen, "%s", e);
        json_decref(root);
        return 0;
    }
    const char *key;
    json_t *val;
    size_t n_chunks = 0;
    json_object_foreach(ts, key, val) n_chunks += json_array_size(json_object_get(val, "chunks"));
    int fi = -1; /* a rank that holds no chunk has no file (its tensors still fix the order) */
    if (n_chunks > 0) {
        fi = ck_meta_file(m, file);
        if (fi < 0) {
            json_decref(root);
            ck_snprintf(err, errlen, "out of memory");
            return -1;
        }
        m->files[fi].size = size;
    }
    int rc = 0;
    json_object_foreach(ts, key, val) {
        const ck_tensor *t = ck_meta_find(m, key);
        int before = t ? t->n_chunks : 0;
        if (parse_tensor(m, key, val, file, 0, err, errlen)) {
            rc = -1;
            break;
        }
        ck_tensor *tt = (ck_tensor *)ck_meta_find(m, key);
        for (int c = before; c < tt->n_chunks; c++) tt->chunks[c].file = fi;
    }
    json_decref(root);
    return rc;
}

/* ----------------------------------------------------------------------------
 * overlap */

ck_region ck_region_of_piece(const dt_tensor *t) {
    ck_region r;
    memset(&r, 0, sizeof r);
    for (int d = 0; d < t->ndim; d++) {
        r.box_start[d] = t->box_start[d];
        r.box_shape[d] = t->box_shape[d];
    }
    r.start = t->n_pieces ? t->piece.start : 0;
    r.count = t->n_pieces ? t->piece.count : 0;
    return r;
}

ck_region ck_region_of_chunk(int ndim, const ck_chunk *c) {
    ck_region r;
    memset(&r, 0, sizeof r);
    for (int d = 0; d < ndim; d++) {
        r.box_start[d] = c->box_start[d];
        r.box_shape[d] = c->box_shape[d];
    }
    r.start = c->start;
    r.count = c->count;
    return r;
}

uint64_t ck_overlap(int ndim, const ck_region *src, const ck_region *dst, ck_run_fn fn, void *user) {
    if (src->count == 0 || dst->count == 0 || ndim < 1) return 0;
    int same = 1;
    for (int d = 0; d < ndim; d++)
        if (src->box_start[d] != dst->box_start[d] || src->box_shape[d] != dst->box_shape[d]) same = 0;
    if (same) {
        uint64_t lo = src->start > dst->start ? src->start : dst->start;
        uint64_t hi_s = src->start + src->count, hi_d = dst->start + dst->count;
        uint64_t hi = hi_s < hi_d ? hi_s : hi_d;
        if (hi <= lo) return 0;
        if (fn) fn(user, lo - src->start, lo - dst->start, hi - lo);
        return hi - lo;
    }
    /* boxes differ: quick reject when they do not intersect */
    for (int d = 0; d < ndim; d++) {
        int64_t a0 = src->box_start[d], a1 = a0 + src->box_shape[d];
        int64_t b0 = dst->box_start[d], b1 = b0 + dst->box_shape[d];
        if ((a0 > b0 ? a0 : b0) >= (a1 < b1 ? a1 : b1)) return 0;
    }
    const int last = ndim - 1;
    const uint64_t dcols = (uint64_t)dst->box_shape[last];
    uint64_t total = 0, k = dst->start;
    const uint64_t kend = dst->start + dst->count;
    while (k < kend) {
        uint64_t row = k / dcols, col = k % dcols;
        uint64_t len = dcols - col;
        if (len > kend - k) len = kend - k;
        /* global coordinates of element k of the destination box */
        int64_t g[DT_MAX_DIMS];
        uint64_t r = row;
        for (int d = last - 1; d >= 0; d--) {
            g[d] = dst->box_start[d] + (int64_t)(r % (uint64_t)dst->box_shape[d]);
            r /= (uint64_t)dst->box_shape[d];
        }
        g[last] = dst->box_start[last] + (int64_t)col;
        int inside = 1;
        for (int d = 0; d < last; d++)
            if (g[d] < src->box_start[d] || g[d] >= src->box_start[d] + src->box_shape[d]) inside = 0;
        if (inside) {
            /* the run [g_last, g_last + len) cut to the source box's columns */
            int64_t c0 = g[last], c1 = g[last] + (int64_t)len;
            int64_t s0 = src->box_start[last], s1 = s0 + src->box_shape[last];
            int64_t lo = c0 > s0 ? c0 : s0, hi = c1 < s1 ? c1 : s1;
            if (lo < hi) {
                uint64_t sidx = 0;
                for (int d = 0; d < last; d++)
                    sidx = sidx * (uint64_t)src->box_shape[d] + (uint64_t)(g[d] - src->box_start[d]);
                sidx = sidx * (uint64_t)src->box_shape[last] + (uint64_t)(lo - s0);
                uint64_t slen = (uint64_t)(hi - lo);
                /* cut to the source range */
                uint64_t a = sidx > src->start ? sidx : src->start;
                uint64_t b = sidx + slen < src->start + src->count ? sidx + slen : src->start + src->count;
                if (a < b) {
                    uint64_t dk = k + (uint64_t)(lo - c0) + (a - sidx);
                    if (fn) fn(user, a - src->start, dk - dst->start, b - a);
                    total += b - a;
                }
            }
        }
        k += len;
    }
    return total;
}

int64_t ck_parse_step_dir(const char *name) {
    if (strncmp(name, "step-", 5) != 0) return -1;
    const char *p = name + 5;
    if (*p < '0' || *p > '9') return -1;
    int64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
        if (v > ((int64_t)1 << 52)) return -1;
    }
    return v;
}
