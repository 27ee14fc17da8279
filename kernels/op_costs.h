/* op_costs.h — a shape-only description of the CUDA backend: for each op of tetra_ops
 * (kernels/ops.h), from the op's own arguments, what kernels/cuda would issue and move.
 * Compiled in every build (no CUDA headers), so a plan for a GPU needs no GPU and no
 * CUDA toolkit; kernels/ops_record.h records it op by op for the trainer's real step.
 *
 * For each call:
 * - launches, counted by kind: the backend's own kernels, cuBLASLt matmuls, CUB sorts,
 *   cuDNN graph executions (a library call is one launch here; the kernels it runs
 *   inside are the library's), and stream copies/memsets; host waits separately;
 * - bytes read and written in device memory as the implementation moves them: every
 *   kernel pass reads its inputs once and writes its outputs once (a tile or row that a
 *   block re-reads stays on chip, unless the row is larger than OPC_ON_CHIP_BYTES),
 *   scratch round trips and extra passes counted (fp8 operand transposes, the fp32
 *   product of the epilogue paths, widened operands, the sort's radix passes);
 * - FLOPs by the unit that runs them: bf16, fp8 and fp32 GEMMs, attention on the tensor
 *   cores (cuDNN, and the built-in bf16 kernels up to head dim 128, which issue 1.5x
 *   cuDNN's forward and 2x its backward products) or on the CUDA cores (the built-in
 *   kernels otherwise, fp32 FMA), and elementwise
 *   arithmetic (an approximate count of fp32 operations per element).
 * Where the CUDA code takes a data-dependent path (fp8 GEMMs by dtype, size and
 * alignment, cuDNN or the built-in attention by shape and device), the description takes
 * the path the code would take for these arguments on the device `op_cost_device`
 * describes, through the predicates the CUDA code itself uses (kernels/ops_paths.h).
 * Pointers are looked at for their alignment only, never dereferenced.
 *
 * Each CUDA op's comment in kernels/cuda points here; tests/gpu/test_ops_cuda.c checks
 * every description's launch counts against the CUDA simulator's (docs/plan.md). */
#ifndef TETRA_KERNELS_OP_COSTS_H
#define TETRA_KERNELS_OP_COSTS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The device the description is for: what decides the CUDA backend's paths. */
typedef struct {
    int sm_major, sm_minor;  /* compute capability: fp8 tensor cores from 8.9 */
    int cudnn_version;       /* e.g. 91400; 0: no cuDNN (the built-in attention runs) */
    int outer_vector_scales; /* cuBLASLt takes rowwise fp8 scales itself (else the fp32 epilogue) */
    int deterministic;       /* training.deterministic: cuDNN's deterministic attention backward graph */
} op_cost_device;

/* An H100 as measured (docs/cuda.md): sm_90, cuDNN 9.14, cuBLASLt without outer-vector
 * fp8 scales. */
op_cost_device op_cost_device_h100(void);

typedef enum {
    OPC_FLOP_GEMM_BF16 = 0,
    OPC_FLOP_GEMM_FP8,
    OPC_FLOP_GEMM_F32,
    OPC_FLOP_ATTN_TC,  /* attention on the tensor cores (cuDNN; the built-in bf16 kernels to d 128) */
    OPC_FLOP_ATTN_F32, /* attention on the CUDA cores (the other built-in kernels, fp32 FMA) */
    OPC_FLOP_ELEMENT,  /* elementwise fp32 arithmetic */
    OPC_FLOP_KINDS
} op_flop_kind;

const char *op_flop_kind_name(op_flop_kind k);

/* Bytes a block re-reads from device memory rather than from L1/shared memory. */
#define OPC_ON_CHIP_BYTES ((size_t)256 << 10)

/* The ops of tetra_ops that do work on the device (the table's member names). */
typedef enum {
    OPK_COPY_H2D = 0,
    OPK_COPY_D2H,
    OPK_COPY,
    OPK_COPY_2D,
    OPK_SYNCHRONIZE,
    OPK_FILL,
    OPK_SCALE,
    OPK_AXPY,
    OPK_ADD,
    OPK_SUM_SQUARES,
    OPK_SUM,
    OPK_AMAX,
    OPK_AMAX_ROWS,
    OPK_AMAX_BF16,
    OPK_AMAX_ROWS_BF16,
    OPK_AMAX_COLS,
    OPK_TRANSPOSE,
    OPK_CAST_F32_TO_BF16,
    OPK_CAST_BF16_TO_F32,
    OPK_CAST_F32_TO_FP8,
    OPK_CAST_BF16_TO_FP8,
    OPK_CAST_TRANSPOSE_TO_FP8,
    OPK_CAST_FP8_TO_F32,
    OPK_FP8_SCALE_FROM_AMAX,
    OPK_FP8_QUANTIZE,
    OPK_GEMM,
    OPK_EMBEDDING_FORWARD,
    OPK_EMBEDDING_BACKWARD,
    OPK_RMSNORM_FORWARD,
    OPK_RMSNORM_BACKWARD_INPUT,
    OPK_RMSNORM_BACKWARD_WEIGHT,
    OPK_ROPE_FORWARD,
    OPK_ROPE_BACKWARD,
    OPK_SWIGLU_FORWARD,
    OPK_SWIGLU_BACKWARD,
    OPK_ATTENTION_FORWARD,
    OPK_ATTENTION_BACKWARD,
    OPK_ATTENTION_MERGE,
    OPK_CROSS_ENTROPY,
    OPK_CE_SHARD_MAX,
    OPK_CE_SHARD_SUMS,
    OPK_CE_SHARD_FINISH,
    OPK_ADAMW_STEP,
    OPK_ADAMW_STEP_BF16,
    OPK_EMBEDDING_FORWARD_BF16,
    OPK_EMBEDDING_BACKWARD_BF16,
    OPK_RMSNORM_FORWARD_BF16,
    OPK_RMSNORM_BACKWARD_INPUT_BF16,
    OPK_RMSNORM_BACKWARD_WEIGHT_BF16,
    OPK_ROPE_FORWARD_BF16,
    OPK_ROPE_BACKWARD_BF16,
    OPK_SWIGLU_FORWARD_BF16,
    OPK_SWIGLU_BACKWARD_BF16,
    OPK_ATTENTION_FORWARD_BF16,
    OPK_ATTENTION_BACKWARD_BF16,
    OPK_CROSS_ENTROPY_BF16,
    OPK_GRAD_SQ_TO_F64,
    OPK_SUM_F64,
    OPK_OPTIM_SCALARS,
    OPK_CAST_FP8_TO_BF16,
    OPK_TRANSPOSE_U8,
    OPK_COUNT
} op_kind;

/* "gemm", "rmsnorm_forward_bf16", ...: the tetra_ops member. */
const char *op_kind_name(op_kind k);

typedef struct {
    op_kind op;
    int kernels;          /* own kernels (<<<...>>> launches) */
    int gemms;            /* cuBLASLt matmuls */
    int sorts;            /* CUB radix sorts */
    int cudnn;            /* cuDNN graph executions */
    int copies;           /* stream copies and memsets */
    int syncs;            /* host waits for the stream */
    double read, written; /* device memory bytes */
    double host_bytes;    /* over the host link (copy_h2d, copy_d2h) */
    double flops[OPC_FLOP_KINDS];
    char path[24];  /* the path taken where there are several ("fp8", "bf16+epilogue", "cudnn", "built-in") */
    char what[112]; /* the op with its shape and dtypes */
} op_cost;

/* Launches of every kind. */
int op_cost_launches(const op_cost *c);
double op_cost_flops(const op_cost *c);
/* a += b (counts, bytes and FLOPs; op, path and what are a's) */
void op_cost_add(op_cost *a, const op_cost *b);

/* ---- one description per op, with the op's arguments (ops.h states their shapes) */
void opc_copy_h2d(op_cost *o, const op_cost_device *d, void *dst, const void *src, size_t bytes);
/* copy_h2d_async: the same copy, no host wait */
void opc_copy_h2d_async(op_cost *o, const op_cost_device *d, void *dst, const void *src, size_t bytes);
void opc_copy_d2h(op_cost *o, const op_cost_device *d, void *dst, const void *src, size_t bytes);
void opc_copy(op_cost *o, const op_cost_device *d, void *dst, const void *src, size_t bytes);
void opc_copy_2d(op_cost *o, const op_cost_device *d, void *dst, size_t dpitch, const void *src, size_t spitch,
                 size_t width, size_t rows);
void opc_synchronize(op_cost *o, const op_cost_device *d);
void opc_fill(op_cost *o, const op_cost_device *d, float *x, float value, size_t n);
void opc_scale(op_cost *o, const op_cost_device *d, float *x, float alpha, size_t n);
void opc_axpy(op_cost *o, const op_cost_device *d, float *y, const float *x, float alpha, size_t n);
void opc_add(op_cost *o, const op_cost_device *d, float *out, const float *a, const float *b, size_t n);
void opc_sum_squares(op_cost *o, const op_cost_device *d, float *out, const float *x, size_t n);
void opc_sum(op_cost *o, const op_cost_device *d, float *out, const float *x, size_t n);
void opc_amax(op_cost *o, const op_cost_device *d, float *out, const float *x, size_t n);
void opc_amax_rows(op_cost *o, const op_cost_device *d, float *out, const float *x, int rows, int cols);
void opc_amax_bf16(op_cost *o, const op_cost_device *d, float *out, const uint16_t *x, size_t n);
void opc_amax_rows_bf16(op_cost *o, const op_cost_device *d, float *out, const uint16_t *x, int rows, int cols);
void opc_amax_cols(op_cost *o, const op_cost_device *d, float *out, const void *x, tetra_dtype xt, int rows, int cols);
void opc_transpose(op_cost *o, const op_cost_device *d, float *out, const float *x, int rows, int cols);
void opc_transpose_u8(op_cost *o, const op_cost_device *d, uint8_t *out, const uint8_t *x, int rows, int cols);
void opc_cast_f32_to_bf16(op_cost *o, const op_cost_device *d, uint16_t *out, const float *x, size_t n);
void opc_cast_fp8_to_bf16(op_cost *o, const op_cost_device *d, uint16_t *out, const uint8_t *q, const float *inv_scale,
                          int rowwise, int rows, int cols, tetra_dtype fmt);
void opc_cast_bf16_to_f32(op_cost *o, const op_cost_device *d, float *out, const uint16_t *x, size_t n);
void opc_cast_f32_to_fp8(op_cost *o, const op_cost_device *d, uint8_t *out, const float *x, const float *scale,
                         int rowwise, int rows, int cols, tetra_dtype fmt);
void opc_cast_bf16_to_fp8(op_cost *o, const op_cost_device *d, uint8_t *out, const uint16_t *x, const float *scale,
                          int rowwise, int rows, int cols, tetra_dtype fmt);
void opc_cast_transpose_to_fp8(op_cost *o, const op_cost_device *d, uint8_t *out, const void *x, tetra_dtype xt,
                               const float *scale, int rows, int cols, tetra_dtype fmt);
void opc_cast_fp8_to_f32(op_cost *o, const op_cost_device *d, float *out, const uint8_t *q, const float *inv_scale,
                         int rowwise, int rows, int cols, tetra_dtype fmt);
void opc_fp8_scale_from_amax(op_cost *o, const op_cost_device *d, float *scale, float *inv_scale, const float *amax,
                             int n, int broadcast, float fp8_max, int pow2);
void opc_fp8_quantize(op_cost *o, const op_cost_device *d, uint8_t *out, uint8_t *out_t, float *inv_scale,
                      const void *x, tetra_dtype xt, const float *amax, int rows, int cols, tetra_dtype fmt);
void opc_gemm(op_cost *o, const op_cost_device *d, void *c, const void *a, const void *b, const ops_gemm_desc *g);
void opc_embedding_forward(op_cost *o, const op_cost_device *d, tetra_dtype t, void *out, const int32_t *tokens,
                           const void *wte, int n, int c, int v_start, int v_local);
void opc_embedding_backward(op_cost *o, const op_cost_device *d, tetra_dtype t, float *dwte, const void *dout,
                            const int32_t *tokens, int n, int c, int v_start, int v_local);
void opc_rmsnorm_forward(op_cost *o, const op_cost_device *d, tetra_dtype t, void *out, float *rstd, float *amax,
                         const void *x, const void *w, int n, int c);
void opc_rmsnorm_backward_input(op_cost *o, const op_cost_device *d, tetra_dtype t, void *dx, float *amax,
                                const void *dout, const void *x, const void *w, const float *rstd, int n, int c);
void opc_rmsnorm_backward_weight(op_cost *o, const op_cost_device *d, tetra_dtype t, float *dw, const void *dout,
                                 const void *x, const float *rstd, int n, int c, int accumulate);
void opc_rope(op_cost *o, const op_cost_device *d, tetra_dtype t, int backward, void *out, float *amax, const void *x,
              int b, int s, int nh, int dh);
void opc_swiglu_forward(op_cost *o, const op_cost_device *d, tetra_dtype t, void *out, float *amax, const void *a,
                        const void *g, size_t n);
void opc_swiglu_backward(op_cost *o, const op_cost_device *d, tetra_dtype t, void *da, void *dg, float *amax_da,
                         float *amax_dg, const void *dout, const void *a, const void *g, size_t n);
/* t: TETRA_F32 (the fp32 op: the built-in kernels) or TETRA_BF16 (cuDNN where it applies;
 * cuDNN also wants every tensor on 16 bytes) */
void opc_attention_forward(op_cost *o, const op_cost_device *d, tetra_dtype t, void *out, float *lse, const void *q,
                           const void *k, const void *v, const ops_attn_shape *s);
void opc_attention_backward(op_cost *o, const op_cost_device *d, tetra_dtype t, void *dq, void *dk, void *dv,
                            const void *dout, const void *q, const void *k, const void *v, const void *out,
                            const float *lse, const ops_attn_shape *s);
void opc_attention_merge(op_cost *o, const op_cost_device *d, int b, int sq, int h, int dh);
void opc_cross_entropy(op_cost *o, const op_cost_device *d, const float *dlogits, int n, int v);
/* cross_entropy_bf16: the fused kernel writing bf16 dlogits */
void opc_cross_entropy_bf16(op_cost *o, const op_cost_device *d, int n, int v);
void opc_ce_shard_max(op_cost *o, const op_cost_device *d, int n, int v_local);
void opc_ce_shard_sums(op_cost *o, const op_cost_device *d, int n, int v_local);
void opc_ce_shard_finish(op_cost *o, const op_cost_device *d, const float *dlogits, int n, int v_local);
/* n_seg > 0: adamw_step_amax over that many stretches (a memset of the maxima, the same
 * kernel's traffic: the magnitudes come from registers) */
void opc_adamw_step(op_cost *o, const op_cost_device *d, int bf16_copy, size_t n, int n_seg);
/* the optimizer's scalars on the device: one single-thread kernel each */
void opc_grad_sq_to_f64(op_cost *o, const op_cost_device *d, int n, int n_loss);
void opc_sum_f64(op_cost *o, const op_cost_device *d, int n);
void opc_optim_scalars(op_cost *o, const op_cost_device *d);

/* Visible (query, key) pairs of an attention call (causal by global position). */
double opc_attention_pairs(const ops_attn_shape *s);

#ifdef __cplusplus
}
#endif

#endif
