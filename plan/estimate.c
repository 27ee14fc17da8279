/* estimate.c — the memory and time model of `tetra plan` (see estimate.h). */
#include "plan/estimate.h"
#include "plan/internal.h"
#include "plan/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "telemetry/log.h"
#include "models/llama3/family.h"
#include "parallel/cp.h"
#include "parallel/mesh.h"
#include "parallel/pp/generate.h"
#include "parallel/pp/schedule.h"
#include "parallel/pp/sim.h"

/* Ranks a group over mesh dims [outer..MESH_TP] spans, innermost first: tp, cp,
 * dp_shard, dp_replicate, pp. A group lies in one node when that span fits in it. */
static int group_span(const cfg_parallel_dims *d, int outer_dim) {
    const int size[MESH_NDIMS] = {d->pp, d->dp_replicate, d->dp_shard, d->cp, d->tp};
    int span = 1;
    for (int k = outer_dim; k < MESH_NDIMS; k++) span *= size[k];
    return span;
}

typedef struct {
    double f, i, w;  /* one microbatch through the stage: forward, backward-input, backward-weight */
    double attn;     /* of which attention (forward + backward + recompute) */
    double hw_flops; /* FLOPs computed, recompute included */
} stage_time;

/* A unit's phase ph over `rows` rows of one microbatch, its per-step part spread over the
 * step's microbatches, divided among the tensor-parallel ranks. */
static double unit_phase(const plan_unit_time *u, int ph, double rows, double tp, double mb_per_step) {
    return (u->per_row[ph] * rows + u->per_step[ph] / mb_per_step) / tp;
}

/* A GPU profile's stage times from the trainer's recorded ops (plan/ops.h): every op but
 * attention from the op sequence, attention (t_attn forward, t_rattn recomputed) from the
 * keys a row sees. Recompute reruns the forward's ops in the share of its GEMM FLOPs the
 * AC policy repeats. */
static void op_times_stage(stage_time *st, const plan_op_times *ot, const trainer_plan *p, int k, double rows,
                           double tp, double mb_per_step, double t_attn, double t_rattn) {
    const double nb = p->stage_blocks[k];
    double ph[PLAN_PHASES];
    for (int x = 0; x < PLAN_PHASES; x++) {
        ph[x] = nb * unit_phase(&ot->block, x, rows, tp, mb_per_step);
        if (p->stage_head[k]) ph[x] += unit_phase(&ot->head, x, rows, tp, mb_per_step);
        if (p->stage_embedding[k]) ph[x] += unit_phase(&ot->embedding, x, rows, 1.0, mb_per_step);
    }
    const double share = ot->block_gemm_flops_fwd_row > 0
        ? p->stage_recompute_flops[k] / (ot->block_gemm_flops_fwd_row / tp)
        : 0.0; /* blocks' worth of forward the backward repeats */
    const double t_recompute = share * ot->block.per_row[PLAN_FWD] * rows / tp + t_rattn;
    st->f = ph[PLAN_FWD] + t_attn;
    st->i = ph[PLAN_BWD_I] + 2.5 * t_attn + t_recompute;
    st->w = ph[PLAN_BWD_W];
}

/* The roofline of one microbatch on one stage of rank plan p (index k of its stages). */
/* keys: the keys a query row sees on average (T/2 causal; fewer under a document mask) */
static stage_time stage_cost(const trainer_plan *p, int k, const llama3_args *a, double keys,
                             const cfg_parallel_dims *d, const plan_hw *hw, int float8, const plan_op_times *ot,
                             double mb_per_step) {
    stage_time st = {0, 0, 0, 0, 0};
    const double tp = d->tp, dim = a->dim, kv = (double)a->n_kv_heads * llama3_head_dim(a);
    const double ffn = (double)llama3_ffn_hidden(a), V = a->vocab_size;
    const double rows = (double)p->local_batch * p->rows; /* this rank's rows of one microbatch */
    const double es = p->mixed ? 2.0 : 4.0;
    const double peak16 = p->mixed ? hw->peak_bf16_flops : hw->peak_fp32_flops;
    const double lin_rate = peak16 * hw->gemm_efficiency;
    const double lin8_rate = float8 && hw->peak_fp8_flops > 0 ? hw->peak_fp8_flops * hw->fp8_gemm_efficiency : lin_rate;
    const double attn_rate = peak16 * hw->attention_efficiency;
    const double mem_rate = hw->memory_bandwidth * hw->memory_efficiency;
    const int nb = p->stage_blocks[k];

    /* per row, forward */
    const double lin_block = 2.0 * (2.0 * dim * dim + 2.0 * dim * kv + 3.0 * dim * ffn) / tp;
    const double attn_block = 4.0 * keys * dim / tp; /* Q K^T and P V over the keys a row sees */
    const double elem_block = es * (12.0 * dim + 3.0 * ffn) / tp;
    const double head = p->stage_head[k] ? 2.0 * dim * V / tp : 0.0;
    const double loss_bytes = p->stage_head[k] ? 3.0 * 4.0 * V / tp : 0.0;

    const double t_attn = rows * nb * attn_block / attn_rate;
    const double t_rattn = rows * p->stage_recompute_attention[k] * attn_block / attn_rate; /* recomputed */
    st.attn = 3.5 * t_attn + t_rattn;
    if (ot) {
        op_times_stage(&st, ot, p, k, rows, tp, mb_per_step, t_attn, t_rattn);
    } else {
        const double t_lin = rows * nb * lin_block / lin8_rate + rows * head / lin_rate;
        const double t_elem = rows * (nb * elem_block + loss_bytes) / mem_rate;
        const double t_recompute = rows * p->stage_recompute_flops[k] / lin8_rate + t_rattn +
            (p->stage_recompute_attention[k] > 0 || p->stage_recompute_flops[k] > 0 ? rows * nb * elem_block / mem_rate
                                                                                    : 0.0);
        st.f = t_lin + t_attn + t_elem;
        /* flash attention's backward recomputes the scores: 2.5 x its forward */
        st.i = t_lin + 2.5 * t_attn + 2.0 * t_elem + t_recompute;
        st.w = t_lin;
    }
    st.hw_flops = rows *
        (3.0 * (nb * lin_block + head) + 3.5 * nb * attn_block + p->stage_recompute_flops[k] +
         p->stage_recompute_attention[k] * attn_block);
    return st;
}

/* Each pipeline rank's dry run of the trainer, in this process: its memory plan, and the worst one. */
static int dry_run_ranks(plan_result *out, const tetra_config *cfg, const mesh *m, int ngpu, char *err, size_t errlen) {
    const cfg_parallel_dims *d = &out->job.dims;
    for (int pr = 0; pr < d->pp; pr++) {
        int co[MESH_NDIMS] = {pr, 0, 0, 0, 0};
        const int rank = mesh_rank(m, co);
        trainer_options o;
        memset(&o, 0, sizeof o);
        o.dry_run = 1;
        o.virtual_world = 1;
        o.plan_out = &out->rank[pr];
        trainer *t = NULL;
        char why[2048];
        log_capture(why, sizeof why);
        const int rc = trainer_setup(&t, cfg, &out->job, rank, ngpu, &o);
        log_capture(NULL, 0);
        if (rc != 0) {
            snprintf(err, errlen, "rank %d of %d (pipeline rank %d): %s", rank, ngpu, pr,
                     why[0] ? why : "the trainer cannot lay it out");
            return -1;
        }
        if (out->rank[pr].total_bytes > out->rank[out->worst_pp_rank].total_bytes) out->worst_pp_rank = pr;
    }
    return 0;
}

/* ---- memory: each pipeline rank's dry run, in this process ---- */
static int estimate_memory(plan_result *out, const tetra_config *cfg, int ngpu, const plan_hw *hw, char *err,
                           size_t errlen) {
    const tetra_config_values *c = &cfg->v;
    const cfg_parallel_dims *d = &out->job.dims;
    mesh m;
    if (mesh_init(&m, ngpu, d->pp, d->dp_replicate, d->dp_shard, d->cp, d->tp, err, errlen)) return -1;
    if (dry_run_ranks(out, cfg, &m, ngpu, err, errlen)) return -1;
    out->reserved_bytes = hw->reserved_bytes;
    /* a CPU profile's memory is the host's, shared by the ranks placed on it */
    const int host_shared = plan_hw_is_host(hw);
    /* NCCL on the device: the trainer's collectives on the CPU are MPI's */
    if (!host_shared && strcmp(c->training.device, "cpu") != 0) {
        const cp_rotate rot = out->job.cp_rotate;
        int co[MESH_NDIMS] = {out->worst_pp_rank, 0, 0, 0, 0};
        plan_nccl_estimate(&out->nccl, &m, mesh_rank(&m, co), out->gpus_per_node, hw->nvswitch,
                           rot == CP_ROTATE_ALLTOALL);
    }
    out->peak_bytes = out->rank[out->worst_pp_rank].total_bytes + hw->reserved_bytes + out->nccl.total_bytes;
    const int on_node = ngpu < out->gpus_per_node ? ngpu : out->gpus_per_node;
    out->device_bytes = host_shared ? hw->memory_bytes / on_node : hw->memory_bytes;
    out->fits = out->peak_bytes <= out->device_bytes;
    return 0;
}

/* What the time model's phases share. */
typedef struct est {
    plan_result *out;
    const tetra_config_values *c;
    const cfg_parallel_dims *d;
    const plan_hw *hw;
    int host_shared; /* a CPU profile: the ranks share the host */
    llama3_args a;
    int T;                       /* sequence length */
    double keys;                 /* keys a query row sees: T/2 causal, fewer under a document mask */
    int rounds, n_mb;            /* gradient-accumulation rounds (pipeline), microbatches per round */
    double fmx, imax, wmax;      /* the slowest stage's forward, backward-input, backward-weight */
    double attn_total;           /* the busiest rank's attention time of a step */
    double es;                   /* bytes of an activation element */
    double intra, inter;         /* effective link bandwidths within and between nodes */
    const trainer_plan *p0, *pw; /* pipeline rank 0's plan, the worst rank's */
    const plan_op_times *ot;     /* a GPU profile's op costs (NULL: a CPU profile's formulas) */
    int sharded;                 /* FSDP: weights gathered per use, so ot's per-step parts recur each microbatch */
} est;

/* Whether a group over mesh dims [outer..MESH_TP] spans nodes, and the bandwidth it gets. */
static int crosses_nodes(const est *E, int outer) { return group_span(E->d, outer) > E->out->gpus_per_node; }
static double link_rate(const est *E, int outer) { return crosses_nodes(E, outer) ? E->inter : E->intra; }

/* ---- compute: the busiest pipeline rank's roofline time of a step ---- */
static void estimate_compute(est *E) {
    plan_result *out = E->out;
    double fmx = 0, imax = 0, wmax = 0;
    for (int pr = 0; pr < E->d->pp; pr++) {
        const trainer_plan *p = &out->rank[pr];
        double busy = 0, fl = 0, at = 0;
        for (int k = 0; k < p->n_local && k < TRAINER_PLAN_MAX_STAGES; k++) {
            stage_time st = stage_cost(p, k, &E->a, E->keys, E->d, E->hw, out->float8, E->ot,
                                       E->sharded ? 1.0 : (double)E->n_mb * E->rounds);
            if (st.f > fmx) fmx = st.f;
            if (st.i > imax) imax = st.i;
            if (st.w > wmax) wmax = st.w;
            busy += st.f + st.i + st.w;
            fl += st.hw_flops;
            at += st.attn;
        }
        busy *= (double)E->n_mb * E->rounds;
        if (busy > out->compute_s) {
            out->compute_s = busy;
            out->hw_flops_per_rank = fl * E->n_mb * E->rounds;
            E->attn_total = at * E->n_mb * E->rounds;
        }
    }
    E->fmx = fmx;
    E->imax = imax;
    E->wmax = wmax;
}

/* A new entry of out->comm for a group over mesh dims [outer..MESH_TP]. */
static plan_comm *add_comm(est *E, const char *name, int group_size, int outer) {
    plan_comm *q = &E->out->comm[E->out->n_comm++];
    q->name = name;
    q->group_size = group_size;
    q->inter_node = crosses_nodes(E, outer);
    return q;
}

/* ---- pipeline: the schedule simulated with the slowest stage's times ---- */
static int estimate_pipeline(est *E, char *err, size_t errlen) {
    const tetra_config_values *c = E->c;
    const cfg_parallel_dims *d = E->d;
    const trainer_plan *p0 = E->p0, *pw = E->pw;
    plan_result *out = E->out;
    const double msg = (double)p0->local_batch * p0->rows * E->a.dim / d->tp * E->es;
    const double tcomm = msg / link_rate(E, MESH_PP);
    pp_schedule *s = NULL;
    char why[1024] = "";
    const char *csv = c->parallelism.pipeline_parallel_schedule_csv;
    if (csv && csv[0]) {
        snprintf(err, errlen,
                 "parallelism.pipeline_parallel_schedule_csv is not modelled; plan the "
                 "named schedule it follows instead");
        return -1;
    }
    s = pp_schedule_generate(E->out->job.pp_schedule, d->pp, p0->n_stages / d->pp, E->n_mb, why, sizeof why);
    if (!s) {
        snprintf(err, errlen, "pipeline schedule %s: %s", c->parallelism.pipeline_parallel_schedule, why);
        return -1;
    }
    pp_sim_times tm = {E->fmx, E->imax, E->wmax, tcomm};
    pp_sim_result *r = pp_sim_run(s, &tm, why, sizeof why);
    pp_schedule_free(s);
    if (!r) {
        snprintf(err, errlen, "simulating the pipeline schedule: %s", why);
        return -1;
    }
    out->pp_makespan_s = r->makespan * E->rounds;
    out->bubble_fraction = r->bubble_fraction;
    pp_sim_free(r);
    plan_comm *q = add_comm(E, "pp", d->pp, MESH_PP);
    q->bytes = pw->pp_bytes;
    q->time_s = pw->pp_bytes / link_rate(E, MESH_PP);
    q->exposed_s = 0; /* inside the simulated makespan (tcomm per dependency) */
    return 0;
}

/* Context parallel's K/V traffic and what of it attention does not hide. */
static double cp_comm(est *E) {
    const cfg_parallel_dims *d = E->d;
    const trainer_plan *pw = E->pw;
    plan_comm *q = add_comm(E, "cp", d->cp, MESH_CP);
    const double kv = (double)E->a.n_kv_heads * llama3_head_dim(&E->a);
    int recompute_attn = 0;
    for (int k = 0; k < pw->n_local; k++) recompute_attn += pw->stage_recompute_attention[k];
    /* K and V gathered in forward, gathered again and dK, dV reduce-scattered in
     * backward, gathered once more where the attention is recomputed */
    const double per_block = (double)pw->local_batch * pw->rows * 2.0 * kv / d->tp * E->es * (d->cp - 1);
    q->bytes = (double)E->n_mb * E->rounds * per_block * (3.0 * pw->n_blocks + recompute_attn);
    q->time_s = q->bytes / link_rate(E, MESH_CP);
    q->exposed_s = E->host_shared ? q->time_s : fmax(0.0, q->time_s - E->attn_total);
    return q->exposed_s;
}

/* ---- collectives: each group's traffic and its exposed time (returned in total) ---- */
static double estimate_collectives(est *E) {
    const cfg_parallel_dims *d = E->d;
    const trainer_plan *pw = E->pw;
    double exposed = 0;
    if (d->dp_shard * d->cp > 1) {
        plan_comm *q = add_comm(E, "fsdp", d->dp_shard * d->cp, MESH_DP_SHARD);
        q->bytes = pw->fsdp_all_gather + pw->fsdp_reduce_scatter;
        q->time_s = q->bytes / link_rate(E, MESH_DP_SHARD);
        const double units = pw->n_blocks + 1;
        q->exposed_s = E->host_shared
            ? q->time_s
            : fmax(0.0, q->time_s - E->out->compute_s) + q->time_s / units / ((double)E->n_mb * E->rounds);
        exposed += q->exposed_s;
    }
    if (d->dp_replicate > 1) {
        plan_comm *q = add_comm(E, "replicate", d->dp_replicate, MESH_DP_REPLICATE);
        q->bytes = pw->replicate_all_reduce;
        q->time_s = q->bytes / link_rate(E, MESH_DP_REPLICATE);
        q->exposed_s = q->time_s;
        exposed += q->exposed_s;
    }
    if (d->tp > 1) {
        plan_comm *q = add_comm(E, "tp", d->tp, MESH_TP);
        q->bytes = pw->tp_bytes;
        q->time_s = q->bytes / link_rate(E, MESH_TP);
        q->exposed_s = E->c->parallelism.enable_async_tensor_parallel && !E->host_shared ? 0.5 * q->time_s : q->time_s;
        exposed += q->exposed_s;
    }
    if (d->cp > 1) exposed += cp_comm(E);
    return exposed;
}

int plan_estimate(plan_result *out, const tetra_config *cfg, int ngpu, int gpus_per_node, const plan_hw *hw, char *err,
                  size_t errlen) {
    memset(out, 0, sizeof *out);
    const tetra_config_values *c = &cfg->v;
    if (job_resolve(cfg, ngpu, &out->job, err, errlen) || plan_check_llama(&out->job, err, errlen)) return -1;
    const cfg_parallel_dims *d = &out->job.dims;
    if (d->pp > PLAN_MAX_PP) {
        snprintf(err, errlen, "pipeline_parallel_degree %d: at most %d", d->pp, PLAN_MAX_PP);
        return -1;
    }
    out->ngpu = ngpu;
    out->gpus_per_node = gpus_per_node > 0 ? gpus_per_node : hw->gpus_per_node;
    if (out->gpus_per_node < 1) out->gpus_per_node = 1;
    out->float8 = out->job.float8;
    if (estimate_memory(out, cfg, ngpu, hw, err, errlen)) return -1;

    /* ---- compute ---- */
    est E = {.out = out, .c = c, .d = d, .hw = hw, .host_shared = plan_hw_is_host(hw)};
    E.a = *llama3_args_of(&out->job.model);
    E.T = (int)c->training.seq_len;
    out->model_flops_per_token = llama3_flops_per_token(&E.a, E.T);
    plan_attention_pairs(out, c, E.T);
    /* causal keeps its T/2 keys a row; a document mask its expected pairs over T */
    E.keys = out->block_causal ? out->attn_pairs_per_seq / E.T : E.T / 2.0;
    out->tokens_per_step = (double)d->global_batch_size * E.T;
    E.p0 = &out->rank[0];
    E.rounds = d->pp > 1 ? E.p0->accum : 1;
    E.n_mb = E.p0->n_microbatches;
    plan_op_times ot;
    E.sharded = d->dp_shard * d->cp > 1;
    if (!E.host_shared) {
        char why[2048];
        if (plan_op_times_record(cfg, hw, E.sharded, &ot, why, sizeof why)) {
            snprintf(err, errlen, "recording the step's ops for %s: %s", hw->name, why);
            return -1;
        }
        E.ot = &ot;
    }
    estimate_compute(&E);
    E.es = E.p0->mixed ? 2.0 : 4.0;
    E.intra = hw->intra_node_bandwidth * hw->comm_efficiency;
    E.inter = hw->inter_node_bandwidth * hw->inter_node_comm_efficiency;
    E.pw = &out->rank[out->worst_pp_rank];

    double pp_time = out->compute_s;
    if (d->pp > 1) {
        if (estimate_pipeline(&E, err, errlen)) return -1;
        pp_time = out->pp_makespan_s;
    }
    const double exposed = estimate_collectives(&E);
    /* AdamW reads parameter, gradient, m, v and writes parameter, m, v (+ the bf16 copy) */
    const double shard_params = E.pw->grad_bytes / 4.0;
    out->optimizer_s =
        shard_params * (7.0 * 4.0 + (E.p0->mixed ? 2.0 : 0.0)) / (hw->memory_bandwidth * hw->memory_efficiency);
    out->step_time_s = pp_time + exposed + out->optimizer_s;
    out->tokens_per_s_per_gpu = out->tokens_per_step / out->step_time_s / ngpu;
    out->mfu = out->model_flops_per_token * out->tokens_per_s_per_gpu / hw->peak_bf16_flops;
    out->mfu_computed = llama3_flops_per_token_pairs(&E.a, out->attn_pairs_per_seq, E.T) * out->tokens_per_s_per_gpu /
        hw->peak_bf16_flops;
    return 0;
}
