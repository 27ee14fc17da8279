// kernels/cpu/cpu_layers.c — embedding, RMSNorm, RoPE, SwiGLU and the fused
// cross-entropy of the CPU backend (fp32). Per-element math comes from ops_math.h so the
// CUDA backend computes the same functions; the row kernels (cpu_*_k) are also what the
// bf16 twins in cpu_bf16.c run on widened rows.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops_math.h"

// Rows per parallel task for row-wise ops: enough work to amortise the OpenMP fork.
static int row_parallel(int n, int c) { return (int64_t)n * (int64_t)c > CPU_CHUNK && n > 1; }

// ----------------------------------------------------------------------------
// embedding

void cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte, int n, int c, int v_start,
                           int v_local) {
#pragma omp parallel for schedule(static) if (row_parallel(n, c))
    for (int i = 0; i < n; i++) {
        float *o = out + (size_t)i * c;
        int t = tokens[i] - v_start;
        if (t >= 0 && t < v_local) memcpy(o, wte + (size_t)t * c, (size_t)c * sizeof(float));
        else memset(o, 0, (size_t)c * sizeof(float)); // token owned by another vocab shard
    }
}

CPU_SIMD static void add_row_k(float *restrict y, const float *restrict x, int n) {
    for (int j = 0; j < n; j++) y[j] += x[j];
}

// Deterministic scatter-add without atomics: threads own disjoint column blocks and walk
// the tokens in order, so repeated tokens always sum in the same order.
void cpu_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int n, int c, int v_start,
                            int v_local) {
    const int cb = 64;
    int nblk = (c + cb - 1) / cb;
#pragma omp parallel for schedule(static) if (row_parallel(n, c))
    for (int blk = 0; blk < nblk; blk++) {
        int j0 = blk * cb, w = c - j0 < cb ? c - j0 : cb;
        for (int i = 0; i < n; i++) {
            int t = tokens[i] - v_start;
            if (t < 0 || t >= v_local) continue;
            add_row_k(dwte + (size_t)t * c + j0, dout + (size_t)i * c + j0, w);
        }
    }
}

// ----------------------------------------------------------------------------
// RMSNorm

CPU_SIMD void cpu_rmsnorm_row_k(float *restrict out, float *restrict rstd, const float *restrict x,
                                const float *restrict w, int c, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < c; j++) ss += x[j] * x[j];
    float r = tetra_rms_rstd(ss, c, eps);
    for (int j = 0; j < c; j++) out[j] = (x[j] * r) * w[j];
    *rstd = r;
}

void cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int n, int c, float eps) {
#pragma omp parallel for schedule(static) if (row_parallel(n, c))
    for (int i = 0; i < n; i++) cpu_rmsnorm_row_k(out + (size_t)i * c, rstd + i, x + (size_t)i * c, w, c, eps);
}

CPU_SIMD void cpu_rmsnorm_bwd_row_k(float *restrict dx, const float *restrict dy, const float *restrict x,
                                    const float *restrict w, float r, int c) {
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j < c; j++) dot += w[j] * dy[j] * x[j];
    float dot_c = dot / (float)c;
    for (int j = 0; j < c; j++) dx[j] += tetra_rms_dx(x[j], w[j], dy[j], r, dot_c);
}

void cpu_rmsnorm_backward_input(float *dx, const float *dout, const float *x, const float *w, const float *rstd, int n,
                                int c, const float *dres) {
#pragma omp parallel for schedule(static) if (row_parallel(n, c))
    for (int i = 0; i < n; i++) {
        size_t o = (size_t)i * c;
        if (dres && dres != dx) memcpy(dx + o, dres + o, (size_t)c * sizeof(float)); /* the row, cache-hot */
        cpu_rmsnorm_bwd_row_k(dx + o, dout + o, x + o, w, rstd[i], c);
    }
}

CPU_SIMD static void rmsnorm_dw_k(double *restrict acc, const float *restrict dy, const float *restrict x, float r,
                                  int w) {
    for (int j = 0; j < w; j++) acc[j] += (double)(dy[j] * (x[j] * r));
}

// the same term on bf16 loads (rmsnorm_backward_weight_bf16)
CPU_SIMD static void rmsnorm_dw_bf16_k(double *restrict acc, const uint16_t *restrict dy, const uint16_t *restrict x,
                                       float r, int w) {
    for (int j = 0; j < w; j++) acc[j] += (double)(tetra_bf16_to_f32(dy[j]) * (tetra_bf16_to_f32(x[j]) * r));
}

// Column blocks again: each thread reduces its columns over all rows in row order
// (deterministic), accumulating in double. One loop for both element types, so the
// bf16 op's fp32 gradient is summed exactly as the fp32 op's.
void cpu_rmsnorm_dw_blocks(float *dw, const void *dout, const void *x, const float *rstd, int n, int c, int bf16,
                           int accumulate) {
    const int cb = 64;
    int nblk = (c + cb - 1) / cb;
#pragma omp parallel for schedule(static) if (row_parallel(n, c))
    for (int blk = 0; blk < nblk; blk++) {
        int j0 = blk * cb, w = c - j0 < cb ? c - j0 : cb;
        double acc[64] = {0};
        for (int i = 0; i < n; i++) {
            size_t o = (size_t)i * c + j0;
            if (bf16) rmsnorm_dw_bf16_k(acc, (const uint16_t *)dout + o, (const uint16_t *)x + o, rstd[i], w);
            else rmsnorm_dw_k(acc, (const float *)dout + o, (const float *)x + o, rstd[i], w);
        }
        if (accumulate)
            for (int j = 0; j < w; j++) dw[j0 + j] += (float)acc[j];
        else
            for (int j = 0; j < w; j++) dw[j0 + j] = (float)acc[j];
    }
}

void cpu_rmsnorm_backward_weight(float *dw, const float *dout, const float *x, const float *rstd, int n, int c,
                                 int accumulate) {
    cpu_rmsnorm_dw_blocks(dw, dout, x, rstd, n, c, 0, accumulate);
}

// ----------------------------------------------------------------------------
// RoPE

CPU_SIMD void cpu_rope_row_k(float *out, const float *x, const float *f, int nh, int d, int inverse) {
    int half = d / 2;
    for (int h = 0; h < nh; h++) {
        const float *xh = x + (size_t)h * d;
        float *oh = out + (size_t)h * d;
        for (int i = 0; i < half; i++) {
            float x0 = xh[2 * i], x1 = xh[2 * i + 1], c = f[2 * i], s = f[2 * i + 1];
            if (inverse) tetra_rope_unrotate(&oh[2 * i], &oh[2 * i + 1], x0, x1, c, s);
            else tetra_rope_rotate(&oh[2 * i], &oh[2 * i + 1], x0, x1, c, s);
        }
    }
}

static void rope_apply(float *out, const float *x, const float *freqs, const int32_t *pos, int pos_offset, int b, int s,
                       int nh, int d, size_t out_ld, size_t x_ld, int inverse) {
    int rows = b * s;
    size_t row = (size_t)nh * d;
#pragma omp parallel for schedule(static) if (row_parallel(rows, (int)row))
    for (int r = 0; r < rows; r++) {
        int si = r % s;
        int p = pos ? pos[si] : pos_offset + si;
        cpu_rope_row_k(out + (size_t)r * out_ld, x + (size_t)r * x_ld, freqs + (size_t)p * d, nh, d, inverse);
    }
}

void cpu_rope_forward(float *out, const float *x, const float *freqs, const int32_t *pos, int pos_offset, int b, int s,
                      int nh, int d, int out_ld, int x_ld) {
    rope_apply(out, x, freqs, pos, pos_offset, b, s, nh, d, (size_t)out_ld, (size_t)x_ld, 0);
}

void cpu_rope_backward(float *dx, const float *dout, const float *freqs, const int32_t *pos, int pos_offset, int b,
                       int s, int nh, int d, int dx_ld, int dout_ld) {
    rope_apply(dx, dout, freqs, pos, pos_offset, b, s, nh, d, (size_t)dx_ld, (size_t)dout_ld, 1);
}

// ----------------------------------------------------------------------------
// SwiGLU

CPU_SIMD void cpu_swiglu_fwd_k(float *out, const float *a, const float *g, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = tetra_silu(a[i]) * g[i];
}

CPU_SIMD void cpu_swiglu_bwd_k(float *da, float *dg, const float *dout, const float *a, const float *g, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float ai = a[i], gi = g[i], d = dout[i];
        float dai = d * gi * tetra_dsilu(ai);
        float dgi = d * tetra_silu(ai);
        da[i] = dai; // a and g are read before either write: in place is safe
        dg[i] = dgi;
    }
}

void cpu_swiglu_forward(float *out, const float *a, const float *g, size_t n) {
    int64_t nc = ((int64_t)n + CPU_CHUNK - 1) / CPU_CHUNK;
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) {
        size_t lo = (size_t)(c * CPU_CHUNK), hi = lo + (size_t)CPU_CHUNK < n ? lo + (size_t)CPU_CHUNK : n;
        cpu_swiglu_fwd_k(out + lo, a + lo, g + lo, hi - lo);
    }
}

void cpu_swiglu_backward(float *da, float *dg, const float *dout, const float *a, const float *g, size_t n) {
    int64_t nc = ((int64_t)n + CPU_CHUNK - 1) / CPU_CHUNK;
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) {
        size_t lo = (size_t)(c * CPU_CHUNK), hi = lo + (size_t)CPU_CHUNK < n ? lo + (size_t)CPU_CHUNK : n;
        cpu_swiglu_bwd_k(da + lo, dg + lo, dout + lo, a + lo, g + lo, hi - lo);
    }
}

// ----------------------------------------------------------------------------
// cross-entropy. Per row: max, then exp(z - max) summed (and stored into dlogits when a
// gradient is wanted, so each logit is exponentiated once), then one scaling pass. The
// row stays in cache between passes (V = 128256 fp32 is 501 KiB).

CPU_SIMD static float row_max_k(const float *z, int v) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int j = 0; j < v; j++) m = z[j] > m ? z[j] : m;
    return m;
}

// sum_j exp(z_j - m), optionally storing the exponentials into e. Summed in fp32 vector
// lanes over blocks of 512 and the block sums in double: accurate for V = 128256 and
// vectorizable on every ISA level (a double accumulator per element is not, on AVX2).
#define SUMEXP_BLOCK 512
CPU_SIMD static double row_sumexp_k(float *e, const float *z, float m, int v) {
    double total = 0.0;
    for (int j0 = 0; j0 < v; j0 += SUMEXP_BLOCK) {
        int j1 = v - j0 < SUMEXP_BLOCK ? v : j0 + SUMEXP_BLOCK;
        float s = 0.0f;
        if (e) {
#pragma omp simd reduction(+ : s)
            for (int j = j0; j < j1; j++) {
                float t = tetra_expf(z[j] - m);
                e[j] = t;
                s += t;
            }
        } else {
#pragma omp simd reduction(+ : s)
            for (int j = j0; j < j1; j++) s += tetra_expf(z[j] - m);
        }
        total += (double)s;
    }
    return total;
}

CPU_SIMD static void row_scale_k(float *x, float a, int v) {
    for (int j = 0; j < v; j++) x[j] *= a;
}

CPU_SIMD static void row_exp_scale_k(float *d, const float *z, float m, float a, int v) {
    for (int j = 0; j < v; j++) d[j] = tetra_expf(z[j] - m) * a;
}

/* One row of the fused cross-entropy: its loss, and unless d is NULL its dlogits (d may
 * alias z). */
static void ce_row(float *d, float *loss, const float *z, int t, int v, float dloss_scale) {
    int valid = t >= 0 && t < v; // OPS_IGNORE_INDEX (and any out-of-range id): no loss
    if (!d) {
        if (!valid) {
            *loss = 0.0f;
            return;
        }
        float m = row_max_k(z, v);
        float s = (float)row_sumexp_k(NULL, z, m, v);
        *loss = logf(s) - (z[t] - m);
        return;
    }
    if (!valid) {
        memset(d, 0, (size_t)v * sizeof(float));
        *loss = 0.0f;
        return;
    }
    float m = row_max_k(z, v);
    float zt = z[t] - m; // read before d (possibly == z) is overwritten
    float s = (float)row_sumexp_k(d, z, m, v);
    *loss = logf(s) - zt;
    row_scale_k(d, dloss_scale / s, v);
    d[t] -= dloss_scale;
}

void cpu_cross_entropy(float *dlogits, float *losses, const float *logits, const int32_t *targets, int n, int v,
                       float dloss_scale) {
#pragma omp parallel for schedule(dynamic, 4) if (n > 1)
    for (int i = 0; i < n; i++)
        ce_row(dlogits ? dlogits + (size_t)i * v : NULL, losses + i, logits + (size_t)i * v, targets[i], v,
               dloss_scale);
}

/* Each row widened into an fp32 row of its thread, through the fp32 op in place, then
 * rounded: the fp32 op's bits, cast (the row is read whole before any of it is written, so
 * dlogits may alias logits). */
void cpu_cross_entropy_bf16(uint16_t *dlogits, float *losses, const uint16_t *logits, const int32_t *targets, int n,
                            int v, float dloss_scale) {
    int failed = 0;
#pragma omp parallel if (n > 1) reduction(| : failed)
    {
        float *row = malloc((size_t)(v > 0 ? v : 1) * sizeof *row);
        failed |= row == NULL;
#pragma omp for schedule(dynamic, 4)
        for (int i = 0; i < n; i++) {
            if (!row) continue;
            const uint16_t *z = logits + (size_t)i * v;
            for (int j = 0; j < v; j++) row[j] = tetra_bf16_to_f32(z[j]);
            ce_row(row, losses + i, row, targets[i], v, dloss_scale);
            for (int j = 0; j < v; j++) dlogits[(size_t)i * v + j] = tetra_f32_to_bf16(row[j]);
        }
        free(row);
    }
    if (failed) {
        fprintf(stderr, "cpu cross_entropy_bf16: out of host memory for a row of %d\n", v);
        abort();
    }
}

void cpu_ce_shard_max(float *row_max, const float *logits, int n, int v_local) {
#pragma omp parallel for schedule(static) if (row_parallel(n, v_local))
    for (int i = 0; i < n; i++) row_max[i] = row_max_k(logits + (size_t)i * v_local, v_local);
}

void cpu_ce_shard_sums(float *sum_exp, float *target_logit, const float *logits, const float *row_max,
                       const int32_t *targets, int n, int v_local, int v_start) {
#pragma omp parallel for schedule(static) if (row_parallel(n, v_local))
    for (int i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * v_local;
        float m = row_max[i];
        int t = targets[i] - v_start;
        float zt = (t >= 0 && t < v_local) ? z[t] - m : 0.0f; // ignored targets are < 0
        sum_exp[i] = (float)row_sumexp_k(NULL, z, m, v_local);
        target_logit[i] = zt;
    }
}

void cpu_ce_shard_finish(float *dlogits, float *losses, const float *logits, const float *row_max, const float *sum_exp,
                         const float *target_logit, const int32_t *targets, int n, int v_local, int v_start,
                         float dloss_scale) {
#pragma omp parallel for schedule(static) if (row_parallel(n, v_local))
    for (int i = 0; i < n; i++) {
        int valid = targets[i] >= 0; // the sharded ops cannot see V; negatives are ignored
        float s = sum_exp[i];
        losses[i] = valid ? logf(s) - target_logit[i] : 0.0f;
        if (!dlogits) continue;
        float *d = dlogits + (size_t)i * v_local;
        if (!valid) {
            memset(d, 0, (size_t)v_local * sizeof(float));
            continue;
        }
        row_exp_scale_k(d, logits + (size_t)i * v_local, row_max[i], dloss_scale / s, v_local);
        int t = targets[i] - v_start;
        if (t >= 0 && t < v_local) d[t] -= dloss_scale;
    }
}
