/* ac.c — activation checkpointing policies as keep masks per block (model.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama3/model.h"

/* TorchTitan's op-level SAC saves the attention output and every other matmul output
 * in forward order. wq, wk and wv run as one GEMM here (llama3_keep_qkv), so the
 * matmuls are qkv, wo, w1, w3, w2 and the 1st, 3rd and 5th are saved; w2's output is
 * the block's output, which the residual stream keeps anyway. */
#define KEEP_OP (LLAMA3_KEEP_Q | LLAMA3_KEEP_K | LLAMA3_KEEP_V | LLAMA3_KEEP_ATT | LLAMA3_KEEP_A)

int llama3_ac_policy(const llama3_model *m, const char *mode, const char *option, unsigned *keep, char *err,
                     size_t errlen) {
    const int l0 = m->layout.layer_start, nb = m->layout.layer_end - l0;
    if (!strcmp(mode, "none") || !strcmp(mode, "full")) {
        for (int i = 0; i < nb; i++) keep[i] = !strcmp(mode, "none") ? LLAMA3_KEEP_ALL : LLAMA3_KEEP_NONE;
        return 0;
    }
    if (strcmp(mode, "selective") != 0) {
        snprintf(err, errlen, "activation_checkpoint.mode = \"%s\": expected none, selective or full", mode);
        return -1;
    }
    if (option && !strcmp(option, "op")) {
        for (int i = 0; i < nb; i++) keep[i] = KEEP_OP;
        return 0;
    }
    char *end = NULL;
    long every = option ? strtol(option, &end, 10) : 0;
    if (!option || end == option || *end || every < 1) {
        snprintf(err, errlen,
                 "activation_checkpoint.selective_ac_option = \"%s\": expected \"op\" or a positive "
                 "integer N (every N-th block)",
                 option ? option : "");
        return -1;
    }
    /* TorchTitan counts blocks from 1 and checkpoints those whose count divides by N */
    for (int i = 0; i < nb; i++) keep[i] = ((long)(l0 + i + 1) % every == 0) ? LLAMA3_KEEP_NONE : LLAMA3_KEEP_ALL;
    return 0;
}

double llama3_recompute_linear_flops(const llama3_args *a, unsigned keep, int tp_size, int *attention) {
    const double d = a->dim, kv = (double)a->n_kv_heads * llama3_head_dim(a), f = (double)llama3_ffn_hidden(a);
    const double tp = tp_size > 0 ? tp_size : 1;
    double fl = 0.0;
    if (!(keep & LLAMA3_KEEP_Q)) fl += 2.0 * d * d;
    if (!(keep & LLAMA3_KEEP_K)) fl += 2.0 * d * kv;
    if (!(keep & LLAMA3_KEEP_V)) fl += 2.0 * d * kv;
    if (!(keep & LLAMA3_KEEP_H)) fl += 2.0 * d * d;
    if (!(keep & LLAMA3_KEEP_A)) fl += 2.0 * d * f;
    if (!(keep & LLAMA3_KEEP_G)) fl += 2.0 * d * f;
    if (attention) *attention = !(keep & LLAMA3_KEEP_ATT);
    return fl / tp;
}
