// kernels/ops.h — the backend op table.
//
// Every compute op the model, the optimizer and the parallel layer need is declared
// once here, as a function pointer in `tetra_ops`. A backend (kernels/cpu, later
// kernels/cuda) fills one table; `ops_get` picks a table at start-up from
// `training.device` ("cpu", "cuda" or "auto"), and the model code is written once
// against it.
//
// Conventions (all ops):
// - Outputs first, then inputs, then weights, then sizes. Every buffer argument carries
//   its shape in a comment. Layouts are row-major. Sizes that multiply out past 2^31
//   (tokens x vocab) are computed in size_t inside the ops.
// - Pointers are backend memory (host memory on the CPU backend, device memory on
//   CUDA); scalars that the GPU produces during a step (loss sums, amax, fp8 scales)
//   are passed as pointers so no op forces a host sync.
// - Activations and weights are fp32, or bf16 in the *_bf16 twins (mixed precision;
//   both backends implement both); the dtype is explicit wherever an op is already
//   dtype-generic (gemm, casts).
// - Gradient semantics are stated per op. The rule: parameter gradients and gradients
//   of tensors that fan out (residual stream, attention q/k/v for ring attention) are
//   ACCUMULATED (+=); pure elementwise backward ops (rope, swiglu) and the fused
//   cross-entropy WRITE their input gradient and may run in place.
// - Shape letters: B batch, S sequence (Sq queries, Sk keys), H query heads, KV key/value
//   heads, D head dim, C model dim, F ffn hidden dim, V vocabulary (Vl a local shard),
//   N = B*S tokens.
#ifndef TETRA_KERNELS_OPS_H
#define TETRA_KERNELS_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "util/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

// element types: util/dtype.h

#define OPS_IGNORE_INDEX (-100) // cross-entropy target that contributes no loss and no grad
#define OPS_FP8_E4M3_MAX 448.0f
#define OPS_FP8_E5M2_MAX 57344.0f

// ----------------------------------------------------------------------------
// op descriptors

// C[m,n] = alpha * sa * sb * op(A)[m,k] . op(B)[k,n] + beta * C        (row-major)
// op(X) = X or X^T. With trans_a, A is stored [k, m] (lda >= m), else [m, k] (lda >= k);
// with trans_b, B is stored [n, k] (ldb >= k), else [k, n] (ldb >= n); C is [m, n].
// This maps 1:1 onto cuBLASLt (a row-major C = A.B is the column-major C^T = B^T.A^T).
// Linear layers: y = x W^T is {m = N, n = out, k = in, trans_b = 1};
// dx = dy W is {m = N, n = in, k = out}; dW += dy^T x is {trans_a = 1, m = out, n = in,
// k = N, beta = 1}.
// fp8 operands hold the quantised values q = sat(x * scale); a_scale/b_scale are the
// DEQUANT factors (1/scale), as cuBLASLt's A/B_SCALE_POINTER: NULL means 1.
// scale_rowwise = 0: a_scale[1], b_scale[1] (tensorwise); 1: a_scale[m] (per row of
// op(A)), b_scale[n] (per column of op(B)) (torchao rowwise/axiswise).
// batch > 1 runs `batch` independent products at the given element strides.
// When beta == 0, C is not read (it may hold garbage). c_in, when set, is the C that beta
// scales and the output is written to the op's `c` alone (D = alpha op(A) op(B) + beta
// c_in, as cuBLASLt's separate C and D): same type, ldc and stride_c as the output, and
// either the output itself or not overlapping it; NULL: the output is also the input. A
// residual add then needs no copy of the residual first. The CPU backend takes F32, BF16,
// FP8_E4M3 and FP8_E5M2 operands (not F16) and widens them exactly to fp32.
// Every GEMM of the model goes through this one entry point, so the fp8 converter only
// has to change the descriptor.
typedef struct {
    tetra_dtype a_type, b_type, c_type; // operands: F32, BF16, FP8_E4M3, FP8_E5M2; C: F32 or BF16
    int trans_a, trans_b;
    int m, n, k;
    int lda, ldb, ldc;
    float alpha, beta;
    const float *a_scale; // fp8 dequant scale of A, or NULL
    const float *b_scale; // fp8 dequant scale of B, or NULL
    int scale_rowwise;
    int fast_accum;                       // fp8 fast accumulation (GPU hint; the CPU always accumulates in fp32)
    int batch;                            // 0 or 1: a single product
    int64_t stride_a, stride_b, stride_c; // elements between batch items
    const void *c_in;                     // beta's C when it is not the output (above), or NULL
} ops_gemm_desc;

// One attention call: queries [Sq] against keys [Sk], which may be a block of a longer
// sequence (ring attention). Query row i has global position q_offset + i, key row j
// has k_offset + j; with `causal`, key j is visible to query i iff
// k_offset + j <= q_offset + i. That covers the diagonal block (equal offsets), fully
// visible blocks and fully masked blocks. A query row that sees no key gets out = 0 and
// lse = -inf, which the merge treats as "no contribution".
// GQA: query head h reads key/value head h / (H / KV), without copies.
// Document mask (TorchTitan's block_causal, kernels/ops_docmask.h): with `doc`, key j is
// visible to query i iff it is causally visible AND doc[q_offset + i] == doc[k_offset + j],
// where doc holds the document id of every GLOBAL position of each sequence (row b at
// doc + b * doc_len). Ids are nondecreasing along a sequence (documents packed end to
// end), so a query sees one contiguous range of keys, [start of its document, itself],
// and a tile whose queries and keys lie in different documents is skipped whole. Ring
// attention passes the same rows with its blocks' global offsets. `doc` is backend
// memory, requires causal = 1 and q_offset + sq, k_offset + sk <= doc_len; NULL is the
// plain mask. Every query sees at least itself in its diagonal block; in other blocks a
// row that sees nothing gets out = 0, lse = -inf as above.
typedef struct {
    int b;              // batch
    int sq, sk;         // query rows, key rows
    int h, kv;          // query heads, key/value heads (H % KV == 0)
    int d;              // head dim
    float scale;        // softmax scale, normally 1/sqrt(d)
    int causal;         // 0: every key visible; 1: causal by global position
    int q_offset;       // global position of query row 0
    int k_offset;       // global position of key row 0
    const int32_t *doc; // [B, doc_len] document id of each global position, or NULL
    int doc_len;        // positions per sequence in doc (the global sequence length)
} ops_attn_shape;

// Stretches of a flat parameter buffer whose largest magnitude adamw_step_amax reports as
// it writes them: stretch s covers [off[s], off[s] + len[s]) (len 0: nothing of it on this
// rank) and its max |w| goes to amax[s]. Stretches ascend and do not overlap. off, len and
// amax are backend memory; the struct itself is the caller's.
typedef struct {
    int n;
    const int64_t *off, *len; // [n]
    float *amax;              // [n]
} ops_amax_segments;

// ----------------------------------------------------------------------------
// the op table

// AdamW's fp32 coefficients of one step (kernels/ops_math.h derives them and applies them
// per element); grad_scale is the clip coefficient.
typedef struct {
    float decay, b1, omb1, b2, omb2, neg_step_size, bc2_sqrt, eps, grad_scale;
} tetra_adamw_coef;

// The optimizer step's scalars, kept in backend memory so that a step that logs nothing
// never reads a device value on the host: the gradient norm, the clip coefficient, whether
// the update happens, and AdamW's step count all stay on the device until the trainer
// next reads them (optim_scalars, adamw_step's `dev`). All zero before the first step
// except `updates`.
typedef struct {
    double sq;          // the step's global gradient sum of squares (sum_f64 writes it)
    tetra_adamw_coef k; // the coefficients adamw_step uses with `dev`
    int32_t skip;       // 1: this step applies no update
    int32_t updates;    // AdamW updates applied so far: the bias correction's t
    int32_t nonfinite;  // steps whose loss or gradient norm was not finite
    int32_t run;        // of those, in a row up to the latest step
    int32_t halted;     // 1: no update from now on (the trainer stops at its next read)
    int32_t pad_;
    int64_t first_bad; // the first non-finite step (the host's numbering; 0: none)
    int64_t last_bad;  // the latest non-finite step
} ops_optim_state;

// What the host knows of a step for optim_scalars.
typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    double max_norm;    // clip_grad_norm_'s max_norm
    int64_t step;       // the step's number (recorded in first_bad / last_bad)
    int32_t expected_t; // the bias correction's t if every step since the host's last read updated
    int32_t max_run;    // halt when this many steps in a row are non-finite (0: never)
    int32_t halt_first; // halt at the first non-finite step
} ops_optim_args;

// What the CUDA graphs of training.cuda_graph have done so far (graph_stats).
typedef struct {
    uint64_t launches;       // graphs launched: one per captured step
    uint64_t instantiations; // executable graphs built: the first, and after a change of topology
    uint64_t updates;        // launches that updated the executable graph in place (arguments only)
    uint64_t nodes;          // nodes (kernels, matmuls, copies, memsets) of the latest graph
} ops_graph_stats;

typedef struct tetra_ops {
    const char *name; // "cpu", "cuda"

    // ---- memory (backend memory; the CPU backend uses the host heap)
    void *(*alloc)(size_t bytes); // 64-byte aligned, NULL on failure
    void (*release)(void *p);
    void (*copy_h2d)(void *dst, const void *src, size_t bytes);
    // the same copy, ordered with the ops around it but not waited for, so the host runs
    // ahead of the device; src may change once the call returns (the CUDA backend stages
    // it in page-locked memory of its own)
    void (*copy_h2d_async)(void *dst, const void *src, size_t bytes);
    void (*copy_d2h)(void *dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes); // device to device
    void (*synchronize)(void);

    // ---- elementwise and reductions (fp32)
    void (*fill)(float *x /*[n]*/, float value, size_t n);
    void (*scale)(float *x /*[n]*/, float alpha, size_t n);                        // x *= alpha
    void (*axpy)(float *y /*[n]*/, const float *x /*[n]*/, float alpha, size_t n); // y += alpha x
    void (*add)(float *out /*[n]*/, const float *a /*[n]*/, const float *b /*[n]*/, size_t n);
    // out[0] += sum x^2 (accumulated so one scalar collects a whole global grad norm)
    void (*sum_squares)(float *out /*[1]*/, const float *x /*[n]*/, size_t n);
    // out[0] = sum x (e.g. the per-token losses)
    void (*sum)(float *out /*[1]*/, const float *x /*[n]*/, size_t n);
    // out[0] = max |x| (0 for n = 0); NaN in x gives NaN
    void (*amax)(float *out /*[1]*/, const float *x /*[n]*/, size_t n);
    // out[r] = max_c |x[r, c]|
    void (*amax_rows)(float *out /*[rows]*/, const float *x /*[rows, cols]*/, int rows, int cols);
    // the same two reductions over bf16 x (widened exactly: the results equal amax and
    // amax_rows of x's fp32 copy), so that fp8 scaling reads bf16 activations directly
    void (*amax_bf16)(float *out /*[1]*/, const uint16_t *x /*[n]*/, size_t n);
    void (*amax_rows_bf16)(float *out /*[rows]*/, const uint16_t *x /*[rows, cols]*/, int rows, int cols);
    // out[c] = max_r |x[r, c]| (x fp32 or bf16, xt), NaN as in amax: the per-column scales of
    // rowwise fp8 without a transposed copy of x
    void (*amax_cols)(float *out /*[cols]*/, const void *x /*[rows, cols]*/, tetra_dtype xt, int rows, int cols);
    // out[c, r] = x[r, c] (fp32, row-major both). out and x must not alias: the tiles are
    // written in a different order than they are read.
    void (*transpose)(float *out /*[cols, rows]*/, const float *x /*[rows, cols]*/, int rows, int cols);

    // ---- casts. fp8: out = rne(clamp(x * scale, -max, max)); scale is scale[0] or, with
    // rowwise, scale[r] for row r of [rows, cols]. bf16: round to nearest even.
    void (*cast_f32_to_bf16)(uint16_t *out /*[n]*/, const float *x /*[n]*/, size_t n);
    void (*cast_bf16_to_f32)(float *out /*[n]*/, const uint16_t *x /*[n]*/, size_t n);
    void (*cast_f32_to_fp8)(uint8_t *out /*[rows, cols]*/, const float *x /*[rows, cols]*/,
                            const float *scale /*[1] or [rows]*/, int rowwise, int rows, int cols, tetra_dtype fmt);
    // cast_f32_to_fp8 of bf16 x (the same bytes as casting x's fp32 copy)
    void (*cast_bf16_to_fp8)(uint8_t *out /*[rows, cols]*/, const uint16_t *x /*[rows, cols]*/,
                             const float *scale /*[1] or [rows]*/, int rowwise, int rows, int cols, tetra_dtype fmt);
    // out[c, r] = rne(clamp(x[r, c] * scale[c], -max, max)): x (fp32 or bf16, xt) transposed
    // and cast in one pass, each row of out (a column of x) with its own scale; the bytes
    // of cast_f32_to_fp8(rowwise) on x's fp32 transpose
    void (*cast_transpose_to_fp8)(uint8_t *out /*[cols, rows]*/, const void *x /*[rows, cols]*/, tetra_dtype xt,
                                  const float *scale /*[cols]*/, int rows, int cols, tetra_dtype fmt);
    // out = decode(q) * inv_scale (inv_scale[1] or, rowwise, [rows]; NULL: 1)
    void (*cast_fp8_to_f32)(float *out /*[rows, cols]*/, const uint8_t *q /*[rows, cols]*/, const float *inv_scale,
                            int rowwise, int rows, int cols, tetra_dtype fmt);
    // scale[i] = fp8_max / max(a, 1e-12), optionally rounded down to a power of 2 (torchao:
    // computed in double, stored fp32), with a = amax[i], or amax[0] for every i with
    // broadcast (n scales from one amax: a tensorwise scale where a rowwise gemm or cast
    // takes a vector). Unless inv_scale is NULL, inv_scale[i] = 1.0f / scale[i], one IEEE
    // fp32 division (both backends give the same bits): the dequant factor that the gemm
    // takes as a_scale/b_scale and cast_fp8_to_f32 as inv_scale.
    void (*fp8_scale_from_amax)(float *scale /*[n]*/, float *inv_scale /*[n] or NULL*/,
                                const float *amax /*[n], or [1] with broadcast*/, int n, int broadcast, float fp8_max,
                                int pow2);
    // Tensorwise quantisation in one pass, the scale taken from a device amax: s =
    // fp8_max / max(amax[0], 1e-12) as fp8_scale_from_amax computes it (fp8_max of fmt, no
    // power of 2), q = rne(clamp(x * s, -max, max)) of x [rows, cols] (fp32 or bf16, xt)
    // written to out [rows, cols] and/or to its transpose out_t [cols, rows] (either may be
    // NULL), and inv_scale[0] = 1.0f / s unless inv_scale is NULL. The bytes are those of
    // fp8_scale_from_amax followed by cast_*_to_fp8 (out) and cast_transpose_to_fp8 with
    // that scale in every column (out_t): one read of x gives the operand of both GEMM
    // layouts, already K-major for the fp8 GEMM.
    void (*fp8_quantize)(uint8_t *out /*[rows, cols] or NULL*/, uint8_t *out_t /*[cols, rows] or NULL*/,
                         float *inv_scale /*[1] or NULL*/, const void *x /*[rows, cols]*/, tetra_dtype xt,
                         const float *amax /*[1]*/, int rows, int cols, tetra_dtype fmt);

    // ---- matmul (see ops_gemm_desc)
    void (*gemm)(void *c, const void *a, const void *b, const ops_gemm_desc *g);

    // ---- embedding (vocab-parallel: this rank holds rows [v_start, v_start + Vl) of the
    // table; tokens outside the shard give zero rows and no gradient)
    void (*embedding_forward)(float *out /*[N, C]*/, const int32_t *tokens /*[N]*/, const float *wte /*[Vl, C]*/, int n,
                              int c, int v_start, int v_local);
    // dwte += scatter(dout) (accumulates; deterministic)
    void (*embedding_backward)(float *dwte /*[Vl, C]*/, const float *dout /*[N, C]*/, const int32_t *tokens /*[N]*/,
                               int n, int c, int v_start, int v_local);

    // ---- RMSNorm: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps)
    void (*rmsnorm_forward)(float *out /*[N, C]*/, float *rstd /*[N]*/, const float *x /*[N, C]*/,
                            const float *w /*[C]*/, int n, int c, float eps);
    // "I" half: dx = dres + d/dx, the residual gradient dres (NULL: dx's own values, which
    // it accumulates into; else not overlapping dx) plus the norm's, so that the residual
    // needs no copy into dx first
    void (*rmsnorm_backward_input)(float *dx /*[N, C]*/, const float *dout /*[N, C]*/, const float *x /*[N, C]*/,
                                   const float *w /*[C]*/, const float *rstd /*[N]*/, int n, int c,
                                   const float *dres /*[N, C] or NULL*/);
    // "W" half: dw += sum_rows dout * x * rstd (deterministic column reduction); with
    // accumulate 0, dw = the sum (dw's old values are not read)
    void (*rmsnorm_backward_weight)(float *dw /*[C]*/, const float *dout /*[N, C]*/, const float *x /*[N, C]*/,
                                    const float *rstd /*[N]*/, int n, int c, int accumulate);

    // ---- RoPE on [B, S, nh, D] (q: nh = H, k: nh = KV); pairs (x[2i], x[2i+1]) rotated by
    // freqs[pos, i] = (cos, sin) (ops_rope_table). Position of row s: pos[s] if pos is not
    // NULL, else pos_offset + s (context parallel passes global positions).
    // Row r (of B*S) of out starts at out + r * out_ld, of x at x + r * x_ld (elements): nh*D
    // for a tensor of its own, more for the q or k columns of a fused projection's output
    // [N, H*D + 2 KV*D]. In place allowed (out == x, out_ld == x_ld).
    void (*rope_forward)(float *out /*[B*S rows of out_ld]*/, const float *x /*[B*S rows of x_ld]*/,
                         const float *freqs /*[max_pos, D/2, 2]*/, const int32_t *pos /*[S] or NULL*/, int pos_offset,
                         int b, int s, int nh, int d, int out_ld, int x_ld);
    // dx = rotate(dout, -angle) (writes; in place allowed; rows as rope_forward's)
    void (*rope_backward)(float *dx /*[B*S rows of dx_ld]*/, const float *dout /*[B*S rows of dout_ld]*/,
                          const float *freqs /*[max_pos, D/2, 2]*/, const int32_t *pos /*[S] or NULL*/, int pos_offset,
                          int b, int s, int nh, int d, int dx_ld, int dout_ld);

    // ---- SwiGLU: out = silu(a) * g, a = x W1^T, g = x W3^T
    void (*swiglu_forward)(float *out /*[n]*/, const float *a /*[n]*/, const float *g /*[n]*/, size_t n);
    // da = dout * g * silu'(a), dg = dout * silu(a) (writes; da may alias a, dg may alias g)
    void (*swiglu_backward)(float *da /*[n]*/, float *dg /*[n]*/, const float *dout /*[n]*/, const float *a /*[n]*/,
                            const float *g /*[n]*/, size_t n);

    // ---- attention (flash-style: blockwise online softmax, never B*H*S*S).
    // Layouts: q/out [B, Sq, H, D] (the natural x Wq^T layout), k/v [B, Sk, KV, D],
    // lse [B, H, Sq] (natural log of the softmax denominator of the scaled scores).
    // workspace: attention_workspace_size(shape) bytes of backend memory (O(B*H*Sq), never
    // O(S^2); independent of the thread count), or NULL to let the backend allocate it per
    // call. Ring attention: a call per (query block, key block) pair with the blocks'
    // global offsets in the shape; fully masked pairs return at once.
    size_t (*attention_workspace_size)(const ops_attn_shape *s);
    void (*attention_forward)(float *out /*[B, Sq, H, D]*/, float *lse /*[B, H, Sq]*/, const float *q /*[B, Sq, H, D]*/,
                              const float *k /*[B, Sk, KV, D]*/, const float *v /*[B, Sk, KV, D]*/,
                              const ops_attn_shape *s, void *workspace);
    // out/lse are the FINAL (merged) forward results of this query block; dq, dk, dv are
    // accumulated (+=), so ring attention calls it once per key block.
    void (*attention_backward)(float *dq /*[B, Sq, H, D]*/, float *dk /*[B, Sk, KV, D]*/, float *dv /*[B, Sk, KV, D]*/,
                               const float *dout /*[B, Sq, H, D]*/, const float *q /*[B, Sq, H, D]*/,
                               const float *k /*[B, Sk, KV, D]*/, const float *v /*[B, Sk, KV, D]*/,
                               const float *out /*[B, Sq, H, D]*/, const float *lse /*[B, H, Sq]*/,
                               const ops_attn_shape *s, void *workspace);
    // Merge a partial (out_blk, lse_blk) over a disjoint key set into (out, lse), in place:
    // lse' = log(e^lse + e^lse_blk), out' = out e^(lse - lse') + out_blk e^(lse_blk - lse').
    void (*attention_merge)(float *out /*[B, Sq, H, D]*/, float *lse /*[B, H, Sq]*/,
                            const float *out_blk /*[B, Sq, H, D]*/, const float *lse_blk /*[B, H, Sq]*/, int b, int sq,
                            int h, int d);

    // ---- cross-entropy over logits z (fp32), target t (OPS_IGNORE_INDEX: no loss, zero grad).
    // Fused, whole vocabulary: losses[i] = logsumexp(z_i) - z_i[t_i] (0 if ignored) and,
    // unless dlogits is NULL, dlogits = (softmax(z) - onehot(t)) * dloss_scale (the caller
    // passes 1/global_valid_tokens). dlogits may alias logits (in place). Targets must be
    // in [0, V) or OPS_IGNORE_INDEX; anything else is treated as ignored.
    void (*cross_entropy)(float *dlogits /*[N, V] or NULL*/, float *losses /*[N]*/, const float *logits /*[N, V]*/,
                          const int32_t *targets /*[N]*/, int n, int v, float dloss_scale);
    // The same over bf16 logits with dlogits written in bf16: the losses and the bits
    // cast_f32_to_bf16 makes of cross_entropy's dlogits over the logits widened to fp32
    // (TorchTitan's loss over the bf16 output projection, which it casts to fp32 first).
    // dlogits is never NULL and may alias logits (in place: one [N, V] bf16 buffer).
    void (*cross_entropy_bf16)(uint16_t *dlogits /*[N, V]*/, float *losses /*[N]*/, const uint16_t *logits /*[N, V]*/,
                               const int32_t *targets /*[N]*/, int n, int v, float dloss_scale);
    // Vocab-sharded (loss parallel), three phases with reductions between them:
    //   1. ce_shard_max   -> row_max (local)        ; all-reduce MAX over the vocab group
    //   2. ce_shard_sums  -> sum_exp, target_logit  ; all-reduce SUM over the vocab group
    //   3. ce_shard_finish-> losses, dlogits
    // sum_exp[i] = sum_j exp(z_ij - row_max_i); target_logit[i] = z_i[t_i] - row_max_i if
    // t_i lies in [v_start, v_start + Vl), else 0. sum_exp and target_logit may be the two
    // halves of one [2, N] buffer so one all-reduce moves both.
    void (*ce_shard_max)(float *row_max /*[N]*/, const float *logits /*[N, Vl]*/, int n, int v_local);
    void (*ce_shard_sums)(float *sum_exp /*[N]*/, float *target_logit /*[N]*/, const float *logits /*[N, Vl]*/,
                          const float *row_max /*[N]*/, const int32_t *targets /*[N]*/, int n, int v_local,
                          int v_start);
    // losses[i] = log(sum_exp_i) - target_logit_i (0 if ignored; every shard computes the
    // same values); dlogits as in cross_entropy, the -1 only on the shard owning t_i.
    void (*ce_shard_finish)(float *dlogits /*[N, Vl] or NULL*/, float *losses /*[N]*/, const float *logits /*[N, Vl]*/,
                            const float *row_max /*[N]*/, const float *sum_exp /*[N]*/,
                            const float *target_logit /*[N]*/, const int32_t *targets /*[N]*/, int n, int v_local,
                            int v_start, float dloss_scale);

    // ---- AdamW, torch.optim.AdamW semantics (decoupled decay, bias correction with step t):
    // g = grad * grad_scale; p *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    // p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). Hyperparameters are double
    // because torch derives its fp32 coefficients from Python floats (1 - 0.9 in double,
    // then rounded, differs from 1 - 0.9f). step is t >= 1 (after the increment).
    // grad_scale multiplies the gradient first (the clip coefficient; 1 for none).
    // With `dev` (backend memory, written by optim_scalars) the step, clip coefficient and
    // hyperparameters come from dev->k instead, and nothing changes when dev->skip is set;
    // the host arguments are then ignored.
    void (*adamw_step)(float *param /*[n]*/, float *m /*[n]*/, float *v /*[n]*/, const float *grad /*[n]*/, size_t n,
                       double lr, double beta1, double beta2, double eps, double weight_decay, int step,
                       float grad_scale, const ops_optim_state *dev);

    // ---- appended members (new slots go at the end so older initialisers stay valid)

    // Mixed precision: adamw_step on the fp32 master weights `param`, then
    // param_bf16 = bf16(param) (round to nearest even), the compute copy.
    void (*adamw_step_bf16)(float *param /*[n]*/, uint16_t *param_bf16 /*[n]*/, float *m /*[n]*/, float *v /*[n]*/,
                            const float *grad /*[n]*/, size_t n, double lr, double beta1, double beta2, double eps,
                            double weight_decay, int step, float grad_scale, const ops_optim_state *dev);

    // ---- bf16 activations (mixed precision, training.mixed_precision_param = "bfloat16").
    // Activations and the parameters' compute copies are bf16 (uint16_t bit patterns). Each
    // op reads them, computes in fp32 with the per-element math of its fp32 twin above
    // (kernels/ops_math.h) and rounds every output once, to nearest even. Statistics stay
    // fp32 (rstd, lse). PARAMETER GRADIENTS ARE fp32 and accumulate (+=) exactly as in the
    // fp32 ops, so they are summed, clipped and reduced in fp32. An accumulating bf16
    // activation gradient (rmsnorm dx) is read, summed in fp32 and rounded once.
    // Layouts, sizes and aliasing rules are those of the fp32 twin unless stated.
    void (*embedding_forward_bf16)(uint16_t *out /*[N, C]*/, const int32_t *tokens /*[N]*/,
                                   const uint16_t *wte /*[Vl, C]*/, int n, int c, int v_start, int v_local);
    // dwte (fp32) += scatter(dout) (deterministic)
    void (*embedding_backward_bf16)(float *dwte /*[Vl, C]*/, const uint16_t *dout /*[N, C]*/,
                                    const int32_t *tokens /*[N]*/, int n, int c, int v_start, int v_local);
    // amax (NULL: not computed): amax_bf16 of out, formed as out is written (as swiglu's)
    void (*rmsnorm_forward_bf16)(uint16_t *out /*[N, C]*/, float *rstd /*[N]*/, float *amax /*[1] or NULL*/,
                                 const uint16_t *x /*[N, C]*/, const uint16_t *w /*[C]*/, int n, int c, float eps);
    // dx = bf16(dres + d/dx), dres as rmsnorm_backward_input's (NULL: dx); amax (NULL: not
    // computed): amax_bf16 of dx, formed as dx is written (as swiglu's)
    void (*rmsnorm_backward_input_bf16)(uint16_t *dx /*[N, C]*/, float *amax /*[1] or NULL*/,
                                        const uint16_t *dout /*[N, C]*/, const uint16_t *x /*[N, C]*/,
                                        const uint16_t *w /*[C]*/, const float *rstd /*[N]*/, int n, int c,
                                        const uint16_t *dres);
    // dw (fp32) += sum_rows dout * x * rstd (deterministic column reduction); accumulate as
    // rmsnorm_backward_weight's
    void (*rmsnorm_backward_weight_bf16)(float *dw /*[C]*/, const uint16_t *dout /*[N, C]*/,
                                         const uint16_t *x /*[N, C]*/, const float *rstd /*[N]*/, int n, int c,
                                         int accumulate);
    void (*rope_forward_bf16)(uint16_t *out /*[B*S rows of out_ld]*/, const uint16_t *x /*[B*S rows of x_ld]*/,
                              const float *freqs /*[max_pos, D/2, 2]*/, const int32_t *pos /*[S] or NULL*/,
                              int pos_offset, int b, int s, int nh, int d, int out_ld, int x_ld);
    // amax (NULL: not computed): amax_bf16 of dx, formed as dx is written (as swiglu's);
    // only for a dx of its own (dx_ld == nh*D)
    void (*rope_backward_bf16)(uint16_t *dx /*[B*S rows of dx_ld]*/, float *amax /*[1] or NULL*/,
                               const uint16_t *dout /*[B*S rows of dout_ld]*/, const float *freqs /*[max_pos, D/2, 2]*/,
                               const int32_t *pos /*[S] or NULL*/, int pos_offset, int b, int s, int nh, int d,
                               int dx_ld, int dout_ld);
    // amax, amax_da, amax_dg (each [1], NULL: not computed): what amax_bf16 gives over
    // what the op wrote (out; da; dg), formed as the outputs are written, so an fp8 cast of
    // them needs no pass of its own to find its scale
    void (*swiglu_forward_bf16)(uint16_t *out /*[n]*/, float *amax, const uint16_t *a /*[n]*/,
                                const uint16_t *g /*[n]*/, size_t n);
    void (*swiglu_backward_bf16)(uint16_t *da /*[n]*/, uint16_t *dg /*[n]*/, float *amax_da, float *amax_dg,
                                 const uint16_t *dout /*[n]*/, const uint16_t *a /*[n]*/, const uint16_t *g /*[n]*/,
                                 size_t n);
    // Attention on bf16 q/k/v with fp32 softmax statistics. The CUDA backend runs cuDNN's
    // fused SDPA where it applies (causal with equal offsets, or non-causal) and its own
    // kernel otherwise. The workspace (attention_workspace_size_bf16 bytes, or NULL to use
    // the backend's reserved scratch) is O(B*H*Sq + B*S*(H+2KV)*D), never O(S^2).
    size_t (*attention_workspace_size_bf16)(const ops_attn_shape *s);
    void (*attention_forward_bf16)(uint16_t *out /*[B, Sq, H, D]*/, float *lse /*[B, H, Sq]*/,
                                   const uint16_t *q /*[B, Sq, H, D]*/, const uint16_t *k /*[B, Sk, KV, D]*/,
                                   const uint16_t *v /*[B, Sk, KV, D]*/, const ops_attn_shape *s, void *workspace);
    // Unlike the fp32 op, dq, dk and dv are WRITTEN (cuDNN's contract): a ring schedule
    // sums the blocks' bf16 gradients itself (in fp32).
    void (*attention_backward_bf16)(uint16_t *dq /*[B, Sq, H, D]*/, uint16_t *dk /*[B, Sk, KV, D]*/,
                                    uint16_t *dv /*[B, Sk, KV, D]*/, const uint16_t *dout /*[B, Sq, H, D]*/,
                                    const uint16_t *q /*[B, Sq, H, D]*/, const uint16_t *k /*[B, Sk, KV, D]*/,
                                    const uint16_t *v /*[B, Sk, KV, D]*/, const uint16_t *out /*[B, Sq, H, D]*/,
                                    const float *lse /*[B, H, Sq]*/, const ops_attn_shape *s, void *workspace);

    // ---- memory accounting and streams.
    // Successful alloc calls so far, and backend bytes held through alloc (plus the
    // backend's own scratch). A training step adds none: everything is taken at start-up.
    size_t (*alloc_count)(void);
    size_t (*allocated_bytes)(void);
    // After memory_freeze(1), any further device allocation (alloc, or growth of the
    // backend's internal scratch) is reported with its size and purpose and fails: the
    // trainer freezes after start-up and a warm-up microbatch. memory_freeze(0) thaws.
    void (*memory_freeze)(int frozen);
    // Device memory free and total (cudaMemGetInfo); the CPU backend reports 0, 0.
    void (*device_memory)(size_t *free_bytes, size_t *total_bytes);
    // The stream every op runs on (a cudaStream_t on CUDA; NULL on the CPU). Collectives
    // order themselves after it with events; the backend's synchronize() waits for it.
    void *(*compute_stream)(void);
    // Named ranges around the profiler's spans, for external profilers: NVTX on CUDA (nsys
    // and Nsight Compute show the trace's names); NULL on the CPU.
    void (*range_push)(const char *name);
    void (*range_pop)(void);

    // training.deterministic: every op gives the same bits on every run. The CPU backend
    // always does; the CUDA backend then runs the bf16 attention backward on its own
    // kernel (cuDNN's accumulates dQ with atomics).
    void (*set_deterministic)(int on);

    // 1 when backend memory is ordinary host memory (the CPU backend), so MPI can move it
    // as it is; 0 on a GPU (and the CUDA kernels on the CPU simulator, which stand in for
    // one), where NCCL moves it, or MPI through page-locked host copies (host_alloc).
    int host_memory;

    // ---- several ranks on one node's devices
    // Make device `index` modulo the device count this process' device: a rank calls it
    // with its node-local rank before its first alloc or op, so ranks spread over the
    // node's GPUs and, when there are more ranks than GPUs, share them. Returns 0, or -1
    // with a message (also when called after the backend has started on another device).
    // NULL on the CPU.
    int (*select_device)(int index, char *err, size_t errlen);
    // Page-locked host memory (cudaHostAlloc) for staging device buffers through the host,
    // as the MPI collectives on device memory do; the CPU backend's heap on the CPU.
    // NULL on failure. Not counted in alloc_count or allocated_bytes.
    void *(*host_alloc)(size_t bytes);
    void (*host_release)(void *p);
    // dst[r * dpitch + c] = src[r * spitch + c] for c < width, r < rows (bytes; device to
    // device, ordered like copy): one strided copy instead of a copy per row.
    void (*copy_2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows);

    // ---- the optimizer's scalars on the device (ops_optim_state)
    // out[i] = (double)sq[i], the stages' gradient sums of squares widened for their
    // reductions over ranks; when the sum of loss[0..n_loss) is not finite, out[0] is NaN,
    // so that every rank those reductions reach sees the step as non-finite.
    void (*grad_sq_to_f64)(double *out /*[n]*/, const float *sq /*[n]*/, int n, const float *loss /*[n_loss]*/,
                           int n_loss);
    // *out = in[0] + in[1] + ... in that order, in double.
    void (*sum_f64)(double *out, const double *in /*[n]*/, int n);
    // From s->sq: norm = sqrt(sq). A finite norm: the clip coefficient
    // min(1, (float)(max_norm / (norm + 1e-6))) (torch.nn.utils.clip_grad_norm_), the
    // coefficients of t = updates + 1 (tetra_adamw_coefficients; those of expected_t are
    // derived on the host, the same bits), updates += 1, run = 0. Not finite: nonfinite
    // and run += 1, first_bad / last_bad = step, halted when halt_first or run reaches
    // max_run. skip = non-finite or halted (a halted state updates nothing again).
    void (*optim_scalars)(ops_optim_state *s, const ops_optim_args *a);
    // Host waits so far: every blocking copy, stream or device synchronisation the backend
    // has made (a host read of a device value is one). 0 on the CPU, whose ops finish
    // before they return.
    uint64_t (*host_waits)(void);
    // adamw_step (param_bf16 NULL) or adamw_step_bf16, the same bits, that also writes each
    // stretch's max |w| of the parameters as the compute copy holds them after the step
    // (param_bf16 where given, else param; as they were when dev skips the update), NaN
    // when one is NaN, 0 for an empty stretch: a converter's statistics of its weights
    // (Float8's weight scales) without a pass over each weight.
    void (*adamw_step_amax)(float *param /*[n]*/, uint16_t *param_bf16 /*[n] or NULL*/, float *m /*[n]*/,
                            float *v /*[n]*/, const float *grad /*[n]*/, size_t n, double lr, double beta1,
                            double beta2, double eps, double weight_decay, int step, float grad_scale,
                            const ops_optim_state *dev, const ops_amax_segments *seg);
    // cast_fp8_to_f32 then cast_f32_to_bf16 in one pass, the same bits: codes dequantised
    // straight into the compute dtype (the float8 all-gather's decode)
    void (*cast_fp8_to_bf16)(uint16_t *out /*[rows, cols]*/, const uint8_t *q /*[rows, cols]*/, const float *inv_scale,
                             int rowwise, int rows, int cols, tetra_dtype fmt);
    // out = x^T, bytes (fp8 codes): the other GEMM layout of codes that arrived whole (the
    // float8 all-gather's weights)
    void (*transpose_u8)(uint8_t *out /*[cols, rows]*/, const uint8_t *x /*[rows, cols]*/, int rows, int cols);

    // ---- CUDA graphs (training.cuda_graph). After graph_begin the ops on the compute
    // stream are recorded with their arguments, not run; graph_end launches the recording
    // as one graph, updating the previous executable graph in place when only arguments
    // changed (else building it anew). copy_h2d_async in between stages at most
    // staging_bytes in all (each copy rounded up to 256 bytes), in page-locked memory of the graph's own that stays as written
    // until that launch has read it (two such areas take turns; starting one waits, counted
    // as a host wait, only when the launch before last has not run yet). Nothing in between
    // may wait for the device or allocate: a host wait there aborts, naming it. Both return
    // 0, or -1 with a message. NULL where the backend has no graphs (the CPU).
    int (*graph_begin)(size_t staging_bytes, char *err, size_t errlen);
    int (*graph_end)(char *err, size_t errlen);
    void (*graph_stats)(ops_graph_stats *out);
} tetra_ops;

// Pick a backend: "cpu", "cuda", or "auto" (cuda when built in and a device is present,
// else cpu). Returns NULL and writes a message into err on failure.
const tetra_ops *ops_get(const char *device, char *err, size_t errlen);

// A table for planning (dry runs) as if on `device` ("cpu", "cuda", "auto"), usable
// without the device: its name and the workspace-size functions only (for CUDA the
// built-in attention kernels' workspace); alloc reports a bug and aborts, every other
// member is NULL.
const tetra_ops *ops_plan(const char *device, char *err, size_t errlen);

// The CPU table (always built). It threads with OpenMP (omp_get_max_threads(), i.e.
// OMP_NUM_THREADS) and switches OpenBLAS to one thread, so one pool runs everything.
const tetra_ops *ops_cpu(void);

// OpenBLAS (the CPU backend's fp8/bf16-widened and fallback fp32 GEMMs) picks its kernels
// by CPU model when it is loaded; on a model it does not know it falls back to pre-AVX2
// kernels whatever the ISA. Returns the OPENBLAS_CORETYPE that selects the kernels this
// CPU can run ("SkylakeX" with AVX-512, "Haswell" with AVX2 and FMA) when that happened
// and the variable is not set, else NULL. The variable is read only at load time, so
// only a process restarted with it set (tetra's main re-executes itself) gains.
const char *ops_cpu_blas_coretype(void);

// The CUDA backend (kernels/cuda) provides this; it exists only in builds with the CUDA
// backend (TETRA_HAVE_CUDA), and ops_get references it only there. Returns NULL with a
// message in err when no usable device is present.
const tetra_ops *ops_cuda(char *err, size_t errlen);

// RoPE table, computed on the host exactly as TorchTitan's precompute_freqs_cis in fp32:
// freqs_i = 1 / theta^((2i)/D) (fp32), Llama 3.1 scaling when `scaled`
// (factor, low_freq_factor, high_freq_factor, original_max_pos = 8, 1, 4, 8192 for
// Llama 3.1), angle = fp32(pos * freq_i), table[pos, i] = (cos angle, sin angle).
// Copy it to backend memory with copy_h2d.
void ops_rope_table(float *table /*[max_pos, D/2, 2]*/, int d, int max_pos, float theta, int scaled, float factor,
                    float low_freq_factor, float high_freq_factor, int original_max_pos);

#ifdef __cplusplus
}
#endif

#endif // TETRA_KERNELS_OPS_H
