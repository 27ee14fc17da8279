/* trainer.h — the training loop: data, model, loss, AdamW, schedule, metrics.
 *
 * One optimizer step: fetch every microbatch of the step, count the valid
 * target tokens and all-reduce the count over the data-parallel ranks, run
 * forward + backward per microbatch with dloss_scale = 1 / global valid tokens
 * (so accumulation and data parallel give the global-token mean gradient),
 * reduce gradients, clip to training.max_norm with the global norm, step AdamW
 * at lr * schedule(step), log. */
#ifndef TETRA_TRAINER_H
#define TETRA_TRAINER_H

#include "engine/config.h"

/* Runs the whole job on this rank (MPI is initialised). Returns the exit code. */
int trainer_run(const tetra_config *cfg, const cfg_parallel_dims *dims, int rank, int world);

#endif
