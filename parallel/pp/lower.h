/* lower.h — from a compute-only schedule to the one a rank runs: PyTorch's
 * lowering passes (_PipelineScheduleRuntime._prepare_schedule_with_comms), so the
 * lowered lists equal PyTorch's compute_comms form:
 *   1. validate; stage -> rank from the compute actions
 *   2. UNSHARD / RESHARD per rank (FSDP; at most max_active_stages stages unsharded,
 *      prefetching the next ones)
 *   3. REDUCE_GRAD and WAIT_REDUCE_GRAD right after each stage's last backward
 *   4. SEND_F / RECV_F and SEND_B / RECV_B by the round-robin pass: a compute action
 *      is placed only once its input is there (received, or produced on the same
 *      rank); each send puts the matching receive on the peer's list
 *   5. WAIT_SEND_F / WAIT_SEND_B: a forward send is waited for right after the
 *      backward of the same stage and microbatch, every other send at the end of
 *      the list
 * and a dry run that proves the result free of deadlock before anything runs, with
 * MPI's independent requests and with NCCL's one stream per rank.
 */
#ifndef TETRA_PARALLEL_PP_LOWER_H
#define TETRA_PARALLEL_PP_LOWER_H

#include <stddef.h>

#include "parallel/pp/schedule.h"

typedef struct {
    int max_active_stages; /* PyTorch's default 3 */
} pp_lower_options;

/* A new, lowered schedule (idle slots dropped). NULL with the rank and action that
 * cannot be placed ("malformed compute schedule") or the validation error. */
pp_schedule *pp_schedule_lower(const pp_schedule *compute, const pp_lower_options *o, char *err, size_t errlen);

/* The point-to-point models a lowered schedule is run under in its dry run. */
enum {
    PP_P2P_MPI = 1,     /* each message on its own: a send completes once its peer has
                           posted the receive (MPI's nonblocking calls; PyTorch's
                           _simulate_comms_compute) */
    PP_P2P_STREAMS = 2, /* NCCL: one FIFO of batches per rank (pp_sim_streams, sim.h) */
    PP_P2P_ALL = 3
};

/* Check a lowered schedule (generated or loaded from a compute_comms CSV): every
 * send has its receive on the peer and the two lists order the messages of each
 * (sender, receiver) pair alike; every compute action's input arrives before it;
 * every wait follows its send or reduction. Then run all ranks' lists as a dry run
 * under each model in `models` (PP_P2P_MPI, then PP_P2P_STREAMS). 0 with the
 * number of time steps of the first model's dry run in *steps (may be NULL), or -1
 * naming the rank, the action and the rule, or, for a deadlock, each stuck rank's
 * next action (and under PP_P2P_STREAMS the heads of the streams that block it). */
int pp_schedule_check_lowered_in(const pp_schedule *s, int models, int *steps, char *err, size_t errlen);
/* Both models: what a schedule must pass before it runs, on CPUs or GPUs. */
int pp_schedule_check_lowered(const pp_schedule *s, int *steps, char *err, size_t errlen);

#endif
