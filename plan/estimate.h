/* estimate.h — what a training config costs at a given rank count, before it runs.
 *
 * Memory comes from the trainer itself: each pipeline rank's dry run is laid out in
 * this process (a planned world, no MPI), so every buffer the run would allocate at
 * start-up is counted as the run counts it — parameters, gradients, optimizer state,
 * gathered FSDP units, activations for the schedule's in-flight microbatches under the
 * AC policy, workspace, converter state — plus the hardware profile's reserved bytes
 * (runtime, libraries, allocator slack) and, on a GPU profile, NCCL's own device memory
 * (nccl.h, a model). The peak is the largest rank.
 *
 * Time is a roofline with stated overlap assumptions (docs/plan.md):
 *   - a GPU profile: every op but attention from the trainer's recorded op sequence
 *     (plan/ops.h: one block, the head and the embedding, per row and per step), each op
 *     at max(FLOPs / its unit's achieved rate, bytes / achieved bandwidth); a CPU
 *     profile: linear layers at peak x gemm_efficiency, norms/activations/loss at
 *     memory_bandwidth x memory_efficiency, backward = 2 x forward;
 *   - causal attention (half the score matrix) at the bf16 peak x attention_efficiency,
 *     backward 2.5 x forward; recompute as the AC policy drops;
 *   - pipeline: the schedule's simulator with the slowest stage's F, I and W times
 *     and one activation transfer per cross-rank dependency;
 *   - FSDP all-gather / reduce-scatter overlap with compute; only what exceeds
 *     the compute, plus the first gather and the last reduce-scatter, is exposed;
 *   - tensor parallel collectives are exposed; async TP hides half of them (TorchTitan
 *     measured 4-16 % faster steps with it, not the whole transfer time);
 *   - context parallel K/V exchange overlaps the attention; the excess is exposed;
 *   - the replicate all-reduce and the optimizer update are exposed;
 *   - on a CPU profile (host memory shared by the ranks of a node) nothing overlaps:
 *     the cores that compute also move the bytes.
 * Collectives use intra_node_bandwidth when the group fits in one node of
 * gpus_per_node ranks (the mesh puts tp innermost, then cp, dp_shard, dp_replicate,
 * pp) and inter_node_bandwidth otherwise, each times its efficiency.
 */
#ifndef TETRA_PLAN_ESTIMATE_H
#define TETRA_PLAN_ESTIMATE_H

#include "config/config.h"
#include "plan/hw.h"
#include "plan/nccl.h"
#include "engine/job.h"
#include "engine/trainer.h"

#define PLAN_MAX_PP 64

typedef struct {
    const char *name; /* "fsdp", "replicate", "tp", "pp", "cp" */
    int group_size;
    int inter_node;   /* the group spans nodes */
    double bytes;     /* sent per rank per step */
    double time_s;    /* at the link's effective bandwidth */
    double exposed_s; /* not hidden behind compute */
} plan_comm;

typedef struct {
    tetra_job job; /* the config resolved at this rank count */
    int ngpu, gpus_per_node;
    /* memory, per rank (the largest pipeline rank) */
    trainer_plan rank[PLAN_MAX_PP]; /* one per pipeline rank */
    int worst_pp_rank;
    plan_nccl nccl; /* NCCL's own device memory (a GPU profile with more than one rank), in the peak */
    double reserved_bytes, peak_bytes, device_bytes;
    int fits;
    /* per step */
    double tokens_per_step;       /* global */
    double model_flops_per_token; /* TorchTitan's formula */
    double hw_flops_per_rank;     /* what the slowest rank computes, recompute included */
    double compute_s;             /* the slowest rank's compute, no bubble */
    double bubble_fraction, pp_makespan_s;
    double optimizer_s;
    plan_comm comm[5];
    int n_comm;
    double step_time_s, tokens_per_s_per_gpu, mfu;
    int float8; /* linears in fp8 */
    /* attention as planned: the mask, the visible (query, key) pairs of a sequence (causal
     * T(T+1)/2; block_causal: expected from the corpus's recorded document lengths,
     * data/doclen.h) and where they come from; the MFU counting those pairs */
    int block_causal;
    double attn_pairs_per_seq;
    char attn_source[512];
    double mfu_computed;
} plan_result;

/* The attention fields of out (block_causal, attn_pairs_per_seq, attn_source) for c at
 * sequence length T (plan/attention.c). */
void plan_attention_pairs(plan_result *out, const tetra_config_values *c, int T);

/* Estimate cfg (already parsed; validated here for ngpu ranks) on hw with gpus_per_node
 * ranks per node (<= 0: the profile's). 0, or -1 with err (a config that cannot run at
 * this rank count, with the trainer's own message). */
int plan_estimate(plan_result *out, const tetra_config *cfg, int ngpu, int gpus_per_node, const plan_hw *hw, char *err,
                  size_t errlen);

#endif
