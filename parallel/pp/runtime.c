/* runtime.c — walk a rank's actions and call the stage's callbacks (see runtime.h). */
#include "parallel/pp/runtime.h"

#include <stdio.h>
#include <stdlib.h>

int pp_run_rank(const pp_schedule *s, int rank, const pp_stage_ops *ops, char *err, size_t errlen) {
    if (rank < 0 || rank >= s->n_ranks) {
        snprintf(err, errlen, "schedule: no action list for rank %d (%d ranks)", rank, s->n_ranks);
        return -1;
    }
    int *done_bw = calloc((size_t)s->n_stages, sizeof *done_bw); /* B or W per stage */
    if (!done_bw) {
        snprintf(err, errlen, "schedule: out of host memory");
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < s->len[rank] && rc == 0; i++) {
        const pp_action *a = &s->acts[rank][i];
        int last = 0;
        if (a->type == PP_B || a->type == PP_W) last = ++done_bw[a->stage] == s->n_microbatches;
        switch (a->type) {
        case PP_F:
            if (ops->forward) ops->forward(ops->user, a->stage, a->mb);
            else rc = -1;
            break;
        case PP_I:
            if (ops->backward_input) ops->backward_input(ops->user, a->stage, a->mb);
            else rc = -1;
            break;
        case PP_W:
            if (ops->backward_weight) ops->backward_weight(ops->user, a->stage, a->mb, last);
            else rc = -1;
            break;
        case PP_B:
            if (ops->backward) ops->backward(ops->user, a->stage, a->mb, last);
            else rc = -1;
            break;
        case PP_UNSHARD:
            if (ops->unshard) ops->unshard(ops->user, a->stage);
            else rc = -1;
            break;
        case PP_RESHARD:
            if (ops->reshard) ops->reshard(ops->user, a->stage);
            else rc = -1;
            break;
        case PP_REDUCE_GRAD:
            if (ops->reduce_grad) ops->reduce_grad(ops->user, a->stage);
            else rc = -1;
            break;
        default: rc = -1; break;
        }
        if (rc) {
            char b[48];
            snprintf(err, errlen, "schedule: rank %d, action %d (%s): this runtime has no handler for it", rank, i,
                     pp_action_str(a, b, sizeof b));
        }
    }
    free(done_bw);
    return rc;
}
