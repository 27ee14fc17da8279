/* trainer_capi.c — the training job's own step for the Python reference tests and
 * benchmarks (ctypes on libtetra.so): plain ints, doubles and host arrays, no structs.
 *
 * A handle is this rank's trainer, set up from `tetra train` arguments exactly as the
 * command line does (config file, keys, validation), with no data loader: each call of
 * trainer_capi_step hands it this rank's batches of one step and runs train_step — the
 * schedule, FSDP hooks, gradient clipping, AdamW and the LR schedule of a real run
 * (collective: every rank calls it). MPI is initialised on first use (a singleton
 * outside mpirun) and finalised at exit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "telemetry/log.h"
#include "engine/trainer_internal.h"
#include "models/model.h"
#include "util/host.h"

/* Exported helpers (not in a header: only ctypes calls them). */
void *trainer_capi_create(int argc, char **argv, char *err, size_t errlen);
void trainer_capi_free(void *h);
int trainer_capi_batch_tokens(void *h);
const char *trainer_capi_backend(void *h);
double trainer_capi_step(void *h, const int32_t *inputs, const int32_t *labels, double *grad_norm, double *lr);
double trainer_capi_step_docs(void *h, const int32_t *inputs, const int32_t *labels, const int32_t *docs,
                              double *grad_norm, double *lr);
int trainer_capi_save_hf(void *h, const char *path, char *err, size_t errlen);

typedef struct {
    tetra_config cfg;
    trainer *t;
} capi;

void *trainer_capi_create(int argc, char **argv, char *err, size_t errlen) {
    if (host_start(NULL, NULL)) host_end_at_exit();
    const int rank = host_rank(), world = host_world();
    log_init(rank, world);
    capi *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "trainer_capi: out of host memory");
        return NULL;
    }
    cfg_init(&c->cfg);
    tetra_job job;
    int rc = cfg_parse_args(&c->cfg, argc, argv, stdout, err, errlen);
    if (rc == 0) rc = job_resolve(&c->cfg, world, &job, err, errlen);
    if (rc == 0) rc = cfg_check_build(&c->cfg, err, errlen);
    if (rc != 0) {
        cfg_free(&c->cfg);
        free(c);
        return NULL;
    }
    trainer_options o;
    memset(&o, 0, sizeof o);
    o.external_batches = 1;
    if (trainer_setup(&c->t, &c->cfg, &job, rank, world, &o) != 0 || !c->t) {
        snprintf(err, errlen, "trainer_capi: setup failed (see the log)");
        cfg_free(&c->cfg);
        free(c);
        return NULL;
    }
    return c;
}

void trainer_capi_free(void *h) {
    capi *c = h;
    if (!c) return;
    trainer_teardown(c->t);
    cfg_free(&c->cfg);
    free(c);
}

/* The backend it computes on: "cpu" or "cuda". */
const char *trainer_capi_backend(void *h) { return ((capi *)h)->t->ops->name; }

/* Tokens of one step's batch on this rank: gradient accumulation x local batch x seq. */
int trainer_capi_batch_tokens(void *h) {
    const trainer *t = ((capi *)h)->t;
    return (int)((size_t)t->shape.accum * (size_t)t->c->training.local_batch_size * (size_t)t->shape.seq_len);
}

/* One optimizer step on inputs/labels [accum * local_batch * seq_len] (int32, labels may
 * hold -100). Returns the loss (global mean over valid tokens); the gradient norm before
 * clipping and the learning rate used go to *grad_norm, *lr. */
double trainer_capi_step(void *h, const int32_t *inputs, const int32_t *labels, double *grad_norm, double *lr) {
    return trainer_capi_step_docs(h, inputs, labels, NULL, grad_norm, lr);
}

/* The same with the batch's document ids [accum * local_batch * seq_len] (whole sequences,
 * as the loader's dl_next_docs gives them), for a block_causal model or positions reset at
 * document boundaries; NULL: each sequence one document. */
double trainer_capi_step_docs(void *h, const int32_t *inputs, const int32_t *labels, const int32_t *docs,
                              double *grad_norm, double *lr) {
    trainer *t = ((capi *)h)->t;
    const size_t n = (size_t)t->shape.accum * (size_t)t->c->training.local_batch_size * (size_t)t->shape.seq_len;
    if (t->batch.doc) {
        if (docs) memcpy(t->batch.doc, docs, n * sizeof(int32_t));
        else memset(t->batch.doc, 0, n * sizeof(int32_t));
    }
    if (t->cp.size > 1) { /* whole sequences in, this rank's rows kept */
        train_shard_batch(t, t->batch.in, t->batch.lab, inputs, labels, (int)(n / (size_t)t->shape.seq_len),
                          t->shape.seq_len);
    } else {
        memcpy(t->batch.in, inputs, n * sizeof(int32_t));
        memcpy(t->batch.lab, labels, n * sizeof(int32_t));
    }
    step_result r;
    t->cur_step = t->tc.step + 1;
    train_step(t, &r);
    train_step_read(t, &r); /* the caller reads this step's loss and norm */
    t->tc.step++;
    if (grad_norm) *grad_norm = r.grad_norm;
    if (lr) *lr = r.lr;
    return r.loss;
}

/* The trainer's current weights (its fp32 master parameters) as Hugging Face safetensors. */
int trainer_capi_save_hf(void *h, const char *path, char *err, size_t errlen) {
    trainer *t = ((capi *)h)->t;
    if (t->n_local != 1 || t->pp_size != 1 || fsdp_shard_degree(t->st[0].fs) != 1) {
        snprintf(err, errlen, "trainer_capi: HF export needs the whole model on this rank");
        return -1;
    }
    const model_stage *m = &t->st[0].model;
    return m->family->hf_save_buffer(m, fsdp_master(t->st[0].fs), path, err, errlen);
}
