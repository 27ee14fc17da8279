/* parquet.h — read one string column of a Parquet file (FineWeb, DCLM, ...).
 *
 * What is read: the footer (FileMetaData, Thrift compact protocol, thrift.h) and, one row
 * group at a time, the column chunk of one top-level BYTE_ARRAY column, REQUIRED or
 * OPTIONAL (nulls), with
 *   - data pages v1 and v2, and a dictionary page;
 *   - PLAIN values, and dictionary indices (RLE_DICTIONARY, PLAIN_DICTIONARY) into the
 *     chunk's dictionary page, which may fall back to PLAIN pages within the chunk;
 *   - definition levels in the RLE / bit-packed hybrid encoding;
 *   - pages UNCOMPRESSED or compressed with SNAPPY, GZIP or ZSTD;
 *   - page CRCs (CRC-32 of the stored page bytes) checked where a writer recorded them.
 * The other columns are never read: their chunks are skipped whatever their type.
 *
 * Refused, with a message that names the file and, for a column chunk, the row group, the
 * column and what is unsupported: other codecs (LZO, BROTLI, LZ4, LZ4_RAW), other value
 * encodings (DELTA_*, BYTE_STREAM_SPLIT, ...), BIT_PACKED levels, a repeated or nested
 * column, a column of another type, column data in another file, encryption. Malformed
 * files (wrong magic, truncated footer, offsets outside the file, page sizes that do not
 * add up, a dictionary index out of range, pages that decompress to other than their
 * declared size, too many or too few values) are refused as corrupt, with where.
 *
 * Memory: a chunk's stored bytes, its decompressed pages and one 16-byte value per row,
 * all bounded by pq_limits (and nothing else is held). A page may not decompress to more
 * than its header declares, and the declared sizes may not exceed the chunk's own
 * metadata nor the limits, so a decompression bomb is refused before it is inflated. The
 * strings of a chunk are views into those buffers; dictionary values are not copied per
 * row, but their expanded length counts against max_text_bytes.
 */
#ifndef TETRA_PARQUET_H
#define TETRA_PARQUET_H

#include <stddef.h>
#include <stdint.h>

typedef struct pq_file pq_file;

typedef struct {
    uint64_t max_chunk_bytes; /* memory for one column chunk: stored + decompressed + values */
    uint64_t max_text_bytes;  /* the chunk's strings added up (dictionary values per use) */
} pq_limits;

/* 4 GiB each: far above a real row group (FineWeb's are tens of MB) and below harm. */
void pq_default_limits(pq_limits *l);

/* Open path and read its footer; select the column called `column` (the text). NULL with
 * a message in err when the file is not Parquet, is corrupt, has no such column, or the
 * column or one of its chunks uses something unsupported (every chunk's metadata is
 * checked here, before any data is read). limits NULL = the defaults. */
pq_file *pq_open(const char *path, const char *column, const pq_limits *limits, char *err, size_t errlen);
/* The same over a file image in memory (tests, fuzzing); name is used in messages. The
 * buffer must outlive the pq_file. */
pq_file *pq_open_mem(const void *data, size_t len, const char *name, const char *column, const pq_limits *limits,
                     char *err, size_t errlen);
void pq_close(pq_file *f);

int pq_num_row_groups(const pq_file *f);
int64_t pq_num_rows(const pq_file *f); /* all row groups */
int64_t pq_row_group_rows(const pq_file *f, int rg);
const char *pq_codec_name(const pq_file *f, int rg); /* of the text column's chunk */

/* One value of the column: NULL ptr = null. */
typedef struct {
    const char *ptr;
    uint32_t len;
} pq_value;

/* The text column of one row group, decoded. */
typedef struct {
    pq_value *values; /* one per row */
    int64_t n;
    uint64_t text_bytes; /* sum of the values' lengths */
    /* owned buffers the values point into */
    void **bufs;
    int n_bufs, cap_bufs;
    uint64_t mem; /* bytes held */
} pq_column;

/* Decode the text column of row group rg into col (freed first if it held one). 0, or -1
 * with a message naming the file, row group, column and what is wrong. */
int pq_read_column(pq_file *f, int rg, pq_column *col, char *err, size_t errlen);
void pq_column_free(pq_column *col);

#endif
