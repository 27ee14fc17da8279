/* ops_shapes.h — sizes that depend only on an op's shape, shared by the backends and by
 * planning. The CUDA backend sizes its buffers with these functions, and `tetra plan` and
 * dry runs size the CUDA layout with the same ones in a build without the CUDA backend,
 * so a plan for a GPU needs no GPU and no CUDA toolkit. Usable from C and CUDA. */
#ifndef TETRA_KERNELS_OPS_SHAPES_H
#define TETRA_KERNELS_OPS_SHAPES_H

#include <stddef.h>

#include "kernels/ops.h"

/* The CUDA built-in attention's workspace: the backward's row term Dv, [B, H, Sq] floats
 * (linear in the sequence, never S^2), plus 64 floats of slack. */
static inline size_t ops_shape_cuda_attention_workspace(const ops_attn_shape *s) {
    return ((size_t)s->b * (size_t)s->h * (size_t)s->sq + 64) * sizeof(float);
}

#endif
