/* job.h — the job as validation resolves it: one typed spec that the trainer, `tetra
 * plan` and its recommender all read, so no reader re-parses a key or re-derives the
 * model on its own terms.
 *
 * job_resolve runs the configuration's key rules and resolves the parallel layout
 * (cfg_validate), checks model.converters against the converter registry
 * (engine/converter.h), and fills the typed values:
 *   - the model: model.flavor with model.vocab_size, model.n_layers,
 *     model.attn_mask_type and model.reset_positions_at_document_boundaries applied;
 *   - the pipeline schedule (parallelism.pipeline_parallel_schedule, parsed once; a
 *     schedule CSV still names the kind that sets stages per rank and placement);
 *   - whether Float8 is among the converters;
 *   - FSDP's reshard policy and context parallel's rotation and load balancing.
 */
#ifndef TETRA_ENGINE_JOB_H
#define TETRA_ENGINE_JOB_H

#include <stddef.h>

#include "config/config.h"
#include "models/model.h"
#include "parallel/cp.h"
#include "parallel/fsdp.h"
#include "parallel/pp/generate.h"

typedef struct {
    cfg_parallel_dims dims;       /* the layout for the world size asked for */
    model_args model;             /* model.name's family, model.flavor with its model.* overrides */
    pp_schedule_kind pp_schedule; /* parallelism.pipeline_parallel_schedule */
    int float8;                   /* model.converters names float8 */
    fsdp_reshard_mode reshard;    /* parallelism.fsdp_reshard_after_forward */
    cp_rotate cp_rotate;          /* parallelism.context_parallel_rotate_method */
    int cp_balanced;              /* parallelism.context_parallel_load_balancer = headtail */
} tetra_job;

/* 0 with *job filled, or -1 with the message (naming the key and where it was set) in
 * err. The same inputs give the same answer on every rank. */
int job_resolve(const tetra_config *c, int world, tetra_job *job, char *err, size_t errlen);

#endif
