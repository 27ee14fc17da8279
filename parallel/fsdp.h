/* fsdp.h — fully sharded data parallel (ZeRO-3), HSDP and DDP over units of
 * parameters, with per-unit working buffers.
 *
 * A model declares its parameters (dt_param_decl: name, global shape, the box of
 * the global tensor this rank holds, unit, offset in a flat index space) and the
 * element range of every unit (embedding, each block, the head). Each unit is
 * sharded over the shard group (dp_shard x cp) as one flat range padded to a
 * multiple of the group size S, as FSDP's flat parameter: rank k of the group
 * owns unit elements [k s_u, (k+1) s_u), s_u = ceil(numel_u / S); the tail of the
 * last rank's range is zero padding. What stays on a rank between steps is that
 * shard: fp32 master parameters (plus their bf16 copy under mixed precision) and
 * fp32 gradients; the optimizer state is the caller's, sized fsdp_local_numel.
 *
 * A unit's full parameters exist only between its all-gather and its reshard,
 * in a working buffer: a unit the reshard policy keeps gathered after forward
 * ("resident": the head by default, every unit under `never` or pipeline
 * parallel) has its own; the others share two rotating slots, so at most two of
 * them are unsharded at a time (the one computing and the prefetched next). The
 * all-gather lands directly in the working buffer (the gathered padded unit IS
 * the unit's row-major parameters followed by padding). FSDP tells the model
 * where a unit's parameters are by writing the caller's table unit_params[u]
 * (NULL while resharded), and where its gradient accumulates through
 * unit_grads[u].
 *
 * Gradients: by default a unit's gradient buffer is taken (zeroed) when its W
 * pass starts and reduce-scattered in fp32 into the shard right after it, while
 * the next unit computes; two rotating buffers. With reduce_at_last_microbatch
 * (pipeline parallel) each unit has its own gradient buffer that accumulates
 * over the step's microbatches and is reduce-scattered after the unit's last W
 * pass, so a schedule may defer W passes across microbatches; a unit's buffer is
 * zeroed when its first W pass of the step binds it, and is the unit's from then
 * until fsdp_finish_grads has waited for its reduction. HSDP: once a
 * unit's reduce-scatter of the last microbatch is done, its shard is
 * all-reduced over the replicate group.
 *
 * Per unit and microbatch (the hooks; u is the unit index):
 *   forward:  fsdp_pre_forward (gather if needed, prefetch the next unit), the
 *             unit's forward, fsdp_post_forward (reshard per policy)
 *   backward: fsdp_pre_backward (gather if resharded, prefetch the previous unit
 *             that reads parameters), the unit's I pass; fsdp_pre_backward_weight
 *             (gather if needed, bind a gradient buffer), the unit's W pass,
 *             fsdp_post_backward_weight (start the reduction when due; reshard)
 * and per step fsdp_begin_step, fsdp_finish_grads (wait for every reduction),
 * fsdp_grad_sq_norm (global sum of squares, each shard counted once), the
 * optimizer on fsdp_master / fsdp_grad (and fsdp_compute_shard), then
 * fsdp_params_updated.
 *
 * Under tensor parallel each rank of the tp group shards its own boxes (the flat layouts
 * have the same length and place the replicated parameters, the norms, at the same
 * offsets); the partial gradients of replicated parameters are all-reduced over tp
 * once a unit's last reduce-scatter is done, and the gradient norm counts them once.
 *
 * Shard degree 1 is plain replicated data parallel: the master and gradient
 * "shards" are whole-layout buffers, bound to the model for good, nothing is
 * gathered, and each unit's gradient is all-reduced over the replicate group
 * after its W pass on the last microbatch (DDP). World size 1 does no
 * communication at all.
 *
 * CPU offload (TorchTitan's training.enable_cpu_offload, offload = 1 on a backend whose
 * memory is not host memory): the fp32 master shard lives in page-locked host memory
 * (as does the optimizer state, which is the caller's), the device keeps only the
 * shard in the compute dtype (what the all-gather reads and, at S = 1, what the model
 * computes with) and the fp32 gradient shard. The optimizer runs on the host, unit by
 * unit (fsdp_offload_update): each unit's gradient shard is copied to the host, the
 * caller updates the master and writes the new compute-dtype values, which are copied
 * back; while the host updates one unit, the next unit's gradient and the previous
 * unit's parameters are in transit. Host memory: the master and the moments (12 bytes
 * per parameter) plus two units' staging.
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
    comm_group *shard;     /* parameters are sharded over it (dp_shard x cp) */
    comm_group *replicate; /* gradients are all-reduced over it (dp_replicate) */
    comm_group *tp;        /* tensor parallel (NULL: none): the gradients of parameters declared
                                       `replicated` are summed over it; every other parameter is a
                                       different box on each of its ranks */
    fsdp_reshard_mode reshard;
    int pipeline_parallel;         /* "default" keeps units gathered after forward under PP */
    int reduce_at_last_microbatch; /* gradients accumulate unsharded until a unit's last W pass */
    int external_work_grads;       /* with reduce_at_last_microbatch: the unsharded gradient buffers
                                       (fsdp_memory.work_grad_bytes) are the caller's, given by
                                       fsdp_set_work_grads, so that units whose W passes never overlap
                                       (stages of one pipeline rank) can take turns in one arena */
    tetra_dtype compute_dtype;     /* F32 or BF16: the dtype of the gathered parameters */
    int n_units;
    const size_t *unit_offset; /* [n_units] each unit's range in the flat index space */
    const size_t *unit_numel;  /* [n_units] */
    int n_params;
    const dt_param_decl *params_decl; /* [n_params] */
    void **unit_params;               /* [n_units] written by FSDP: each unit's gathered parameters or NULL */
    float **unit_grads;               /* [n_units] written by FSDP: each unit's gradient buffer or NULL */
    int plan_only;                    /* lay out and report memory; allocate nothing (dry run) */
    int offload;                      /* CPU offload (see above); needs ops->host_alloc */
    const tetra_ops *host_ops;        /* offload: an op table on host memory (the CPU backend's) */
} fsdp_config;

typedef struct {
    size_t param_bytes;      /* persistent: fp32 master shard (on the host under offload) */
    size_t compute_bytes;    /* persistent: its bf16 copy (mixed precision), else 0; under offload the
                                device's copy in the compute dtype (fp32 too) */
    size_t host_bytes;       /* offload: page-locked host memory FSDP holds (master, staging) */
    size_t grad_bytes;       /* persistent: fp32 gradient shard */
    size_t optim_bytes;      /* AdamW m and v for the shard (2 x param_bytes) */
    size_t work_param_bytes; /* working: gathered parameters (resident units + 2 slots) */
    size_t work_grad_bytes;  /* working: unsharded gradient buffers */
    size_t reduce_bytes;     /* working: reduce-scatter receive staging */
    size_t max_unit_bytes;   /* largest unit, unsharded fp32 */
    int resident_units;      /* units with their own gathered buffer */
} fsdp_memory;

typedef struct {
    double wait_s; /* time spent waiting for collectives */
    long all_gathers, reduce_scatters, all_reduces;
} fsdp_stats;

typedef struct fsdp fsdp;

fsdp *fsdp_create(const fsdp_config *cfg, char *err, size_t errlen);
void fsdp_free(fsdp *f);

int fsdp_shard_degree(const fsdp *f);
int fsdp_replicate_degree(const fsdp *f);
/* Persistent local storage, fsdp_local_numel elements each: the master shard (backend
 * memory, or page-locked host memory under offload: fsdp_offloaded) and the gradient
 * shard (backend memory). */
float *fsdp_master(fsdp *f);
float *fsdp_grad(fsdp *f);
int fsdp_offloaded(const fsdp *f);
/* The fp32 parameters in backend memory: the master, or under offload its device copy
 * (fp32 compute only; NULL under offload with bf16 compute, where fsdp_compute_shard is
 * the device's only copy). */
float *fsdp_device_master(fsdp *f);
/* Mixed precision: the bf16 copy of the master shard (fsdp_local_numel elements) that
 * adamw_step_bf16 writes and the all-gather reads; NULL for fp32 compute. */
uint16_t *fsdp_compute_shard(fsdp *f);
size_t fsdp_local_numel(const fsdp *f);
/* This rank's piece of every parameter, in the order of the declarations. */
const dt_tensor *fsdp_tensors(const fsdp *f);
/* Does unit u stay gathered after its forward (resident)? */
int fsdp_reshards_after_forward(const fsdp *f, int u);
/* A unit whose backward reads no parameters (e.g. an embedding lookup) is not
 * gathered for backward. */
void fsdp_set_backward_needs_params(fsdp *f, int u, int needs);

/* Fill the master shard: fill(user, param index, start, count, host_out) writes
 * elements [start, start + count) of that parameter's GLOBAL row-major tensor
 * (count <= 1 << 20 per call; a call never crosses a row of the rank's box that is
 * not contiguous in the global tensor). 0, or -1 when fill fails (it returns
 * nonzero) or host memory runs out. */
typedef int (*fsdp_fill_fn)(void *user, int param, size_t start, size_t count, float *host_out);
int fsdp_init_shards(fsdp *f, fsdp_fill_fn fill, void *user);

void fsdp_begin_step(fsdp *f);
/* fsdp_begin_step for a caller whose first write of each gradient in a step can overwrite
 * it: where the gradients are the shard itself (no sharding) they are left as they are
 * and it returns 1 (the caller overwrites; what lies between parameters stays zero from
 * start-up, as nothing writes it); otherwise it zeroes as fsdp_begin_step does and
 * returns 0. */
int fsdp_begin_step_unzeroed(fsdp *f);
void fsdp_pre_forward(fsdp *f, int u);
void fsdp_post_forward(fsdp *f, int u);
void fsdp_pre_backward(fsdp *f, int u);
void fsdp_pre_backward_weight(fsdp *f, int u);
/* last_microbatch: this was the unit's last W pass of the step. */
void fsdp_post_backward_weight(fsdp *f, int u, int last_microbatch);
void fsdp_finish_grads(fsdp *f);
/* external_work_grads: the memory (work_grad_bytes, 64-byte aligned) the unsharded
 * gradient buffers live in from now on; before the first W pass. The caller lets
 * another user write it only after this FSDP's fsdp_finish_grads and before its next
 * W pass. */
void fsdp_set_work_grads(fsdp *f, void *mem);
/* Offload: the optimizer step on the host, one unit's shard at a time (on a thread of its
 * own, while the device copies the neighbouring units). For each unit,
 * update(user, offset, n, grad, params_out) gets the unit's range of the local shard
 * [offset, offset + n), its gradient copied to page-locked host memory, and writes the
 * updated parameters in the compute dtype to params_out (n elements, host), which are
 * then copied to the device shard. The caller updates fsdp_master and its own moments
 * at the same offsets. Then as fsdp_params_updated. */
typedef void (*fsdp_host_update_fn)(void *user, size_t offset, size_t n, const float *grad, void *params_out);
void fsdp_offload_update(fsdp *f, fsdp_host_update_fn update, void *user);
/* Sum of squares of the whole (global) gradient. */
double fsdp_grad_sq_norm(fsdp *f);
/* The same in two halves, with no host wait of their own: _local queues this rank's sum
 * of squares (fp32) into dev_out (backend memory, one float); _global_dev, given that
 * value widened to double in backend memory, sums it over the ranks holding other pieces
 * (each shard counted once), as fsdp_grad_sq_norm returns it. */
void fsdp_grad_sq_norm_local(fsdp *f, float *dev_out);
void fsdp_grad_sq_norm_global_dev(fsdp *f, double *dev);
/* The master shard changed in an optimizer step (which also wrote the bf16 copy
 * under mixed precision): gathered copies are stale. */
void fsdp_params_updated(fsdp *f);
/* The master shard was written otherwise (init, checkpoint load): refresh the
 * bf16 copy from it, then as fsdp_params_updated. */
void fsdp_master_changed(fsdp *f);
/* Start gathering unit u without waiting, when a buffer is free for it (resident
 * units always; transient ones while a slot is free): the UNSHARD action. The next
 * pre-hook of the unit waits for it. */
void fsdp_prefetch(fsdp *f, int u);
/* Free every gathered unit (e.g. before a long pause): the RESHARD action. */
void fsdp_reshard_all(fsdp *f);

/* Bytes this rank sends per optimizer step of `microbatches` microbatches, by collective
 * (the schedule of gradient accumulation: every unit gathered for its forward, gathered
 * again for its backward when the policy resharded it and its backward reads parameters,
 * one reduce-scatter per unit and microbatch, the replicate all-reduce once per step). */
typedef struct {
    double all_gather, reduce_scatter, all_reduce;
} fsdp_traffic;
/* A gather codec: the parameters it is enabled for travel in the all-gather as `bytes`
 * bytes per element instead of the compute dtype. encode writes the codes of n elements of
 * parameter param (src: this rank's compute copy, bf16, or its fp32 master, as src_type
 * says); decode fills elements [first, first + n) of the parameter whose place in the
 * gathered buffer starts at param_dst (room for its elements in dst_type, the compute
 * dtype) from their codes: with their values, or with anything its own users of that
 * parameter read instead (Float8 keeps the codes themselves, which its linear reads).
 * Float8's (torchao's float8 all-gather for FSDP2) is one: float8/float8.c. */
typedef struct fsdp_gather_codec fsdp_gather_codec;
struct fsdp_gather_codec {
    const char *name;
    int bytes;
    void (*encode)(const fsdp_gather_codec *c, int param, uint8_t *dst, const void *src, tetra_dtype src_type,
                   size_t n);
    void (*decode)(const fsdp_gather_codec *c, int param, void *param_dst, size_t first, tetra_dtype dst_type,
                   const uint8_t *src, size_t n);
    void *user; /* the codec's own state */
};
/* Coded all-gather: the n parameters named here travel coded. A unit holding any of them
 * gathers one byte block per rank: the codes of its shard and, packed after them, its
 * other elements in the compute dtype; the gathered buffer then holds what decode makes of
 * the codes. The codec must outlive f. Call once, before the first gather; a no-op without
 * sharding. 0, or -1 with err. */
int fsdp_enable_coded_gather(fsdp *f, int n, const int *params, const fsdp_gather_codec *codec, char *err,
                             size_t errlen);
fsdp_traffic fsdp_step_traffic(const fsdp *f, int microbatches);

fsdp_memory fsdp_memory_report(const fsdp *f);
fsdp_stats fsdp_get_stats(const fsdp *f);

#endif
