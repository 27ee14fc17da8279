/* model.h — Llama 3 on the backend op table: parameters, init, forward and
 * the two halves of backward.
 *
 * Parameters live in per-unit contiguous ranges of one allocation (units:
 * 0 = embedding, 1..L = transformer blocks, L+1 = final norm + output), each
 * parameter recorded with its TorchTitan name, global shape and offset, so
 * FSDP can shard a unit as one flat range and checkpoints can name every
 * element by global coordinates. Gradients mirror the same layout.
 *
 * Backward is split as the zero-bubble schedules need it: for each block,
 * backward_input ("I": every input-gradient GEMM plus attention, norm and
 * activation backward) and backward_weight ("W": weight-gradient GEMMs and
 * norm-weight reductions). I then W equals the one-pass backward bit for bit.
 * Parameter gradients accumulate (+=), so microbatches accumulate naturally.
 *
 * Activations for one microbatch live in a llama3_acts owned by the caller,
 * so several microbatches can be in flight.
 */
#ifndef TETRA_LLAMA3_MODEL_H
#define TETRA_LLAMA3_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "models/llama3/llama3_args.h"

typedef struct {
    char name[96];      /* TorchTitan FQN, e.g. "layers.3.attention.wq.weight" */
    int unit;           /* 0 embedding, 1..L block l-1, L+1 norm + output */
    int ndim;           /* 1 or 2 */
    int64_t shape[2];   /* global shape (row-major) */
    size_t numel;
    size_t offset;      /* elements from the start of the whole parameter buffer */
    /* init: all ones (norm weights), or a truncated normal N(0, init_std) cut to
     * [init_lo, init_hi] (absolute bounds; +-inf for a plain normal) */
    int init_ones;
    double init_std, init_lo, init_hi;
} llama3_param;

typedef struct {
    llama3_args args;
    const tetra_ops *ops;
    int max_seq_len;

    int n_params;
    llama3_param *params;     /* [n_params], in unit order */
    int n_units;              /* L + 2 */
    size_t *unit_offset;      /* [n_units] element offset of each unit */
    size_t *unit_numel;       /* [n_units] */
    size_t total_numel;

    float *param_mem;         /* [total_numel] backend memory: fp32 parameters */
    float *grad_mem;          /* [total_numel] backend memory: fp32 gradients (both precisions) */
    float *rope_table;        /* [max_seq_len, head_dim/2, 2] backend memory */

    /* Mixed precision (TorchTitan's mixed_precision_param = bfloat16): the forward and
     * backward read bf16 compute copies of the parameters and keep bf16 activations;
     * gradients stay fp32 and the fp32 parameters are the optimizer's master weights. */
    tetra_dtype compute_dtype; /* TETRA_F32 (default) or TETRA_BF16 */
    uint16_t *param_bf16;      /* [total_numel] backend memory, the compute copy (BF16 only) */
} llama3_model;

typedef struct llama3_acts llama3_acts;

/* Lay out parameters and allocate params, grads and the RoPE table. */
int llama3_model_init(llama3_model *m, const llama3_args *a, int max_seq_len, const tetra_ops *ops, char *err,
                      size_t errlen);
void llama3_model_free(llama3_model *m);

/* Choose the compute precision (before creating activations): TETRA_BF16 allocates the
 * bf16 compute copy and fills it from param_mem. */
int llama3_model_set_compute_dtype(llama3_model *m, tetra_dtype t, char *err, size_t errlen);
/* param_bf16 = bf16(param_mem) (round to nearest even) after the fp32 parameters were
 * written outside an optimizer step; a no-op in fp32. (With FSDP the compute copy is
 * gathered from the shards instead.) */
void llama3_sync_compute_params(llama3_model *m);

/* TorchTitan's init drawn from a counter-based RNG keyed by (seed, parameter
 * name, global element index): any sharding computes the same values. */
void llama3_init_weights(llama3_model *m, uint64_t seed);

/* Elements [start, start + count) of one parameter's row-major init, into host
 * memory: what a shard owner calls to initialise only its own range. */
void llama3_init_param_range(const llama3_param *p, uint64_t seed, size_t start, size_t count, float *host_out);

const llama3_param *llama3_find_param(const llama3_model *m, const char *name);
void llama3_zero_grads(llama3_model *m);

/* Activations of one microbatch of b sequences of t tokens (t <= max_seq_len). */
llama3_acts *llama3_acts_create(const llama3_model *m, int b, int t, char *err, size_t errlen);
void llama3_acts_free(const llama3_model *m, llama3_acts *a);
/* Bytes held by one llama3_acts of this size (for memory reports). */
size_t llama3_acts_bytes(const llama3_model *m, int b, int t);

/* Keep a copy of the logits before the fused cross-entropy overwrites them with
 * dlogits (tests; costs one more [b*t, V] buffer). Returns 0, or -1 when out of memory. */
int llama3_acts_keep_logits(const llama3_model *m, llama3_acts *a, int keep);

/* Forward over inputs/targets [b, t] (host memory) (targets may hold OPS_IGNORE_INDEX).
 * Returns the SUM of token losses; *n_valid gets the count of valid targets.
 * The fused cross-entropy also leaves dlogits = dloss_scale * dL/dlogits in
 * the activations, so pass dloss_scale = 1 / (global valid tokens). */
double llama3_forward(llama3_model *m, llama3_acts *a, const int32_t *inputs, const int32_t *targets,
                      float dloss_scale, int64_t *n_valid);
/* With targets == NULL the forward stops at the logits (no loss, no backward)
 * and returns 0. The pieces, for pipeline stages (residual r_0 is the embedding
 * output, block l maps r_l to r_{l+1}, the head reads r_L): */
void llama3_forward_embedding(llama3_model *m, llama3_acts *a, const int32_t *inputs);
void llama3_block_forward(llama3_model *m, llama3_acts *a, int layer);
double llama3_forward_head(llama3_model *m, llama3_acts *a, const int32_t *targets, float dloss_scale,
                           int64_t *n_valid);
/* Residual r_l [b*t, dim] and its gradient dL/dr_l (backend memory, compute dtype),
 * l in [0, L]: what pipeline stages send and receive. */
void *llama3_acts_residual(llama3_acts *a, int l);
void *llama3_acts_residual_grad(llama3_acts *a, int l);

/* The logits of the last forward ([b*t, V], backend memory): the kept copy
 * (llama3_acts_keep_logits), or the logits buffer itself after a forward
 * without targets; NULL otherwise (the buffer then holds dlogits). */
const float *llama3_logits(const llama3_acts *a);

/* Full backward of the last forward; accumulates into grad_mem. */
void llama3_backward(llama3_model *m, llama3_acts *a);

/* The pieces, for schedules that run them apart (pipeline parallel). I of block l
 * reads dL/dr_{l+1} (from the head or from I of block l+1) and writes dL/dr_l; W of
 * block l may run any time after I of block l and before this llama3_acts' next
 * forward (I leaves what W needs in the activations). The one-pass llama3_backward
 * runs head, then I and W per block from the last, then the embedding. */
void llama3_backward_head(llama3_model *m, llama3_acts *a);              /* output + final norm, I and W */
void llama3_block_backward_input(llama3_model *m, llama3_acts *a, int layer);
void llama3_block_backward_weight(llama3_model *m, llama3_acts *a, int layer);
void llama3_backward_embedding(llama3_model *m, llama3_acts *a);

#endif
