/* parallelize.h — how Llama 3 is parallelized: TorchTitan's parallelize_llama and
 * pipeline_llama, as the model's own part of the job.
 *
 * The trainer places stages on ranks and runs them; what a layout of Llama means is
 * here: the cut into pipeline stages (pipeline.h), each stage's layout from this rank's
 * mesh coordinates (tensor- and context-parallel rank and size), the groups and flags
 * tensor and context parallel compute with, and FSDP over the stage's units (its
 * parameter declarations by global coordinates). Model converters run between the
 * declaration and FSDP (engine/converter.h): the trainer calls, through the family's
 * table (family.c, models/model.h)
 *   llama3_parallelize_stage   the stage's model, declared for this rank's layout;
 *   (converters' convert hooks)
 *   llama3_fully_shard         FSDP/HSDP/DDP over its units;
 *   (converters' parallelized hooks)
 */
#ifndef TETRA_LLAMA3_PARALLELIZE_H
#define TETRA_LLAMA3_PARALLELIZE_H

#include <stddef.h>

#include "kernels/ops.h"
#include "models/llama3/llama3_args.h"
#include "models/llama3/model.h"
#include "models/model.h"
#include "parallel/comm.h"
#include "parallel/cp.h"
#include "parallel/fsdp.h"
#include "parallel/mesh.h"
#include "parallel/pp/generate.h"

/* The stages in all (*n_stages) and the blocks [start[s], end[s]) of each; one stage,
 * the whole model, at pp 1. 0, or -1 with the reason in err. */
int llama3_pipeline_stages(const llama3_args *a, const model_pp_spec *pp, int *n_stages, int *start, int *end,
                           char *err, size_t errlen);

/* Declare stage `stage` of n_stages (blocks [start, end)) for this rank's layout, with
 * the tensor- and context-parallel groups and flags set. 0, or -1 with err set; a model
 * that was partly built has m->params set and is freed with llama3_model_free. */
int llama3_parallelize_stage(llama3_model *m, const llama3_args *a, int stage, int n_stages, int start, int end,
                             const model_parallel_env *env, char *err, size_t errlen);

/* FSDP over the stage's units: *decl gets the stage's parameter declarations
 * ([m->n_params], malloc'd, owned by the caller, alive as long as the fsdp). NULL with
 * err set on failure. */
fsdp *llama3_fully_shard(llama3_model *m, const model_parallel_env *env, dt_param_decl **decl, char *err,
                         size_t errlen);

/* One line per parameter (name, global shape, what computes it) to line(user, text):
 * model.print_after_conversion. */
void llama3_describe_params(const llama3_model *m, void (*line)(void *user, const char *text), void *user);

#endif
