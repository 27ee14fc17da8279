/* dtensor.c — coordinates of a distributed tensor's pieces (see dtensor.h). */
#include "parallel/dtensor.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

size_t dt_box_numel(const dt_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->box_shape[d];
    return n;
}

void dt_piece_coords(const dt_tensor *t, size_t k, int64_t coord[DT_MAX_DIMS]) {
    size_t idx = t->piece.start + k;
    for (int d = t->ndim - 1; d >= 0; d--) {
        coord[d] = t->box_start[d] + (int64_t)(idx % (size_t)t->box_shape[d]);
        idx /= (size_t)t->box_shape[d];
    }
    for (int d = t->ndim; d < DT_MAX_DIMS; d++) coord[d] = 0;
}

size_t dt_piece_global_index(const dt_tensor *t, size_t k) {
    int64_t c[DT_MAX_DIMS];
    dt_piece_coords(t, k, c);
    size_t g = 0;
    for (int d = 0; d < t->ndim; d++) g = g * (size_t)t->shape[d] + (size_t)c[d];
    return g;
}

size_t dt_piece_global_run(const dt_tensor *t, size_t k, size_t *run) {
    size_t left = t->piece.count - k;
    /* the innermost dimensions the box spans completely are contiguous in both orders */
    size_t span = 1;
    int d = t->ndim - 1;
    for (; d >= 0 && t->box_shape[d] == t->shape[d]; d--) span *= (size_t)t->box_shape[d];
    if (d >= 0) span *= (size_t)t->box_shape[d]; /* the first partial dimension: one run per row of it */
    size_t in_row = span - (t->piece.start + k) % span;
    *run = left < in_row ? left : in_row;
    return dt_piece_global_index(t, k);
}

void dt_describe(const dt_tensor *t, char *buf, size_t n) {
    char shape[96] = "";
    size_t o = 0;
    for (int d = 0; d < t->ndim && o < sizeof shape; d++)
        o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%" PRId64, d ? ", " : "", t->shape[d]);
    if (t->n_pieces == 0)
        snprintf(buf, n, "%s [%s] %s: no elements on this rank", t->name, shape, tetra_dtype_name(t->dtype));
    else
        snprintf(buf, n, "%s [%s] %s: elements [%zu, %zu) of %zu at local offset %zu", t->name, shape,
                 tetra_dtype_name(t->dtype), t->piece.start, t->piece.start + t->piece.count, dt_box_numel(t),
                 t->piece.local_offset);
}
