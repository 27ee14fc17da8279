/* shard.h — binary token shards and their index.
 *
 * A prepared corpus is a folder:
 *
 *   <dir>/index.json            what the folder holds (see below)
 *   <dir>/train/shard_00000.bin token shards of the "train" split, in order
 *   <dir>/val/shard_00000.bin   token shards of the "val" split (if any)
 *
 * A split's token stream is the concatenation of its shards in index order
 * (a shard boundary may fall inside a document). Every document is wrapped
 * BOS ... EOS (each only when the tokenizer has it).
 *
 * Shard file (all integers little-endian):
 *
 *   offset size  field
 *        0    8  magic "TTOKSHRD"
 *        8    4  version (1)
 *       12    4  header size in bytes (64)
 *       16    4  vocab size of the tokenizer (every id is < this)
 *       20    4  token width in bytes: 2 (uint16, vocab <= 65536) or 4 (uint32)
 *       24    8  token count n
 *       32    4  CRC-32C of the payload bytes
 *       36    4  BOS id (0xFFFFFFFF = none)
 *       40    4  EOS id (0xFFFFFFFF = none)
 *       44   16  reserved, zero
 *       60    4  CRC-32C of header bytes 0..59
 *       64  n*w  payload: n token ids of w bytes each
 *
 * The file size must be exactly 64 + n*w bytes.
 *
 * index.json:
 *   { "format": "tetra-token-shards", "version": 1,
 *     "vocab_size": V, "token_bytes": 2|4, "bos_id": id|-1, "eos_id": id|-1,
 *     "tokenizer": "...", "input": "...", "val_fraction": F, "val_rule": "...",
 *     "splits": { "train": { "documents": D, "tokens": N,
 *                            "shards": [ { "file": "train/shard_00000.bin",
 *                                          "tokens": n, "crc32c": c }, ... ] },
 *                 "val": { ... } } }
 *
 * Writers write to "<name>.tmp", fsync and rename, so a file with the final
 * name is always complete; on error the temporary file is removed.
 */
#ifndef TETRA_SHARD_H
#define TETRA_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "data/doclen.h"

#define SHARD_MAGIC "TTOKSHRD"
#define SHARD_VERSION 1u
#define SHARD_HEADER_BYTES 64u
#define SHARD_NO_ID 0xFFFFFFFFu
#define SHARD_INDEX_FORMAT "tetra-token-shards"
#define SHARD_INDEX_VERSION 1

/* 2 when every id of a vocab of this size fits in uint16, else 4. */
uint32_t shard_token_bytes_for_vocab(uint32_t vocab_size);

typedef struct {
    uint32_t version;
    uint32_t vocab_size;
    uint32_t token_bytes; /* 2 or 4 */
    uint64_t n_tokens;
    uint32_t crc32c; /* of the payload */
    int64_t bos_id;  /* -1 = none */
    int64_t eos_id;  /* -1 = none */
} shard_header;

/* Encode a header into 64 bytes (computes the header CRC). */
void shard_header_encode(const shard_header *h, unsigned char out[SHARD_HEADER_BYTES]);
/* Decode and check a header: magic, version, header CRC, token width and vocab
 * size. file_size (when not 0) must equal 64 + n*w; errors name path. */
int shard_header_decode(const unsigned char *buf, size_t len, uint64_t file_size, const char *path, shard_header *h,
                        char *err, size_t errlen);

/* ---- writing ------------------------------------------------------------ */

typedef struct shard_writer shard_writer;

/* Create path (written as path.tmp until shard_writer_close). */
shard_writer *shard_writer_open(const char *path, uint32_t vocab_size, int64_t bos_id, int64_t eos_id, char *err,
                                size_t errlen);
/* Append ids; every id must be < vocab_size. */
int shard_writer_append(shard_writer *w, const uint32_t *ids, size_t n, char *err, size_t errlen);
uint64_t shard_writer_tokens(const shard_writer *w);
/* Finish the header, fsync, rename to the final name, free w. On failure the
 * temporary file is removed. *out (optional) receives the final header. */
int shard_writer_close(shard_writer *w, shard_header *out, char *err, size_t errlen);
/* Remove the temporary file and free w. */
void shard_writer_abort(shard_writer *w);

/* ---- reading (read-only memory map; safe to share across processes) ----- */

typedef struct {
    char *path;
    shard_header h;
    const unsigned char *map; /* whole file */
    size_t map_len;
    const unsigned char *tokens; /* payload = map + 64 */
} shard_file;

/* Map and validate path. verify = 1 also checks the payload CRC. */
int shard_open(shard_file *s, const char *path, int verify, char *err, size_t errlen);
void shard_close(shard_file *s);

static inline uint32_t shard_token(const shard_file *s, uint64_t i) {
    const unsigned char *p = s->tokens + i * s->h.token_bytes;
    if (s->h.token_bytes == 2) return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Copy ids [first, first+n) as int32 into out. */
void shard_read_tokens(const shard_file *s, uint64_t first, size_t n, int32_t *out);

/* ---- index.json ----------------------------------------------------------- */

typedef struct {
    char *file; /* relative to the corpus folder */
    uint64_t n_tokens;
    uint32_t crc32c;
} shard_index_shard;

typedef struct {
    char *name; /* "train", "val" */
    uint64_t n_documents;
    uint64_t n_tokens;
    int n_shards;
    shard_index_shard *shards;
    /* "document_lengths" (data/doclen.h): [[shortest length of a bucket, documents, tokens],
     * ...] for the non-empty buckets; NULL when the index has none (written before it was
     * recorded). Read: owned by the index; written: the caller's. */
    doclen_hist *doc_lengths;
} shard_index_split;

typedef struct {
    uint32_t vocab_size;
    uint32_t token_bytes;
    int64_t bos_id, eos_id;
    char *tokenizer;             /* informational; may be NULL */
    char *tokenizer_fingerprint; /* tok_fingerprint as 16 hex digits; NULL in older indexes */
    char *input;                 /* informational; may be NULL */
    double val_fraction;
    char *val_rule; /* informational; may be NULL */
    int n_splits;
    shard_index_split *splits;
} shard_index;

/* Write dir/index.json (temporary name, fsync, rename). */
int shard_index_write(const char *dir, const shard_index *ix, char *err, size_t errlen);
/* Read and check dir/index.json. */
int shard_index_read(const char *dir, shard_index *ix, char *err, size_t errlen);
void shard_index_free(shard_index *ix);
const shard_index_split *shard_index_find(const shard_index *ix, const char *split);

/* Write all of buf to fd (retrying short writes); 0 or -1 with errno set. */
int shard_write_all(int fd, const void *buf, size_t n);
/* fsync the directory holding path (so a rename in it is durable). */
int shard_fsync_parent(const char *path);

#endif
