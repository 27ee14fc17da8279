// kernels/cuda/cuda_ops.h — the CUDA backend's functions. Each fills one slot of tetra_ops
// (kernels/ops.h documents shapes and semantics there, once); exported with C linkage so
// tests can call a single op by name. Pointers are device memory unless stated.
//
// Backend init creates the compute stream, the cuBLASLt handle and its 32 MiB workspace
// and the constant one, once per process, at the first alloc or op (not in ops_cuda, so
// that a multi-GPU rank can select its device after picking the backend), on the device
// current then: select the device (cudaSetDevice) before the first alloc. After init only
// alloc and the growable scratch buffers allocate device memory (cuda_common.cuh).
#ifndef TETRA_KERNELS_CUDA_OPS_H
#define TETRA_KERNELS_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- cuda_backend.cu: memory and streams, elementwise, reductions, casts, optimizer
void *cuda_alloc(size_t bytes);
void cuda_release(void *p);
size_t cuda_alloc_count(void);
size_t cuda_allocated_bytes(void);
void cuda_memory_freeze(int frozen);
void cuda_device_memory(size_t *free_bytes, size_t *total_bytes);
void *cuda_compute_stream(void);
// ---- cuda_graph.cu: a step captured and launched as one CUDA graph
int cuda_graph_begin(size_t staging_bytes, char *err, size_t errlen);
int cuda_graph_end(char *err, size_t errlen);
void cuda_graph_stats(ops_graph_stats *out);
void cuda_set_deterministic(int on);
void cuda_copy_h2d(void *dst, const void *src, size_t bytes);
void cuda_copy_h2d_async(void *dst, const void *src, size_t bytes);
void cuda_copy_d2h(void *dst, const void *src, size_t bytes);
void cuda_copy(void *dst, const void *src, size_t bytes);
void cuda_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows);
int cuda_select_device(int index, char *err, size_t errlen);
void cuda_synchronize(void);
void cuda_fill(float *x, float value, size_t n);
void cuda_scale(float *x, float alpha, size_t n);
void cuda_axpy(float *y, const float *x, float alpha, size_t n);
void cuda_add(float *out, const float *a, const float *b, size_t n);
void cuda_sum_squares(float *out, const float *x, size_t n);
void cuda_sum(float *out, const float *x, size_t n);
void cuda_amax(float *out, const float *x, size_t n);
void cuda_amax_rows(float *out, const float *x, int rows, int cols);
void cuda_amax_bf16(float *out, const uint16_t *x, size_t n);
void cuda_amax_rows_bf16(float *out, const uint16_t *x, int rows, int cols);
void cuda_amax_cols(float *out, const void *x, tetra_dtype xt, int rows, int cols);
void cuda_cast_transpose_to_fp8(uint8_t *out, const void *x, tetra_dtype xt, const float *scale, int rows, int cols,
                                tetra_dtype fmt);
void cuda_transpose(float *out, const float *x, int rows, int cols);
void cuda_transpose_u8(uint8_t *out, const uint8_t *x, int rows, int cols);
void cuda_cast_f32_to_bf16(uint16_t *out, const float *x, size_t n);
void cuda_cast_bf16_to_f32(float *out, const uint16_t *x, size_t n);
void cuda_cast_f32_to_fp8(uint8_t *out, const float *x, const float *scale, int rowwise, int rows, int cols,
                          tetra_dtype fmt);
void cuda_cast_bf16_to_fp8(uint8_t *out, const uint16_t *x, const float *scale, int rowwise, int rows, int cols,
                           tetra_dtype fmt);
void cuda_cast_fp8_to_bf16(uint16_t *out, const uint8_t *q, const float *inv_scale, int rowwise, int rows, int cols,
                           tetra_dtype fmt);
void cuda_cast_fp8_to_f32(float *out, const uint8_t *q, const float *inv_scale, int rowwise, int rows, int cols,
                          tetra_dtype fmt);
void cuda_fp8_quantize(uint8_t *out, uint8_t *out_t, float *inv_scale, const void *x, tetra_dtype xt, const float *amax,
                       int rows, int cols, tetra_dtype fmt);
void cuda_fp8_scale_from_amax(float *scale, float *inv_scale, const float *amax, int n, int broadcast, float fp8_max,
                              int pow2);
void cuda_adamw_step(float *param, float *m, float *v, const float *grad, size_t n, double lr, double beta1,
                     double beta2, double eps, double weight_decay, int step, float grad_scale,
                     const ops_optim_state *dev);
void cuda_adamw_step_bf16(float *param, uint16_t *param_bf16, float *m, float *v, const float *grad, size_t n,
                          double lr, double beta1, double beta2, double eps, double weight_decay, int step,
                          float grad_scale, const ops_optim_state *dev);
void cuda_adamw_step_amax(float *param, uint16_t *param_bf16, float *m, float *v, const float *grad, size_t n,
                          double lr, double beta1, double beta2, double eps, double weight_decay, int step,
                          float grad_scale, const ops_optim_state *dev, const ops_amax_segments *seg);

// ---- cuda_gemm.cu (cuBLASLt)
void cuda_gemm(void *c, const void *a, const void *b, const ops_gemm_desc *g);
// Which path the last cuda_gemm call took (tests print it): "f32", "bf16", "fp8",
// "fp8+rowwise", "fp8+epilogue", "bf16+epilogue", "f32+epilogue", "k=0".
const char *cuda_gemm_last_path(void);

// ---- cuda_layers.cu (the *_bf16 ops: bf16 activations, fp32 math, fp32 parameter grads)
void cuda_embedding_forward(float *out, const int32_t *tokens, const float *wte, int n, int c, int v_start,
                            int v_local);
void cuda_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int n, int c, int v_start,
                             int v_local);
void cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int n, int c, float eps);
void cuda_rmsnorm_backward_input(float *dx, const float *dout, const float *x, const float *w, const float *rstd, int n,
                                 int c, const float *dres);
void cuda_rmsnorm_backward_weight(float *dw, const float *dout, const float *x, const float *rstd, int n, int c,
                                  int accumulate);
void cuda_rope_forward(float *out, const float *x, const float *freqs, const int32_t *pos, int pos_offset, int b, int s,
                       int nh, int d, int out_ld, int x_ld);
void cuda_rope_backward(float *dx, const float *dout, const float *freqs, const int32_t *pos, int pos_offset, int b,
                        int s, int nh, int d, int dx_ld, int dout_ld);
void cuda_swiglu_forward(float *out, const float *a, const float *g, size_t n);
void cuda_swiglu_backward(float *da, float *dg, const float *dout, const float *a, const float *g, size_t n);
void cuda_embedding_forward_bf16(uint16_t *out, const int32_t *tokens, const uint16_t *wte, int n, int c, int v_start,
                                 int v_local);
void cuda_embedding_backward_bf16(float *dwte, const uint16_t *dout, const int32_t *tokens, int n, int c, int v_start,
                                  int v_local);
void cuda_rmsnorm_forward_bf16(uint16_t *out, float *rstd, float *amax, const uint16_t *x, const uint16_t *w, int n,
                               int c, float eps);
void cuda_rmsnorm_backward_input_bf16(uint16_t *dx, float *amax, const uint16_t *dout, const uint16_t *x,
                                      const uint16_t *w, const float *rstd, int n, int c, const uint16_t *dres);
void cuda_rmsnorm_backward_weight_bf16(float *dw, const uint16_t *dout, const uint16_t *x, const float *rstd, int n,
                                       int c, int accumulate);
void cuda_rope_forward_bf16(uint16_t *out, const uint16_t *x, const float *freqs, const int32_t *pos, int pos_offset,
                            int b, int s, int nh, int d, int out_ld, int x_ld);
void cuda_rope_backward_bf16(uint16_t *dx, float *amax, const uint16_t *dout, const float *freqs, const int32_t *pos,
                             int pos_offset, int b, int s, int nh, int d, int dx_ld, int dout_ld);
void cuda_swiglu_forward_bf16(uint16_t *out, float *amax, const uint16_t *a, const uint16_t *g, size_t n);
void cuda_swiglu_backward_bf16(uint16_t *da, uint16_t *dg, float *amax_da, float *amax_dg, const uint16_t *dout,
                               const uint16_t *a, const uint16_t *g, size_t n);
void cuda_cross_entropy_bf16(uint16_t *dlogits, float *losses, const uint16_t *logits, const int32_t *targets, int n,
                             int v, float dloss_scale);
void cuda_cross_entropy(float *dlogits, float *losses, const float *logits, const int32_t *targets, int n, int v,
                        float dloss_scale);
void cuda_ce_shard_max(float *row_max, const float *logits, int n, int v_local);
void cuda_ce_shard_sums(float *sum_exp, float *target_logit, const float *logits, const float *row_max,
                        const int32_t *targets, int n, int v_local, int v_start);
void cuda_ce_shard_finish(float *dlogits, float *losses, const float *logits, const float *row_max,
                          const float *sum_exp, const float *target_logit, const int32_t *targets, int n, int v_local,
                          int v_start, float dloss_scale);

// ---- cuda_attention.cu (flash-attention-2 style kernels, fp32 math; head dim <= 256)
size_t cuda_attention_workspace_size(const ops_attn_shape *s);
void cuda_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                            const ops_attn_shape *s, void *workspace);
void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                             const float *v, const float *out, const float *lse, const ops_attn_shape *s,
                             void *workspace);
void cuda_attention_merge(float *out, float *lse, const float *out_blk, const float *lse_blk, int b, int sq, int h,
                          int d);
// bf16: cuDNN's fused SDPA where it applies, else the kernels above on bf16 storage
size_t cuda_attention_workspace_size_bf16(const ops_attn_shape *s);
void cuda_attention_forward_bf16(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                 const ops_attn_shape *s, void *workspace);
void cuda_attention_backward_bf16(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout, const uint16_t *q,
                                  const uint16_t *k, const uint16_t *v, const uint16_t *out, const float *lse,
                                  const ops_attn_shape *s, void *workspace);
// Which path the last bf16 attention call took (tests print it): "cudnn", "built-in".
const char *cuda_attention_bf16_last_path(void);

#ifdef __cplusplus
}
#endif

#endif // TETRA_KERNELS_CUDA_OPS_H
