/* runtime.h — execute one rank's list of a pp_schedule (compute-only or lowered).
 *
 * The runtime knows nothing of the model: the caller supplies what a stage does
 * (forward, backward-input, backward-weight, full backward, the FSDP actions) as
 * callbacks, and where each microbatch's pipeline messages live. The runtime does
 * the point-to-point part of a lowered schedule over the pipeline group:
 *
 *   SEND_F s,m   post a send of stage s's output activations of microbatch m
 *                (buffer PP_BUF_ACT_OUT) to the rank of stage s+1
 *   RECV_F s,m   post a receive of stage s's input activations (PP_BUF_ACT_IN)
 *                from the rank of stage s-1; the F of (s,m) waits for it
 *   SEND_B s,m   post a send of the gradient of stage s's input (PP_BUF_GRAD_IN)
 *                to the rank of stage s-1
 *   RECV_B s,m   post a receive of the gradient of stage s's output
 *                (PP_BUF_GRAD_OUT) from the rank of stage s+1; the I or B of (s,m)
 *                waits for it
 *   WAIT_SEND_*  wait for that send; then `sent` says its buffer is free
 *
 * Every message is one microbatch's activations or gradients: `count` elements of
 * `dtype`. A run of consecutive SEND/RECV actions (the batch of pp_post_batch_end,
 * schedule.h) is posted as one comm_batch_p2p: every message of it is started
 * before any is waited for (under NCCL one ncclGroupStart/End on the rank's one
 * stream); each keeps its own request, so waits and `sent` stay per message.
 * Messages between two ranks match in the order both lists post them (one
 * tag; lower.h checks the orders agree), so a schedule lowered by pp_schedule_lower
 * or checked by pp_schedule_check_lowered runs without deadlock, with MPI's
 * independent requests and with NCCL's one stream per rank alike. Sends not waited
 * for by the list are waited for at its end; a receive nobody consumed is an error.
 * Idle slots are skipped. An OVERLAP_F_B runs its sub-actions in order.
 *
 * The backward callbacks learn when an action is the stage's last backward of the
 * list (its m-th B or W), which is when FSDP reduces the stage's gradients.
 */
#ifndef TETRA_PARALLEL_PP_RUNTIME_H
#define TETRA_PARALLEL_PP_RUNTIME_H

#include <stddef.h>

#include "parallel/comm.h"
#include "parallel/pp/schedule.h"

typedef enum {
    PP_BUF_ACT_IN = 0, /* a stage's input activations (what RECV_F fills) */
    PP_BUF_ACT_OUT,    /* a stage's output activations (what SEND_F sends) */
    PP_BUF_GRAD_IN,    /* the gradient of a stage's input (what SEND_B sends) */
    PP_BUF_GRAD_OUT    /* the gradient of a stage's output (what RECV_B fills) */
} pp_buffer;

typedef struct {
    void *user;
    void (*forward)(void *user, int stage, int mb);
    void (*backward_input)(void *user, int stage, int mb);
    void (*backward_weight)(void *user, int stage, int mb, int last);
    void (*backward)(void *user, int stage, int mb, int last);
    void (*unshard)(void *user, int stage);
    void (*reshard)(void *user, int stage);
    void (*reduce_grad)(void *user, int stage);
    void (*wait_reduce_grad)(void *user, int stage);
    /* Lowered schedules: the backend buffer of `count` elements for a message of
     * (stage, mb), asked for when the send or receive is posted; the receive
     * buffer must stay put until the consuming compute action, the send buffer
     * until `sent`. */
    void *(*buffer)(void *user, int stage, int mb, pp_buffer which);
    /* The send of (stage, mb, which) has finished: its buffer may be reused. */
    void (*sent)(void *user, int stage, int mb, pp_buffer which);
} pp_stage_ops;

/* The pipeline group and the shape of every message (lowered schedules). */
typedef struct {
    comm_group *group; /* peers are group ranks: the schedule's ranks */
    size_t count;      /* elements per message */
    comm_dtype dtype;
} pp_p2p;

/* What one run of a rank's list spent its time on (seconds). */
typedef struct {
    double compute_s;   /* inside compute callbacks (F, I, W, B) */
    double fsdp_s;      /* inside FSDP callbacks */
    double recv_wait_s; /* waiting for receives before compute */
    double send_wait_s; /* waiting for sends */
    double total_s;     /* the whole list */
    double type_s[4];   /* compute time by action type: F, I, W, B (pp_action_type order) */
    long type_n[4];     /* and how many of each ran */
    long sends, recvs;
} pp_run_stats;

/* Drive the messages the running list has posted (nonblocking; a no-op outside
 * pp_run_rank). MPI moves a large message only while both ends are inside an MPI
 * call, so a stage calls this between its units: a transfer then completes during
 * the compute instead of at the next wait. */
void pp_progress(void);

/* Run rank r's actions in order. p2p may be NULL for a list without sends and
 * receives. stats may be NULL. 0, or -1 with a message (an action type the
 * callbacks do not provide, a message without a pipeline group, a receive never
 * consumed). */
int pp_run_rank(const pp_schedule *s, int rank, const pp_stage_ops *ops, const pp_p2p *p2p, pp_run_stats *stats,
                char *err, size_t errlen);

#endif
