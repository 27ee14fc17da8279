/* schedule.h — a training step as data: per rank, a list of actions on
 * (stage, microbatch), PyTorch's pipelining IR (torch.distributed.pipelining).
 *
 * compute:  F  forward of a stage on a microbatch
 *           I  backward-input ("B" of zero-bubble papers): input gradients only
 *           W  backward-weight: weight gradients only (any time after the I)
 *           B  full backward (I and W of each unit back to back)
 *           OVERLAP_F_B  a forward and a full backward of two stages as one action
 *                        (DualPipeV); its sub-actions run in order
 * FSDP:     UNSHARD / RESHARD   gather / free a stage's parameters (stage only)
 *           REDUCE_GRAD         start reducing a stage's gradients (stage only)
 *           WAIT_REDUCE_GRAD    that reduction has finished (stage only)
 * p2p:      SEND_F / RECV_F     a stage's output activations to the next stage
 *           SEND_B / RECV_B     a stage's input gradients to the previous stage
 *           WAIT_SEND_F / WAIT_SEND_B   that send has finished (its buffer is free)
 *           RECV_F and RECV_B name the receiving stage, sends the sending stage.
 * idle:     an empty CSV cell: a deliberate idle slot, skipped at runtime.
 *
 * String form "{stage}{type}{mb}": "0F3", "1I0", "0UNSHARD", "3SEND_F1";
 * OVERLAP_F_B prints as "(2F3;5B1)OVERLAP_F_B"; idle prints as "". A schedule
 * holds one list per rank; stage s runs on the one rank that lists its compute
 * actions (stage_rank). Gradient accumulation on one stage is the degenerate
 * schedule F0 B0 F1 B1 ... F(m-1) B(m-1).
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
    PP_WAIT_REDUCE_GRAD,
    PP_SEND_F,
    PP_RECV_F,
    PP_SEND_B,
    PP_RECV_B,
    PP_WAIT_SEND_F,
    PP_WAIT_SEND_B,
    PP_OVERLAP_F_B,
    PP_IDLE,
    PP_N_ACTION_TYPES
} pp_action_type;

#define PP_MAX_SUB 2

typedef struct {
    pp_action_type type; /* F, I, W or B */
    int stage;
    int mb;
} pp_op;

typedef struct {
    pp_action_type type;
    int stage; /* -1 for OVERLAP_F_B and IDLE */
    int mb;    /* -1 for the stage-only actions, OVERLAP_F_B and IDLE */
    int n_sub; /* OVERLAP_F_B: sub[0..n_sub-1], run in order */
    pp_op sub[PP_MAX_SUB];
} pp_action;

typedef struct {
    int n_ranks, n_stages, n_microbatches;
    int *len;         /* [n_ranks] */
    pp_action **acts; /* [n_ranks][len[r]] */
    int *stage_rank;  /* [n_stages] the rank each stage runs on (-1 until known) */
} pp_schedule;

const char *pp_action_type_name(pp_action_type t); /* "F", "I", ..., "REDUCE_GRAD", "OVERLAP_F_B", "" for IDLE */
int pp_action_is_compute(pp_action_type t);        /* F, I, W, B, OVERLAP_F_B */
int pp_action_is_comm(pp_action_type t);           /* SEND_*, RECV_*, WAIT_SEND_* */
int pp_action_stage_only(pp_action_type t);        /* UNSHARD, RESHARD, REDUCE_GRAD, WAIT_REDUCE_GRAD */
int pp_action_posts(pp_action_type t);             /* SEND_F, RECV_F, SEND_B, RECV_B: post one message */
/* The string form into buf; returns buf. */
char *pp_action_str(const pp_action *a, char *buf, size_t n);
/* Parse one cell (surrounding blanks ignored; "" is IDLE). 0, or -1 for anything
 * else (a type with a microbatch it must not have or without one it needs,
 * an OVERLAP_F_B whose parts are not compute actions, ...). */
int pp_action_parse(const char *s, pp_action *out);

/* The batching rule: the messages a rank posts together. A batch is a maximal run
 * of consecutive posting actions (pp_action_posts) in a rank's list; anything else,
 * an idle slot included, ends it. The runtime posts each batch as one
 * comm_batch_p2p (one NCCL group) and the simulator's stream mode (sim.h) puts it
 * on the rank's stream as one entry, so both read the rule here. Returns the index
 * one past the last action of the batch that starts at action i of acts[0..len-1];
 * i itself when action i posts nothing. */
int pp_post_batch_end(const pp_action *acts, int len, int i);

pp_schedule *pp_schedule_new(int n_ranks, int n_stages, int n_microbatches);
/* Append to rank r's list; 0 or -1 (out of memory, bad rank). */
int pp_schedule_push(pp_schedule *s, int rank, pp_action_type t, int stage, int mb);
int pp_schedule_push_action(pp_schedule *s, int rank, const pp_action *a);
pp_schedule *pp_schedule_copy(const pp_schedule *s);
void pp_schedule_free(pp_schedule *s);

/* Gradient accumulation: one rank, one stage, m microbatches, F then B of each. */
pp_schedule *pp_schedule_accumulate(int m);

/* Check the compute actions of every rank (PyTorch's rules, plus order): each
 * stage on exactly one rank; per (stage, mb) exactly one F, then either one B or
 * one I followed by one W; per stage #F = m, #I = #W, #B + #I = m. Fills
 * stage_rank. 0, or -1 with the rank, the action's position and text, and the
 * broken rule in err. */
int pp_schedule_validate(const pp_schedule *s, char *err, size_t errlen);
/* The same check for callers that word the location themselves (the CSV loader
 * names file, row and cell): 0, or -1 with the rank and the action's position
 * (-1 when the rule concerns a whole stage or rank) and the rule alone in rule. */
int pp_schedule_validate_at(const pp_schedule *s, int *bad_rank, int *bad_pos, char *rule, size_t rulelen);

/* The most microbatches of one rank whose activations are alive at once (from its F
 * until its B or W; a V rank's two stages count separately), over all ranks. */
int pp_schedule_max_in_flight(const pp_schedule *s);
/* The same for one rank and one of its stages (-1: all its stages). */
int pp_schedule_rank_in_flight(const pp_schedule *s, int rank, int stage);
/* The most (stage, mb) pairs of one rank between their I and their W at once. */
int pp_schedule_max_deferred_w(const pp_schedule *s);

#endif
