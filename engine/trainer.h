/* trainer.h — the training job: setup, the step loop, teardown.
 *
 * The ranks form the mesh pp x dp_replicate x dp_shard x cp x tp
 * (parallel/mesh.h) with a communicator per group (parallel/comm.h). Each rank
 * builds the model for its layout (its family's, models/model.h) without storage of its
 * own; FSDP (parallel/fsdp.h: FSDP, HSDP, or DDP when the shard degree is 1)
 * owns the parameter, gradient and working buffers and binds each unit to the
 * model while it computes.
 *
 * One optimizer step (train_step): each rank of the batch group reads its own
 * microbatches; the valid target tokens are counted and all-reduced over the
 * loss group; then the rank's list of schedule actions runs (parallel/pp:
 * forward / backward-input / backward-weight / full backward of a stage and
 * microbatch — gradient accumulation is the degenerate schedule F0 B0 F1 B1 ...)
 * with dloss_scale = 1 / global valid tokens, so accumulation and data parallel
 * give the global-token mean gradient; FSDP gathers each unit before it runs and
 * reduce-scatters its gradient after its W pass; then the gradient is clipped to
 * training.max_norm with the global norm of the sharded gradient and AdamW steps
 * the local shard at lr * schedule(step); the loss is summed over the loss group.
 *
 * Checkpoints (checkpoint/checkpoint.h, docs/checkpoint.md): with
 * checkpoint.enable the run resumes from the newest complete checkpoint in
 * <dump_folder>/<folder> (or load_step), under any data-parallel layout, and
 * continues at its step + 1; otherwise it may start from initial_load_path
 * (a tetra checkpoint, or Hugging Face safetensors read piece by piece). It
 * saves after every interval-th step and the last one (sync, or staged to host
 * memory and written by a background thread in async mode). create_seed_checkpoint
 * writes step-0 and exits.
 *
 * A dry run lays out everything — model, FSDP shards and working buffers,
 * activations, workspace, optimizer state — prints each rank's start-up memory
 * lines and returns without allocating backend memory or reading data.
 */
#ifndef TETRA_TRAINER_H
#define TETRA_TRAINER_H

#include "config/config.h"
#include "engine/job.h"
#include "kernels/ops.h"

typedef struct trainer trainer;

/* What a dry run lays out on one rank (all its pipeline stages together): bytes it
 * would take, bytes it would send per optimizer step, and the shape of its work. */
#define TRAINER_PLAN_MAX_STAGES 64
typedef struct {
    /* persistent */
    double param_bytes; /* fp32 master shard + its bf16 copy under mixed precision */
    double grad_bytes, optim_bytes;
    /* working */
    double work_param_bytes;            /* gathered parameters */
    double work_grad_bytes;             /* unsharded gradients */
    int grad_arenas, grad_arena_stages; /* pipeline parallel: the stages that hold unsharded gradients
                                           take turns in this many buffers (a stage's window never
                                           overlaps another's in the same buffer) */
    double reduce_bytes;                /* reduce-scatter staging */
    double act_bytes;                   /* every activation buffer + workspace (+ validation) */
    double act_mb_bytes;                /* one microbatch of all local stages under the AC policy */
    double act_mb_full_bytes;           /* ... without activation checkpointing */
    double workspace_bytes, validation_bytes, converter_bytes;
    double total_bytes; /* what the backend would allocate at start-up */
    /* training.enable_cpu_offload: page-locked host memory (fp32 master weights, AdamW's
     * moments, one unit's staging), not in total_bytes; param_bytes is then the device's
     * copy in the compute dtype and optim_bytes 0 */
    double host_bytes;
    int offload;
    int n_acts;               /* activation buffers: microbatches alive at once, over local stages */
    int n_dropping, n_blocks; /* blocks that recompute in backward, of all local blocks */
    int recompute_slots, resident_units;
    /* sent per optimizer step */
    double fsdp_all_gather, fsdp_reduce_scatter, replicate_all_reduce, tp_bytes, pp_bytes;
    /* the work */
    int pp_rank, n_local, n_stages, n_microbatches, accum, local_batch, rows; /* rows: seq_len / cp */
    int stage[TRAINER_PLAN_MAX_STAGES];                                       /* [n_local] global stage index */
    int stage_blocks[TRAINER_PLAN_MAX_STAGES];
    int stage_embedding[TRAINER_PLAN_MAX_STAGES], stage_head[TRAINER_PLAN_MAX_STAGES];
    /* activation checkpointing: linear FLOPs per row the stage's backward repeats, and
     * how many of its blocks rerun their attention */
    double stage_recompute_flops[TRAINER_PLAN_MAX_STAGES];
    int stage_recompute_attention[TRAINER_PLAN_MAX_STAGES];
    int mixed; /* bf16 compute */
    double n_params, flops_per_token;
} trainer_plan;

typedef struct {
    int dry_run;          /* plan and print memory per rank; allocate nothing */
    int external_batches; /* no data loader: the caller supplies every step's batches */
    /* `tetra plan`: a dry run of rank `rank` of a world of `world` in this one process
     * (no MPI), filling *plan_out instead of logging */
    int virtual_world;
    trainer_plan *plan_out;
    /* A recording run (plan/ops.h): this op table instead of training.device's
     * (NULL: the device's), and, with skip_weight_init, no initial weights drawn (the
     * table computes nothing, so no value is ever read) */
    const tetra_ops *ops;
    int skip_weight_init;
    /* a recording run of one rank standing for a rank of a sharded (FSDP) layout: the
     * converters treat the weights as gathered and freed around each use */
    int weights_per_use;
} trainer_options;

/* Collective over MPI_COMM_WORLD. 0 with *out set, or an exit code (the error is
 * logged). A dry run returns 0 with *out NULL after printing its plan. */
int trainer_setup(trainer **out, const tetra_config *cfg, const tetra_job *job, int rank, int world,
                  const trainer_options *opt);
void trainer_teardown(trainer *t);

/* Runs the whole job on this rank (MPI is initialised). Returns the exit code. */
int trainer_run(const tetra_config *cfg, const tetra_job *job, int rank, int world, const trainer_options *opt);

#endif
