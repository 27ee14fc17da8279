/* trainer_internal.h — the state of a training job, shared by its parts:
 *   trainer_setup.c setup in named phases, teardown
 *   trainer_plan.c  the memory plan, its start-up lines and memory snapshots
 *   trainer.c       the step loop (data, metrics, saves, validation, stop requests)
 *   train_step.c    one optimizer step: the schedule's actions on the model and FSDP,
 *                   gradient clipping, AdamW and the LR schedule
 *   train_ckpt.c    checkpoint state: what is saved, finding and loading a checkpoint
 *   trainer_capi.c  entry points for the Python reference tests
 * Nothing here is part of the public contract (trainer.h).
 */
#ifndef TETRA_TRAINER_INTERNAL_H
#define TETRA_TRAINER_INTERNAL_H

#include <stdint.h>

#include "checkpoint/checkpoint.h"
#include "data/loader.h"
#include "config/config.h"
#include "engine/converter.h"
#include "engine/lr_schedule.h"
#include "telemetry/metrics.h"
#include "telemetry/trace.h"
#include "engine/trainer.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "parallel/comm.h"
#include "parallel/fsdp.h"
#include "parallel/mesh.h"
#include "parallel/pp/runtime.h"
#include "parallel/pp/schedule.h"

enum { G_MODEL = 0, G_EXP_AVG, G_EXP_AVG_SQ, N_GROUPS };

typedef struct {
    int64_t step; /* last completed training step */
    int64_t tokens_seen;
    int64_t lr_count; /* scheduler steps taken (the LambdaLR count) */
    int64_t opt_step; /* AdamW steps taken (bias correction) */
} train_counters;

/* What one optimizer step reports. */
typedef struct {
    double loss;     /* global mean over valid tokens */
    double max_loss; /* largest per-rank mean */
    double loss_sum; /* this rank's summed token losses */
    int64_t local_valid, global_valid;
    double grad_norm; /* before clipping */
    double lr;
    int nonfinite; /* the loss or the gradient norm is NaN/Inf: the parameters were not updated */
    /* The fields above except lr and the valid counts hold only when `read`: a step reads
     * the device's scalars when it logs, saves a checkpoint or offloads the optimizer
     * (train_step_read); the others leave them on the device. */
    int read;
    int64_t new_bad;   /* non-finite steps since the previous read, this one included */
    int64_t first_bad; /* the run's first non-finite step (0: none) */
    int run;           /* non-finite steps in a row up to the latest */
    int halted;        /* no update is applied any more (training.on_nonfinite): the run stops */
} step_result;

/* The shape of the step's batches. */
typedef struct {
    int batch;     /* sequences per microbatch */
    int seq_len;   /* tokens per sequence */
    int rows;      /* this rank's tokens of a sequence: seq_len / cp */
    size_t tokens; /* batch * rows: tokens of one microbatch on this rank */
    int accum;     /* gradient-accumulation rounds of the schedule per step */
    int n_mb;      /* microbatches per round */
    int round;     /* the round running now */
} train_shape;

/* A batch in host memory: this rank's rows, and (context parallel, or documents) the
 * whole sequences as loaded. */
typedef struct {
    int32_t *in, *lab;           /* [microbatches * tokens] this rank's rows */
    int32_t *full_in, *full_lab; /* context parallel: [sequences * seq_len] whole sequences */
    int32_t *doc;                /* block_causal or positions reset: the document ids of the whole
                                    sequences (every cp rank keeps all of them), else NULL */
} train_batch;

/* What the final Hugging Face export converts with (checkpoint.last_save_in_hf). */
typedef struct {
    const model_family *family;
    tetra_dtype dtype; /* checkpoint.export_dtype */
} train_hf_export;

/* One pipeline stage this rank runs: its part of the model, FSDP over it, its optimizer
 * state and its microbatches' activations. A rank runs one stage without pipeline
 * parallel (the whole model) and one or more with it (several for the looped and V
 * schedules). */
typedef struct {
    int index;           /* global stage index */
    model_stage model;   /* the family's model of the stage (models/model.h); impl NULL until built */
    dt_param_decl *decl; /* [model.n_params] the stage's parameters for FSDP */
    fsdp *fs;
    unsigned *keep;               /* [local blocks] what each block keeps for backward (activation checkpointing) */
    int n_dropping;               /* blocks that keep less than everything */
    int recompute_slots;          /* workspace slots for blocks between their I and W passes (the rank's) */
    int fwd_scratch;              /* the workspace's forward_scratch: 0, 1, or shared with slot 0
                                  when every backward of the rank's stages is a full one */
    model_workspace *ws;          /* one per rank: its stages run one action at a time */
    int ws_owner;                 /* this stage's model lays out (and frees) the rank's workspace */
    int grad_arena;               /* pipeline parallel with sharding: the arena its unsharded gradients live
                                  in (trainer.grad_arena_off), shared with the rank's stages whose
                                  gradient windows never overlap its own; -1: none */
    int n_acts;                   /* microbatch activation buffers (the schedule's peak alive on this stage) */
    model_acts **acts;            /* [n_acts] */
    int *acts_mb;                 /* [n_acts] the microbatch using each, or -1 */
    unsigned char *acts_state;    /* [n_acts] ACTS_* bits: what still holds the buffer */
    int n_send;                   /* gradients of the stage input being sent back (the schedule's peak) */
    void **send_buf;              /* [n_send] one residual each: [B, Tl / tp, dim] compute dtype */
    int *send_mb;                 /* [n_send] the microbatch whose gradient each holds, or -1 */
    float *adam_m, *adam_v;       /* [local] each, one allocation (page-locked host memory under CPU offload) */
    int adam_on_host;             /* adam_m came from host_alloc */
    dt_tensor *save_tensors;      /* [model.n_params] what this rank writes of the stage */
    int remote_prev, remote_next; /* the neighbouring stage runs on another rank */
    int local_prev, local_next;   /* ... or on this one: index into trainer.st, else -1 */
    void **conv_state;            /* [trainer.n_conv] each model converter's state for this stage */
    trace *tr;                    /* the job's profiler (NULL: off) */
} train_stage;

struct trainer {
    const tetra_config *cfg;
    const tetra_config_values *c;
    tetra_job job;
    trainer_options opt;
    int rank, world, threads;

    const tetra_ops *ops;
    const tetra_ops *host_ops; /* training.enable_cpu_offload: the CPU backend's, for AdamW on the host */
    int mixed;                 /* bf16 compute */
    mesh msh;
    comm_world *cw;
    comm_device_staging comm_staging; /* MPI on device buffers: the ops' copies */
    int comm_staged;                  /* 1 when comm runs MPI on device buffers */
    comm_group *g_world, *g_loss, *g_pp;
    comm_group *g_replicate; /* dp_replicate when it is more than 1, else NULL */

    model_args args; /* the model's family and hyperparameters (the job's) */
    /* pipeline: n_stages in all; this rank runs n_local of them (st[0..n_local-1],
     * ascending stage index) at pipeline rank pp_rank of pp_size */
    int n_stages, n_local, pp_rank, pp_size;
    train_stage *st;
    trace *tr; /* profiling traces (telemetry/trace.h), NULL when off */
    /* model.converters, in order (engine/converter.h) */
    int n_conv;
    const tetra_converter **conv;

    /* the step: accum rounds of the schedule, each over n_mb microbatches of batch
     * sequences of seq_len tokens, of which this rank holds rows each */
    train_shape shape;
    train_shape vshape; /* validation: batch, seq_len and rows (accum and n_mb unused) */
    struct {
        int rank, size;
        int balanced;       /* load-balanced chunks (parallel/cp.h) */
    } cp;                   /* context parallel */
    pp_schedule *sched;     /* compute-only */
    pp_schedule *run_sched; /* what this rank runs (lowered under pipeline parallel) */
    int n_grad_arenas;      /* unsharded gradient arenas (train_plan_grad_arenas) */
    size_t *grad_arena_off; /* [n_grad_arenas + 1] byte offsets; the last is the total */
    void *grad_arena_mem;   /* one allocation for all of them */
    model_workspace **vws;  /* [n_local] validation workspaces, when its shape differs */
    model_acts **vacts;     /* [n_local] */
    int vacts_own;          /* vacts were allocated for validation (else acts[0] of each stage) */

    /* data */
    char data_dir[4096];
    dl_loader *train, *val;
    train_batch batch;  /* this step's: accum * n_mb microbatches */
    train_batch vbatch; /* validation's: one batch of vshape */

    /* optimizer */
    lr_schedule lrs;
    train_counters tc;

    /* checkpoints and logs */
    char ckpt_dir[4096];
    ckpt_group *groups;      /* [N_GROUPS * n_local] what this rank loads, by group then stage */
    ckpt_group *save_groups; /* what it writes: replicated pieces from one tp rank only */
    ckpt_saver *saver;
    train_hf_export hf_export; /* the last save's conversion (its saver's ctx) */
    metrics_logger *ml;
    double n_params, flops_per_token, peak;
    const char *peak_src;
    char peak_src_buf[192]; /* the device name when the peak is the table's */
    size_t allocs_at_start;
    int plan_ready; /* every stage's layout is built (fill_plan may run) */

    int graph_warm; /* training.cuda_graph: a step has run, so the next ones are captured */

    /* during a step: what the stage callbacks need */
    float dloss_scale;
    double step_loss_sum;
    int64_t step_valid;
    /* The step's scalars in one block of backend memory (train_step_scalar_bytes), read in
     * one host wait on the steps that need them: the optimizer's state, each local stage's
     * gradient sum of squares widened to double, then each head forward's loss sum of the
     * step and each stage's fp32 sum of squares. step_host mirrors the block. */
    void *step_dev, *step_host;
    ops_optim_state *opt_dev;
    double *sq_dev;   /* [n_local] */
    float *loss_dev;  /* [loss_cap + n_local] */
    float *loss_host; /* [loss_cap + n_local], in step_host */
    int loss_cap, n_loss;
    int opt_ready;         /* opt_dev holds the update count (queued at the first step) */
    int64_t cur_step;      /* the step train_step runs */
    int64_t bad_seen;      /* non-finite steps known to the host */
    pp_run_stats pp_stats; /* the last step's runtime times (summed over rounds) */
    double pp_step_s;      /* the last step's wall time inside the schedule */
};

/* trainer_plan.c */
/* What this rank lays out (trainer.h): every buffer by category, what it sends. */
void train_fill_plan(const trainer *t, trainer_plan *p);
/* The start-up lines: the job, the layout, memory per rank, communication per step. */
void train_log_plan(trainer *t);
/* profiling.enable_memory_snapshot: this rank's snapshot for `step` (at_exit: a failure's). */
void train_memory_snapshot(const trainer *t, int64_t step, const char *reason, int at_exit);
/* Validation's forward keeps nothing but the residual stream and the head: a policy of
 * the stage's blocks (malloc'd), or NULL out of memory. */
unsigned *train_keep_none(const train_stage *s);
/* One pipeline send buffer of the stage: a residual of one microbatch. */
size_t train_send_bytes(const trainer *t, const train_stage *s);
void train_fmt_bytes(char *buf, size_t n, double bytes);

/* train_step.c */
/* The converters' pre_optimizer / post_optimizer hooks on every local stage, in order. */
void train_converters_pre_optimizer(trainer *t);
void train_converters_post_optimizer(trainer *t);
/* The step's schedule: accumulation on one stage, or the pipeline schedule (generated
 * or from the CSV), lowered and checked; the stages this rank runs must be set. */
int train_build_schedule(trainer *t, char *err, size_t errlen);
/* The activation buffers each local stage needs (peak[i] for st[i]) and the most of
 * its microbatches between an I pass and their W at once (open_iw[i]), and the most
 * gradient sends in flight (peak_send[i]), by replaying the schedule this rank runs. */
int train_plan_pools(trainer *t, int *peak, int *open_iw, int *peak_send, char *err, size_t errlen);
/* Pipeline parallel with sharding: a stage's unsharded gradients are written from its
 * first W (or B) pass of the step until its WAIT_REDUCE_GRAD has finished their
 * reductions (the whole step when it runs several rounds). Stages of this rank whose
 * windows never overlap share an arena, sized by the largest of them: sets
 * st[i].grad_arena, n_grad_arenas and grad_arena_off. 0, or -1 out of host memory. */
int train_plan_grad_arenas(trainer *t);
/* One optimizer step over t->h_in / t->h_lab (accum microbatches of this rank). */
void train_step(trainer *t, step_result *r);
/* Read the step's scalars from the device into r (one host wait): the loss, the gradient
 * norm, the update count and what went non-finite since the last read. Idempotent within
 * a step. */
void train_step_read(trainer *t, step_result *r);
/* Bytes of the step's scalar block (trainer_internal.h step_dev). */
size_t train_step_scalar_bytes(const trainer *t);
/* Forward of every stage of this rank over one batch (validation, warm-up), passing
 * activations along the pipeline; acts[i] serves st[i], each of ntok tokens. The summed loss of the batch
 * on every rank (0 with no valid token). */
double train_forward_only(trainer *t, model_acts **acts, size_t ntok, const int32_t *in, const int32_t *lab,
                          const int32_t *doc, float dloss_scale, int64_t *n_valid);
/* Forward and backward of one microbatch without an optimizer step (warm-up). */
void train_warmup(trainer *t);

/* Context parallel: this rank's rows (train_step.c) of n whole sequences of T tokens. */
void train_shard_batch(const trainer *t, int32_t *in, int32_t *lab, const int32_t *full_in, const int32_t *full_lab,
                       int n, int T);

/* train_ckpt.c */
int train_ckpt_excluded(const tetra_config_values *c, const char *what);
int train_find_checkpoint(trainer *t, char *load_path, size_t n, int *model_only, int *initial, char *err,
                          size_t errlen);
int train_load_checkpoint(trainer *t, const char *path, int model_only, char *err, size_t errlen);
/* Save after `step` (model_only: the last save's model-only or HF form). 0 or -1. */
int train_save_checkpoint(trainer *t, int64_t step, int model_only, int last, char *err, size_t errlen);
void train_log_save(const ckpt_saver *sv, int async_done);

#endif
