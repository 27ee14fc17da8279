// kernels/cpu/cpu_ops.h — the CPU backend's functions. Each fills one slot of tetra_ops
// (kernels/ops.h documents shapes and semantics there, once); they are also exported by
// name so tests can call a single op through ctypes without mirroring the table.
#ifndef TETRA_KERNELS_CPU_OPS_H
#define TETRA_KERNELS_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

// Hot loops live in small non-inline functions marked CPU_SIMD: GCC compiles them once
// per ISA level (AVX-512, AVX2+FMA, baseline) and picks one at load time, so the default
// portable build still runs wide vectors. OpenMP regions stay in the callers because the
// outlined region bodies would not inherit the clone's ISA.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && !defined(TETRA_NO_CLONES)
#define CPU_SIMD                                                                                                       \
    __attribute__((noinline, optimize("fp-contract=fast"),                                                             \
                   target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
// The same clones for a loop whose every rounding is written out (AdamW matches torch's
// separately rounded products): only the fmaf calls in the source fuse.
#define CPU_SIMD_EXACT                                                                                                 \
    __attribute__((noinline, optimize("fp-contract=off"), target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_SIMD __attribute__((noinline))
#define CPU_SIMD_EXACT __attribute__((noinline))
#endif

// Elements per parallel chunk for streaming ops. Fixed (not derived from the thread
// count) so that chunked reductions give the same bits with any number of threads.
#define CPU_CHUNK ((int64_t)1 << 15)

// ---- cpu_backend.c: memory, elementwise, reductions, casts, optimizer, the table
void *cpu_alloc(size_t bytes);
void cpu_release(void *p);
void cpu_copy(void *dst, const void *src, size_t bytes);
void cpu_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows);
void cpu_synchronize(void);
void cpu_fill(float *x, float value, size_t n);
void cpu_scale(float *x, float alpha, size_t n);
void cpu_axpy(float *y, const float *x, float alpha, size_t n);
void cpu_add(float *out, const float *a, const float *b, size_t n);
void cpu_sum_squares(float *out, const float *x, size_t n);
void cpu_sum(float *out, const float *x, size_t n);
void cpu_amax(float *out, const float *x, size_t n);
void cpu_amax_rows(float *out, const float *x, int rows, int cols);
void cpu_amax_bf16(float *out, const uint16_t *x, size_t n);
void cpu_amax_rows_bf16(float *out, const uint16_t *x, int rows, int cols);
void cpu_amax_cols(float *out, const void *x, tetra_dtype xt, int rows, int cols);
void cpu_fp8_quantize(uint8_t *out, uint8_t *out_t, float *inv_scale, const void *x, tetra_dtype xt, const float *amax,
                      int rows, int cols, tetra_dtype fmt);
void cpu_cast_transpose_to_fp8(uint8_t *out, const void *x, tetra_dtype xt, const float *scale, int rows, int cols,
                               tetra_dtype fmt);
void cpu_transpose(float *out, const float *x, int rows, int cols);
void cpu_transpose_u8(uint8_t *out, const uint8_t *x, int rows, int cols);
void cpu_cast_f32_to_bf16(uint16_t *out, const float *x, size_t n);
void cpu_cast_bf16_to_f32(float *out, const uint16_t *x, size_t n);
void cpu_cast_f32_to_fp8(uint8_t *out, const float *x, const float *scale, int rowwise, int rows, int cols,
                         tetra_dtype fmt);
void cpu_cast_bf16_to_fp8(uint8_t *out, const uint16_t *x, const float *scale, int rowwise, int rows, int cols,
                          tetra_dtype fmt);
void cpu_cast_fp8_to_bf16(uint16_t *out, const uint8_t *q, const float *inv_scale, int rowwise, int rows, int cols,
                          tetra_dtype fmt);
void cpu_cast_fp8_to_f32(float *out, const uint8_t *q, const float *inv_scale, int rowwise, int rows, int cols,
                         tetra_dtype fmt);
void cpu_fp8_scale_from_amax(float *scale, float *inv_scale, const float *amax, int n, int broadcast, float fp8_max,
                             int pow2);
void cpu_adamw_step(float *param, float *m, float *v, const float *grad, size_t n, double lr, double beta1,
                    double beta2, double eps, double weight_decay, int step, float grad_scale,
                    const ops_optim_state *dev);
// memory accounting (ops.h: alloc_count .. compute_stream)
size_t cpu_alloc_count(void);
size_t cpu_allocated_bytes(void);
void cpu_memory_freeze(int frozen);
void cpu_device_memory(size_t *free_bytes, size_t *total_bytes);
void *cpu_compute_stream(void);
void cpu_set_deterministic(int on);

// ---- cpu_gemm.c
void cpu_gemm(void *c, const void *a, const void *b, const ops_gemm_desc *g);
// Single-threaded fp32 sgemm on row-major operands (used inside parallel regions).
void cpu_sgemm_serial(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                      const float *b, int ldb, float beta, float *c, int ldc);
// Make OpenBLAS single-threaded; the backend threads with OpenMP only (one pool, no
// oversubscription when a GEMM runs inside a parallel region). Called once by ops_cpu().
void cpu_blas_init(void);
// bf16 x bf16 GEMMs on oneDNN (1) or widened to fp32 sgemm (0). on = -1 only asks;
// 1 takes effect only where the CPU has AVX512-BF16. Returns the state before the call.
// For tests and benchmarks that compare the two routes.
int cpu_gemm_bf16_onednn(int on);
// fp32 GEMMs on oneDNN (1) or OpenBLAS (0); same protocol. The default is chosen per CPU
// (cpu_gemm.c), TETRA_CPU_GEMM=openblas|onednn overrides it.
int cpu_gemm_f32_onednn(int on);

// ---- cpu_layers.c
void cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte, int n, int c, int v_start, int v_local);
void cpu_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int n, int c, int v_start,
                            int v_local);
void cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int n, int c, float eps);
void cpu_rmsnorm_backward_input(float *dx, const float *dout, const float *x, const float *w, const float *rstd, int n,
                                int c, const float *dres);
void cpu_rmsnorm_backward_weight(float *dw, const float *dout, const float *x, const float *rstd, int n, int c,
                                 int accumulate);
void cpu_rope_forward(float *out, const float *x, const float *freqs, const int32_t *pos, int pos_offset, int b, int s,
                      int nh, int d, int out_ld, int x_ld);
void cpu_rope_backward(float *dx, const float *dout, const float *freqs, const int32_t *pos, int pos_offset, int b,
                       int s, int nh, int d, int dx_ld, int dout_ld);
void cpu_swiglu_forward(float *out, const float *a, const float *g, size_t n);
void cpu_swiglu_backward(float *da, float *dg, const float *dout, const float *a, const float *g, size_t n);
void cpu_cross_entropy_bf16(uint16_t *dlogits, float *losses, const uint16_t *logits, const int32_t *targets, int n,
                            int v, float dloss_scale);
void cpu_cross_entropy(float *dlogits, float *losses, const float *logits, const int32_t *targets, int n, int v,
                       float dloss_scale);
void cpu_ce_shard_max(float *row_max, const float *logits, int n, int v_local);
void cpu_ce_shard_sums(float *sum_exp, float *target_logit, const float *logits, const float *row_max,
                       const int32_t *targets, int n, int v_local, int v_start);
void cpu_ce_shard_finish(float *dlogits, float *losses, const float *logits, const float *row_max, const float *sum_exp,
                         const float *target_logit, const int32_t *targets, int n, int v_local, int v_start,
                         float dloss_scale);
// Row and element kernels of the ops above, shared with their bf16 twins (cpu_bf16.c),
// which widen into fp32 buffers and call these, so both compute the same function.
void cpu_rmsnorm_row_k(float *restrict out, float *restrict rstd, const float *restrict x, const float *restrict w,
                       int c, float eps);
// dx[0..c) += the RMSNorm input gradient of one row
void cpu_rmsnorm_bwd_row_k(float *restrict dx, const float *restrict dy, const float *restrict x,
                           const float *restrict w, float r, int c);
// dw += column sums of dout * x * rstd over [n, c], fp32 (bf16 = 0) or bf16 inputs
void cpu_rmsnorm_dw_blocks(float *dw, const void *dout, const void *x, const float *rstd, int n, int c, int bf16,
                           int accumulate);
// one row of nh heads of d (rotation by the row's freqs; inverse: by the conjugate)
void cpu_rope_row_k(float *out, const float *x, const float *f, int nh, int d, int inverse);
void cpu_swiglu_fwd_k(float *out, const float *a, const float *g, size_t n);
void cpu_swiglu_bwd_k(float *da, float *dg, const float *dout, const float *a, const float *g, size_t n);

// ---- cpu_bf16.c: the bf16 activation twins (ops.h), fp32 inside, one rounding per output
void cpu_embedding_forward_bf16(uint16_t *out, const int32_t *tokens, const uint16_t *wte, int n, int c, int v_start,
                                int v_local);
void cpu_embedding_backward_bf16(float *dwte, const uint16_t *dout, const int32_t *tokens, int n, int c, int v_start,
                                 int v_local);
void cpu_rmsnorm_forward_bf16(uint16_t *out, float *rstd, float *amax, const uint16_t *x, const uint16_t *w, int n,
                              int c, float eps);
void cpu_rmsnorm_backward_input_bf16(uint16_t *dx, float *amax, const uint16_t *dout, const uint16_t *x,
                                     const uint16_t *w, const float *rstd, int n, int c, const uint16_t *dres);
void cpu_rmsnorm_backward_weight_bf16(float *dw, const uint16_t *dout, const uint16_t *x, const float *rstd, int n,
                                      int c, int accumulate);
void cpu_rope_forward_bf16(uint16_t *out, const uint16_t *x, const float *freqs, const int32_t *pos, int pos_offset,
                           int b, int s, int nh, int d, int out_ld, int x_ld);
void cpu_rope_backward_bf16(uint16_t *dx, float *amax, const uint16_t *dout, const float *freqs, const int32_t *pos,
                            int pos_offset, int b, int s, int nh, int d, int dx_ld, int dout_ld);
void cpu_swiglu_forward_bf16(uint16_t *out, float *amax, const uint16_t *a, const uint16_t *g, size_t n);
void cpu_swiglu_backward_bf16(uint16_t *da, uint16_t *dg, float *amax_da, float *amax_dg, const uint16_t *dout,
                              const uint16_t *a, const uint16_t *g, size_t n);
size_t cpu_attention_workspace_size_bf16(const ops_attn_shape *s);
void cpu_attention_forward_bf16(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                const ops_attn_shape *s, void *workspace);
void cpu_attention_backward_bf16(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout, const uint16_t *q,
                                 const uint16_t *k, const uint16_t *v, const uint16_t *out, const float *lse,
                                 const ops_attn_shape *s, void *workspace);

// ---- cpu_attention.c
// Tile sizes of the blockwise attention (queries x keys per score tile).
#define CPU_ATTN_BQ 64
#define CPU_ATTN_BK 64
size_t cpu_attention_workspace_size(const ops_attn_shape *s);
void cpu_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                           const ops_attn_shape *s, void *workspace);
void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                            const float *v, const float *out, const float *lse, const ops_attn_shape *s,
                            void *workspace);
// Backward schedule (see cpu_attention.c): 0 automatic (default), 1 fused, 2 split.
// Both give the same result up to summation order; tests force each.
void cpu_attention_set_backward_mode(int mode);
// vector width of the attention tile kernel: 0 = the widest the CPU runs (16 on
// x86-64-v4), 8 = the AVX2 kernel; returns the width now in use
int cpu_attention_set_vector_width(int w);
void cpu_attention_merge(float *out, float *lse, const float *out_blk, const float *lse_blk, int b, int sq, int h,
                         int d);

#endif // TETRA_KERNELS_CPU_OPS_H
