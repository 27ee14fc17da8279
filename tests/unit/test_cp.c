/* Context parallel (parallel/cp.h) on every rank of MPI_COMM_WORLD (the cp group is
 * the world: run it under mpirun -np 2 and 4; one rank checks the helpers):
 *   - the load-balanced split: rank r holds chunks r and 2cp-1-r, positions and token
 *     shards follow, every position is held exactly once;
 *   - attention under CP, both rotate methods, with and without balancing, GQA, two
 *     sequences: each rank's out and lse equal the unsharded op's rows within 1e-6
 *     (Frobenius, fp32), and so do dq, dk, dv for allgather; against a
 *     double-precision truth every result is as accurate as the unsharded op's
 *     (within 3x its error, or 1e-6; bf16 1e-2);
 *   - the same with a document mask (block_causal): documents crossing chunk edges and
 *     short ones inside chunks, so some block pairs see nothing; the truth is masked too;
 *   - without a document mask, every bf16 attention call context parallel makes (both
 *     rotate methods, balanced or not) is a shape cuDNN's fused SDPA takes
 *     (kernels/ops_paths.h, on an sm_90 device with cuDNN 9.19): no chunk falls back to
 *     the built-in kernels. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "kernels/ops_paths.h"
#include "parallel/comm.h"
#include "parallel/cp.h"
#include "parallel/mesh.h"
#include "tests/check.h"

static uint64_t lcg_state;
static void seed(uint64_t s) { lcg_state = s * 0x9E3779B97F4A7C15ull + 1; }
static float unif(void) {
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(((uint32_t)(lcg_state >> 33) + 0.5) / 2147483648.0) - 1.0f;
}

/* ||a - b|| / ||b|| (Frobenius) */
static double rel(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        m += (double)b[i] * b[i];
    }
    return m > 0 ? sqrt(d / m) : sqrt(d);
}

/* Causal attention over whole sequences in double precision: the ground truth both
 * the unsharded op and context parallel are measured against. q/out/dout [B, T, H, D],
 * k/v [B, T, KV, D]; doc [B, T] document ids (NULL: causal only): query i sees keys
 * j <= i of its own document. */
static void exact_attention(double *out, double *dq, double *dk, double *dv, const float *q, const float *k,
                            const float *v, const float *dout, const int32_t *doc, int B, int T, int H, int KV, int D,
                            double scale) {
    double *p = malloc((size_t)T * sizeof *p);
    memset(dq, 0, (size_t)B * T * H * D * sizeof *dq);
    memset(dk, 0, (size_t)B * T * KV * D * sizeof *dk);
    memset(dv, 0, (size_t)B * T * KV * D * sizeof *dv);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const int kh = h / (H / KV);
            for (int i = 0; i < T; i++) {
                const float *qi = q + (((size_t)b * T + i) * H + h) * D, *di = dout + (((size_t)b * T + i) * H + h) * D;
                double m = -INFINITY, l = 0, dd = 0;
                int j0 = i; /* the first key of the query's document */
                while (doc && j0 > 0 && doc[(size_t)b * T + j0 - 1] == doc[(size_t)b * T + i]) j0--;
                if (!doc) j0 = 0;
                for (int j = j0; j <= i; j++) {
                    const float *kj = k + (((size_t)b * T + j) * KV + kh) * D;
                    double x = 0;
                    for (int e = 0; e < D; e++) x += (double)qi[e] * kj[e];
                    p[j] = x * scale;
                    m = fmax(m, p[j]);
                }
                for (int j = j0; j <= i; j++) l += (p[j] = exp(p[j] - m));
                double *oi = out + (((size_t)b * T + i) * H + h) * D;
                for (int e = 0; e < D; e++) {
                    double a = 0;
                    for (int j = j0; j <= i; j++) a += p[j] / l * v[(((size_t)b * T + j) * KV + kh) * D + e];
                    oi[e] = a;
                    dd += a * di[e];
                }
                for (int j = j0; j <= i; j++) {
                    const float *kj = k + (((size_t)b * T + j) * KV + kh) * D,
                                *vj = v + (((size_t)b * T + j) * KV + kh) * D;
                    double dp = 0, pj = p[j] / l;
                    for (int e = 0; e < D; e++) dp += (double)di[e] * vj[e];
                    const double ds = pj * (dp - dd) * scale;
                    for (int e = 0; e < D; e++) {
                        dq[(((size_t)b * T + i) * H + h) * D + e] += ds * kj[e];
                        dk[(((size_t)b * T + j) * KV + kh) * D + e] += ds * qi[e];
                        dv[(((size_t)b * T + j) * KV + kh) * D + e] += pj * di[e];
                    }
                }
            }
        }
    free(p);
}

/* ||a - x|| / ||x|| against the double-precision truth */
static double err64(const float *a, const double *x, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - x[i]) * ((double)a[i] - x[i]);
        m += x[i] * x[i];
    }
    return m > 0 ? sqrt(d / m) : sqrt(d);
}

static void local_rows64(double *out, const double *full, int B, int T, int n, const int32_t *pos, int t) {
    for (int b = 0; b < B; b++)
        for (int x = 0; x < t; x++)
            memcpy(out + ((size_t)b * t + x) * n, full + ((size_t)b * T + pos[x]) * n, (size_t)n * sizeof(double));
}

static void test_split(int cp) {
    for (int bal = 0; bal < 2; bal++) {
        const int T = 8 * cp, t = T / cp;
        int *held = calloc((size_t)T, sizeof *held);
        int32_t pos[64], in[2 * 64], out[2 * 64];
        for (int i = 0; i < 2 * T; i++) in[i] = i;
        int ok = 1;
        for (int r = 0; r < cp; r++) {
            cp_positions(cp, bal, r, T, pos);
            cp_shard_tokens(cp, bal, r, out, in, 2, T);
            for (int x = 0; x < t; x++) {
                held[pos[x]]++;
                ok &= out[x] == pos[x] && out[t + x] == T + pos[x];
            }
            if (bal) ok &= pos[0] == r * (T / (2 * cp)) && pos[t - 1] == T - 1 - r * (T / (2 * cp));
        }
        for (int p = 0; p < T; p++) ok &= held[p] == 1;
        CHECK(ok, "cp %d %s: every position once, tokens follow the positions", cp, bal ? "headtail" : "none");
        free(held);
    }
}

/* The local rows of a [B, T, n] tensor into [B, t, n]. */
static void local_rows(float *out, const float *full, int B, int T, int n, const int32_t *pos, int t) {
    for (int b = 0; b < B; b++)
        for (int x = 0; x < t; x++)
            memcpy(out + ((size_t)b * t + x) * n, full + ((size_t)b * T + pos[x]) * n, (size_t)n * sizeof(float));
}

static void to_bf16(uint16_t *o, const float *x, size_t n) { ops_cpu()->cast_f32_to_bf16(o, x, n); }
static void from_bf16(float *o, const uint16_t *x, size_t n) { ops_cpu()->cast_bf16_to_f32(o, x, n); }

/* Document ids [2, T]: row 0 documents of 5, 11, 1, 9, ... tokens (crossing chunk edges,
 * one of a single token), row 1 documents of 3 (most block pairs see nothing). */
static int32_t *make_docs(int T) {
    static const int lens[4] = {5, 11, 1, 9};
    int32_t *doc = malloc(2 * (size_t)T * sizeof *doc);
    for (int i = 0, id = 0, li = 0, left = lens[0]; i < T; i++, left--) {
        if (!left) id++, li++, left = lens[li % 4];
        doc[i] = id;
    }
    for (int i = 0; i < T; i++) doc[T + i] = i / 3;
    return doc;
}

/* The CPU table, with its bf16 attention calls checked against the cuDNN path's shape
 * rules on the way through. */
static tetra_ops watched;
static int n_bf16_calls, n_refused;
static char refused[160];

static void watch(const ops_attn_shape *s, const char *dir) {
    n_bf16_calls++;
    if (!s->doc && !ops_path_cudnn_sdpa_shape(s, 9, 91900) && !n_refused++)
        snprintf(refused, sizeof refused, "%s sq %d sk %d causal %d q_offset %d k_offset %d", dir, s->sq, s->sk,
                 s->causal, s->q_offset, s->k_offset);
}
static void watched_fwd(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                        const ops_attn_shape *s, void *ws) {
    watch(s, "forward");
    ops_cpu()->attention_forward_bf16(out, lse, q, k, v, s, ws);
}
static void watched_bwd(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout, const uint16_t *q,
                        const uint16_t *k, const uint16_t *v, const uint16_t *out, const float *lse,
                        const ops_attn_shape *s, void *ws) {
    watch(s, "backward");
    ops_cpu()->attention_backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, s, ws);
}
static const tetra_ops *watched_ops(void) {
    watched = *ops_cpu();
    watched.attention_forward_bf16 = watched_fwd;
    watched.attention_backward_bf16 = watched_bwd;
    return &watched;
}

static void test_attention(comm_group *g, int bf16, int docs) {
    const tetra_ops *ops = ops_cpu(), *cp_ops = watched_ops();
    const int cp = comm_group_size(g), r = comm_group_rank(g);
    const int B = 2, T = 16 * cp, H = 4, KV = 2, D = 16, t = T / cp;
    int32_t *doc = docs ? make_docs(T) : NULL;
    const size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KV * D;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    float *out = malloc(nq * 4), *lse = malloc((size_t)B * H * T * 4), *dq = calloc(nq, 4), *dk = calloc(nk, 4),
          *dv = calloc(nk, 4);
    seed(17);
    for (size_t i = 0; i < nq; i++) q[i] = unif();
    for (size_t i = 0; i < nk; i++) k[i] = unif();
    for (size_t i = 0; i < nk; i++) v[i] = unif();
    for (size_t i = 0; i < nq; i++) dout[i] = unif();
    ops_attn_shape s;
    memset(&s, 0, sizeof s);
    s.b = B;
    s.sq = s.sk = T;
    s.h = H;
    s.kv = KV;
    s.d = D;
    s.scale = 0.25f;
    s.causal = 1;
    s.doc = doc;
    s.doc_len = doc ? T : 0;
    /* the unsharded reference (bf16: the bf16 op on the rounded inputs) */
    uint16_t *q16 = malloc(nq * 2), *k16 = malloc(nk * 2), *v16 = malloc(nk * 2), *o16 = malloc(nq * 2),
             *do16 = malloc(nq * 2), *dq16 = malloc(nq * 2), *dk16 = malloc(nk * 2), *dv16 = malloc(nk * 2);
    if (bf16) {
        to_bf16(q16, q, nq);
        to_bf16(k16, k, nk);
        to_bf16(v16, v, nk);
        to_bf16(do16, dout, nq);
        ops->attention_forward_bf16(o16, lse, q16, k16, v16, &s, NULL);
        ops->attention_backward_bf16(dq16, dk16, dv16, do16, q16, k16, v16, o16, lse, &s, NULL);
        from_bf16(out, o16, nq);
        from_bf16(dq, dq16, nq);
        from_bf16(dk, dk16, nk);
        from_bf16(dv, dv16, nk);
        from_bf16(q, q16, nq); /* the local inputs are these rounded values */
        from_bf16(k, k16, nk);
        from_bf16(v, v16, nk);
        from_bf16(dout, do16, nq);
    } else {
        ops->attention_forward(out, lse, q, k, v, &s, NULL);
        ops->attention_backward(dq, dk, dv, dout, q, k, v, out, lse, &s, NULL);
    }
    double *xo = malloc(nq * 8), *xdq = malloc(nq * 8), *xdk = malloc(nk * 8), *xdv = malloc(nk * 8);
    exact_attention(xo, xdq, xdk, xdv, q, k, v, dout, doc, B, T, H, KV, D, 0.25);
    const size_t lq = (size_t)B * t * H * D, lk = (size_t)B * t * KV * D, ll = (size_t)B * H * t;
    double *eo = malloc(lq * 8), *edq = malloc(lq * 8), *edk = malloc(lk * 8), *edv = malloc(lk * 8);
    float *xq = malloc(lq * 4), *xk = malloc(lk * 4), *xv = malloc(lk * 4), *xdo = malloc(lq * 4);
    float *wo = malloc(lq * 4), *wl = malloc(ll * 4), *wdq = malloc(lq * 4), *wdk = malloc(lk * 4),
          *wdv = malloc(lk * 4), *ro = malloc(lq * 4), *rl = malloc(ll * 4), *rdq = malloc(lq * 4),
          *rdk = malloc(lk * 4), *rdv = malloc(lk * 4);
    void *lq_in = malloc(lq * 4), *lk_in = malloc(lk * 4), *lv_in = malloc(lk * 4), *ldo = malloc(lq * 4),
         *lo = malloc(lq * 4), *ldq = malloc(lq * 4), *ldk = malloc(lk * 4), *ldv = malloc(lk * 4);
    int32_t pos[256];
    for (int bal = 0; bal < 2; bal++)
        for (int method = 0; method < 2; method++) {
            cp_ctx c = {g, method ? CP_ROTATE_ALLTOALL : CP_ROTATE_ALLGATHER, bal};
            cp_positions(cp, bal, r, T, pos);
            local_rows(xq, q, B, T, H * D, pos, t);
            local_rows(xk, k, B, T, KV * D, pos, t);
            local_rows(xv, v, B, T, KV * D, pos, t);
            local_rows(xdo, dout, B, T, H * D, pos, t);
            local_rows(ro, out, B, T, H * D, pos, t);
            local_rows(rdq, dq, B, T, H * D, pos, t);
            local_rows(rdk, dk, B, T, KV * D, pos, t);
            local_rows(rdv, dv, B, T, KV * D, pos, t);
            local_rows64(eo, xo, B, T, H * D, pos, t);
            local_rows64(edq, xdq, B, T, H * D, pos, t);
            local_rows64(edk, xdk, B, T, KV * D, pos, t);
            local_rows64(edv, xdv, B, T, KV * D, pos, t);
            for (int b = 0; b < B; b++) /* lse [B, H, T] -> [B, H, t] */
                for (int h = 0; h < H; h++)
                    for (int x = 0; x < t; x++) rl[((size_t)b * H + h) * t + x] = lse[((size_t)b * H + h) * T + pos[x]];
            if (bf16) {
                to_bf16(lq_in, xq, lq);
                to_bf16(lk_in, xk, lk);
                to_bf16(lv_in, xv, lk);
                to_bf16(ldo, xdo, lq);
            } else {
                memcpy(lq_in, xq, lq * 4);
                memcpy(lk_in, xk, lk * 4);
                memcpy(lv_in, xv, lk * 4);
                memcpy(ldo, xdo, lq * 4);
            }
            cp_attn_dims dim = {B, t, H, KV, D, 0.25f, doc};
            void *ws = malloc(cp_workspace_bytes(&c, cp_ops, &dim, bf16));
            n_bf16_calls = n_refused = 0;
            cp_attention_forward(&c, cp_ops, bf16, lo, wl, lq_in, lk_in, lv_in, &dim, ws);
            cp_attention_backward(&c, cp_ops, bf16, ldq, ldk, ldv, ldo, lq_in, lk_in, lv_in, lo, wl, &dim, ws);
            if (bf16) {
                from_bf16(wo, lo, lq);
                from_bf16(wdq, ldq, lq);
                from_bf16(wdk, ldk, lk);
                from_bf16(wdv, ldv, lk);
            } else {
                memcpy(wo, lo, lq * 4);
                memcpy(wdq, ldq, lq * 4);
                memcpy(wdk, ldk, lk * 4);
                memcpy(wdv, ldv, lk * 4);
            }
            /* Against the unsharded op: out and lse within 1e-6 (fp32, Frobenius), and
             * for allgather (one call per query chunk) the gradients too. Measured
             * against the double-precision truth, context parallel is as accurate as
             * the unsharded op (within 3x its error, or 1e-6): in the ring a query
             * row's keys arrive in blocks merged by their log-sum-exp, and the softmax
             * gradient (dP - D) amplifies the last-ulp difference that makes — the
             * unsharded op's own dq is only 3e-6 from the truth. bf16: the blocks'
             * outputs round once more. */
            const double tol = bf16 ? 1e-2 : 1e-6;
            const double e[5] = {rel(wo, ro, lq), rel(wl, rl, ll), rel(wdq, rdq, lq), rel(wdk, rdk, lk),
                                 rel(wdv, rdv, lk)};
            const double xc[4] = {err64(wo, eo, lq), err64(wdq, edq, lq), err64(wdk, edk, lk), err64(wdv, edv, lk)};
            const double xr[4] = {err64(ro, eo, lq), err64(rdq, edq, lq), err64(rdk, edk, lk), err64(rdv, edv, lk)};
            static const char *const what[5] = {"out", "lse", "dq", "dk", "dv"};
            const char *mname = method ? "alltoall" : "allgather";
            const char *bname =
                bal ? (doc ? "headtail block_causal" : "headtail") : (doc ? "none block_causal" : "none");
            if (bf16 && !doc)
                CHECK(n_bf16_calls > 0 && n_refused == 0,
                      "cp %d bf16 %s %s: %d of %d attention calls are shapes cuDNN refuses (first: %s)", cp, mname,
                      bname, n_refused, n_bf16_calls, refused);
            CHECK(e[0] <= tol && e[1] <= 1e-6, "cp %d %s %s %s: out %.3g lse %.3g", cp, bf16 ? "bf16" : "fp32", mname,
                  bname, e[0], e[1]);
            for (int i = 0; i < 4; i++)
                CHECK(xc[i] <= fmax(bf16 ? 1e-2 : 1e-6, 3.0 * xr[i]),
                      "cp %d %s %s %s: %s error %.3g against the truth, the unsharded op's %.3g", cp,
                      bf16 ? "bf16" : "fp32", mname, bname, what[i ? i + 1 : 0], xc[i], xr[i]);
            /* allgather runs the op once per query chunk, so its gradients differ from the
             * unsharded op's by no more than two errors of that op's size from the truth
             * (its tiles start on other rows, and a BLAS kernel may sum an edge tile in
             * another order: 5e-6 on AVX2, where the op's own dq error is 4e-6). */
            if (!bf16 && !method)
                for (int i = 2; i < 5; i++)
                    CHECK(e[i] <= fmax(1e-6, 2.0 * xr[i - 1]),
                          "cp %d fp32 %s %s: %s %.3g from the unsharded op (its own error %.3g)", cp, mname, bname,
                          what[i], e[i], xr[i - 1]);
            if (check_rank == 0)
                printf("cp %d %-4s %-9s %-8s: vs unsharded op: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e; "
                       "vs fp64 truth (unsharded op): out %.1e (%.1e) dq %.1e (%.1e) dk %.1e (%.1e) dv %.1e (%.1e)\n",
                       cp, bf16 ? "bf16" : "fp32", mname, bname, e[0], e[1], e[2], e[3], e[4], xc[0], xr[0], xc[1],
                       xr[1], xc[2], xr[2], xc[3], xr[3]);
            free(ws);
        }
    void *all[] = {xo,  xdq, xdk, xdv, eo,  edq,  edk,  edv,   q,     k,     v,   dout, out, lse, dq, dk,
                   dv,  q16, k16, v16, o16, do16, dq16, dk16,  dv16,  xq,    xk,  xv,   xdo, wo,  wl, wdq,
                   wdk, wdv, ro,  rl,  rdq, rdk,  rdv,  lq_in, lk_in, lv_in, ldo, lo,   ldq, ldk, ldv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    free(doc);
}

int main(int argc, char **argv) {
    int provided = 0, world = 1;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &check_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    for (int cp = 1; cp <= 4; cp *= 2) test_split(cp);
    mesh m;
    char err[512];
    if (mesh_init(&m, world, 1, 1, 1, world, 1, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        MPI_Finalize();
        return 1;
    }
    comm_options o;
    memset(&o, 0, sizeof o);
    o.backend = COMM_BACKEND_MPI;
    o.init_timeout_s = 120;
    o.train_timeout_s = 120;
    comm_world *w = comm_world_create(&m, check_rank, &o, err, sizeof err);
    if (!w) {
        fprintf(stderr, "%s\n", err);
        MPI_Finalize();
        return 1;
    }
    comm_group *g = comm_get(w, MESH_G_CP);
    for (int docs = 0; docs < 2; docs++) {
        test_attention(g, 0, docs);
        test_attention(g, 1, docs);
    }
    comm_world_free(w);
    int f = failures, all = 0;
    MPI_Allreduce(&f, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (check_rank == 0) printf("test_cp: %d ranks, %d checks per rank, %d failures\n", world, checks, all);
    MPI_Finalize();
    return all ? 1 : 0;
}
