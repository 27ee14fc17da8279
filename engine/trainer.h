/* trainer.h — the training loop: data, model, loss, AdamW, schedule, metrics.
 *
 * The ranks form the mesh pp x dp_replicate x dp_shard x cp x tp
 * (parallel/mesh.h) with a communicator per group (parallel/comm.h); the
 * model's units (embedding, blocks, norm + output) are sharded over
 * dp_shard x cp and replicated over dp_replicate (parallel/fsdp.h: FSDP,
 * HSDP, or DDP when the shard degree is 1).
 *
 * One optimizer step: fetch every microbatch of the step (each rank of the
 * batch group reads its own windows), count the valid target tokens and
 * all-reduce the count over the loss group, run forward + backward per
 * microbatch unit by unit with dloss_scale = 1 / global valid tokens (so
 * accumulation and data parallel give the global-token mean gradient),
 * all-gathering each unit's parameters before it runs and reduce-scattering
 * its gradient after its W pass; clip to training.max_norm with the global
 * norm of the sharded gradient; step AdamW on the local shard at
 * lr * schedule(step); log the loss summed over the loss group.
 *
 * Checkpoints (checkpoint/checkpoint.h, docs/checkpoint.md): with
 * checkpoint.enable the run resumes from the newest complete checkpoint in
 * <dump_folder>/<folder> (or load_step), under any data-parallel layout, and
 * continues at its step + 1; otherwise it may start from initial_load_path.
 * It saves after every interval-th step and the last one (sync, or staged to
 * host memory and written by a background thread in async mode; an async
 * save is finalised at a later step boundary once every rank's writer is
 * done). create_seed_checkpoint writes step-0 and exits. */
#ifndef TETRA_TRAINER_H
#define TETRA_TRAINER_H

#include "engine/config.h"

/* Runs the whole job on this rank (MPI is initialised). Returns the exit code. */
int trainer_run(const tetra_config *cfg, const cfg_parallel_dims *dims, int rank, int world);

#endif
