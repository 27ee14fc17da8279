/* ops_run.c — the recorded training step of `tetra plan --ops` (ops.h): the
 * trainer's own setup, warm-up and steps, on one rank, through any op table. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "telemetry/log.h"
#include "plan/ops.h"
#include "telemetry/trace.h"
#include "engine/trainer_internal.h"

/* This rank's batch of one step: made-up tokens below the vocabulary size (a
 * recording table reads none; a computing one needs valid ids), the labels the next
 * token. The same tokens for every call, so two runs see the same batch. */
static void fill_batch(trainer *t) {
    const size_t n = (size_t)t->shape.accum * (size_t)t->c->training.local_batch_size * (size_t)t->shape.seq_len;
    uint32_t x = 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        t->batch.in[i] = (int32_t)((x >> 8) % (uint32_t)t->args.family->vocab_size(&t->args));
    }
    for (size_t i = 0; i < n; i++) t->batch.lab[i] = t->batch.in[(i + 1) % n];
}

static void step(trainer *t) {
    step_result r;
    fill_batch(t);
    train_step(t, &r);
    t->tc.step++;
}

int plan_ops_run(const tetra_config *cfg, const tetra_ops *ops, int init_weights, int weights_per_use,
                 void (*mark)(void *user, int on), void *user, char *err, size_t errlen) {
    tetra_job job;
    if (job_resolve(cfg, 1, &job, err, errlen)) return -1;
    trainer_options o;
    memset(&o, 0, sizeof o);
    o.external_batches = 1;
    o.ops = ops;
    o.skip_weight_init = !init_weights;
    o.weights_per_use = weights_per_use;
    trainer *t = NULL;
    char why[2048] = "";
    log_capture(why, sizeof why);
    const int rc = trainer_setup(&t, cfg, &job, 0, 1, &o);
    log_capture(NULL, 0);
    if (rc != 0 || !t) {
        snprintf(err, errlen, "the trainer's set-up failed: %s", why[0] ? why : "(no message)");
        return -1;
    }
    /* the GPU run's start-up: a warm-up microbatch, then a first step (Float8 takes its
     * weight statistics once per optimizer step, at the first use after the update: the
     * second step is the steady one) */
    fill_batch(t);
    train_warmup(t);
    step(t);
    trace *tr = trace_create(NULL, 0, 1, 1, ops, t->cw, err, errlen);
    if (!tr) {
        trainer_teardown(t);
        return -1;
    }
    t->tr = tr; /* the teardown frees it */
    for (int i = 0; i < t->n_local; i++) t->st[i].tr = tr;
    if (mark) mark(user, 1);
    trace_step_begin(tr, t->tc.step + 1);
    step(t);
    int bad = trace_step_end(tr, t->tc.step, err, errlen);
    if (mark) mark(user, 0);
    trainer_teardown(t);
    return bad ? -1 : 0;
}
