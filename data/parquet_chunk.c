/* parquet_chunk.c — decoding the text column's chunk of one row group (see parquet.h):
 * page headers, decompression within declared sizes, definition levels, PLAIN and
 * dictionary values. */
#include "data/parquet.h"

#include "data/parquet_internal.h"
#include "data/thrift.h"

#include <snappy-c.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

/* ---- decoding one column chunk --------------------------------------------------------- */

typedef struct {
    pq_file *f;
    int rg;
    pq_column *col;
    const pq_chunk *c;
    char *err;
    size_t errlen;
    uint64_t page_at; /* file offset of the page being decoded */
    pq_value *dict;   /* the dictionary page's values */
    int64_t dict_n;
    int have_dict, seen_data;
    int64_t cap_values;
    uint64_t declared; /* the pages' uncompressed sizes added up */
} chunk_ctx;

static int fail(chunk_ctx *x, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pq_seterr(x->err, x->errlen, "%s: row group %d, column '%s': %s", x->f->name, x->rg, x->f->column, msg);
    return -1;
}

/* Take memory for the chunk, within the limit. */
static void *chunk_alloc(chunk_ctx *x, uint64_t n) {
    pq_column *col = x->col;
    if (n > x->f->lim.max_chunk_bytes - col->mem) {
        fail(x, "refused: decoding the chunk takes more than the limit of %llu bytes of memory",
             (unsigned long long)x->f->lim.max_chunk_bytes);
        return NULL;
    }
    if (col->n_bufs == col->cap_bufs) {
        int cap = col->cap_bufs ? 2 * col->cap_bufs : 8;
        void **b = realloc(col->bufs, (size_t)cap * sizeof *b);
        if (!b) {
            fail(x, "out of memory");
            return NULL;
        }
        col->bufs = b;
        col->cap_bufs = cap;
    }
    void *p = malloc(n ? (size_t)n : 1);
    if (!p) {
        fail(x, "out of memory (%llu bytes)", (unsigned long long)n);
        return NULL;
    }
    col->bufs[col->n_bufs++] = p;
    col->mem += n;
    return p;
}

/* Decompress a page's n stored bytes into exactly `expect` bytes. */
static const uint8_t *decompress(chunk_ctx *x, const uint8_t *in, size_t n, uint64_t expect) {
    const int64_t codec = x->c->codec;
    if (codec == C_NONE) {
        if (n != expect) {
            fail(x, "corrupt: the uncompressed page at byte %llu stores %zu bytes but declares %llu",
                 (unsigned long long)x->page_at, n, (unsigned long long)expect);
            return NULL;
        }
        return in;
    }
    uint8_t *out = chunk_alloc(x, expect);
    if (!out) return NULL;
    const char *why = NULL;
    uint64_t got = 0;
    if (codec == C_SNAPPY) {
        size_t ulen = 0;
        if (snappy_uncompressed_length((const char *)in, n, &ulen) != SNAPPY_OK) why = "not Snappy data";
        else if (ulen != expect) got = ulen, why = "size";
        else {
            size_t olen = (size_t)expect;
            if (snappy_uncompress((const char *)in, n, (char *)out, &olen) != SNAPPY_OK) why = "corrupt Snappy data";
            got = olen;
        }
    } else if (codec == C_GZIP) {
        z_stream z;
        memset(&z, 0, sizeof z);
        if (inflateInit2(&z, 15 + 32) != Z_OK) why = "cannot start zlib";
        else {
            z.next_in = (Bytef *)(uintptr_t)in;
            z.avail_in = (uInt)n;
            z.next_out = out;
            z.avail_out = (uInt)expect;
            int zr = n > UINT32_MAX || expect > UINT32_MAX ? Z_DATA_ERROR : inflate(&z, Z_FINISH);
            got = z.total_out;
            if (zr != Z_STREAM_END && z.avail_out == 0) why = "size", got = expect + 1; /* more than declared */
            else if (zr != Z_STREAM_END) why = "corrupt gzip data";
            inflateEnd(&z);
        }
    } else { /* ZSTD */
        size_t r = ZSTD_decompress(out, (size_t)expect, in, n);
        if (ZSTD_isError(r)) {
            if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall) why = "size", got = expect + 1;
            else why = ZSTD_getErrorName(r);
        } else {
            got = r;
        }
    }
    if (!why && got != expect) why = "size";
    if (why && !strcmp(why, "size")) {
        if (got > expect)
            fail(x,
                 "corrupt: the %s page at byte %llu decompresses to more than the %llu bytes its header declares "
                 "(a decompression bomb?)",
                 pq_codec_names[codec], (unsigned long long)x->page_at, (unsigned long long)expect);
        else
            fail(x, "corrupt: the %s page at byte %llu decompresses to %llu bytes, not the %llu its header declares",
                 pq_codec_names[codec], (unsigned long long)x->page_at, (unsigned long long)got,
                 (unsigned long long)expect);
        return NULL;
    }
    if (why) {
        fail(x, "corrupt: the %s page at byte %llu: %s", pq_codec_names[codec], (unsigned long long)x->page_at, why);
        return NULL;
    }
    return out;
}

/* The RLE / bit-packed hybrid (Encodings.md): runs of one value, or of bit-packed groups of
 * 8 values, least significant bit first. */
typedef struct {
    const uint8_t *p, *end;
    int bw;
    uint64_t left; /* values left in the current run */
    int packed;
    uint32_t value;      /* of an RLE run */
    const uint8_t *bits; /* of a bit-packed run */
    uint64_t bitpos, bitlen;
    int bad;
} rle_iter;

static void rle_init(rle_iter *it, const uint8_t *p, size_t n, int bw) {
    memset(it, 0, sizeof *it);
    it->p = p;
    it->end = p + n;
    it->bw = bw;
}

static int rle_header(rle_iter *it) {
    uint64_t h = 0;
    for (int shift = 0;; shift += 7) {
        if (it->p >= it->end || shift > 28) return 0;
        uint8_t b = *it->p++;
        h |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) break;
    }
    if (h & 1) { /* bit-packed: h >> 1 groups of 8 values */
        uint64_t groups = h >> 1;
        it->packed = 1;
        it->left = groups * 8;
        it->bits = it->p;
        it->bitpos = 0;
        uint64_t bytes = groups * (uint64_t)it->bw;
        uint64_t avail = (uint64_t)(it->end - it->p);
        /* the last run may stop short of its final group's bytes: values past the end are
         * refused when they are read */
        it->bitlen = (bytes < avail ? bytes : avail) * 8;
        it->p += bytes < avail ? bytes : avail;
    } else {
        it->packed = 0;
        it->left = h >> 1;
        int nb = (it->bw + 7) / 8;
        if (it->end - it->p < nb) return 0;
        uint32_t v = 0;
        for (int i = 0; i < nb; i++) v |= (uint32_t)it->p[i] << (8 * i);
        it->p += nb;
        if (it->bw < 32 && (v >> it->bw)) return 0; /* wider than the bit width */
        it->value = v;
    }
    return 1;
}

/* The next value; 0 when the data ends or is malformed (bad is set for malformed). */
static int rle_next(rle_iter *it, uint32_t *v) {
    while (it->left == 0) {
        if (it->p >= it->end) return 0;
        if (!rle_header(it)) {
            it->bad = 1;
            return 0;
        }
    }
    if (!it->packed) {
        *v = it->value;
    } else {
        if (it->bitpos + (uint64_t)it->bw > it->bitlen) return 0;
        uint64_t acc = 0;
        size_t byte = (size_t)(it->bitpos >> 3);
        size_t have = (size_t)((it->bitlen >> 3) - byte);
        for (size_t i = 0; i < 8 && i < have; i++) acc |= (uint64_t)it->bits[byte + i] << (8 * i);
        acc >>= it->bitpos & 7;
        *v = it->bw == 32 ? (uint32_t)acc : (uint32_t)(acc & ((1u << it->bw) - 1));
        it->bitpos += (uint64_t)it->bw;
    }
    it->left--;
    return 1;
}

/* PLAIN byte arrays: a 4-byte little-endian length, then the bytes. */
static int plain_next(chunk_ctx *x, const uint8_t **p, const uint8_t *end, pq_value *v) {
    if (end - *p < 4)
        return fail(x, "corrupt: the PLAIN values of the page at byte %llu end early", (unsigned long long)x->page_at);
    uint32_t len = pq_le32(*p);
    if (len > (uint64_t)(end - *p - 4))
        return fail(x, "corrupt: a PLAIN value of %u bytes runs past the end of the page at byte %llu", len,
                    (unsigned long long)x->page_at);
    v->ptr = (const char *)*p + 4;
    v->len = len;
    *p += 4 + (size_t)len;
    return 0;
}

static int read_dictionary(chunk_ctx *x, int64_t n, int64_t enc, const uint8_t *data, size_t len) {
    char b[32];
    if (x->have_dict || x->seen_data)
        return fail(x,
                    "corrupt: a second dictionary page, or one after data pages, at "
                    "byte %llu",
                    (unsigned long long)x->page_at);
    if (enc != E_PLAIN && enc != E_PLAIN_DICT)
        return fail(x, "unsupported: dictionary page encoding %s", NAME(pq_encoding_names, enc, b));
    if (n < 0 || (uint64_t)n > len / 4)
        return fail(x, "corrupt: the dictionary page at byte %llu declares %lld values in %zu bytes",
                    (unsigned long long)x->page_at, (long long)n, len);
    x->dict = chunk_alloc(x, (uint64_t)(n ? n : 1) * sizeof *x->dict);
    if (!x->dict) return -1;
    const uint8_t *p = data, *end = data + len;
    for (int64_t i = 0; i < n; i++)
        if (plain_next(x, &p, end, &x->dict[i]) != 0) return -1;
    x->dict_n = n;
    x->have_dict = 1;
    return 0;
}

/* Append rows [..+n) of a data page: levels (def, NULL when required) and values. */
static int add_values(chunk_ctx *x, int64_t n, rle_iter *def, int64_t enc, const uint8_t *vals, size_t vlen,
                      int64_t *nulls) {
    pq_column *col = x->col;
    char b[32];
    if (n < 0 || n > x->c->num_rows - col->n)
        return fail(x,
                    "corrupt: the page at byte %llu holds %lld values, more than the %lld rows left in the row group",
                    (unsigned long long)x->page_at, (long long)n, (long long)(x->c->num_rows - col->n));
    const int dict = enc == E_RLE_DICT || enc == E_PLAIN_DICT;
    if (enc != E_PLAIN && !dict) return fail(x, "unsupported: value encoding %s", NAME(pq_encoding_names, enc, b));
    if (dict && !x->have_dict)
        return fail(x, "corrupt: the page at byte %llu uses a dictionary but the chunk has no dictionary page",
                    (unsigned long long)x->page_at);
    if (col->n + n > x->cap_values) { /* grow within the memory limit */
        int64_t cap = x->cap_values ? x->cap_values : 1024;
        while (cap < col->n + n) cap *= 2;
        if (cap > x->c->num_rows) cap = x->c->num_rows;
        uint64_t add = (uint64_t)(cap - x->cap_values) * sizeof(pq_value);
        if (add > x->f->lim.max_chunk_bytes - col->mem)
            return fail(x, "refused: decoding the chunk takes more than the limit of %llu bytes of memory",
                        (unsigned long long)x->f->lim.max_chunk_bytes);
        pq_value *v = realloc(col->values, (size_t)cap * sizeof *v);
        if (!v) return fail(x, "out of memory");
        col->values = v;
        col->mem += add;
        x->cap_values = cap;
    }
    rle_iter idx;
    const uint8_t *p = vals, *end = vals + vlen;
    if (dict) {
        if (vlen < 1 || vals[0] > 32)
            return fail(x, "corrupt: bad dictionary index bit width in the page at byte %llu",
                        (unsigned long long)x->page_at);
        rle_init(&idx, vals + 1, vlen - 1, vals[0]);
    }
    *nulls = 0;
    for (int64_t i = 0; i < n; i++) {
        pq_value *v = &col->values[col->n];
        uint32_t level = 1;
        if (def && !rle_next(def, &level))
            return fail(x, "corrupt: the definition levels of the page at byte %llu end after %lld of %lld values",
                        (unsigned long long)x->page_at, (long long)i, (long long)n);
        if (level > 1)
            return fail(x,
                        "corrupt: definition level %u in the page at byte %llu (the column's maximum "
                        "is 1)",
                        level, (unsigned long long)x->page_at);
        if (level == 0) {
            v->ptr = NULL;
            v->len = 0;
            (*nulls)++;
        } else if (dict) {
            uint32_t k;
            if (!rle_next(&idx, &k))
                return fail(x, "corrupt: the dictionary indices of the page at byte %llu end after %lld values",
                            (unsigned long long)x->page_at, (long long)i);
            if (k >= (uint64_t)x->dict_n)
                return fail(x,
                            "corrupt: dictionary index %u out of range in the page at byte %llu (the dictionary "
                            "has %lld values)",
                            k, (unsigned long long)x->page_at, (long long)x->dict_n);
            *v = x->dict[k];
        } else if (plain_next(x, &p, end, v) != 0) {
            return -1;
        }
        col->text_bytes += v->len;
        if (col->text_bytes > x->f->lim.max_text_bytes)
            return fail(x, "refused: the chunk's strings add up to more than the limit of %llu bytes",
                        (unsigned long long)x->f->lim.max_text_bytes);
        col->n++;
    }
    return 0;
}

typedef struct {
    int64_t type, usize, csize, crc;
    int has_crc;
    int64_t nv, enc, def_enc, nulls, rows, def_len, rep_len, dict_enc;
    int compressed;
    int have_v1, have_v2, have_dict;
} page_header;

static void read_page_sub(thr_reader *r, page_header *h, int which) {
    int16_t last, id;
    int t;
    thr_struct_begin(r, &last);
    while (thr_field(r, &last, &id, &t)) {
        if (which == 5 && id >= 1 && id <= 4) {
            int64_t v = thr_int(r, t);
            if (id == 1) h->nv = v;
            else if (id == 2) h->enc = v;
            else if (id == 3) h->def_enc = v;
        } else if (which == 7 && (id == 1 || id == 2)) {
            int64_t v = thr_int(r, t);
            if (id == 1) h->nv = v;
            else h->dict_enc = v;
        } else if (which == 8 && id >= 1 && id <= 6) {
            int64_t v = thr_int(r, t);
            if (id == 1) h->nv = v;
            else if (id == 2) h->nulls = v;
            else if (id == 3) h->rows = v;
            else if (id == 4) h->enc = v;
            else if (id == 5) h->def_len = v;
            else h->rep_len = v;
        } else if (which == 8 && id == 7 && (t == THR_TRUE || t == THR_FALSE)) {
            h->compressed = thr_bool_field(t);
        } else {
            thr_skip(r, t);
        }
    }
    thr_struct_end(r);
}

static void read_page_header(thr_reader *r, page_header *h) {
    int16_t last, id;
    int t;
    memset(h, 0, sizeof *h);
    h->type = h->usize = h->csize = h->nv = h->enc = h->def_enc = h->dict_enc = -1;
    h->compressed = 1; /* the default of is_compressed */
    thr_struct_begin(r, &last);
    while (thr_field(r, &last, &id, &t)) {
        if (id == 1) h->type = thr_int(r, t);
        else if (id == 2) h->usize = thr_int(r, t);
        else if (id == 3) h->csize = thr_int(r, t);
        else if (id == 4) h->crc = thr_int(r, t), h->has_crc = 1;
        else if ((id == 5 || id == 7 || id == 8) && t == THR_STRUCT) {
            read_page_sub(r, h, id);
            if (id == 5) h->have_v1 = 1;
            else if (id == 7) h->have_dict = 1;
            else h->have_v2 = 1;
        } else {
            thr_skip(r, t);
        }
    }
    thr_struct_end(r);
}

static int data_page_v1(chunk_ctx *x, const page_header *h, const uint8_t *stored) {
    char b[32];
    const uint8_t *page = decompress(x, stored, (size_t)h->csize, (uint64_t)h->usize);
    if (!page) return -1;
    size_t len = (size_t)h->usize, pos = 0;
    rle_iter def, *dp = NULL;
    if (x->f->max_def) {
        if (h->def_enc == E_BIT_PACKED) return fail(x, "unsupported: BIT_PACKED definition levels (deprecated)");
        if (h->def_enc != E_RLE)
            return fail(x, "unsupported: definition level encoding %s", NAME(pq_encoding_names, h->def_enc, b));
        if (len < 4 || pq_le32(page) > len - 4)
            return fail(x, "corrupt: the definition levels of the page at byte %llu run past its end",
                        (unsigned long long)x->page_at);
        rle_init(&def, page + 4, pq_le32(page), 1);
        pos = 4 + (size_t)pq_le32(page);
        dp = &def;
    }
    int64_t nulls;
    if (add_values(x, h->nv, dp, h->enc, page + pos, len - pos, &nulls) != 0) return -1;
    if (dp && def.bad)
        return fail(x, "corrupt: malformed definition levels in the page at byte %llu", (unsigned long long)x->page_at);
    return 0;
}

static int data_page_v2(chunk_ctx *x, const page_header *h, const uint8_t *stored) {
    if (h->def_len < 0 || h->rep_len != 0 || h->def_len > h->csize || h->def_len > h->usize ||
        (!x->f->max_def && h->def_len != 0))
        return fail(x,
                    "corrupt: the page at byte %llu has %lld bytes of definition and %lld of repetition levels "
                    "(the column has %s and no repetition)",
                    (unsigned long long)x->page_at, (long long)h->def_len, (long long)h->rep_len,
                    x->f->max_def ? "definition levels" : "none");
    if (h->nulls < 0 || h->nulls > h->nv || h->rows != h->nv)
        return fail(x, "corrupt: the page at byte %llu declares %lld values, %lld nulls and %lld rows",
                    (unsigned long long)x->page_at, (long long)h->nv, (long long)h->nulls, (long long)h->rows);
    const size_t dl = (size_t)h->def_len;
    const uint8_t *vals;
    if (h->compressed) {
        vals = decompress(x, stored + dl, (size_t)h->csize - dl, (uint64_t)(h->usize - h->def_len));
    } else if (h->csize != h->usize) {
        return fail(x, "corrupt: the page at byte %llu is not compressed but stores %lld bytes and declares %lld",
                    (unsigned long long)x->page_at, (long long)h->csize, (long long)h->usize);
    } else {
        vals = stored + dl;
    }
    if (!vals) return -1;
    rle_iter def;
    rle_init(&def, stored, dl, 1);
    int64_t nulls;
    if (add_values(x, h->nv, x->f->max_def ? &def : NULL, h->enc, vals, (size_t)(h->usize - h->def_len), &nulls) != 0)
        return -1;
    if (def.bad)
        return fail(x, "corrupt: malformed definition levels in the page at byte %llu", (unsigned long long)x->page_at);
    if (nulls != h->nulls)
        return fail(x, "corrupt: the page at byte %llu declares %lld nulls but its levels hold %lld",
                    (unsigned long long)x->page_at, (long long)h->nulls, (long long)nulls);
    return 0;
}

static int one_page(chunk_ctx *x, const uint8_t *chunk, size_t len, size_t *pos) {
    thr_reader r;
    page_header h;
    x->page_at = (uint64_t)x->c->start + *pos;
    thr_init(&r, chunk + *pos, len - *pos);
    read_page_header(&r, &h);
    if (r.bad) return fail(x, "corrupt: the page header at byte %llu: %s", (unsigned long long)x->page_at, r.why);
    const size_t hl = thr_offset(&r);
    if (h.csize < 0 || h.usize < 0 || (uint64_t)h.csize > len - *pos - hl)
        return fail(x, "corrupt: the page at byte %llu stores %lld bytes, but %zu are left in the chunk",
                    (unsigned long long)x->page_at, (long long)h.csize, len - *pos - hl);
    /* a bomb: pages that claim more than the chunk's metadata says they hold */
    x->declared += (uint64_t)h.usize;
    if (x->declared > (uint64_t)x->c->total_uncompressed)
        return fail(x,
                    "corrupt: the pages declare more than the %lld uncompressed bytes of the chunk's metadata "
                    "(page at byte %llu declares %lld)",
                    (long long)x->c->total_uncompressed, (unsigned long long)x->page_at, (long long)h.usize);
    const uint8_t *stored = chunk + *pos + hl;
    if (h.has_crc && (uint32_t)crc32(0, stored, (uInt)h.csize) != (uint32_t)h.crc)
        return fail(x, "corrupt: the page at byte %llu fails its CRC-32 check", (unsigned long long)x->page_at);
    *pos += hl + (size_t)h.csize;
    switch (h.type) {
    case P_DICT:
        if (!h.have_dict) break;
        {
            const uint8_t *d = decompress(x, stored, (size_t)h.csize, (uint64_t)h.usize);
            return d ? read_dictionary(x, h.nv, h.dict_enc, d, (size_t)h.usize) : -1;
        }
    case P_DATA:
        if (!h.have_v1) break;
        x->seen_data = 1;
        return data_page_v1(x, &h, stored);
    case P_DATA_V2:
        if (!h.have_v2) break;
        x->seen_data = 1;
        return data_page_v2(x, &h, stored);
    case P_INDEX: return 0;
    default:
        return fail(x, "unsupported: page type %lld at byte %llu", (long long)h.type, (unsigned long long)x->page_at);
    }
    return fail(x, "corrupt: the page at byte %llu has no header for its type %lld", (unsigned long long)x->page_at,
                (long long)h.type);
}

void pq_column_free(pq_column *col) {
    if (!col) return;
    for (int i = 0; i < col->n_bufs; i++) free(col->bufs[i]);
    free(col->bufs);
    free(col->values);
    memset(col, 0, sizeof *col);
}

int pq_read_column(pq_file *f, int rg, pq_column *col, char *err, size_t errlen) {
    pq_column_free(col);
    if (rg < 0 || rg >= f->n_rg) {
        pq_seterr(err, errlen, "%s: no row group %d", f->name, rg);
        return -1;
    }
    chunk_ctx x;
    memset(&x, 0, sizeof x);
    x.f = f;
    x.rg = rg;
    x.col = col;
    x.c = &f->rg[rg];
    x.err = err;
    x.errlen = errlen;
    const size_t len = (size_t)x.c->total_compressed;
    uint8_t *buf = NULL;
    if (f->fd >= 0 && !(buf = chunk_alloc(&x, len))) goto fail;
    char e[512];
    const uint8_t *chunk = pq_file_bytes(f, (uint64_t)x.c->start, len, buf, e, sizeof e);
    if (!chunk) {
        pq_seterr(err, errlen, "%s", e);
        goto fail;
    }
    size_t pos = 0;
    while (pos < len)
        if (one_page(&x, chunk, len, &pos) != 0) goto fail;
    if (col->n != x.c->num_rows) {
        fail(&x, "corrupt: the chunk's pages hold %lld values but the row group has %lld rows", (long long)col->n,
             (long long)x.c->num_rows);
        goto fail;
    }
    return 0;
fail:
    pq_column_free(col);
    return -1;
}
