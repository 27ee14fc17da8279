/* parquet.c — one string column of a Parquet file: the footer, and opening (see parquet.h;
 * parquet_chunk.c decodes a column chunk's pages).
 *
 * Format: apache/parquet-format (parquet.thrift, Encodings.md, Compression.md). A file is
 * "PAR1", the column chunks, the footer (FileMetaData in the Thrift compact protocol), the
 * footer's length (4 bytes little-endian) and "PAR1". */
#include "data/parquet.h"

#include "data/parquet_internal.h"
#include "data/thrift.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const pq_codec_names[8] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
const char *const pq_encoding_names[11] = {"PLAIN",
                                           "GROUP_VAR_INT",
                                           "PLAIN_DICTIONARY",
                                           "RLE",
                                           "BIT_PACKED",
                                           "DELTA_BINARY_PACKED",
                                           "DELTA_LENGTH_BYTE_ARRAY",
                                           "DELTA_BYTE_ARRAY",
                                           "RLE_DICTIONARY",
                                           "BYTE_STREAM_SPLIT",
                                           "ALP"};
const char *const pq_type_names[8] = {"BOOLEAN", "INT32",  "INT64",      "INT96",
                                      "FLOAT",   "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};

const char *pq_name_of(const char *const *names, size_t n, int64_t v, char *buf, size_t bn) {
    if (v >= 0 && (uint64_t)v < n) return names[v];
    snprintf(buf, bn, "unknown (%lld)", (long long)v);
    return buf;
}

void pq_default_limits(pq_limits *l) {
    l->max_chunk_bytes = (uint64_t)4 << 30;
    l->max_text_bytes = (uint64_t)4 << 30;
}

void pq_seterr(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

const uint8_t *pq_file_bytes(pq_file *f, uint64_t off, size_t n, uint8_t *buf, char *err, size_t errlen) {
    if (off > f->size || n > f->size - off) {
        pq_seterr(err, errlen, "%s: bytes [%llu, %llu) lie outside the file (%llu bytes)", f->name,
                  (unsigned long long)off, (unsigned long long)(off + n), (unsigned long long)f->size);
        return NULL;
    }
    if (f->fd < 0) return f->mem + off;
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(f->fd, buf + got, n - got, (off_t)(off + got));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            pq_seterr(err, errlen, "%s: read error at byte %llu: %s", f->name, (unsigned long long)(off + got),
                      k < 0 ? strerror(errno) : "unexpected end of file");
            return NULL;
        }
        got += (size_t)k;
    }
    return buf;
}

/* ---- the footer ------------------------------------------------------------------------ */

typedef struct {
    int64_t type, repetition, num_children;
    const uint8_t *name;
    size_t name_len;
} schema_elem;

static void read_schema_elem(thr_reader *r, schema_elem *e) {
    int16_t last, id;
    int t;
    memset(e, 0, sizeof *e);
    e->type = e->repetition = -1;
    thr_struct_begin(r, &last);
    while (thr_field(r, &last, &id, &t)) {
        if (id == 1) e->type = thr_int(r, t);
        else if (id == 3) e->repetition = thr_int(r, t);
        else if (id == 4 && t == THR_BINARY) e->name = thr_binary(r, &e->name_len);
        else if (id == 5) e->num_children = thr_int(r, t);
        else thr_skip(r, t);
    }
    thr_struct_end(r);
    if (!r->bad && !e->name) thr_fail(r, "a schema element without a name");
    if (!r->bad && e->num_children < 0) thr_fail(r, "a negative number of children");
}

static int name_is(const schema_elem *e, const char *s) {
    return e->name_len == strlen(s) && memcmp(e->name, s, e->name_len) == 0;
}

/* Find the column among the schema's depth-first list: leaf index, nesting, type. */
static int find_column(pq_file *f, const schema_elem *el, int64_t n, char *err, size_t errlen) {
    if (n < 2 || el[0].num_children < 1) {
        pq_seterr(err, errlen, "%s: corrupt footer: the schema has no columns", f->name);
        return -1;
    }
    int64_t rem[THR_MAX_DEPTH + 1];
    int depth = 1, leaves = 0, found = -1;
    rem[1] = el[0].num_children;
    char names[512] = "";
    size_t nl = 0;
    for (int64_t i = 1; i < n; i++) {
        while (depth > 0 && rem[depth] == 0) depth--;
        if (depth == 0) {
            pq_seterr(err, errlen, "%s: corrupt footer: schema element %lld is outside the root's children", f->name,
                      (long long)i);
            return -1;
        }
        rem[depth]--;
        const schema_elem *e = &el[i];
        if (depth == 1) {
            int k = snprintf(names + nl, sizeof names - nl, "%s'%.*s'", nl ? ", " : "",
                             (int)(e->name_len > 64 ? 64 : e->name_len), (const char *)e->name);
            if (k > 0 && nl + (size_t)k < sizeof names) nl += (size_t)k;
        }
        if (depth == 1 && found < 0 && name_is(e, f->column)) {
            char b[32];
            if (e->num_children > 0) {
                pq_seterr(err, errlen,
                          "%s: column '%s': unsupported: a nested (group) column; the text must be a "
                          "top-level string column",
                          f->name, f->column);
                return -1;
            }
            if (e->repetition == REP_REPEATED) {
                pq_seterr(err, errlen,
                          "%s: column '%s': unsupported: a repeated column (a list of strings); the text "
                          "must be one string per row",
                          f->name, f->column);
                return -1;
            }
            if (e->type != T_BYTE_ARRAY) {
                pq_seterr(err, errlen,
                          "%s: column '%s': unsupported: type %s; the text column must be BYTE_ARRAY "
                          "(string)",
                          f->name, f->column, NAME(pq_type_names, e->type, b));
                return -1;
            }
            f->max_def = e->repetition == REP_OPTIONAL;
            found = leaves;
        }
        if (e->num_children > 0) {
            if (depth == THR_MAX_DEPTH) {
                pq_seterr(err, errlen, "%s: corrupt footer: the schema nests deeper than %d", f->name, THR_MAX_DEPTH);
                return -1;
            }
            rem[++depth] = e->num_children;
        } else {
            leaves++;
        }
    }
    while (depth > 0 && rem[depth] == 0) depth--;
    if (depth > 0) {
        pq_seterr(err, errlen, "%s: corrupt footer: the schema ends before its groups' children", f->name);
        return -1;
    }
    if (found < 0) {
        pq_seterr(err, errlen, "%s: no column '%s' (the columns are %s); choose it with --text-field", f->name,
                  f->column, names);
        return -1;
    }
    f->leaf = found;
    f->n_leaves = leaves;
    return 0;
}

/* ColumnMetaData of the text column. */
static void read_column_meta(thr_reader *r, pq_file *f, pq_chunk *c, int64_t *type, int *path_ok) {
    int16_t last, id;
    int t;
    int64_t data_off = -1, dict_off = -1;
    thr_struct_begin(r, &last);
    while (thr_field(r, &last, &id, &t)) {
        switch (id) {
        case 1: *type = thr_int(r, t); break;
        case 3: {
            int et;
            if (t != THR_LIST) {
                thr_fail(r, "path_in_schema is not a list");
                break;
            }
            int64_t n = thr_list(r, &et);
            for (int64_t i = 0; i < n && !r->bad; i++) {
                size_t len;
                const uint8_t *s = et == THR_BINARY ? thr_binary(r, &len) : NULL;
                if (!s) thr_fail(r, "path_in_schema holds something other than strings");
                else if (i == 0 && n == 1 && len == strlen(f->column) && !memcmp(s, f->column, len)) *path_ok = 1;
            }
            break;
        }
        case 4: c->codec = thr_int(r, t); break;
        case 5: c->num_values = thr_int(r, t); break;
        case 6: c->total_uncompressed = thr_int(r, t); break;
        case 7: c->total_compressed = thr_int(r, t); break;
        case 9: data_off = thr_int(r, t); break;
        case 11: dict_off = thr_int(r, t); break;
        default: thr_skip(r, t);
        }
    }
    thr_struct_end(r);
    /* a dictionary page comes first; some writers leave its offset out or at 0 */
    c->start = dict_off >= 4 && dict_off < data_off ? dict_off : data_off;
}

typedef struct {
    int has_meta, other_file, encrypted, path_ok;
    int64_t type;
} chunk_facts;

static void read_column_chunk(thr_reader *r, pq_file *f, pq_chunk *c, chunk_facts *k) {
    int16_t last, id;
    int t;
    thr_struct_begin(r, &last);
    while (thr_field(r, &last, &id, &t)) {
        if (id == 1) {
            k->other_file = 1;
            thr_skip(r, t);
        } else if (id == 3 && t == THR_STRUCT) {
            k->has_meta = 1;
            read_column_meta(r, f, c, &k->type, &k->path_ok);
        } else if (id == 8 || id == 9) {
            k->encrypted = 1;
            thr_skip(r, t);
        } else {
            thr_skip(r, t);
        }
    }
    thr_struct_end(r);
}

/* One RowGroup: its rows and the text column's chunk. */
static int read_row_group(thr_reader *r, pq_file *f, int g, char *err, size_t errlen) {
    int16_t last, id;
    int t;
    pq_chunk *c = &f->rg[g];
    chunk_facts k = {0, 0, 0, 0, -1};
    int64_t n_cols = -1;
    memset(c, 0, sizeof *c);
    c->num_rows = -1;
    c->start = -1;
    thr_struct_begin(r, &last);
    while (thr_field(r, &last, &id, &t)) {
        if (id == 1 && t == THR_LIST) {
            int et;
            n_cols = thr_list(r, &et);
            if (n_cols > 0 && et != THR_STRUCT) thr_fail(r, "the column list holds something other than structs");
            for (int64_t i = 0; i < n_cols && !r->bad; i++) {
                if (i == f->leaf) read_column_chunk(r, f, c, &k);
                else thr_skip(r, THR_STRUCT); /* the other columns are not ours to read */
            }
        } else if (id == 3) {
            c->num_rows = thr_int(r, t);
        } else {
            thr_skip(r, t);
        }
    }
    thr_struct_end(r);
    if (r->bad) return 0; /* the caller reports where */
    const char *fn = f->name, *col = f->column;
    char b[32];
    if (n_cols != f->n_leaves || c->num_rows < 0) {
        pq_seterr(err, errlen,
                  "%s: corrupt footer: row group %d has %lld column chunks and %lld rows; the schema has %d "
                  "columns",
                  fn, g, (long long)n_cols, (long long)c->num_rows, f->n_leaves);
        return -1;
    }
    if (k.other_file || k.encrypted || !k.has_meta) {
        pq_seterr(err, errlen, "%s: row group %d, column '%s': unsupported: %s", fn, g, col,
                  k.other_file ? "the column's data is in another file (file_path)"
                               : "an encrypted column (or one without column metadata)");
        return -1;
    }
    if (k.type != T_BYTE_ARRAY || !k.path_ok) {
        pq_seterr(err, errlen,
                  "%s: row group %d, column '%s': corrupt: the chunk's metadata (type %s) does not match the "
                  "schema's BYTE_ARRAY column '%s'",
                  fn, g, col, NAME(pq_type_names, k.type, b), col);
        return -1;
    }
    if (c->codec != C_NONE && c->codec != C_SNAPPY && c->codec != C_GZIP && c->codec != C_ZSTD) {
        pq_seterr(err, errlen,
                  "%s: row group %d, column '%s': unsupported: compression %s (supported: UNCOMPRESSED, "
                  "SNAPPY, GZIP, ZSTD)",
                  fn, g, col, NAME(pq_codec_names, c->codec, b));
        return -1;
    }
    if (c->num_values != c->num_rows) {
        pq_seterr(err, errlen,
                  "%s: row group %d, column '%s': corrupt: the chunk holds %lld values but the row group "
                  "has %lld rows",
                  fn, g, col, (long long)c->num_values, (long long)c->num_rows);
        return -1;
    }
    if (c->start < 4 || (uint64_t)c->start > f->data_end || c->total_compressed < 0 || c->total_uncompressed < 0 ||
        (uint64_t)c->total_compressed > f->data_end - (uint64_t)c->start) {
        pq_seterr(err, errlen,
                  "%s: row group %d, column '%s': corrupt: the chunk at byte %lld (%lld bytes) lies outside "
                  "the data of the file (bytes 4 to %llu)",
                  fn, g, col, (long long)c->start, (long long)c->total_compressed, (unsigned long long)f->data_end);
        return -1;
    }
    if ((uint64_t)c->total_compressed > f->lim.max_chunk_bytes) {
        pq_seterr(err, errlen,
                  "%s: row group %d, column '%s': refused: the chunk holds %lld bytes, more than the limit "
                  "of %llu",
                  fn, g, col, (long long)c->total_compressed, (unsigned long long)f->lim.max_chunk_bytes);
        return -1;
    }
    return 0;
}

static int parse_footer(pq_file *f, const uint8_t *buf, size_t len, char *err, size_t errlen) {
    thr_reader r;
    schema_elem *el = NULL;
    int64_t n_el = -1, num_rows = -1;
    size_t rg_at = 0;
    int have_rg = 0, rc = -1;
    int16_t last, id;
    int t;
    /* first the schema, wherever it is among the fields; the row groups need it */
    thr_init(&r, buf, len);
    thr_struct_begin(&r, &last);
    while (thr_field(&r, &last, &id, &t)) {
        if (id == 2 && t == THR_LIST && n_el < 0) {
            int et;
            n_el = thr_list(&r, &et);
            if (n_el > 0 && et != THR_STRUCT) thr_fail(&r, "the schema holds something other than structs");
            free(el);
            el = calloc((size_t)(n_el > 0 ? n_el : 1), sizeof *el);
            if (!el) {
                pq_seterr(err, errlen, "%s: out of memory reading the footer", f->name);
                return -1;
            }
            for (int64_t i = 0; i < n_el && !r.bad; i++) read_schema_elem(&r, &el[i]);
        } else if (id == 3) {
            num_rows = thr_int(&r, t);
        } else if (id == 4 && t == THR_LIST && !have_rg) {
            rg_at = thr_offset(&r);
            have_rg = 1;
            thr_skip(&r, t);
        } else {
            thr_skip(&r, t);
        }
    }
    thr_struct_end(&r);
    if (r.bad) {
        pq_seterr(err, errlen, "%s: corrupt footer (FileMetaData) at byte %zu of its %zu: %s", f->name, r.bad_at, len,
                  r.why);
        goto out;
    }
    if (n_el < 0 || !have_rg || num_rows < 0) {
        pq_seterr(err, errlen, "%s: corrupt footer: no %s", f->name,
                  n_el < 0       ? "schema"
                      : !have_rg ? "row groups"
                                 : "row count");
        goto out;
    }
    if (find_column(f, el, n_el, err, errlen) != 0) goto out;
    /* then the row groups */
    thr_init(&r, buf + rg_at, len - rg_at);
    int et;
    int64_t n = thr_list(&r, &et);
    if (n > 0 && et != THR_STRUCT) thr_fail(&r, "the row groups are not structs");
    if (r.bad) {
        pq_seterr(err, errlen, "%s: corrupt footer at byte %zu: %s", f->name, rg_at + r.bad_at, r.why);
        goto out;
    }
    if (n > INT32_MAX) n = INT32_MAX; /* bounded by the bytes left already */
    f->rg = calloc((size_t)(n > 0 ? n : 1), sizeof *f->rg);
    if (!f->rg) {
        pq_seterr(err, errlen, "%s: out of memory reading the footer", f->name);
        goto out;
    }
    int64_t sum = 0;
    for (int g = 0; g < (int)n; g++) {
        if (read_row_group(&r, f, g, err, errlen) != 0) goto out;
        if (r.bad) {
            pq_seterr(err, errlen, "%s: corrupt footer at byte %zu (row group %d): %s", f->name, rg_at + r.bad_at, g,
                      r.why);
            goto out;
        }
        f->n_rg = g + 1;
        if (f->rg[g].num_rows > INT64_MAX - sum) break;
        sum += f->rg[g].num_rows;
    }
    if (sum != num_rows) {
        pq_seterr(err, errlen, "%s: corrupt footer: the file says %lld rows but its row groups hold %lld", f->name,
                  (long long)num_rows, (long long)sum);
        goto out;
    }
    f->num_rows = num_rows;
    rc = 0;
out:
    free(el);
    return rc;
}

static pq_file *open_common(pq_file *f, const char *column, const pq_limits *limits, char *err, size_t errlen) {
    if (limits) f->lim = *limits;
    else pq_default_limits(&f->lim);
    f->column = strdup(column);
    if (!f->name || !f->column) {
        pq_seterr(err, errlen, "%s: out of memory", f->name ? f->name : "parquet");
        pq_close(f);
        return NULL;
    }
    uint8_t tail[8], head[4];
    const uint8_t *h = f->size >= 12 ? pq_file_bytes(f, 0, 4, head, err, errlen) : NULL;
    const uint8_t *tl = h ? pq_file_bytes(f, f->size - 8, 8, tail, err, errlen) : NULL;
    if (f->size < 12) {
        pq_seterr(err, errlen, "%s: not a Parquet file (%llu bytes; the smallest has 12)", f->name,
                  (unsigned long long)f->size);
    } else if (h && tl && !memcmp(tl + 4, "PARE", 4)) {
        pq_seterr(err, errlen, "%s: unsupported: an encrypted Parquet file (footer magic PARE)", f->name);
        tl = NULL;
    } else if (h && tl && (memcmp(h, "PAR1", 4) != 0 || memcmp(tl + 4, "PAR1", 4) != 0)) {
        pq_seterr(err, errlen, "%s: not a Parquet file (wrong magic: expected \"PAR1\" at its start and end)", f->name);
        tl = NULL;
    }
    if (!tl) {
        pq_close(f);
        return NULL;
    }
    uint64_t flen = pq_le32(tl);
    if (flen > f->size - 12) {
        pq_seterr(err, errlen,
                  "%s: corrupt or truncated Parquet file: the footer length %llu is more than the %llu bytes "
                  "before it",
                  f->name, (unsigned long long)flen, (unsigned long long)(f->size - 12));
        pq_close(f);
        return NULL;
    }
    f->data_end = f->size - 8 - flen;
    uint8_t *fbuf = f->fd >= 0 ? malloc(flen ? flen : 1) : NULL;
    const uint8_t *footer = (f->fd < 0 || fbuf) ? pq_file_bytes(f, f->data_end, flen, fbuf, err, errlen) : NULL;
    if (f->fd >= 0 && !fbuf)
        pq_seterr(err, errlen, "%s: out of memory for a footer of %llu bytes", f->name, (unsigned long long)flen);
    int rc = footer ? parse_footer(f, footer, flen, err, errlen) : -1;
    free(fbuf);
    if (rc != 0) {
        pq_close(f);
        return NULL;
    }
    return f;
}

pq_file *pq_open(const char *path, const char *column, const pq_limits *limits, char *err, size_t errlen) {
    pq_file *f = calloc(1, sizeof *f);
    if (!f) {
        pq_seterr(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    f->name = strdup(path);
    f->fd = open(path, O_RDONLY);
    struct stat st;
    if (f->fd < 0 || fstat(f->fd, &st) != 0) {
        pq_seterr(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        pq_close(f);
        return NULL;
    }
    f->size = (uint64_t)st.st_size;
    return open_common(f, column, limits, err, errlen);
}

pq_file *pq_open_mem(const void *data, size_t len, const char *name, const char *column, const pq_limits *limits,
                     char *err, size_t errlen) {
    pq_file *f = calloc(1, sizeof *f);
    if (!f) {
        pq_seterr(err, errlen, "%s: out of memory", name);
        return NULL;
    }
    f->name = strdup(name);
    f->fd = -1;
    f->mem = data;
    f->size = len;
    return open_common(f, column, limits, err, errlen);
}

void pq_close(pq_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    free(f->name);
    free(f->column);
    free(f->rg);
    free(f);
}

int pq_num_row_groups(const pq_file *f) { return f->n_rg; }
int64_t pq_num_rows(const pq_file *f) { return f->num_rows; }
int64_t pq_row_group_rows(const pq_file *f, int rg) { return rg >= 0 && rg < f->n_rg ? f->rg[rg].num_rows : 0; }
const char *pq_codec_name(const pq_file *f, int rg) {
    return rg >= 0 && rg < f->n_rg && f->rg[rg].codec >= 0 && f->rg[rg].codec < 8 ? pq_codec_names[f->rg[rg].codec]
                                                                                  : "?";
}
