/* sim.h — a timing simulator for pipeline schedules (schedule.h): how long one
 * training step of a schedule takes when every action has a fixed duration, and
 * where the ranks sit idle (the bubble).
 *
 * Model. Each rank runs its list in order, one action at a time; idle slots are
 * skipped, and actions that move no activations and compute nothing (FSDP,
 * send/receive, waits: a lowered schedule's extras) take no time — their cost is
 * the tcomm charged on each cross-rank dependency. A compute action starts when
 * its rank is free and its inputs exist:
 *   F(s, mb)      after F(s-1, mb)                        (stage 0: no input)
 *   I/B(s, mb)    after I or B of (s+1, mb); the last stage after its own F(s, mb)
 *                 (and every stage after its own F)
 *   W(s, mb)      after I(s, mb)
 * A dependency produced on another rank adds tcomm; on the same rank it adds
 * nothing. Durations per stage action: F = tf, I = tb, W = tw, B = tb + tw.
 * OVERLAP_F_B is charged the sum of its parts (no credit for overlapping them):
 * its parts run one after the other, each once its own input exists.
 * Times are per stage action: with v stages per rank, a whole-model microbatch
 * forward costs v * tf on a rank.
 *
 * The result is exact (a deterministic list schedule), so closed forms such as
 * 1F1B's bubble (p-1)/(m+p-1) hold to rounding.
 */
#ifndef TETRA_PARALLEL_PP_SIM_H
#define TETRA_PARALLEL_PP_SIM_H

#include <stddef.h>

#include "parallel/pp/schedule.h"

typedef struct {
    double tf, tb, tw; /* forward, backward-input, backward-weight of one stage action */
    double tcomm;      /* added to every dependency that crosses ranks */
} pp_sim_times;

/* One computation on the timeline: an F, I, W or B (an OVERLAP_F_B gives one
 * slice per part, both with the same `action` index). */
typedef struct {
    pp_action_type type; /* F, I, W or B */
    int stage, mb;
    int chunk;      /* which of its rank's stages (0 = lowest stage number) */
    int action;     /* index in the rank's list */
    int overlapped; /* part of an OVERLAP_F_B */
    double start, end;
} pp_sim_slice;

typedef struct {
    int n_ranks, n_stages, n_microbatches;
    int max_stages_per_rank; /* the most stages any rank runs */
    pp_sim_times times;
    int *n_slices;          /* [n_ranks] */
    pp_sim_slice **slices;  /* [n_ranks][n_slices[r]] in start order */
    int *rank_stages;       /* [n_ranks] stages each rank runs */
    double makespan;        /* the step: last end over all ranks (from 0) */
    double *busy;           /* [n_ranks] time spent computing */
    double *idle;           /* [n_ranks] makespan - busy */
    double idle_total;      /* sum of idle */
    double bubble_fraction; /* idle_total / (n_ranks * makespan) */
    double ideal;           /* m * (tf + tb + tw) * max_stages_per_rank: one rank's work, no bubble */
    int *peak_in_flight;    /* [n_ranks] most (stage, mb) pairs alive at once: from F until B or W */
    int has_overlap;        /* some OVERLAP_F_B was simulated */
} pp_sim_result;

/* Simulate s with the given times (negative times are refused). Returns the
 * timeline, or NULL with the reason in err: an action outside the schedule's
 * stages or microbatches, a computation listed twice, a W without its I on the
 * same stage, or a deadlock — then err lists each stuck rank's next action and
 * what it waits for ("rank 1 at 1F0 (action 0) waits for 0F0, which no rank
 * lists"). */
pp_sim_result *pp_sim_run(const pp_schedule *s, const pp_sim_times *t, char *err, size_t errlen);
void pp_sim_free(pp_sim_result *r);

/* Stream mode: a dry run of a lowered schedule's messages as NCCL runs them. Each
 * rank's point-to-point operations go to one stream, a FIFO: the batches of
 * pp_post_batch_end (schedule.h) enter it in list order as the list posts them
 * (posting never blocks), and only the batch at the head runs. A message moves while
 * its other end (the same stage and microbatch message, the opposite direction) is in
 * the batch at the head of the peer's stream; inside a batch, messages to one peer in
 * one direction move in order and the rest independently (NCCL's rule for a group);
 * a head batch leaves its stream once all its messages are done.
 * A compute action waits for the receives that bring its inputs, a WAIT_SEND_* for
 * its send; FSDP actions and idle slots pass. MPI's independent requests (the dry
 * run of lower.h) would finish lists this mode finds deadlocked: rank 0 posting
 * "send A; receive B" and rank 1 "send B; receive A" as two batches each.
 *
 * The compute actions are validated first (pp_schedule_validate: where each stage
 * runs); the rest of the per-rank order (inputs received before use, sends after
 * their compute) is pp_schedule_check_lowered's to check: here a message only needs
 * a peer stage on another rank. 0 with the number of rounds in *steps (may be NULL), or -1 with
 * the reason in err; a deadlock names, for each blocked rank, the action it is
 * stuck at, the message holding back the head of its stream and its peer's head:
 * "rank 0 stuck at action 7 (0B0, waiting for 0RECV_B0): its stream's head is
 * 0SEND_F2 to rank 1, whose head is 1SEND_B0 to rank 0". */
int pp_sim_streams(const pp_schedule *s, int *steps, char *err, size_t errlen);

/* Peak in flight in whole-model microbatches: chunk-microbatches divided by the
 * stages the rank runs (a V rank's two half-model chunks count one half each). */
double pp_sim_peak_model_mb(const pp_sim_result *r, int rank);

#endif
