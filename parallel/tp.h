/* tp.h — tensor-parallel primitives over a tensor-parallel group of P ranks
 * (Megatron-style; parallel/ knows nothing of the model that uses them).
 *
 * Sequence parallel: an activation [N, C] between the parallel regions is split
 * by rows; rank p holds rows [p N/P, (p+1) N/P). Entering a region that needs
 * every row (a column-parallel linear) all-gathers the rows; leaving a
 * row-parallel linear, whose output is a partial sum on every rank,
 * reduce-scatters it back to row shards.
 *
 *   column-parallel linear  y[:, cols of p] = x W_p^T       (x all rows, no collective)
 *     backward input:       dx = sum_p dy_p W_p            (a partial sum: reduce-scatter)
 *   row-parallel linear     y = sum_p x[:, cols of p] W_p^T (a partial sum: reduce-scatter)
 *     backward input:       dx_p = dy W_p                  (dy all rows: all-gather first)
 *   vocab-parallel embedding: rank p holds vocabulary rows [p V/P, (p+1) V/P); a token's
 *     row comes from its owner, zeros from the others: a reduce-scatter of exact sums
 *   vocab-parallel cross-entropy: logits [N, V/P] per rank; the softmax statistics are
 *     all-reduced (max, then sum of exponentials and the target logit), so logits are
 *     never gathered (loss parallel)
 *
 * Reductions are deterministic and identical whatever the transport: a reduce-scatter
 * moves the blocks with an all-to-all and sums them in rank order 0..P-1, in fp32.
 * Buffers are backend memory (device memory under NCCL). A group of one rank makes
 * every primitive a copy (or nothing).
 */
#ifndef TETRA_PARALLEL_TP_H
#define TETRA_PARALLEL_TP_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "parallel/comm.h"

/* full[N, C] = the row blocks local[N/P, C] of every rank, in rank order. dt: F32 or BF16. */
void tp_all_gather_rows(comm_group *g, void *full, const void *local, size_t rows_local, size_t cols, tetra_dtype dt);

/* out_local[N/P, C] = sum over ranks q = 0..P-1 of rows [p N/P, (p+1) N/P) of full_q[N, C]
 * (fp32). staging: [P, N/P, C] fp32 backend memory. out_local may not alias full. */
void tp_reduce_scatter_rows(const tetra_ops *ops, comm_group *g, float *out_local, const float *full, float *staging,
                            size_t rows_local, size_t cols);

/* The column-parallel and row-parallel linears with their collectives. A callback
 * computes rows [row0, row0 + rows) of the linear's GEMMs (whatever implementation the
 * caller's linear has); it is called once per rank's block of rows, in both modes, so
 * they give the same bits (the same calls on the same shapes, in another order).
 *
 * tp_column_parallel_in: full = every rank's rows of `local` (all-gather, as
 *   tp_all_gather_rows), then consume on every block. async: the blocks travel in P - 1
 *   ring steps (step j: send to p - j, receive from p + j, one grouped exchange) and
 *   consume runs on this rank's block at once, then on each block as it arrives.
 * tp_row_parallel_out: produce writes every block of rows of the partial sum `full`
 *   (fp32), then out_local = this rank's rows summed over the group in rank order (as
 *   tp_reduce_scatter_rows). async: the other ranks' blocks are produced first, each
 *   leaving for its owner in a ring step as soon as it is written; this rank's last. */
typedef void (*tp_rows_fn)(void *user, size_t row0, size_t rows);
void tp_column_parallel_in(const tetra_ops *ops, comm_group *g, void *full, const void *local, size_t rows_local,
                           size_t cols, tetra_dtype dt, int async, tp_rows_fn consume, void *user);
void tp_row_parallel_out(const tetra_ops *ops, comm_group *g, float *out_local, float *full, float *staging,
                         size_t rows_local, size_t cols, int async, tp_rows_fn produce, void *user);

/* Time the host spent waiting for tensor-parallel collectives, their count and the
 * bytes this rank sent in them, since start. */
typedef struct {
    double wait_s;
    long collectives;
    double bytes;
} tp_stats;
tp_stats tp_get_stats(void);

/* Vocab-parallel cross-entropy over logits [N, V/P] holding vocabulary columns
 * [v_start, v_start + v_local): losses[N] (the same on every rank) and, unless NULL,
 * dlogits = (softmax - onehot) * dloss_scale for the local columns (may alias logits).
 * stats: [3, N] fp32 backend memory. Targets are in [0, V) or OPS_IGNORE_INDEX (no loss,
 * no gradient); no shard can tell a target beyond V from one in another shard. */
void tp_vocab_cross_entropy(const tetra_ops *ops, comm_group *g, float *dlogits, float *losses, const float *logits,
                            const int32_t *targets, int n, int v_local, int v_start, float dloss_scale, float *stats);

/* full[N, P * Vl] = the column blocks local[N, Vl] of every rank side by side (the
 * logits gathered when loss parallel is off). staging: [P, N, Vl] fp32. */
void tp_all_gather_cols(const tetra_ops *ops, comm_group *g, float *full, const float *local, float *staging, int n,
                        int v_local);
/* local[N, Vl] = columns [p Vl, (p+1) Vl) of full[N, P * Vl] (fp32). */
void tp_take_cols(const tetra_ops *ops, comm_group *g, float *local, const float *full, int n, int v_local);

#endif
