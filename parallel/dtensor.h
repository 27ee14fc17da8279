/* dtensor.h — the descriptor of a distributed tensor (the role PyTorch's
 * DTensor plays): name, global shape, dtype, and which pieces of the global
 * tensor this rank holds and where they lie in its local storage.
 *
 * A piece is a flat range [start, start + count) of the row-major elements of
 * a box of the global tensor (box_start, box_shape per dimension). Without
 * tensor parallel the box is the whole tensor and a piece is an FSDP range of
 * the tensor's row-major elements; under TP the box is the rank's TP block and
 * FSDP ranges are taken inside it. Checkpoints name every element by its
 * global coordinates through this descriptor alone.
 *
 * parallel/ builds these from plain (name, shape, offset, numel) records; it
 * never knows which model they came from.
 */
#ifndef TETRA_PARALLEL_DTENSOR_H
#define TETRA_PARALLEL_DTENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

#define DT_MAX_DIMS 4
#define DT_NAME_MAX 96

/* A parameter as a model declares it: this rank's unsharded layout. */
typedef struct {
    const char *name;
    int unit; /* FSDP unit (communication group of parameters) */
    int ndim;
    int64_t shape[DT_MAX_DIMS];     /* global shape */
    int64_t box_start[DT_MAX_DIMS]; /* the block of the global tensor this rank holds (tensor */
    int64_t box_shape[DT_MAX_DIMS]; /* parallel); box_shape[0] == 0 means the whole tensor */
    size_t numel;                   /* elements of the box */
    size_t offset;                  /* elements from the start of the flat unsharded index space */
    int replicated;                 /* every rank of the tensor-parallel group holds this same box: its
                                  gradient is a partial sum over that group, and checkpoints take it
                                  from the group's first rank */
} dt_param_decl;

typedef struct {
    size_t start;        /* first element (row-major within the box) */
    size_t count;        /* elements */
    size_t local_offset; /* where they start in the rank's local storage (elements) */
} dt_piece;

typedef struct {
    char name[DT_NAME_MAX];
    tetra_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];     /* global shape */
    size_t numel;                   /* global elements */
    int64_t box_start[DT_MAX_DIMS]; /* the block this rank's pieces are taken from */
    int64_t box_shape[DT_MAX_DIMS];
    int unit;
    int n_pieces; /* 0 (holds nothing) or 1 */
    dt_piece piece;
} dt_tensor;

/* Elements in the box. */
size_t dt_box_numel(const dt_tensor *t);
/* Global coordinates of element k of the piece (0 <= k < piece.count). */
void dt_piece_coords(const dt_tensor *t, size_t k, int64_t coord[DT_MAX_DIMS]);
/* Global row-major index of element k of the piece. */
size_t dt_piece_global_index(const dt_tensor *t, size_t k);
/* The same, and in *run how many piece elements from k on are consecutive in the
 * global row-major order (to the end of the piece or of a box row narrower than the
 * tensor). */
size_t dt_piece_global_run(const dt_tensor *t, size_t k, size_t *run);
/* "layers.0.attention.wq.weight [256, 256] float32: elements [0, 16384) of 65536 at local 0" */
void dt_describe(const dt_tensor *t, char *buf, size_t n);

#endif
