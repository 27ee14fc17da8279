// kernels/cuda/cuda_attention_tc.cu — the built-in bf16 attention on the tensor cores: the
// FlashAttention-2 schedule of cuda_attention.cu (online softmax, the lse saved, each
// probability tile recomputed in the backward, one block owning each output row) with
// every tile product on the warp matrix units (nvcuda::wmma, 16 x 16 x 16, bf16 operands
// into fp32 accumulators) instead of fp32 FMA.
//
// Why this shape:
// - q, k, v and dout are bf16 already, so Q K^T and dO V^T are exact products summed in
//   fp32, as the CUDA-core kernels sum them. The probabilities P and dS are fp32; each is
//   split into two bf16 terms (hi = bf16(x), lo = bf16(x - hi), 16 significant bits
//   together) and multiplied as two products, so P V, P^T dO, dS^T Q and dS K keep about
//   fp32's accuracy and the op stays within a bf16 ulp of the CPU's fp32 arithmetic,
//   where a single bf16 P (cuDNN's choice) is not.
// - Tiles of 64 queries x 64 keys, 8 warps: each product is a set of 16 x 16 output tiles
//   spread over the warps. Scores go through shared memory in fp32 for the softmax (one
//   warp per row) and the masks (causal offsets, document ids: cuda_attention_args.cuh).
//   The forward's output accumulator is in shared memory, because the online softmax
//   rescales its rows and a fragment's element order is unspecified; the backward's dK,
//   dV and dQ stay in fragments for the whole block.
// - Grouped-query heads read K/V head h / (H/KV) in place; the dK/dV block walks its
//   group's query heads. Tiles between documents are skipped as in cuda_attention.cu.
// - Shared memory: forward 120 KiB, backward 139 KiB at head dim 128 (one block per SM
//   on sm_80 and sm_90). Deterministic: no atomics, fixed summation order.
#include "kernels/cuda/cuda_attention_tc.cuh"

#include <cuda_bf16.h>
#include <mma.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/ops_math.h"

using namespace nvcuda;

#define TC_THREADS 256
#define TC_WARPS 8
#define TC_BQ 64 // query rows of a tile
#define TC_BK 64 // keys of a tile

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_a_row;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major> frag_a_col;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_acc;

static constexpr size_t tc_al(size_t bytes) { return (bytes + 127) / 128 * 128; }

// Row strides (elements) and region sizes (bytes). Strides keep every 16 x 16 tile on 32
// bytes, as the warp matrix loads require, and shift rows across banks.
template <int DMAX> struct TcDims {
    static constexpr int KD = DMAX / 16;                       // 16-wide steps of the head dim
    static constexpr int NT = 4 * KD;                          // 16 x 16 tiles of a [64][DMAX] output
    static constexpr int UPW = (NT + TC_WARPS - 1) / TC_WARPS; // of them per warp (tile warp + 8 u)
    static constexpr int LDB = DMAX + 8;                       // bf16 q/k/v/dout tiles, [64][LDB]
    static constexpr int LDS = TC_BK + 4;                      // fp32 scores, [64][LDS]
    static constexpr int LDP = TC_BK + 8;                      // bf16 probability terms, [64][LDP]
    static constexpr int LDO = DMAX + 4;                       // fp32 outputs, [64][LDO]
    static constexpr size_t tile = tc_al((size_t)TC_BQ * LDB * 2);
    static constexpr size_t scores = tc_al((size_t)TC_BQ * LDS * 4);
    static constexpr size_t probs = tc_al((size_t)TC_BQ * LDP * 2);
    static constexpr size_t outs = tc_al((size_t)TC_BQ * LDO * 4);
    static constexpr size_t rowf = tc_al((size_t)TC_BQ * 4);
    static_assert(DMAX % 16 == 0 && DMAX <= 128, "head dims of 16 to 128");
    static_assert(TC_BQ == TC_BK, "square tiles: q and k tiles share a size");
    static_assert(LDB % 8 == 0, "tile rows on 16 bytes");
};

// forward: Q, K, V | S | P hi, P lo | O | max, sum, correction
template <int DMAX> struct TcFwd {
    typedef TcDims<DMAX> Dm;
    static constexpr size_t q = 0, k = q + Dm::tile, v = k + Dm::tile, s = v + Dm::tile;
    static constexpr size_t ph = s + Dm::scores, pl = ph + Dm::probs, o = pl + Dm::probs;
    static constexpr size_t m = o + Dm::outs, bytes = m + 3 * Dm::rowf;
};

// backward: K, V, Q, dO | S, dP (the outputs' fp32 staging at the end) | P hi/lo, dS hi/lo | lse, Dv
template <int DMAX> struct TcBwd {
    typedef TcDims<DMAX> Dm;
    static constexpr size_t k = 0, v = k + Dm::tile, q = v + Dm::tile, d_o = q + Dm::tile;
    static constexpr size_t s = d_o + Dm::tile, dp = s + Dm::scores;
    static constexpr size_t ph = dp + Dm::scores, pl = ph + Dm::probs, dsh = pl + Dm::probs, dsl = dsh + Dm::probs;
    static constexpr size_t lse = dsl + Dm::probs, dv = lse + Dm::rowf, bytes = dv + Dm::rowf;
    static_assert(2 * Dm::scores >= Dm::outs, "the output staging fits over S and dP");
};

// the backward's regions as typed pointers into the dynamic shared memory
template <int DMAX> struct TcBwdViews {
    uint16_t *k, *v, *q, *d_o, *ph, *pl, *dsh, *dsl;
    float *s, *dp, *lse, *dv;
    __device__ explicit TcBwdViews(float *sm) {
        typedef TcBwd<DMAX> L;
        char *base = (char *)sm;
        k = (uint16_t *)(base + L::k), v = (uint16_t *)(base + L::v);
        q = (uint16_t *)(base + L::q), d_o = (uint16_t *)(base + L::d_o);
        ph = (uint16_t *)(base + L::ph), pl = (uint16_t *)(base + L::pl);
        dsh = (uint16_t *)(base + L::dsh), dsl = (uint16_t *)(base + L::dsl);
        s = (float *)(base + L::s), dp = (float *)(base + L::dp);
        lse = (float *)(base + L::lse), dv = (float *)(base + L::dv);
    }
};

__device__ __forceinline__ const __nv_bfloat16 *bf(const uint16_t *p) {
    return reinterpret_cast<const __nv_bfloat16 *>(p);
}

// rows x D bf16 elements (row stride ld) into a [64][LDB] tile, zero beyond rows and D:
// 16 bytes a load where the rows allow it (D the tile's width, rows on 16 bytes)
template <int DMAX, int LDB>
__device__ __forceinline__ void tc_load(uint16_t *dst, const uint16_t *src, size_t ld, int rows, int D) {
    if (D == DMAX && (ld & 7) == 0 && ((uintptr_t)src & 15) == 0) {
        constexpr int V = DMAX / 8;
        for (int idx = threadIdx.x; idx < TC_BQ * V; idx += TC_THREADS) {
            const int r = idx / V, c = (idx - r * V) * 8;
            uint4 val = {0, 0, 0, 0};
            if (r < rows) val = *(const uint4 *)(src + (size_t)r * ld + c);
            *(uint4 *)(dst + r * LDB + c) = val;
        }
        return;
    }
    for (int idx = threadIdx.x; idx < TC_BQ * DMAX; idx += TC_THREADS) {
        const int r = idx / DMAX, c = idx - r * DMAX;
        dst[r * LDB + c] = (r < rows && c < D) ? src[(size_t)r * ld + c] : (uint16_t)0;
    }
}

// x as hi + lo, two bf16 values (hi = x rounded, lo = the rest rounded)
__device__ __forceinline__ void tc_split(float x, uint16_t *hi, uint16_t *lo) {
    const uint16_t h = tetra_f32_to_bf16(x);
    *hi = h;
    *lo = tetra_f32_to_bf16(x - tetra_bf16_to_f32(h));
}

// acc += (hi + lo) B: an fp32 tile held as its two bf16 terms (A, layout LA) times B
template <typename LA>
__device__ __forceinline__ void tc_mma2(frag_acc &acc, const uint16_t *hi, const uint16_t *lo, int ld,
                                        const frag_b_row &fb) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LA> fa;
    wmma::load_matrix_sync(fa, bf(hi), ld);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::load_matrix_sync(fa, bf(lo), ld);
    wmma::mma_sync(acc, fa, fb, acc);
}

// C [64][LDS] (fp32) = A B^T for A, B [64][LDB] bf16 tiles: the 16 output tiles of one
// product, or of two (jobs 16-31 write C2 = A2 B2^T), spread over the warps.
template <int DMAX>
__device__ __forceinline__ void tc_abt(float *C, const uint16_t *A, const uint16_t *B, float *C2, const uint16_t *A2,
                                       const uint16_t *B2, int jobs) {
    typedef TcDims<DMAX> Dm;
    for (int t = (int)(threadIdx.x >> 5); t < jobs; t += TC_WARPS) {
        const int second = t >= 16, ti = (t & 15) >> 2, tj = t & 3;
        const uint16_t *a = second ? A2 : A, *b = second ? B2 : B;
        frag_acc acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < Dm::KD; kk++) {
            frag_a_row fa;
            frag_b_col fb;
            wmma::load_matrix_sync(fa, bf(a + ti * 16 * Dm::LDB + kk * 16), Dm::LDB);
            wmma::load_matrix_sync(fb, bf(b + tj * 16 * Dm::LDB + kk * 16), Dm::LDB);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync((second ? C2 : C) + ti * 16 * Dm::LDS + tj * 16, acc, Dm::LDS, wmma::mem_row_major);
    }
}

// ----------------------------------------------------------------------------
// forward: one block per (batch, head, 64-query tile), heaviest tiles first

template <int DMAX>
__global__ void __launch_bounds__(TC_THREADS, 1)
    tc_fwd_kernel(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v, attn_args a,
                  int nqb) {
    typedef TcDims<DMAX> Dm;
    typedef TcFwd<DMAX> L;
    constexpr int LDB = Dm::LDB, LDS = Dm::LDS, LDP = Dm::LDP, LDO = Dm::LDO, KD = Dm::KD;
    extern __shared__ float sm[];
    char *base = (char *)sm;
    uint16_t *sQ = (uint16_t *)(base + L::q), *sK = (uint16_t *)(base + L::k), *sV = (uint16_t *)(base + L::v);
    float *sS = (float *)(base + L::s), *sO = (float *)(base + L::o);
    uint16_t *sPh = (uint16_t *)(base + L::ph), *sPl = (uint16_t *)(base + L::pl);
    float *sM = (float *)(base + L::m), *sL = sM + Dm::rowf / 4, *sC = sL + Dm::rowf / 4;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int nbh = a.B * a.H;
    const int qb = nqb - 1 - (int)(blockIdx.x / nbh);
    const int bh = (int)(blockIdx.x % nbh), b = bh / a.H, h = bh % a.H, g = h / a.rep;
    const int i0 = qb * TC_BQ, rows = min(TC_BQ, a.Sq - i0);
    const int D = a.D;
    const size_t ldq = (size_t)a.H * D, ldk = (size_t)a.KV * D;

    tc_load<DMAX, LDB>(sQ, q + ((size_t)b * a.Sq + i0) * ldq + (size_t)h * D, ldq, rows, D);
    for (int idx = tid; idx < TC_BQ * DMAX; idx += TC_THREADS) sO[(idx / DMAX) * LDO + idx % DMAX] = 0.0f;
    if (tid < TC_BQ) {
        sM[tid] = -INFINITY;
        sL[tid] = 0.0f;
    }

    const int kend = visible_keys(a, i0 + rows - 1);
    for (int j0 = doc_key_begin(a, b, i0) / TC_BK * TC_BK; j0 < kend; j0 += TC_BK) {
        const int cols = min(TC_BK, kend - j0);
        __syncthreads(); // the previous tile is consumed
        const size_t koff = ((size_t)b * a.Sk + j0) * ldk + (size_t)g * D;
        tc_load<DMAX, LDB>(sK, k + koff, ldk, cols, D);
        tc_load<DMAX, LDB>(sV, v + koff, ldk, cols, D);
        __syncthreads();
        tc_abt<DMAX>(sS, sQ, sK, nullptr, nullptr, nullptr, 16); // S = Q K^T
        __syncthreads();

        // online softmax, one warp per row, two keys per lane; P = hi + lo
        for (int r = warp; r < TC_BQ; r += TC_WARPS) {
            float val[2], mx = -INFINITY;
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const int c = lane + 32 * u;
                const bool vis = r < rows && c < cols && key_visible(a, b, i0 + r, j0 + c);
                val[u] = vis ? a.scale * sS[r * LDS + c] : -INFINITY;
                mx = fmaxf(mx, val[u]);
            }
            mx = warp_max(mx);
            const float m_old = sM[r], m_new = fmaxf(m_old, mx);
            if (m_new == -INFINITY) { // nothing visible to this row yet
#pragma unroll
                for (int u = 0; u < 2; u++) sPh[r * LDP + lane + 32 * u] = sPl[r * LDP + lane + 32 * u] = 0;
                if (lane == 0) sC[r] = 1.0f;
                continue;
            }
            float sum = 0.0f;
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const float p = val[u] == -INFINITY ? 0.0f : tetra_expf(val[u] - m_new);
                tc_split(p, &sPh[r * LDP + lane + 32 * u], &sPl[r * LDP + lane + 32 * u]);
                sum += p;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                const float corr = m_old == -INFINITY ? 0.0f : tetra_expf(m_old - m_new);
                sL[r] = sL[r] * corr + sum;
                sM[r] = m_new;
                sC[r] = corr;
            }
        }
        __syncthreads();
        for (int idx = tid; idx < TC_BQ * DMAX; idx += TC_THREADS) {
            const int r = idx / DMAX;
            sO[r * LDO + idx % DMAX] *= sC[r];
        }
        __syncthreads();

        // O += P V, P as its two terms
        for (int t = warp; t < 4 * KD; t += TC_WARPS) {
            const int ti = t / KD, td = t % KD;
            frag_acc acc;
            wmma::load_matrix_sync(acc, sO + ti * 16 * LDO + td * 16, LDO, wmma::mem_row_major);
#pragma unroll
            for (int kk = 0; kk < TC_BK / 16; kk++) {
                frag_b_row fb;
                wmma::load_matrix_sync(fb, bf(sV + kk * 16 * LDB + td * 16), LDB);
                const int pa = ti * 16 * LDP + kk * 16;
                tc_mma2<wmma::row_major>(acc, sPh + pa, sPl + pa, LDP, fb);
            }
            wmma::store_matrix_sync(sO + ti * 16 * LDO + td * 16, acc, LDO, wmma::mem_row_major);
        }
    }
    __syncthreads();

    for (int idx = tid; idx < TC_BQ * DMAX; idx += TC_THREADS) {
        const int r = idx / DMAX, dd = idx - r * DMAX;
        if (r >= rows || dd >= D) continue;
        const float inv = sL[r] == 0.0f ? 0.0f : 1.0f / sL[r]; // a row that saw no key: out = 0
        out[((size_t)b * a.Sq + i0 + r) * ldq + (size_t)h * D + dd] = tetra_f32_to_bf16(sO[r * LDO + dd] * inv);
    }
    if (tid < rows)
        lse[((size_t)b * a.H + h) * a.Sq + i0 + tid] = sL[tid] == 0.0f ? -INFINITY : sM[tid] + logf(sL[tid]);
}

// ----------------------------------------------------------------------------
// backward

// A (query tile, key tile) pair of the backward, its tiles in shared memory: S = Q K^T and
// dP = dO V^T, then P = exp(scale S - lse) where visible and dS = P (dP - Dv), each as two
// bf16 terms (P only with_p, for the dK/dV pass); ends on a barrier
template <int DMAX, bool with_p>
__device__ __forceinline__ void tc_recompute(const TcBwdViews<DMAX> &w, const attn_args &a, int b, int i0, int rows,
                                             int j0, int cols) {
    typedef TcDims<DMAX> Dm;
    tc_abt<DMAX>(w.s, w.q, w.k, w.dp, w.d_o, w.v, 32);
    __syncthreads();
    for (int idx = threadIdx.x; idx < TC_BQ * TC_BK; idx += TC_THREADS) {
        const int r = idx / TC_BK, c = idx - r * TC_BK;
        const float L = w.lse[r];
        const bool vis = r < rows && c < cols && L != -INFINITY && key_visible(a, b, i0 + r, j0 + c);
        const float p = vis ? tetra_expf(a.scale * w.s[r * Dm::LDS + c] - L) : 0.0f;
        const float ds = p * (w.dp[r * Dm::LDS + c] - w.dv[r]);
        if (with_p) tc_split(p, &w.ph[r * Dm::LDP + c], &w.pl[r * Dm::LDP + c]);
        tc_split(ds, &w.dsh[r * Dm::LDP + c], &w.dsl[r * Dm::LDP + c]);
    }
    __syncthreads();
}

// a query tile's rows of q and dout, lse and Dv into shared memory
template <int DMAX>
__device__ __forceinline__ void tc_load_queries(const TcBwdViews<DMAX> &w, const uint16_t *q, const uint16_t *dout,
                                                const float *lse, const float *Dv, const attn_args &a, int b, int h,
                                                int i0, int rows) {
    const size_t ldq = (size_t)a.H * a.D, qoff = ((size_t)b * a.Sq + i0) * ldq + (size_t)h * a.D;
    tc_load<DMAX, TcDims<DMAX>::LDB>(w.q, q + qoff, ldq, rows, a.D);
    tc_load<DMAX, TcDims<DMAX>::LDB>(w.d_o, dout + qoff, ldq, rows, a.D);
    if (threadIdx.x < TC_BQ) {
        const int r = (int)threadIdx.x;
        const size_t li = ((size_t)b * a.H + h) * a.Sq + i0 + r;
        w.lse[r] = r < rows ? lse[li] : -INFINITY;
        w.dv[r] = r < rows ? Dv[li] : 0.0f;
    }
}

// 64 rows of a gradient, held as fragments of [64/16][DMAX/16] tiles (tile warp + 8 u),
// scaled and written through the fp32 staging: rows < nrows, columns < D
template <int DMAX>
__device__ __forceinline__ void tc_write_rows(uint16_t *dst, size_t ld, int nrows, int D, float scale,
                                              const frag_acc *f, float *stage) {
    typedef TcDims<DMAX> Dm;
    const int warp = (int)(threadIdx.x >> 5);
#pragma unroll
    for (int u = 0; u < Dm::UPW; u++) {
        const int t = warp + TC_WARPS * u;
        if (t < Dm::NT)
            wmma::store_matrix_sync(stage + (t / Dm::KD) * 16 * Dm::LDO + (t % Dm::KD) * 16, f[u], Dm::LDO,
                                    wmma::mem_row_major);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < TC_BQ * DMAX; idx += TC_THREADS) {
        const int r = idx / DMAX, dd = idx - r * DMAX;
        if (r < nrows && dd < D) dst[(size_t)r * ld + dd] = tetra_f32_to_bf16(scale * stage[r * Dm::LDO + dd]);
    }
    __syncthreads();
}

// dK and dV: one block per (batch, kv head, 64-key tile), over every query head of the
// group and every query tile that sees the keys
template <int DMAX>
__global__ void __launch_bounds__(TC_THREADS, 1)
    tc_bwd_dkdv_kernel(uint16_t *dk, uint16_t *dv, const uint16_t *dout, const uint16_t *q, const uint16_t *k,
                       const uint16_t *v, const float *lse, const float *Dv, attn_args a) {
    typedef TcDims<DMAX> Dm;
    constexpr int LDB = Dm::LDB, LDP = Dm::LDP, KD = Dm::KD, NT = Dm::NT, UPW = Dm::UPW;
    extern __shared__ float sm[];
    const TcBwdViews<DMAX> w(sm);
    uint16_t *sK = w.k, *sV = w.v, *sQ = w.q, *sdO = w.d_o, *sPh = w.ph, *sPl = w.pl, *sdSh = w.dsh, *sdSl = w.dsl;

    const int warp = (int)(threadIdx.x >> 5);
    const int nbg = a.B * a.KV;
    const int kb = (int)(blockIdx.x / nbg); // earliest key tiles (seen by most queries) first
    const int bg = (int)(blockIdx.x % nbg), b = bg / a.KV, g = bg % a.KV;
    const int j0 = kb * TC_BK, cols = min(TC_BK, a.Sk - j0);
    const int D = a.D;
    const size_t ldk = (size_t)a.KV * D, koff = ((size_t)b * a.Sk + j0) * ldk + (size_t)g * D;

    tc_load<DMAX, LDB>(sK, k + koff, ldk, cols, D);
    tc_load<DMAX, LDB>(sV, v + koff, ldk, cols, D);
    frag_acc fdk[UPW], fdv[UPW];
#pragma unroll
    for (int u = 0; u < UPW; u++) {
        wmma::fill_fragment(fdk[u], 0.0f);
        wmma::fill_fragment(fdv[u], 0.0f);
    }

    // queries from the first that sees key j0 to the last of the tile's last key's document
    const int qstart = first_query(a, j0), qend = doc_query_end(a, b, j0 + cols - 1);
    for (int hh = 0; hh < a.rep; hh++) {
        const int h = g * a.rep + hh;
        for (int i0 = qstart; i0 < qend; i0 += TC_BQ) {
            const int rows = min(TC_BQ, a.Sq - i0);
            __syncthreads();
            tc_load_queries<DMAX>(w, q, dout, lse, Dv, a, b, h, i0, rows);
            __syncthreads();
            tc_recompute<DMAX, true>(w, a, b, i0, rows, j0, cols);
            // dV += P^T dO, dK += dS^T Q (P^T and dS^T read column-major)
#pragma unroll
            for (int u = 0; u < UPW; u++) {
                const int t = warp + TC_WARPS * u;
                if (t >= NT) break;
                const int tk = t / KD, td = t % KD;
#pragma unroll
                for (int kk = 0; kk < TC_BQ / 16; kk++) {
                    const int pa = kk * 16 * LDP + tk * 16;
                    frag_b_row fb;
                    wmma::load_matrix_sync(fb, bf(sdO + kk * 16 * LDB + td * 16), LDB);
                    tc_mma2<wmma::col_major>(fdv[u], sPh + pa, sPl + pa, LDP, fb);
                    wmma::load_matrix_sync(fb, bf(sQ + kk * 16 * LDB + td * 16), LDB);
                    tc_mma2<wmma::col_major>(fdk[u], sdSh + pa, sdSl + pa, LDP, fb);
                }
            }
        }
    }
    __syncthreads();
    tc_write_rows<DMAX>(dv + koff, ldk, cols, D, 1.0f, fdv, w.s);
    tc_write_rows<DMAX>(dk + koff, ldk, cols, D, a.scale, fdk, w.s);
}

// dQ: one block per (batch, head, 64-query tile), over the key tiles its rows see
template <int DMAX>
__global__ void __launch_bounds__(TC_THREADS, 1)
    tc_bwd_dq_kernel(uint16_t *dq, const uint16_t *dout, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                     const float *lse, const float *Dv, attn_args a, int nqb) {
    typedef TcDims<DMAX> Dm;
    constexpr int LDB = Dm::LDB, LDP = Dm::LDP, KD = Dm::KD, NT = Dm::NT, UPW = Dm::UPW;
    extern __shared__ float sm[];
    const TcBwdViews<DMAX> w(sm);
    uint16_t *sK = w.k, *sV = w.v, *sdSh = w.dsh, *sdSl = w.dsl;

    const int warp = (int)(threadIdx.x >> 5);
    const int nbh = a.B * a.H;
    const int qb = nqb - 1 - (int)(blockIdx.x / nbh);
    const int bh = (int)(blockIdx.x % nbh), b = bh / a.H, h = bh % a.H, g = h / a.rep;
    const int i0 = qb * TC_BQ, rows = min(TC_BQ, a.Sq - i0);
    const int D = a.D;
    const size_t ldq = (size_t)a.H * D, ldk = (size_t)a.KV * D;

    tc_load_queries<DMAX>(w, q, dout, lse, Dv, a, b, h, i0, rows);
    frag_acc fdq[UPW];
#pragma unroll
    for (int u = 0; u < UPW; u++) wmma::fill_fragment(fdq[u], 0.0f);

    const int kend = visible_keys(a, i0 + rows - 1);
    for (int j0 = doc_key_begin(a, b, i0) / TC_BK * TC_BK; j0 < kend; j0 += TC_BK) {
        const int cols = min(TC_BK, kend - j0);
        __syncthreads();
        const size_t koff = ((size_t)b * a.Sk + j0) * ldk + (size_t)g * D;
        tc_load<DMAX, LDB>(sK, k + koff, ldk, cols, D);
        tc_load<DMAX, LDB>(sV, v + koff, ldk, cols, D);
        __syncthreads();
        tc_recompute<DMAX, false>(w, a, b, i0, rows, j0, cols);
        // dQ += dS K
#pragma unroll
        for (int u = 0; u < UPW; u++) {
            const int t = warp + TC_WARPS * u;
            if (t >= NT) break;
            const int ti = t / KD, td = t % KD;
#pragma unroll
            for (int kk = 0; kk < TC_BK / 16; kk++) {
                frag_b_row fb;
                wmma::load_matrix_sync(fb, bf(sK + kk * 16 * LDB + td * 16), LDB);
                const int pa = ti * 16 * LDP + kk * 16;
                tc_mma2<wmma::row_major>(fdq[u], sdSh + pa, sdSl + pa, LDP, fb);
            }
        }
    }
    __syncthreads();
    tc_write_rows<DMAX>(dq + ((size_t)b * a.Sq + i0) * ldq + (size_t)h * D, ldq, rows, D, a.scale, fdq, w.s);
}

// ----------------------------------------------------------------------------
// launchers

template <int DMAX>
static void tc_forward(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                       const attn_args &a) {
    static bool configured = false;
    const size_t smem = TcFwd<DMAX>::bytes;
    attn_configure(tc_fwd_kernel<DMAX>, configured, smem);
    const int nqb = (a.Sq + TC_BQ - 1) / TC_BQ;
    const long long blocks = (long long)nqb * a.B * a.H;
    tc_fwd_kernel<DMAX><<<(unsigned)blocks, TC_THREADS, smem, cuda_stream()>>>(out, lse, q, k, v, a, nqb);
    CUDA_CHECK_LAUNCH();
}

template <int DMAX>
static void tc_backward(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout, const uint16_t *q,
                        const uint16_t *k, const uint16_t *v, const float *lse, const float *Dv, const attn_args &a) {
    static bool configured_kv = false, configured_q = false;
    const size_t smem = TcBwd<DMAX>::bytes;
    attn_configure(tc_bwd_dkdv_kernel<DMAX>, configured_kv, smem);
    attn_configure(tc_bwd_dq_kernel<DMAX>, configured_q, smem);
    const int nkb = (a.Sk + TC_BK - 1) / TC_BK, nqb = (a.Sq + TC_BQ - 1) / TC_BQ;
    const long long blocks_kv = (long long)nkb * a.B * a.KV, blocks_q = (long long)nqb * a.B * a.H;
    tc_bwd_dkdv_kernel<DMAX>
        <<<(unsigned)blocks_kv, TC_THREADS, smem, cuda_stream()>>>(dk, dv, dout, q, k, v, lse, Dv, a);
    CUDA_CHECK_LAUNCH();
    tc_bwd_dq_kernel<DMAX><<<(unsigned)blocks_q, TC_THREADS, smem, cuda_stream()>>>(dq, dout, q, k, v, lse, Dv, a, nqb);
    CUDA_CHECK_LAUNCH();
}

void cuda_attention_tc_forward(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                               const attn_args &a) {
    if (a.D <= 16) tc_forward<16>(out, lse, q, k, v, a);
    else if (a.D <= 32) tc_forward<32>(out, lse, q, k, v, a);
    else if (a.D <= 64) tc_forward<64>(out, lse, q, k, v, a);
    else tc_forward<128>(out, lse, q, k, v, a);
}

void cuda_attention_tc_backward(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout, const uint16_t *q,
                                const uint16_t *k, const uint16_t *v, const float *lse, const float *Dv,
                                const attn_args &a) {
    if (a.D <= 16) tc_backward<16>(dq, dk, dv, dout, q, k, v, lse, Dv, a);
    else if (a.D <= 32) tc_backward<32>(dq, dk, dv, dout, q, k, v, lse, Dv, a);
    else if (a.D <= 64) tc_backward<64>(dq, dk, dv, dout, q, k, v, lse, Dv, a);
    else tc_backward<128>(dq, dk, dv, dout, q, k, v, lse, Dv, a);
}
