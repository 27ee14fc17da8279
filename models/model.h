/* model.h — what the trainer needs of a model family: TorchTitan's TrainSpec and
 * parallelize roles, as one table of functions.
 *
 * A family lives in its own folder (models/llama3/) and describes itself with one
 * model_family table, listed in models/registry.c (or registered with
 * model_family_register); model.name picks it. The trainer
 * (engine/) never names a family: it holds the family's resolved hyperparameters as
 * a model_args, cuts the pipeline and builds each stage through the table, and runs a
 * stage unit by unit:
 *
 *   units     a stage's parameters come in units (FSDP's wrapping granularity), in
 *             forward order 0 .. n_units - 1: an optional input unit that reads the
 *             token ids (the embedding), blocks that map the residual stream to
 *             itself, and an optional output unit that computes the loss (the head).
 *   forward   unit by unit in order; the output unit leaves the loss.
 *   backward  unit by unit in reverse, split as the zero-bubble schedules need it:
 *             the I pass (input gradients) and the W pass (weight gradients); I then
 *             W of every unit equals the one-pass backward bit for bit. The input
 *             unit's I pass does nothing (the token ids have no gradient).
 *   boundary  what a stage receives and hands on (the residual at its first and
 *             past its last block) and the gradients of those, for the pipeline.
 *
 * A block keeps some of its activations for backward and recomputes the rest: its
 * keep mask (the family's bits; 0 keeps only the block's input, the stage's keep_all
 * keeps everything) comes from activation_checkpoint.* through ac_policy. Each
 * microbatch's activations (model_acts) sit on a workspace (model_workspace) the
 * rank's stages share.
 *
 * The family fills the stage's public fields in parallelize; the trainer reads them
 * and never looks inside impl.
 */
#ifndef TETRA_MODELS_MODEL_H
#define TETRA_MODELS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "kernels/ops.h"
#include "models/linear.h"
#include "parallel/comm.h"
#include "parallel/cp.h"
#include "parallel/fsdp.h"
#include "parallel/mesh.h"
#include "parallel/pp/generate.h"

typedef struct model_family model_family;

/* A family's hyperparameters (model.flavor with the model.* overrides), held by value:
 * the bytes are the family's own arguments, which fit in them. The schema's model keys
 * are Llama 3's (config/config.c, cfg_model): today every family receives a llama3_args
 * resolved from them; a family with other hyperparameters adds its keys and its case
 * in cfg_model. */
#define MODEL_ARGS_BYTES 256
typedef struct {
    const model_family *family;
    union {
        long double align_;
        void *align_ptr_;
        unsigned char bytes[MODEL_ARGS_BYTES];
    } u;
} model_args;

/* The pipeline's keys (parallelism.pipeline_parallel_*). */
typedef struct {
    int pp;                                /* pipeline ranks */
    pp_schedule_kind kind;                 /* decides stages per rank and their placement */
    int layers_per_stage;                  /* 0 = not set */
    int first_stage_less, last_stage_less; /* the input unit's and the output unit's weight in blocks */
} model_pp_spec;

#define MODEL_MAX_STAGES 256

/* What a stage is parallelized over on this rank. */
typedef struct {
    const tetra_ops *ops;
    const mesh *msh;
    int rank;
    comm_world *cw;            /* the mesh's groups */
    int cp_rank, cp_size;      /* context parallel: this rank's chunks of every sequence */
    int cp_balanced;           /* load-balanced chunks */
    cp_rotate rotate;          /* context parallel: all-gather, or the all-to-all ring */
    int loss_parallel;         /* 0: gather the logits before the loss (disable_loss_parallel) */
    int async_tp;              /* enable_async_tensor_parallel */
    int bf16;                  /* compute in bf16 */
    int max_rows;              /* the longest sequence (rows) the stage computes */
    int dry_run;               /* declare only: no backend memory */
    fsdp_reshard_mode reshard; /* fsdp_reshard_after_forward */
    int offload;               /* training.enable_cpu_offload (parallel/fsdp.h) */
    const tetra_ops *host_ops; /* offload: the op table on host memory */
} model_parallel_env;

/* The model of one pipeline stage on this rank. */
typedef struct {
    const model_family *family;
    void *impl;                 /* the family's model; NULL when none was built */
    int n_params, n_units;      /* this rank's parameters and units */
    int block_start, block_end; /* global blocks [block_start, block_end) */
    int has_input, has_output;  /* the input unit (token ids in) and the output unit (the loss) */
    int tp_rank, tp_size;       /* tensor parallel: this rank's part of every projection */
    int tp_async;               /* async tensor parallel */
    comm_group *tp;             /* the tensor-parallel group (NULL: degree 1) */
    tetra_dtype compute_dtype;  /* activations and what stages exchange */
    size_t residual_width;      /* elements per token of the residual stream */
    unsigned keep_all;          /* the keep mask that keeps every activation */
} model_stage;

typedef struct model_acts model_acts;
typedef struct model_workspace model_workspace;

/* forward_scratch = MODEL_FWD_SCRATCH_SHARED lays the forward scratch over the first
 * recompute slot (every backward is a full one: no slot is held while a forward runs). */
#define MODEL_FWD_SCRATCH_SHARED 2

/* What the output unit's forward reads and leaves. */
typedef struct {
    const int32_t *targets; /* [tokens] host memory (may hold OPS_IGNORE_INDEX) */
    float dloss_scale;      /* the loss gradient's scale: 1 / (global valid tokens) */
    int64_t *n_valid;       /* out: valid targets */
    float *loss_dev;        /* backend memory for the loss sum (no host wait), or NULL: read it */
} model_loss_io;

struct model_family {
    const char *name; /* model.name */

    /* ---- the job, from the hyperparameters */
    double (*num_params)(const model_args *a);
    /* TorchTitan's FLOPs per token (every query against every key) */
    double (*flops_per_token)(const model_args *a, int seq_len);
    /* the same with pairs_per_seq visible (query, key) pairs a sequence (mfu_computed) */
    double (*flops_per_token_pairs)(const model_args *a, double pairs_per_seq, int seq_len);
    /* the visible (query, key) pairs of one sequence under the model's mask; doc: its
     * document ids (NULL: one document) */
    double (*attention_pairs)(const model_args *a, const int32_t *doc, int seq_len);
    /* does a microbatch need its sequences' document ids? */
    int (*needs_documents)(const model_args *a);
    int (*vocab_size)(const model_args *a);
    /* a checkpoint's "model" object (a new reference) */
    json_t *(*checkpoint_json)(const model_args *a, int seq_len);
    /* A checkpoint's model tensors (names without "model/") are this model's, all of
     * them and no more: 0, or -1 with what differs in err. */
    int (*check_checkpoint)(const model_args *a, const char *const *names, int n, char *err, size_t errlen);

    /* ---- stages */
    /* the stages in all (*n_stages) and the blocks [start[s], end[s]) of each */
    int (*pipeline_stages)(const model_args *a, const model_pp_spec *pp, int *n_stages, int *start, int *end, char *err,
                           size_t errlen);
    /* Stage `stage` of n_stages (blocks [start, end)) declared for this rank's layout, with
     * its tensor- and context-parallel groups and flags; fills *s. 0, or -1 with err set
     * (nothing is left to free). */
    int (*parallelize)(model_stage *s, const model_args *a, int stage, int n_stages, int start, int end,
                       const model_parallel_env *env, char *err, size_t errlen);
    /* FSDP over the stage's units; *decl: the parameter declarations ([n_params],
     * malloc'd, the caller's, alive as long as the fsdp). NULL with err set. */
    fsdp *(*fully_shard)(model_stage *s, const model_parallel_env *env, dt_param_decl **decl, char *err, size_t errlen);
    /* The stage's linear descriptors (models/linear.h), what converters install on:
     * pointers into the stage's model, at most n_params of them into out. Returns the count. */
    int (*linears)(model_stage *s, model_linear **out);
    /* Every linear's module name in the whole model ("layers.3.attention.wq", ...), to
     * name(user, name): what a converter's filter can match. */
    void (*linear_names)(const model_args *a, void (*name)(void *user, const char *name), void *user);
    /* one line per parameter: model.print_after_conversion */
    void (*describe_params)(const model_stage *s, void (*line)(void *user, const char *text), void *user);
    void (*free)(model_stage *s);

    /* ---- weights */
    const char *(*param_name)(const model_stage *s, int param);
    /* elements [start, start + count) of the parameter's global row-major init */
    void (*init_param_range)(const model_stage *s, int param, uint64_t seed, size_t start, size_t count,
                             float *host_out);
    /* Hugging Face weights: open, read pieces by parameter name, close */
    void *(*hf_open)(const model_args *a, const char *path, char *err, size_t errlen);
    int (*hf_read)(void *reader, const char *name, size_t start, size_t count, float *host_out, char *err,
                   size_t errlen);
    void (*hf_close)(void *reader);
    /* a complete checkpoint folder to Hugging Face safetensors in dtype */
    int (*hf_export)(const char *step_dir, const char *out_dir, tetra_dtype dtype, char *err, size_t errlen);
    /* a buffer in the stage's parameter layout to one safetensors file */
    int (*hf_save_buffer)(const model_stage *s, const float *buf, const char *path, char *err, size_t errlen);

    /* ---- memory */
    /* activation_checkpoint.mode/option as a keep mask per local block */
    int (*ac_policy)(const model_stage *s, const char *mode, const char *option, unsigned *keep, char *err,
                     size_t errlen);
    /* the forward linear FLOPs a block's backward repeats per row (and *attention = 1
     * when the attention runs again) */
    double (*recompute_flops)(const model_stage *s, unsigned keep, int *attention);
    model_workspace *(*workspace_create)(const model_stage *s, int max_b, int max_t, int forward_scratch,
                                         int recompute_slots, char *err, size_t errlen);
    void (*workspace_free)(const model_stage *s, model_workspace *ws);
    size_t (*workspace_bytes)(const model_stage *s, int max_b, int max_t, int forward_scratch, int recompute_slots);
    /* one microbatch's activations (b sequences of t rows) on ws; keep: [blocks] */
    model_acts *(*acts_create)(const model_stage *s, model_workspace *ws, const unsigned *keep, int b, int t, char *err,
                               size_t errlen);
    void (*acts_free)(const model_stage *s, model_acts *a);
    size_t (*acts_bytes)(const model_stage *s, const unsigned *keep, int b, int t);
    /* bytes sent in tensor parallel's collectives per microbatch */
    double (*tp_traffic_bytes)(const model_stage *s, const unsigned *keep, int b, int t);

    /* ---- the passes */
    /* the microbatch's document ids (whole sequences), before its forward */
    int (*set_documents)(const model_stage *s, model_acts *a, const int32_t *doc, char *err, size_t errlen);
    /* the global block a unit is (-1: the input or the output unit) and its name */
    int (*unit_block)(const model_stage *s, int unit);
    const char *(*unit_name)(const model_stage *s, int unit);
    /* forward of one unit: the input unit reads tokens, the output unit reads loss
     * (and returns the loss sum when loss->loss_dev is NULL), blocks read neither */
    double (*forward)(model_stage *s, model_acts *a, int unit, const int32_t *tokens, const model_loss_io *loss);
    void (*backward_input)(model_stage *s, model_acts *a, int unit);
    void (*backward_weight)(model_stage *s, model_acts *a, int unit);
    /* Optional (NULL: the trainer zeroes the gradients before each step). Every gradient of
     * the stage holds no value for the step about to run: the first write of each overwrites
     * it, later writes of the step add. */
    void (*grads_fresh)(model_stage *s);
    /* the residual at the stage's input (at_output 0) or past its last block (1), or its
     * gradient (grad 1): backend memory, [tokens / tp_size, residual_width] */
    void *(*boundary)(const model_stage *s, model_acts *a, int at_output, int grad);
};

/* The family model.name names (built-in or registered), or NULL. */
const model_family *model_family_find(const char *name);
/* Add a family (the table must outlive the job). 0, or -1 if the name is taken or the
 * registry is full. */
int model_family_register(const model_family *f);
/* "llama3, ..." for messages */
void model_family_names(char *buf, size_t n);

/* The input unit (0), or -1 when the stage has none. */
static inline int model_input_unit(const model_stage *s) { return s->has_input ? 0 : -1; }

#endif
