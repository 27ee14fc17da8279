/* tp.c — tensor-parallel primitives (see tp.h). */
#include "parallel/tp.h"

#include <stdio.h>
#include <stdlib.h>

/* commi_now is the comm module's clock */
double commi_now(void);

static tp_stats totals;

tp_stats tp_get_stats(void) { return totals; }

static void timed_wait(comm_request *r) {
    double t0 = commi_now();
    comm_wait(r);
    totals.wait_s += commi_now() - t0;
}

static size_t type_size(tetra_dtype dt) { return dt == TETRA_BF16 ? 2 : 4; }

static comm_dtype comm_type(tetra_dtype dt) { return dt == TETRA_BF16 ? COMM_BF16 : COMM_F32; }

void tp_all_gather_rows(comm_group *g, void *full, const void *local, size_t rows_local, size_t cols, tetra_dtype dt) {
    const int size = comm_group_size(g);
    if (size > 1) {
        totals.collectives++;
        totals.bytes += (double)(size - 1) * (double)(rows_local * cols * type_size(dt));
    }
    comm_request *r = NULL;
    comm_all_gather(g, full, local, rows_local * cols, comm_type(dt), size > 1 ? &r : NULL);
    if (r) timed_wait(r);
}

/* out = staging[0] + staging[1] + ... + staging[P-1], left to right */
static void ordered_sum(const tetra_ops *ops, float *out, const float *staging, int size, size_t n) {
    if (size == 1) {
        ops->copy(out, staging, n * sizeof(float));
        return;
    }
    ops->add(out, staging, staging + n, n);
    for (int q = 2; q < size; q++) ops->add(out, out, staging + (size_t)q * n, n);
}

void tp_reduce_scatter_rows(const tetra_ops *ops, comm_group *g, float *out_local, const float *full, float *staging,
                            size_t rows_local, size_t cols) {
    const int size = comm_group_size(g);
    const size_t n = rows_local * cols;
    if (size == 1) {
        ops->copy(out_local, full, n * sizeof(float));
        return;
    }
    totals.collectives++;
    totals.bytes += (double)(size - 1) * (double)(n * sizeof(float));
    comm_request *r = NULL;
    comm_all_to_all(g, staging, full, n, COMM_F32, &r);
    timed_wait(r);
    ordered_sum(ops, out_local, staging, size, n);
}

void tp_column_parallel_in(const tetra_ops *ops, comm_group *g, void *full, const void *local, size_t rows_local,
                           size_t cols, tetra_dtype dt, int async, tp_rows_fn consume, void *user) {
    const int size = comm_group_size(g), p = comm_group_rank(g);
    if (!async || size == 1) {
        tp_all_gather_rows(g, full, local, rows_local, cols, dt);
        for (int q = 0; q < size; q++) consume(user, (size_t)q * rows_local, rows_local);
        return;
    }
    const size_t blk = rows_local * cols * type_size(dt);
    totals.collectives++;
    totals.bytes += (double)(size - 1) * (double)blk;
    comm_request **rq = calloc((size_t)size, sizeof *rq);
    if (!rq) {
        fprintf(stderr, "tp: out of host memory\n");
        abort();
    }
    for (int j = 1; j < size; j++) { /* ring step j: to p - j, from p + j */
        const int to = (p - j + size) % size, from = (p + j) % size;
        comm_sendrecv(g, (char *)full + (size_t)from * blk, from, local, to, rows_local * cols, comm_type(dt), &rq[j]);
    }
    ops->copy((char *)full + (size_t)p * blk, local, blk);
    consume(user, (size_t)p * rows_local, rows_local); /* this rank's rows while the others travel */
    for (int j = 1; j < size; j++) {
        timed_wait(rq[j]);
        consume(user, (size_t)((p + j) % size) * rows_local, rows_local);
    }
    free(rq);
}

void tp_row_parallel_out(const tetra_ops *ops, comm_group *g, float *out_local, float *full, float *staging,
                         size_t rows_local, size_t cols, int async, tp_rows_fn produce, void *user) {
    const int size = comm_group_size(g), p = comm_group_rank(g);
    const size_t n = rows_local * cols;
    if (!async || size == 1) {
        for (int q = 0; q < size; q++) produce(user, (size_t)q * rows_local, rows_local);
        tp_reduce_scatter_rows(ops, g, out_local, full, staging, rows_local, cols);
        return;
    }
    totals.collectives++;
    totals.bytes += (double)(size - 1) * (double)(n * sizeof(float));
    comm_request **rq = calloc((size_t)size, sizeof *rq);
    if (!rq) {
        fprintf(stderr, "tp: out of host memory\n");
        abort();
    }
    for (int j = 1; j < size; j++) { /* ring step j: block of p + j out, p - j's partial of ours in */
        const int to = (p + j) % size, from = (p - j + size) % size;
        produce(user, (size_t)to * rows_local, rows_local);
        comm_sendrecv(g, staging + (size_t)from * n, from, full + (size_t)to * n, to, n, COMM_F32, &rq[j]);
        for (int k = 1; k < j; k++) comm_test(rq[k]); /* MPI moves messages only inside its calls */
    }
    produce(user, (size_t)p * rows_local, rows_local);
    ops->copy(staging + (size_t)p * n, full + (size_t)p * n, n * sizeof(float));
    for (int j = 1; j < size; j++) timed_wait(rq[j]);
    free(rq);
    ordered_sum(ops, out_local, staging, size, n);
}

void tp_vocab_cross_entropy(const tetra_ops *ops, comm_group *g, float *dlogits, float *losses, const float *logits,
                            const int32_t *targets, int n, int v_local, int v_start, float dloss_scale, float *stats) {
    float *row_max = stats, *sum_exp = stats + n, *target_logit = stats + 2 * (size_t)n;
    ops->ce_shard_max(row_max, logits, n, v_local);
    comm_all_reduce(g, row_max, (size_t)n, COMM_F32, COMM_MAX, NULL);
    ops->ce_shard_sums(sum_exp, target_logit, logits, row_max, targets, n, v_local, v_start);
    /* sum_exp and target_logit are adjacent: one all-reduce moves both */
    comm_all_reduce(g, sum_exp, 2 * (size_t)n, COMM_F32, COMM_SUM, NULL);
    ops->ce_shard_finish(dlogits, losses, logits, row_max, sum_exp, target_logit, targets, n, v_local, v_start,
                         dloss_scale);
}

void tp_all_gather_cols(const tetra_ops *ops, comm_group *g, float *full, const float *local, float *staging, int n,
                        int v_local) {
    const int size = comm_group_size(g);
    const size_t vl = (size_t)v_local, row = (size_t)size * vl;
    comm_all_gather(g, staging, local, (size_t)n * vl, COMM_F32, NULL);
    /* one strided copy per rank block: a copy per row is a launch per row on a GPU */
    for (int q = 0; q < size; q++)
        ops->copy_2d(full + (size_t)q * vl, row * sizeof(float), staging + (size_t)q * n * vl, vl * sizeof(float),
                     vl * sizeof(float), (size_t)n);
}

void tp_take_cols(const tetra_ops *ops, comm_group *g, float *local, const float *full, int n, int v_local) {
    const int size = comm_group_size(g), p = comm_group_rank(g);
    const size_t vl = (size_t)v_local, row = (size_t)size * vl;
    ops->copy_2d(local, vl * sizeof(float), full + (size_t)p * vl, row * sizeof(float), vl * sizeof(float), (size_t)n);
}
