// kernels/cuda/cuda_attention.cu — causal (or full) attention with grouped-query heads,
// forward and backward, in the FlashAttention-2 manner with fp32 arithmetic: score tiles live in
// shared memory and registers only, the softmax is online, the forward saves only the
// log-sum-exp per query row, and the backward recomputes each probability tile from it.
// Nothing of size S x S ever reaches device memory.
//
// Layouts (ops.h): q/out/dq [B, Sq, H, D], k/v/dk/dv [B, Sk, KV, D], lse [B, H, Sq]. Heads
// are read in place through their row stride (H*D or KV*D floats); GQA reads the shared
// key/value head g = h / (H/KV) directly, never expanding K/V. Query row i has global
// position q_offset + i, key j has k_offset + j; under `causal`, key j is visible to
// query i iff k_offset + j <= q_offset + i. A row that sees no key gets out = 0 and
// lse = -inf (ring attention's "no contribution"), exactly as the CPU backend. Under a
// document mask (ops_attn_shape.doc, device memory) key j is visible only where the ids of
// the two global positions are equal too; a query tile starts at the key tile its first
// row's document starts in, and a key tile's backward stops at the last query of its
// last key's document (kernels/ops_docmask.h), so tiles across documents are skipped.
//
// Kernels (256 threads as a 16 x 16 grid; a thread owns rows ty + 16 i and columns
// tx + 16 j of each tile, so shared-memory reads are conflict-free broadcasts):
// - forward: one block per (batch, head, query tile of BQ rows), heaviest tiles first;
//   loops over the visible key tiles of BK keys: S = scale Q K^T, online max/sum per
//   row (one warp per row), O = O * corr + P V in registers.
// - backward, deterministic and free of atomics (the CPU backend's "split" schedule):
//   (1) Dv = rowsum(dO * O) into the workspace [B, H, Sq];
//   (2) one block per (batch, kv head, key tile) owns its rows of dK and dV: it walks
//       every query head of its group and every query tile that sees the key tile,
//       recomputing P = exp(S - lse) and dS = P (dP - Dv), and accumulates
//       dV += P^T dO, dK += scale dS^T Q in registers;
//   (3) one block per (batch, head, query tile) owns its rows of dQ and accumulates
//       dQ += scale dS K over the visible key tiles.
//   dq, dk, dv are added to (+=), so ring attention calls it once per key block.
// Per-element math (exp) is ops_math.h's, as on the CPU. Head dims up to 256 (kernels
// are instantiated for 16, 32, 64, 128 and 256 and zero-pad the rest).
//
// The kernels are templates on the storage type of q/k/v/out/dout and the gradients:
// float for the fp32 ops, bf16 (uint16_t) for the built-in path of the *_bf16 ops. Tiles
// are widened to fp32 in shared memory, so both compute the same fp32 arithmetic; bf16
// outputs are rounded once, and bf16 gradients are WRITTEN (ops.h), each block owning
// its rows. The bf16 ops prefer cuDNN's fused SDPA (kernels/cuda/cuda_cudnn.cu); where it
// does not apply they use the tensor-core kernels of cuda_attention_tc.cu up to head dim
// 128, and these above (see the bf16 section at the end).
// kernels/op_costs.c describes each call (opc_attention_*: which path, its launches and
// bytes) for `tetra plan --ops`; the simulator checks the launches: change both together.
#include "kernels/ops_shapes.h"
#include "kernels/cuda/cuda_attention_args.cuh"
#include "kernels/cuda/cuda_attention_tc.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_cudnn.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops_math.h"
#include "kernels/ops_paths.h"

#include <type_traits>

#define ATT_THREADS 256

// Load `rows` rows of D floats (row stride ld) into a [BR][LD] tile, zero-padding rows
// >= rows and columns >= D.
template <int BR, int DMAX, int LD, typename T>
__device__ __forceinline__ void load_tile(float *dst, const T *src, size_t ld, int rows, int D) {
    for (int idx = threadIdx.x; idx < BR * DMAX; idx += ATT_THREADS) {
        int r = idx / DMAX, dd = idx - r * DMAX;
        dst[r * LD + dd] = (r < rows && dd < D) ? to_f32(src[(size_t)r * ld + dd]) : 0.0f;
    }
}

// Gradient stores: fp32 gradients accumulate (+=; ring attention adds key blocks in
// place), bf16 gradients are written, rounded once (ops.h attention_backward_bf16).
__device__ __forceinline__ void grad_out(float *p, float v) { *p += v; }
__device__ __forceinline__ void grad_out(uint16_t *p, float v) { *p = tetra_f32_to_bf16(v); }

// ----------------------------------------------------------------------------
// forward

template <int DMAX, int BQ, int BK> struct FwdCfg {
    static constexpr int LD = DMAX + 1, LDP = BK + 1;
    static constexpr size_t smem_floats =
        (size_t)BQ * LD + (size_t)BK * LD + (size_t)BK * DMAX + (size_t)BQ * LDP + 3 * BQ;
};

template <int DMAX, int BQ, int BK, typename T>
__device__ __forceinline__ void attn_fwd_body(T *out, float *lse, const T *q, const T *k, const T *v, attn_args a,
                                              int nqb) {
    typedef FwdCfg<DMAX, BQ, BK> Cfg;
    constexpr int LD = Cfg::LD, LDP = Cfg::LDP, RI = BQ / 16, RJ = BK / 16, DJ = DMAX / 16, PER = BK / 32;
    static_assert(BQ % 16 == 0 && BK % 32 == 0 && DMAX % 16 == 0, "tile shapes");
    extern __shared__ float sm[];
    float *sQ = sm;
    float *sK = sQ + BQ * LD;
    float *sV = sK + BK * LD; // [BK][DMAX]
    float *sP = sV + BK * DMAX;
    float *sM = sP + BQ * LDP;
    float *sL = sM + BQ;
    float *sC = sL + BQ;

    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4, warp = tid >> 5, lane = tid & 31;
    const int nbh = a.B * a.H;
    const int qb = nqb - 1 - (int)(blockIdx.x / nbh); // heaviest (latest) query tiles first
    const int bh = (int)(blockIdx.x % nbh), b = bh / a.H, h = bh % a.H, g = h / a.rep;
    const int i0 = qb * BQ, rows = min(BQ, a.Sq - i0);
    const int D = a.D;
    const size_t ldq = (size_t)a.H * D, ldk = (size_t)a.KV * D;

    load_tile<BQ, DMAX, LD, T>(sQ, q + ((size_t)b * a.Sq + i0) * ldq + (size_t)h * D, ldq, rows, D);
    if (tid < BQ) {
        sM[tid] = -INFINITY;
        sL[tid] = 0.0f;
    }
    float o[RI][DJ];
#pragma unroll
    for (int i = 0; i < RI; i++)
#pragma unroll
        for (int j = 0; j < DJ; j++) o[i][j] = 0.0f;

    const int kend = visible_keys(a, i0 + rows - 1); // keys any row of this tile sees
    // from the key tile where the first row's document starts (the BK grid of the backward)
    for (int j0 = doc_key_begin(a, b, i0) / BK * BK; j0 < kend; j0 += BK) {
        const int cols = min(BK, kend - j0);
        __syncthreads(); // the previous tile is consumed
        const size_t koff = ((size_t)b * a.Sk + j0) * ldk + (size_t)g * D;
        for (int idx = tid; idx < BK * DMAX; idx += ATT_THREADS) {
            int c = idx / DMAX, dd = idx - c * DMAX;
            bool in = c < cols && dd < D;
            sK[c * LD + dd] = in ? to_f32(k[koff + (size_t)c * ldk + dd]) : 0.0f;
            sV[c * DMAX + dd] = in ? to_f32(v[koff + (size_t)c * ldk + dd]) : 0.0f;
        }
        __syncthreads();

        // S = scale Q K^T, masked to -inf
        float s[RI][RJ];
#pragma unroll
        for (int i = 0; i < RI; i++)
#pragma unroll
            for (int jj = 0; jj < RJ; jj++) s[i][jj] = 0.0f;
        for (int kk = 0; kk < D; kk++) {
            float qv[RI], kv[RJ];
#pragma unroll
            for (int i = 0; i < RI; i++) qv[i] = sQ[(ty + 16 * i) * LD + kk];
#pragma unroll
            for (int jj = 0; jj < RJ; jj++) kv[jj] = sK[(tx + 16 * jj) * LD + kk];
#pragma unroll
            for (int i = 0; i < RI; i++)
#pragma unroll
                for (int jj = 0; jj < RJ; jj++) s[i][jj] = fmaf(qv[i], kv[jj], s[i][jj]);
        }
#pragma unroll
        for (int i = 0; i < RI; i++) {
#pragma unroll
            for (int jj = 0; jj < RJ; jj++) {
                int r = ty + 16 * i, c = tx + 16 * jj;
                bool vis = r < rows && c < cols && key_visible(a, b, i0 + r, j0 + c);
                sP[r * LDP + c] = vis ? a.scale * s[i][jj] : -INFINITY;
            }
        }
        __syncthreads();

        // online softmax, one warp per row
        for (int r = warp; r < BQ; r += ATT_THREADS / 32) {
            float val[PER], mx = -INFINITY;
#pragma unroll
            for (int u = 0; u < PER; u++) {
                val[u] = sP[r * LDP + lane + 32 * u];
                mx = fmaxf(mx, val[u]);
            }
            mx = warp_max(mx);
            const float m_old = sM[r], m_new = fmaxf(m_old, mx);
            if (m_new == -INFINITY) { // nothing visible to this row yet
#pragma unroll
                for (int u = 0; u < PER; u++) sP[r * LDP + lane + 32 * u] = 0.0f;
                if (lane == 0) sC[r] = 1.0f;
                continue;
            }
            float sum = 0.0f;
#pragma unroll
            for (int u = 0; u < PER; u++) {
                float p = val[u] == -INFINITY ? 0.0f : tetra_expf(val[u] - m_new);
                sP[r * LDP + lane + 32 * u] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                float corr = m_old == -INFINITY ? 0.0f : tetra_expf(m_old - m_new);
                sL[r] = sL[r] * corr + sum;
                sM[r] = m_new;
                sC[r] = corr;
            }
        }
        __syncthreads();

        // O = O corr + P V
#pragma unroll
        for (int i = 0; i < RI; i++) {
            float corr = sC[ty + 16 * i];
#pragma unroll
            for (int j = 0; j < DJ; j++) o[i][j] *= corr;
        }
        for (int c = 0; c < cols; c++) {
            float vv[DJ];
#pragma unroll
            for (int j = 0; j < DJ; j++) vv[j] = sV[c * DMAX + tx + 16 * j];
#pragma unroll
            for (int i = 0; i < RI; i++) {
                float p = sP[(ty + 16 * i) * LDP + c];
#pragma unroll
                for (int j = 0; j < DJ; j++) o[i][j] = fmaf(p, vv[j], o[i][j]);
            }
        }
    }
    __syncthreads();

#pragma unroll
    for (int i = 0; i < RI; i++) {
        int r = ty + 16 * i;
        if (r >= rows) continue;
        float l = sL[r];
        float inv = l == 0.0f ? 0.0f : 1.0f / l;
        T *orow = out + ((size_t)b * a.Sq + i0 + r) * ldq + (size_t)h * D;
#pragma unroll
        for (int j = 0; j < DJ; j++) {
            int dd = tx + 16 * j;
            if (dd < D) store_f32(orow + dd, l == 0.0f ? 0.0f : o[i][j] * inv);
        }
        if (tx == 0) lse[((size_t)b * a.H + h) * a.Sq + i0 + r] = l == 0.0f ? -INFINITY : sM[r] + logf(l);
    }
}

// ----------------------------------------------------------------------------
// backward

// Dv[b, h, i] = sum_d dout * out: one warp per (b, i, h) row
template <typename T>
__global__ void attn_rowdot_kernel(float *Dv, const T *dout, const T *out, int Sq, int H, int D, long long nrows) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < nrows; r += warps) {
        const T *a = dout + (size_t)r * D, *o = out + (size_t)r * D;
        float acc = 0.0f;
        for (int j = lane; j < D; j += 32) acc = fmaf(to_f32(a[j]), to_f32(o[j]), acc);
        acc = warp_sum(acc);
        if (lane == 0) {
            int h = (int)(r % H);
            long long bi = r / H;
            int i = (int)(bi % Sq), b = (int)(bi / Sq);
            Dv[((size_t)b * H + h) * Sq + i] = acc;
        }
    }
}

template <int DMAX, int BQ, int BK> struct BwdCfg {
    static constexpr int LD = DMAX + 1, LDP = BK + 1;
    // sK, sV, sQ, sdO; sP, sdS; lse, Dv
    static constexpr size_t smem_floats = 2 * (size_t)BK * LD + 2 * (size_t)BQ * LD + 2 * (size_t)BQ * LDP + 2 * BQ;
};

// One (query tile, key tile) pair: recompute P and dS into sP / sdS ([BQ][LDP]).
// Thread (ty, tx) computes rows ty + 16 i and columns tx + 16 jj.
template <int DMAX, int BQ, int BK>
__device__ __forceinline__ void bwd_scores(float *sP, float *sdS, const float *sQ, const float *sdO, const float *sK,
                                           const float *sV, const float *sLse, const float *sDv, const attn_args &a,
                                           int b, int i0, int rows, int j0, int cols) {
    constexpr int LD = DMAX + 1, LDP = BK + 1, RI = BQ / 16, RJ = BK / 16;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float s[RI][RJ], dp[RI][RJ];
#pragma unroll
    for (int i = 0; i < RI; i++)
#pragma unroll
        for (int jj = 0; jj < RJ; jj++) s[i][jj] = dp[i][jj] = 0.0f;
    for (int kk = 0; kk < a.D; kk++) {
        float qv[RI], dov[RI], kv[RJ], vv[RJ];
#pragma unroll
        for (int i = 0; i < RI; i++) {
            qv[i] = sQ[(ty + 16 * i) * LD + kk];
            dov[i] = sdO[(ty + 16 * i) * LD + kk];
        }
#pragma unroll
        for (int jj = 0; jj < RJ; jj++) {
            kv[jj] = sK[(tx + 16 * jj) * LD + kk];
            vv[jj] = sV[(tx + 16 * jj) * LD + kk];
        }
#pragma unroll
        for (int i = 0; i < RI; i++)
#pragma unroll
            for (int jj = 0; jj < RJ; jj++) {
                s[i][jj] = fmaf(qv[i], kv[jj], s[i][jj]);
                dp[i][jj] = fmaf(dov[i], vv[jj], dp[i][jj]);
            }
    }
#pragma unroll
    for (int i = 0; i < RI; i++) {
        const int r = ty + 16 * i;
        const float L = sLse[r], Dr = sDv[r];
#pragma unroll
        for (int jj = 0; jj < RJ; jj++) {
            const int c = tx + 16 * jj;
            bool vis = r < rows && c < cols && L != -INFINITY && key_visible(a, b, i0 + r, j0 + c);
            float p = vis ? tetra_expf(a.scale * s[i][jj] - L) : 0.0f;
            sP[r * LDP + c] = p;
            sdS[r * LDP + c] = p * (dp[i][jj] - Dr);
        }
    }
}

template <int DMAX, int BQ, int BK, typename T>
__device__ __forceinline__ void attn_bwd_dkdv_body(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v,
                                                   const float *lse, const float *Dv, attn_args a) {
    constexpr int LD = DMAX + 1, LDP = BK + 1, RK = BK / 16, DJ = DMAX / 16;
    extern __shared__ float sm[];
    float *sK = sm;
    float *sV = sK + BK * LD;
    float *sQ = sV + BK * LD;
    float *sdO = sQ + BQ * LD;
    float *sP = sdO + BQ * LD;
    float *sdS = sP + BQ * LDP;
    float *sLse = sdS + BQ * LDP;
    float *sDv = sLse + BQ;

    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int nbg = a.B * a.KV;
    const int kb = (int)(blockIdx.x / nbg); // earliest key tiles (seen by most queries) first
    const int bg = (int)(blockIdx.x % nbg), b = bg / a.KV, g = bg % a.KV;
    const int j0 = kb * BK, cols = min(BK, a.Sk - j0);
    const int D = a.D;
    const size_t ldq = (size_t)a.H * D, ldk = (size_t)a.KV * D;
    const size_t koff = ((size_t)b * a.Sk + j0) * ldk + (size_t)g * D;

    load_tile<BK, DMAX, LD, T>(sK, k + koff, ldk, cols, D);
    load_tile<BK, DMAX, LD, T>(sV, v + koff, ldk, cols, D);
    float dkacc[RK][DJ], dvacc[RK][DJ];
#pragma unroll
    for (int i = 0; i < RK; i++)
#pragma unroll
        for (int j = 0; j < DJ; j++) dkacc[i][j] = dvacc[i][j] = 0.0f;

    // queries from the first that sees key j0 to the last of the tile's last key's document
    const int qstart = first_query(a, j0), qend = cols > 0 ? doc_query_end(a, b, j0 + cols - 1) : 0;
    for (int hh = 0; hh < a.rep; hh++) {
        const int h = g * a.rep + hh;
        for (int i0 = qstart; i0 < qend; i0 += BQ) {
            const int rows = min(BQ, a.Sq - i0);
            __syncthreads();
            const size_t qoff = ((size_t)b * a.Sq + i0) * ldq + (size_t)h * D;
            load_tile<BQ, DMAX, LD, T>(sQ, q + qoff, ldq, rows, D);
            load_tile<BQ, DMAX, LD, T>(sdO, dout + qoff, ldq, rows, D);
            if (tid < BQ) {
                size_t li = ((size_t)b * a.H + h) * a.Sq + i0 + tid;
                sLse[tid] = tid < rows ? lse[li] : -INFINITY;
                sDv[tid] = tid < rows ? Dv[li] : 0.0f;
            }
            __syncthreads();
            bwd_scores<DMAX, BQ, BK>(sP, sdS, sQ, sdO, sK, sV, sLse, sDv, a, b, i0, rows, j0, cols);
            __syncthreads();
            // dV += P^T dO ; dK += dS^T Q (scale applied at the end)
            for (int r = 0; r < rows; r++) {
                float dov[DJ], qv[DJ];
#pragma unroll
                for (int j = 0; j < DJ; j++) {
                    dov[j] = sdO[r * LD + tx + 16 * j];
                    qv[j] = sQ[r * LD + tx + 16 * j];
                }
#pragma unroll
                for (int i = 0; i < RK; i++) {
                    float p = sP[r * LDP + ty + 16 * i], ds = sdS[r * LDP + ty + 16 * i];
#pragma unroll
                    for (int j = 0; j < DJ; j++) {
                        dvacc[i][j] = fmaf(p, dov[j], dvacc[i][j]);
                        dkacc[i][j] = fmaf(ds, qv[j], dkacc[i][j]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RK; i++) {
        int c = ty + 16 * i;
        if (c >= cols) continue;
        T *dkrow = dk + koff + (size_t)c * ldk, *dvrow = dv + koff + (size_t)c * ldk;
#pragma unroll
        for (int j = 0; j < DJ; j++) {
            int dd = tx + 16 * j;
            if (dd < D) {
                grad_out(dkrow + dd, a.scale * dkacc[i][j]);
                grad_out(dvrow + dd, dvacc[i][j]);
            }
        }
    }
}

template <int DMAX, int BQ, int BK, typename T>
__device__ __forceinline__ void attn_bwd_dq_body(T *dq, const T *dout, const T *q, const T *k, const T *v,
                                                 const float *lse, const float *Dv, attn_args a, int nqb) {
    constexpr int LD = DMAX + 1, LDP = BK + 1, RI = BQ / 16, DJ = DMAX / 16;
    extern __shared__ float sm[];
    float *sK = sm;
    float *sV = sK + BK * LD;
    float *sQ = sV + BK * LD;
    float *sdO = sQ + BQ * LD;
    float *sP = sdO + BQ * LD;
    float *sdS = sP + BQ * LDP;
    float *sLse = sdS + BQ * LDP;
    float *sDv = sLse + BQ;

    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int nbh = a.B * a.H;
    const int qb = nqb - 1 - (int)(blockIdx.x / nbh);
    const int bh = (int)(blockIdx.x % nbh), b = bh / a.H, h = bh % a.H, g = h / a.rep;
    const int i0 = qb * BQ, rows = min(BQ, a.Sq - i0);
    const int D = a.D;
    const size_t ldq = (size_t)a.H * D, ldk = (size_t)a.KV * D;
    const size_t qoff = ((size_t)b * a.Sq + i0) * ldq + (size_t)h * D;

    load_tile<BQ, DMAX, LD, T>(sQ, q + qoff, ldq, rows, D);
    load_tile<BQ, DMAX, LD, T>(sdO, dout + qoff, ldq, rows, D);
    if (tid < BQ) {
        size_t li = ((size_t)b * a.H + h) * a.Sq + i0 + tid;
        sLse[tid] = tid < rows ? lse[li] : -INFINITY;
        sDv[tid] = tid < rows ? Dv[li] : 0.0f;
    }
    float dqacc[RI][DJ];
#pragma unroll
    for (int i = 0; i < RI; i++)
#pragma unroll
        for (int j = 0; j < DJ; j++) dqacc[i][j] = 0.0f;

    const int kend = visible_keys(a, i0 + rows - 1);
    for (int j0 = doc_key_begin(a, b, i0) / BK * BK; j0 < kend; j0 += BK) {
        const int cols = min(BK, kend - j0);
        __syncthreads();
        const size_t koff = ((size_t)b * a.Sk + j0) * ldk + (size_t)g * D;
        load_tile<BK, DMAX, LD, T>(sK, k + koff, ldk, cols, D);
        load_tile<BK, DMAX, LD, T>(sV, v + koff, ldk, cols, D);
        __syncthreads();
        bwd_scores<DMAX, BQ, BK>(sP, sdS, sQ, sdO, sK, sV, sLse, sDv, a, b, i0, rows, j0, cols);
        __syncthreads();
        // dQ += dS K (scale applied at the end)
        for (int c = 0; c < cols; c++) {
            float kv[DJ];
#pragma unroll
            for (int j = 0; j < DJ; j++) kv[j] = sK[c * LD + tx + 16 * j];
#pragma unroll
            for (int i = 0; i < RI; i++) {
                float ds = sdS[(ty + 16 * i) * LDP + c];
#pragma unroll
                for (int j = 0; j < DJ; j++) dqacc[i][j] = fmaf(ds, kv[j], dqacc[i][j]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RI; i++) {
        int r = ty + 16 * i;
        if (r >= rows) continue;
        T *dqrow = dq + qoff + (size_t)r * ldq;
#pragma unroll
        for (int j = 0; j < DJ; j++) {
            int dd = tx + 16 * j;
            if (dd < D) grad_out(dqrow + dd, a.scale * dqacc[i][j]);
        }
    }
}

// ----------------------------------------------------------------------------
// kernels: the bodies above as fp32 and bf16 entry points. The fp32 kernels keep ptxas's
// own register budget. The bf16 ones name the occupancy their shared memory allows on
// sm_80 (164 KiB per SM) as __launch_bounds__'s minimum blocks, so ptxas budgets
// registers for it (left to guess, it spilled a few bytes in some bf16 variants).

template <int DMAX> struct AttnOcc {
    static constexpr int fwd = DMAX <= 32 ? 4 : (DMAX <= 64 ? 3 : 2);
    static constexpr int bwd = DMAX <= 64 ? 3 : (DMAX <= 128 ? 2 : 1);
};

template <int DMAX, int BQ, int BK>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_fwd_kernel(float *out, float *lse, const float *q, const float *k, const float *v, attn_args a, int nqb) {
    attn_fwd_body<DMAX, BQ, BK, float>(out, lse, q, k, v, a, nqb);
}

template <int DMAX, int BQ, int BK>
__global__ void __launch_bounds__(ATT_THREADS, AttnOcc<DMAX>::fwd)
    attn_fwd_kernel_bf16(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                         attn_args a, int nqb) {
    attn_fwd_body<DMAX, BQ, BK, uint16_t>(out, lse, q, k, v, a, nqb);
}

template <int DMAX, int BQ, int BK>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_bwd_dkdv_kernel(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
                         const float *lse, const float *Dv, attn_args a) {
    attn_bwd_dkdv_body<DMAX, BQ, BK, float>(dk, dv, dout, q, k, v, lse, Dv, a);
}

template <int DMAX, int BQ, int BK>
__global__ void __launch_bounds__(ATT_THREADS, AttnOcc<DMAX>::bwd)
    attn_bwd_dkdv_kernel_bf16(uint16_t *dk, uint16_t *dv, const uint16_t *dout, const uint16_t *q, const uint16_t *k,
                              const uint16_t *v, const float *lse, const float *Dv, attn_args a) {
    attn_bwd_dkdv_body<DMAX, BQ, BK, uint16_t>(dk, dv, dout, q, k, v, lse, Dv, a);
}

template <int DMAX, int BQ, int BK>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_bwd_dq_kernel(float *dq, const float *dout, const float *q, const float *k, const float *v, const float *lse,
                       const float *Dv, attn_args a, int nqb) {
    attn_bwd_dq_body<DMAX, BQ, BK, float>(dq, dout, q, k, v, lse, Dv, a, nqb);
}

template <int DMAX, int BQ, int BK>
__global__ void __launch_bounds__(ATT_THREADS, AttnOcc<DMAX>::bwd)
    attn_bwd_dq_kernel_bf16(uint16_t *dq, const uint16_t *dout, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                            const float *lse, const float *Dv, attn_args a, int nqb) {
    attn_bwd_dq_body<DMAX, BQ, BK, uint16_t>(dq, dout, q, k, v, lse, Dv, a, nqb);
}

// ----------------------------------------------------------------------------
// launchers (T: float for the fp32 ops, uint16_t for bf16)

// Sets the kernel's dynamic shared memory limit on its first launch, then launches it.
template <typename K, typename... Args>
static void launch_attn(K kernel, bool &configured, size_t smem, long long blocks, Args... args) {
    attn_configure(kernel, configured, smem);
    kernel<<<(unsigned)blocks, ATT_THREADS, smem, cuda_stream()>>>(args...);
    CUDA_CHECK_LAUNCH();
}

template <int DMAX, int BQ, int BK, typename T>
static void launch_fwd(T *out, float *lse, const T *q, const T *k, const T *v, const attn_args &a) {
    static bool configured = false;
    const size_t smem = FwdCfg<DMAX, BQ, BK>::smem_floats * sizeof(float);
    const int nqb = (a.Sq + BQ - 1) / BQ;
    const long long blocks = (long long)nqb * a.B * a.H;
    if constexpr (std::is_same<T, float>::value)
        launch_attn(attn_fwd_kernel<DMAX, BQ, BK>, configured, smem, blocks, out, lse, q, k, v, a, nqb);
    else launch_attn(attn_fwd_kernel_bf16<DMAX, BQ, BK>, configured, smem, blocks, out, lse, q, k, v, a, nqb);
}

template <int DMAX, int BQ, int BK, typename T>
static void launch_bwd(T *dq, T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, const float *lse,
                       const float *Dv, const attn_args &a) {
    static bool configured_kv = false, configured_q = false;
    const size_t smem = BwdCfg<DMAX, BQ, BK>::smem_floats * sizeof(float);
    const int nkb = (a.Sk + BK - 1) / BK, nqb = (a.Sq + BQ - 1) / BQ;
    const long long blocks_kv = (long long)nkb * a.B * a.KV, blocks_q = (long long)nqb * a.B * a.H;
    if constexpr (std::is_same<T, float>::value) {
        launch_attn(attn_bwd_dkdv_kernel<DMAX, BQ, BK>, configured_kv, smem, blocks_kv, dk, dv, dout, q, k, v, lse, Dv,
                    a);
        launch_attn(attn_bwd_dq_kernel<DMAX, BQ, BK>, configured_q, smem, blocks_q, dq, dout, q, k, v, lse, Dv, a, nqb);
    } else {
        launch_attn(attn_bwd_dkdv_kernel_bf16<DMAX, BQ, BK>, configured_kv, smem, blocks_kv, dk, dv, dout, q, k, v, lse,
                    Dv, a);
        launch_attn(attn_bwd_dq_kernel_bf16<DMAX, BQ, BK>, configured_q, smem, blocks_q, dq, dout, q, k, v, lse, Dv, a,
                    nqb);
    }
}

static void check_shape(const ops_attn_shape *s) {
    if (s->d > 256 || s->d <= 0 || s->kv <= 0 || s->h % s->kv != 0) {
        fprintf(stderr,
                "[tetra] cuda attention: unsupported shape (head dim %d, heads %d, kv heads %d); "
                "head dim must be in [1, 256] and heads a multiple of kv heads\n",
                s->d, s->h, s->kv);
        abort();
    }
    if (s->doc && (!s->causal || s->q_offset + s->sq > s->doc_len || s->k_offset + s->sk > s->doc_len)) {
        fprintf(stderr,
                "[tetra] cuda attention: a document mask needs causal = 1 and the rows inside doc_len "
                "(causal %d, q %d+%d, k %d+%d, doc_len %d)\n",
                s->causal, s->q_offset, s->sq, s->k_offset, s->sk, s->doc_len);
        abort();
    }
}

extern "C" size_t cuda_attention_workspace_size(const ops_attn_shape *s) {
    // the backward's row term Dv (kernels/ops_shapes.h, which planning shares)
    return ops_shape_cuda_attention_workspace(s);
}

// The built-in forward: out (T) and lse; rows that see no key get out = 0, lse = -inf.
template <typename T>
static void builtin_forward(T *out, float *lse, const T *q, const T *k, const T *v, const ops_attn_shape *s) {
    check_shape(s);
    attn_args a = make_args(s);
    if constexpr (std::is_same<T, uint16_t>::value) {
        if (ops_path_attention_tc(s)) {
            cuda_attention_tc_forward(out, lse, q, k, v, a);
            return;
        }
    }
    if (s->d <= 16) launch_fwd<16, 64, 32, T>(out, lse, q, k, v, a);
    else if (s->d <= 32) launch_fwd<32, 64, 32, T>(out, lse, q, k, v, a);
    else if (s->d <= 64) launch_fwd<64, 64, 32, T>(out, lse, q, k, v, a);
    else if (s->d <= 128) launch_fwd<128, 64, 32, T>(out, lse, q, k, v, a);
    else launch_fwd<256, 32, 32, T>(out, lse, q, k, v, a);
}

// The built-in backward (fp32: dq, dk, dv +=; bf16: written). Needs Dv, [B, H, Sq] floats.
template <typename T>
static void builtin_backward(T *dq, T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, const T *out,
                             const float *lse, const ops_attn_shape *s, float *Dv) {
    check_shape(s);
    attn_args a = make_args(s);
    const long long nrows = (long long)s->b * s->sq * s->h;
    long long nb = (nrows + 7) / 8;
    if (nb > TETRA_MAX_BLOCKS) nb = TETRA_MAX_BLOCKS;
    attn_rowdot_kernel<T><<<(unsigned)nb, 256, 0, cuda_stream()>>>(Dv, dout, out, s->sq, s->h, s->d, nrows);
    CUDA_CHECK_LAUNCH();
    if constexpr (std::is_same<T, uint16_t>::value) {
        if (ops_path_attention_tc(s)) {
            cuda_attention_tc_backward(dq, dk, dv, dout, q, k, v, lse, Dv, a);
            return;
        }
    }
    if (s->d <= 16) launch_bwd<16, 32, 32, T>(dq, dk, dv, dout, q, k, v, lse, Dv, a);
    else if (s->d <= 32) launch_bwd<32, 32, 32, T>(dq, dk, dv, dout, q, k, v, lse, Dv, a);
    else if (s->d <= 64) launch_bwd<64, 32, 32, T>(dq, dk, dv, dout, q, k, v, lse, Dv, a);
    else if (s->d <= 128) launch_bwd<128, 32, 32, T>(dq, dk, dv, dout, q, k, v, lse, Dv, a);
    else launch_bwd<256, 32, 32, T>(dq, dk, dv, dout, q, k, v, lse, Dv, a);
}

extern "C" void cuda_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                       const ops_attn_shape *s, void *workspace) {
    (void)workspace;
    if (s->b <= 0 || s->sq <= 0 || s->h <= 0) return;
    builtin_forward(out, lse, q, k, v, s);
}

extern "C" void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                        const float *k, const float *v, const float *out, const float *lse,
                                        const ops_attn_shape *s, void *workspace) {
    if (s->b <= 0 || s->sq <= 0 || s->sk <= 0 || s->h <= 0) return;
    if (s->causal && (long long)s->q_offset - s->k_offset + s->sq <= 0) return; // fully masked pair: adds nothing
    float *Dv = (float *)workspace;
    if (!Dv) Dv = (float *)cuda_scratch(SCRATCH_ATTN, cuda_attention_workspace_size(s));
    builtin_backward(dq, dk, dv, dout, q, k, v, out, lse, s, Dv);
}

// ----------------------------------------------------------------------------
// bf16 attention: cuDNN's fused SDPA (kernels/cuda/cuda_cudnn.cu) where it takes the
// shape and has a plan, else the built-in kernels: on the tensor cores for head dims up to
// 128 (cuda_attention_tc.cu), above that the kernels above instantiated for bf16 (tiles
// widened to fp32 in shared memory, fp32 softmax and accumulation, outputs rounded once).
// The workspace holds whichever of the two needs more: cuDNN's forward or backward
// workspace, or the built-in backward's Dv. Each path (and each reason for falling back)
// is logged once per direction to stderr.

static const char *attn_bf16_path = "none";

extern "C" const char *cuda_attention_bf16_last_path(void) { return attn_bf16_path; }

enum { WHY_CUDNN = 0, WHY_NO_CUDNN, WHY_UNSUPPORTED, WHY_NO_PLAN, WHY_FAILED, WHY_DETERMINISTIC, WHY_N };

// training.deterministic: cuDNN's usual SDPA backward accumulates dQ with atomics, so its
// bits vary run to run; cuDNN then builds its deterministic graph instead
// (cuda_cudnn_set_deterministic), and where it has none the built-in backward, which owns
// each output row, runs.
static int attn_deterministic = 0;
extern "C" void cuda_set_deterministic(int on) {
    attn_deterministic = on != 0;
    cuda_cudnn_set_deterministic(on);
}

static void log_path(int backward, int why, const ops_attn_shape *s, const char *detail) {
    static int logged[2][WHY_N];
    attn_bf16_path = why == WHY_CUDNN ? "cudnn" : "built-in";
    if (logged[backward][why]) return;
    logged[backward][why] = 1;
    const char *dir = backward ? "backward" : "forward";
    const char *kind = ops_path_attention_tc(s) ? "tensor-core" : "SIMT";
    const int ver = cuda_cudnn_version();
    char shape[160];
    snprintf(shape, sizeof shape, "b%d sq%d sk%d h%d kv%d d%d %s q@%d k@%d", s->b, s->sq, s->sk, s->h, s->kv, s->d,
             s->doc ? "block_causal" : (s->causal ? "causal" : "full"), s->q_offset, s->k_offset);
    switch (why) {
    case WHY_CUDNN:
        fprintf(stderr, "cuda: attention bf16 %s via cuDNN %d.%d fused SDPA%s\n", dir, ver / 10000, (ver / 100) % 100,
                backward && attn_deterministic ? " (deterministic graph)" : "");
        break;
    case WHY_NO_CUDNN:
        fprintf(stderr, "cuda: attention bf16 %s via the built-in %s kernel (this build has no cuDNN)\n", dir, kind);
        break;
    case WHY_DETERMINISTIC:
        fprintf(stderr,
                "cuda: attention bf16 %s via the built-in %s kernel (training.deterministic: cuDNN %d.%d has no "
                "deterministic SDPA plan for %s: %s)\n",
                dir, kind, ver / 10000, (ver / 100) % 100, shape, cuda_cudnn_last_error());
        break;
    case WHY_UNSUPPORTED:
        fprintf(stderr,
                "cuda: attention bf16 %s via the built-in %s kernel (cuDNN %d.%d's fused SDPA does not take %s)\n", dir,
                kind, ver / 10000, (ver / 100) % 100, shape);
        break;
    case WHY_NO_PLAN:
        fprintf(stderr,
                "cuda: attention bf16 %s via the built-in %s kernel (cuDNN %d.%d has no SDPA plan for %s: %s)\n", dir,
                kind, ver / 10000, (ver / 100) % 100, shape, cuda_cudnn_last_error());
        break;
    default:
        fprintf(stderr, "cuda: attention bf16 %s via the built-in %s kernel (the cuDNN SDPA call failed for %s: %s)\n",
                dir, kind, shape, detail && detail[0] ? detail : "no message");
        break;
    }
}

// The cuDNN workspace this direction needs, or (size_t)-1 when cuDNN cannot run it
// (*why says which reason).
static size_t cudnn_need(const ops_attn_shape *s, int backward, int *why) {
    if (!cuda_cudnn_version()) {
        *why = WHY_NO_CUDNN;
        return (size_t)-1;
    }
    if (!cuda_cudnn_sdpa_supported(s)) {
        *why = WHY_UNSUPPORTED;
        return (size_t)-1;
    }
    size_t w = cuda_cudnn_sdpa_workspace_size(s, backward);
    if (w == (size_t)-1) *why = WHY_NO_PLAN;
    return w;
}

extern "C" size_t cuda_attention_workspace_size_bf16(const ops_attn_shape *s) {
    size_t w = cuda_attention_workspace_size(s);
    int why;
    for (int backward = 0; backward < 2; backward++) {
        size_t c = cudnn_need(s, backward, &why);
        if (c != (size_t)-1 && c > w) w = c;
    }
    return (w + 255) & ~(size_t)255;
}

// workspace and its size: the caller's (sized by attention_workspace_size_bf16) or scratch
static void *bf16_workspace(const ops_attn_shape *s, void *workspace, size_t *bytes) {
    *bytes = cuda_attention_workspace_size_bf16(s);
    return workspace ? workspace : cuda_scratch(SCRATCH_ATTN, *bytes);
}

extern "C" void cuda_attention_forward_bf16(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                            const uint16_t *v, const ops_attn_shape *s, void *workspace) {
    if (s->b <= 0 || s->sq <= 0 || s->h <= 0) return;
    int why = WHY_CUDNN;
    char err[512] = "";
    if (cudnn_need(s, 0, &why) != (size_t)-1) {
        size_t bytes;
        void *ws = bf16_workspace(s, workspace, &bytes);
        if (cuda_cudnn_sdpa_forward(out, lse, q, k, v, s, ws, bytes, (void *)cuda_stream(), err, sizeof err) == 0) {
            log_path(0, WHY_CUDNN, s, NULL);
            return;
        }
        why = WHY_FAILED;
    }
    log_path(0, why, s, err);
    builtin_forward(out, lse, q, k, v, s);
}

extern "C" void cuda_attention_backward_bf16(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout,
                                             const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                             const uint16_t *out, const float *lse, const ops_attn_shape *s,
                                             void *workspace) {
    if (s->b <= 0 || s->h <= 0 || s->kv <= 0 || s->d <= 0) return;
    const size_t nq = s->sq > 0 ? (size_t)s->b * s->sq * s->h * s->d : 0;
    const size_t nk = s->sk > 0 ? (size_t)s->b * s->sk * s->kv * s->d : 0;
    // no query sees a key: the written gradients are zero
    if (!nq || !nk || (s->causal && (long long)s->q_offset - s->k_offset + s->sq <= 0)) {
        cudaStream_t st = cuda_stream();
        if (nq) CUDA_CHECK(cudaMemsetAsync(dq, 0, nq * sizeof(uint16_t), st));
        if (nk) CUDA_CHECK(cudaMemsetAsync(dk, 0, nk * sizeof(uint16_t), st));
        if (nk) CUDA_CHECK(cudaMemsetAsync(dv, 0, nk * sizeof(uint16_t), st));
        return;
    }
    int why = WHY_CUDNN;
    char err[512] = "";
    size_t bytes;
    if (cudnn_need(s, 1, &why) != (size_t)-1) {
        void *ws = bf16_workspace(s, workspace, &bytes);
        if (cuda_cudnn_sdpa_backward(dq, dk, dv, dout, q, k, v, out, lse, s, ws, bytes, (void *)cuda_stream(), err,
                                     sizeof err) == 0) {
            log_path(1, WHY_CUDNN, s, NULL);
            return;
        }
        why = WHY_FAILED;
    }
    if (why == WHY_NO_PLAN && attn_deterministic) why = WHY_DETERMINISTIC;
    log_path(1, why, s, err);
    float *Dv = (float *)bf16_workspace(s, workspace, &bytes);
    builtin_backward(dq, dk, dv, dout, q, k, v, out, lse, s, Dv);
}

// ----------------------------------------------------------------------------
// merge of two partial results over disjoint key sets (ring attention): one warp per row

__global__ void attn_merge_kernel(float *out, float *lse, const float *out_blk, const float *lse_blk, int sq, int h,
                                  int d, long long nrows) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < nrows; r += warps) {
        int hh = (int)(r % h);
        long long bi = r / h;
        int i = (int)(bi % sq), bb = (int)(bi / sq);
        size_t li = ((size_t)bb * h + hh) * sq + i;
        float la = lse[li], lb = lse_blk[li];
        float *o = out + (size_t)r * d;
        const float *ob = out_blk + (size_t)r * d;
        if (lb == -INFINITY) continue; // the block saw no key for this row
        if (la == -INFINITY) {
            for (int j = lane; j < d; j += 32) o[j] = ob[j];
        } else {
            float mx = la > lb ? la : lb;
            float lnew = mx + log1pf(expf(-fabsf(la - lb)));
            float wa = expf(la - lnew), wb = expf(lb - lnew);
            for (int j = lane; j < d; j += 32) o[j] = __fadd_rn(__fmul_rn(wa, o[j]), __fmul_rn(wb, ob[j]));
            lb = lnew;
        }
        __syncwarp();
        if (lane == 0) lse[li] = lb;
    }
}

extern "C" void cuda_attention_merge(float *out, float *lse, const float *out_blk, const float *lse_blk, int b, int sq,
                                     int h, int d) {
    const long long nrows = (long long)b * sq * h;
    if (nrows <= 0) return;
    long long nb = (nrows + 7) / 8;
    if (nb > TETRA_MAX_BLOCKS) nb = TETRA_MAX_BLOCKS;
    attn_merge_kernel<<<(unsigned)nb, 256, 0, cuda_stream()>>>(out, lse, out_blk, lse_blk, sq, h, d, nrows);
    CUDA_CHECK_LAUNCH();
}
