// kernels/cpu/cpu_bf16.c — the bf16 activation twins of the CPU backend (ops.h, mixed
// precision). Each op widens its bf16 inputs to fp32 (exact), runs the row or element
// kernel of its fp32 twin on them and rounds each output once to nearest even. Running
// the very same kernel (not a copy of its math) is what makes a bf16 op equal, bit for
// bit, to bf16(fp32 op(widened inputs)); tests/py/test_ops_cpu.py checks exactly that,
// besides the comparison with PyTorch. Widened rows live in small per-thread buffers and
// stay in cache, so the extra passes cost little next to the GEMMs around these ops.
//
// Parameter gradients (embedding, RMSNorm weight) are fp32 and accumulate exactly as in
// the fp32 ops; their reductions keep the twins' orders, so they are deterministic and
// independent of the thread count.
//
// Attention widens q/k/v (and dout/out) into the workspace and runs the fp32 flash
// kernels of cpu_attention.c; their results are rounded once. The backward WRITES dq, dk
// and dv (ops.h): it runs the accumulating fp32 backward on zero-filled fp32 buffers.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops_math.h"

// Same threshold as the fp32 row ops: thread only when the work amortises the fork.
static int row_parallel(int n, int c) { return (int64_t)n * (int64_t)c > CPU_CHUNK && n > 1; }

CPU_SIMD static void widen_k(float *restrict out, const uint16_t *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = tetra_bf16_to_f32(x[i]);
}

CPU_SIMD static void round_k(uint16_t *restrict out, const float *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = tetra_f32_to_bf16(x[i]);
}

// 64-byte aligned fp32 scratch of one call (C heap: a temporary, not a backend buffer,
// so it is neither counted nor blocked by memory_freeze)
static float *scratch(size_t floats) {
    void *p = NULL;
    if (posix_memalign(&p, 64, (floats ? floats : 1) * sizeof(float)) != 0) abort();
    return (float *)p;
}

static size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// ----------------------------------------------------------------------------
// embedding

void cpu_embedding_forward_bf16(uint16_t *out, const int32_t *tokens, const uint16_t *wte, int n, int c, int v_start,
                                int v_local) {
#pragma omp parallel for schedule(static) if (row_parallel(n, c))
    for (int i = 0; i < n; i++) {
        uint16_t *o = out + (size_t)i * c;
        int t = tokens[i] - v_start;
        if (t >= 0 && t < v_local)
            memcpy(o, wte + (size_t)t * c, (size_t)c * sizeof(uint16_t)); // a copy needs no rounding
        else memset(o, 0, (size_t)c * sizeof(uint16_t));                  // token of another vocab shard: +0.0
    }
}

CPU_SIMD static void add_row_bf16_k(float *restrict y, const uint16_t *restrict x, int n) {
    for (int j = 0; j < n; j++) y[j] += tetra_bf16_to_f32(x[j]);
}

// As the fp32 twin: threads own column blocks and walk the tokens in order.
void cpu_embedding_backward_bf16(float *dwte, const uint16_t *dout, const int32_t *tokens, int n, int c, int v_start,
                                 int v_local) {
    const int cb = 64;
    int nblk = (c + cb - 1) / cb;
#pragma omp parallel for schedule(static) if (row_parallel(n, c))
    for (int blk = 0; blk < nblk; blk++) {
        int j0 = blk * cb, w = c - j0 < cb ? c - j0 : cb;
        for (int i = 0; i < n; i++) {
            int t = tokens[i] - v_start;
            if (t < 0 || t >= v_local) continue;
            add_row_bf16_k(dwte + (size_t)t * c + j0, dout + (size_t)i * c + j0, w);
        }
    }
}

// ----------------------------------------------------------------------------
// RMSNorm

void cpu_rmsnorm_forward_bf16(uint16_t *out, float *rstd, float *amax, const uint16_t *x, const uint16_t *w, int n,
                              int c, float eps) {
    float *wf = scratch((size_t)c);
    widen_k(wf, w, (size_t)c);
#pragma omp parallel if (row_parallel(n, c))
    {
        float *xf = scratch(2 * align16((size_t)c)), *of = xf + align16((size_t)c);
#pragma omp for schedule(static)
        for (int i = 0; i < n; i++) {
            size_t o = (size_t)i * c;
            widen_k(xf, x + o, (size_t)c);
            cpu_rmsnorm_row_k(of, rstd + i, xf, wf, c, eps);
            round_k(out + o, of, (size_t)c);
        }
        free(xf);
    }
    free(wf);
    if (amax) cpu_amax_bf16(amax, out, (size_t)(n > 0 ? n : 0) * (size_t)(c > 0 ? c : 0));
}

// dx = bf16(dres + d/dx): the residual gradient is widened, the contribution added in fp32
// by the twin's kernel, and the sum rounded once.
void cpu_rmsnorm_backward_input_bf16(uint16_t *dx, float *amax, const uint16_t *dout, const uint16_t *x,
                                     const uint16_t *w, const float *rstd, int n, int c, const uint16_t *dres) {
    if (!dres) dres = dx;
    float *wf = scratch((size_t)c);
    widen_k(wf, w, (size_t)c);
#pragma omp parallel if (row_parallel(n, c))
    {
        size_t cs = align16((size_t)c);
        float *dxf = scratch(3 * cs), *dyf = dxf + cs, *xf = dyf + cs;
#pragma omp for schedule(static)
        for (int i = 0; i < n; i++) {
            size_t o = (size_t)i * c;
            widen_k(dxf, dres + o, (size_t)c);
            widen_k(dyf, dout + o, (size_t)c);
            widen_k(xf, x + o, (size_t)c);
            cpu_rmsnorm_bwd_row_k(dxf, dyf, xf, wf, rstd[i], c);
            round_k(dx + o, dxf, (size_t)c);
        }
        free(dxf);
    }
    free(wf);
    if (amax) cpu_amax_bf16(amax, dx, (size_t)(n > 0 ? n : 0) * (size_t)(c > 0 ? c : 0));
}

void cpu_rmsnorm_backward_weight_bf16(float *dw, const uint16_t *dout, const uint16_t *x, const float *rstd, int n,
                                      int c, int accumulate) {
    cpu_rmsnorm_dw_blocks(dw, dout, x, rstd, n, c, 1, accumulate);
}

// ----------------------------------------------------------------------------
// RoPE (in place allowed: a row is fully widened before any of it is written)

static void rope_apply_bf16(uint16_t *out, const uint16_t *x, const float *freqs, const int32_t *pos, int pos_offset,
                            int b, int s, int nh, int d, size_t out_ld, size_t x_ld, int inverse) {
    int rows = b * s;
    size_t row = (size_t)nh * d;
#pragma omp parallel if (row_parallel(rows, (int)row))
    {
        float *xf = scratch(2 * align16(row)), *of = xf + align16(row);
#pragma omp for schedule(static)
        for (int r = 0; r < rows; r++) {
            int si = r % s;
            int p = pos ? pos[si] : pos_offset + si;
            widen_k(xf, x + (size_t)r * x_ld, row);
            cpu_rope_row_k(of, xf, freqs + (size_t)p * d, nh, d, inverse);
            round_k(out + (size_t)r * out_ld, of, row);
        }
        free(xf);
    }
}

void cpu_rope_forward_bf16(uint16_t *out, const uint16_t *x, const float *freqs, const int32_t *pos, int pos_offset,
                           int b, int s, int nh, int d, int out_ld, int x_ld) {
    rope_apply_bf16(out, x, freqs, pos, pos_offset, b, s, nh, d, (size_t)out_ld, (size_t)x_ld, 0);
}

void cpu_rope_backward_bf16(uint16_t *dx, float *amax, const uint16_t *dout, const float *freqs, const int32_t *pos,
                            int pos_offset, int b, int s, int nh, int d, int dx_ld, int dout_ld) {
    if (amax && dx_ld != nh * d) {
        fprintf(stderr, "rope_backward_bf16: an amax needs a dx of its own (dx_ld %d, nh*d %d)\n", dx_ld, nh * d);
        abort();
    }
    rope_apply_bf16(dx, dout, freqs, pos, pos_offset, b, s, nh, d, (size_t)dx_ld, (size_t)dout_ld, 1);
    if (amax) {
        const size_t n = b > 0 && s > 0 && nh > 0 && d > 0 ? (size_t)b * (size_t)s * (size_t)nh * (size_t)d : 0;
        cpu_amax_bf16(amax, dx, n);
    }
}

// ----------------------------------------------------------------------------
// SwiGLU: CPU_CHUNK pieces per thread as the twin, each walked in sub-blocks small
// enough for stack buffers (the math is elementwise, so the blocking changes nothing).

#define SUB 512

void cpu_swiglu_forward_bf16(uint16_t *out, float *amax, const uint16_t *a, const uint16_t *g, size_t n) {
    int64_t nc = ((int64_t)n + CPU_CHUNK - 1) / CPU_CHUNK;
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) {
        size_t lo = (size_t)(c * CPU_CHUNK), hi = lo + (size_t)CPU_CHUNK < n ? lo + (size_t)CPU_CHUNK : n;
        float af[SUB], gf[SUB], of[SUB];
        for (size_t i = lo; i < hi; i += SUB) {
            size_t m = hi - i < SUB ? hi - i : SUB;
            widen_k(af, a + i, m);
            widen_k(gf, g + i, m);
            cpu_swiglu_fwd_k(of, af, gf, m);
            round_k(out + i, of, m);
        }
    }
    if (amax) cpu_amax_bf16(amax, out, n); // the CPU reads its cache again; the GPU fuses it
}

// da may alias a and dg may alias g: each sub-block is read in full before it is written.
void cpu_swiglu_backward_bf16(uint16_t *da, uint16_t *dg, float *amax_da, float *amax_dg, const uint16_t *dout,
                              const uint16_t *a, const uint16_t *g, size_t n) {
    int64_t nc = ((int64_t)n + CPU_CHUNK - 1) / CPU_CHUNK;
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) {
        size_t lo = (size_t)(c * CPU_CHUNK), hi = lo + (size_t)CPU_CHUNK < n ? lo + (size_t)CPU_CHUNK : n;
        float af[SUB], gf[SUB], df[SUB], daf[SUB], dgf[SUB];
        for (size_t i = lo; i < hi; i += SUB) {
            size_t m = hi - i < SUB ? hi - i : SUB;
            widen_k(af, a + i, m);
            widen_k(gf, g + i, m);
            widen_k(df, dout + i, m);
            cpu_swiglu_bwd_k(daf, dgf, df, af, gf, m);
            round_k(da + i, daf, m);
            round_k(dg + i, dgf, m);
        }
    }
    if (amax_da) cpu_amax_bf16(amax_da, da, n);
    if (amax_dg) cpu_amax_bf16(amax_dg, dg, n);
}

// ----------------------------------------------------------------------------
// attention

// Workspace layout, in fp32 buffers of 64-byte aligned length:
//   q32, dout32, out32, dq32 [B, Sq, H, D] ; k32, v32, dk32, dv32 [B, Sk, KV, D] ;
//   then the fp32 backward's own workspace (rowsum(dout * out), [B, H, Sq]).
// The forward uses q32, out32, k32 and v32 only. Linear in the sequence, never S^2.
typedef struct {
    float *q, *dout, *out, *dq, *k, *v, *dk, *dv;
    void *ws32;
} attn_bufs;

static size_t attn_nq(const ops_attn_shape *s) { return (size_t)s->b * s->sq * s->h * s->d; }
static size_t attn_nk(const ops_attn_shape *s) { return (size_t)s->b * s->sk * s->kv * s->d; }

size_t cpu_attention_workspace_size_bf16(const ops_attn_shape *s) {
    size_t floats = 4 * align16(attn_nq(s)) + 4 * align16(attn_nk(s));
    return floats * sizeof(float) + cpu_attention_workspace_size(s) + 64;
}

static attn_bufs attn_carve(void *ws, const ops_attn_shape *s) {
    // the caller's workspace may be any address: start on the next 64-byte boundary
    // (the size above reserves the slack)
    float *p = (float *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    size_t nq = align16(attn_nq(s)), nk = align16(attn_nk(s));
    attn_bufs b;
    b.q = p, p += nq;
    b.dout = p, p += nq;
    b.out = p, p += nq;
    b.dq = p, p += nq;
    b.k = p, p += nk;
    b.v = p, p += nk;
    b.dk = p, p += nk;
    b.dv = p, p += nk;
    b.ws32 = p;
    return b;
}

// No query row of the call sees any key (a masked ring-attention pair, or empty blocks).
static int attn_all_masked(const ops_attn_shape *s) {
    if (s->sq <= 0 || s->sk <= 0) return 1;
    return s->causal && (long long)s->q_offset + s->sq - 1 < (long long)s->k_offset;
}

void cpu_attention_forward_bf16(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                const ops_attn_shape *s, void *workspace) {
    size_t nq = attn_nq(s), nk = attn_nk(s), nl = (size_t)s->b * s->h * (s->sq > 0 ? s->sq : 0);
    if (attn_all_masked(s)) { // out = 0, lse = -inf: no contribution when merged
        if (nq) memset(out, 0, nq * sizeof(uint16_t));
        for (size_t i = 0; i < nl; i++) lse[i] = -INFINITY;
        return;
    }
    void *owned = NULL;
    if (!workspace) {
        owned = malloc(cpu_attention_workspace_size_bf16(s));
        if (!owned) abort();
        workspace = owned;
    }
    attn_bufs w = attn_carve(workspace, s);
    cpu_cast_bf16_to_f32(w.q, q, nq);
    cpu_cast_bf16_to_f32(w.k, k, nk);
    cpu_cast_bf16_to_f32(w.v, v, nk);
    cpu_attention_forward(w.out, lse, w.q, w.k, w.v, s, w.ws32);
    cpu_cast_f32_to_bf16(out, w.out, nq);
    free(owned);
}

void cpu_attention_backward_bf16(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout, const uint16_t *q,
                                 const uint16_t *k, const uint16_t *v, const uint16_t *out, const float *lse,
                                 const ops_attn_shape *s, void *workspace) {
    size_t nq = attn_nq(s), nk = attn_nk(s);
    if (attn_all_masked(s)) { // written, not accumulated: zeros
        if (nq) memset(dq, 0, nq * sizeof(uint16_t));
        if (nk) memset(dk, 0, nk * sizeof(uint16_t));
        if (nk) memset(dv, 0, nk * sizeof(uint16_t));
        return;
    }
    void *owned = NULL;
    if (!workspace) {
        owned = malloc(cpu_attention_workspace_size_bf16(s));
        if (!owned) abort();
        workspace = owned;
    }
    attn_bufs w = attn_carve(workspace, s);
    cpu_cast_bf16_to_f32(w.q, q, nq);
    cpu_cast_bf16_to_f32(w.dout, dout, nq);
    cpu_cast_bf16_to_f32(w.out, out, nq);
    cpu_cast_bf16_to_f32(w.k, k, nk);
    cpu_cast_bf16_to_f32(w.v, v, nk);
    // the fp32 backward accumulates: start it from zero so the result is the gradient itself
    cpu_fill(w.dq, 0.0f, nq);
    cpu_fill(w.dk, 0.0f, nk);
    cpu_fill(w.dv, 0.0f, nk);
    cpu_attention_backward(w.dq, w.dk, w.dv, w.dout, w.q, w.k, w.v, w.out, lse, s, w.ws32);
    cpu_cast_f32_to_bf16(dq, w.dq, nq);
    cpu_cast_f32_to_bf16(dk, w.dk, nk);
    cpu_cast_f32_to_bf16(dv, w.dv, nk);
    free(owned);
}
