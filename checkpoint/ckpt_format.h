/* ckpt_format.h — the on-disk format of a tetra checkpoint, without I/O policy.
 *
 * A checkpoint of step N is the folder <dump_folder>/<checkpoint.folder>/step-N:
 *
 *   rank_00000.bin ...   one file per writing rank: the raw little-endian bytes
 *                        of its chunks, back to back (each chunk starts at a
 *                        64-byte aligned offset; the gaps are zero)
 *   metadata.json        written last, by rank 0: every tensor with its global
 *                        shape, dtype and the chunks that hold it, every file
 *                        with its size, and the training state
 *
 * A chunk is part of one tensor: a flat range [start, start + count) of the
 * row-major elements of a box of the global tensor (box_start, box_shape per
 * dimension; the whole tensor for FSDP ranges, a TP block under tensor
 * parallel), stored at [offset, offset + length) of one file, with the
 * CRC-32C of those bytes. Pieces larger than CK_MAX_CHUNK_ELEMS elements are
 * split into several chunks, so a reader never needs more than that much
 * staging memory and a damaged byte is localised to one chunk.
 *
 * metadata.json:
 *   { "format": "tetra-checkpoint", "version": 1, "step": N, "model_only": false,
 *     "files":   [ {"name": "rank_00000.bin", "size": bytes}, ... ],
 *     "tensors": { "model/<name>": {"dtype": "float32", "shape": [..],
 *                    "chunks": [ {"file": 0, "offset": o, "length": n,
 *                                 "box_start": [..], "box_shape": [..],
 *                                 "start": s, "count": c, "crc32c": "89abcdef"} ] },
 *                  "optimizer/exp_avg/<name>": ..., "optimizer/exp_avg_sq/<name>": ... },
 *     ... the engine's state objects (train_state, lr_scheduler, optimizer,
 *         dataloader, rng, model, parallelism) kept verbatim }
 *
 * Everything here is pure (no MPI, no files except ck_meta_write/read), so it
 * is unit-tested directly.
 */
#ifndef TETRA_CKPT_FORMAT_H
#define TETRA_CKPT_FORMAT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "util/dtype.h"
#include "parallel/dtensor.h"

#define CK_FORMAT_NAME "tetra-checkpoint"
#define CK_FORMAT_VERSION 1
#define CK_NAME_MAX 160
#define CK_ALIGN 64
#define CK_MAX_CHUNK_ELEMS ((uint64_t)16 << 20)

/* snprintf that may truncate paths in messages on purpose (no truncation
 * warnings for fixed buffers); always NUL-terminates. Returns snprintf's value. */
int ck_snprintf(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- element types: float32, bfloat16, float16 (tetra_dtype values) */
int ck_dtype_parse(const char *s, tetra_dtype *t); /* "float32" | "bfloat16" | "float16" (also F32/BF16/F16) */
/* Convert n floats into dst of type t (round to nearest even) and back. */
void ck_encode(void *dst, const float *src, size_t n, tetra_dtype t);
void ck_decode(float *dst, const void *src, size_t n, tetra_dtype t);
uint16_t ck_f32_to_f16(float x);
float ck_f16_to_f32(uint16_t h);

/* ---- metadata */
typedef struct {
    int file;                /* index into ck_meta.files */
    uint64_t offset, length; /* bytes in that file */
    int64_t box_start[DT_MAX_DIMS];
    int64_t box_shape[DT_MAX_DIMS];
    uint64_t start, count; /* elements, row-major within the box */
    uint32_t crc;          /* CRC-32C of the length bytes */
} ck_chunk;

typedef struct {
    char name[CK_NAME_MAX]; /* "model/layers.0.attention.wq.weight" */
    tetra_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    int n_chunks, cap_chunks;
    ck_chunk *chunks;
} ck_tensor;

typedef struct {
    char name[64]; /* "rank_00003.bin" */
    uint64_t size;
} ck_file;

typedef struct {
    int64_t step;
    int model_only;
    int n_files, cap_files;
    ck_file *files;
    int n_tensors, cap_tensors;
    ck_tensor *tensors;
    json_t *state;         /* every other top-level key (owned); never NULL after init */
    int *index, index_cap; /* tensor name hash -> tensor + 1 (open addressing) */
} ck_meta;

void ck_meta_init(ck_meta *m);
void ck_meta_free(ck_meta *m);
/* Index of the file / tensor, adding it when absent; -1 when out of memory. */
int ck_meta_file(ck_meta *m, const char *name);
int ck_meta_tensor(ck_meta *m, const char *name, tetra_dtype dtype, int ndim, const int64_t *shape);
int ck_tensor_add_chunk(ck_tensor *t, const ck_chunk *c);
const ck_tensor *ck_meta_find(const ck_meta *m, const char *name);
size_t ck_tensor_numel(const ck_tensor *t);

/* JSON round trip. ck_meta_to_json returns a new reference. ck_meta_from_json
 * validates everything a reader relies on (shapes, chunk bounds inside their
 * box and file, no chunk outside the tensor) and names the offending tensor.
 * `where` prefixes messages (the file's path). */
json_t *ck_meta_to_json(const ck_meta *m);
int ck_meta_from_json(ck_meta *m, json_t *root, const char *where, char *err, size_t errlen);
/* The training-state counters a loader restores, checked for what every save
 * guarantees: train_state.step equals the checkpoint's step, and
 * train_state.tokens_seen, lr_scheduler.count, optimizer.step and
 * dataloader.position are integers >= 0 (optimizer.step also fits AdamW's int
 * step). Nothing ties the scheduler or optimizer count to the step itself:
 * checkpoint.exclude_from_loading restarts each of them on its own. An absent
 * object or key is fine (model-only saves have none). 0, or -1 with a message
 * naming `where` and the field. */
int ck_meta_check_state(const ck_meta *m, const char *where, char *err, size_t errlen);
/* metadata.json: written to path (fsync'ed, not renamed: the folder rename
 * publishes it), read back. */
int ck_meta_write(const ck_meta *m, const char *path, char *err, size_t errlen);
int ck_meta_read(ck_meta *m, const char *path, char *err, size_t errlen);

/* A rank's contribution to a save, serialised for gathering at rank 0 (no
 * assumption that ranks hold the same tensors): a compact JSON text with the
 * rank's status (error message or none), its file's size and its chunks. */
char *ck_chunks_serialise(const ck_meta *local, uint64_t file_size, const char *error);
/* Merge one serialised contribution into m, its chunks in file `file` (tensors
 * are created, or checked to have the same dtype and shape). A contribution
 * that carries an error sets *failed = 1 and copies the message to err. A rank
 * with no chunks adds no file. */
int ck_chunks_merge(ck_meta *m, const char *text, const char *file, int *failed, char *err, size_t errlen);

/* ---- overlap of a stored chunk with a wanted region (resharding) ----------
 * A region is a flat range of the row-major elements of a box, like a chunk.
 * ck_overlap calls fn once per maximal contiguous run of elements that both
 * hold: n elements starting at element src_k of the chunk's range and
 * element dst_k of the wanted range (both counted from the range starts).
 * Returns the number of elements in common. Same boxes take one interval
 * intersection; different boxes go row by row along the last dimension. */
typedef struct {
    int64_t box_start[DT_MAX_DIMS];
    int64_t box_shape[DT_MAX_DIMS];
    uint64_t start, count;
} ck_region;

typedef void (*ck_run_fn)(void *user, uint64_t src_k, uint64_t dst_k, uint64_t n);
uint64_t ck_overlap(int ndim, const ck_region *src, const ck_region *dst, ck_run_fn fn, void *user);
/* The region of a dtensor's piece, and of a chunk. */
ck_region ck_region_of_piece(const dt_tensor *t);
ck_region ck_region_of_chunk(int ndim, const ck_chunk *c);

/* ---- folder names */
/* "step-12" -> 12; -1 for anything else (including "step-12.tmp-..."). */
int64_t ck_parse_step_dir(const char *name);

#endif
