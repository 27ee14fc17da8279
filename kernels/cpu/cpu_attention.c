// kernels/cpu/cpu_attention.c — causal (or full) attention with grouped-query heads,
// forward and backward, computed blockwise with an online softmax (FlashAttention-2 on a
// CPU). Nothing of size S x S is ever stored: the forward saves only the log-sum-exp per
// query row, and the backward recomputes each score tile from it.
//
// Layouts (ops.h): q/out/dq [B, Sq, H, D], k/v/dk/dv [B, Sk, KV, D], lse [B, H, Sq]. A
// head's rows are strided by H*D (or KV*D) floats; GQA indexes the shared K/V head
// g = h / (H/KV) without expanding it.
//
// Tiles are transposed: a score tile S^T = scale K_blk Q_blk^T holds a key per row and a
// query per column ([cols <= BK][rows <= BQ]), so the softmax statistics of all the
// block's queries (max, sum, lse, the row term of the backward) are vectors along a tile
// row, and the causal mask cuts a prefix off each key's row. Every product is one small
// register-tiled kernel (mk_gemm) that reads one operand element by element at any
// stride, so nothing is packed per tile as a BLAS call would (at head_dim 16 a tile is
// 64 x 64 x 16: packing and call overhead cost as much as the arithmetic). What is
// copied is copied once per task: the kv head's K and V rows, contiguous (in the [B, S,
// KV, D] layout a head's rows are KV*D floats apart, a cache line each at head_dim 16),
// and each query block's Q^T (and dO^T, Q, dO) for the backward.
//
// The products whose output is a block's rows by head_dim (the forward's P V, the
// backward's dQ) accumulate transposed, [D][BQ]: at head_dim 16 a row-major output is a
// single vector wide, so every FMA would need its own broadcast, while the transposed one
// is BQ wide and takes the kernel's full register tiles. The forward's rescaling by the
// softmax correction becomes a lane-wise multiply, and the block is transposed back once,
// when it is written out. Each output element is still the same FMA chain in the same
// order, so the results are those of the row-major products, bit for bit.
//
// Threads: the forward runs one task per (batch, kv head, range of query blocks), the
// latest ranges first (they see the most keys under the causal mask). The backward has
// two schedules, both free of atomics:
// - fused (when B*KV keeps the threads busy): one task per (batch, kv head) walks query
//   blocks, the group's query heads and the key blocks each sees. It owns its rows of dK
//   and dV (every query head that reads them is inside it) and of dQ (no other task
//   touches that kv group's query heads), sums them in its own contiguous buffers and adds
//   them to the outputs once: 5 products per tile pair and no races.
// - split (few groups, many threads): pass 1 runs (batch, head, query block) tasks that
//   produce dQ, pass 2 runs (batch, kv head, key block) tasks that produce dK and dV, on
//   the strided rows in place. Score tiles are recomputed in both (7 products per tile
//   pair instead of 5), in exchange for parallelism over blocks rather than heads.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops_docmask.h"
#include "kernels/ops_math.h"

#define BQ CPU_ATTN_BQ
#define BK CPU_ATTN_BK

// ----------------------------------------------------------------------------
// the tile product

// The kernel is written once for a GCC vector of W floats (VT): 8 (AVX registers on
// x86-64-v3, pairs of SSE registers on the baseline) or 16 (AVX-512 registers, its own
// function compiled for x86-64-v4 and chosen at run time: the CPU_SIMD clones of a 32-byte
// vector would leave half of each FMA unit idle). Loads and stores go through memcpy
// (unaligned, no aliasing questions); macros rather than functions so no vector crosses a
// call (its ABI differs between the ISA levels).
#define V_LD(VT, p)                                                                                                    \
    __extension__({                                                                                                    \
        VT vl_;                                                                                                        \
        __builtin_memcpy(&vl_, (p), sizeof vl_);                                                                       \
        vl_;                                                                                                           \
    })
#define V_ST(VT, p, x)                                                                                                 \
    do {                                                                                                               \
        VT vs_ = (x);                                                                                                  \
        __builtin_memcpy((p), &vs_, sizeof vs_);                                                                       \
    } while (0)
// C := alpha S (+ C when acc), on W columns or the last nw < W through a zero-padded copy.
// alpha S is rounded on its own before the add: whether a compiler would fuse the two
// depends on the code around them (it differs between the widths under ASan), and the
// kernels of both widths must give the same bits. Without acc the product is stored as it
// is: at head_dim 16 a tile's output costs as much as a sixth of its FMAs, and the fence
// and the add of zeros were most of that.
#define V_OUT(VT, W, cp, s, nw)                                                                                        \
    do {                                                                                                               \
        float *cp_ = (cp);                                                                                             \
        VT r_ = alpha * (s);                                                                                           \
        if (acc) {                                                                                                     \
            VT cv_;                                                                                                    \
            if ((nw) == (W)) {                                                                                         \
                cv_ = V_LD(VT, cp_);                                                                                   \
            } else {                                                                                                   \
                float tc_[W] = {0};                                                                                    \
                __builtin_memcpy(tc_, cp_, (size_t)(nw) * sizeof(float));                                              \
                cv_ = V_LD(VT, tc_);                                                                                   \
            }                                                                                                          \
            __asm__("" : "+m"(r_)); /* no fusion with the add below */                                                 \
            r_ += cv_;                                                                                                 \
        }                                                                                                              \
        if ((nw) == (W)) {                                                                                             \
            V_ST(VT, cp_, r_);                                                                                         \
        } else {                                                                                                       \
            float t_[W];                                                                                               \
            V_ST(VT, t_, r_);                                                                                          \
            __builtin_memcpy(cp_, t_, (size_t)(nw) * sizeof(float));                                                   \
        }                                                                                                              \
    } while (0)
// B's W columns at bp, or its last nw < W zero-padded
#define V_LDB(VT, W, bp, nw)                                                                                           \
    __extension__({                                                                                                    \
        float tb_[W] = {0};                                                                                            \
        (nw) == (W) ? V_LD(VT, bp) : (__builtin_memcpy(tb_, (bp), (size_t)(nw) * sizeof(float)), V_LD(VT, tb_));       \
    })

// C[m, w] = alpha A B (+ C when acc): A(i, p) = a[i ar + p ac] at any strides, B row-major
// [n, w] with leading dimension ldb. Register tiles of R2 rows x 2W columns (B's two vectors
// loaded once per p for the R2 rows); columns past the last 2W run as tiles of R1 rows x W
// (the head_dim-wide products at head_dim 16 on AVX-512), the last of them zero-padded;
// rows past the last full tile one at a time. An FMA's result is ready 4 cycles after it
// issues and two issue per cycle, so a tile needs at least 8 independent accumulators to
// keep both FMA ports busy; the AVX-512 build has 32 vector registers and takes 16 (R2 8,
// R1 16) to leave slack for the loads, the 8-wide build's 16 registers hold 8 (R2 4, R1 8).
// Every element of C is the same chain of FMAs over p in order and one final
// alpha-multiply-add, whichever tile, edge or vector width computes it, so its bits depend
// neither on where the tile edges fall nor on the ISA level.
#define MK_GEMM_BODY(VT, W, R2, R1)                                                                                    \
    const int jm = w / (2 * W) * (2 * W), im = m / (R2) * (R2);                                                        \
    for (int i = 0; i < im; i += (R2)) {                                                                               \
        const float *a0 = a + i * ar;                                                                                  \
        float *c0 = c + i * ldc;                                                                                       \
        for (int j = 0; j < jm; j += 2 * W) {                                                                          \
            VT s[R2][2];                                                                                               \
            _Pragma("GCC unroll 16") for (int r = 0; r < (R2); r++) s[r][0] = s[r][1] = (VT){0};                       \
            const float *bp = b + j, *ap = a0;                                                                         \
            for (int p = 0; p < n; p++, bp += ldb, ap += ac) {                                                         \
                VT b0 = V_LD(VT, bp), b1 = V_LD(VT, bp + W);                                                           \
                _Pragma("GCC unroll 16") for (int r = 0; r < (R2); r++) {                                              \
                    float x = ap[r * ar];                                                                              \
                    s[r][0] += x * b0, s[r][1] += x * b1;                                                              \
                }                                                                                                      \
            }                                                                                                          \
            _Pragma("GCC unroll 16") for (int r = 0; r < (R2); r++) {                                                  \
                V_OUT(VT, W, c0 + r * ldc + j, s[r][0], W);                                                            \
                V_OUT(VT, W, c0 + r * ldc + j + W, s[r][1], W);                                                        \
            }                                                                                                          \
        }                                                                                                              \
    }                                                                                                                  \
    for (int j = jm; j < w; j += W) {                                                                                  \
        const int nw = w - j < W ? w - j : W;                                                                          \
        int i = 0;                                                                                                     \
        for (; i + (R1) <= m; i += (R1)) {                                                                             \
            VT s[R1];                                                                                                  \
            _Pragma("GCC unroll 16") for (int r = 0; r < (R1); r++) s[r] = (VT){0};                                    \
            const float *bp = b + j, *ap = a + i * ar;                                                                 \
            for (int p = 0; p < n; p++, bp += ldb, ap += ac) {                                                         \
                VT b0 = V_LDB(VT, W, bp, nw);                                                                          \
                _Pragma("GCC unroll 16") for (int r = 0; r < (R1); r++) s[r] += ap[r * ar] * b0;                       \
            }                                                                                                          \
            _Pragma("GCC unroll 16") for (int r = 0; r < (R1); r++) V_OUT(VT, W, c + (i + r) * ldc + j, s[r], nw);     \
        }                                                                                                              \
        for (; i < m; i++) {                                                                                           \
            VT s0 = {0};                                                                                               \
            const float *bp = b + j, *ap = a + i * ar;                                                                 \
            for (int p = 0; p < n; p++, bp += ldb, ap += ac) s0 += ap[0] * V_LDB(VT, W, bp, nw);                       \
            V_OUT(VT, W, c + i * ldc + j, s0, nw);                                                                     \
        }                                                                                                              \
    }                                                                                                                  \
    for (int i = im; i < m; i++)                                                                                       \
        for (int j = 0; j < jm; j += W) {                                                                              \
            VT s0 = {0};                                                                                               \
            const float *bp = b + j, *ap = a + i * ar;                                                                 \
            for (int p = 0; p < n; p++, bp += ldb, ap += ac) s0 += ap[0] * V_LD(VT, bp);                               \
            V_OUT(VT, W, c + i * ldc + j, s0, W);                                                                      \
        }

typedef float v8f __attribute__((vector_size(32)));
CPU_SIMD static void mk_gemm8(float *restrict c, long ldc, const float *restrict a, long ar, long ac,
                              const float *restrict b, long ldb, int m, int w, int n, float alpha, int acc) {
    MK_GEMM_BODY(v8f, 8, 4, 8)
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && !defined(TETRA_NO_CLONES)
#include <immintrin.h>
typedef float v16f __attribute__((vector_size(64)));
__attribute__((noinline, optimize("fp-contract=fast"), target("arch=x86-64-v4"))) static void
mk_gemm16(float *restrict c, long ldc, const float *restrict a, long ar, long ac, const float *restrict b, long ldb,
          int m, int w, int n, float alpha, int acc) {
    MK_GEMM_BODY(v16f, 16, 8, 8)
}
#define MK_HAVE_W16 1
#endif

// Vector width of the tile kernel: 16 where the CPU has x86-64-v4, else 8 (0 until the
// first call decides). Tests force 8 to compare the two. Set outside parallel regions.
static int mk_width = 0;
int cpu_attention_set_vector_width(int w) {
#ifdef MK_HAVE_W16
    int can16 = __builtin_cpu_supports("x86-64-v4");
#else
    int can16 = 0;
#endif
    mk_width = (w == 16 || w == 0) && can16 ? 16 : 8;
    return mk_width;
}

// f16(...) or f8(...), by the vector width chosen above
#ifdef MK_HAVE_W16
#define BY_WIDTH(f, ...) (mk_width == 16 ? f##16(__VA_ARGS__) : f##8(__VA_ARGS__))
#else
#define BY_WIDTH(f, ...) f##8(__VA_ARGS__)
#endif

static void mk_gemm(float *restrict c, long ldc, const float *restrict a, long ar, long ac, const float *restrict b,
                    long ldb, int m, int w, int n, float alpha, int acc) {
    BY_WIDTH(mk_gemm, c, ldc, a, ar, ac, b, ldb, m, w, n, alpha, acc);
}

// ----------------------------------------------------------------------------
// the softmax passes over a score tile

// A transposed tile holds a key per row and a query per column, so W queries are one
// vector: their running max and sum stay in registers while the pass walks the tile's
// keys, and the causal mask is a lane mask on the few keys a vector sees partly (all keys
// before them are visible to every lane, all keys after them to none). Written once for
// the two vector widths, with the exp of tetra_expf_softmax spelled out on vectors (the
// same operations, so the same bits at either width).
#define V_SEL(VT, IT, msk, x, y) ((VT)(((IT)(x) & (msk)) | ((IT)(y) & ~(msk))))
// e^r on the remainder r = x - fn ln2 (two-part ln2), tetra_exp_reduced's polynomial
#define V_EXP_REDUCED(VT, xc, fn)                                                                                      \
    __extension__({                                                                                                    \
        VT r_ = (xc) - (fn)*0.693359375f;                                                                              \
        r_ = r_ - (fn) * -2.12194440e-4f;                                                                              \
        VT p_ = (VT){} + 1.9875691500e-4f;                                                                             \
        p_ = p_ * r_ + 1.3981999507e-3f;                                                                               \
        p_ = p_ * r_ + 8.3334519073e-3f;                                                                               \
        p_ = p_ * r_ + 4.1665795894e-2f;                                                                               \
        p_ = p_ * r_ + 1.6666665459e-1f;                                                                               \
        p_ = p_ * r_ + 5.0000001201e-1f;                                                                               \
        p_ *r_ *r_ + r_ + 1.0f;                                                                                        \
    })
#define V_EXP_SM(VT, IT, x)                                                                                            \
    __extension__({                                                                                                    \
        VT xc_ = (x);                                                                                                  \
        xc_ = V_SEL(VT, IT, xc_ < -87.3f, (VT){} - 87.3f, xc_);                                                        \
        VT t_ = xc_ * 1.44269504088896341f;                                                                            \
        VT fn_ = (t_ + 12582912.0f) - 12582912.0f;                                                                     \
        IT n_ = __builtin_convertvector(fn_, IT);                                                                      \
        V_EXP_REDUCED(VT, xc_, fn_) * (VT)((n_ + 127) << 23);                                                          \
    })

// keys [0, lo) of a tile are visible to queries r0.. r0+W-1, keys [hi, cols) to none of
// them; key c in between is visible to lane q iff r0 + q >= c - nvis0 + 1
#define TILE_SPAN(W)                                                                                                   \
    int lo = cols, hi = cols;                                                                                          \
    if (causal) {                                                                                                      \
        lo = r0 + nvis0 < 0 ? 0 : (r0 + nvis0 > cols ? cols : r0 + nvis0);                                             \
        hi = r0 + (W)-1 + nvis0 < 0 ? 0 : (r0 + (W)-1 + nvis0 > cols ? cols : r0 + (W)-1 + nvis0);                     \
    }

// The document mask's lower bound (kfirst: each query's first visible key, in the key
// block's coordinates; NULL: none): key c is visible to lane q only if c >= lane_lo[q].
// Keys [fa, fe) pass both bounds in every lane (fa: the largest lower bound of the live
// lanes, which is the last one's, ids being nondecreasing); keys [0, fa) and [fe, hi)
// take the lane masks. Without a document mask fa = 0 and fe = lo, as before.
#define DOC_SPAN(IT, W)                                                                                                \
    IT lane_lo = (IT){} - (BK + 1);                                                                                    \
    int fa = 0;                                                                                                        \
    if (kfirst) {                                                                                                      \
        lane_lo = V_LD(IT, kfirst + r0) - j0;                                                                          \
        fa = kfirst[(rows - r0 < (W) ? rows : r0 + (W)) - 1] - j0;                                                     \
        fa = fa < 0 ? 0 : (fa > hi ? hi : fa);                                                                         \
    }                                                                                                                  \
    const int fe = fa > lo ? fa : lo;

// Online-softmax update of a transposed score tile ST [cols][rows] (ld BQ), in place to
// P^T. m, l: the running max and sum of each query; corr receives the factor that
// rescales each query's accumulator (1 when it had seen nothing or the max holds). Lanes
// past `rows` compute on whatever the buffers hold and are never read.
// keys [c0, c1) of the max pass that take the lane masks
#define FWD_MAX_MASKED(VT, IT, c0, c1)                                                                                 \
    for (int c = (c0); c < (c1); c++) {                                                                                \
        VT x = V_LD(VT, ST + (size_t)c * BQ + r0);                                                                     \
        mx = V_SEL(VT, IT, (x > mx) & (c <= lane) & (c >= lane_lo), x, mx);                                            \
    }
// keys [c0, c1) of the exp pass, with the lane masks (masked = 1) or visible to every lane
#define FWD_EXP_RANGE(VT, IT, VEXP, c0, c1, masked)                                                                    \
    for (int c = (c0); c < (c1); c++) {                                                                                \
        float *sp = ST + (size_t)c * BQ + r0;                                                                          \
        VT p = VEXP(VT, IT, V_LD(VT, sp) - mx);                                                                        \
        if (masked) p = V_SEL(VT, IT, (c <= lane) & (c >= lane_lo), p, (VT){});                                        \
        V_ST(VT, sp, p);                                                                                               \
        lv += p;                                                                                                       \
    }
#define FWD_TILE_BODY(VT, IT, W, VEXP)                                                                                 \
    IT iota = {0};                                                                                                     \
    for (int q = 0; q < (W); q++) iota[q] = q;                                                                         \
    for (int r0 = 0; r0 < rows; r0 += (W)) {                                                                           \
        TILE_SPAN(W)                                                                                                   \
        DOC_SPAN(IT, W)                                                                                                \
        const IT lane = iota + r0 + nvis0 - 1; /* key c is visible to the lanes with c <= lane */                      \
        /* the max in four independent chains (a max is exact in any order): one chain    \
           would wait out the compare's latency at every key */                            \
        VT m_old = V_LD(VT, m + r0), mx = m_old, mx1 = m_old, mx2 = m_old, mx3 = m_old;                                \
        int c4 = fa;                                                                                                   \
        for (; c4 + 4 <= fe; c4 += 4) {                                                                                \
            const float *sp = ST + (size_t)c4 * BQ + r0;                                                               \
            VT x0 = V_LD(VT, sp), x1 = V_LD(VT, sp + BQ);                                                              \
            VT x2 = V_LD(VT, sp + 2 * BQ), x3 = V_LD(VT, sp + 3 * BQ);                                                 \
            mx = V_SEL(VT, IT, x0 > mx, x0, mx);                                                                       \
            mx1 = V_SEL(VT, IT, x1 > mx1, x1, mx1);                                                                    \
            mx2 = V_SEL(VT, IT, x2 > mx2, x2, mx2);                                                                    \
            mx3 = V_SEL(VT, IT, x3 > mx3, x3, mx3);                                                                    \
        }                                                                                                              \
        mx = V_SEL(VT, IT, mx1 > mx, mx1, mx);                                                                         \
        mx2 = V_SEL(VT, IT, mx3 > mx2, mx3, mx2);                                                                      \
        mx = V_SEL(VT, IT, mx2 > mx, mx2, mx);                                                                         \
        for (int c = c4; c < fe; c++) {                                                                                \
            VT x = V_LD(VT, ST + (size_t)c * BQ + r0);                                                                 \
            mx = V_SEL(VT, IT, x > mx, x, mx);                                                                         \
        }                                                                                                              \
        FWD_MAX_MASKED(VT, IT, 0, fa)                                                                                  \
        FWD_MAX_MASKED(VT, IT, fe, hi)                                                                                 \
        /* a query that has seen no key yet keeps m = -inf, l = 0 and an empty accumulator */                          \
        VT cr = V_SEL(VT, IT, mx == -INFINITY, (VT){} + 1.0f, VEXP(VT, IT, m_old - mx));                               \
        VT lv = V_LD(VT, l + r0) * cr;                                                                                 \
        /* in key order, so the sum is the causal kernel's where there is no document mask */                          \
        FWD_EXP_RANGE(VT, IT, VEXP, 0, fa, 1)                                                                          \
        FWD_EXP_RANGE(VT, IT, VEXP, fa, fe, 0)                                                                         \
        FWD_EXP_RANGE(VT, IT, VEXP, fe, hi, 1)                                                                         \
        for (int c = hi; c < cols; c++) V_ST(VT, ST + (size_t)c * BQ + r0, (VT){});                                    \
        V_ST(VT, m + r0, mx);                                                                                          \
        V_ST(VT, l + r0, lv);                                                                                          \
        V_ST(VT, corr + r0, cr);                                                                                       \
    }

// A transposed tile pair in place: ST -> P^T = exp(S^T - lse), dPT -> dS^T = P^T (dP^T - Dv),
// both [cols][rows] (ld BQ); masked entries become 0, and so does P for a query that sees
// no key (lse = -inf). lse and Dv are read through a zero-padded copy past `rows`.
// keys [c0, c1) of a backward tile, with the lane masks (masked = 1) or visible to every lane
#define BWD_RANGE(VT, IT, VEXP, c0, c1, masked)                                                                        \
    for (int c = (c0); c < (c1); c++) {                                                                                \
        float *sp = ST + (size_t)c * BQ + r0, *dp = dPT + (size_t)c * BQ + r0;                                         \
        const IT in_ = masked ? (c <= lane) & (c >= lane_lo) : live;                                                   \
        VT p = V_SEL(VT, IT, live & in_, VEXP(VT, IT, V_LD(VT, sp) - L), (VT){});                                      \
        VT ds = p * (V_LD(VT, dp) - dvv);                                                                              \
        V_ST(VT, sp, p);                                                                                               \
        V_ST(VT, dp, masked ? V_SEL(VT, IT, in_, ds, (VT){}) : ds);                                                    \
    }
#define BWD_TILE_BODY(VT, IT, W, VEXP)                                                                                 \
    IT iota = {0};                                                                                                     \
    for (int q = 0; q < (W); q++) iota[q] = q;                                                                         \
    for (int r0 = 0; r0 < rows; r0 += (W)) {                                                                           \
        TILE_SPAN(W)                                                                                                   \
        DOC_SPAN(IT, W)                                                                                                \
        const IT lane = iota + r0 + nvis0 - 1;                                                                         \
        const int nw = rows - r0 < (W) ? rows - r0 : (W);                                                              \
        VT L = V_LDB(VT, W, lse + r0, nw), dvv = V_LDB(VT, W, dv + r0, nw);                                            \
        const IT live = L != -INFINITY;                                                                                \
        BWD_RANGE(VT, IT, VEXP, 0, fa, 1)                                                                              \
        BWD_RANGE(VT, IT, VEXP, fa, fe, 0)                                                                             \
        BWD_RANGE(VT, IT, VEXP, fe, hi, 1)                                                                             \
        for (int c = hi; c < cols; c++) {                                                                              \
            V_ST(VT, ST + (size_t)c * BQ + r0, (VT){});                                                                \
            V_ST(VT, dPT + (size_t)c * BQ + r0, (VT){});                                                               \
        }                                                                                                              \
    }

typedef int v8i __attribute__((vector_size(32)));
CPU_SIMD static void fwd_tile8(float *restrict ST, float *restrict m, float *restrict l, float *restrict corr, int rows,
                               int cols, int nvis0, int causal, const int *restrict kfirst,
                               int j0){FWD_TILE_BODY(v8f, v8i, 8, V_EXP_SM)} CPU_SIMD
    static void bwd_tile8(float *restrict ST, float *restrict dPT, const float *restrict lse, const float *restrict dv,
                          int rows, int cols, int nvis0, int causal, const int *restrict kfirst, int j0) {
    BWD_TILE_BODY(v8f, v8i, 8, V_EXP_SM)
}
#ifdef MK_HAVE_W16
typedef int v16i __attribute__((vector_size(64)));
// V_EXP_SM in AVX-512's own instructions, with the same bits: max(-87.3, x) is the clamp
// (NaN passes), roundscale to nearest even is the 1.5 * 2^23 rounding, and scalef is the
// exact multiply by 2^fn that the exponent-bits construction performs (fn in [-126, 127]).
// 13 operations a vector instead of 18: the exp is most of a softmax pass.
#define V_EXP_SM16(VT, IT, x)                                                                                          \
    __extension__({                                                                                                    \
        VT xc_ = (VT)_mm512_max_ps(_mm512_set1_ps(-87.3f), (__m512)(x));                                               \
        VT fn_ = (VT)_mm512_roundscale_ps((__m512)(xc_ * 1.44269504088896341f),                                        \
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                              \
        (VT) _mm512_scalef_ps((__m512)V_EXP_REDUCED(VT, xc_, fn_), (__m512)fn_);                                       \
    })
__attribute__((noinline, optimize("fp-contract=fast"), target("arch=x86-64-v4"))) static void
fwd_tile16(float *restrict ST, float *restrict m, float *restrict l, float *restrict corr, int rows, int cols,
           int nvis0, int causal, const int *restrict kfirst, int j0) {
    FWD_TILE_BODY(v16f, v16i, 16, V_EXP_SM16)
}
__attribute__((noinline, optimize("fp-contract=fast"), target("arch=x86-64-v4"))) static void
bwd_tile16(float *restrict ST, float *restrict dPT, const float *restrict lse, const float *restrict dv, int rows,
           int cols, int nvis0, int causal, const int *restrict kfirst, int j0) {
    BWD_TILE_BODY(v16f, v16i, 16, V_EXP_SM16)
}
#endif

static void fwd_tile_t(float *restrict ST, float *restrict m, float *restrict l, float *restrict corr, int rows,
                       int cols, int nvis0, int causal, const int *restrict kfirst, int j0) {
    BY_WIDTH(fwd_tile, ST, m, l, corr, rows, cols, nvis0, causal, kfirst, j0);
}

static void bwd_tile_t(float *restrict ST, float *restrict dPT, const float *restrict lse, const float *restrict dv,
                       int rows, int cols, int nvis0, int causal, const int *restrict kfirst, int j0) {
    BY_WIDTH(bwd_tile, ST, dPT, lse, dv, rows, cols, nvis0, causal, kfirst, j0);
}

// ----------------------------------------------------------------------------
// transposes between a block's rows [rows][D] (strided) and its transposed [D][BQ] form

#ifdef MK_HAVE_W16
// r[q] := column q of the 16 x 16 block held in r (row i in r[i])
__attribute__((always_inline, target("arch=x86-64-v4"))) static inline void tr16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int j = 0; j < 4; j++) {
        t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
        t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
        t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
        t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);
        r[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
        r[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xDD);
    }
}

// dst[c * ldd + r] = scale[c] src[r * lds + c] (scale NULL: 1, no multiply) for r < nr, c < nc
// (both <= 16), 16 x 16 in registers; with add, dst += instead of =. Each element is one
// multiply and one add at most, as in the scalar loops.
__attribute__((noinline, target("arch=x86-64-v4"))) static void tr_block16(float *restrict dst, long ldd,
                                                                           const float *restrict src, long lds,
                                                                           const float *restrict scale, int nr, int nc,
                                                                           int add) {
    const __mmask16 cm = (__mmask16)((1u << nc) - 1), rm = (__mmask16)((1u << nr) - 1);
    __m512 r[16];
    for (int i = 0; i < 16; i++) r[i] = i < nr ? _mm512_maskz_loadu_ps(cm, src + i * lds) : _mm512_setzero_ps();
    tr16(r);
    for (int c = 0; c < nc; c++) {
        __m512 x = scale ? _mm512_mul_ps(_mm512_set1_ps(scale[c]), r[c]) : r[c];
        if (add) x = _mm512_add_ps(_mm512_maskz_loadu_ps(rm, dst + c * ldd), x);
        _mm512_mask_storeu_ps(dst + c * ldd, rm, x);
    }
}
#endif

// dst[c][r] (ld ldd) = scale[c] src[r][c] (ld lds), or += with add; r < nr, c < nc
static void tr_rows(float *restrict dst, long ldd, const float *restrict src, long lds, const float *restrict scale,
                    int nr, int nc, int add) {
#ifdef MK_HAVE_W16
    if (mk_width == 16) {
        for (int r0 = 0; r0 < nr; r0 += 16)
            for (int c0 = 0; c0 < nc; c0 += 16)
                tr_block16(dst + c0 * ldd + r0, ldd, src + r0 * lds + c0, lds, scale ? scale + c0 : NULL,
                           nr - r0 < 16 ? nr - r0 : 16, nc - c0 < 16 ? nc - c0 : 16, add);
        return;
    }
#endif
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) {
            float x = scale ? scale[c] * src[r * lds + c] : src[r * lds + c];
            dst[c * ldd + r] = add ? dst[c * ldd + r] + x : x;
        }
}

// dst[r][:] = x[r][:] for rows of x strided by ldx, dst contiguous [rows][d] (a head's row
// is 64 bytes at head_dim 16: a vector copy, where a memcpy call per row cost more; GCC
// would turn the inner loop back into that call)
CPU_SIMD __attribute__((optimize("no-tree-loop-distribute-patterns"))) static void
copy_rows_k(float *restrict dst, const float *restrict x, long ldx, int rows, int d) {
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < d; j++) dst[(size_t)r * d + j] = x[r * ldx + j];
}

// xt[d][r] = x[r][d] for a block of rows (row stride ldx), leading dimension BQ; and,
// when xp is given, the rows themselves contiguous [rows][d].
static void pack_rows(float *restrict xt, float *restrict xp, const float *restrict x, long ldx, int rows, int d) {
    tr_rows(xt, BQ, x, ldx, NULL, rows, d, 0);
    if (xp) copy_rows_k(xp, x, ldx, rows, d);
}

// y[r][:] += x[r][:] for rows of y strided by ldy, x contiguous [rows][d]
CPU_SIMD static void add_rows_k(float *restrict y, long ldy, const float *restrict x, int rows, int d) {
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < d; j++) y[r * ldy + j] += x[(size_t)r * d + j];
}

// ----------------------------------------------------------------------------
// workspace

// Per-thread buffers, taken from the C heap on entering a parallel region rather than
// from cpu_alloc: they are temporaries of one call, not backend buffers, so they stay out
// of the memory accounting, keep working once memory is frozen, and leave the caller's
// workspace independent of the thread count. Each holds the score tiles and packs of the
// current query block (tiles()) and the contiguous copy of one kv head's keys and values
// (kv_floats(): linear in the sequence, never S^2).
typedef struct {
    float *ST, *dPT;     // score tiles [BK][BQ]
    float *QT, *dOT;     // the query block's Q^T, dO^T [D][BQ]
    float *Qp, *dOp;     // its Q and dO rows, contiguous [BQ][D] (backward)
    float *dQp;          // its dQ, transposed [D][BQ] (backward)
    float *acc;          // output accumulator, transposed [D][BQ] (forward)
    float *m, *l, *corr; // per-query statistics [BQ] (forward)
    int *kfirst;         // each query's first visible key under the document mask [BQ]
    float *Kp, *Vp;      // the kv head's K, V rows, contiguous [Sk][D]
    float *dKp, *dVp;    // their gradients (backward)
} attn_bufs;

static size_t align16(size_t n) { return (n + 15) / 16 * 16; }

static attn_bufs bufs_alloc(int d, int sk, int backward) {
    size_t tile = align16((size_t)BK * BQ), blk = align16((size_t)BQ * d), vec = align16(BQ);
    size_t kv = align16((size_t)sk * d);
    size_t n = 2 * tile + 6 * blk + 4 * vec + (backward ? 4 : 2) * kv;
    float *p = NULL;
    if (posix_memalign((void **)&p, 64, n * sizeof(float)) != 0) abort();
    // tiles, packs and statistics start as zeros: the softmax passes compute whole vectors,
    // and lanes past a block's last query must hold numbers (not uninitialised bits)
    memset(p, 0, (n - (backward ? 4 : 2) * kv) * sizeof(float));
    attn_bufs t;
    t.ST = p, p += tile;
    t.dPT = p, p += tile;
    t.QT = p, p += blk;
    t.dOT = p, p += blk;
    t.Qp = p, p += blk;
    t.dOp = p, p += blk;
    t.dQp = p, p += blk;
    t.acc = p, p += blk;
    t.m = p, p += vec;
    t.l = p, p += vec;
    t.corr = p, p += vec;
    t.kfirst = (int *)p, p += vec; // an int is a float's size
    t.Kp = p, p += kv;
    t.Vp = p, p += kv;
    t.dKp = backward ? p : NULL, p += backward ? kv : 0;
    t.dVp = backward ? p : NULL;
    return t;
}

// rows [j, n) of kv head g of batch b, contiguous [n][D] (rows before j are not written)
static void pack_kv(float *restrict dst, const float *restrict x, const ops_attn_shape *s, int b, int g, int j, int n) {
    if (n <= j) return;
    const long ld = (long)s->kv * s->d;
    copy_rows_k(dst + (size_t)j * s->d, x + ((size_t)b * s->sk * s->kv + g) * s->d + j * ld, ld, n - j, s->d);
}

// The workspace holds the backward's row term rowsum(dout * out), [B, H, Sq]: linear in
// the sequence length, never S^2. The forward needs none.
size_t cpu_attention_workspace_size(const ops_attn_shape *s) {
    return align16((size_t)s->b * s->h * s->sq) * sizeof(float) + 64;
}

// Backward schedule: 0 = automatic, 1 = fused, 2 = split (tests force each one).
static int attn_bwd_mode = 0;
void cpu_attention_set_backward_mode(int mode) { attn_bwd_mode = mode; }

// number of keys visible to query row i (global positions; causal), clamped to [0, sk]
static inline int visible_keys(const ops_attn_shape *s, int i) {
    if (!s->causal) return s->sk;
    long long n = (long long)s->q_offset - s->k_offset + i + 1;
    return n < 0 ? 0 : (n > s->sk ? s->sk : (int)n);
}

// Keys of the tile at j0 that query row 0 of the block at i0 sees; query r sees nvis0 + r
// of them (causal), so key c is visible to queries r >= c - nvis0 + 1. Clamped to
// [-BQ, cols], which keeps that bound in range.
static inline int tile_nvis0(const ops_attn_shape *s, long long delta, int i0, int j0, int cols) {
    long long nv0 = s->causal ? delta + i0 + 1 - j0 : cols;
    return nv0 < -BQ ? -BQ : (nv0 > cols ? cols : (int)nv0);
}

// The keys query block [i0, i0 + rows) of sequence b sees: [*kbeg, return value). Under a
// document mask kfirst[r] gets row r's first visible key (its document's start; rows past
// `rows` repeat the last one's, so every vector lane reads a bound) and *kbeg the first
// row's, the smallest; the scan is O(BQ) after one binary search. Without one *kbeg = 0
// and kfirst is not touched.
static int block_keys(const ops_attn_shape *s, int b, int i0, int rows, int *kfirst, int *kbeg) {
    const int kend = visible_keys(s, i0 + rows - 1);
    *kbeg = 0;
    if (!s->doc) return kend;
    const int32_t *doc = s->doc + (size_t)b * s->doc_len;
    int f = ops_doc_key_begin(s, b, i0);
    kfirst[0] = f;
    for (int r = 1; r < BQ; r++) {
        const int p = s->q_offset + i0 + r;
        if (r < rows && doc[p] != doc[p - 1]) {
            long long j = (long long)p - s->k_offset;
            f = j < 0 ? 0 : (j > s->sk ? s->sk : (int)j);
        }
        kfirst[r] = f;
    }
    *kbeg = kfirst[0];
    return kend;
}

// the document mask needs the causal one (ops.h)
static void check_doc(const ops_attn_shape *s) {
    if (s->doc && (!s->causal || s->q_offset + s->sq > s->doc_len || s->k_offset + s->sk > s->doc_len)) {
        fprintf(stderr,
                "[tetra] cpu attention: a document mask needs causal = 1 and the rows inside doc_len "
                "(causal %d, q %d+%d, k %d+%d, doc_len %d)\n",
                s->causal, s->q_offset, s->sq, s->k_offset, s->sk, s->doc_len);
        abort();
    }
}

// ----------------------------------------------------------------------------
// forward

// accT[d][r] *= corr[r]: the accumulator is transposed ([D][BQ]), so a query's factor is a
// lane of every row (multiplying by 1 changes nothing, so no row is skipped)
CPU_SIMD static void scale_cols_k(float *restrict accT, const float *restrict corr, int rows, int d) {
    for (int j = 0; j < d; j++)
        for (int r = 0; r < rows; r++) accT[(size_t)j * BQ + r] *= corr[r];
}

// out = acc / l (transposed back to rows), lse = m + log l; a row that saw no key gets 0
// and -inf (it contributes nothing when merged). inv is scratch [BQ].
static void fwd_finish(float *restrict out, int ldo, float *restrict lse, const float *restrict accT,
                       const float *restrict m, const float *restrict l, float *restrict inv, int rows, int d) {
    for (int r = 0; r < rows; r++) {
        inv[r] = l[r] == 0.0f ? 0.0f : 1.0f / l[r];
        lse[r] = l[r] == 0.0f ? -INFINITY : m[r] + logf(l[r]);
    }
    tr_rows(out, ldo, accT, BQ, inv, d, rows, 0); // out[r][j] = inv[r] accT[j][r]
    for (int r = 0; r < rows; r++)
        if (l[r] == 0.0f) memset(out + (size_t)r * ldo, 0, (size_t)d * sizeof(float));
}

// Tasks of a pass over (batch, kv head): each takes a range of query blocks, and there
// are about 4 per thread when B*KV alone would leave threads idle.
static int query_chunks(int groups, int nqb) {
    int nt = omp_get_max_threads();
    int c = (4 * nt + groups - 1) / groups;
    return c < 1 ? 1 : (c > nqb ? nqb : c);
}

void cpu_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                           const ops_attn_shape *s, void *workspace) {
    const int B = s->b, Sq = s->sq, Sk = s->sk, H = s->h, KV = s->kv, D = s->d;
    const int rep = H / KV;
    const long ldq = (long)H * D;
    const long long delta = (long long)s->q_offset - s->k_offset;
    (void)workspace;
    check_doc(s);
    if (!mk_width) cpu_attention_set_vector_width(0);
    const int nqb = (Sq + BQ - 1) / BQ, groups = B * KV;
    const int nch = query_chunks(groups, nqb), per = (nqb + nch - 1) / nch;
    const long long ntasks = (long long)groups * nch;

#pragma omp parallel
    {
        attn_bufs t = bufs_alloc(D, Sk, 0);
#pragma omp for schedule(dynamic, 1)
        for (long long task = 0; task < ntasks; task++) {
            // heaviest (latest) query blocks first: they see the most keys under the causal mask
            int ch = nch - 1 - (int)(task / groups), bg = (int)(task % groups);
            int b = bg / KV, g = bg % KV;
            int qb0 = ch * per, qb1 = qb0 + per < nqb ? qb0 + per : nqb;
            if (qb0 >= qb1) continue;
            int nk = visible_keys(s, (qb1 * BQ < Sq ? qb1 * BQ : Sq) - 1); // keys the chunk sees
            int kb0 = ops_doc_key_begin(s, b, qb0 * BQ) / BK * BK;         // and the first tile of them
            pack_kv(t.Kp, k, s, b, g, kb0, nk);
            pack_kv(t.Vp, v, s, b, g, kb0, nk);
            for (int qb = qb0; qb < qb1; qb++) {
                int i0 = qb * BQ, rows = Sq - i0 < BQ ? Sq - i0 : BQ, kbeg;
                int kend = block_keys(s, b, i0, rows, t.kfirst, &kbeg); // keys any row of this block can see
                const int *kf = s->doc ? t.kfirst : NULL;
                for (int h = g * rep; h < (g + 1) * rep; h++) {
                    pack_rows(t.QT, NULL, q + ((size_t)(b * Sq + i0) * H + h) * D, ldq, rows, D);
                    for (int r = 0; r < rows; r++) t.m[r] = -INFINITY, t.l[r] = 0.0f;
                    memset(t.acc, 0, (size_t)D * BQ * sizeof(float));
                    // tiles on the BK grid (the backward's), from the first one a row's document reaches
                    for (int j0 = kbeg / BK * BK; j0 < kend; j0 += BK) {
                        int cols = kend - j0 < BK ? kend - j0 : BK;
                        // S^T = scale K_blk Q_blk^T
                        mk_gemm(t.ST, BQ, t.Kp + (size_t)j0 * D, D, 1, t.QT, BQ, cols, rows, D, s->scale, 0);
                        fwd_tile_t(t.ST, t.m, t.l, t.corr, rows, cols, tile_nvis0(s, delta, i0, j0, cols), s->causal,
                                   kf, j0);
                        scale_cols_k(t.acc, t.corr, rows, D);
                        // acc^T += V_blk^T P^T: the tile is P^T already, and a tile of the
                        // transposed product is D x BQ, wide enough for full register tiles
                        mk_gemm(t.acc, BQ, t.Vp + (size_t)j0 * D, 1, D, t.ST, BQ, D, rows, cols, 1.0f, 1);
                    }
                    fwd_finish(out + ((size_t)(b * Sq + i0) * H + h) * D, (int)ldq, lse + (size_t)(b * H + h) * Sq + i0,
                               t.acc, t.m, t.l, t.corr, rows, D);
                }
            }
        }
        free(t.ST);
    }
}

// ----------------------------------------------------------------------------
// backward

// Dv[b, h, i] = sum_d dout * out (the softmax-backward row term), one pass over rows.
CPU_SIMD static void rowdot_k(float *restrict dst, const float *restrict a, const float *restrict o, int d) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int j = 0; j < d; j++) acc += a[j] * o[j];
    *dst = acc;
}

// The tile pair of a (query block, key block): ST = scale K_blk Q_blk^T -> P^T and
// dPT = V_blk dO_blk^T -> dS^T, from the block's packed Q^T, dO^T in t and key/value rows
// at kb, vb (row stride ldkv); li indexes the block's first query in lse and Dv.
static void bwd_tile(const ops_attn_shape *s, attn_bufs *t, const float *kb, const float *vb, long ldkv,
                     const float *lse, const float *Dv, int rows, int cols, int nvis0, int j0) {
    mk_gemm(t->ST, BQ, kb, ldkv, 1, t->QT, BQ, cols, rows, s->d, s->scale, 0);
    mk_gemm(t->dPT, BQ, vb, ldkv, 1, t->dOT, BQ, cols, rows, s->d, 1.0f, 0);
    bwd_tile_t(t->ST, t->dPT, lse, Dv, rows, cols, nvis0, s->causal, s->doc ? t->kfirst : NULL, j0);
}

// first query row that sees key j0 (0 without the causal mask), clamped to [0, sq]
static int first_query(const ops_attn_shape *s, long long delta, int j0) {
    if (!s->causal) return 0;
    long long i = (long long)j0 - delta;
    return i < 0 ? 0 : (i > s->sq ? s->sq : (int)i);
}

void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                            const float *v, const float *out, const float *lse, const ops_attn_shape *s,
                            void *workspace) {
    const int B = s->b, Sq = s->sq, Sk = s->sk, H = s->h, KV = s->kv, D = s->d;
    const int rep = H / KV;
    float *Dv = (float *)workspace;
    check_doc(s);
    if (!mk_width) cpu_attention_set_vector_width(0);
    float *owned = NULL;
    if (!Dv) {
        owned = (float *)malloc(cpu_attention_workspace_size(s));
        if (!owned) abort();
        Dv = owned;
    }
    const long ldq = (long)H * D, ldk = (long)KV * D;
    const long long delta = (long long)s->q_offset - s->k_offset;

    // 1. Dv = rowsum(dout * out), stored [B, H, Sq]
    const long long nrows = (long long)B * Sq * H;
#pragma omp parallel for schedule(static) if (nrows * D > CPU_CHUNK)
    for (long long r = 0; r < nrows; r++) {
        int h = (int)(r % H);
        long long bi = r / H;
        int i = (int)(bi % Sq), b = (int)(bi / Sq);
        rowdot_k(Dv + (size_t)(b * H + h) * Sq + i, dout + (size_t)r * D, out + (size_t)r * D, D);
    }

    const int nqb = (Sq + BQ - 1) / BQ, nkb = (Sk + BK - 1) / BK;
    const int groups = B * KV;
    int mode = attn_bwd_mode;
    const int nthreads = omp_get_max_threads();
    if (mode == 0) mode = (groups % nthreads == 0 || groups >= 4 * nthreads) ? 1 : 2;

    if (mode == 1) {
        // 2a. fused: one task per (batch, kv head), on contiguous copies of its K and V and
        // of each query block's Q, dO; dK, dV and dQ summed there and added once
#pragma omp parallel
        {
            attn_bufs t = bufs_alloc(D, Sk, 1);
#pragma omp for schedule(dynamic, 1)
            for (int task = 0; task < groups; task++) {
                int b = task / KV, g = task % KV;
                int nk = visible_keys(s, Sq - 1), kb0 = ops_doc_key_begin(s, b, 0) / BK * BK;
                if (kb0 > nk) kb0 = nk;
                pack_kv(t.Kp, k, s, b, g, kb0, nk);
                pack_kv(t.Vp, v, s, b, g, kb0, nk);
                memset(t.dKp + (size_t)kb0 * D, 0, (size_t)(nk - kb0) * D * sizeof(float));
                memset(t.dVp + (size_t)kb0 * D, 0, (size_t)(nk - kb0) * D * sizeof(float));
                for (int i0 = 0; i0 < Sq; i0 += BQ) {
                    int rows = Sq - i0 < BQ ? Sq - i0 : BQ, kbeg;
                    int kend = block_keys(s, b, i0, rows, t.kfirst, &kbeg);
                    if (kend <= kbeg) continue;
                    for (int h = g * rep; h < (g + 1) * rep; h++) {
                        size_t qoff = ((size_t)(b * Sq + i0) * H + h) * D, li = (size_t)(b * H + h) * Sq + i0;
                        pack_rows(t.QT, t.Qp, q + qoff, ldq, rows, D);
                        pack_rows(t.dOT, t.dOp, dout + qoff, ldq, rows, D);
                        memset(t.dQp, 0, (size_t)D * BQ * sizeof(float));
                        for (int j0 = kbeg / BK * BK; j0 < kend; j0 += BK) {
                            int cols = kend - j0 < BK ? kend - j0 : BK;
                            float *kb = t.Kp + (size_t)j0 * D, *vb = t.Vp + (size_t)j0 * D;
                            bwd_tile(s, &t, kb, vb, D, lse + li, Dv + li, rows, cols,
                                     tile_nvis0(s, delta, i0, j0, cols), j0);
                            // dV_blk += P^T dO ; dK_blk += scale dS^T Q ; dQ_blk += scale dS K_blk
                            mk_gemm(t.dVp + (size_t)j0 * D, D, t.ST, BQ, 1, t.dOp, D, cols, D, rows, 1.0f, 1);
                            mk_gemm(t.dKp + (size_t)j0 * D, D, t.dPT, BQ, 1, t.Qp, D, cols, D, rows, s->scale, 1);
                            mk_gemm(t.dQp, BQ, kb, 1, D, t.dPT, BQ, D, rows, cols, s->scale, 1); // dQ^T
                        }
                        tr_rows(dq + qoff, ldq, t.dQp, BQ, NULL, D, rows, 1);
                    }
                }
                size_t koff = ((size_t)(b * Sk + kb0) * KV + g) * D;
                add_rows_k(dk + koff, ldk, t.dKp + (size_t)kb0 * D, nk - kb0, D);
                add_rows_k(dv + koff, ldk, t.dVp + (size_t)kb0 * D, nk - kb0, D);
            }
            free(t.ST);
        }
    } else {
        // 2b. split, pass 1: dQ per (batch, head, query block), heaviest first
        const long long nt1 = (long long)B * H * nqb;
#pragma omp parallel
        {
            attn_bufs t = bufs_alloc(D, 0, 0);
#pragma omp for schedule(dynamic, 1)
            for (long long task = 0; task < nt1; task++) {
                int qb = nqb - 1 - (int)(task / (B * H));
                int bh = (int)(task % (B * H)), b = bh / H, h = bh % H, g = h / rep;
                int i0 = qb * BQ, rows = Sq - i0 < BQ ? Sq - i0 : BQ, kbeg;
                int kend = block_keys(s, b, i0, rows, t.kfirst, &kbeg);
                if (kend <= kbeg) continue;
                size_t qoff = ((size_t)(b * Sq + i0) * H + h) * D, li = (size_t)(b * H + h) * Sq + i0;
                pack_rows(t.QT, NULL, q + qoff, ldq, rows, D);
                pack_rows(t.dOT, NULL, dout + qoff, ldq, rows, D);
                for (int j0 = kbeg / BK * BK; j0 < kend; j0 += BK) {
                    int cols = kend - j0 < BK ? kend - j0 : BK;
                    size_t koff = ((size_t)(b * Sk + j0) * KV + g) * D;
                    bwd_tile(s, &t, k + koff, v + koff, ldk, lse + li, Dv + li, rows, cols,
                             tile_nvis0(s, delta, i0, j0, cols), j0);
                    mk_gemm(dq + qoff, ldq, t.dPT, 1, BQ, k + koff, ldk, rows, D, cols, s->scale, 1);
                }
            }
            free(t.ST);
        }
        // pass 2: dK, dV per (batch, kv head, key block), heaviest (earliest) first
        const long long nt2 = (long long)B * KV * nkb;
#pragma omp parallel
        {
            attn_bufs t = bufs_alloc(D, 0, 0);
#pragma omp for schedule(dynamic, 1)
            for (long long task = 0; task < nt2; task++) {
                int kb = (int)(task / groups);
                int bg = (int)(task % groups), b = bg / KV, g = bg % KV;
                int j0 = kb * BK, cols = Sk - j0 < BK ? Sk - j0 : BK;
                size_t koff = ((size_t)(b * Sk + j0) * KV + g) * D;
                // queries from the first that sees key j0 to the last whose document holds a key of the block
                const int qend = ops_doc_query_end(s, b, j0 + cols - 1);
                for (int i0 = first_query(s, delta, j0) / BQ * BQ; i0 < qend; i0 += BQ) {
                    int rows = Sq - i0 < BQ ? Sq - i0 : BQ, kbeg;
                    int kend = block_keys(s, b, i0, rows, t.kfirst, &kbeg);
                    if (kend <= j0 || kbeg >= j0 + cols) continue; // no row of the block sees a key of the tile
                    for (int h = g * rep; h < (g + 1) * rep; h++) {
                        size_t qoff = ((size_t)(b * Sq + i0) * H + h) * D, li = (size_t)(b * H + h) * Sq + i0;
                        pack_rows(t.QT, NULL, q + qoff, ldq, rows, D);
                        pack_rows(t.dOT, NULL, dout + qoff, ldq, rows, D);
                        bwd_tile(s, &t, k + koff, v + koff, ldk, lse + li, Dv + li, rows, cols,
                                 tile_nvis0(s, delta, i0, j0, cols), j0);
                        mk_gemm(dv + koff, ldk, t.ST, BQ, 1, dout + qoff, ldq, cols, D, rows, 1.0f, 1);
                        mk_gemm(dk + koff, ldk, t.dPT, BQ, 1, q + qoff, ldq, cols, D, rows, s->scale, 1);
                    }
                }
            }
            free(t.ST);
        }
    }
    free(owned);
}

// ----------------------------------------------------------------------------
// merge of two partial results over disjoint key sets (ring attention)

void cpu_attention_merge(float *out, float *lse, const float *out_blk, const float *lse_blk, int b, int sq, int h,
                         int d) {
    const long long nrows = (long long)b * sq * h;
#pragma omp parallel for schedule(static) if (nrows * d > CPU_CHUNK)
    for (long long r = 0; r < nrows; r++) {
        int hh = (int)(r % h);
        long long bi = r / h;
        int i = (int)(bi % sq), bb = (int)(bi / sq);
        size_t li = (size_t)(bb * h + hh) * sq + i;
        float la = lse[li], lb = lse_blk[li];
        float *o = out + (size_t)r * d;
        const float *ob = out_blk + (size_t)r * d;
        if (lb == -INFINITY) continue; // the block saw no key for this row
        if (la == -INFINITY) {
            memcpy(o, ob, (size_t)d * sizeof(float));
            lse[li] = lb;
            continue;
        }
        float mx = la > lb ? la : lb;
        float lnew = mx + log1pf(expf(-fabsf(la - lb)));
        float wa = expf(la - lnew), wb = expf(lb - lnew);
        for (int j = 0; j < d; j++) o[j] = wa * o[j] + wb * ob[j];
        lse[li] = lnew;
    }
}
