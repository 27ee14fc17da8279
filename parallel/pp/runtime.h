/* runtime.h — execute one rank's list of a pp_schedule.
 *
 * The runtime knows nothing of the model: the caller supplies what a stage does
 * (forward, backward-input, backward-weight, full backward, and the FSDP actions)
 * as callbacks. It tells the backward callbacks when an action is the stage's last
 * backward of the step (the m-th B or W), which is when FSDP reduces the stage's
 * gradients. Send and receive actions join with the pipeline schedules.
 */
#ifndef TETRA_PARALLEL_PP_RUNTIME_H
#define TETRA_PARALLEL_PP_RUNTIME_H

#include <stddef.h>

#include "parallel/pp/schedule.h"

typedef struct {
    void *user;
    void (*forward)(void *user, int stage, int mb);
    void (*backward_input)(void *user, int stage, int mb);
    void (*backward_weight)(void *user, int stage, int mb, int last);
    void (*backward)(void *user, int stage, int mb, int last);
    void (*unshard)(void *user, int stage);
    void (*reshard)(void *user, int stage);
    void (*reduce_grad)(void *user, int stage);
} pp_stage_ops;

/* Run rank r's actions in order. 0, or -1 with a message (an action type the
 * callbacks do not provide). */
int pp_run_rank(const pp_schedule *s, int rank, const pp_stage_ops *ops, char *err, size_t errlen);

#endif
