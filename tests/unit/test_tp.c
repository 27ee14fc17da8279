/* Tensor parallel: the primitives of parallel/tp.h against the unsharded ops, and the
 * Llama model split over a tensor-parallel group against the whole model, on every
 * rank of MPI_COMM_WORLD (the group is the world: run it under mpirun -np 2 and 4;
 * one rank checks the degenerate group).
 *   - all-gather / reduce-scatter of rows (fp32 and bf16), the rank-order sum;
 *   - column-parallel and row-parallel linears (forward and input gradient) equal the
 *     unsharded GEMM's columns / rows;
 *   - vocab-parallel embedding equals the unsharded lookup bit for bit; vocab-parallel
 *     cross-entropy (with ignored labels) equals the unsharded loss and gradient columns;
 *     the gathered-logits path too (one strided copy per rank block, one to take back);
 *   - a rank's model holds exactly its slices of the full model's parameters (heads,
 *     hidden units, vocabulary; whole norms), and forward + backward under sequence and
 *     loss parallel give the full model's loss and, for every parameter, this rank's
 *     slice of its gradient (norm weights: summed over the group), also with activation
 *     checkpointing (bit-identical to keeping everything) and the I passes all run
 *     before the W passes; async tensor parallel (blocks of rows overlapped with their
 *     GEMMs) gives the synchronous bits. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "kernels/ops_math.h"
#include "models/llama3/model.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/tp.h"
#include "tests/check.h"

static uint64_t lcg_state;
static void seed(uint64_t s) { lcg_state = s * 0x9E3779B97F4A7C15ull + 1; }
static uint32_t lcg(void) {
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(lcg_state >> 33);
}
static float unif(void) { return (float)((lcg() + 0.5) / 2147483648.0) - 1.0f; }
static void fill_rand(float *x, size_t n, uint64_t s) {
    seed(s);
    for (size_t i = 0; i < n; i++) x[i] = unif();
}

/* max |a - b| / max |b| */
static double rel(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

static ops_gemm_desc gemm(int m, int n, int k, int trans_a, int trans_b, int lda, int ldb, int ldc, float beta) {
    ops_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.a_type = g.b_type = g.c_type = TETRA_F32;
    g.m = m;
    g.n = n;
    g.k = k;
    g.trans_a = trans_a;
    g.trans_b = trans_b;
    g.lda = lda;
    g.ldb = ldb;
    g.ldc = ldc;
    g.alpha = 1.0f;
    g.beta = beta;
    return g;
}

/* ---------------------------------------------------------------------------- primitives */

/* copies through the op table, counted: the gathered-logits path must be one strided copy
 * per rank block (a copy per row is a launch per row on a GPU) */
static const tetra_ops *counted_base;
static long counted_copies, counted_copies_2d;
static void counted_copy(void *dst, const void *src, size_t bytes) {
    counted_copies++;
    counted_base->copy(dst, src, bytes);
}
static void counted_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows) {
    counted_copies_2d++;
    counted_base->copy_2d(dst, dpitch, src, spitch, width, rows);
}
static tetra_ops counting_ops(const tetra_ops *base) {
    tetra_ops t = *base;
    counted_base = base;
    t.copy = counted_copy;
    t.copy_2d = counted_copy_2d;
    return t;
}

/* a callback over blocks of rows: fills the partial sums of the rank (the same values as
 * fill_rand(full, N*C, 100 + rank)) for the rows it is given, or checks gathered rows arrived */
typedef struct {
    float *full;
    int cols, rank, rows_seen;
} prim_job;

static void prim_produce(void *user, size_t r0, size_t rows) {
    prim_job *j = user;
    const size_t total = (r0 + rows) * (size_t)j->cols;
    float *tmp = malloc(total * sizeof *tmp); /* the rank's partial up to these rows */
    fill_rand(tmp, total, 100 + (uint64_t)j->rank);
    memcpy(j->full + r0 * (size_t)j->cols, tmp + r0 * (size_t)j->cols, rows * (size_t)j->cols * 4);
    free(tmp);
    j->rows_seen += (int)rows;
}

static void prim_consume(void *user, size_t r0, size_t rows) {
    prim_job *j = user;
    (void)r0;
    j->rows_seen += (int)rows;
}

static void test_primitives(comm_group *g) {
    const tetra_ops *ops = ops_cpu();
    const int P = comm_group_size(g), p = comm_group_rank(g);
    const int N = 8 * P, C = 12, NL = N / P;
    float *full = malloc((size_t)N * C * 4), *local = malloc((size_t)NL * C * 4), *stage = malloc((size_t)N * C * 4);
    float *want = malloc((size_t)N * C * 4);

    /* all-gather of rows: block q of the result is rank q's rows */
    for (int i = 0; i < NL * C; i++) local[i] = (float)(1000 * p + i);
    tp_all_gather_rows(g, full, local, (size_t)NL, (size_t)C, TETRA_F32);
    int bad = 0;
    for (int q = 0; q < P; q++)
        for (int i = 0; i < NL * C; i++) bad += full[q * NL * C + i] != (float)(1000 * q + i);
    CHECK(!bad, "all-gather rows fp32: %d wrong", bad);
    uint16_t *l16 = malloc((size_t)NL * C * 2), *f16 = malloc((size_t)N * C * 2);
    for (int i = 0; i < NL * C; i++) l16[i] = tetra_f32_to_bf16((float)(p + 0.5 * i));
    tp_all_gather_rows(g, f16, l16, (size_t)NL, (size_t)C, TETRA_BF16);
    bad = 0;
    for (int q = 0; q < P; q++)
        for (int i = 0; i < NL * C; i++) bad += f16[q * NL * C + i] != tetra_f32_to_bf16((float)(q + 0.5 * i));
    CHECK(!bad, "all-gather rows bf16: %d wrong", bad);

    /* reduce-scatter of rows: rank p gets rows of block p summed over ranks in rank order */
    fill_rand(full, (size_t)N * C, 100 + (uint64_t)p);
    tp_reduce_scatter_rows(ops, g, local, full, stage, (size_t)NL, (size_t)C);
    for (int q = 0; q < P; q++) {
        fill_rand(want, (size_t)N * C, 100 + (uint64_t)q); /* rank q's partial */
        if (q == 0) memcpy(stage, want + (size_t)p * NL * C, (size_t)NL * C * 4);
        else
            for (int i = 0; i < NL * C; i++) stage[i] = stage[i] + want[(size_t)p * NL * C + i];
    }
    CHECK(!memcmp(local, stage, (size_t)NL * C * 4), "reduce-scatter rows = the rank-order sum, bit for bit");
    /* the row-parallel and column-parallel primitives, sync and async (ring steps): the
     * callback sees every block once, and the two modes give the same bits */
    {
        float *f1 = malloc((size_t)N * C * 4), *f2 = malloc((size_t)N * C * 4), *o1 = malloc((size_t)NL * C * 4);
        float *o2 = malloc((size_t)NL * C * 4);
        for (int async = 0; async < 2; async++) {
            prim_job pj = {async ? f2 : f1, C, p, 0};
            tp_row_parallel_out(ops, g, async ? o2 : o1, pj.full, stage, (size_t)NL, (size_t)C, async, prim_produce,
                                &pj);
            CHECK(pj.rows_seen == N, "row-parallel out (async %d): produce saw %d of %d rows", async, pj.rows_seen, N);
        }
        CHECK(!memcmp(o1, o2, (size_t)NL * C * 4) && !memcmp(o1, local, (size_t)NL * C * 4),
              "row-parallel out: sync and async equal the reduce-scatter, bit for bit");
        for (int async = 0; async < 2; async++) {
            for (int i = 0; i < NL * C; i++) o1[i] = (float)(7 * p + i);
            prim_job pj = {async ? f2 : f1, C, p, 0};
            memset(pj.full, 0, (size_t)N * C * 4);
            tp_column_parallel_in(ops, g, pj.full, o1, (size_t)NL, (size_t)C, TETRA_F32, async, prim_consume, &pj);
            int wrong = 0;
            for (int q = 0; q < P; q++)
                for (int i = 0; i < NL * C; i++) wrong += pj.full[(size_t)q * NL * C + i] != (float)(7 * q + i);
            CHECK(!wrong && pj.rows_seen == N, "column-parallel in (async %d): %d wrong, consume saw %d of %d rows",
                  async, wrong, pj.rows_seen, N);
        }
        free(f1);
        free(f2);
        free(o1);
        free(o2);
    }

    /* column-parallel linear: y = x W^T, rank p holds rows [p O/P, (p+1) O/P) of W and
     * computes those columns of y; its input gradient is a partial sum */
    const int IN = 16, OUT = 8 * P, OL = OUT / P;
    float *x = malloc((size_t)N * IN * 4), *w = malloc((size_t)OUT * IN * 4), *y = malloc((size_t)N * OUT * 4);
    float *yl = malloc((size_t)N * OL * 4), *dy = malloc((size_t)N * OUT * 4), *dx = malloc((size_t)N * IN * 4);
    float *dxp = malloc((size_t)N * IN * 4), *dxl = malloc((size_t)NL * IN * 4), *st2 = malloc((size_t)N * IN * 4);
    fill_rand(x, (size_t)N * IN, 7);
    fill_rand(w, (size_t)OUT * IN, 8);
    fill_rand(dy, (size_t)N * OUT, 9);
    ops_gemm_desc gd = gemm(N, OUT, IN, 0, 1, IN, IN, OUT, 0.0f);
    ops->gemm(y, x, w, &gd);
    gd = gemm(N, OL, IN, 0, 1, IN, IN, OL, 0.0f);
    ops->gemm(yl, x, w + (size_t)p * OL * IN, &gd);
    double e = 0;
    for (int i = 0; i < N; i++) e = fmax(e, rel(yl + (size_t)i * OL, y + (size_t)i * OUT + p * OL, (size_t)OL));
    CHECK(e <= 1e-6, "column-parallel forward: local columns of y, rel %.2e", e);
    gd = gemm(N, IN, OUT, 0, 0, OUT, IN, IN, 0.0f); /* dx = dy W */
    ops->gemm(dx, dy, w, &gd);
    gd = gemm(N, IN, OL, 0, 0, OUT, IN, IN, 0.0f); /* partial: dy[:, cols p] W[rows p] */
    ops->gemm(dxp, dy + p * OL, w + (size_t)p * OL * IN, &gd);
    tp_reduce_scatter_rows(ops, g, dxl, dxp, st2, (size_t)NL, (size_t)IN);
    e = rel(dxl, dx + (size_t)p * NL * IN, (size_t)NL * IN);
    CHECK(e <= 1e-5, "column-parallel input gradient (reduce-scattered partial sums), rel %.2e", e);

    /* row-parallel linear: rank p holds columns [p I/P, ...) of W; y is a partial sum */
    const int IL = IN / P;
    float *yp = malloc((size_t)N * OUT * 4), *ylr = malloc((size_t)NL * OUT * 4), *st3 = malloc((size_t)N * OUT * 4);
    gd = gemm(N, OUT, IL, 0, 1, IN, IN, OUT, 0.0f);
    ops->gemm(yp, x + p * IL, w + p * IL, &gd);
    tp_reduce_scatter_rows(ops, g, ylr, yp, st3, (size_t)NL, (size_t)OUT);
    e = rel(ylr, y + (size_t)p * NL * OUT, (size_t)NL * OUT);
    CHECK(e <= 1e-5, "row-parallel forward (reduce-scattered partial sums), rel %.2e", e);
    float *dxr = malloc((size_t)N * IL * 4);
    gd = gemm(N, IL, OUT, 0, 0, OUT, IN, IL, 0.0f);
    ops->gemm(dxr, dy, w + p * IL, &gd);
    e = 0;
    for (int i = 0; i < N; i++) e = fmax(e, rel(dxr + (size_t)i * IL, dx + (size_t)i * IN + p * IL, (size_t)IL));
    CHECK(e <= 1e-6, "row-parallel input gradient: local columns, rel %.2e", e);

    /* vocab-parallel embedding: exact */
    const int V = 16 * P, VL = V / P, D = 10;
    float *wte = malloc((size_t)V * D * 4), *emb = malloc((size_t)N * D * 4), *part = malloc((size_t)N * D * 4);
    float *embl = malloc((size_t)NL * D * 4), *st4 = malloc((size_t)N * D * 4);
    int32_t *tok = malloc((size_t)N * 4);
    fill_rand(wte, (size_t)V * D, 11);
    seed(12);
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(lcg() % (uint32_t)V);
    ops->embedding_forward(emb, tok, wte, N, D, 0, V);
    ops->embedding_forward(part, tok, wte + (size_t)p * VL * D, N, D, p * VL, VL);
    tp_reduce_scatter_rows(ops, g, embl, part, st4, (size_t)NL, (size_t)D);
    CHECK(!memcmp(embl, emb + (size_t)p * NL * D, (size_t)NL * D * 4), "vocab-parallel embedding, bit for bit");

    /* vocab-parallel cross-entropy, with ignored labels */
    const int NV = 6 * P;
    float *lg = malloc((size_t)NV * V * 4), *dl = malloc((size_t)NV * V * 4), *loss = malloc((size_t)NV * 4);
    float *lgl = malloc((size_t)NV * VL * 4), *loss2 = malloc((size_t)NV * 4), *stats = malloc((size_t)3 * NV * 4);
    int32_t *tg = malloc((size_t)NV * 4);
    fill_rand(lg, (size_t)NV * V, 13);
    for (size_t i = 0; i < (size_t)NV * V; i++) lg[i] *= 6.0f;
    seed(14);
    for (int i = 0; i < NV; i++) tg[i] = (int32_t)(lcg() % (uint32_t)V);
    tg[1] = OPS_IGNORE_INDEX;
    tg[NV - 1] = OPS_IGNORE_INDEX;
    ops->cross_entropy(dl, loss, lg, tg, NV, V, 0.25f);
    for (int i = 0; i < NV; i++) memcpy(lgl + (size_t)i * VL, lg + (size_t)i * V + p * VL, (size_t)VL * 4);
    tp_vocab_cross_entropy(ops, g, lgl, loss2, lgl, tg, NV, VL, p * VL, 0.25f, stats);
    e = rel(loss2, loss, (size_t)NV);
    CHECK(e <= 1e-6 && loss2[1] == 0.0f && loss2[NV - 1] == 0.0f, "vocab-parallel cross-entropy: losses rel %.2e", e);
    e = 0;
    for (int i = 0; i < NV; i++) e = fmax(e, rel(lgl + (size_t)i * VL, dl + (size_t)i * V + p * VL, (size_t)VL));
    CHECK(e <= 1e-6, "vocab-parallel cross-entropy: local dlogits columns rel %.2e", e);

    /* gathered logits (loss parallel off): the columns reassemble exactly and go back */
    float *lgf = malloc((size_t)NV * V * 4), *st5 = malloc((size_t)NV * V * 4), *back = malloc((size_t)NV * VL * 4);
    for (int i = 0; i < NV; i++) memcpy(lgl + (size_t)i * VL, lg + (size_t)i * V + p * VL, (size_t)VL * 4);
    const tetra_ops counting = counting_ops(ops);
    tp_all_gather_cols(&counting, g, lgf, lgl, st5, NV, VL);
    CHECK(!memcmp(lgf, lg, (size_t)NV * V * 4), "all-gather of columns rebuilds the logits");
    CHECK(counted_copies_2d == P && counted_copies == 0,
          "all-gather of columns: %ld strided copies for %d ranks, %ld copies", counted_copies_2d, P, counted_copies);
    counted_copies = counted_copies_2d = 0;
    tp_take_cols(&counting, g, back, lgf, NV, VL);
    CHECK(!memcmp(back, lgl, (size_t)NV * VL * 4), "taking this rank's columns back");
    CHECK(counted_copies_2d == 1 && counted_copies == 0, "taking columns: %ld strided copies, %ld copies",
          counted_copies_2d, counted_copies);

    free(full);
    free(local);
    free(stage);
    free(want);
    free(l16);
    free(f16);
    free(x);
    free(w);
    free(y);
    free(yl);
    free(dy);
    free(dx);
    free(dxp);
    free(dxl);
    free(st2);
    free(yp);
    free(ylr);
    free(st3);
    free(dxr);
    free(wte);
    free(emb);
    free(part);
    free(embl);
    free(st4);
    free(tok);
    free(lg);
    free(dl);
    free(loss);
    free(lgl);
    free(loss2);
    free(stats);
    free(tg);
    free(lgf);
    free(st5);
    free(back);
}

/* ---------------------------------------------------------------------------- the model */

/* element (r, c) of a parameter in the full model's storage */
static float full_at(const llama3_model *f, const llama3_param *q, const float *mem, int64_t r, int64_t c) {
    const int64_t cols = q->ndim == 2 ? q->shape[1] : 1;
    return mem[q->offset + (size_t)(r * cols + c)];
}

/* Compare this rank's box of every parameter (values or gradients) with the full model's. */
static double compare_boxes(const llama3_model *tpm, const float *tmem, const llama3_model *full, const float *fmem,
                            comm_group *g, int grads, const char **worst) {
    double worst_e = 0.0;
    *worst = "-";
    for (int i = 0; i < tpm->n_params; i++) {
        const llama3_param *p = &tpm->params[i];
        const llama3_param *q = llama3_find_param(full, p->name);
        if (!q) return INFINITY;
        const int64_t rows = p->box_shape[0], cols = p->ndim == 2 ? p->box_shape[1] : 1;
        float *mine = malloc(p->numel * 4), *ref = malloc(p->numel * 4);
        memcpy(mine, tmem + p->offset, p->numel * 4);
        /* a replicated parameter's gradient is a partial sum over the group */
        if (grads && p->tp_replicated) comm_all_reduce(g, mine, p->numel, COMM_F32, COMM_SUM, NULL);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                ref[r * cols + c] = full_at(full, q, fmem, p->box_start[0] + r, p->ndim == 2 ? p->box_start[1] + c : 0);
        double e = grads ? rel(mine, ref, p->numel) : (memcmp(mine, ref, p->numel * 4) ? INFINITY : 0.0);
        if (e > worst_e) {
            worst_e = e;
            *worst = p->name;
        }
        free(mine);
        free(ref);
    }
    return worst_e;
}

static void test_model(comm_group *g) {
    const int P = comm_group_size(g), p = comm_group_rank(g);
    llama3_args args;
    llama3_flavor("debugmodel", &args);
    char err[512];
    llama3_model full, tpm;
    if (llama3_model_init(&full, &args, 64, ops_cpu(), err, sizeof err) != 0) {
        CHECK(0, "%s", err);
        return;
    }
    llama3_layout lay = llama3_layout_full(&args);
    lay.tp_rank = p;
    lay.tp_size = P;
    if (llama3_model_init_layout(&tpm, &args, &lay, LLAMA3_STORAGE_OWN, 64, ops_cpu(), err, sizeof err) != 0) {
        CHECK(0, "%s", err);
        return;
    }
    tpm.ctx.tp = g;
    llama3_init_weights(&full, 9);
    llama3_init_weights(&tpm, 9);
    const char *worst;
    double e = compare_boxes(&tpm, tpm.param_mem, &full, full.param_mem, g, 0, &worst);
    CHECK(e == 0.0, "tp %d rank %d: its parameters equal the full model's slices (first difference: %s)", P, p, worst);
    CHECK(tpm.total_numel < full.total_numel || P == 1, "the rank holds %zu of %zu elements", tpm.total_numel,
          full.total_numel);
    const llama3_param *wq = llama3_find_param(&tpm, "layers.0.attention.wq.weight");
    const llama3_param *wo = llama3_find_param(&tpm, "layers.0.attention.wo.weight");
    CHECK(wq && wq->box_shape[0] == 256 / P && wq->box_start[0] == p * (256 / P) && wo->box_shape[1] == 256 / P,
          "wq holds this rank's heads (rows), wo their columns");

    const int b = 2, t = 32, n = b * t;
    int32_t in[64], tg[64];
    seed(21);
    for (int i = 0; i < n; i++) {
        in[i] = (int32_t)(lcg() % 2048u);
        tg[i] = (int32_t)(lcg() % 2048u);
    }
    tg[3] = OPS_IGNORE_INDEX;
    llama3_acts *af = llama3_acts_create(&full, b, t, err, sizeof err);
    llama3_acts *at = llama3_acts_create(&tpm, b, t, err, sizeof err);
    CHECK(af && at, "%s", err);
    if (!af || !at) return;
    llama3_zero_grads(&full);
    double lf = llama3_forward(&full, af, in, tg, 1.0f / 63.0f, NULL);
    llama3_backward(&full, af);
    llama3_zero_grads(&tpm);
    double lt = llama3_forward(&tpm, at, in, tg, 1.0f / 63.0f, NULL);
    llama3_backward(&tpm, at);
    CHECK(fabs(lt - lf) <= 1e-6 * fabs(lf), "tp %d loss %.9g vs full %.9g", P, lt, lf);
    e = compare_boxes(&tpm, tpm.grad_mem, &full, full.grad_mem, g, 1, &worst);
    CHECK(e <= 1e-5, "tp %d rank %d: every gradient is its slice of the full one, worst %s rel %.2e", P, p, worst, e);
    if (p == 0) printf("test_tp: tp %d: loss %.9g vs %.9g; worst gradient %s rel %.2e\n", P, lt, lf, worst, e);

    /* activation checkpointing under TP (recompute with its collectives in the I pass), and
     * every I before every W: bit-identical to the one-pass keep-all backward */
    const size_t bytes = tpm.total_numel * 4;
    float *g_ref = malloc(bytes);
    memcpy(g_ref, tpm.grad_mem, bytes);
    const int L = args.n_layers;
    unsigned keep[6];
    for (int l = 0; l < L; l++) keep[l] = l % 2 ? LLAMA3_KEEP_NONE : (LLAMA3_KEEP_ATT | LLAMA3_KEEP_Q | LLAMA3_KEEP_A);
    llama3_workspace *ws = llama3_workspace_create(&tpm, b, t, 1, L, err, sizeof err);
    llama3_acts *ak = ws ? llama3_acts_create_ws(&tpm, ws, keep, b, t, err, sizeof err) : NULL;
    CHECK(ak != NULL, "%s", err);
    if (ak) {
        llama3_zero_grads(&tpm);
        double lk = llama3_forward(&tpm, ak, in, tg, 1.0f / 63.0f, NULL);
        llama3_backward_head_input(&tpm, ak);
        for (int l = L - 1; l >= 0; l--) llama3_block_backward_input(&tpm, ak, l);
        llama3_backward_head_weight(&tpm, ak);
        for (int l = 0; l < L; l++) llama3_block_backward_weight(&tpm, ak, l);
        llama3_backward_embedding(&tpm, ak);
        CHECK(lk == lt && !memcmp(g_ref, tpm.grad_mem, bytes),
              "tp %d: checkpointed blocks, all I then all W: bit-identical to keeping everything", P);
        llama3_acts_free(&tpm, ak);
    }
    llama3_workspace_free(&tpm, ws);

    /* async tensor parallel: blocks of rows overlapped with their GEMMs, the same bits */
    {
        llama3_acts *aa = llama3_acts_create(&tpm, b, t, err, sizeof err);
        CHECK(aa != NULL, "%s", err);
        if (aa) {
            tpm.tp_async = 1;
            llama3_zero_grads(&tpm);
            double la = llama3_forward(&tpm, aa, in, tg, 1.0f / 63.0f, NULL);
            llama3_backward(&tpm, aa);
            tpm.tp_async = 0;
            CHECK(la == lt && !memcmp(g_ref, tpm.grad_mem, bytes),
                  "tp %d async: the same loss and gradients, bit for bit", P);
            llama3_acts_free(&tpm, aa);
        }
    }

    /* loss parallel off: the gathered-logits path gives the same loss and gradients */
    llama3_acts_free(&tpm, at);
    tpm.tp_gather_logits = 1;
    at = llama3_acts_create(&tpm, b, t, err, sizeof err);
    CHECK(at != NULL, "%s", err);
    if (at) {
        llama3_zero_grads(&tpm);
        double lg = llama3_forward(&tpm, at, in, tg, 1.0f / 63.0f, NULL);
        llama3_backward(&tpm, at);
        double eg = rel(tpm.grad_mem, g_ref, tpm.total_numel);
        CHECK(fabs(lg - lt) <= 1e-6 * fabs(lt) && eg <= 1e-5,
              "tp %d without loss parallel: loss %.9g vs %.9g, "
              "gradients rel %.2e",
              P, lg, lt, eg);
    }
    free(g_ref);
    llama3_acts_free(&tpm, at);
    llama3_acts_free(&full, af);
    llama3_model_free(&tpm);
    llama3_model_free(&full);
}

int main(int argc, char **argv) {
    int provided = 0, world = 1;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &check_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    mesh m;
    char err[512];
    if (mesh_init(&m, world, 1, 1, 1, 1, world, err, sizeof err)) {
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
    comm_group *g = comm_get(w, MESH_G_TP);
    test_primitives(g);
    test_model(g);
    comm_world_free(w);
    int f = failures, all = 0;
    MPI_Allreduce(&f, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (check_rank == 0) printf("test_tp: %d ranks, %d checks per rank, %d failures\n", world, checks, all);
    MPI_Finalize();
    return all ? 1 : 0;
}
