/* fsdp.h — fully sharded data parallel (ZeRO-3), HSDP and DDP over units of
 * parameters.
 *
 * A model hands over its unsharded parameter and gradient buffers (one flat
 * allocation each), the element range of every unit (embedding, each block,
 * final norm + output) and its parameter records. Each unit is sharded over
 * the shard group (dp_shard x cp) as one flat range padded to a multiple of
 * the group size S, as FSDP's flat parameter: rank k of the group owns unit
 * elements [k s_u, (k+1) s_u), s_u = ceil(numel_u / S); the tail of the last
 * rank's range is zero padding. What stays on a rank between steps is that
 * shard: fp32 master parameters and fp32 gradients (the optimizer state is
 * the caller's, sized fsdp_local_numel). The unsharded buffers are working
 * space: a unit's range holds its full parameters only between an all-gather
 * and the next reshard, and its full gradients only until they are
 * reduce-scattered.
 *
 * Per unit and microbatch:
 *   forward:  fsdp_pre_forward (all-gather if needed, prefetch the next unit),
 *             the unit's forward, fsdp_post_forward (reshard per policy)
 *   backward: fsdp_pre_backward (re-gather if resharded, prefetch the previous
 *             unit, zero the unit's gradient range), the unit's I and W passes,
 *             fsdp_post_backward (reduce-scatter the gradient in fp32 into the
 *             shard, overlapping the next unit's backward; reshard; on the last
 *             microbatch all-reduce the shard over the replicate group: HSDP)
 * and per step fsdp_begin_step, fsdp_finish_grads (wait for every reduction),
 * fsdp_grad_sq_norm (global sum of squares, each shard counted once), the
 * optimizer on fsdp_master / fsdp_grad (and fsdp_compute_shard), then
 * fsdp_params_updated.
 *
 * Shard degree 1 is plain replicated data parallel: the master and gradient
 * "shards" are the unsharded buffers themselves, nothing is gathered, and each
 * unit's gradient is all-reduced over the replicate group after its backward
 * on the last microbatch (DDP). World size 1 does no communication at all.
 *
 * Gradients are SUMMED (no division): the loss is already normalised by the
 * global token count, as TorchTitan sets FSDP's gradient divide factor to 1.
 */
#ifndef TETRA_PARALLEL_FSDP_H
#define TETRA_PARALLEL_FSDP_H

#include <stddef.h>

#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/dtensor.h"

typedef enum { FSDP_RESHARD_DEFAULT = 0, FSDP_RESHARD_ALWAYS, FSDP_RESHARD_NEVER } fsdp_reshard_mode;

/* "default" | "always" | "never"; -1 for anything else. */
int fsdp_parse_reshard(const char *s, fsdp_reshard_mode *out);

typedef struct {
    const tetra_ops *ops;
    comm_group *shard;              /* parameters are sharded over it (dp_shard x cp) */
    comm_group *replicate;          /* gradients are all-reduced over it (dp_replicate) */
    fsdp_reshard_mode reshard;
    int pipeline_parallel;          /* "default" keeps units gathered after forward under PP */
    float *params, *grads;          /* unsharded buffers [total_numel] (backend memory) */
    uint16_t *compute_params;       /* mixed precision: the model's unsharded bf16 compute copy
                                       [total_numel], gathered in bf16; NULL: fp32 compute */
    size_t total_numel;
    int n_units;
    const size_t *unit_offset;      /* [n_units] */
    const size_t *unit_numel;       /* [n_units] */
    int n_params;
    const dt_param_decl *params_decl; /* [n_params] */
} fsdp_config;

typedef struct {
    size_t param_bytes;             /* persistent: fp32 master shard */
    size_t compute_bytes;           /* persistent: its bf16 copy (mixed precision), else 0 */
    size_t grad_bytes;              /* persistent: fp32 gradient shard */
    size_t optim_bytes;             /* AdamW m and v for the shard (2 x param_bytes) */
    size_t gather_bytes;            /* transient: all-gather staging */
    size_t reduce_bytes;            /* transient: reduce-scatter staging */
    size_t unsharded_bytes;         /* the unsharded parameter + gradient working buffers */
    size_t max_unit_bytes;          /* largest unit, unsharded fp32 */
} fsdp_memory;

typedef struct {
    double wait_s;                  /* time spent waiting for collectives */
    long all_gathers, reduce_scatters, all_reduces;
} fsdp_stats;

typedef struct fsdp fsdp;

fsdp *fsdp_create(const fsdp_config *cfg, char *err, size_t errlen);
void fsdp_free(fsdp *f);

int fsdp_shard_degree(const fsdp *f);
int fsdp_replicate_degree(const fsdp *f);
/* Persistent local storage (backend memory), fsdp_local_numel elements each. */
float *fsdp_master(fsdp *f);
float *fsdp_grad(fsdp *f);
/* Mixed precision: the bf16 copy of the master shard (fsdp_local_numel elements) that
 * adamw_step_bf16 writes and the all-gather reads; NULL for fp32 compute. */
uint16_t *fsdp_compute_shard(fsdp *f);
size_t fsdp_local_numel(const fsdp *f);
/* This rank's piece of every parameter, in the order of the declarations. */
const dt_tensor *fsdp_tensors(const fsdp *f);
/* Reshards unit u after forward under the configured policy? */
int fsdp_reshards_after_forward(const fsdp *f, int u);
/* A unit whose backward reads no parameters (e.g. an embedding lookup) is not
 * gathered for backward. */
void fsdp_set_backward_needs_params(fsdp *f, int u, int needs);

/* Fill the master shard: fill(user, param index, start, count, host_out)
 * writes elements [start, start + count) of that parameter's row-major values
 * (count <= 1 << 20 per call). */
typedef void (*fsdp_fill_fn)(void *user, int param, size_t start, size_t count, float *host_out);
int fsdp_init_shards(fsdp *f, fsdp_fill_fn fill, void *user);
/* Take the master shard from the unsharded parameter buffer (after a full
 * load into it); then as fsdp_master_changed. */
void fsdp_shard_from_unsharded(fsdp *f);

void fsdp_begin_step(fsdp *f);
void fsdp_pre_forward(fsdp *f, int u);
void fsdp_post_forward(fsdp *f, int u);
void fsdp_pre_backward(fsdp *f, int u);
void fsdp_post_backward(fsdp *f, int u, int last_microbatch);
void fsdp_finish_grads(fsdp *f);
/* Sum of squares of the whole (global) gradient. */
double fsdp_grad_sq_norm(fsdp *f);
/* The master shard changed in an optimizer step (which also wrote the bf16 copy
 * under mixed precision): gathered copies are stale. */
void fsdp_params_updated(fsdp *f);
/* The master shard was written otherwise (init, checkpoint load): refresh the
 * bf16 copy from it, then as fsdp_params_updated. */
void fsdp_master_changed(fsdp *f);
/* Free every gathered unit (e.g. before a long pause). */
void fsdp_reshard_all(fsdp *f);

fsdp_memory fsdp_memory_report(const fsdp *f);
fsdp_stats fsdp_get_stats(const fsdp *f);

#endif
