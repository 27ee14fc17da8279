/* cuda_cudnn.h — cuDNN's fused attention (SDPA) for the bf16 attention ops (C interface).
 *
 * Layouts are those of the attention ops in kernels/ops.h: q/out/dq/dout [B, Sq, H, D],
 * k/v/dk/dv [B, Sk, KV, D] (bf16 bit patterns), lse [B, H, Sq] fp32, the natural log of
 * the softmax denominator of the scaled scores. GQA reads key/value head h / (H / KV)
 * without copies. Pointers are device memory; `stream` is a cudaStream_t. Every call
 * that can fail returns non-zero (or (size_t)-1) and leaves the caller to run its own
 * kernel. Built without cuDNN (TETRA_HAVE_CUDNN undefined), every function answers
 * "not supported", and the caller's own kernel runs.
 */
#ifndef TETRA_CUDA_CUDNN_H
#define TETRA_CUDA_CUDNN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cuDNN version the process runs with (e.g. 91900 for 9.19.0); 0 when built without cuDNN. */
int cuda_cudnn_version(void);

/* 1 when the fused SDPA can run this shape: built with cuDNN (TETRA_HAVE_CUDNN), a device
 * of compute capability >= 8.0, d % 8 == 0 and d <= 128 (256 on sm_90), h % kv == 0, and
 * either causal with q_offset == k_offset and sq == sk (top-left diagonal), or non-causal. */
int cuda_cudnn_sdpa_supported(const ops_attn_shape *s);

/* Workspace bytes for the forward (backward = 0) or backward (1) plan of this shape;
 * builds and caches the plan (first call per shape, at start-up). Returns (size_t)-1 when
 * no plan can be built (the caller then falls back; cuda_cudnn_last_error says why). */
size_t cuda_cudnn_sdpa_workspace_size(const ops_attn_shape *s, int backward);

/* out [B, Sq, H, D] and lse [B, H, Sq] are written. 0 on success; non-zero with a message
 * in err (the caller falls back to its own kernel). */
int cuda_cudnn_sdpa_forward(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                            const ops_attn_shape *s, void *workspace, size_t workspace_bytes, void *stream, char *err,
                            size_t errlen);

/* dq [B, Sq, H, D], dk and dv [B, Sk, KV, D] are WRITTEN (not accumulated); out and lse are
 * the final forward results of this query block. 0 on success; non-zero with a message in
 * err. */
int cuda_cudnn_sdpa_backward(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout, const uint16_t *q,
                             const uint16_t *k, const uint16_t *v, const uint16_t *out, const float *lse,
                             const ops_attn_shape *s, void *workspace, size_t workspace_bytes, void *stream, char *err,
                             size_t errlen);

/* training.deterministic: backward plans built from now on give the same bits on every run
 * (dQ written without the fp32 accumulator reached by atomics, deterministic head-group
 * reductions, and no engine that cuDNN notes as non-deterministic); a shape with no such
 * plan answers (size_t)-1 / non-zero as any other. Forward plans are unchanged. */
void cuda_cudnn_set_deterministic(int on);

/* Why the last plan build failed ("" when none has): the call and the cuDNN status. */
const char *cuda_cudnn_last_error(void);

/* Destroys the cached plans and the handle (the next call starts afresh). */
void cuda_cudnn_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif
