/* float8.h — Float8 training: linear layers whose GEMMs take e4m3/e5m2 operands with
 * dynamic scaling (torchao's Float8Linear recipes), installed on a model's linear
 * descriptors (models/linear.h): any model that runs its projections through them.
 *
 * Scaling (parallelism reference §5): amax = max |x|, scale = fp8_max / max(amax, 1e-12)
 * (double, stored fp32), q = rne(clamp(x * scale)), the GEMM gets 1/scale per operand.
 *
 *   recipe              output = x W^T            grad_input = dy W         grad_weight = dy^T x
 *   tensorwise          x e4m3 . W e4m3,          dy e5m2 . W e4m3          dy e5m2 . x e4m3
 *                       fast accumulation         (one scale per tensor)
 *   rowwise             every operand e4m3 with one power-of-2 scale per row of the
 *                       non-contracted dimension (x per token, W per output channel for
 *                       the output; dy per token, W per input channel for grad_input; dy
 *                       per output channel, x per input channel for grad_weight)
 *   rowwise_with_gw_hp  output as rowwise; grad_input dy per token . W tensorwise (both
 *                       e4m3, power-of-2); grad_weight in the compute dtype
 *
 * A tensor's scale is the scale of the whole tensor as an unsplit run sees it: under
 * tensor parallel the amax of a split operand or weight is all-reduced (MAX) over the
 * group, and blocks of rows use the statistics of the whole operand (begin_rows). So a
 * layout with tensor parallel computes the same numbers as one rank with the same
 * microbatch. Data-parallel ranks scale their own microbatches (as torchao).
 *
 * GEMMs: the backend's gemm op with fp8 operands (cuBLASLt FP8 on sm_89+; the CPU
 * widens fp8 exactly and accumulates in fp32), or with `emulate` the operands are
 * dequantised to fp32 (q / scale) and multiplied in fp32 on any backend.
 *
 * Weight scales are computed once per optimizer step and cached until the next step:
 * tensorwise, from the amaxes AdamW writes as it updates the shards (float8_optimizer_amax;
 * one amax all-reduce per group for every weight); otherwise at first use, or all at once
 * after the step from the sharded weights with precompute_scales. A weight's amax is the
 * same number either way (a maximum, of the same compute copy).
 *
 * Tensorwise passes (the cost table of docs/float8.md): every fp8 operand reaches the GEMM
 * K-major from one fp8_quantize pass (scale from a device amax, codes, and the transpose
 * where the GEMM wants it), so the GEMM never packs. Weights that FSDP does not shard are
 * quantised once per step into W and W^T codes kept for the step; under FSDP at each use.
 * A linear whose input is its predecessor's (model_linear.input_from: wk, wv after wq)
 * reuses that cast; the weight gradient reuses the amax the input gradient took of the
 * same dy; amaxes a producer writes as it writes the operand (model_linear_impl.amax_slot)
 * replace the amax pass; the weight gradient accumulates in its GEMM (beta 1).
 */
#ifndef TETRA_FLOAT8_FLOAT8_H
#define TETRA_FLOAT8_FLOAT8_H

#include <stddef.h>

#include "kernels/ops.h"
#include "models/linear.h"
#include "parallel/comm.h"
#include "parallel/fsdp.h"

typedef enum { FLOAT8_TENSORWISE = 0, FLOAT8_ROWWISE, FLOAT8_ROWWISE_GW_HP } float8_recipe;

typedef struct {
    float8_recipe recipe;
    int emulate;             /* dequantise and multiply in fp32 instead of the fp8 GEMM */
    int precompute_scales;   /* weight amaxes from the shards after each step (tensorwise) */
    int fsdp_fp8_all_gather; /* FSDP gathers the weights as e4m3 (tensorwise; implies precompute_scales) */
    int weights_per_use;     /* the weights are gathered and freed around each use: quantise at each */
    /* a recording standing for a rank of the float8 all-gather: each converted weight is
     * taken as arriving in its codes (W as it is, W^T one transpose_u8), as the gather
     * leaves it; never set in training, where the gather marks what it delivered */
    int codes_per_use;
    int n_filter;
    const char *const *filter; /* [n_filter] linears whose name contains one stay high precision */
} float8_config;

/* "tensorwise" | "rowwise" | "rowwise_with_gw_hp": 0, or -1 */
int float8_parse_recipe(const char *s, float8_recipe *out);
const char *float8_recipe_name(float8_recipe r);

/* Would float8 convert the linear with this name (the module name, e.g.
 * "layers.0.attention.wq") and global sizes? Dims must divide by 16 and no filter
 * entry may be a substring of the name. */
int float8_wants(const float8_config *c, const char *name, long in_features, long out_features);

typedef struct float8_model float8_model;

/* Install the fp8 linear on every one of lins[0..n_lins) that float8_wants (each keeps
 * the pointer to the returned state in its impl_state), computing on ops in
 * compute_dtype. max_rows: the most rows a linear's forward sees (tokens of a
 * microbatch); shard/tp: the groups the weights are split over (NULL: none). dry_run:
 * count, allocate nothing. */
float8_model *float8_convert(model_linear *const *lins, int n_lins, const tetra_ops *ops, tetra_dtype compute_dtype,
                             const float8_config *c, size_t max_rows, comm_group *shard, comm_group *tp, int dry_run,
                             char *err, size_t errlen);
/* Linears converted; backend bytes of the float8 workspace and caches. */
int float8_converted(const float8_model *f);
size_t float8_workspace_bytes(const float8_model *f);
/* With fsdp_fp8_all_gather: FSDP gathers the converted weights through float8's gather
 * codec (fsdp_enable_coded_gather: e4m3 codes with the precomputed scales), once FSDP
 * wraps the model. 0, or -1 with err. */
int float8_attach_fsdp(float8_model *f, fsdp *fs, char *err, size_t errlen);
/* Tensorwise: the stretches of fs's shard holding the converted weights, for the AdamW
 * about to update fs on the device (ops.h adamw_step_amax) to write their amaxes; NULL when
 * that does not apply (another recipe, CPU offload, a dry run). The next
 * float8_params_updated takes them instead of a pass over each weight. */
const ops_amax_segments *float8_optimizer_amax(float8_model *f, fsdp *fs);
/* The parameters changed (initialised, loaded, or after the optimizer step): the cached
 * weight scales are stale. With AdamW's amaxes, or with precompute_scales, they are
 * computed here (from fs's shards, collective over shard and tp) before the next gather
 * reads them; otherwise each at its weight's first use. */
void float8_params_updated(float8_model *f, fsdp *fs);
void float8_free(float8_model *f);

#endif
