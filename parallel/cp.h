/* cp.h — context parallel: a sequence split over the ranks of the cp group, and
 * exact attention over the whole sequence from each rank's part.
 *
 * Sharding. A sequence of T tokens is cut into chunks. Load-balanced ("headtail",
 * TorchTitan's default): 2·cp chunks of c = T/(2·cp) tokens, rank r holds chunks r
 * and 2·cp−1−r, so every rank gets the same share of causal attention work.
 * Without balancing: cp chunks of c = T/cp, rank r holds chunk r. A rank's local
 * sequence is its chunks in that order (t = T/cp rows per sequence); every
 * per-token input (token ids, labels, RoPE positions) follows the same map
 * (cp_shard_tokens, cp_positions).
 *
 * Attention. Queries are local; keys and values are needed from every chunk at or
 * before the query's. Two ways to move them (parallelism.context_parallel_rotate_method):
 *   allgather  all-gather K and V once per call, put them in sequence order, and
 *              attend each local query chunk to the prefix it sees in one call of
 *              the attention op (causal by global position); the backward gathers
 *              again, accumulates dK/dV over the whole sequence and reduce-scatters
 *              them back to their owners. Memory: the whole sequence's K and V.
 *   alltoall   the ring: K/V blocks travel rank to rank (cp − 1 sends and
 *              receives, each overlapped with the attention on the block at hand),
 *              every (query chunk, key chunk) pair at or below the diagonal is one
 *              call of the op, and the partial results are merged by their
 *              log-sum-exp in fp32; in backward dK/dV accumulators travel with the
 *              blocks and arrive home after cp steps. Memory: two ranks' K/V.
 * Both give the unsharded op's results up to fp32 rounding of the merge order;
 * GQA is kept (key/value heads are never expanded). Layouts are the model's:
 * q/out [B, t, H, D], k/v [B, t, KV, D], lse [B, H, t] (local rows). The bf16
 * variants keep the blocks in bf16 and every sum (merges, dQ/dK/dV over blocks,
 * the reduce-scatter) in fp32.
 *
 * Document masks (block_causal): with dims.doc, the document ids of every GLOBAL
 * position of each sequence (every rank holds all of them, not only its chunks'), each
 * call passes its sequence's row with the blocks' global offsets, so the op masks
 * across documents and skips the tiles between them; chunks and load balancing stay
 * as they are (a block pair whose documents never meet costs the op almost nothing).
 *
 * Everything here is collective over the cp group. Nothing allocates: the caller
 * provides cp_workspace_bytes of backend memory.
 */
#ifndef TETRA_PARALLEL_CP_H
#define TETRA_PARALLEL_CP_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "parallel/comm.h"

typedef enum { CP_ROTATE_ALLGATHER = 0, CP_ROTATE_ALLTOALL } cp_rotate;

typedef struct {
    comm_group *g; /* the cp group (rank, size from it) */
    cp_rotate rotate;
    int balanced; /* headtail load balancing */
} cp_ctx;

/* "allgather" | "alltoall"; "headtail" | "none". 0, or -1. */
int cp_parse_rotate(const char *s, cp_rotate *out);
int cp_parse_balancer(const char *s, int *balanced);

/* Chunks per sequence over the group, and the global chunk index of the local
 * segment i (0 or 1 with balancing, 0 without) of rank r. */
int cp_n_chunks(int cp, int balanced);
int cp_n_segments(int balanced);
int cp_segment_chunk(int cp, int balanced, int r, int i);

/* The global position of each of rank r's t = T/cp local rows of a sequence. */
void cp_positions(int cp, int balanced, int r, int T, int32_t *pos /*[T/cp]*/);
/* Rank r's rows of b sequences of T tokens: out [b, T/cp] from in [b, T]. */
void cp_shard_tokens(int cp, int balanced, int r, int32_t *out, const int32_t *in, int b, int T);

/* The local shape of one attention call: b sequences of t local rows, h query heads,
 * kv key/value heads, head dim d, softmax scale. */
typedef struct {
    int b, t, h, kv, d;
    float scale;
    const int32_t *doc; /* [b, t * cp] document ids of the global positions (backend memory), or NULL */
} cp_attn_dims;

/* Backend bytes cp_attention_forward/backward need for these dims (t local), in
 * fp32 (bf16 = 0) or bf16 activations. */
size_t cp_workspace_bytes(const cp_ctx *c, const tetra_ops *ops, const cp_attn_dims *dim, int bf16);

/* out/lse of the local queries against the whole sequence's keys. q, k, v, out in
 * the compute dtype (fp32 or bf16), lse fp32. */
void cp_attention_forward(const cp_ctx *c, const tetra_ops *ops, int bf16, void *out, float *lse, const void *q,
                          const void *k, const void *v, const cp_attn_dims *dim, void *ws);
/* dq, dk, dv (WRITTEN, compute dtype) of the local rows from dout and the forward's
 * out and lse. */
void cp_attention_backward(const cp_ctx *c, const tetra_ops *ops, int bf16, void *dq, void *dk, void *dv,
                           const void *dout, const void *q, const void *k, const void *v, const void *out,
                           const float *lse, const cp_attn_dims *dim, void *ws);

#endif
