/* megatron.c — Megatron-LM indexed datasets, memory-mapped (see megatron.h). */
#include "data/megatron.h"

#include "util/crc32c.h"
#include "util/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MG_MAGIC "MMIDIDX\0\0"
#define MG_HEADER 34u

static const struct {
    const char *name;
    int width;
    uint64_t max;
} g_dtypes[9] = {{"?", 0, 0},         {"uint8", 1, 255},         {"int8", 1, 127},
                 {"int16", 2, 32767}, {"int32", 4, 2147483647u}, {"int64", 8, INT64_MAX},
                 {"float64", 8, 0},   {"float32", 4, 0},         {"uint16", 2, 65535}};

const char *mg_dtype_name(int code) { return code >= 1 && code <= 8 ? g_dtypes[code].name : "unknown"; }
uint64_t mg_dtype_max(int code) { return code >= 1 && code <= 8 ? g_dtypes[code].max : 0; }

static uint64_t rd64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* PREFIX from PREFIX, PREFIX.idx or PREFIX.bin (a malloc'd copy). */
static char *prefix_of(const char *path) {
    size_t n = strlen(path);
    if (n > 4 && (!strcmp(path + n - 4, ".idx") || !strcmp(path + n - 4, ".bin"))) n -= 4;
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, path, n);
    p[n] = 0;
    return p;
}

static char *with_suffix(const char *prefix, const char *suffix) {
    size_t n = strlen(prefix), k = strlen(suffix);
    char *p = malloc(n + k + 1);
    if (!p) return NULL;
    memcpy(p, prefix, n);
    memcpy(p + n, suffix, k + 1);
    return p;
}

int mg_is_dataset(const char *path) {
    if (!path || !*path) return 0;
    char *prefix = prefix_of(path);
    char *idx = prefix ? with_suffix(prefix, ".idx") : NULL;
    struct stat st;
    int yes = idx && stat(idx, &st) == 0 && S_ISREG(st.st_mode);
    free(idx);
    free(prefix);
    return yes;
}

static int map_whole(const char *path, const unsigned char **data, size_t *len, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        util_set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    *data = NULL;
    *len = (size_t)st.st_size;
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            util_set_err(err, errlen, "%s: cannot map: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        *data = p;
    }
    close(fd);
    return 0;
}

void mg_close(mg_dataset *d) {
    if (!d) return;
    if (d->idx) munmap((void *)d->idx, d->idx_len);
    if (d->bin) munmap((void *)d->bin, d->bin_len);
    free(d->prefix);
    memset(d, 0, sizeof *d);
}

/* The header: magic, version, dtype, counts, and the index's size. */
static int check_header(mg_dataset *d, const char *ip, char *err, size_t errlen) {
    const unsigned char *x = d->idx;
    if (d->idx_len < MG_HEADER || memcmp(x, MG_MAGIC, 9) != 0) {
        util_set_err(err, errlen, "%s: not a Megatron index (%s; expected the magic \"MMIDIDX\" and a 34-byte header)",
                     ip, d->idx_len < MG_HEADER ? "too short" : "wrong magic");
        return -1;
    }
    if (rd64(x + 9) != 1) {
        util_set_err(err, errlen, "%s: Megatron index version %llu; only version 1 is known", ip,
                     (unsigned long long)rd64(x + 9));
        return -1;
    }
    d->dtype = x[17];
    if (d->dtype < 1 || d->dtype > 8) {
        util_set_err(err, errlen, "%s: unknown dtype code %d (Megatron's are 1..8)", ip, d->dtype);
        return -1;
    }
    if (d->dtype == 6 || d->dtype == 7) {
        util_set_err(err, errlen, "%s: dtype %s holds no token ids", ip, mg_dtype_name(d->dtype));
        return -1;
    }
    d->width = g_dtypes[d->dtype].width;
    const uint64_t S = rd64(x + 18), D = rd64(x + 26), body = d->idx_len - MG_HEADER;
    if (S > body / 12 || (body - 12 * S) / 8 < D) {
        util_set_err(err, errlen,
                     "%s: truncated or corrupt index: %llu sequences and %llu document indices need more than "
                     "its %zu bytes",
                     ip, (unsigned long long)S, (unsigned long long)D, d->idx_len);
        return -1;
    }
    const uint64_t rest = body - 12 * S - 8 * D;
    if (rest == S && S > 0) {
        util_set_err(err, errlen, "%s: unsupported: a multimodal dataset (it has sequence modes)", ip);
        return -1;
    }
    if (rest != 0) {
        util_set_err(err, errlen,
                     "%s: corrupt index: %llu bytes more than %llu sequences and %llu document indices take", ip,
                     (unsigned long long)rest, (unsigned long long)S, (unsigned long long)D);
        return -1;
    }
    d->n_sequences = S;
    if (D < 1) {
        util_set_err(err, errlen, "%s: corrupt index: no document indices (there must be at least the leading 0)", ip);
        return -1;
    }
    d->n_documents = D - 1;
    return 0;
}

/* Lengths, pointers (back to back from 0, ending at the .bin's end) and document indices. */
static int check_arrays(mg_dataset *d, const char *ip, const char *bp, char *err, size_t errlen) {
    const unsigned char *len = d->idx + MG_HEADER, *ptr = len + 4 * d->n_sequences, *doc = ptr + 8 * d->n_sequences;
    uint64_t at = 0;
    for (uint64_t i = 0; i < d->n_sequences; i++) {
        const int32_t n = (int32_t)rd32(len + 4 * i);
        const uint64_t p = rd64(ptr + 8 * i);
        if (n < 0) {
            util_set_err(err, errlen, "%s: corrupt index: sequence %llu has length %d", ip, (unsigned long long)i, n);
            return -1;
        }
        if (p != at) {
            util_set_err(err, errlen,
                         "%s: sequence %llu starts at byte %llu of %s, not at %llu where the one before it ends "
                         "(unsupported: sequences not stored back to back, or a corrupt index)",
                         ip, (unsigned long long)i, (unsigned long long)p, bp, (unsigned long long)at);
            return -1;
        }
        if ((uint64_t)n * (uint64_t)d->width > d->bin_len - at) {
            util_set_err(err, errlen,
                         "%s: sequence %llu (%d tokens at byte %llu) runs past the end of %s (%zu bytes): "
                         "truncated data",
                         ip, (unsigned long long)i, n, (unsigned long long)at, bp, d->bin_len);
            return -1;
        }
        at += (uint64_t)n * (uint64_t)d->width;
    }
    if (at != d->bin_len) {
        util_set_err(err, errlen, "%s: has %zu bytes but the %llu sequences of %s take %llu", bp, d->bin_len,
                     (unsigned long long)d->n_sequences, ip, (unsigned long long)at);
        return -1;
    }
    d->n_tokens = at / (uint64_t)d->width;
    uint64_t prev = 0;
    for (uint64_t k = 0; k <= d->n_documents; k++) {
        const uint64_t v = rd64(doc + 8 * k);
        if ((k == 0 && v != 0) || v < prev || v > d->n_sequences || (k == d->n_documents && v != d->n_sequences)) {
            util_set_err(err, errlen,
                         "%s: corrupt index: document index %llu is %llu (they rise from 0 to the %llu "
                         "sequences)",
                         ip, (unsigned long long)k, (unsigned long long)v, (unsigned long long)d->n_sequences);
            return -1;
        }
        prev = v;
    }
    return 0;
}

int mg_open(mg_dataset *d, const char *path, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    d->prefix = prefix_of(path);
    char *ip = d->prefix ? with_suffix(d->prefix, ".idx") : NULL,
         *bp = d->prefix ? with_suffix(d->prefix, ".bin") : NULL;
    int rc = -1;
    if (!ip || !bp) util_set_err(err, errlen, "out of memory");
    else if (map_whole(ip, &d->idx, &d->idx_len, err, errlen) == 0 &&
             map_whole(bp, &d->bin, &d->bin_len, err, errlen) == 0 && check_header(d, ip, err, errlen) == 0 &&
             check_arrays(d, ip, bp, err, errlen) == 0)
        rc = 0;
    if (rc == 0) d->idx_crc = crc32c(0, d->idx, d->idx_len);
    free(ip);
    free(bp);
    if (rc != 0) mg_close(d);
    return rc;
}

static int64_t token_at(const mg_dataset *d, uint64_t i) {
    const unsigned char *p = d->bin + i * (uint64_t)d->width;
    switch (d->dtype) {
    case 1: return p[0];
    case 2: return (int8_t)p[0];
    case 3: return (int16_t)(uint16_t)(p[0] | (p[1] << 8));
    case 4: return (int32_t)rd32(p);
    case 5: return (int64_t)rd64(p);
    default: return (uint16_t)(p[0] | (p[1] << 8)); /* 8: uint16 */
    }
}

/* The sequence holding token i (the last whose pointer is at or before it). */
static uint64_t sequence_of(const mg_dataset *d, uint64_t i) {
    const unsigned char *ptr = d->idx + MG_HEADER + 4 * d->n_sequences;
    const uint64_t off = i * (uint64_t)d->width;
    uint64_t lo = 0, hi = d->n_sequences ? d->n_sequences - 1 : 0;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo + 1) / 2;
        if (rd64(ptr + 8 * mid) <= off) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* The first stream token of document k (k = n_documents: the stream's end). */
static uint64_t doc_start(const mg_dataset *d, uint64_t k) {
    const unsigned char *ptr = d->idx + MG_HEADER + 4 * d->n_sequences, *doc = ptr + 8 * d->n_sequences;
    const uint64_t s = rd64(doc + 8 * k);
    return s >= d->n_sequences ? d->n_tokens : rd64(ptr + 8 * s) / (uint64_t)d->width;
}

void mg_doc_lengths(const mg_dataset *d, doclen_hist *h) {
    for (uint64_t k = 0; k < d->n_documents; k++) doclen_add(h, doc_start(d, k + 1) - doc_start(d, k));
}

void mg_doc_ids(const mg_dataset *d, uint64_t first, size_t n, int32_t *ids) {
    if (!d->n_documents) { /* no tokens either */
        memset(ids, 0, n * sizeof *ids);
        return;
    }
    uint64_t lo = 0, hi = d->n_documents ? d->n_documents - 1 : 0;
    while (lo < hi) { /* the last document that starts at or before token first */
        uint64_t mid = lo + (hi - lo + 1) / 2;
        if (doc_start(d, mid) <= first) lo = mid;
        else hi = mid - 1;
    }
    uint64_t k = lo, next = doc_start(d, k + 1);
    int32_t id = 0;
    for (size_t i = 0; i < n; i++) {
        if (first + i >= next) { /* a new document (skipping empty ones) */
            while (first + i >= next && k + 1 < d->n_documents) next = doc_start(d, ++k + 1);
            id++;
        }
        ids[i] = id;
    }
}

int mg_read(const mg_dataset *d, uint64_t first, size_t n, uint32_t vocab, int32_t *out, char *err, size_t errlen) {
    if (first > d->n_tokens || n > d->n_tokens - first) {
        util_set_err(err, errlen, "%s.bin: tokens [%llu, %llu) are past its %llu tokens", d->prefix,
                     (unsigned long long)first, (unsigned long long)(first + n), (unsigned long long)d->n_tokens);
        return -1;
    }
    for (size_t k = 0; k < n; k++) {
        const int64_t v = token_at(d, first + k);
        if (v < 0 || v >= (int64_t)vocab) {
            util_set_err(err, errlen,
                         "%s.bin: token %llu (sequence %llu) holds id %lld, outside the model's vocabulary of %u "
                         "ids (a Megatron dataset records no tokenizer: was it tokenized with another one?)",
                         d->prefix, (unsigned long long)(first + k), (unsigned long long)sequence_of(d, first + k),
                         (long long)v, vocab);
            return -1;
        }
        out[k] = (int32_t)v;
    }
    return 0;
}
