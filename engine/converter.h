/* converter.h — model converters: TorchTitan's `model.converters` extension point.
 *
 * A converter is a small table of hooks that changes how a model computes without
 * touching the core. The trainer applies the converters named in model.converters, in
 * that order, to every pipeline stage this rank runs:
 *   convert         after the stage's model is declared (its layout, tensor-parallel
 *                   boxes and linear descriptors exist) and before FSDP wraps it: e.g.
 *                   install another implementation on chosen linears (the family's
 *                   `linears`, models/linear.h);
 *   parallelized    after FSDP wrapped the stage (its shards exist, not yet filled): e.g.
 *                   Float8 asks FSDP to gather its weights in float8;
 *   pre_optimizer   every step, after the gradients are final (reduced, before
 *                   clipping and AdamW);
 *   optimizer_amax  every step, right before a stage's AdamW on the device: stretches of
 *                   the shard whose amaxes that AdamW should write as it updates them
 *                   (Float8's weights; the first converter that asks gets them);
 *   post_optimizer  every step, after AdamW wrote the parameters (e.g. Float8's one
 *                   amax all-reduce that precomputes the weight scales), and once before
 *                   the first step, when the parameters are initialised or loaded;
 *   destroy         at teardown.
 * Each hook runs on every rank at the same point of the step, so it may run
 * collectives over the groups the converter_env names. Float8 (float8/) is the
 * built-in converter; others register with converter_register before the config is
 * validated (the tests add their own).
 */
#ifndef TETRA_ENGINE_CONVERTER_H
#define TETRA_ENGINE_CONVERTER_H

#include <stddef.h>

#include "config/config.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "parallel/comm.h"
#include "parallel/fsdp.h"

/* What a converter sees of the job and of one stage. */
typedef struct {
    const tetra_config_values *cfg;
    const char *config_file; /* for messages ("command line" when none) */
    const tetra_ops *ops;
    int rank;
    int stage;              /* the global stage index */
    size_t max_rows;        /* tokens of one microbatch on this rank: the most rows a linear sees */
    int dry_run;            /* a plan: declare, allocate no backend memory */
    comm_group *shard;      /* the FSDP group the parameters are sharded over (dp_shard x cp) */
    comm_group *tp;         /* tensor parallel (NULL: none) */
    const model_args *args; /* the model's family and hyperparameters */
    /* the weights are gathered and freed around each use (FSDP over more than one rank,
     * or a recording standing for such a rank): nothing derived from them outlives a use */
    int weights_per_use;
    /* a recording (plan/ops.h) standing for a rank of an FSDP layout: no gather runs, so a
     * converter whose weights travel encoded records its uses as if they had arrived so */
    int stands_for_shard;
} converter_env;

typedef struct tetra_converter {
    const char *name;
    /* 0, or non-zero with err set; *state is the converter's per-stage state */
    int (*convert)(void **state, model_stage *m, const converter_env *env, char *err, size_t errlen);
    /* NULL: nothing to do. 0, or non-zero with err set. */
    int (*parallelized)(void *state, model_stage *m, fsdp *fs, char *err, size_t errlen);
    /* NULL: nothing to do. fs holds the stage's shards (master, gradient, compute copy). */
    void (*pre_optimizer)(void *state, model_stage *m, fsdp *fs);
    void (*post_optimizer)(void *state, model_stage *m, fsdp *fs);
    /* NULL: none. Backend bytes the converter holds for the stage (also in a dry run):
     * the memory plan counts them. */
    size_t (*backend_bytes)(const void *state);
    void (*destroy)(void *state);
    /* NULL: none. NULL or the stretches (ops.h ops_amax_segments, the converter's memory);
     * called only where the update runs on the device, and only until a converter asks. */
    const ops_amax_segments *(*optimizer_amax)(void *state, model_stage *m, fsdp *fs);
} tetra_converter;

/* The converter of that name (built-in or registered), or NULL. */
const tetra_converter *converter_find(const char *name);
/* Add a converter (the table must outlive the job). 0, or -1 if the name is taken or
 * the registry is full. */
int converter_register(const tetra_converter *c);
/* "float8, ..." for messages */
void converter_list(char *buf, size_t n);

#endif
