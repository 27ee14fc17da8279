/* parquet_internal.h — what parquet.c (the footer) and parquet_chunk.c (a column chunk's
 * pages) share. Not a contract: parquet.h is. */
#ifndef TETRA_PARQUET_INTERNAL_H
#define TETRA_PARQUET_INTERNAL_H

#include "data/parquet.h"

#include <stddef.h>
#include <stdint.h>

/* enums of parquet.thrift */
enum { T_BYTE_ARRAY = 6 };
enum { REP_REQUIRED = 0, REP_OPTIONAL = 1, REP_REPEATED = 2 };
enum { C_NONE = 0, C_SNAPPY = 1, C_GZIP = 2, C_ZSTD = 6 };
enum { E_PLAIN = 0, E_PLAIN_DICT = 2, E_RLE = 3, E_BIT_PACKED = 4, E_RLE_DICT = 8 };
enum { P_DATA = 0, P_INDEX = 1, P_DICT = 2, P_DATA_V2 = 3 };

extern const char *const pq_codec_names[8];
extern const char *const pq_encoding_names[11];
extern const char *const pq_type_names[8];

/* names[v], or "unknown (v)" in buf */
const char *pq_name_of(const char *const *names, size_t n, int64_t v, char *buf, size_t bn);
#define NAME(tab, v, buf) pq_name_of(tab, sizeof tab / sizeof *tab, v, buf, sizeof buf)

/* the text column's chunk in one row group, from the footer */
typedef struct {
    int64_t num_rows;
    int64_t codec;
    int64_t num_values;
    int64_t total_uncompressed, total_compressed;
    int64_t start; /* first page: the dictionary page's offset, else the first data page's */
} pq_chunk;

struct pq_file {
    char *name, *column;
    int fd; /* -1: an image in memory */
    const uint8_t *mem;
    uint64_t size;
    uint64_t data_end; /* where the footer starts */
    pq_limits lim;
    int max_def; /* 0: REQUIRED, 1: OPTIONAL */
    int leaf;    /* the column's place among the schema's leaves */
    int n_leaves;
    int n_rg;
    pq_chunk *rg;
    int64_t num_rows;
};

void pq_seterr(char *err, size_t errlen, const char *fmt, ...);

static inline uint32_t pq_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* n bytes at offset off of the file: read into buf (a file), or a view (memory). */
const uint8_t *pq_file_bytes(pq_file *f, uint64_t off, size_t n, uint8_t *buf, char *err, size_t errlen);

#endif
