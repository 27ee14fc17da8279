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

/* Peak in flight in whole-model microbatches: chunk-microbatches divided by the
 * stages the rank runs (a V rank's two half-model chunks count one half each). */
double pp_sim_peak_model_mb(const pp_sim_result *r, int rank);

#endif
