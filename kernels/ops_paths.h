/* ops_paths.h — which path the CUDA backend takes for an op's arguments, as pure
 * predicates of the arguments (sizes, dtypes, pointer alignment) and of the device (its
 * compute capability, the cuDNN version). The CUDA code (kernels/cuda/cuda_gemm.cu,
 * cuda_cudnn.cu) decides with these functions, and the shape-only description of the
 * backend (kernels/op_costs.h) follows the same decisions without a device, so the two
 * cannot drift apart. No pointer is dereferenced: only its address is looked at.
 * Usable from C and CUDA. */
#ifndef TETRA_KERNELS_OPS_PATHS_H
#define TETRA_KERNELS_OPS_PATHS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

static inline int ops_path_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static inline int ops_path_is_fp8(tetra_dtype t) { return t == TETRA_FP8_E4M3 || t == TETRA_FP8_E5M2; }

/* ---- GEMM (cuda_gemm.cu) */

/* The fp8 tensor-core kernels take both operands fp8, but not e5m2 x e5m2. */
static inline int ops_path_gemm_fp8_pair(tetra_dtype a, tetra_dtype b) {
    return ops_path_is_fp8(a) && ops_path_is_fp8(b) && !(a == TETRA_FP8_E5M2 && b == TETRA_FP8_E5M2);
}

/* ... with m, n, k multiples of 16 and an output whose rows (and batch items) start on
 * 16 bytes. */
static inline int ops_path_gemm_fp8_shape(const ops_gemm_desc *g, const void *c) {
    const int batch = g->batch > 1 ? g->batch : 1;
    const int64_t cs = (int64_t)tetra_dtype_size(g->c_type);
    return g->m % 16 == 0 && g->n % 16 == 0 && g->k % 16 == 0 && ((int64_t)g->ldc * cs) % 16 == 0 &&
        ops_path_aligned16(c) && (!g->c_in || ops_path_aligned16(g->c_in)) &&
        (batch <= 1 || (g->stride_c * cs) % 16 == 0);
}

/* An fp8 operand is used in place when it is K-major (A as [m, k]: trans 0; B as [n, k]:
 * trans 1) with a leading dim, start and batch stride on 16 bytes; otherwise the GEMM
 * transposes or repacks it into scratch first. */
static inline int ops_path_gemm_kmajor_ok(int is_b, int trans, int64_t ld, const void *p, int batch, int64_t stride) {
    return trans == (is_b ? 1 : 0) && ld % 16 == 0 && ops_path_aligned16(p) && (batch <= 1 || stride % 16 == 0);
}

/* The widened path's compute type: fp32 if either operand is fp32, else bf16. */
static inline tetra_dtype ops_path_gemm_common(tetra_dtype a, tetra_dtype b) {
    return (a == TETRA_F32 || b == TETRA_F32) ? TETRA_F32 : TETRA_BF16;
}

/* The widened path runs one cuBLASLt call straight into C unless dequant scales must be
 * applied or fp32 operands meet a bf16 C: then the product goes to an fp32 scratch and an
 * epilogue kernel writes C. */
static inline int ops_path_gemm_direct(const ops_gemm_desc *g, tetra_dtype common) {
    const int scaled = g->a_scale || g->b_scale;
    return !scaled && !(common == TETRA_F32 && g->c_type == TETRA_BF16);
}

/* ---- cuDNN's fused attention (cuda_cudnn.cu) */

/* The shapes the fused SDPA takes on a device of compute capability sm_major with cuDNN
 * `version` (0: none): cuDNN >= 9.0, sm >= 8.0, d % 8 == 0 and d <= 128 (256 on sm_90),
 * h % kv == 0, and either causal with q_offset == k_offset and sq == sk (top-left
 * diagonal) or non-causal; no document mask (cuDNN's ragged/padding-mask SDPA could take
 * one, but tetra has not been able to check that path on a device: docs/cuda.md). */
static inline int ops_path_cudnn_sdpa_shape(const ops_attn_shape *s, int sm_major, int version) {
    if (!s || s->b <= 0 || s->sq <= 0 || s->sk <= 0 || s->h <= 0 || s->kv <= 0 || s->d <= 0 || s->h % s->kv != 0)
        return 0;
    if (s->doc) return 0;
    if (version < 90000 || sm_major < 8) return 0;
    if (s->d % 8 != 0) return 0;
    if (s->causal && (s->q_offset != s->k_offset || s->sq != s->sk)) return 0;
    return s->d <= (sm_major == 9 ? 256 : 128);
}

/* Why this cuDNN version cannot take a direction and shape although the shape rules
 * allow it (too old, or a known bug); NULL when it can. */
static inline const char *ops_path_cudnn_version_problem(int version, int backward, int sk) {
    if (version < 90000) return "cuDNN older than 9.0";
    if (version == 91000 || version == 91001) return "cuDNN 9.10.0/9.10.1 (known SDPA bugs)";
    if (backward && version <= 91500 && sk % 128 != 0) return "cuDNN <= 9.15.0 backward with Sk % 128 != 0 (known bug)";
    return NULL;
}

/* Shapes the fused kernels refuse although a plan might build. */
static inline const char *ops_path_cudnn_shape_problem(const ops_attn_shape *s, int backward) {
    if (backward && s->sq == 1 && s->sk == 1) return "backward with Sq = Sk = 1";
    return NULL;
}

/* ---- attention's built-in kernels (cuda_attention.cu, cuda_attention_tc.cu)
 *
 * Where cuDNN does not run it, the bf16 op runs on the tensor cores (warp matrix products,
 * bf16 operands into fp32, the probabilities and dS as two bf16 terms) for head dims up to
 * 128, and on the CUDA cores (fp32 FMA, as the fp32 op) above. */
static inline int ops_path_attention_tc(const ops_attn_shape *s) { return s && s->d >= 1 && s->d <= 128; }

/* The backward operation graph's dQ accumulator must be zeroed before each call (a
 * memset) with cuDNN before 9.6. */
static inline int ops_path_cudnn_zero_dq_accum(int version) { return version < 90600; }

#endif
