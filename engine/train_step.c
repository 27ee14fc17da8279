/* train_step.c — one optimizer step as a schedule of actions on the stages this rank
 * runs and their FSDP, then clipping, AdamW and the LR schedule (see trainer.h).
 *
 * The schedule (parallel/pp/schedule.h) says which stage and microbatch runs
 * forward, backward-input, backward-weight or a full backward; without pipeline
 * parallel it is gradient accumulation on one stage, with it one of the pipeline
 * schedules (parallel/pp/generate.h, or a CSV), lowered (parallel/pp/lower.h) so
 * that it also holds the sends and receives between stages and the FSDP actions.
 * The runtime (parallel/pp/runtime.h) walks it; the callbacks below turn each
 * action into the unit-by-unit calls of the stage's model, each bracketed by its
 * FSDP hooks:
 *   F  for each unit in order: pre_forward, the unit's forward, post_forward
 *   I  for each unit in reverse: pre_backward, the unit's I pass
 *   W  for each unit in reverse: pre_backward_weight, the unit's W pass,
 *      post_backward_weight (starts the gradient reduction when due)
 *   B  for each unit in reverse: I then W (so a unit's reduce-scatter overlaps the
 *      next unit's backward)
 * The embedding has no I pass; the head's I starts the residual gradient. A stage
 * without the embedding reads its input residual from what RECV_F put in its
 * activations (or what the stage before it on this rank handed over); one without
 * the head starts its backward from the residual gradient RECV_B brought.
 *
 * Each (stage, microbatch) has an activation buffer from the moment its input
 * arrives until its backward is done and, when the stage before it is on another
 * rank, the input gradient has been sent. Buffers come from a pool per stage sized
 * by running those same rules over the schedule before the first step.
 *
 * Gradient accumulation under pipeline parallel repeats the schedule (one round per
 * accumulation step, TorchTitan's loop around the pipeline's step); FSDP reduces
 * the gradients in the last round.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "telemetry/log.h"
#include "engine/trainer_internal.h"
#include "parallel/cp.h"
#include "parallel/pp/csv.h"
#include "parallel/pp/generate.h"
#include "parallel/pp/lower.h"
#include "parallel/pp/runtime.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* what still holds an activation buffer */
enum { ACTS_BACKWARD = 1 };

static int local_of(const trainer *t, int stage) {
    for (int i = 0; i < t->n_local; i++)
        if (t->st[i].index == stage) return i;
    fprintf(stderr, "train_step: stage %d does not run on pipeline rank %d\n", stage, t->pp_rank);
    abort();
}

/* ----------------------------------------------------------------------------
 * the schedule and the activation pools it needs */

/* The parts of an action: an OVERLAP_F_B's sub-actions, else the action itself. */
static int action_parts(const pp_action *a, pp_op *out) {
    if (a->type != PP_OVERLAP_F_B) {
        out[0] = (pp_op){a->type, a->stage, a->mb};
        return 1;
    }
    for (int k = 0; k < a->n_sub; k++) out[k] = a->sub[k];
    return a->n_sub;
}

/* Rounds of the schedule per step: the accumulation steps under pipeline parallel;
 * without it the accumulation is the schedule itself. */
static int n_rounds(const trainer *t) { return t->pp_size > 1 ? t->shape.accum : 1; }

/* Replays the buffer rules over a rank's list: the most buffers each local stage
 * holds at once (peak[i] for st[i]), and the most of its microbatches between an I
 * and its W at once (open_iw[i]: each holds a recompute slot per block that drops
 * activations). */
static int plan_pools(const trainer *t, const pp_schedule *s, int rank, int *peak, int *open_iw, int *peak_send,
                      char *err, size_t errlen) {
    const int S = s->n_stages, M = s->n_microbatches;
    unsigned char *state = calloc((size_t)S * (size_t)M, 1);
    int *live = calloc((size_t)t->n_local, sizeof *live);
    if (!state || !live) {
        free(state);
        free(live);
        snprintf(err, errlen, "schedule: out of host memory");
        return -1;
    }
    int *open = calloc(2 * (size_t)t->n_local, sizeof *open), *sending = open ? open + t->n_local : NULL;
    if (!open) {
        free(state);
        free(live);
        snprintf(err, errlen, "schedule: out of host memory");
        return -1;
    }
    for (int i = 0; i < t->n_local; i++) peak[i] = open_iw[i] = peak_send[i] = 0;
#define ST(stage, mb) state[(size_t)(stage) * (size_t)M + (size_t)(mb)]
#define TAKE(li, stage, mb)                                                                                            \
    do {                                                                                                               \
        if (!ST(stage, mb)) {                                                                                          \
            ST(stage, mb) = ACTS_BACKWARD;                                                                             \
            if (++live[li] > peak[li]) peak[li] = live[li];                                                            \
        }                                                                                                              \
    } while (0)
#define CLEAR(li, stage, mb, bit)                                                                                      \
    do {                                                                                                               \
        if (ST(stage, mb) & (bit)) {                                                                                   \
            ST(stage, mb) &= (unsigned char)~(bit);                                                                    \
            if (!ST(stage, mb)) live[li]--;                                                                            \
        }                                                                                                              \
    } while (0)
    for (int i = 0; i < s->len[rank]; i++) {
        const pp_action *a = &s->acts[rank][i];
        pp_op ops_[PP_MAX_SUB];
        const int n = action_parts(a, ops_);
        for (int k = 0; k < n; k++) {
            const pp_op *o = &ops_[k];
            if (o->stage < 0 || o->stage >= S || o->mb < 0 || o->mb >= M) continue;
            const int li = local_of(t, o->stage);
            switch (o->type) {
            case PP_RECV_F: TAKE(li, o->stage, o->mb); break;
            case PP_F: {
                TAKE(li, o->stage, o->mb);
                const int nx = t->st[li].local_next;
                if (nx >= 0) TAKE(nx, o->stage + 1, o->mb);
                break;
            }
            case PP_I:
                if (++open[li] > open_iw[li]) open_iw[li] = open[li];
                if (t->st[li].remote_prev && ++sending[li] > peak_send[li]) peak_send[li] = sending[li];
                break;
            case PP_W:
                open[li]--;
                CLEAR(li, o->stage, o->mb, ACTS_BACKWARD);
                break;
            case PP_B:
                CLEAR(li, o->stage, o->mb, ACTS_BACKWARD);
                if (t->st[li].remote_prev && ++sending[li] > peak_send[li]) peak_send[li] = sending[li];
                break;
            /* the gradient sent back leaves in a buffer of its own, taken by I or B (hand_back):
             * a send that is waited for at the end of the list holds one residual, not the
             * microbatch's activations */
            case PP_WAIT_SEND_B: sending[li]--; break;
            default: break;
            }
        }
    }
#undef ST
#undef TAKE
#undef CLEAR
    free(open);
    free(state);
    free(live);
    for (int i = 0; i < t->n_local; i++)
        if (peak[i] < 1) peak[i] = 1;
    return 0;
}

int train_build_schedule(trainer *t, char *err, size_t errlen) {
    const tetra_config_values *c = t->c;
    if (t->pp_size == 1) {
        t->sched = pp_schedule_accumulate(t->shape.n_mb);
        if (!t->sched) {
            snprintf(err, errlen, "schedule: out of host memory");
            return -1;
        }
        if (pp_schedule_validate(t->sched, err, errlen)) return -1;
        t->run_sched = t->sched;
    } else {
        const char *csv = c->parallelism.pipeline_parallel_schedule_csv;
        if (csv && csv[0]) {
            pp_csv_format fmt;
            char why[1536];
            pp_schedule *s = pp_csv_load(csv, t->pp_size, t->shape.n_mb, &fmt, why, sizeof why);
            if (!s) {
                snprintf(err, errlen, "parallelism.pipeline_parallel_schedule_csv: %s", why);
                return -1;
            }
            if (s->n_stages != t->n_stages) {
                snprintf(err, errlen,
                         "parallelism.pipeline_parallel_schedule_csv %s: the schedule has %d stages, the model is cut "
                         "into %d (pipeline_parallel_degree %d x %d stages per rank)",
                         csv, s->n_stages, t->n_stages, t->pp_size, t->n_stages / t->pp_size);
                pp_schedule_free(s);
                return -1;
            }
            if (fmt == PP_CSV_COMPUTE_COMMS) {
                t->run_sched = s;
                if (pp_schedule_check_lowered(s, NULL, why, sizeof why)) {
                    snprintf(err, errlen, "parallelism.pipeline_parallel_schedule_csv %s: %s", csv, why);
                    return -1;
                }
            } else {
                t->sched = s;
            }
        } else {
            char why[1024];
            t->sched = pp_schedule_generate(t->job.pp_schedule, t->pp_size, t->n_stages / t->pp_size, t->shape.n_mb,
                                            why, sizeof why);
            if (!t->sched) {
                snprintf(err, errlen, "parallelism.pipeline_parallel_schedule \"%s\": %s",
                         c->parallelism.pipeline_parallel_schedule, why);
                return -1;
            }
        }
        if (!t->run_sched) {
            pp_lower_options lo = {3};
            char why[1024];
            t->run_sched = pp_schedule_lower(t->sched, &lo, why, sizeof why);
            if (!t->run_sched || pp_schedule_check_lowered(t->run_sched, NULL, why, sizeof why)) {
                snprintf(err, errlen, "pipeline schedule: %s", why);
                return -1;
            }
        }
    }
    /* the stages this rank runs must be the ones the schedule gives it */
    const pp_schedule *rs = t->run_sched;
    for (int i = 0; i < t->n_local; i++) {
        const int st = t->st[i].index;
        if (st >= rs->n_stages || !rs->stage_rank || rs->stage_rank[st] != t->pp_rank) {
            snprintf(err, errlen,
                     "pipeline schedule: stage %d runs on pipeline rank %d in the schedule, but the placement of "
                     "pipeline_parallel_schedule \"%s\" puts it on rank %d",
                     st, st < rs->n_stages && rs->stage_rank ? rs->stage_rank[st] : -1,
                     c->parallelism.pipeline_parallel_schedule, t->pp_rank);
            return -1;
        }
    }
    return 0;
}

/* The activation buffers each local stage needs: after the stages' links are known. */
int train_plan_pools(trainer *t, int *peak, int *open_iw, int *peak_send, char *err, size_t errlen) {
    return plan_pools(t, t->run_sched, t->pp_rank, peak, open_iw, peak_send, err, errlen);
}

int train_plan_grad_arenas(trainer *t) {
    t->n_grad_arenas = 0;
    for (int i = 0; i < t->n_local; i++) t->st[i].grad_arena = -1;
    if (t->pp_size == 1) return 0; /* without pipeline parallel FSDP rotates two buffers of its own */
    const pp_schedule *s = t->run_sched;
    const int n = t->n_local, len = s->len[t->pp_rank];
    /* per stage: its window [first, end], the order of the starts; per arena: its last end */
    int *first = malloc(4 * (size_t)n * sizeof *first);
    size_t *arena_size = calloc((size_t)n, sizeof *arena_size);
    t->grad_arena_off = calloc((size_t)n + 1, sizeof *t->grad_arena_off);
    if (!first || !arena_size || !t->grad_arena_off) {
        free(first);
        free(arena_size);
        return -1;
    }
    int *end = first + n, *order = end + n, *arena_end = order + n;
    for (int i = 0; i < n; i++) {
        first[i] = len;
        end[i] = len; /* without a WAIT_REDUCE_GRAD (a CSV's lowered list): fsdp_finish_grads after the list */
        order[i] = i;
    }
    if (n_rounds(t) > 1) /* several rounds accumulate across the whole step */
        for (int i = 0; i < n; i++) first[i] = 0;
    else
        for (int k = 0; k < len; k++) {
            pp_op o[PP_MAX_SUB];
            const int m = action_parts(&s->acts[t->pp_rank][k], o);
            for (int j = 0; j < m; j++) {
                if (o[j].stage < 0) continue;
                const int li = local_of(t, o[j].stage);
                if ((o[j].type == PP_W || o[j].type == PP_B) && first[li] == len) first[li] = k;
                if (o[j].type == PP_WAIT_REDUCE_GRAD) end[li] = k;
            }
        }
    /* greedy interval colouring in order of the windows' starts: a stage joins the first
     * arena whose last window closed before its own opens */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && first[order[j]] < first[order[j - 1]]; j--) {
            const int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    for (int q = 0; q < n; q++) {
        const int i = order[q];
        const size_t need = fsdp_memory_report(t->st[i].fs).work_grad_bytes;
        if (!need) continue;
        int a = 0;
        while (a < t->n_grad_arenas && arena_end[a] >= first[i]) a++;
        if (a == t->n_grad_arenas) t->n_grad_arenas++;
        arena_end[a] = end[i];
        if (need > arena_size[a]) arena_size[a] = need;
        t->st[i].grad_arena = a;
    }
    for (int a = 0; a < t->n_grad_arenas; a++) t->grad_arena_off[a + 1] = t->grad_arena_off[a] + arena_size[a];
    free(first);
    free(arena_size);
    return 0;
}

/* ----------------------------------------------------------------------------
 * activation buffers per (stage, microbatch) */

static model_acts *acts_find(train_stage *s, int mb) {
    for (int i = 0; i < s->n_acts; i++)
        if (s->acts_mb[i] == mb) return s->acts[i];
    return NULL;
}

static model_acts *acts_take(train_stage *s, int mb) {
    model_acts *a = acts_find(s, mb);
    if (a) return a;
    for (int i = 0; i < s->n_acts; i++)
        if (s->acts_mb[i] < 0) {
            s->acts_mb[i] = mb;
            s->acts_state[i] = ACTS_BACKWARD;
            return s->acts[i];
        }
    /* the pool is sized by replaying the schedule: running out is a bug */
    fprintf(stderr, "train_step: stage %d has no activation buffer free for microbatch %d (%d in use)\n", s->index, mb,
            s->n_acts);
    abort();
}

static model_acts *acts_of(train_stage *s, int mb) {
    model_acts *a = acts_find(s, mb);
    if (!a) {
        fprintf(stderr, "train_step: stage %d: microbatch %d has no activations (backward before forward)\n", s->index,
                mb);
        abort();
    }
    return a;
}

static void acts_clear(train_stage *s, int mb, unsigned bit) {
    for (int i = 0; i < s->n_acts; i++)
        if (s->acts_mb[i] == mb) {
            s->acts_state[i] &= (unsigned char)~bit;
            if (!s->acts_state[i]) s->acts_mb[i] = -1;
        }
}

/* Elements of the residual (or its gradient) of ntok tokens on this rank: what a
 * stage hands on, sends and receives. */
static size_t residual_elems(const train_stage *s, size_t ntok) {
    return ntok / (size_t)s->model.tp_size * s->model.residual_width;
}
static size_t residual_bytes(const train_stage *s, size_t ntok) {
    return residual_elems(s, ntok) * tetra_dtype_size(s->model.compute_dtype);
}
static comm_dtype residual_comm_dtype(const train_stage *s) {
    return s->model.compute_dtype == TETRA_BF16 ? COMM_BF16 : COMM_F32;
}

/* ----------------------------------------------------------------------------
 * a stage, unit by unit */

/* A unit's label in traces: "layers.3", "tok_embeddings", ... */
static const char *unit_label(const model_stage *m, int u) { return m->family->unit_name(m, u); }

/* doc: the microbatch's document ids (whole sequences), or NULL when the model needs none.
 * Every stage keeps them with its activations: each runs attention. */
/* loss_dev: where the output unit leaves the loss sum in backend memory (read later, no
 * host wait), or NULL to read it here and return it. */
static double stage_forward(train_stage *s, model_acts *a, const int32_t *in, const int32_t *lab, const int32_t *doc,
                            float dloss_scale, int64_t *n_valid, float *loss_dev) {
    model_stage *m = &s->model;
    const model_family *f = m->family;
    fsdp *fs = s->fs;
    double loss = 0.0;
    trace *tr = s->tr;
    char err[256];
    if (doc && f->set_documents(m, a, doc, err, sizeof err) != 0) {
        log_error("training data: %s", err);
        comm_abort_explained(1);
    }
    const model_loss_io io = {lab, dloss_scale, n_valid, loss_dev};
    for (int u = 0; u < m->n_units; u++) {
        const int block = f->unit_block(m, u) >= 0;
        if (block) trace_begin(tr, "fsdp", "unshard %s", unit_label(m, u));
        fsdp_pre_forward(fs, u);
        if (block) trace_end(tr);
        trace_begin(tr, "compute", "forward %s", unit_label(m, u));
        loss += f->forward(m, a, u, in, &io);
        trace_end(tr);
        fsdp_post_forward(fs, u);
        if (block) pp_progress();
    }
    return loss;
}

/* what = 1: I passes, 2: W passes, 3: both per unit (full backward) */
static void stage_backward(train_stage *s, model_acts *a, int what, int last) {
    model_stage *m = &s->model;
    const model_family *f = m->family;
    fsdp *fs = s->fs;
    trace *tr = s->tr;
    for (int u = m->n_units - 1; u >= 0; u--) {
        const int block = f->unit_block(m, u) >= 0;
        if (what & 1) { /* the input unit has no input gradient: its I pass only moves its FSDP state along */
            if (block) trace_begin(tr, "fsdp", "unshard %s", unit_label(m, u));
            fsdp_pre_backward(fs, u);
            if (block) trace_end(tr);
            if (u != model_input_unit(m)) {
                trace_begin(tr, "compute", "backward input %s", unit_label(m, u));
                f->backward_input(m, a, u);
                trace_end(tr);
            }
        }
        if (what & 2) {
            fsdp_pre_backward_weight(fs, u);
            trace_begin(tr, "compute", "backward weight %s", unit_label(m, u));
            f->backward_weight(m, a, u);
            trace_end(tr);
            if (block) trace_begin(tr, "fsdp", "reduce gradients %s", unit_label(m, u));
            fsdp_post_backward_weight(fs, u, last);
            if (block) trace_end(tr);
        }
        if (block) pp_progress();
    }
}

/* ----------------------------------------------------------------------------
 * the schedule's callbacks */

static size_t mb_offset(const trainer *t, int mb) {
    return ((size_t)t->shape.round * (size_t)t->shape.n_mb + (size_t)mb) * t->shape.tokens;
}
/* a microbatch's document ids: whole sequences, cp_size times its local tokens */
static const int32_t *mb_docs(const trainer *t, int mb) {
    return t->batch.doc ? t->batch.doc + mb_offset(t, mb) * (size_t)t->cp.size : NULL;
}

static void cb_forward(void *user, int stage, int mb) {
    trainer *t = user;
    train_stage *s = &t->st[local_of(t, stage)];
    model_acts *a = acts_take(s, mb);
    int64_t nv = 0;
    trace_begin(t->tr, "action", "F stage %d microbatch %d", stage, mb);
    /* the head's loss stays on the device until the step reads them all (train_step_read) */
    float *loss_dev = s->model.has_output && t->n_loss < t->loss_cap ? t->loss_dev + t->n_loss++ : NULL;
    t->step_loss_sum += stage_forward(s, a, t->batch.in + mb_offset(t, mb), t->batch.lab + mb_offset(t, mb),
                                      mb_docs(t, mb), t->dloss_scale, &nv, loss_dev);
    trace_end(t->tr);
    t->step_valid += nv;
    if (s->local_next >= 0) { /* the next stage runs here: hand the residual over */
        train_stage *nx = &t->st[s->local_next];
        const model_family *f = s->model.family;
        t->ops->copy(f->boundary(&nx->model, acts_take(nx, mb), 0, 0), f->boundary(&s->model, a, 1, 0),
                     residual_bytes(s, t->shape.tokens));
    }
}

/* After the I half: the stage before, when it runs here, gets the input gradient. */
static void hand_back(trainer *t, train_stage *s, model_acts *a, int mb) {
    const model_family *f = s->model.family;
    if (s->remote_prev) {
        /* into the send pool: the activations are free once the backward is done, while
         * the send may be waited for only at the end of the schedule */
        for (int i = 0; i < s->n_send; i++)
            if (s->send_mb[i] < 0) {
                s->send_mb[i] = mb;
                t->ops->copy(s->send_buf[i], f->boundary(&s->model, a, 0, 1), residual_bytes(s, t->shape.tokens));
                return;
            }
        fprintf(stderr, "train_step: stage %d has no send buffer free for microbatch %d (%d in use)\n", s->index, mb,
                s->n_send);
        abort();
    }
    if (s->local_prev < 0) return;
    train_stage *pv = &t->st[s->local_prev];
    t->ops->copy(f->boundary(&pv->model, acts_of(pv, mb), 1, 1), f->boundary(&s->model, a, 0, 1),
                 residual_bytes(s, t->shape.tokens));
}

static int last_round(const trainer *t) { return t->shape.round == n_rounds(t) - 1; }

static void cb_backward_input(void *user, int stage, int mb) {
    trainer *t = user;
    train_stage *s = &t->st[local_of(t, stage)];
    model_acts *a = acts_of(s, mb);
    trace_begin(t->tr, "action", "I stage %d microbatch %d", stage, mb);
    stage_backward(s, a, 1, 0);
    trace_end(t->tr);
    hand_back(t, s, a, mb);
}

static void cb_backward_weight(void *user, int stage, int mb, int last) {
    trainer *t = user;
    train_stage *s = &t->st[local_of(t, stage)];
    trace_begin(t->tr, "action", "W stage %d microbatch %d", stage, mb);
    stage_backward(s, acts_of(s, mb), 2, last && last_round(t));
    trace_end(t->tr);
    acts_clear(s, mb, ACTS_BACKWARD);
}

static void cb_backward(void *user, int stage, int mb, int last) {
    trainer *t = user;
    train_stage *s = &t->st[local_of(t, stage)];
    model_acts *a = acts_of(s, mb);
    trace_begin(t->tr, "action", "B stage %d microbatch %d", stage, mb);
    stage_backward(s, a, 3, last && last_round(t));
    trace_end(t->tr);
    hand_back(t, s, a, mb);
    acts_clear(s, mb, ACTS_BACKWARD);
}

static void cb_unshard(void *user, int stage) {
    trainer *t = user;
    train_stage *s = &t->st[local_of(t, stage)];
    for (int u = 0; u < s->model.n_units; u++) fsdp_prefetch(s->fs, u);
}

static void cb_reshard(void *user, int stage) {
    trainer *t = user;
    fsdp_reshard_all(t->st[local_of(t, stage)].fs);
}

/* Reductions start at each unit's last W pass (fsdp_post_backward_weight); the wait
 * belongs to the step's last round, earlier rounds keep accumulating. */
static void cb_reduce_grad(void *user, int stage) {
    (void)user;
    (void)stage;
}

static void cb_wait_reduce_grad(void *user, int stage) {
    trainer *t = user;
    if (last_round(t)) fsdp_finish_grads(t->st[local_of(t, stage)].fs);
}

static void *cb_buffer(void *user, int stage, int mb, pp_buffer which) {
    trainer *t = user;
    train_stage *s = &t->st[local_of(t, stage)];
    const model_family *f = s->model.family;
    switch (which) {
    case PP_BUF_ACT_IN: return f->boundary(&s->model, acts_take(s, mb), 0, 0);
    case PP_BUF_ACT_OUT: return f->boundary(&s->model, acts_of(s, mb), 1, 0);
    case PP_BUF_GRAD_IN:
        for (int i = 0; i < s->n_send; i++)
            if (s->send_mb[i] == mb) return s->send_buf[i];
        fprintf(stderr, "train_step: stage %d: microbatch %d has no gradient to send (send before backward)\n",
                s->index, mb);
        abort();
    default: return f->boundary(&s->model, acts_of(s, mb), 1, 1);
    }
}

static void cb_sent(void *user, int stage, int mb, pp_buffer which) {
    trainer *t = user;
    if (which != PP_BUF_GRAD_IN) return;
    train_stage *s = &t->st[local_of(t, stage)];
    for (int i = 0; i < s->n_send; i++)
        if (s->send_mb[i] == mb) s->send_mb[i] = -1;
}

static pp_stage_ops stage_ops(trainer *t) {
    pp_stage_ops o;
    memset(&o, 0, sizeof o);
    o.user = t;
    o.forward = cb_forward;
    o.backward_input = cb_backward_input;
    o.backward_weight = cb_backward_weight;
    o.backward = cb_backward;
    o.unshard = cb_unshard;
    o.reshard = cb_reshard;
    o.reduce_grad = cb_reduce_grad;
    o.wait_reduce_grad = cb_wait_reduce_grad;
    o.buffer = cb_buffer;
    o.sent = cb_sent;
    return o;
}

static pp_p2p stage_p2p(const trainer *t) {
    pp_p2p p;
    p.group = t->g_pp;
    p.count = residual_elems(&t->st[0], t->shape.tokens);
    p.dtype = residual_comm_dtype(&t->st[0]);
    return p;
}

/* Run the schedule once per accumulation round. */
static void run_rounds(trainer *t) {
    pp_stage_ops so = stage_ops(t);
    pp_p2p p2p = stage_p2p(t);
    char err[1024];
    memset(&t->pp_stats, 0, sizeof t->pp_stats);
    const int rounds = n_rounds(t);
    double t0 = now_s();
    for (t->shape.round = 0; t->shape.round < rounds; t->shape.round++) {
        pp_run_stats rs;
        if (pp_run_rank(t->run_sched, t->pp_rank, &so, &p2p, &rs, err, sizeof err)) {
            fprintf(stderr, "%s\n", err); /* validated before the first step: a bug */
            abort();
        }
        t->pp_stats.compute_s += rs.compute_s;
        t->pp_stats.fsdp_s += rs.fsdp_s;
        t->pp_stats.recv_wait_s += rs.recv_wait_s;
        t->pp_stats.send_wait_s += rs.send_wait_s;
        t->pp_stats.total_s += rs.total_s;
        for (int k = 0; k < 4; k++) {
            t->pp_stats.type_s[k] += rs.type_s[k];
            t->pp_stats.type_n[k] += rs.type_n[k];
        }
        t->pp_stats.sends += rs.sends;
        t->pp_stats.recvs += rs.recvs;
        for (int i = 0; i < t->n_local; i++)
            for (int k = 0; k < t->st[i].n_acts; k++)
                if (t->st[i].acts_mb[k] >= 0) {
                    fprintf(stderr, "train_step: stage %d still holds microbatch %d after the schedule\n",
                            t->st[i].index, t->st[i].acts_mb[k]);
                    abort();
                }
    }
    t->shape.round = rounds - 1;
    t->pp_step_s = now_s() - t0;
}

/* ----------------------------------------------------------------------------
 * one optimizer step */

void train_converters_pre_optimizer(trainer *t) {
    for (int k = 0; k < t->n_conv; k++)
        if (t->conv[k]->pre_optimizer)
            for (int i = 0; i < t->n_local; i++)
                t->conv[k]->pre_optimizer(t->st[i].conv_state[k], &t->st[i].model, t->st[i].fs);
}

/* The stretches stage i's AdamW reports amaxes of: the first converter's that asks. */
static const ops_amax_segments *converters_optimizer_amax(trainer *t, int i) {
    for (int k = 0; k < t->n_conv; k++)
        if (t->conv[k]->optimizer_amax) {
            const ops_amax_segments *seg =
                t->conv[k]->optimizer_amax(t->st[i].conv_state[k], &t->st[i].model, t->st[i].fs);
            if (seg) return seg;
        }
    return NULL;
}

void train_converters_post_optimizer(trainer *t) {
    for (int k = 0; k < t->n_conv; k++)
        if (t->conv[k]->post_optimizer)
            for (int i = 0; i < t->n_local; i++)
                t->conv[k]->post_optimizer(t->st[i].conv_state[k], &t->st[i].model, t->st[i].fs);
}

/* A step went non-finite: the rank holding the first non-finite gradient (by stage, then
 * parameter) names it. A failure path: it copies gradients to the host. */
static void report_nonfinite(trainer *t) {
    int64_t mine = INT64_MAX;
    char name[DT_NAME_MAX] = "";
    for (int i = 0; i < t->n_local && mine == INT64_MAX; i++) {
        train_stage *s = &t->st[i];
        const dt_tensor *T = fsdp_tensors(s->fs);
        const float *g = fsdp_grad(s->fs);
        for (int p = 0; p < s->model.n_params && mine == INT64_MAX; p++) {
            if (!T[p].n_pieces) continue;
            const size_t n = T[p].piece.count;
            float *h = malloc(n * sizeof *h);
            if (!h) break;
            t->ops->copy_d2h(h, g + T[p].piece.local_offset, n * sizeof *h);
            for (size_t k = 0; k < n; k++)
                if (!isfinite(h[k])) {
                    mine = ((int64_t)s->index << 20 | p) * t->world + t->rank;
                    snprintf(name, sizeof name, "%s", T[p].name);
                    break;
                }
            free(h);
        }
    }
    const int64_t first = comm_all_reduce_i64(t->g_world, mine, COMM_MIN);
    if (first == INT64_MAX) {
        if (t->rank == 0) log_warn("the loss is not finite, but every gradient is: the update is not applied");
    } else if (first == mine) {
        log_warn("first non-finite gradient: %s on rank %d; the update is not applied", name, t->rank);
    }
}

/* What one AdamW step of the job is given, whatever memory it runs on. With `dev` the
 * step count, clip coefficient and skip come from the optimizer's state instead (backend
 * memory of the table that runs the update). */
typedef struct {
    const tetra_config_values *c;
    int mixed; /* also write the bf16 compute copy */
    double lr;
    const ops_optim_state *dev;
} adamw_args;

static void adamw(const tetra_ops *ops, const adamw_args *a, float *master, uint16_t *compute, float *m, float *v,
                  const float *grad, size_t n, const ops_amax_segments *seg) {
    const tetra_config_values *c = a->c;
    if (seg) /* a converter's amaxes of the weights it writes, in the same pass */
        ops->adamw_step_amax(master, a->mixed ? compute : NULL, m, v, grad, n, a->lr, c->optimizer.beta1,
                             c->optimizer.beta2, c->optimizer.eps, c->optimizer.weight_decay, 0, 1.0f, a->dev, seg);
    else if (a->mixed) /* fp32 master weights and moments; the bf16 compute copy is written in the same pass */
        ops->adamw_step_bf16(master, compute, m, v, grad, n, a->lr, c->optimizer.beta1, c->optimizer.beta2,
                             c->optimizer.eps, c->optimizer.weight_decay, 0, 1.0f, a->dev);
    else
        ops->adamw_step(master, m, v, grad, n, a->lr, c->optimizer.beta1, c->optimizer.beta2, c->optimizer.eps,
                        c->optimizer.weight_decay, 0, 1.0f, a->dev);
}

/* CPU offload: AdamW on the host over one unit's range of the shard (parallel/fsdp.h),
 * the same op as the device's on the CPU backend's table. */
typedef struct {
    const adamw_args *a;
    const tetra_ops *host;
    train_stage *s;
} offload_ctx;

static void host_adamw(void *user, size_t off, size_t n, const float *grad, void *params_out) {
    const offload_ctx *oc = user;
    float *master = fsdp_master(oc->s->fs) + off;
    adamw(oc->host, oc->a, master, oc->a->mixed ? params_out : NULL, oc->s->adam_m + off, oc->s->adam_v + off, grad, n,
          NULL);
    if (!oc->a->mixed) memcpy(params_out, master, n * sizeof(float));
}

size_t train_step_scalar_bytes(const trainer *t) {
    /* the state, the stages' sums, then the losses, the stages' norms and the replicas' loss */
    return sizeof(ops_optim_state) + (size_t)t->n_local * sizeof(double) +
        (size_t)(t->loss_cap + t->n_local + 1) * sizeof(float);
}

/* A stage's gradients at the start of a step: where the model overwrites a gradient at its
 * first write and FSDP leaves them unzeroed, nothing is filled (a pass over every
 * gradient fewer); otherwise FSDP zeroes them. */
static void begin_stage_grads(train_stage *s) {
    const model_family *f = s->model.family;
    if (!f->grads_fresh) {
        fsdp_begin_step(s->fs);
        return;
    }
    if (fsdp_begin_step_unzeroed(s->fs)) f->grads_fresh(&s->model);
}

/* The gradient norm, clip coefficient and update decision of the step, queued on the
 * device: each stage's sum of squares is summed over the ranks holding its other pieces,
 * the stages' sums added in order, the pipeline ranks' added up (the same reductions, in
 * the same order, as a host read would make), and a non-finite loss on any rank turns the
 * norm into NaN on every rank those reductions reach. */
/* TETRA_TEST_INF_LOSS="RANK:STEP": that rank's loss of that step becomes +inf, its
 * gradients untouched (the tests' way to a non-finite loss with finite gradients). */
static void test_poison_loss(trainer *t) {
    static int rank = -2;
    static int64_t step = -1;
    if (rank == -2) {
        const char *s = getenv("TETRA_TEST_INF_LOSS");
        long long st = -1;
        rank = -1;
        if (s && sscanf(s, "%d:%lld", &rank, &st) != 2) rank = -1;
        step = (int64_t)st;
    }
    if (rank == t->rank && step == t->cur_step && t->n_loss > 0) t->ops->fill(t->loss_dev, INFINITY, 1);
}

static void queue_step_scalars(trainer *t) {
    const tetra_config_values *c = t->c;
    const tetra_ops *ops = t->ops;
    float *norms = t->loss_dev + t->loss_cap;
    test_poison_loss(t);
    /* A non-finite loss poisons the first stage's sum, which the reductions over the shard,
     * tensor and pipeline groups carry to every rank of the replica. Replicas reduce their
     * gradients, not their sums: a loss that is infinite on one replica while its gradients
     * are finite (a target's probability underflowing to 0) must stop the others too, so
     * with dp_replicate the poison is the losses' sum over the replicas. */
    const float *loss = t->loss_dev;
    int n_loss = t->n_loss;
    if (t->g_replicate) {
        float *rep = norms + t->n_local;
        ops->sum(rep, t->loss_dev, (size_t)t->n_loss);
        comm_all_reduce(t->g_replicate, rep, 1, COMM_F32, COMM_SUM, NULL);
        loss = rep;
        n_loss = 1;
    }
    for (int i = 0; i < t->n_local; i++) fsdp_grad_sq_norm_local(t->st[i].fs, norms + i);
    for (int i = 0; i < t->n_local; i++) {
        ops->grad_sq_to_f64(t->sq_dev + i, norms + i, 1, i == 0 ? loss : NULL, i == 0 ? n_loss : 0);
        fsdp_grad_sq_norm_global_dev(t->st[i].fs, t->sq_dev + i);
    }
    ops->sum_f64(&t->opt_dev->sq, t->sq_dev, t->n_local);
    if (t->pp_size > 1) comm_all_reduce(t->g_pp, &t->opt_dev->sq, 1, COMM_F64, COMM_SUM, NULL);
    const int skip_mode = !strcmp(c->training.on_nonfinite, "skip");
    const ops_optim_args a = {c->optimizer.lr * lr_factor(&t->lrs, t->tc.lr_count),
                              c->optimizer.beta1,
                              c->optimizer.beta2,
                              c->optimizer.eps,
                              c->optimizer.weight_decay,
                              c->training.max_norm,
                              t->cur_step,
                              (int32_t)(t->tc.opt_step + 1),
                              skip_mode ? (int32_t)c->training.max_consecutive_nonfinite_steps : 0,
                              !skip_mode};
    ops->optim_scalars(t->opt_dev, &a);
}

void train_step_read(trainer *t, step_result *r) {
    if (r->read) return;
    t->ops->copy_d2h(t->step_host, t->step_dev, train_step_scalar_bytes(t));
    const ops_optim_state *o = t->step_host;
    r->read = 1;
    /* the losses added in the order the heads ran, as a read per microbatch would add them */
    double loss_sum = t->step_loss_sum;
    for (int k = 0; k < t->n_loss; k++) loss_sum += (double)t->loss_host[k];
    r->grad_norm = sqrt(o->sq);
    /* the loss is computed on the last stage: every pipeline rank learns it */
    r->loss_sum = t->pp_size > 1 ? comm_all_reduce_f64(t->g_pp, loss_sum, COMM_SUM) : loss_sum;
    double local_avg = r->local_valid > 0 ? r->loss_sum / (double)r->local_valid : 0.0;
    double global_sum = comm_all_reduce_f64(t->g_loss, r->loss_sum, COMM_SUM);
    r->max_loss = comm_all_reduce_f64(t->g_loss, local_avg, COMM_MAX);
    r->loss = r->global_valid > 0 ? global_sum / (double)r->global_valid : 0.0;
    t->tc.opt_step = o->updates;
    r->nonfinite = o->nonfinite > 0 && o->last_bad == t->cur_step;
    r->new_bad = o->nonfinite - t->bad_seen;
    t->bad_seen = o->nonfinite;
    r->first_bad = o->first_bad;
    r->run = o->run;
    r->halted = o->halted;
    if (r->nonfinite) report_nonfinite(t);
}

/* training.cuda_graph: a step after the process' first (which made everything the ops
 * make lazily) is captured and launched as one graph, unless the profiler times it (its
 * spans wait for the device). Its host copies (tokens, targets, document ids, positions
 * of each microbatch) are staged for the graph: at most four of a microbatch's whole
 * sequences each. 1 when the step is being captured. */
static int graph_begin(trainer *t) {
    if (!t->c->training.cuda_graph || !t->graph_warm || trace_timing(t->tr)) return 0;
    const size_t mbs = (size_t)n_rounds(t) * (size_t)t->shape.n_mb;
    const size_t seq = t->shape.tokens * (size_t)t->cp.size * sizeof(int32_t);
    char err[512];
    if (t->ops->graph_begin(mbs * 4 * (seq + 256), err, sizeof err)) {
        log_error("training.cuda_graph: %s", err);
        comm_abort_explained(1);
    }
    return 1;
}
static void graph_end(trainer *t, int captured) {
    char err[512];
    if (captured && t->ops->graph_end(err, sizeof err)) {
        log_error("training.cuda_graph: %s", err);
        comm_abort_explained(1);
    }
    t->graph_warm = 1;
}

void train_step(trainer *t, step_result *r) {
    const tetra_config_values *c = t->c;
    const tetra_ops *ops = t->ops;
    memset(r, 0, sizeof *r);
    const size_t ntok = (size_t)n_rounds(t) * (size_t)t->shape.n_mb * t->shape.tokens;
    for (size_t i = 0; i < ntok; i++) r->local_valid += t->batch.lab[i] != OPS_IGNORE_INDEX;
    /* the loss is the sum over every valid token of the global batch divided by their
     * global count, so each rank's gradient is already its share of the global mean */
    r->global_valid = comm_all_reduce_i64(t->g_loss, r->local_valid, COMM_SUM);
    t->dloss_scale = r->global_valid > 0 ? (float)(1.0 / (double)r->global_valid) : 0.0f;
    t->step_loss_sum = 0.0;
    t->step_valid = 0;
    t->n_loss = 0;
    if (!t->opt_ready) { /* the update count (a resumed run's) reaches the device without a wait */
        ops_optim_state *o = t->step_host;
        memset(o, 0, sizeof *o);
        o->updates = (int32_t)t->tc.opt_step;
        t->bad_seen = 0;
        ops->copy_h2d_async(t->opt_dev, o, sizeof *o);
        t->opt_ready = 1;
    }

    const int captured = graph_begin(t);
    for (int i = 0; i < t->n_local; i++) begin_stage_grads(&t->st[i]);
    /* the schedule's actions nest in it; the time between them is the schedule's waiting */
    trace_begin(t->tr, "schedule", "schedule: %d microbatch%s x %d round%s", t->shape.n_mb,
                t->shape.n_mb == 1 ? "" : "es", n_rounds(t), n_rounds(t) == 1 ? "" : "s");
    run_rounds(t);
    trace_end(t->tr);
    trace_begin(t->tr, "fsdp", "finish gradient reductions");
    for (int i = 0; i < t->n_local; i++) fsdp_finish_grads(t->st[i].fs);
    trace_end(t->tr);
    trace_begin(t->tr, "optimizer", "clip gradients and AdamW");
    /* converters see the final gradients before the norm and the update */
    train_converters_pre_optimizer(t);
    queue_step_scalars(t);
    r->lr = c->optimizer.lr * lr_factor(&t->lrs, t->tc.lr_count);
    t->tc.lr_count++; /* the schedule follows the steps; AdamW's bias correction counts updates */
    t->tc.opt_step++; /* as the device expects it; the next read corrects it after a skipped step */
    const adamw_args a = {c, t->mixed, r->lr, t->opt_dev};
    int offloaded = 0;
    for (int i = 0; i < t->n_local; i++) offloaded |= fsdp_offloaded(t->st[i].fs);
    /* the host's AdamW needs the step's coefficients on the host: the one wait of such a step */
    if (offloaded) train_step_read(t, r);
    const adamw_args host_a = {c, t->mixed, r->lr, t->step_host};
    for (int i = 0; i < t->n_local; i++) {
        train_stage *s = &t->st[i];
        if (fsdp_offloaded(s->fs)) {
            offload_ctx oc = {&host_a, t->host_ops, s};
            fsdp_offload_update(s->fs, host_adamw, &oc);
            continue;
        }
        adamw(ops, &a, fsdp_master(s->fs), fsdp_compute_shard(s->fs), s->adam_m, s->adam_v, fsdp_grad(s->fs),
              fsdp_local_numel(s->fs), converters_optimizer_amax(t, i));
    }
    /* no wait for the update: the next step's work queues behind it on the stream, and
     * what reads the parameters on the host (a checkpoint, a log step's timing) waits */
    for (int i = 0; i < t->n_local; i++)
        if (!fsdp_offloaded(t->st[i].fs)) fsdp_params_updated(t->st[i].fs);
    train_converters_post_optimizer(t);
    graph_end(t, captured);
    trace_end(t->tr);
}

double train_forward_only(trainer *t, model_acts **acts, size_t ntok, const int32_t *in, const int32_t *lab,
                          const int32_t *doc, float dloss_scale, int64_t *n_valid) {
    double loss = 0.0;
    int64_t nv = 0;
    /* stages in ascending order: each rank receives a stage's input just as the rank
     * before it sends it, so the blocking chain cannot deadlock */
    for (int i = 0; i < t->n_local; i++) {
        train_stage *s = &t->st[i];
        const model_family *f = s->model.family;
        const size_t cnt = residual_elems(s, ntok), bytes = residual_bytes(s, ntok);
        const comm_dtype dt = residual_comm_dtype(s);
        if (s->remote_prev)
            comm_recv(t->g_pp, f->boundary(&s->model, acts[i], 0, 0), cnt, dt, t->run_sched->stage_rank[s->index - 1],
                      NULL);
        int64_t n = 0;
        loss += stage_forward(s, acts[i], in, lab, doc, dloss_scale, &n, NULL);
        nv += n;
        if (s->local_next >= 0)
            t->ops->copy(f->boundary(&t->st[s->local_next].model, acts[s->local_next], 0, 0),
                         f->boundary(&s->model, acts[i], 1, 0), bytes);
        if (s->remote_next)
            comm_send(t->g_pp, f->boundary(&s->model, acts[i], 1, 0), cnt, dt, t->run_sched->stage_rank[s->index + 1],
                      NULL);
    }
    if (t->pp_size > 1) {
        loss = comm_all_reduce_f64(t->g_pp, loss, COMM_SUM);
        nv = comm_all_reduce_i64(t->g_pp, nv, COMM_SUM);
    }
    if (n_valid) *n_valid = nv;
    return loss;
}

void train_warmup(trainer *t) {
    /* token 0 everywhere, dloss_scale 0: the gradients it leaves are zeroed by the next
     * step's fsdp_begin_step, and the parameters do not change */
    const size_t n = (size_t)t->shape.n_mb * t->shape.tokens;
    memset(t->batch.in, 0, n * sizeof(int32_t));
    memset(t->batch.lab, 0, n * sizeof(int32_t));
    if (t->batch.doc) memset(t->batch.doc, 0, n * (size_t)t->cp.size * sizeof(int32_t)); /* one document a sequence */
    t->dloss_scale = 0.0f;
    for (int i = 0; i < t->n_local; i++) begin_stage_grads(&t->st[i]);
    if (t->pp_size == 1) {
        t->shape.round = 0;
        cb_forward(t, t->st[0].index, 0);
        cb_backward(t, t->st[0].index, 0, 1);
    } else {
        const int accum = t->shape.accum;
        t->shape.accum = 1; /* one round, the last */
        run_rounds(t);
        t->shape.accum = accum;
    }
    for (int i = 0; i < t->n_local; i++) fsdp_finish_grads(t->st[i].fs);
    t->step_loss_sum = 0.0;
    t->step_valid = 0;
    t->n_loss = 0;
}

void train_shard_batch(const trainer *t, int32_t *in, int32_t *lab, const int32_t *full_in, const int32_t *full_lab,
                       int n, int T) {
    cp_shard_tokens(t->cp.size, t->cp.balanced, t->cp.rank, in, full_in, n, T);
    cp_shard_tokens(t->cp.size, t->cp.balanced, t->cp.rank, lab, full_lab, n, T);
}
