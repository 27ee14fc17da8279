/* schedule.h — a training step as data: per rank, a list of actions on
 * (stage, microbatch), PyTorch's pipelining IR (torch.distributed.pipelining).
 *
 *   F  forward of a stage on a microbatch
 *   I  backward-input ("B" of zero-bubble papers): input gradients only
 *   W  backward-weight: weight gradients only (any time after the I)
 *   B  full backward (I and W of each unit back to back)
 *   UNSHARD / RESHARD   gather / free a stage's FSDP parameters (stage only)
 *   REDUCE_GRAD         make sure a stage's gradients are reduced (stage only)
 *
 * String form "{stage}{type}{mb}": "0F3", "1I0", "0UNSHARD". A schedule holds one
 * list per rank; stage s of n_stages runs on the rank that lists its actions.
 * Gradient accumulation on one stage is the degenerate schedule
 * F0 B0 F1 B1 ... F(m-1) B(m-1).
 */
#ifndef TETRA_PARALLEL_PP_SCHEDULE_H
#define TETRA_PARALLEL_PP_SCHEDULE_H

#include <stddef.h>

typedef enum {
    PP_F = 0,
    PP_I,
    PP_W,
    PP_B,
    PP_UNSHARD,
    PP_RESHARD,
    PP_REDUCE_GRAD,
    PP_N_ACTION_TYPES
} pp_action_type;

typedef struct {
    pp_action_type type;
    int stage;
    int mb; /* -1 for the stage-only actions */
} pp_action;

typedef struct {
    int n_ranks, n_stages, n_microbatches;
    int *len;            /* [n_ranks] */
    pp_action **acts;    /* [n_ranks][len[r]] */
} pp_schedule;

const char *pp_action_type_name(pp_action_type t); /* "F", "I", ..., "REDUCE_GRAD" */
/* "0F3" into buf; returns buf. */
char *pp_action_str(const pp_action *a, char *buf, size_t n);
/* Parse "0F3" / "1UNSHARD"; 0, or -1 for anything else. */
int pp_action_parse(const char *s, pp_action *out);

pp_schedule *pp_schedule_new(int n_ranks, int n_stages, int n_microbatches);
/* Append an action to rank r's list; 0 or -1 (out of memory). */
int pp_schedule_push(pp_schedule *s, int rank, pp_action_type t, int stage, int mb);
void pp_schedule_free(pp_schedule *s);

/* Gradient accumulation: one rank, one stage, m microbatches, F then B of each. */
pp_schedule *pp_schedule_accumulate(int m);

/* Check the compute actions of every rank: each stage on exactly one rank; per
 * (stage, mb) exactly one F, then either one B or one I followed by one W. 0, or -1
 * with the rank, the action and the broken rule in err. */
int pp_schedule_validate(const pp_schedule *s, char *err, size_t errlen);

/* The most microbatches of one rank whose activations are alive at once (from its F
 * until its B or W), over all ranks. */
int pp_schedule_max_in_flight(const pp_schedule *s);
/* The most (stage, mb) pairs of one rank between their I and their W at once. */
int pp_schedule_max_deferred_w(const pp_schedule *s);

#endif
