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
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
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
#define V_LD(VT, p)                              \
    __extension__({                              \
        VT vl_;                                  \
        __builtin_memcpy(&vl_, (p), sizeof vl_); \
        vl_;                                     \
    })
#define V_ST(VT, p, x)                           \
    do {                                         \
        VT vs_ = (x);                            \
        __builtin_memcpy((p), &vs_, sizeof vs_); \
    } while (0)
// C := alpha S + (C or 0), on W columns or the last nw < W through a zero-padded copy.
// alpha S is rounded on its own before the add: whether a compiler would fuse the two
// depends on the code around them (it differs between the widths under ASan), and the
// kernels of both widths must give the same bits.
#define V_OUT(VT, W, cp, s, nw)                                                          \
    do {                                                                                 \
        float *cp_ = (cp), t_[W] = {0};                                                  \
        VT cv_ = {0};                                                                    \
        if (acc) {                                                                       \
            if ((nw) == (W)) {                                                           \
                cv_ = V_LD(VT, cp_);                                                     \
            } else {                                                                     \
                __builtin_memcpy(t_, cp_, (size_t)(nw) * sizeof(float));                 \
                cv_ = V_LD(VT, t_);                                                      \
            }                                                                            \
        }                                                                                \
        VT r_ = alpha * (s);                                                             \
        __asm__("" : "+m"(r_)); /* no fusion with the add below */                       \
        r_ += cv_;                                                                       \
        if ((nw) == (W)) {                                                               \
            V_ST(VT, cp_, r_);                                                           \
        } else {                                                                         \
            V_ST(VT, t_, r_);                                                            \
            __builtin_memcpy(cp_, t_, (size_t)(nw) * sizeof(float));                     \
        }                                                                                \
    } while (0)
// B's W columns at bp, or its last nw < W zero-padded
#define V_LDB(VT, W, bp, nw)                                                             \
    __extension__({                                                                      \
        float tb_[W] = {0};                                                              \
        (nw) == (W) ? V_LD(VT, bp)                                                       \
                    : (__builtin_memcpy(tb_, (bp), (size_t)(nw) * sizeof(float)), V_LD(VT, tb_)); \
    })

// C[m, w] = alpha A B (+ C when acc): A(i, p) = a[i ar + p ac] at any strides, B row-major
// [n, w] with leading dimension ldb. Register tiles of 4 rows x 2W columns (8 vector
// accumulators; B's two vectors loaded once per p for the 4 rows); columns past the last
// 2W run as tiles of 8 rows x W (the head_dim-wide products at head_dim 16 on AVX-512),
// the last of them zero-padded; rows past the last 4 one at a time. Every element of C is
// the same chain of FMAs over p in order and one final alpha-multiply-add, whichever tile,
// edge or vector width computes it, so its bits depend neither on where the tile edges
// fall nor on the ISA level.
#define MK_GEMM_BODY(VT, W)                                                                       \
    const int jm = w / (2 * W) * (2 * W), im = m / 4 * 4;                                        \
    for (int i = 0; i < im; i += 4) {                                                             \
        const float *a0 = a + i * ar;                                                             \
        float *c0 = c + i * ldc;                                                                  \
        for (int j = 0; j < jm; j += 2 * W) {                                                     \
            VT s00 = {0}, s01 = {0}, s10 = {0}, s11 = {0}, s20 = {0}, s21 = {0}, s30 = {0}, s31 = {0}; \
            const float *bp = b + j, *ap = a0;                                                    \
            for (int p = 0; p < n; p++, bp += ldb, ap += ac) {                                    \
                VT b0 = V_LD(VT, bp), b1 = V_LD(VT, bp + W);                                      \
                float x;                                                                          \
                x = ap[0], s00 += x * b0, s01 += x * b1;                                          \
                x = ap[ar], s10 += x * b0, s11 += x * b1;                                         \
                x = ap[2 * ar], s20 += x * b0, s21 += x * b1;                                     \
                x = ap[3 * ar], s30 += x * b0, s31 += x * b1;                                     \
            }                                                                                     \
            V_OUT(VT, W, c0 + j, s00, W);                                                         \
            V_OUT(VT, W, c0 + j + W, s01, W);                                                     \
            V_OUT(VT, W, c0 + ldc + j, s10, W);                                                   \
            V_OUT(VT, W, c0 + ldc + j + W, s11, W);                                               \
            V_OUT(VT, W, c0 + 2 * ldc + j, s20, W);                                               \
            V_OUT(VT, W, c0 + 2 * ldc + j + W, s21, W);                                           \
            V_OUT(VT, W, c0 + 3 * ldc + j, s30, W);                                               \
            V_OUT(VT, W, c0 + 3 * ldc + j + W, s31, W);                                           \
        }                                                                                         \
    }                                                                                             \
    for (int j = jm; j < w; j += W) {                                                             \
        const int nw = w - j < W ? w - j : W;                                                     \
        int i = 0;                                                                                \
        for (; i + 8 <= m; i += 8) {                                                              \
            VT s[8] = {{0}};                                                                      \
            const float *bp = b + j, *ap = a + i * ar;                                            \
            for (int p = 0; p < n; p++, bp += ldb, ap += ac) {                                    \
                VT b0 = V_LDB(VT, W, bp, nw);                                                     \
                for (int r = 0; r < 8; r++) s[r] += ap[r * ar] * b0;                              \
            }                                                                                     \
            for (int r = 0; r < 8; r++) V_OUT(VT, W, c + (i + r) * ldc + j, s[r], nw);            \
        }                                                                                         \
        for (; i < m; i++) {                                                                      \
            VT s0 = {0};                                                                          \
            const float *bp = b + j, *ap = a + i * ar;                                            \
            for (int p = 0; p < n; p++, bp += ldb, ap += ac) s0 += ap[0] * V_LDB(VT, W, bp, nw);  \
            V_OUT(VT, W, c + i * ldc + j, s0, nw);                                                \
        }                                                                                         \
    }                                                                                             \
    for (int i = im; i < m; i++)                                                                  \
        for (int j = 0; j < jm; j += W) {                                                         \
            VT s0 = {0};                                                                          \
            const float *bp = b + j, *ap = a + i * ar;                                            \
            for (int p = 0; p < n; p++, bp += ldb, ap += ac) s0 += ap[0] * V_LD(VT, bp);          \
            V_OUT(VT, W, c + i * ldc + j, s0, W);                                                 \
        }

typedef float v8f __attribute__((vector_size(32)));
CPU_SIMD static void mk_gemm8(float *restrict c, long ldc, const float *restrict a, long ar, long ac,
                              const float *restrict b, long ldb, int m, int w, int n, float alpha, int acc) {
    MK_GEMM_BODY(v8f, 8)
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(TETRA_NO_CLONES)
typedef float v16f __attribute__((vector_size(64)));
__attribute__((noinline, optimize("fp-contract=fast"), target("arch=x86-64-v4"))) static void mk_gemm16(
    float *restrict c, long ldc, const float *restrict a, long ar, long ac, const float *restrict b, long ldb, int m,
    int w, int n, float alpha, int acc) {
    MK_GEMM_BODY(v16f, 16)
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

static void mk_gemm(float *restrict c, long ldc, const float *restrict a, long ar, long ac,
                    const float *restrict b, long ldb, int m, int w, int n, float alpha, int acc) {
#ifdef MK_HAVE_W16
    if (mk_width == 16) {
        mk_gemm16(c, ldc, a, ar, ac, b, ldb, m, w, n, alpha, acc);
        return;
    }
#endif
    mk_gemm8(c, ldc, a, ar, ac, b, ldb, m, w, n, alpha, acc);
}

// xt[d][r] = x[r][d] for a block of rows (row stride ldx), leading dimension BQ; and,
// when xp is given, the rows themselves contiguous [rows][d].
static void pack_rows(float *restrict xt, float *restrict xp, const float *restrict x, long ldx, int rows, int d) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        for (int j = 0; j < d; j++) xt[(size_t)j * BQ + r] = xr[j];
        if (xp) memcpy(xp + (size_t)r * d, xr, (size_t)d * sizeof(float));
    }
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
    float *ST, *dPT;        // score tiles [BK][BQ]
    float *QT, *dOT;        // the query block's Q^T, dO^T [D][BQ]
    float *Qp, *dOp, *dQp;  // its Q, dO and dQ rows, contiguous [BQ][D] (backward)
    float *acc;             // output accumulator [BQ][D] (forward)
    float *m, *l, *corr, *mx;  // per-query statistics [BQ] (forward)
    float *Kp, *Vp;         // the kv head's K, V rows, contiguous [Sk][D]
    float *dKp, *dVp;       // their gradients (backward)
} attn_bufs;

static size_t align16(size_t n) { return (n + 15) / 16 * 16; }

static attn_bufs bufs_alloc(int d, int sk, int backward) {
    size_t tile = align16((size_t)BK * BQ), blk = align16((size_t)BQ * d), vec = align16(BQ);
    size_t kv = align16((size_t)sk * d);
    size_t n = 2 * tile + 6 * blk + 4 * vec + (backward ? 4 : 2) * kv;
    float *p = NULL;
    if (posix_memalign((void **)&p, 64, n * sizeof(float)) != 0) abort();
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
    t.mx = p, p += vec;
    t.Kp = p, p += kv;
    t.Vp = p, p += kv;
    t.dKp = backward ? p : NULL, p += backward ? kv : 0;
    t.dVp = backward ? p : NULL;
    return t;
}

// rows [0, n) of kv head g of batch b, contiguous [n][D]
static void pack_kv(float *restrict dst, const float *restrict x, const ops_attn_shape *s, int b, int g, int n) {
    const float *src = x + ((size_t)b * s->sk * s->kv + g) * s->d;
    for (int j = 0; j < n; j++) memcpy(dst + (size_t)j * s->d, src + (size_t)j * s->kv * s->d, (size_t)s->d * 4);
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

// first query row of the tile that sees key c
static inline int first_visible(int c, int nvis0, int rows, int causal) {
    int r0 = causal ? c - nvis0 + 1 : 0;
    return r0 < 0 ? 0 : (r0 > rows ? rows : r0);
}

// ----------------------------------------------------------------------------
// forward

// Online-softmax update of a transposed score tile ST [cols][rows] (ld BQ), in place to
// P^T. m, l: the running max and sum of each query; corr receives the factor that
// rescales each query's accumulator (0 when it had seen nothing, 1 when the max holds);
// mx is scratch.
CPU_SIMD static void fwd_tile_t_k(float *restrict ST, float *restrict m, float *restrict l, float *restrict corr,
                                  float *restrict mx, int rows, int cols, int nvis0, int causal) {
    for (int r = 0; r < rows; r++) mx[r] = m[r];
    for (int c = 0; c < cols; c++) {
        const float *sr = ST + (size_t)c * BQ;
        for (int r = first_visible(c, nvis0, rows, causal); r < rows; r++) mx[r] = sr[r] > mx[r] ? sr[r] : mx[r];
    }
    for (int r = 0; r < rows; r++) {
        // a query that has seen no key yet keeps m = -inf, l = 0 and an empty accumulator
        corr[r] = mx[r] == -INFINITY ? 1.0f : tetra_expf_softmax(m[r] - mx[r]);
        l[r] *= corr[r];
        m[r] = mx[r];
    }
    for (int c = 0; c < cols; c++) {
        float *sr = ST + (size_t)c * BQ;
        int r0 = first_visible(c, nvis0, rows, causal);
        for (int r = 0; r < r0; r++) sr[r] = 0.0f;
        for (int r = r0; r < rows; r++) {  // visible: m[r] >= sr[r] is finite
            float p = tetra_expf_softmax(sr[r] - m[r]);
            sr[r] = p;
            l[r] += p;
        }
    }
}

CPU_SIMD static void scale_rows_k(float *restrict acc, const float *restrict corr, int rows, int d) {
    for (int r = 0; r < rows; r++) {
        float f = corr[r];
        if (f == 1.0f) continue;
        float *ar = acc + (size_t)r * d;
        for (int j = 0; j < d; j++) ar[j] *= f;
    }
}

CPU_SIMD static void fwd_finish_k(float *restrict out, int ldo, float *restrict lse, const float *restrict acc,
                                  const float *restrict m, const float *restrict l, int rows, int d) {
    for (int r = 0; r < rows; r++) {
        float *o = out + (size_t)r * ldo;
        if (l[r] == 0.0f) {  // no visible key: contributes nothing when merged
            for (int j = 0; j < d; j++) o[j] = 0.0f;
            lse[r] = -INFINITY;
            continue;
        }
        float inv = 1.0f / l[r];
        for (int j = 0; j < d; j++) o[j] = acc[(size_t)r * d + j] * inv;
        lse[r] = m[r] + logf(l[r]);
    }
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
            int nk = visible_keys(s, (qb1 * BQ < Sq ? qb1 * BQ : Sq) - 1);  // keys the chunk sees
            pack_kv(t.Kp, k, s, b, g, nk);
            pack_kv(t.Vp, v, s, b, g, nk);
            for (int qb = qb0; qb < qb1; qb++) {
                int i0 = qb * BQ, rows = Sq - i0 < BQ ? Sq - i0 : BQ;
                int kend = visible_keys(s, i0 + rows - 1);  // keys any row of this block can see
                for (int h = g * rep; h < (g + 1) * rep; h++) {
                    pack_rows(t.QT, NULL, q + ((size_t)(b * Sq + i0) * H + h) * D, ldq, rows, D);
                    for (int r = 0; r < rows; r++) t.m[r] = -INFINITY, t.l[r] = 0.0f;
                    memset(t.acc, 0, (size_t)rows * D * sizeof(float));
                    for (int j0 = 0; j0 < kend; j0 += BK) {
                        int cols = kend - j0 < BK ? kend - j0 : BK;
                        // S^T = scale K_blk Q_blk^T
                        mk_gemm(t.ST, BQ, t.Kp + (size_t)j0 * D, D, 1, t.QT, BQ, cols, rows, D, s->scale, 0);
                        fwd_tile_t_k(t.ST, t.m, t.l, t.corr, t.mx, rows, cols, tile_nvis0(s, delta, i0, j0, cols),
                                     s->causal);
                        scale_rows_k(t.acc, t.corr, rows, D);
                        // acc += P V_blk, P read transposed from the tile
                        mk_gemm(t.acc, D, t.ST, 1, BQ, t.Vp + (size_t)j0 * D, D, rows, D, cols, 1.0f, 1);
                    }
                    fwd_finish_k(out + ((size_t)(b * Sq + i0) * H + h) * D, (int)ldq,
                                 lse + (size_t)(b * H + h) * Sq + i0, t.acc, t.m, t.l, rows, D);
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

// A transposed tile pair in place: ST -> P^T = exp(S^T - lse), dPT -> dS^T = P^T (dP^T - Dv),
// both [cols][rows] (ld BQ); masked entries become 0.
CPU_SIMD static void bwd_tile_t_k(float *restrict ST, float *restrict dPT, const float *restrict lse,
                                  const float *restrict dv, int rows, int cols, int nvis0, int causal) {
    for (int c = 0; c < cols; c++) {
        float *sr = ST + (size_t)c * BQ, *dr = dPT + (size_t)c * BQ;
        int r0 = first_visible(c, nvis0, rows, causal);
        for (int r = 0; r < r0; r++) {
            sr[r] = 0.0f;
            dr[r] = 0.0f;
        }
        for (int r = r0; r < rows; r++) {
            float L = lse[r];
            float p = L == -INFINITY ? 0.0f : tetra_expf_softmax(sr[r] - L);  // row that sees no key
            sr[r] = p;
            dr[r] = p * (dr[r] - dv[r]);
        }
    }
}

// The tile pair of a (query block, key block): ST = scale K_blk Q_blk^T -> P^T and
// dPT = V_blk dO_blk^T -> dS^T, from the block's packed Q^T, dO^T in t and key/value rows
// at kb, vb (row stride ldkv); li indexes the block's first query in lse and Dv.
static void bwd_tile(const ops_attn_shape *s, attn_bufs *t, const float *kb, const float *vb, long ldkv,
                     const float *lse, const float *Dv, int rows, int cols, int nvis0) {
    mk_gemm(t->ST, BQ, kb, ldkv, 1, t->QT, BQ, cols, rows, s->d, s->scale, 0);
    mk_gemm(t->dPT, BQ, vb, ldkv, 1, t->dOT, BQ, cols, rows, s->d, 1.0f, 0);
    bwd_tile_t_k(t->ST, t->dPT, lse, Dv, rows, cols, nvis0, s->causal);
}

// first query row that sees key j0 (0 without the causal mask), clamped to [0, sq]
static int first_query(const ops_attn_shape *s, long long delta, int j0) {
    if (!s->causal) return 0;
    long long i = (long long)j0 - delta;
    return i < 0 ? 0 : (i > s->sq ? s->sq : (int)i);
}

void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                            const float *k, const float *v, const float *out, const float *lse,
                            const ops_attn_shape *s, void *workspace) {
    const int B = s->b, Sq = s->sq, Sk = s->sk, H = s->h, KV = s->kv, D = s->d;
    const int rep = H / KV;
    float *Dv = (float *)workspace;
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
                int nk = visible_keys(s, Sq - 1);
                pack_kv(t.Kp, k, s, b, g, nk);
                pack_kv(t.Vp, v, s, b, g, nk);
                memset(t.dKp, 0, (size_t)nk * D * sizeof(float));
                memset(t.dVp, 0, (size_t)nk * D * sizeof(float));
                for (int i0 = 0; i0 < Sq; i0 += BQ) {
                    int rows = Sq - i0 < BQ ? Sq - i0 : BQ;
                    int kend = visible_keys(s, i0 + rows - 1);
                    if (kend == 0) continue;
                    for (int h = g * rep; h < (g + 1) * rep; h++) {
                        size_t qoff = ((size_t)(b * Sq + i0) * H + h) * D, li = (size_t)(b * H + h) * Sq + i0;
                        pack_rows(t.QT, t.Qp, q + qoff, ldq, rows, D);
                        pack_rows(t.dOT, t.dOp, dout + qoff, ldq, rows, D);
                        memset(t.dQp, 0, (size_t)rows * D * sizeof(float));
                        for (int j0 = 0; j0 < kend; j0 += BK) {
                            int cols = kend - j0 < BK ? kend - j0 : BK;
                            float *kb = t.Kp + (size_t)j0 * D, *vb = t.Vp + (size_t)j0 * D;
                            bwd_tile(s, &t, kb, vb, D, lse + li, Dv + li, rows, cols, tile_nvis0(s, delta, i0, j0, cols));
                            // dV_blk += P^T dO ; dK_blk += scale dS^T Q ; dQ_blk += scale dS K_blk
                            mk_gemm(t.dVp + (size_t)j0 * D, D, t.ST, BQ, 1, t.dOp, D, cols, D, rows, 1.0f, 1);
                            mk_gemm(t.dKp + (size_t)j0 * D, D, t.dPT, BQ, 1, t.Qp, D, cols, D, rows, s->scale, 1);
                            mk_gemm(t.dQp, D, t.dPT, 1, BQ, kb, D, rows, D, cols, s->scale, 1);
                        }
                        add_rows_k(dq + qoff, ldq, t.dQp, rows, D);
                    }
                }
                size_t koff = ((size_t)b * Sk * KV + g) * D;
                add_rows_k(dk + koff, ldk, t.dKp, nk, D);
                add_rows_k(dv + koff, ldk, t.dVp, nk, D);
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
                int i0 = qb * BQ, rows = Sq - i0 < BQ ? Sq - i0 : BQ;
                int kend = visible_keys(s, i0 + rows - 1);
                size_t qoff = ((size_t)(b * Sq + i0) * H + h) * D, li = (size_t)(b * H + h) * Sq + i0;
                pack_rows(t.QT, NULL, q + qoff, ldq, rows, D);
                pack_rows(t.dOT, NULL, dout + qoff, ldq, rows, D);
                for (int j0 = 0; j0 < kend; j0 += BK) {
                    int cols = kend - j0 < BK ? kend - j0 : BK;
                    size_t koff = ((size_t)(b * Sk + j0) * KV + g) * D;
                    bwd_tile(s, &t, k + koff, v + koff, ldk, lse + li, Dv + li, rows, cols,
                             tile_nvis0(s, delta, i0, j0, cols));
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
                for (int i0 = first_query(s, delta, j0) / BQ * BQ; i0 < Sq; i0 += BQ) {
                    int rows = Sq - i0 < BQ ? Sq - i0 : BQ;
                    for (int h = g * rep; h < (g + 1) * rep; h++) {
                        size_t qoff = ((size_t)(b * Sq + i0) * H + h) * D, li = (size_t)(b * H + h) * Sq + i0;
                        pack_rows(t.QT, NULL, q + qoff, ldq, rows, D);
                        pack_rows(t.dOT, NULL, dout + qoff, ldq, rows, D);
                        bwd_tile(s, &t, k + koff, v + koff, ldk, lse + li, Dv + li, rows, cols,
                                 tile_nvis0(s, delta, i0, j0, cols));
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

void cpu_attention_merge(float *out, float *lse, const float *out_blk, const float *lse_blk, int b, int sq,
                         int h, int d) {
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
        if (lb == -INFINITY) continue;  // the block saw no key for this row
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
