/* train_step.c — one optimizer step as a schedule of actions on the model and
 * FSDP, then clipping, AdamW and the LR schedule (see trainer.h).
 *
 * The schedule (parallel/pp/schedule.h) says which stage and microbatch runs
 * forward, backward-input, backward-weight or a full backward; the callbacks
 * below turn each action into the unit-by-unit calls of the model, each bracketed
 * by its FSDP hooks:
 *   F  for each unit in order: pre_forward, the unit's forward, post_forward
 *   I  for each unit in reverse: pre_backward, the unit's I pass
 *   W  for each unit in reverse: pre_backward_weight, the unit's W pass,
 *      post_backward_weight (starts the gradient reduction when due)
 *   B  for each unit in reverse: I then W (so a unit's reduce-scatter overlaps the
 *      next unit's backward)
 * The embedding has no I pass; the head's I starts the residual gradient. Each
 * microbatch's activations come from a pool sized by the schedule's peak number of
 * microbatches in flight and go back after its last backward action.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/trainer_internal.h"
#include "parallel/pp/runtime.h"

int train_build_schedule(trainer *t, char *err, size_t errlen) {
    t->sched = pp_schedule_accumulate(t->accum);
    if (!t->sched) {
        snprintf(err, errlen, "schedule: out of host memory");
        return -1;
    }
    if (pp_schedule_validate(t->sched, err, errlen)) return -1;
    t->n_acts = pp_schedule_max_in_flight(t->sched);
    return 0;
}

/* ----------------------------------------------------------------------------
 * activation buffers per microbatch */

static llama3_acts *acts_take(trainer *t, int mb) {
    for (int i = 0; i < t->n_acts; i++)
        if (t->acts_mb[i] == mb) return t->acts[i];
    for (int i = 0; i < t->n_acts; i++)
        if (t->acts_mb[i] < 0) {
            t->acts_mb[i] = mb;
            return t->acts[i];
        }
    /* the pool is sized by the validated schedule: running out is a bug */
    fprintf(stderr, "train_step: no activation buffer free for microbatch %d (%d in flight)\n", mb, t->n_acts);
    abort();
}

static llama3_acts *acts_of(trainer *t, int mb) {
    for (int i = 0; i < t->n_acts; i++)
        if (t->acts_mb[i] == mb) return t->acts[i];
    fprintf(stderr, "train_step: backward of microbatch %d without its forward\n", mb);
    abort();
}

static void acts_release(trainer *t, int mb) {
    for (int i = 0; i < t->n_acts; i++)
        if (t->acts_mb[i] == mb) t->acts_mb[i] = -1;
}

/* ----------------------------------------------------------------------------
 * a stage, unit by unit */

static double stage_forward(trainer *t, llama3_acts *a, const int32_t *in, const int32_t *lab, float dloss_scale,
                            int64_t *n_valid) {
    llama3_model *m = &t->model;
    fsdp *fs = t->fs;
    double loss = 0.0;
    int u = llama3_embedding_unit(m);
    if (u >= 0) {
        fsdp_pre_forward(fs, u);
        llama3_forward_embedding(m, a, in);
        fsdp_post_forward(fs, u);
    }
    for (int l = m->layout.layer_start; l < m->layout.layer_end; l++) {
        u = llama3_block_unit(m, l);
        fsdp_pre_forward(fs, u);
        llama3_block_forward(m, a, l);
        fsdp_post_forward(fs, u);
    }
    u = llama3_head_unit(m);
    if (u >= 0) {
        fsdp_pre_forward(fs, u);
        loss = llama3_forward_head(m, a, lab, dloss_scale, n_valid);
        fsdp_post_forward(fs, u);
    }
    return loss;
}

/* what = 1: I passes, 2: W passes, 3: both per unit (full backward) */
static void stage_backward(trainer *t, llama3_acts *a, int what, int last) {
    llama3_model *m = &t->model;
    fsdp *fs = t->fs;
    int u = llama3_head_unit(m);
    if (u >= 0) {
        if (what & 1) {
            fsdp_pre_backward(fs, u);
            llama3_backward_head_input(m, a);
        }
        if (what & 2) {
            fsdp_pre_backward_weight(fs, u);
            llama3_backward_head_weight(m, a);
            fsdp_post_backward_weight(fs, u, last);
        }
    }
    for (int l = m->layout.layer_end - 1; l >= m->layout.layer_start; l--) {
        u = llama3_block_unit(m, l);
        if (what & 1) {
            fsdp_pre_backward(fs, u);
            llama3_block_backward_input(m, a, l);
        }
        if (what & 2) {
            fsdp_pre_backward_weight(fs, u);
            llama3_block_backward_weight(m, a, l);
            fsdp_post_backward_weight(fs, u, last);
        }
    }
    u = llama3_embedding_unit(m);
    if (u >= 0) { /* no input gradient: the I pass only gathers dL/dr_0 under tensor parallel */
        if (what & 1) {
            fsdp_pre_backward(fs, u);
            llama3_backward_embedding_input(m, a);
        }
        if (what & 2) {
            fsdp_pre_backward_weight(fs, u);
            llama3_backward_embedding(m, a);
            fsdp_post_backward_weight(fs, u, last);
        }
    }
}

/* ----------------------------------------------------------------------------
 * the schedule's callbacks (stage 0 of a single-stage schedule in this version) */

static void cb_forward(void *user, int stage, int mb) {
    trainer *t = user;
    (void)stage;
    llama3_acts *a = acts_take(t, mb);
    int64_t nv = 0;
    t->step_loss_sum += stage_forward(t, a, t->h_in + (size_t)mb * t->tok, t->h_lab + (size_t)mb * t->tok,
                                      t->dloss_scale, &nv);
    t->step_valid += nv;
}

static void cb_backward_input(void *user, int stage, int mb) {
    trainer *t = user;
    (void)stage;
    stage_backward(t, acts_of(t, mb), 1, 0);
}

static void cb_backward_weight(void *user, int stage, int mb, int last) {
    trainer *t = user;
    (void)stage;
    stage_backward(t, acts_of(t, mb), 2, last);
    acts_release(t, mb);
}

static void cb_backward(void *user, int stage, int mb, int last) {
    trainer *t = user;
    (void)stage;
    stage_backward(t, acts_of(t, mb), 3, last);
    acts_release(t, mb);
}

static void cb_unshard(void *user, int stage) {
    trainer *t = user;
    (void)stage;
    for (int u = 0; u < t->model.n_units; u++) fsdp_prefetch(t->fs, u);
}

static void cb_reshard(void *user, int stage) {
    trainer *t = user;
    (void)stage;
    fsdp_reshard_all(t->fs);
}

static void cb_reduce_grad(void *user, int stage) {
    trainer *t = user;
    (void)stage;
    fsdp_finish_grads(t->fs);
}

static pp_stage_ops stage_ops(trainer *t) {
    pp_stage_ops o = {t, cb_forward, cb_backward_input, cb_backward_weight, cb_backward,
                      cb_unshard, cb_reshard, cb_reduce_grad};
    return o;
}

/* ----------------------------------------------------------------------------
 * one optimizer step */

void train_step(trainer *t, step_result *r) {
    const tetra_config_values *c = t->c;
    const tetra_ops *ops = t->ops;
    memset(r, 0, sizeof *r);
    for (size_t i = 0; i < (size_t)t->accum * t->tok; i++) r->local_valid += t->h_lab[i] != OPS_IGNORE_INDEX;
    /* the loss is the sum over every valid token of the global batch divided by their
     * global count, so each rank's gradient is already its share of the global mean */
    r->global_valid = comm_all_reduce_i64(t->g_loss, r->local_valid, COMM_SUM);
    t->dloss_scale = r->global_valid > 0 ? (float)(1.0 / (double)r->global_valid) : 0.0f;
    t->step_loss_sum = 0.0;
    t->step_valid = 0;

    fsdp_begin_step(t->fs);
    pp_stage_ops so = stage_ops(t);
    char err[512];
    if (pp_run_rank(t->sched, 0, &so, err, sizeof err)) {
        fprintf(stderr, "%s\n", err); /* validated before the first step: a bug */
        abort();
    }
    fsdp_finish_grads(t->fs);
    r->grad_norm = sqrt(fsdp_grad_sq_norm(t->fs));
    /* torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), clamped to 1 */
    float clip = (float)(c->training.max_norm / (r->grad_norm + 1e-6));
    if (clip > 1.0f) clip = 1.0f;
    r->lr = c->optimizer.lr * lr_factor(&t->lrs, t->tc.lr_count);
    t->tc.lr_count++;
    t->tc.opt_step++;
    const size_t local = fsdp_local_numel(t->fs);
    if (t->mixed) /* fp32 master weights and moments; the bf16 compute copy is written in the same pass */
        ops->adamw_step_bf16(fsdp_master(t->fs), fsdp_compute_shard(t->fs), t->adam_m, t->adam_v, fsdp_grad(t->fs),
                             local, r->lr, c->optimizer.beta1, c->optimizer.beta2, c->optimizer.eps,
                             c->optimizer.weight_decay, (int)t->tc.opt_step, clip);
    else
        ops->adamw_step(fsdp_master(t->fs), t->adam_m, t->adam_v, fsdp_grad(t->fs), local, r->lr, c->optimizer.beta1,
                        c->optimizer.beta2, c->optimizer.eps, c->optimizer.weight_decay, (int)t->tc.opt_step, clip);
    ops->synchronize();
    fsdp_params_updated(t->fs);

    r->loss_sum = t->step_loss_sum;
    double local_avg = r->local_valid > 0 ? r->loss_sum / (double)r->local_valid : 0.0;
    double global_sum = comm_all_reduce_f64(t->g_loss, r->loss_sum, COMM_SUM);
    r->max_loss = comm_all_reduce_f64(t->g_loss, local_avg, COMM_MAX);
    r->loss = r->global_valid > 0 ? global_sum / (double)r->global_valid : 0.0;
}

double train_forward_only(trainer *t, llama3_acts *a, const int32_t *in, const int32_t *lab, float dloss_scale,
                          int64_t *n_valid) {
    return stage_forward(t, a, in, lab, dloss_scale, n_valid);
}

void train_warmup(trainer *t) {
    /* token 0 everywhere, dloss_scale 0: the gradients it leaves are zeroed by the next
     * step's fsdp_begin_step, and the parameters do not change */
    memset(t->h_in, 0, t->tok * sizeof(int32_t));
    memset(t->h_lab, 0, t->tok * sizeof(int32_t));
    t->dloss_scale = 0.0f;
    fsdp_begin_step(t->fs);
    cb_forward(t, 0, 0);
    cb_backward(t, 0, 0, 1);
    fsdp_finish_grads(t->fs);
    t->step_loss_sum = 0.0;
    t->step_valid = 0;
}
