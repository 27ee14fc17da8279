/* model_capi.c — flat entry points over the model for the Python reference tests
 * (ctypes on libtetra.so): plain ints, doubles and host arrays, no structs. A
 * handle owns a model on the CPU backend and one activation buffer: forward,
 * backward, weights and gradients in and out. Training steps (clipping, AdamW, the
 * LR schedule) are the trainer's own, through engine/trainer_capi.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama3/hf.h"
#include "models/llama3/model.h"

/* Exported helpers (not in a header: only ctypes calls them). */
void *llama3_capi_create(const char *flavor, int max_seq_len, char *err, size_t errlen);
void llama3_capi_free(void *h);
void llama3_capi_init_weights(void *h, uint64_t seed);
int llama3_capi_n_params(void *h);
const char *llama3_capi_param_name(void *h, int i);
int llama3_capi_param_shape(void *h, int i, int64_t *shape);
int llama3_capi_get(void *h, const char *name, int grad, float *out);
int llama3_capi_set(void *h, const char *name, const float *in);
size_t llama3_capi_acts_bytes(void *h, int b, int t);
double llama3_capi_forward_backward(void *h, int b, int t, const int32_t *inputs, const int32_t *targets,
                                    float *logits_out);
int llama3_capi_set_reset_positions(void *h, int on);
double llama3_capi_forward_backward_docs(void *h, int b, int t, const int32_t *inputs, const int32_t *targets,
                                         const int32_t *docs, float *logits_out);
int llama3_capi_save_hf(void *h, const char *path, const char *dtype, int grad, char *err, size_t errlen);
int llama3_capi_load_hf(void *h, const char *path, char *err, size_t errlen);

typedef struct {
    llama3_model m;
    llama3_acts *acts;
    int b, t;
} capi;

void *llama3_capi_create(const char *flavor, int max_seq_len, char *err, size_t errlen) {
    llama3_args a;
    if (llama3_flavor(flavor, &a) != 0) {
        snprintf(err, errlen, "unknown flavor '%s' (known: %s)", flavor, llama3_flavor_names());
        return NULL;
    }
    const tetra_ops *ops = ops_get("cpu", err, errlen);
    if (!ops) return NULL;
    capi *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (llama3_model_init(&c->m, &a, max_seq_len, ops, err, errlen) != 0) {
        free(c);
        return NULL;
    }
    return c;
}

void llama3_capi_free(void *h) {
    capi *c = h;
    if (!c) return;
    llama3_acts_free(&c->m, c->acts);
    llama3_model_free(&c->m);
    free(c);
}

void llama3_capi_init_weights(void *h, uint64_t seed) { llama3_init_weights(&((capi *)h)->m, seed); }

int llama3_capi_n_params(void *h) { return ((capi *)h)->m.n_params; }

const char *llama3_capi_param_name(void *h, int i) { return ((capi *)h)->m.params[i].name; }

int llama3_capi_param_shape(void *h, int i, int64_t *shape) {
    const llama3_param *p = &((capi *)h)->m.params[i];
    shape[0] = p->shape[0];
    shape[1] = p->shape[1];
    return p->ndim;
}

int llama3_capi_get(void *h, const char *name, int grad, float *out) {
    capi *c = h;
    const llama3_param *p = llama3_find_param(&c->m, name);
    if (!p) return -1;
    c->m.ops->copy_d2h(out, (grad ? c->m.grad_mem : c->m.param_mem) + p->offset, p->numel * sizeof(float));
    return 0;
}

int llama3_capi_set(void *h, const char *name, const float *in) {
    capi *c = h;
    const llama3_param *p = llama3_find_param(&c->m, name);
    if (!p) return -1;
    c->m.ops->copy_h2d(c->m.param_mem + p->offset, in, p->numel * sizeof(float));
    return 0;
}

size_t llama3_capi_acts_bytes(void *h, int b, int t) { return llama3_acts_bytes(&((capi *)h)->m, b, t); }

/* model.reset_positions_at_document_boundaries for the next activations (before the first
 * forward of a size): 0. */
int llama3_capi_set_reset_positions(void *h, int on) {
    capi *c = h;
    llama3_acts_free(&c->m, c->acts);
    c->acts = NULL;
    c->m.args.reset_positions = on != 0;
    return 0;
}

/* Zero the gradients, run forward and backward on one batch with the loss
 * averaged over its valid targets; returns that mean loss (NAN on error). */
double llama3_capi_forward_backward(void *h, int b, int t, const int32_t *inputs, const int32_t *targets,
                                    float *logits_out) {
    return llama3_capi_forward_backward_docs(h, b, t, inputs, targets, NULL, logits_out);
}

/* The same with the batch's document ids [b, t] (NULL: the ids given last; at first one
 * document a sequence), for a block_causal flavor or positions reset at document boundaries. */
double llama3_capi_forward_backward_docs(void *h, int b, int t, const int32_t *inputs, const int32_t *targets,
                                         const int32_t *docs, float *logits_out) {
    capi *c = h;
    char err[256];
    if (!c->acts || c->b != b || c->t != t) {
        llama3_acts_free(&c->m, c->acts);
        c->acts = llama3_acts_create(&c->m, b, t, err, sizeof err);
        if (!c->acts) {
            fprintf(stderr, "%s\n", err);
            return NAN;
        }
        c->b = b;
        c->t = t;
    }
    if (llama3_acts_keep_logits(&c->m, c->acts, logits_out != NULL) != 0) return NAN;
    if (docs && llama3_acts_set_documents(&c->m, c->acts, docs, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return NAN;
    }
    int64_t valid = 0;
    for (size_t i = 0; i < (size_t)b * (size_t)t; i++) valid += targets[i] != OPS_IGNORE_INDEX;
    if (valid == 0) return NAN;
    llama3_zero_grads(&c->m);
    double sum = llama3_forward(&c->m, c->acts, inputs, targets, (float)(1.0 / (double)valid), NULL);
    if (logits_out)
        c->m.ops->copy_d2h(logits_out, llama3_logits(c->acts),
                           (size_t)b * (size_t)t * (size_t)c->m.args.vocab_size * sizeof(float));
    llama3_backward(&c->m, c->acts);
    return sum / (double)valid;
}

int llama3_capi_save_hf(void *h, const char *path, const char *dtype, int grad, char *err, size_t errlen) {
    capi *c = h;
    return llama3_save_hf_buffer(&c->m, grad ? c->m.grad_mem : c->m.param_mem, path, dtype, err, errlen);
}

int llama3_capi_load_hf(void *h, const char *path, char *err, size_t errlen) {
    return llama3_load_hf(&((capi *)h)->m, path, err, errlen);
}
