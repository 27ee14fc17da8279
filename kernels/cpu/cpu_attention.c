// kernels/cpu/cpu_attention.c — causal (or full) attention with grouped-query heads,
// forward and backward, computed blockwise with an online softmax (FlashAttention-2 on a
// CPU): score tiles of CPU_ATTN_BQ x CPU_ATTN_BK come from sgemm, are exponentiated in
// place and multiplied into V by another sgemm. Nothing of size S x S is ever stored;
// the forward saves only the log-sum-exp per query row, and the backward recomputes
// each score tile from it.
//
// Layouts (ops.h): q/out/dq [B, Sq, H, D], k/v/dk/dv [B, Sk, KV, D], lse [B, H, Sq]. A
// head's rows are strided by H*D (or KV*D) floats, which sgemm reads through its leading
// dimension, so no head is ever transposed or copied, and GQA indexes the shared K/V head
// g = h / (H/KV) in place.
//
// Threads: the forward runs one task per (batch, head, query block), heaviest blocks
// first. The backward has two schedules, both free of atomics and of S-sized scratch:
// - fused (when B*KV keeps the threads busy): one task per (batch, kv head) walks key
//   blocks and, for each, all query blocks and the group's query heads. It owns its rows
//   of dK and dV (every query head that reads them is inside it) and of dQ (no other task
//   touches that kv group's query heads), so 5 sgemms per tile pair and no races. Its
//   tiles are computed transposed (S^T = K Q^T, one key per row) so that dV += P^T dO
//   and dK += dS^T Q are plain row-major GEMMs (OpenBLAS's small-matrix kernels cover
//   those; the transposed-A form takes its slower packed path).
// - split (few groups, many threads): pass 1 runs (batch, head, query block) tasks that
//   produce dQ, pass 2 runs (batch, kv head, key block) tasks that produce dK and dV.
//   Score tiles are recomputed in both (7 sgemms per tile pair instead of 5), in
//   exchange for parallelism over blocks rather than heads.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops_math.h"

#define BQ CPU_ATTN_BQ
#define BK CPU_ATTN_BK

// ----------------------------------------------------------------------------
// workspace

static size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// Per-thread tiles live in a small buffer each thread allocates on entering a parallel
// region (a few hundred KiB at most), so the caller's workspace does not depend on the
// thread count. Forward: S tile, output accumulator, running max and sum; backward: the
// S/P and dP/dS tiles.
static size_t tile_floats(int d) {
    size_t fwd = align16((size_t)BQ * BK) + align16((size_t)BQ * d) + 2 * align16(BQ);
    size_t bwd = 2 * align16((size_t)BQ * BK);
    return fwd > bwd ? fwd : bwd;
}

// Tiles and a per-call workspace are temporaries of one call, taken from the C heap
// rather than cpu_alloc: they are not backend buffers, so they stay out of the memory
// accounting and keep working once memory is frozen.
static float *tile_alloc(int d) {
    void *p = NULL;
    if (posix_memalign(&p, 64, tile_floats(d) * sizeof(float)) != 0) abort();
    return (float *)p;
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

// ----------------------------------------------------------------------------
// forward

// Online-softmax update of one score tile S [rows, cols] (ld BK), in place to P.
// nvis0 = visible columns of row 0 (row r sees nvis0 + r under the causal mask).
CPU_SIMD static void fwd_tile_k(float *restrict S, float *restrict acc, float *restrict m, float *restrict l,
                                int rows, int cols, int d, int nvis0, int causal) {
    for (int r = 0; r < rows; r++) {
        float *sr = S + (size_t)r * BK;
        int nv = causal ? nvis0 + r : cols;
        nv = nv < 0 ? 0 : (nv > cols ? cols : nv);
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int c = 0; c < nv; c++) mx = sr[c] > mx ? sr[c] : mx;
        float m_old = m[r];
        float m_new = mx > m_old ? mx : m_old;
        if (m_new == -INFINITY) {  // nothing visible yet in this row
            for (int c = 0; c < cols; c++) sr[c] = 0.0f;
            continue;
        }
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int c = 0; c < nv; c++) {
            float p = tetra_expf(sr[c] - m_new);
            sr[c] = p;
            sum += p;
        }
        for (int c = nv; c < cols; c++) sr[c] = 0.0f;
        float corr = tetra_expf(m_old - m_new);  // 0 when m_old = -inf
        l[r] = l[r] * corr + sum;
        m[r] = m_new;
        if (corr != 1.0f) {
            float *ar = acc + (size_t)r * d;
            for (int j = 0; j < d; j++) ar[j] *= corr;
        }
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

void cpu_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                           const ops_attn_shape *s, void *workspace) {
    cpu_blas_init();
    const int B = s->b, Sq = s->sq, Sk = s->sk, H = s->h, KV = s->kv, D = s->d;
    const int rep = H / KV;
    const int ldq = H * D, ldk = KV * D;
    const long long delta = (long long)s->q_offset - s->k_offset;
    (void)workspace;
    const int nqb = (Sq + BQ - 1) / BQ;
    const long long ntasks = (long long)B * H * nqb;

#pragma omp parallel
    {
        float *S = tile_alloc(D);
        float *acc = S + align16((size_t)BQ * BK);
        float *m = acc + align16((size_t)BQ * D);
        float *l = m + align16(BQ);
#pragma omp for schedule(dynamic, 1)
        for (long long t = 0; t < ntasks; t++) {
            // heaviest (latest) query blocks first: they see the most keys under the causal mask
            int qb = nqb - 1 - (int)(t / (B * H));
            int bh = (int)(t % (B * H));
            int b = bh / H, h = bh % H, g = h / rep;

            int i0 = qb * BQ, rows = Sq - i0 < BQ ? Sq - i0 : BQ;
            const float *qb_ptr = q + ((size_t)(b * Sq + i0) * H + h) * D;
            int kend = visible_keys(s, i0 + rows - 1);  // keys any row of this block can see
            for (int r = 0; r < rows; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
            memset(acc, 0, (size_t)rows * D * sizeof(float));

            for (int j0 = 0; j0 < kend; j0 += BK) {
                int cols = kend - j0 < BK ? kend - j0 : BK;
                const float *kb = k + ((size_t)(b * Sk + j0) * KV + g) * D;
                const float *vb = v + ((size_t)(b * Sk + j0) * KV + g) * D;
                // S = scale * Q_blk K_blk^T
                cpu_sgemm_serial(0, 1, rows, cols, D, s->scale, qb_ptr, ldq, kb, ldk, 0.0f, S, BK);
                // columns of this tile that row 0 sees; row r sees nvis0 + r (clamped in the kernel)
                long long nv0 = s->causal ? delta + i0 + 1 - j0 : cols;
                int nvis0 = nv0 < -BQ ? -BQ : (nv0 > cols ? cols : (int)nv0);
                fwd_tile_k(S, acc, m, l, rows, cols, D, nvis0, s->causal);
                // acc += P V_blk
                cpu_sgemm_serial(0, 0, rows, D, cols, 1.0f, S, BK, vb, ldk, 1.0f, acc, D);
            }
            fwd_finish_k(out + ((size_t)(b * Sq + i0) * H + h) * D, ldq, lse + (size_t)(b * H + h) * Sq + i0, acc, m, l,
                         rows, D);
        }
        free(S);
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

// Turn a score tile into P = exp(S - lse) (masked) and dP into dS = P (dP - Dv), in place.
CPU_SIMD static void bwd_tile_k(float *restrict S, float *restrict dP, const float *restrict lse,
                                const float *restrict dv, int rows, int cols, int nvis0, int causal) {
    for (int r = 0; r < rows; r++) {
        float *sr = S + (size_t)r * BK, *dr = dP + (size_t)r * BK;
        int nv = causal ? nvis0 + r : cols;
        nv = nv < 0 ? 0 : (nv > cols ? cols : nv);
        float L = lse[r];
        if (L == -INFINITY) nv = 0;
        float Dr = dv[r];
        for (int c = 0; c < nv; c++) {
            float p = tetra_expf(sr[c] - L);
            sr[c] = p;
            dr[c] = p * (dr[c] - Dr);
        }
        for (int c = nv; c < cols; c++) {
            sr[c] = 0.0f;
            dr[c] = 0.0f;
        }
    }
}


// The same on a transposed tile: ST, dPT are [cols, rows] (ld BQ), one key per row, so the
// products that contract over queries (dV += P^T dO, dK += dS^T Q) become plain
// row-major GEMMs. Key c is visible to query r iff c < nvis0 + r.
CPU_SIMD static void bwd_tile_t_k(float *restrict ST, float *restrict dPT, const float *restrict lse,
                                  const float *restrict dv, int rows, int cols, int nvis0, int causal) {
    for (int c = 0; c < cols; c++) {
        float *sr = ST + (size_t)c * BQ, *dr = dPT + (size_t)c * BQ;
        int r0 = causal ? c - nvis0 + 1 : 0;  // first query row that sees key c
        r0 = r0 < 0 ? 0 : (r0 > rows ? rows : r0);
        for (int r = 0; r < r0; r++) {
            sr[r] = 0.0f;
            dr[r] = 0.0f;
        }
        for (int r = r0; r < rows; r++) {
            float L = lse[r];
            float p = L == -INFINITY ? 0.0f : tetra_expf(sr[r] - L);  // row that sees no key
            sr[r] = p;
            dr[r] = p * (dr[r] - dv[r]);
        }
    }
}

// One (query block, key block, head) tile of the backward: S = scale Q K^T -> P, and
// dP = dO V^T -> dS, both [rows, cols] with leading dimension BK.
typedef struct {
    const ops_attn_shape *s;
    const float *q, *k, *v, *dout, *lse, *Dv;
    long long delta;  // q_offset - k_offset
} bwd_ctx;

static void bwd_tile(const bwd_ctx *c, float *S, float *dP, int b, int h, int i0, int rows, int j0, int cols) {
    const ops_attn_shape *s = c->s;
    const int g = h / (s->h / s->kv), ldq = s->h * s->d, ldk = s->kv * s->d;
    const float *qblk = c->q + ((size_t)(b * s->sq + i0) * s->h + h) * s->d;
    const float *doblk = c->dout + ((size_t)(b * s->sq + i0) * s->h + h) * s->d;
    const float *kblk = c->k + ((size_t)(b * s->sk + j0) * s->kv + g) * s->d;
    const float *vblk = c->v + ((size_t)(b * s->sk + j0) * s->kv + g) * s->d;
    long long nv0 = s->causal ? c->delta + i0 + 1 - j0 : cols;
    int nvis0 = nv0 < -BQ ? -BQ : (nv0 > cols ? cols : (int)nv0);
    cpu_sgemm_serial(0, 1, rows, cols, s->d, s->scale, qblk, ldq, kblk, ldk, 0.0f, S, BK);
    cpu_sgemm_serial(0, 1, rows, cols, s->d, 1.0f, doblk, ldq, vblk, ldk, 0.0f, dP, BK);
    bwd_tile_k(S, dP, c->lse + (size_t)(b * s->h + h) * s->sq + i0, c->Dv + (size_t)(b * s->h + h) * s->sq + i0,
               rows, cols, nvis0, s->causal);
}

// Transposed tile: ST = scale K Q^T -> P^T, dPT = V dO^T -> dS^T, both [cols, rows], ld BQ.
static void bwd_tile_t(const bwd_ctx *c, float *ST, float *dPT, int b, int h, int i0, int rows, int j0, int cols) {
    const ops_attn_shape *s = c->s;
    const int g = h / (s->h / s->kv), ldq = s->h * s->d, ldk = s->kv * s->d;
    const float *qblk = c->q + ((size_t)(b * s->sq + i0) * s->h + h) * s->d;
    const float *doblk = c->dout + ((size_t)(b * s->sq + i0) * s->h + h) * s->d;
    const float *kblk = c->k + ((size_t)(b * s->sk + j0) * s->kv + g) * s->d;
    const float *vblk = c->v + ((size_t)(b * s->sk + j0) * s->kv + g) * s->d;
    long long nv0 = s->causal ? c->delta + i0 + 1 - j0 : cols;
    int nvis0 = nv0 < -BQ ? -BQ : (nv0 > cols ? cols : (int)nv0);
    cpu_sgemm_serial(0, 1, cols, rows, s->d, s->scale, kblk, ldk, qblk, ldq, 0.0f, ST, BQ);
    cpu_sgemm_serial(0, 1, cols, rows, s->d, 1.0f, vblk, ldk, doblk, ldq, 0.0f, dPT, BQ);
    bwd_tile_t_k(ST, dPT, c->lse + (size_t)(b * s->h + h) * s->sq + i0, c->Dv + (size_t)(b * s->h + h) * s->sq + i0,
                 rows, cols, nvis0, s->causal);
}

// first query row that sees key j0 (0 without the causal mask), clamped to [0, sq]
static int first_query(const bwd_ctx *c, int j0) {
    if (!c->s->causal) return 0;
    long long i = (long long)j0 - c->delta;
    return i < 0 ? 0 : (i > c->s->sq ? c->s->sq : (int)i);
}

void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                            const float *k, const float *v, const float *out, const float *lse,
                            const ops_attn_shape *s, void *workspace) {
    cpu_blas_init();
    const int B = s->b, Sq = s->sq, Sk = s->sk, H = s->h, KV = s->kv, D = s->d;
    const int rep = H / KV;
    const int ldq = H * D, ldk = KV * D;
    float *Dv = (float *)workspace;
    float *owned = NULL;
    if (!Dv) {
        owned = (float *)malloc(cpu_attention_workspace_size(s));
        if (!owned) abort();
        Dv = owned;
    }
    bwd_ctx ctx = {s, q, k, v, dout, lse, Dv, (long long)s->q_offset - s->k_offset};

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
        // 2a. fused: one task per (batch, kv head)
#pragma omp parallel
        {
            float *S = tile_alloc(D), *dP = S + align16((size_t)BQ * BK);
#pragma omp for schedule(dynamic, 1)
            for (int t = 0; t < groups; t++) {
                int b = t / KV, g = t % KV;
                for (int kb = 0; kb < nkb; kb++) {
                    int j0 = kb * BK, cols = Sk - j0 < BK ? Sk - j0 : BK;
                    const float *kblk = k + ((size_t)(b * Sk + j0) * KV + g) * D;
                    float *dkblk = dk + ((size_t)(b * Sk + j0) * KV + g) * D;
                    float *dvblk = dv + ((size_t)(b * Sk + j0) * KV + g) * D;
                    for (int i0 = first_query(&ctx, j0); i0 < Sq; i0 += BQ) {
                        int rows = Sq - i0 < BQ ? Sq - i0 : BQ;
                        for (int h = g * rep; h < (g + 1) * rep; h++) {
                            const float *qblk = q + ((size_t)(b * Sq + i0) * H + h) * D;
                            const float *doblk = dout + ((size_t)(b * Sq + i0) * H + h) * D;
                            float *dqblk = dq + ((size_t)(b * Sq + i0) * H + h) * D;
                            bwd_tile_t(&ctx, S, dP, b, h, i0, rows, j0, cols);
                            // dV_blk += P^T dO ; dK_blk += scale dS^T Q ; dQ_blk += scale dS K
                            cpu_sgemm_serial(0, 0, cols, D, rows, 1.0f, S, BQ, doblk, ldq, 1.0f, dvblk, ldk);
                            cpu_sgemm_serial(0, 0, cols, D, rows, s->scale, dP, BQ, qblk, ldq, 1.0f, dkblk, ldk);
                            cpu_sgemm_serial(1, 0, rows, D, cols, s->scale, dP, BQ, kblk, ldk, 1.0f, dqblk, ldq);
                        }
                    }
                }
            }
            free(S);
        }
    } else {
        // 2b. split, pass 1: dQ per (batch, head, query block), heaviest first
        const long long nt1 = (long long)B * H * nqb;
#pragma omp parallel
        {
            float *S = tile_alloc(D), *dP = S + align16((size_t)BQ * BK);
#pragma omp for schedule(dynamic, 1)
            for (long long t = 0; t < nt1; t++) {
                int qb = nqb - 1 - (int)(t / (B * H));
                int bh = (int)(t % (B * H)), b = bh / H, h = bh % H, g = h / rep;
                int i0 = qb * BQ, rows = Sq - i0 < BQ ? Sq - i0 : BQ;
                float *dqblk = dq + ((size_t)(b * Sq + i0) * H + h) * D;
                int kend = visible_keys(s, i0 + rows - 1);
                for (int j0 = 0; j0 < kend; j0 += BK) {
                    int cols = kend - j0 < BK ? kend - j0 : BK;
                    const float *kblk = k + ((size_t)(b * Sk + j0) * KV + g) * D;
                    bwd_tile(&ctx, S, dP, b, h, i0, rows, j0, cols);
                    cpu_sgemm_serial(0, 0, rows, D, cols, s->scale, dP, BK, kblk, ldk, 1.0f, dqblk, ldq);
                }
            }
            free(S);
        }
        // pass 2: dK, dV per (batch, kv head, key block), heaviest (earliest) first
        const long long nt2 = (long long)B * KV * nkb;
#pragma omp parallel
        {
            float *S = tile_alloc(D), *dP = S + align16((size_t)BQ * BK);
#pragma omp for schedule(dynamic, 1)
            for (long long t = 0; t < nt2; t++) {
                int kb = (int)(t / groups);
                int bg = (int)(t % groups), b = bg / KV, g = bg % KV;
                int j0 = kb * BK, cols = Sk - j0 < BK ? Sk - j0 : BK;
                float *dkblk = dk + ((size_t)(b * Sk + j0) * KV + g) * D;
                float *dvblk = dv + ((size_t)(b * Sk + j0) * KV + g) * D;
                for (int i0 = first_query(&ctx, j0); i0 < Sq; i0 += BQ) {
                    int rows = Sq - i0 < BQ ? Sq - i0 : BQ;
                    for (int h = g * rep; h < (g + 1) * rep; h++) {
                        const float *qblk = q + ((size_t)(b * Sq + i0) * H + h) * D;
                        const float *doblk = dout + ((size_t)(b * Sq + i0) * H + h) * D;
                        bwd_tile_t(&ctx, S, dP, b, h, i0, rows, j0, cols);
                        cpu_sgemm_serial(0, 0, cols, D, rows, 1.0f, S, BQ, doblk, ldq, 1.0f, dvblk, ldk);
                        cpu_sgemm_serial(0, 0, cols, D, rows, s->scale, dP, BQ, qblk, ldq, 1.0f, dkblk, ldk);
                    }
                }
            }
            free(S);
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
