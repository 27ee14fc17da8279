/* model.h — Llama 3 on the backend op table: a layout-aware parameter
 * declaration, init, forward and the two halves of backward.
 *
 * A model is built for a layout (llama3_layout): the range of blocks this rank
 * runs (a pipeline stage), whether it holds the embedding and the head (final
 * norm + output), and its tensor-parallel rank and size. It declares only the
 * parameters of that layout, each with its global shape and the block of the
 * global tensor this rank holds (the tensor-parallel box; the whole tensor at
 * tp 1), so FSDP and checkpoints can name every element by global
 * coordinates. Parameters are grouped into units — the embedding, each block,
 * the head — laid out as contiguous ranges of one flat index space.
 *
 * Storage is not the model's business. Each unit's parameters (compute dtype)
 * and fp32 gradients are found through two pointer tables, unit_params and
 * unit_grads, that the owner of the storage fills: FSDP binds a unit's gathered
 * working buffer between its all-gather and its reshard, and its gradient
 * buffer while the unit's W pass runs. A pass that reads an unbound unit stops
 * with a message naming the unit (a schedule bug, never silent garbage). For
 * tests and tools, llama3_model_init gives the whole model its own flat
 * buffers (param_mem, grad_mem, param_bf16) and binds them once.
 *
 * Every projection goes through a linear descriptor (model_linear): its
 * weight, its sizes, its tensor-parallel style and an implementation slot
 * (default: the compute-dtype GEMM). A model converter such as Float8 swaps
 * the implementation of chosen linears without touching the forward code.
 *
 * Tensor parallel (tp_size P > 1; the Llama plan of TorchTitan's parallelize_llama,
 * Megatron layout, with sequence and loss parallel): wq/wk/wv/w1/w3 are
 * column-parallel (rank p holds n_heads/P query heads, n_kv_heads/P kv heads, F/P
 * hidden units), wo/w2 row-parallel, the embedding and the output projection
 * vocabulary-parallel, the norms replicated. Between the parallel regions the
 * residual stream is split by rows (sequence parallel: of the N tokens of a
 * microbatch, rank p holds rows [p N/P, (p+1) N/P)): the norms run on the local
 * rows, their outputs are all-gathered before the column-parallel projections,
 * and the partial sums of the row-parallel ones are reduce-scattered back
 * (parallel/tp.h, over ctx.tp). The loss is computed on vocabulary-sharded logits.
 * Every collective of a backward runs in the I pass; W passes read what I and the
 * forward kept (the gathered norm outputs, the gathered output gradients) and
 * communicate nothing. Norm-weight gradients are partial sums over the group
 * (tp_replicated): the owner of the gradients sums them.
 *
 * Backward is split as the zero-bubble schedules need it: per block and for
 * the head, backward_input ("I": every input-gradient GEMM plus attention,
 * norm and activation backward) and backward_weight ("W": weight-gradient GEMMs
 * and norm-weight reductions). I then W equals the one-pass backward bit for
 * bit. Parameter gradients accumulate (+=), so microbatches accumulate
 * naturally. I reads the unit's parameters; so does W (it recomputes the norm
 * outputs with the norm weights); only W writes gradients.
 *
 * Context parallel (cp_size > 1): the model runs on this rank's rows of each sequence
 * (its chunks: activations are created with the local length t = T / cp), with RoPE at
 * the rows' global positions and attention over the whole sequence (parallel/cp.h);
 * every other op is per token. Attention's collectives run in the forward and the I
 * pass, none in W.
 *
 * Activations for one microbatch live in a llama3_acts owned by the caller, so
 * several microbatches can be in flight. Each block has a save policy: a mask
 * of the activations it keeps for backward (LLAMA3_KEEP_*). What it does not
 * keep goes to the stage's shared workspace (llama3_workspace) in the forward
 * and is recomputed at the start of the block's I pass into a recompute slot
 * of the workspace, which the W pass releases. A microbatch therefore costs
 * only what its blocks keep; the workspace is paid once per stage.
 */
#ifndef TETRA_LLAMA3_MODEL_H
#define TETRA_LLAMA3_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "models/linear.h"
#include "models/llama3/llama3_args.h"
#include "parallel/comm.h"

/* What this rank's model holds. */
typedef struct {
    int layer_start, layer_end; /* global blocks [layer_start, layer_end) */
    int has_embedding;          /* tok_embeddings (the first stage) */
    int has_head;               /* norm + output and the loss (the last stage) */
    int tp_rank, tp_size;       /* tensor parallel: this rank's part of every projection */
    int cp_rank, cp_size;       /* context parallel: this rank's chunks of every sequence */
} llama3_layout;

/* Every block, the embedding and the head, tp 1: the single-rank model. */
llama3_layout llama3_layout_full(const llama3_args *a);

typedef enum { LLAMA3_UNIT_EMBEDDING = 0, LLAMA3_UNIT_BLOCK, LLAMA3_UNIT_HEAD } llama3_unit_kind;

typedef struct {
    char name[96];                      /* TorchTitan FQN, e.g. "layers.3.attention.wq.weight" */
    int unit;                           /* local unit index */
    int ndim;                           /* 1 or 2 */
    int64_t shape[2];                   /* global shape (row-major) */
    int64_t box_start[2], box_shape[2]; /* the block of the global tensor this rank holds */
    size_t numel;                       /* elements held (of the box) */
    int tp_replicated;                  /* every tensor-parallel rank holds all of it (the norms): its gradient
                           is a partial sum over the tensor-parallel group */
    size_t offset;                      /* elements from the start of the rank's flat layout */
    /* init: all ones (norm weights), or a truncated normal N(0, init_std) cut to
     * [init_lo, init_hi] (absolute bounds; +-inf for a plain normal) */
    int init_ones;
    double init_std, init_lo, init_hi;
} llama3_param;

typedef struct {
    llama3_unit_kind kind;
    int layer;     /* global block index (blocks), -1 otherwise */
    size_t offset; /* first element in the flat layout */
    size_t numel;
    int first_param, n_params;
    char name[32]; /* "tok_embeddings", "layers.3", "norm+output" */
} llama3_unit;

/* ---- linear layers (models/linear.h) ----
 * y[N, out] = x[N, in] W[out, in]^T. The default implementation runs the gemm op in
 * the compute dtype with fp32 weight gradients; a converter installs another. */
typedef struct llama3_model llama3_model;

const model_linear_impl *llama3_linear_default(void);

/* The process groups a layout computes over (NULL: degree 1, nothing to talk to). */
typedef struct {
    comm_group *tp;
    comm_group *cp;
} llama3_ctx;

struct llama3_model {
    llama3_args args;
    const tetra_ops *ops;
    int max_seq_len;
    llama3_layout layout;
    llama3_ctx ctx;

    int n_params;
    llama3_param *params;     /* [n_params], in unit order */
    model_linear *linears;    /* [n_params]: linears[i] describes params[i] when is_linear[i]
                                 (the projections; not the embedding or the norms) */
    unsigned char *is_linear; /* [n_params] */
    /* [n_params] 1: the gradient holds no value this step (llama3_grads_fresh), so its first
     * write overwrites instead of adding; 0 (the default): writes accumulate */
    unsigned char *grad_fresh;
    int n_units;
    llama3_unit *units;  /* [n_units] */
    size_t *unit_offset; /* [n_units] element offset of each unit (= units[u].offset) */
    size_t *unit_numel;  /* [n_units] */
    size_t total_numel;  /* elements of this rank's layout */

    /* Where each unit's parameters (compute dtype) and fp32 gradients are now; NULL
     * while not available. Filled by the owner of the storage. */
    void **unit_params; /* [n_units] */
    float **unit_grads; /* [n_units] */

    float *rope_table; /* [max_seq_len, head_dim/2, 2] backend memory */

    /* Mixed precision (TorchTitan's mixed_precision_param = bfloat16): the forward and
     * backward read bf16 compute copies of the parameters and keep bf16 activations;
     * gradients stay fp32 and the fp32 parameters are the optimizer's master weights. */
    tetra_dtype compute_dtype; /* TETRA_F32 (default) or TETRA_BF16 */

    /* Tensor parallel without loss parallel (parallelism.disable_loss_parallel): the logits
     * are gathered over the group and every rank computes the whole cross-entropy. Set
     * before creating activations. */
    int tp_gather_logits;
    /* Async tensor parallel (parallelism.enable_async_tensor_parallel): every all-gather and
     * reduce-scatter moves one rank's block of rows at a time, overlapped with the GEMMs on
     * the blocks already there (parallel/tp.h); the same numbers as the synchronous path. */
    int tp_async;
    /* Context parallel (cp_size > 1, over ctx.cp; parallel/cp.h): a microbatch's t rows per
     * sequence are this rank's chunks of sequences of t * cp_size tokens (load-balanced
     * "headtail" chunks unless cp_balanced is 0), RoPE uses their global positions and
     * attention sees the whole sequence through the ring (cp_ring) or an all-gather of
     * K/V. Set before creating workspaces and activations. */
    int cp_ring;
    int cp_balanced;

    /* Own storage (llama3_model_init): the whole layout's fp32 parameters, gradients
     * and, under mixed precision, the bf16 compute copy. NULL with external storage. */
    int own_storage;
    float *param_mem;     /* [total_numel] */
    float *grad_mem;      /* [total_numel] */
    uint16_t *param_bf16; /* [total_numel] (BF16 only) */
};

typedef struct llama3_acts llama3_acts;
typedef struct llama3_workspace llama3_workspace;

/* The single-rank model with its own storage: params and grads allocated and bound,
 * plus the RoPE table. */
int llama3_model_init(llama3_model *m, const llama3_args *a, int max_seq_len, const tetra_ops *ops, char *err,
                      size_t errlen);
/* Storage of a model built for a layout. */
typedef enum {
    LLAMA3_STORAGE_EXTERNAL = 0, /* unit_params / unit_grads are the caller's (FSDP) */
    LLAMA3_STORAGE_OWN,          /* the layout's buffers, allocated and bound (as llama3_model_init) */
    LLAMA3_STORAGE_NONE          /* a declaration only (planning): no backend memory, nothing may run */
} llama3_storage;
int llama3_model_init_layout(llama3_model *m, const llama3_args *a, const llama3_layout *layout, llama3_storage storage,
                             int max_seq_len, const tetra_ops *ops, char *err, size_t errlen);
void llama3_model_free(llama3_model *m);

/* Choose the compute precision (before creating activations). With own storage,
 * TETRA_BF16 allocates the bf16 compute copy and fills it from param_mem. */
int llama3_model_set_compute_dtype(llama3_model *m, tetra_dtype t, char *err, size_t errlen);
/* Own storage: param_bf16 = bf16(param_mem) (round to nearest even) after the fp32
 * parameters were written outside an optimizer step; a no-op in fp32. */
void llama3_sync_compute_params(llama3_model *m);

/* Own storage: TorchTitan's init drawn from a counter-based RNG keyed by (seed,
 * parameter name, global element index): any sharding computes the same values. */
void llama3_init_weights(llama3_model *m, uint64_t seed);

/* Elements [start, start + count) of one parameter's GLOBAL row-major init, into
 * host memory: what a shard owner calls to initialise only its own range. */
void llama3_init_param_range(const llama3_param *p, uint64_t seed, size_t start, size_t count, float *host_out);

const llama3_param *llama3_find_param(const llama3_model *m, const char *name);
/* Own storage: zero every gradient. */
void llama3_zero_grads(llama3_model *m);
/* Every gradient holds no value for the step about to run (its buffer was not zeroed):
 * the first write of each this step overwrites it (the linears' weight gradients with
 * beta 0, the norms' as a sum, the embedding's after zeroing its rows), later ones add. */
void llama3_grads_fresh(llama3_model *m);

/* Local units: the block's unit, the embedding's, the head's; -1 when not held. */
int llama3_block_unit(const llama3_model *m, int layer);
int llama3_embedding_unit(const llama3_model *m);
int llama3_head_unit(const llama3_model *m);

/* ---- activations ---- */

/* What a block keeps for backward: one bit per activation (the op that makes it).
 * A block keeps the residual stream (its input and output) always. */
enum {
    LLAMA3_KEEP_XN1 = 1u << 0, /* attention_norm output and its rstd */
    LLAMA3_KEEP_Q = 1u << 1,   /* xn1 Wq^T after RoPE */
    LLAMA3_KEEP_K = 1u << 2,   /* xn1 Wk^T after RoPE */
    LLAMA3_KEEP_V = 1u << 3,   /* xn1 Wv^T */
    LLAMA3_KEEP_ATT = 1u << 4, /* attention output and its log-sum-exp */
    LLAMA3_KEEP_H = 1u << 5,   /* residual after attention */
    LLAMA3_KEEP_XN2 = 1u << 6, /* ffn_norm output and its rstd */
    LLAMA3_KEEP_A = 1u << 7,   /* xn2 W1^T */
    LLAMA3_KEEP_G = 1u << 8,   /* xn2 W3^T */
    LLAMA3_KEEP_S = 1u << 9,   /* silu(a) * g */
    LLAMA3_KEEP_ALL = (1u << 10) - 1u,
    LLAMA3_KEEP_NONE = 0u /* only the block's input: the backward recomputes the block */
};

/* The stage's shared scratch for microbatches of up to max_b x max_t: the per-pass
 * scratch (GEMM outputs, attention workspace); with forward_scratch, room for one
 * block's unkept activations in the forward (needed as soon as a block keeps less
 * than everything); and `recompute_slots` blocks recomputed between their I and W
 * passes (1 when every W follows its I; more when a schedule defers W passes).
 * forward_scratch = LLAMA3_FWD_SCRATCH_SHARED lays the forward scratch over the first
 * recompute slot: for callers whose every backward is a full one (I then W of each
 * block, no forward in between), which never hold a slot while a forward runs. */
#define LLAMA3_FWD_SCRATCH_SHARED 2
llama3_workspace *llama3_workspace_create(const llama3_model *m, int max_b, int max_t, int forward_scratch,
                                          int recompute_slots, char *err, size_t errlen);
void llama3_workspace_free(const llama3_model *m, llama3_workspace *ws);
size_t llama3_workspace_bytes(const llama3_model *m, int max_b, int max_t, int forward_scratch, int recompute_slots);

/* Activation checkpointing as TorchTitan configures it: the keep mask of each local
 * block for mode "none" (keep everything), "full" (keep only the block's input),
 * "selective" with option "N" (blocks whose 1-based global index is a multiple of N
 * keep only their input) or "op" (keep the attention output and every other matmul
 * output in forward order, wq/wk/wv counted as the one GEMM they run as: q, k, v, w1,
 * w2; recompute the norms, wo, w3 and SwiGLU).
 * 0, or -1 with the key and value named. */
int llama3_ac_policy(const llama3_model *m, const char *mode, const char *option, unsigned *keep /*[blocks]*/,
                     char *err, size_t errlen);
/* The forward work a block's backward repeats to rebuild what `keep` dropped, per row
 * of a sequence on one of tp_size tensor-parallel ranks: linear FLOPs (2 per
 * multiply-add; wq, wk, wv, wo, w1, w3 as their outputs are missing) and whether the
 * attention itself runs again (*attention = 1). Norms, RoPE and SwiGLU cost bandwidth,
 * not FLOPs, and are not counted. */
double llama3_recompute_linear_flops(const llama3_args *a, unsigned keep, int tp_size, int *attention);

/* q, k and v live in one buffer (wq, wk and wv run as one GEMM, and the I pass leaves
 * their output gradients there as one matrix): a block keeps the three or none. keep
 * with any of them gets all three (the activations below take their masks through this). */
unsigned llama3_keep_qkv(unsigned keep);

/* Activations of one microbatch of b sequences of t tokens on workspace ws (b t <= its
 * max_b max_t); keep[i] is the mask of local block i (NULL: keep everything; each mask
 * through llama3_keep_qkv). */
llama3_acts *llama3_acts_create_ws(const llama3_model *m, llama3_workspace *ws, const unsigned *keep, int b, int t,
                                   char *err, size_t errlen);
/* The documents of the microbatch these activations are about to run (block_causal
 * attention, positions reset at document boundaries; see models/llama3/documents.h):
 * doc [b, t * cp_size] host memory, the document id of every global position of each
 * sequence, nondecreasing along it (every context-parallel rank passes whole sequences).
 * Kept with the activations, so the backward and any recomputation see the same mask.
 * Until called, each sequence is one document. A no-op when the model needs no document
 * ids; 0, or -1 with err when the ids are not nondecreasing. */
int llama3_acts_set_documents(const llama3_model *m, llama3_acts *a, const int32_t *doc, char *err, size_t errlen);

/* The same with a private workspace, every activation kept (tests, tools). */
llama3_acts *llama3_acts_create(const llama3_model *m, int b, int t, char *err, size_t errlen);
void llama3_acts_free(const llama3_model *m, llama3_acts *a);
/* Bytes one llama3_acts of this size and policy holds (NULL keep: everything),
 * without the workspace. */
size_t llama3_acts_bytes_policy(const llama3_model *m, const unsigned *keep, int b, int t);
/* Bytes of llama3_acts_create(m, b, t): everything kept, plus its private workspace. */
size_t llama3_acts_bytes(const llama3_model *m, int b, int t);

/* Bytes this rank sends in the sequence-parallel all-gathers and reduce-scatters of one
 * microbatch's forward and backward (recomputation included); 0 at tp 1. */
double llama3_tp_traffic_bytes(const llama3_model *m, const unsigned *keep, int b, int t);

/* Keep a copy of the logits before the fused cross-entropy overwrites them with
 * dlogits (tests; costs one more [b*t, V] buffer). Returns 0, or -1 when out of memory. */
int llama3_acts_keep_logits(const llama3_model *m, llama3_acts *a, int keep);

/* Forward of the whole layout over inputs/targets [b, t] (host memory) (targets may
 * hold OPS_IGNORE_INDEX). Needs the embedding and the head. Returns the SUM of token
 * losses; *n_valid gets the count of valid targets. The fused cross-entropy also
 * leaves dlogits = dloss_scale * dL/dlogits in the activations, so pass
 * dloss_scale = 1 / (global valid tokens). With targets == NULL the forward stops at
 * the logits (no loss, no backward) and returns 0. */
double llama3_forward(llama3_model *m, llama3_acts *a, const int32_t *inputs, const int32_t *targets, float dloss_scale,
                      int64_t *n_valid);
/* The pieces, per unit (residual r_0 is the embedding output, block l maps r_l to
 * r_{l+1}, the head reads r_L; l is the global block index). inputs and targets (host
 * memory) are copied to the device without a host wait (copy_h2d_async), which leaves the
 * caller free to change them once the call returns. */
void llama3_forward_embedding(llama3_model *m, llama3_acts *a, const int32_t *inputs);
void llama3_block_forward(llama3_model *m, llama3_acts *a, int layer);
double llama3_forward_head(llama3_model *m, llama3_acts *a, const int32_t *targets, float dloss_scale,
                           int64_t *n_valid);
/* The same, leaving the loss sum in backend memory (*loss_sum, one float) instead of
 * reading it: no host wait, so a step can read all its microbatches' losses at once. */
void llama3_forward_head_to(llama3_model *m, llama3_acts *a, const int32_t *targets, float dloss_scale,
                            int64_t *n_valid, float *loss_sum);
/* Residual r_l and its gradient dL/dr_l (backend memory, compute dtype, [b*t/P, dim]:
 * this rank's rows under tensor parallel), l in [layer_start, layer_end]: what
 * pipeline stages send and receive. */
void *llama3_acts_residual(llama3_acts *a, int l);
void *llama3_acts_residual_grad(llama3_acts *a, int l);

/* The logits of the last forward ([b*t, V] fp32, backend memory): the kept copy
 * (llama3_acts_keep_logits), or the logits buffer itself after a forward without
 * targets in fp32 or under tensor parallel; NULL otherwise (the buffer then holds
 * dlogits; in bf16 at tp 1 the logits are bf16 and only a kept copy widens them). */
const float *llama3_logits(const llama3_acts *a);

/* Full backward of the last forward (embedding and head needed); accumulates into
 * the gradients. */
void llama3_backward(llama3_model *m, llama3_acts *a);

/* The pieces, for schedules that run them apart. I of block l reads dL/dr_{l+1}
 * (from the head's I or I of block l+1) and writes dL/dr_l; W of block l may run any
 * time after I of block l and before this llama3_acts' next forward (I leaves what W
 * needs in the activations or a recompute slot). The head's I reads the dlogits of
 * its forward and writes dL/dr_L; its W needs only what its forward and I left. The
 * one-pass llama3_backward runs the head's I and W, then I and W per block from the
 * last, then the embedding (a W pass: it has no input gradient). */
void llama3_backward_head_input(llama3_model *m, llama3_acts *a);
void llama3_backward_head_weight(llama3_model *m, llama3_acts *a);
void llama3_backward_head(llama3_model *m, llama3_acts *a); /* I then W */
void llama3_block_backward_input(llama3_model *m, llama3_acts *a, int layer);
void llama3_block_backward_weight(llama3_model *m, llama3_acts *a, int layer);
/* The embedding's backward is all W (it has no input gradient): under tensor parallel it
 * first gathers dL/dr_0 of every token over the group. */
void llama3_backward_embedding(llama3_model *m, llama3_acts *a);

#endif
