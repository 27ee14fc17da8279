/* generate.h — the named pipeline schedules, generated as PyTorch generates them
 * (torch.distributed.pipelining.schedules), so the same (schedule, pp ranks,
 * stages per rank, microbatches) gives the same per-rank order, idle slots
 * included.
 *
 *   GPipe, 1F1B                     one stage per rank (stage r on rank r)
 *   Interleaved1F1B, LoopedBFS,     several stages per rank, loop placement
 *   InterleavedZeroBubble (ZB-H1)   (stage s on rank s mod p)
 *   ZBVZeroBubble, DualPipeV        exactly two stages per rank, V placement
 *                                   (rank r: stages r and 2p-1-r)
 */
#ifndef TETRA_PARALLEL_PP_GENERATE_H
#define TETRA_PARALLEL_PP_GENERATE_H

#include <stddef.h>

#include "parallel/pp/schedule.h"

typedef enum {
    PP_SCHED_GPIPE = 0,
    PP_SCHED_1F1B,
    PP_SCHED_INTERLEAVED_1F1B,
    PP_SCHED_LOOPED_BFS,
    PP_SCHED_INTERLEAVED_ZB,
    PP_SCHED_ZBV,
    PP_SCHED_DUALPIPEV,
    PP_N_SCHEDULE_KINDS
} pp_schedule_kind;

/* TorchTitan's names: "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS",
 * "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV". */
const char *pp_schedule_kind_name(pp_schedule_kind k);
/* Case-insensitive, as PyTorch's get_schedule_class. 0, or -1. */
int pp_schedule_kind_parse(const char *name, pp_schedule_kind *out);
/* "GPipe, 1F1B, Interleaved1F1B, ..." for error messages. */
const char *pp_schedule_kind_list(void);
int pp_schedule_kind_single_stage(pp_schedule_kind k); /* GPipe, 1F1B */
int pp_schedule_kind_v(pp_schedule_kind k);            /* ZBVZeroBubble, DualPipeV */

/* The rank that runs `stage` of n_stages under the kind's placement. */
int pp_stage_to_rank(pp_schedule_kind k, int n_ranks, int n_stages, int stage);

/* The compute-only schedule for n_ranks ranks, stages_per_rank stages each and
 * n_microbatches microbatches, validated, stage_rank filled. NULL with the rule
 * that fails in err: stages per rank other than 1 for GPipe/1F1B, other than 2 for
 * the V ones (the looped ones take any number: with one stage per rank
 * InterleavedZeroBubble is ZB-H1); microbatches not a multiple of the
 * rounds (Interleaved1F1B, InterleavedZeroBubble); fewer microbatches than stages
 * (DualPipeV, and 1F1B as PyTorch's Schedule1F1B refuses it). */
pp_schedule *pp_schedule_generate(pp_schedule_kind k, int n_ranks, int stages_per_rank, int n_microbatches, char *err,
                                  size_t errlen);

#endif
