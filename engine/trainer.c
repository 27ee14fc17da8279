/* trainer.c — the training job: setup, the step loop, teardown (see trainer.h).
 * One optimizer step is train_step.c; checkpoint state is train_ckpt.c. */
#include "engine/trainer.h"

#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/mixture.h"
#include "data/shard.h"
#include "telemetry/log.h"
#include "telemetry/memsnap.h"
#include "telemetry/metrics.h"
#include "engine/run_guard.h"
#include "engine/trainer_internal.h"
#include "kernels/cuda_plugin.h"
#include "models/llama3/documents.h"
#include "models/llama3/hf.h"
#include "models/llama3/parallelize.h"
#include "parallel/cp.h"
#include "parallel/pp/generate.h"
#include "parallel/tp.h"
#include "util/host.h"

/* OpenBLAS' own thread control; declared here to keep to the generic cblas.h. */
void openblas_set_num_threads(int num_threads);

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Ranks on this host, so CPU threads are split between them. */
static int local_ranks(void) { return host_node_ranks(); }

/* This rank's index among the ranks of its host. */
static int node_local_rank(void) { return host_node_rank(); }

/* comm.backend: NCCL where each rank of a node has a GPU of its own (NCCL refuses two
 * ranks of a communicator on one device), MPI otherwise; MPI on device buffers goes
 * through page-locked host copies made by the ops backend. The answer is the same on
 * every rank (the host's GPU count and ranks per host are). */
static int choose_comm_backend(trainer *t, int world, comm_options *copt) {
    const tetra_ops *ops = t->ops;
    const char *want = t->c->comm.backend;
    const int device = !t->opt.dry_run && !ops->host_memory;
    copt->backend = COMM_BACKEND_MPI;
    if (!device) {
        if (!strcmp(want, "nccl") && !t->opt.dry_run) {
            log_error("comm.backend = \"nccl\" moves GPU buffers, but this run computes on the %s", ops->name);
            return -1;
        }
        return 0; /* a dry run communicates nothing on the device */
    }
    copt->compute_stream = ops->compute_stream();
    const int nccl = comm_backend_available(COMM_BACKEND_NCCL);
    const int gpus = comm_nccl_device_count(), per_node = local_ranks();
    if (!strcmp(want, "nccl") || (!strcmp(want, "auto") && world > 1 && nccl && per_node <= gpus)) {
        if (!nccl) {
            log_error("comm.backend = \"nccl\": this build has no NCCL backend (build with libnccl, see "
                      "docs/parallelism.md), or lib/libtetra_cuda.so does not load");
            return -1;
        }
        copt->backend = COMM_BACKEND_NCCL;
        return 0;
    }
    t->comm_staging.host_alloc = ops->host_alloc;
    t->comm_staging.host_release = ops->host_release;
    t->comm_staging.to_host = ops->copy_d2h;
    t->comm_staging.to_device = ops->copy_h2d;
    t->comm_staging.device_copy = ops->copy;
    copt->staging = &t->comm_staging;
    t->comm_staged = 1;
    if (world > 1 && t->rank == 0 && !strcmp(want, "auto"))
        log_info("comm: %d ranks per host share %d GPU%s, and NCCL needs one per rank: collectives go through MPI, "
                 "staged in page-locked host memory (slow; for tests; comm.backend = \"mpi\" says so explicitly)",
                 per_node, gpus, gpus == 1 ? "" : "s");
    return 0;
}

/* Achievable FLOP/s of this backend in the compute dtype: the best of a few square GEMMs,
 * the denominator of MFU when metrics.peak_flops is not given. On the CPU, fp32 at 1024^3
 * (bf16 operands are widened to fp32 there, so fp32 is its peak). On a GPU, bf16 operands
 * when the model computes in bf16, at 8192^3: a 1024^3 GEMM is over in microseconds on an
 * H100, launch-bound, and would understate the peak several-fold (MFU above 100 %). */
static double measure_peak_flops(const tetra_ops *ops, int bf16, const char **what) {
    const int cpu = !strcmp(ops->name, "cpu");
    const int n = cpu ? 1024 : 8192;
    const tetra_dtype dt = bf16 && !cpu ? TETRA_BF16 : TETRA_F32;
    const size_t elem = dt == TETRA_BF16 ? 2 : 4, count = (size_t)n * n;
    *what = dt == TETRA_BF16 ? "measured bf16 GEMM, 8192^3"
        : cpu                ? "measured fp32 GEMM, 1024^3"
                             : "measured fp32 GEMM, 8192^3";
    float *a = ops->alloc(count * elem), *b = ops->alloc(count * elem), *c = ops->alloc(count * elem);
    if (!a || !b || !c) {
        ops->release(a);
        ops->release(b);
        ops->release(c);
        return 0.0;
    }
    /* fill writes fp32 words: over bf16 storage that is pairs of (0, 0.5) - as good for timing */
    ops->fill(a, 0.5f, count * elem / 4);
    ops->fill(b, 0.25f, count * elem / 4);
    ops_gemm_desc g = {0};
    g.a_type = g.b_type = g.c_type = dt;
    g.m = g.n = g.k = n;
    g.lda = g.ldb = g.ldc = n;
    g.alpha = 1.0f;
    g.beta = 0.0f;
    double best = 1e30;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = now_s();
        ops->gemm(c, a, b, &g);
        ops->synchronize();
        double dt_s = now_s() - t0;
        if (rep > 0 && dt_s < best) best = dt_s; /* the first call warms caches, threads and heuristics */
    }
    ops->release(a);
    ops->release(b);
    ops->release(c);
    return 2.0 * n * (double)n * n / best;
}

static void fmt_bytes(char *buf, size_t n, double bytes) {
    if (bytes >= 1024.0 * 1024 * 1024) snprintf(buf, n, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    else snprintf(buf, n, "%.1f MiB", bytes / (1024.0 * 1024));
}

/* Was section.key given in the TOML file or on the command line (not a default)? */
static int key_is_set(const tetra_config *cfg, const char *section, const char *key) {
    const cfg_key_desc *d = cfg_find_key(section, key);
    return d && cfg->origin && cfg->origin[d - cfg_keys].kind != CFG_FROM_DEFAULT;
}

/* ----------------------------------------------------------------------------
 * initial weights: every rank fills only its shard, from the counter-based init
 * or from a Hugging Face checkpoint read piece by piece */

typedef struct {
    const llama3_model *m;
    uint64_t seed;
} init_ctx;

static int init_fill(void *user, int param, size_t start, size_t count, float *host_out) {
    const init_ctx *c = user;
    llama3_init_param_range(&c->m->params[param], c->seed, start, count, host_out);
    return 0;
}

typedef struct {
    const llama3_model *m;
    llama3_hf_reader *rd;
    char err[2048];
} hf_ctx;

static int hf_fill(void *user, int param, size_t start, size_t count, float *host_out) {
    hf_ctx *c = user;
    return llama3_hf_read(c->rd, c->m->params[param].name, start, count, host_out, c->err, sizeof c->err);
}

/* ----------------------------------------------------------------------------
 * what this run is, and its memory per rank */

/* Validation runs forward only: its activations keep nothing beyond the residual
 * stream and the head, on a workspace of its own shape. */
static unsigned *keep_none(const train_stage *s) {
    const int nb = s->model.layout.layer_end - s->model.layout.layer_start;
    unsigned *k = calloc((size_t)(nb > 0 ? nb : 1), sizeof *k); /* LLAMA3_KEEP_NONE is 0 */
    return k;
}

static size_t validation_bytes(const trainer *t, const train_stage *s) {
    unsigned *none = keep_none(s);
    size_t b = none ? llama3_acts_bytes_policy(&s->model, none, t->vshape.batch, t->vshape.rows) +
            llama3_workspace_bytes(&s->model, t->vshape.batch, t->vshape.rows, 1, 0)
                    : 0;
    free(none);
    return b;
}

/* "layers 0-3 + embedding" */
static void describe_stage(const train_stage *s, char *buf, size_t n) {
    const llama3_layout *L = &s->model.layout;
    if (L->layer_end > L->layer_start)
        snprintf(buf, n, "stage %d: blocks %d-%d%s%s", s->index, L->layer_start, L->layer_end - 1,
                 L->has_embedding ? " + embedding" : "", L->has_head ? " + norm/output" : "");
    else
        snprintf(buf, n, "stage %d: no blocks%s%s", s->index, L->has_embedding ? ", embedding" : "",
                 L->has_head ? ", norm/output" : "");
}

/* One gradient of a stage's input, as the pipeline sends it back: [B, Tl / tp, dim]. */
static size_t send_bytes(const trainer *t, const train_stage *s) {
    return t->shape.tokens / (size_t)s->model.layout.tp_size * (size_t)s->model.args.dim *
        tetra_dtype_size(s->model.compute_dtype);
}

/* What this rank's dry run lays out (trainer.h). */
static void fill_plan(const trainer *t, trainer_plan *p) {
    const tetra_config_values *c = t->c;
    memset(p, 0, sizeof *p);
    for (int i = 0; i < t->n_local; i++) {
        const train_stage *s = &t->st[i];
        fsdp_memory m = fsdp_memory_report(s->fs);
        if (c->training.enable_cpu_offload) { /* the master and the moments live on the host */
            p->param_bytes += (double)m.compute_bytes;
            p->host_bytes += (double)(m.host_bytes + m.optim_bytes);
            p->offload = 1;
        } else {
            p->param_bytes += (double)(m.param_bytes + m.compute_bytes);
            p->optim_bytes += (double)m.optim_bytes;
        }
        p->grad_bytes += (double)m.grad_bytes;
        p->work_param_bytes += (double)m.work_param_bytes;
        if (s->grad_arena < 0) p->work_grad_bytes += (double)m.work_grad_bytes;
        else p->grad_arena_stages++;
        p->reduce_bytes += (double)m.reduce_bytes;
        p->resident_units += m.resident_units;
        const size_t a1 = llama3_acts_bytes_policy(&s->model, s->keep, t->shape.batch, t->shape.rows);
        /* the rank's one workspace, counted with the stage that lays it out */
        const size_t w = s->ws_owner
            ? llama3_workspace_bytes(&s->model, t->shape.batch, t->shape.rows, s->fwd_scratch, s->recompute_slots)
            : 0;
        p->act_bytes += (double)((size_t)s->n_acts * a1 + w + (size_t)s->n_send * send_bytes(t, s));
        p->act_mb_bytes += (double)a1;
        p->workspace_bytes += (double)w;
        p->act_mb_full_bytes += (double)llama3_acts_bytes_policy(&s->model, NULL, t->shape.batch, t->shape.rows);
        p->n_acts += s->n_acts;
        p->n_dropping += s->n_dropping;
        const llama3_layout *L = &s->model.layout;
        p->n_blocks += L->layer_end - L->layer_start;
        if (s->ws_owner) p->recompute_slots = s->recompute_slots;
        if (c->validation.enable && (t->vshape.batch != t->shape.batch || t->vshape.rows != t->shape.rows))
            p->validation_bytes += (double)validation_bytes(t, s);
        for (int q = 0; q < t->n_conv; q++)
            if (t->conv[q]->backend_bytes && s->conv_state[q])
                p->converter_bytes += (double)t->conv[q]->backend_bytes(s->conv_state[q]);
        if (i < TRAINER_PLAN_MAX_STAGES) {
            p->stage[i] = s->index;
            p->stage_blocks[i] = L->layer_end - L->layer_start;
            p->stage_embedding[i] = L->has_embedding;
            p->stage_head[i] = L->has_head;
            for (int k = 0; k < L->layer_end - L->layer_start; k++) {
                int att = 0;
                p->stage_recompute_flops[i] +=
                    llama3_recompute_linear_flops(&s->model.args, s->keep[k], L->tp_size, &att);
                p->stage_recompute_attention[i] += att;
            }
        }
    }
    if (t->grad_arena_off) p->work_grad_bytes += (double)t->grad_arena_off[t->n_grad_arenas];
    p->grad_arenas = t->n_grad_arenas;
    p->act_bytes += p->validation_bytes;
    p->total_bytes = p->param_bytes + p->grad_bytes + p->optim_bytes + p->work_param_bytes + p->work_grad_bytes +
        p->reduce_bytes + p->act_bytes + p->converter_bytes;
    /* what this rank sends per step, by parallelism */
    const train_stage *s0 = &t->st[0];
    const int mbs = t->shape.n_mb * (t->pp_size > 1 ? t->shape.accum : 1);
    for (int i = 0; i < t->n_local; i++) {
        fsdp_traffic x = fsdp_step_traffic(t->st[i].fs, mbs);
        p->fsdp_all_gather += x.all_gather;
        p->fsdp_reduce_scatter += x.reduce_scatter;
        p->replicate_all_reduce += x.all_reduce;
        p->tp_bytes +=
            (double)mbs * llama3_tp_traffic_bytes(&t->st[i].model, t->st[i].keep, t->shape.batch, t->shape.rows);
    }
    if (t->pp_size > 1) {
        const double msg = (double)t->shape.tokens / s0->model.layout.tp_size * s0->model.args.dim *
            (double)tetra_dtype_size(s0->model.compute_dtype);
        for (int i = 0; i < t->n_local; i++)
            p->pp_bytes += (double)mbs * msg * (t->st[i].remote_next + t->st[i].remote_prev);
    }
    p->pp_rank = t->pp_rank;
    p->n_local = t->n_local;
    p->n_stages = t->n_stages;
    p->n_microbatches = t->shape.n_mb;
    p->accum = t->shape.accum;
    p->local_batch = t->shape.batch;
    p->rows = t->shape.rows;
    p->mixed = t->mixed;
    p->n_params = t->n_params;
    p->flops_per_token = t->flops_per_token;
}

/* profiling.enable_memory_snapshot: <dump>/<folder>/iteration_<step>[_exit]/rank<r>_memory_snapshot.json */
static void write_memory_snapshot(const trainer *t, int64_t step, const char *reason, int at_exit) {
    const tetra_config_values *c = t->c;
    if (!c->profiling.enable_memory_snapshot || t->opt.dry_run) return;
    trainer_plan p;
    fill_plan(t, &p);
    char dir[8400], err[512];
    const char *f = c->profiling.save_memory_snapshot_folder;
    if (f[0] == '/') snprintf(dir, sizeof dir, "%s/iteration_%lld%s", f, (long long)step, at_exit ? "_exit" : "");
    else
        snprintf(dir, sizeof dir, "%s/%s/iteration_%lld%s", c->job.dump_folder, f, (long long)step,
                 at_exit ? "_exit" : "");
    /* the plan's categories, as fill_plan adds them up to total_bytes */
    const double acts = p.act_bytes - p.workspace_bytes - p.validation_bytes;
    const memsnap_category cat[] = {
        {"parameters", p.param_bytes,
         p.mixed ? "this rank's fp32 shard of the parameters and its bf16 copy"
                 : "this rank's fp32 shard of the parameters"},
        {"gradients", p.grad_bytes, "this rank's shard of the gradients (fp32)"},
        {"optimizer_state", p.optim_bytes, "AdamW's two moments for this rank's shard (fp32)"},
        {"gathered_parameters", p.work_param_bytes, "whole units' parameters gathered for compute (FSDP working set)"},
        {"unsharded_gradients", p.work_grad_bytes, "whole units' gradients before the reduce-scatter"},
        {"reduce_staging", p.reduce_bytes, "reduce-scatter and all-reduce staging"},
        {"activations", acts,
         "activations kept for backward, every microbatch alive at once, and pipeline send buffers"},
        {"workspace", p.workspace_bytes, "recompute slots and per-op scratch shared by the blocks"},
        {"validation", p.validation_bytes, "validation activations (when its batch shape differs)"},
        {"converters", p.converter_bytes, "model converters' state (Float8 scales, amax history)"},
    };
    const memsnap_plan mp = {cat, (int)(sizeof cat / sizeof cat[0]), p.mixed};
    if (memsnap_write(dir, t->rank, step, reason, &mp, t->ops, err, sizeof err)) log_warn("%s", err);
    else if (t->rank == 0) log_info("memory snapshot (%s): %s/rank<r>_memory_snapshot.json", reason, dir);
}

static void log_plan(trainer *t) {
    const tetra_config_values *c = t->c;
    const train_stage *s0 = &t->st[0];
    const int S = fsdp_shard_degree(s0->fs), R = fsdp_replicate_degree(s0->fs);
    const char *mode = t->world == 1 ? "single rank"
        : S == 1 && R == 1           ? "no data parallel"
        : S == 1                     ? "DDP (replicated)"
        : R == 1                     ? "FSDP (sharded)"
                                     : "HSDP (sharded x replicated)";
    char mdesc[160];
    mesh_describe(&t->msh, mdesc, sizeof mdesc);
    log_info("model %s %s: %.3fM parameters, %.3g FLOPs/token at seq_len %d", c->model.name, c->model.flavor,
             t->n_params / 1e6, t->flops_per_token, t->shape.seq_len);
    if (t->opt.dry_run)
        log_info("dry run: backend %s (planned, nothing allocated), %d threads per rank; %s: %s; gradient "
                 "accumulation %d",
                 t->ops->name, t->threads, mdesc, mode, t->shape.accum);
    else
        log_info("backend %s, %d threads per rank; %s: %s, comm %s; gradient accumulation %d; peak %.1f %s "
                 "per rank (%s)",
                 t->ops->name, t->threads, mdesc, mode,
                 t->comm_staged ? "mpi (device buffers staged through host memory)"
                                : comm_backend_name(comm_world_backend(t->cw)),
                 t->shape.accum, t->peak >= 1e13 ? t->peak / 1e12 : t->peak / 1e9,
                 t->peak >= 1e13 ? "TFLOP/s" : "GFLOP/s", t->peak_src);
    if (t->pp_size > 1) {
        const char *csv = c->parallelism.pipeline_parallel_schedule_csv;
        char stages[512] = "";
        for (int i = 0; i < t->n_local; i++) {
            char d[128];
            describe_stage(&t->st[i], d, sizeof d);
            snprintf(stages + strlen(stages), sizeof stages - strlen(stages), "%s%s", i ? "; " : "", d);
        }
        log_info("pipeline: schedule %s%s%s, %d stages (%d per rank), %d microbatch%s of %d sequence%s per round, "
                 "%d round%s per step; pipeline rank %d runs %s",
                 c->parallelism.pipeline_parallel_schedule, csv && csv[0] ? " from " : "", csv && csv[0] ? csv : "",
                 t->n_stages, t->n_local, t->shape.n_mb, t->shape.n_mb == 1 ? "" : "es", t->shape.batch,
                 t->shape.batch == 1 ? "" : "s", t->shape.accum, t->shape.accum == 1 ? "" : "s", t->pp_rank, stages);
    }
    trainer_plan p;
    fill_plan(t, &p);
    char pb[32], gb[32], ob[32], wpb[32], wgb[80], rb[32], ab[32], a1s[32], wb[32], vbs[32], tot[32];
    fmt_bytes(pb, sizeof pb, p.param_bytes);
    fmt_bytes(gb, sizeof gb, p.grad_bytes);
    fmt_bytes(ob, sizeof ob, p.optim_bytes);
    fmt_bytes(wpb, sizeof wpb, p.work_param_bytes);
    fmt_bytes(wgb, sizeof wgb, p.work_grad_bytes);
    if (p.grad_arena_stages > p.grad_arenas)
        snprintf(wgb + strlen(wgb), sizeof wgb - strlen(wgb), " (%d stages taking turns in %d)", p.grad_arena_stages,
                 p.grad_arenas);
    fmt_bytes(rb, sizeof rb, p.reduce_bytes);
    fmt_bytes(ab, sizeof ab, p.act_bytes);
    fmt_bytes(a1s, sizeof a1s, p.act_mb_bytes);
    fmt_bytes(wb, sizeof wb, p.workspace_bytes);
    fmt_bytes(vbs, sizeof vbs, p.validation_bytes);
    fmt_bytes(tot, sizeof tot, p.total_bytes);
    char cpart[64] = "", cvb[32];
    fmt_bytes(cvb, sizeof cvb, p.converter_bytes);
    if (p.converter_bytes > 0) snprintf(cpart, sizeof cpart, "; model converters %s", cvb);
    const char *prec = t->mixed ? "bf16 compute: parameters include their bf16 copy; fp32 master weights, gradients "
                                  "and optimizer state"
                                : "fp32";
    char who[300], tpw[48] = "", ppw[48] = "";
    if (s0->model.layout.tp_size > 1)
        snprintf(tpw, sizeof tpw, "tp %d of %d, ", s0->model.layout.tp_rank, s0->model.layout.tp_size);
    if (t->pp_size > 1) snprintf(ppw, sizeof ppw, "pp %d of %d, ", t->pp_rank, t->pp_size);
    if (S > 1)
        snprintf(who, sizeof who, "%s%sshard %d of %d, %s", ppw, tpw, comm_group_rank(comm_get(t->cw, MESH_G_FSDP)), S,
                 prec);
    else snprintf(who, sizeof who, "%s%s%s", ppw, tpw, prec);
    char vpart[80] = "", mbpart[96];
    if (p.validation_bytes > 0) snprintf(vpart, sizeof vpart, " + validation %s", vbs);
    if (t->n_local == 1)
        snprintf(mbpart, sizeof mbpart, "%d microbatch%s x %s", p.n_acts, p.n_acts == 1 ? "" : "es", a1s);
    else
        snprintf(mbpart, sizeof mbpart, "%d stage-microbatches, %s per microbatch of all %d stages", p.n_acts, a1s,
                 t->n_local);
    if (S > 1)
        log_info("memory rank %d (%s): persistent: parameters %s, gradients %s, optimizer state %s; working: gathered "
                 "parameters %s (%d resident unit%s + 2 slots%s), unsharded gradients %s, reduce staging %s; "
                 "activations %s (%s + workspace %s%s)%s; total %s",
                 t->rank, who, pb, gb, ob, wpb, p.resident_units, p.resident_units == 1 ? "" : "s",
                 t->n_local > 1 ? " per stage" : "", wgb, rb, ab, mbpart, wb, vpart, cpart, tot);
    else
        log_info("memory rank %d (%s): persistent: parameters %s, gradients %s, optimizer state %s; activations %s "
                 "(%s + workspace %s%s)%s; total %s",
                 t->rank, who, pb, gb, ob, ab, mbpart, wb, vpart, cpart, tot);
    {
        const double mib = 1024.0 * 1024.0;
        if (S > 1 || R > 1 || p.tp_bytes > 0 || p.pp_bytes > 0)
            log_info("communication per step, rank %d sends: fsdp all-gather %.2f MiB, reduce-scatter %.2f MiB, "
                     "replicate all-reduce %.2f MiB; tensor parallel %.2f MiB; pipeline %.2f MiB",
                     t->rank, p.fsdp_all_gather / mib, p.fsdp_reduce_scatter / mib, p.replicate_all_reduce / mib,
                     p.tp_bytes / mib, p.pp_bytes / mib);
    }
    if (p.n_dropping > 0) {
        char full[32];
        fmt_bytes(full, sizeof full, p.act_mb_full_bytes);
        log_info("activation checkpointing: mode %s%s%s: %d of %d blocks recompute in backward; %s per microbatch "
                 "instead of %s, %d recompute slot%s in the workspace",
                 c->activation_checkpoint.mode, strcmp(c->activation_checkpoint.mode, "selective") ? "" : ", option ",
                 strcmp(c->activation_checkpoint.mode, "selective") ? "" : c->activation_checkpoint.selective_ac_option,
                 p.n_dropping, p.n_blocks, a1s, full, p.recompute_slots, p.recompute_slots == 1 ? "" : "s");
    }
    if (p.offload) {
        char hb[32];
        fmt_bytes(hb, sizeof hb, p.host_bytes);
        log_info("cpu offload rank %d: %s of page-locked host memory (fp32 master weights, AdamW moments, one "
                 "unit's staging); the device keeps the %s parameters and the fp32 gradients; AdamW runs on the "
                 "host, unit by unit",
                 t->rank, hb, t->mixed ? "bf16" : "fp32");
    }
    if (S > 1)
        log_info("fsdp: %d units sharded over %s (%d ranks), reshard_after_forward = %s%s", s0->model.n_units,
                 comm_group_name(comm_get(t->cw, MESH_G_FSDP)), S, c->parallelism.fsdp_reshard_after_forward,
                 R > 1 ? ", gradients all-reduced over dp_replicate" : "");
}

/* ----------------------------------------------------------------------------
 * setup and teardown */

static void stage_free(const tetra_ops *ops, train_stage *s) {
    if (s->model_ready)
        for (int i = 0; i < s->n_acts && s->acts; i++) llama3_acts_free(&s->model, s->acts[i]);
    for (int i = 0; i < s->n_send && s->send_buf; i++)
        if (s->send_buf[i]) ops->release(s->send_buf[i]);
    free(s->send_buf);
    free(s->send_mb);
    free(s->acts);
    free(s->acts_mb);
    free(s->acts_state);
    free(s->keep);
    free(s->save_tensors);
    if (s->adam_m && s->adam_on_host) ops->host_release(s->adam_m);
    else if (s->adam_m) ops->release(s->adam_m);
    fsdp_free(s->fs);
    free(s->decl);
    if (s->model_ready) llama3_model_free(&s->model);
}

void trainer_teardown(trainer *t) {
    if (!t) return;
    const tetra_ops *ops = t->ops;
    if (t->ml) metrics_close(t->ml);
    if (ops && ops->memory_freeze) ops->memory_freeze(0);
    ckpt_saver_free(t->saver);
    for (int i = 0; i < t->n_local && t->st; i++) {
        train_stage *s = &t->st[i];
        if (t->vacts_own && t->vacts && t->vacts[i] && s->model_ready) llama3_acts_free(&s->model, t->vacts[i]);
        if (t->vws && t->vws[i] && s->model_ready) llama3_workspace_free(&s->model, t->vws[i]);
    }
    free(t->vacts);
    free(t->vws);
    /* every stage's activations before the workspace they share */
    for (int i = 0; i < t->n_local && t->st; i++) {
        train_stage *st = &t->st[i];
        for (int k = 0; k < st->n_acts && st->acts && st->model_ready; k++) {
            llama3_acts_free(&st->model, st->acts[k]);
            st->acts[k] = NULL;
        }
    }
    for (int i = 0; i < t->n_local && t->st; i++)
        if (t->st[i].ws_owner && t->st[i].model_ready) llama3_workspace_free(&t->st[i].model, t->st[i].ws);
    for (int i = 0; i < t->n_local && t->st; i++) {
        train_stage *st = &t->st[i];
        for (int k = t->n_conv - 1; k >= 0 && st->conv_state; k--)
            if (t->conv[k]->destroy && st->conv_state[k]) t->conv[k]->destroy(st->conv_state[k]);
        free(st->conv_state);
        stage_free(ops, st);
    }
    /* after every FSDP has waited for its reductions */
    if (t->grad_arena_mem) ops->release(t->grad_arena_mem);
    free(t->grad_arena_off);
    free(t->conv);
    trace_free(t->tr);
    free(t->st);
    free(t->groups);
    free(t->save_groups);
    free(t->batch.in);
    free(t->batch.lab);
    free(t->vbatch.in);
    free(t->vbatch.lab);
    free(t->batch.full_in);
    free(t->batch.full_lab);
    free(t->vbatch.full_in);
    free(t->batch.doc);
    free(t->vbatch.doc);
    free(t->vbatch.full_lab);
    if (t->val) dl_close(t->val);
    if (t->train) dl_close(t->train);
    if (t->run_sched != t->sched) pp_schedule_free(t->run_sched);
    pp_schedule_free(t->sched);
    comm_world_free(t->cw);
    free(t);
}

/* Refusals before anything is built: features of later versions, bad values. */
static int check_supported(const tetra_config *cfg, const cfg_parallel_dims *dims, int world) {
    const tetra_config_values *c = &cfg->v;
    if (c->checkpoint.create_seed_checkpoint && world != 1) {
        log_error("checkpoint.create_seed_checkpoint needs a single rank (got %d): run it with NGPU=1; the seed "
                  "checkpoint then loads under any layout",
                  world);
        return 1;
    }
    if (strcmp(c->training.mixed_precision_reduce, "float32") != 0) {
        log_error("training.mixed_precision_reduce = \"%s\": gradients are computed, accumulated and reduced in "
                  "float32 in this version (parameter gradients are fp32 in both precisions); set it to "
                  "\"float32\"",
                  c->training.mixed_precision_reduce);
        return 1;
    }
    return 0;
}

/* The stages of the pipeline this rank runs, in ascending order, with their neighbours. */
static int place_stages(trainer *t, pp_schedule_kind kind, char *err, size_t errlen) {
    int rank_of[LLAMA3_MAX_STAGES];
    t->n_local = 0;
    for (int s = 0; s < t->n_stages; s++) {
        rank_of[s] = t->pp_size == 1 ? 0 : pp_stage_to_rank(kind, t->pp_size, t->n_stages, s);
        t->n_local += rank_of[s] == t->pp_rank;
    }
    t->st = calloc((size_t)t->n_local, sizeof *t->st);
    if (!t->st) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    int k = 0;
    for (int s = 0; s < t->n_stages; s++) {
        if (rank_of[s] != t->pp_rank) continue;
        train_stage *st = &t->st[k];
        st->index = s;
        st->grad_arena = -1;
        st->remote_prev = s > 0 && rank_of[s - 1] != t->pp_rank;
        st->remote_next = s < t->n_stages - 1 && rank_of[s + 1] != t->pp_rank;
        st->local_prev = s > 0 && rank_of[s - 1] == t->pp_rank ? k - 1 : -1;
        st->local_next = s < t->n_stages - 1 && rank_of[s + 1] == t->pp_rank ? k + 1 : -1;
        k++;
    }
    return 0;
}

/* model.converters, looked up once (job_resolve checked the names). */
static int find_converters(trainer *t, char *err, size_t errlen) {
    const tetra_config_values *c = t->c;
    t->n_conv = c->model.converters.n;
    t->conv = calloc((size_t)(t->n_conv > 0 ? t->n_conv : 1), sizeof *t->conv);
    if (!t->conv) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    for (int k = 0; k < t->n_conv; k++)
        if (!(t->conv[k] = converter_find(c->model.converters.items[k]))) {
            snprintf(err, errlen, "model.converters: unknown converter \"%s\"", c->model.converters.items[k]);
            return -1;
        }
    return 0;
}

/* The converters' convert hooks on a declared stage, before FSDP wraps it. */
static int convert_stage(trainer *t, train_stage *st, char *err, size_t errlen) {
    const tetra_config_values *c = t->c;
    st->conv_state = calloc((size_t)(t->n_conv > 0 ? t->n_conv : 1), sizeof *st->conv_state);
    if (!st->conv_state) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    converter_env env;
    memset(&env, 0, sizeof env);
    env.cfg = c;
    env.config_file = t->cfg->file;
    env.ops = t->ops;
    env.rank = t->rank;
    env.stage = st->index;
    env.max_rows = t->shape.tokens;
    if (c->validation.enable && (size_t)t->vshape.batch * (size_t)t->vshape.rows > env.max_rows)
        env.max_rows = (size_t)t->vshape.batch * (size_t)t->vshape.rows;
    env.dry_run = t->opt.dry_run;
    env.shard = comm_get(t->cw, MESH_G_FSDP);
    env.tp = st->model.ctx.tp;
    char why[1024];
    for (int q = 0; q < t->n_conv; q++)
        if (t->conv[q]->convert(&st->conv_state[q], &st->model, &env, why, sizeof why)) {
            snprintf(err, errlen, "model.converters \"%s\" (stage %d): %s", t->conv[q]->name, st->index, why);
            return -1;
        }
    return 0;
}

static void log_param_line(void *user, const char *text) {
    (void)user;
    log_info("%s", text);
}

/* model.print_after_conversion: the stage's parameters and what computes each, from the
 * first rank of every other mesh dimension */
static void print_stage(const trainer *t, const train_stage *st) {
    int coord[MESH_NDIMS];
    mesh_coords(&t->msh, t->rank, coord);
    if (!t->c->model.print_after_conversion || coord[MESH_DP_REPLICATE] || coord[MESH_DP_SHARD] || coord[MESH_CP] ||
        coord[MESH_TP])
        return;
    const llama3_model *m = &st->model;
    log_info("model after conversion, stage %d (blocks %d..%d), %d parameters:", st->index, m->layout.layer_start,
             m->layout.layer_end - 1, m->n_params);
    llama3_describe_params(m, log_param_line, NULL);
}

/* What the model's parallelization reads of the job and of this rank. */
static llama3_parallel_env parallel_env(const trainer *t, int max_t) {
    const tetra_config_values *c = t->c;
    llama3_parallel_env env;
    memset(&env, 0, sizeof env);
    env.ops = t->ops;
    env.msh = &t->msh;
    env.rank = t->rank;
    env.cw = t->cw;
    env.cp_rank = t->cp.rank;
    env.cp_size = t->cp.size;
    env.cp_balanced = t->cp.balanced;
    env.rotate = t->job.cp_rotate;
    env.loss_parallel = !c->parallelism.disable_loss_parallel;
    env.async_tp = c->parallelism.enable_async_tensor_parallel;
    env.bf16 = t->mixed;
    env.max_rows = max_t;
    env.dry_run = t->opt.dry_run;
    env.reshard = t->job.reshard;
    env.offload = (int)c->training.enable_cpu_offload;
    env.host_ops = t->host_ops;
    return env;
}

/* The pipeline: how many stages, which this rank runs, and each one's model for this
 * rank's layout (models/llama3/parallelize.h), converted, under FSDP. Without pipeline
 * parallel: one stage, the whole model. */
static int setup_stages(trainer *t, int max_t, char *err, size_t errlen) {
    const tetra_config_values *c = t->c;
    int coord[MESH_NDIMS];
    mesh_coords(&t->msh, t->rank, coord);
    t->pp_rank = coord[MESH_PP];
    t->pp_size = t->msh.size[MESH_PP];
    const llama3_pp_spec pp = {t->pp_size, t->job.pp_schedule, (int)c->parallelism.pipeline_parallel_layers_per_stage,
                               (int)c->parallelism.pipeline_parallel_first_stage_less_layers,
                               (int)c->parallelism.pipeline_parallel_last_stage_less_layers};
    int start[LLAMA3_MAX_STAGES], end[LLAMA3_MAX_STAGES];
    if (llama3_pipeline_stages(&t->args, &pp, &t->n_stages, start, end, err, errlen)) return -1;
    if (t->pp_size == 1) {
        t->shape.batch = (int)c->training.local_batch_size;
        t->shape.n_mb = t->shape.accum;
    } else {
        t->shape.batch = (int)c->parallelism.pipeline_parallel_microbatch_size;
        t->shape.n_mb = (int)(c->training.local_batch_size / c->parallelism.pipeline_parallel_microbatch_size);
    }
    t->shape.tokens = (size_t)t->shape.batch * (size_t)t->shape.rows;
    if (find_converters(t, err, errlen) || place_stages(t, pp.kind, err, errlen)) return -1;
    const llama3_parallel_env env = parallel_env(t, max_t);
    for (int i = 0; i < t->n_local; i++) {
        train_stage *st = &t->st[i];
        llama3_model *m = &st->model;
        char why[1024];
        if (llama3_parallelize_stage(m, &t->args, st->index, t->n_stages, start[st->index], end[st->index], &env, why,
                                     sizeof why)) {
            snprintf(err, errlen, "model (stage %d): %s", st->index, why);
            if (m->params) st->model_ready = 1;
            return -1;
        }
        st->model_ready = 1;
        if (convert_stage(t, st, err, errlen)) return -1;
        print_stage(t, st);
        st->fs = llama3_fully_shard(m, &env, &st->decl, why, sizeof why);
        if (!st->fs) {
            snprintf(err, errlen, "%s", why);
            return -1;
        }
        for (int q = 0; q < t->n_conv; q++)
            if (t->conv[q]->parallelized && t->conv[q]->parallelized(st->conv_state[q], m, st->fs, why, sizeof why)) {
                snprintf(err, errlen, "model.converters \"%s\" (stage %d): %s", t->conv[q]->name, st->index, why);
                return -1;
            }
    }
    return 0;
}

/* Threads, the op table (device), determinism and the compute precision. */
static int setup_backend(trainer *t) {
    const tetra_config_values *c = t->c;
    char err[2048];
    const int dry = t->opt.dry_run;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (c->training.threads > (cores > 0 ? cores : 1)) {
        log_error("training.threads = %lld: this host has %ld cores; at most %ld threads per rank (0 = cores / "
                  "ranks per host)",
                  (long long)c->training.threads, cores, cores > 0 ? cores : 1);
        return -1;
    }
    t->threads = (int)c->training.threads;
    if (t->threads <= 0) {
        t->threads = t->opt.virtual_world ? 1 : (int)(cores / local_ranks());
        if (t->threads < 1) t->threads = 1;
    }
    omp_set_num_threads(t->threads);
    openblas_set_num_threads(t->threads);
    t->ops = t->opt.ops ? t->opt.ops
        : dry           ? ops_plan(c->training.device, err, sizeof err)
                        : ops_get(c->training.device, err, sizeof err);
    if (!t->ops) {
        log_error("training.device: %s", err);
        return -1;
    }
    if (c->profiling.enable_profiling && !dry) t->ops = trace_ops(t->ops); /* GEMM and attention spans */
    const tetra_ops *ops = t->ops;
    if (!dry && ops->select_device) { /* before the backend's first op: its resources live there */
        if (ops->select_device(node_local_rank(), err, sizeof err)) {
            log_error("training.device: %s", err);
            return -1;
        }
    }
    if (!dry) ops->set_deterministic((int)c->training.deterministic);
    if (c->training.enable_cpu_offload) {
        /* AdamW on the host runs on the CPU backend's table */
        if (ops->host_memory || !strcmp(ops->name, "cpu") || (!dry && !ops->host_alloc)) {
            log_error("training.enable_cpu_offload: backend %s computes in host memory already; offload is for a "
                      "GPU (set it to false)",
                      ops->name);
            return -1;
        }
        t->host_ops = ops_get("cpu", err, sizeof err);
        if (!t->host_ops) {
            log_error("training.enable_cpu_offload: %s", err);
            return -1;
        }
    }

    /* ---- precision ----
     * TorchTitan's default mixed_precision_param = bfloat16 applies on the GPU. The CPU
     * backend computes in fp32 unless the key is set explicitly (bf16 there is for
     * checking the mixed-precision path, not for speed). */
    t->mixed = !strcmp(c->training.mixed_precision_param, "bfloat16") &&
        (strcmp(ops->name, "cpu") != 0 || key_is_set(t->cfg, "training", "mixed_precision_param"));
    return 0;
}

/* The device mesh and its communication groups. */
static int setup_mesh(trainer *t) {
    const tetra_config_values *c = t->c;
    char err[2048];
    const int dry = t->opt.dry_run;
    const cfg_parallel_dims *dims = &t->job.dims;
    if (mesh_init(&t->msh, t->world, dims->pp, dims->dp_replicate, dims->dp_shard, dims->cp, dims->tp, err,
                  sizeof err)) {
        log_error("parallelism: %s", err);
        return -1;
    }
    comm_options copt;
    memset(&copt, 0, sizeof copt);
    if (choose_comm_backend(t, t->world, &copt)) return -1;
    copt.init_timeout_s = (double)c->comm.init_timeout_seconds;
    copt.train_timeout_s = (double)c->comm.train_timeout_seconds;
    copt.cuda_device = -1;
    copt.virtual_world = t->opt.virtual_world;
    char trace_dir[4096];
    if (c->comm.save_traces_folder[0] == '/') snprintf(trace_dir, sizeof trace_dir, "%s", c->comm.save_traces_folder);
    else snprintf(trace_dir, sizeof trace_dir, "%s/%s", c->job.dump_folder, c->comm.save_traces_folder);
    copt.trace_buf_size = dry ? 0 : (int)c->comm.trace_buf_size;
    copt.trace_dir = trace_dir;
    copt.trace_prefix = c->comm.save_traces_file_prefix;
    t->cw = comm_world_create(&t->msh, t->rank, &copt, err, sizeof err);
    if (!t->cw) {
        log_error("%s", err);
        return -1;
    }
    t->g_world = comm_get(t->cw, MESH_G_WORLD);
    t->g_loss = comm_get(t->cw, MESH_G_LOSS);

    t->g_pp = comm_get(t->cw, MESH_G_PP);
    return 0;
}

/* The model and the step's shape on this rank: sequence rows under context parallel. */
static int setup_shape(trainer *t) {
    const tetra_config_values *c = t->c;
    char err[2048];
    const int dry = t->opt.dry_run;
    t->args = t->job.model;
    t->shape.seq_len = (int)c->training.seq_len;
    t->vshape.batch = (int)c->validation.local_batch_size;
    t->vshape.seq_len = (int)c->validation.seq_len;
    {
        int co[MESH_NDIMS];
        mesh_coords(&t->msh, t->rank, co);
        t->cp.rank = co[MESH_CP];
        t->cp.size = t->msh.size[MESH_CP];
        t->cp.balanced = t->job.cp_balanced;
        t->shape.rows = t->shape.seq_len / t->cp.size;
        t->vshape.rows = t->vshape.seq_len / t->cp.size;
    }
    /* the corpus must hold one sequence before anything is sized by seq_len (a seq_len of
     * 1e8 would otherwise allocate for a minute before the loader refuses it) */
    if (!t->opt.external_batches && !dry && c->training.dataset_mix.n == 0) {
        char dir[4096];
        shard_index ix;
        if (!dl_resolve_dataset(c->training.dataset, c->training.dataset_path, dir, sizeof dir, err, sizeof err) &&
            !shard_index_read(dir, &ix, err, sizeof err)) {
            const shard_index_split *sp = shard_index_find(&ix, "train");
            const uint64_t n = sp ? sp->n_tokens : 0;
            shard_index_free(&ix);
            if (sp && n < (uint64_t)t->shape.seq_len + 1) {
                if (t->rank == 0)
                    log_error("training.seq_len %d: the train split of %s holds %llu tokens, fewer than one sequence "
                              "(seq_len + 1 tokens)",
                              t->shape.seq_len, dir, (unsigned long long)n);
                return -1;
            }
        }
    }
    return 0;
}

/* The step's schedule, then what each stage keeps for backward (activation
 * checkpointing), how many microbatches it holds at once, the workspace its stages
 * share and the unsharded gradients' arenas. */
static int plan_stages(trainer *t) {
    const tetra_config_values *c = t->c;
    char err[2048];
    if (train_build_schedule(t, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    {
        int *peak = calloc(3 * (size_t)t->n_local, sizeof *peak), *open_iw = peak ? peak + t->n_local : NULL;
        int *peak_send = peak ? peak + 2 * t->n_local : NULL;
        if (!peak || train_plan_pools(t, peak, open_iw, peak_send, err, sizeof err)) {
            log_error("%s", peak ? err : "out of host memory");
            free(peak);
            return -1;
        }
        /* activation checkpointing: a block holds a recompute slot from its I pass to its W
         * pass: one when every backward is a full one (each unit's I then W), else every
         * dropping block of each microbatch of the stage between its I and its W */
        for (int i = 0; i < t->n_local; i++) {
            train_stage *st = &t->st[i];
            st->n_acts = peak[i];
            st->n_send = st->remote_prev ? peak_send[i] : 0;
            const int nb = st->model.layout.layer_end - st->model.layout.layer_start;
            st->keep = calloc((size_t)(nb > 0 ? nb : 1), sizeof *st->keep);
            if (!st->keep ||
                llama3_ac_policy(&st->model, c->activation_checkpoint.mode,
                                 c->activation_checkpoint.selective_ac_option, st->keep, err, sizeof err)) {
                log_error("%s", st->keep ? err : "out of host memory");
                free(peak);
                return -1;
            }
            for (int k = 0; k < nb; k++) st->n_dropping += st->keep[k] != LLAMA3_KEEP_ALL;
            if (st->n_dropping > 0) st->recompute_slots = open_iw[i] > 0 ? open_iw[i] * st->n_dropping : 1;
            /* without I/W split no forward runs while a block holds its slot: the forward's
             * scratch can be the slot's memory */
            st->fwd_scratch = st->n_dropping == 0 ? 0 : open_iw[i] > 0 ? 1 : LLAMA3_FWD_SCRATCH_SHARED;
        }
        free(peak);
        /* a rank runs one action at a time, so its stages share one workspace: with the
         * slots all of them may hold at once where W passes wait across actions, else the
         * one slot a full backward takes and gives back; laid out by the stage whose
         * layout is the largest (the head's, when it gathers the logits) */
        int split = 0, dropping = 0, slots = 0, owner = 0;
        for (int i = 0; i < t->n_local; i++) {
            split |= t->st[i].fwd_scratch == 1;
            dropping |= t->st[i].n_dropping > 0;
            slots += t->st[i].recompute_slots;
        }
        const int fwd = !dropping ? 0 : split ? 1 : LLAMA3_FWD_SCRATCH_SHARED;
        if (!split) slots = dropping ? 1 : 0;
        size_t largest = 0;
        for (int i = 0; i < t->n_local; i++) {
            const size_t b = llama3_workspace_bytes(&t->st[i].model, t->shape.batch, t->shape.rows, fwd, slots);
            if (b > largest) {
                largest = b;
                owner = i;
            }
        }
        for (int i = 0; i < t->n_local; i++) {
            t->st[i].fwd_scratch = fwd;
            t->st[i].recompute_slots = slots;
            t->st[i].ws_owner = i == owner;
        }
    }
    if (train_plan_grad_arenas(t)) {
        log_error("out of host memory");
        return -1;
    }
    return 0;
}

/* Where the run starts: a checkpoint found (loaded once the optimizer state exists),
 * Hugging Face weights, or weights drawn from the seed. */
typedef struct {
    char path[4096]; /* the checkpoint to load */
    int found, model_only, initial;
} start_point;

static int setup_weights(trainer *t, start_point *sp) {
    const tetra_config_values *c = t->c;
    char err[2048];
    sp->found = train_find_checkpoint(t, sp->path, sizeof sp->path, &sp->model_only, &sp->initial, err, sizeof err);
    if (sp->found < 0) {
        if (t->rank == 0) log_error("%s", err);
        return -1;
    }

    /* Initial weights: each rank draws only its shard (the init is a function of seed,
     * name and element index, so every layout starts from the same model), or reads its
     * pieces of a Hugging Face checkpoint; skipped when a checkpoint's weights replace
     * them below. */
    if (sp->found && !train_ckpt_excluded(c, "model")) {
        /* the checkpoint's weights are loaded once the optimizer state exists */
    } else if (c->checkpoint.initial_load_path && c->checkpoint.initial_load_in_hf &&
               !(c->checkpoint.enable && sp->found)) {
        hf_ctx hc;
        memset(&hc, 0, sizeof hc);
        hc.rd = llama3_hf_open(&t->args, c->checkpoint.initial_load_path, hc.err, sizeof hc.err);
        int bad = !hc.rd;
        for (int i = 0; i < t->n_local && !bad; i++) {
            hc.m = &t->st[i].model;
            bad = fsdp_init_shards(t->st[i].fs, hf_fill, &hc) != 0;
        }
        llama3_hf_close(hc.rd);
        if (ckpt_agree(bad, hc.err, sizeof hc.err)) {
            log_error("checkpoint.initial_load_path: %s", hc.err);
            return -1;
        }
        log_info("loaded Hugging Face weights from %s", c->checkpoint.initial_load_path);
    } else if (!t->opt.skip_weight_init) {
        for (int i = 0; i < t->n_local; i++) {
            init_ctx ic = {&t->st[i].model, (uint64_t)c->training.seed};
            if (fsdp_init_shards(t->st[i].fs, init_fill, &ic)) {
                log_error("out of host memory initialising the weights");
                return -1;
            }
        }
    }
    return 0;
}

/* The training loader: one corpus, or a weighted mixture (docs/data.md, Mixtures). */
static int open_train_data(trainer *t, int dp_rank, int dp) {
    const tetra_config_values *c = t->c;
    char err[2048];
    const cfg_list *mix = &c->training.dataset_mix;
    if (mix->n > 0) { /* a weighted mixture (docs/data.md, Mixtures) */
        dl_config tcfg = {0};
        tcfg.seq_len = t->shape.seq_len;
        tcfg.local_batch_size = (int)c->training.local_batch_size;
        tcfg.dp_rank = dp_rank;
        tcfg.dp_size = dp;
        tcfg.seed = (uint64_t)c->training.seed;
        tcfg.expected_vocab_size = (uint32_t)t->args.vocab_size;
        t->train = dl_open_mix((const char *const *)mix->items, mix->n, "train", &tcfg, err, sizeof err);
        snprintf(t->data_dir, sizeof t->data_dir, "a mixture of %d sources", mix->n);
    } else {
        if (dl_resolve_dataset(c->training.dataset, c->training.dataset_path, t->data_dir, sizeof t->data_dir, err,
                               sizeof err)) {
            log_error("training.dataset: %s", err);
            return -1;
        }
        t->train = dl_open(t->data_dir, "train", t->shape.seq_len, (int)c->training.local_batch_size, dp_rank, dp, 0,
                           (uint64_t)c->training.seed, (uint32_t)t->args.vocab_size, err, sizeof err);
    }
    if (!t->train) {
        log_error("training data: %s", err);
        return -1;
    }
    if (llama3_needs_documents(&t->args) && !dl_has_documents(t->train)) {
        log_error("%s needs each sequence's document boundaries, and the corpus %s marks none (no BOS or EOS "
                  "id in its index.json): prepare it with `tetra data prepare`, which wraps every document in "
                  "BOS ... EOS, or use model.attn_mask_type = \"causal\"",
                  c->model.reset_positions_at_document_boundaries ? "model.reset_positions_at_document_boundaries"
                                                                  : "model.attn_mask_type = \"block_causal\"",
                  t->data_dir);
        return -1;
    }
    return 0;
}

/* The validation loader's shape: one pass over the split, this rank's windows. */
static dl_config val_loader_config(const trainer *t, int dp_rank, int dp) {
    dl_config vc = {0};
    vc.seq_len = t->vshape.seq_len;
    vc.local_batch_size = t->vshape.batch;
    vc.dp_rank = dp_rank;
    vc.dp_size = dp;
    vc.expected_vocab_size = (uint32_t)t->args.vocab_size;
    vc.single_pass = 1;
    return vc;
}

/* Validation on every mixture source's own "val" split, reported apart. */
static int open_val_mix(trainer *t, int dp_rank, int dp) {
    const tetra_config_values *c = t->c;
    char err[2048];
    const cfg_list *mix = &c->training.dataset_mix;
    const dl_config vc = val_loader_config(t, dp_rank, dp);
    t->val = dl_open_mix((const char *const *)mix->items, mix->n, "val", &vc, err, sizeof err);
    if (!t->val) {
        log_error("validation data: %s", err);
        return -1;
    }
    for (int i = 0; i < dl_num_sources(t->val); i++)
        if (dl_is_megatron(dl_source_name(t->val, i))) {
            log_error("validation: mixture source %s is a Megatron dataset, which has no held-out split: set "
                      "validation.dataset_path",
                      dl_source_name(t->val, i));
            return -1;
        }
    return 0;
}

/* Validation on one corpus's "val" split (the training corpus's unless validation.dataset_path). */
static int open_val_corpus(trainer *t, int dp_rank, int dp, char *vdir, size_t vdir_n) {
    const tetra_config_values *c = t->c;
    char err[2048];
    const char *vpath = c->validation.dataset_path ? c->validation.dataset_path : c->training.dataset_path;
    if (dl_resolve_dataset(c->validation.dataset, vpath, vdir, vdir_n, err, sizeof err)) {
        log_error("validation.dataset: %s", err);
        return -1;
    }
    if (!c->validation.dataset_path && dl_is_megatron(vdir)) { /* it would validate on training data */
        log_error("validation: training.dataset_path %s is a Megatron dataset, which has no held-out split: "
                  "set validation.dataset_path to another one",
                  vdir);
        return -1;
    }
    const dl_config vc = val_loader_config(t, dp_rank, dp);
    t->val = dl_open_config(vdir, "val", &vc, err, sizeof err);
    if (!t->val) {
        log_error("validation data: %s", err);
        return -1;
    }
    /* single pass: a split shorter than one validation batch would validate nothing */
    const uint64_t windows = dl_windows_per_epoch(t->val), batch = (uint64_t)t->vshape.batch * (uint64_t)dp;
    if (windows < batch) {
        if (t->rank == 0)
            log_error("validation data: the \"val\" split of %s holds %llu sequences of %d tokens, fewer than "
                      "one validation batch of %llu (validation.local_batch_size %d x %d data-parallel "
                      "ranks): lower validation.local_batch_size or validation.seq_len",
                      vdir, (unsigned long long)windows, t->vshape.seq_len, (unsigned long long)batch, t->vshape.batch,
                      dp);
        return -1;
    }
    return 0;
}

/* The loaders (every rank of the batch group reads its own windows), and the tokenizer
 * the config names agreeing with the corpora's. */
static int open_data(trainer *t) {
    const tetra_config_values *c = t->c;
    char err[2048];
    if (t->opt.external_batches) return 0;
    const int dp_rank = comm_group_rank(comm_get(t->cw, MESH_G_BATCH)), dp = t->job.dims.dp;
    const cfg_list *mix = &c->training.dataset_mix;
    if (open_train_data(t, dp_rank, dp)) return -1;
    const char *corpora[MIX_MAX_SOURCES + 1];
    int n_corpora = dl_num_sources(t->train);
    for (int i = 0; i < n_corpora; i++) corpora[i] = dl_source_name(t->train, i);
    char vdir[4096];
    if (c->validation.enable && mix->n > 0 && !c->validation.dataset_path) {
        if (open_val_mix(t, dp_rank, dp)) return -1;
    } else if (c->validation.enable) {
        if (open_val_corpus(t, dp_rank, dp, vdir, sizeof vdir)) return -1;
        if (mix->n > 0 || strcmp(vdir, t->data_dir) != 0) corpora[n_corpora++] = vdir;
    }
    /* token ids mean what the corpus's tokenizer says: the one the config names must agree.
     * Rank 0 reads the tokenizer (once, not on every rank) and tells the others. */
    int tok_rc = t->rank == 0 ? dl_check_tokenizer(corpora, n_corpora, c->model.hf_assets_path, err, sizeof err) : 0;
    if (t->rank == 0 && tok_rc < 0) log_error("model.hf_assets_path: %s", err);
    if (t->rank == 0 && tok_rc > 0)
        log_warn("model.hf_assets_path: %s; the token shards' tokenizer is not checked against it", err);
    if (comm_all_reduce_f64(t->g_world, tok_rc < 0 ? 1.0 : 0.0, COMM_MAX) > 0) return -1;
    return 0;
}

/* The host batches: this rank's rows, whole sequences under context parallel, document ids. */
static int alloc_batches(trainer *t) {
    const tetra_config_values *c = t->c;
    const size_t step_tok = (size_t)t->shape.accum * (size_t)c->training.local_batch_size * (size_t)t->shape.rows;
    t->batch.in = malloc(sizeof(int32_t) * step_tok);
    t->batch.lab = malloc(sizeof(int32_t) * step_tok);
    const size_t vtok = (size_t)t->vshape.batch * (size_t)t->vshape.rows;
    if (t->val) {
        t->vbatch.in = malloc(sizeof(int32_t) * vtok);
        t->vbatch.lab = malloc(sizeof(int32_t) * vtok);
    }
    int cp_oom = 0;
    if (t->cp.size > 1) { /* whole sequences as loaded, before this rank takes its rows */
        t->batch.full_in = malloc(sizeof(int32_t) * step_tok * (size_t)t->cp.size);
        t->batch.full_lab = malloc(sizeof(int32_t) * step_tok * (size_t)t->cp.size);
        cp_oom = !t->batch.full_in || !t->batch.full_lab;
        if (t->val) {
            t->vbatch.full_in = malloc(sizeof(int32_t) * vtok * (size_t)t->cp.size);
            t->vbatch.full_lab = malloc(sizeof(int32_t) * vtok * (size_t)t->cp.size);
            cp_oom |= !t->vbatch.full_in || !t->vbatch.full_lab;
        }
    }
    if (llama3_needs_documents(&t->args)) { /* whole sequences' ids; zeros (one document each) until loaded */
        t->batch.doc = calloc(step_tok * (size_t)t->cp.size, sizeof(int32_t));
        cp_oom |= !t->batch.doc;
        if (t->val) {
            t->vbatch.doc = calloc(vtok * (size_t)t->cp.size, sizeof(int32_t));
            cp_oom |= !t->vbatch.doc;
        }
    }
    if (!t->batch.in || !t->batch.lab || (t->val && (!t->vbatch.in || !t->vbatch.lab)) || cp_oom) {
        log_error("out of memory allocating training buffers");
        return -1;
    }
    return 0;
}

/* A stage's optimizer state, activations (and the rank's one workspace) and pipeline sends. */
static int alloc_stage(trainer *t, train_stage *st) {
    const tetra_ops *ops = t->ops;
    char err[2048];
    const size_t local_numel = fsdp_local_numel(st->fs);
    /* AdamW moments for this rank's shard only, one allocation ("optimizer state") */
    const size_t adam_stride = (local_numel + 15) & ~(size_t)15;
    st->adam_on_host = fsdp_offloaded(st->fs);
    st->adam_m = st->adam_on_host ? ops->host_alloc(2 * adam_stride * sizeof(float))
                                  : ops->alloc(2 * adam_stride * sizeof(float));
    st->adam_v = st->adam_m ? st->adam_m + adam_stride : NULL;
    st->acts = calloc((size_t)st->n_acts, sizeof *st->acts);
    st->acts_mb = malloc((size_t)st->n_acts * sizeof *st->acts_mb);
    st->acts_state = calloc((size_t)st->n_acts, 1);
    if (!st->adam_m || !st->acts || !st->acts_mb || !st->acts_state) {
        log_error("out of memory allocating training buffers");
        return -1;
    }
    if (st->adam_on_host) {
        memset(st->adam_m, 0, local_numel * sizeof(float));
        memset(st->adam_v, 0, local_numel * sizeof(float));
    } else {
        ops->fill(st->adam_m, 0.0f, local_numel);
        ops->fill(st->adam_v, 0.0f, local_numel);
    }
    if (!st->ws) { /* the rank's one workspace, before the first stage's activations */
        train_stage *wo = st;
        for (int k = 0; k < t->n_local; k++)
            if (t->st[k].ws_owner) wo = &t->st[k];
        llama3_workspace *ws = llama3_workspace_create(&wo->model, t->shape.batch, t->shape.rows, wo->fwd_scratch,
                                                       wo->recompute_slots, err, sizeof err);
        if (!ws) {
            log_error("out of memory allocating the workspace: %s", err);
            return -1;
        }
        for (int k = 0; k < t->n_local; k++) t->st[k].ws = ws;
    }
    for (int k = 0; st->ws && k < st->n_acts; k++) {
        st->acts_mb[k] = -1;
        st->acts[k] =
            llama3_acts_create_ws(&st->model, st->ws, st->keep, t->shape.batch, t->shape.rows, err, sizeof err);
        if (!st->acts[k]) break;
    }
    if (!st->ws || !st->acts[st->n_acts - 1]) {
        log_error("out of memory allocating activations: %s", err);
        return -1;
    }
    if (st->n_send > 0) {
        st->send_buf = calloc((size_t)st->n_send, sizeof *st->send_buf);
        st->send_mb = malloc((size_t)st->n_send * sizeof *st->send_mb);
        if (!st->send_buf || !st->send_mb) {
            log_error("out of host memory");
            return -1;
        }
        for (int k = 0; k < st->n_send; k++) {
            st->send_mb[k] = -1;
            if (!(st->send_buf[k] = ops->alloc(send_bytes(t, st)))) {
                log_error("out of memory allocating pipeline send buffers");
                return -1;
            }
        }
    }
    return 0;
}

/* Validation's activations: the training ones when the shapes agree, else their own. */
static int alloc_validation(trainer *t) {
    char err[2048];
    t->vacts = calloc((size_t)t->n_local, sizeof *t->vacts);
    t->vws = calloc((size_t)t->n_local, sizeof *t->vws);
    if (!t->vacts || !t->vws) {
        log_error("out of host memory");
        return -1;
    }
    t->vacts_own = t->vshape.batch != t->shape.batch || t->vshape.rows != t->shape.rows;
    for (int i = 0; i < t->n_local; i++) {
        train_stage *st = &t->st[i];
        if (!t->vacts_own) {
            t->vacts[i] = st->acts[0];
            continue;
        }
        unsigned *none = keep_none(st);
        t->vws[i] =
            none ? llama3_workspace_create(&st->model, t->vshape.batch, t->vshape.rows, 1, 0, err, sizeof err) : NULL;
        t->vacts[i] = t->vws[i]
            ? llama3_acts_create_ws(&st->model, t->vws[i], none, t->vshape.batch, t->vshape.rows, err, sizeof err)
            : NULL;
        free(none);
        if (!t->vacts[i]) {
            log_error("out of memory allocating validation activations: %s", err);
            return -1;
        }
    }
    return 0;
}

/* Every buffer the step uses, allocated once at start-up. */
static int alloc_buffers(trainer *t) {
    const tetra_ops *ops = t->ops;
    t->plan_ready = 1; /* the layout is known: a start-up failure from here on can be snapshot */
    if (alloc_batches(t)) return -1;
    if (t->n_grad_arenas) { /* the stages' unsharded gradients (train_plan_grad_arenas) */
        const size_t total = t->grad_arena_off[t->n_grad_arenas];
        t->grad_arena_mem = ops->alloc(total);
        if (!t->grad_arena_mem) {
            log_error("out of memory allocating the unsharded gradients (%.1f MiB)", (double)total / 1048576.0);
            return -1;
        }
        for (int i = 0; i < t->n_local; i++)
            if (t->st[i].grad_arena >= 0)
                fsdp_set_work_grads(t->st[i].fs, (char *)t->grad_arena_mem + t->grad_arena_off[t->st[i].grad_arena]);
    }
    for (int i = 0; i < t->n_local; i++)
        if (alloc_stage(t, &t->st[i])) return -1;
    return t->val ? alloc_validation(t) : 0;
}

/* What checkpoints read and write of each stage: by group (model, exp_avg, exp_avg_sq),
 * then stage. */
static int setup_ckpt_groups(trainer *t) {
    t->groups = calloc((size_t)(N_GROUPS * t->n_local), sizeof *t->groups);
    t->save_groups = calloc((size_t)(N_GROUPS * t->n_local), sizeof *t->save_groups);
    if (!t->groups || !t->save_groups) {
        log_error("out of host memory");
        return -1;
    }
    for (int i = 0; i < t->n_local; i++) {
        train_stage *st = &t->st[i];
        const llama3_model *sm = &st->model;
        const dt_tensor *pieces = fsdp_tensors(st->fs);
        const int mh = fsdp_offloaded(st->fs), oh = st->adam_on_host; /* CPU offload: on the host */
        t->groups[G_MODEL * t->n_local + i] = (ckpt_group){"model/", pieces, sm->n_params, fsdp_master(st->fs), mh};
        t->groups[G_EXP_AVG * t->n_local + i] =
            (ckpt_group){"optimizer/exp_avg/", pieces, sm->n_params, st->adam_m, oh};
        t->groups[G_EXP_AVG_SQ * t->n_local + i] =
            (ckpt_group){"optimizer/exp_avg_sq/", pieces, sm->n_params, st->adam_v, oh};
        /* every tensor-parallel rank holds the replicated parameters (the norms): one writes them */
        st->save_tensors = malloc((size_t)sm->n_params * sizeof *st->save_tensors);
        if (!st->save_tensors) {
            log_error("out of host memory");
            return -1;
        }
        memcpy(st->save_tensors, pieces, (size_t)sm->n_params * sizeof *st->save_tensors);
        for (int k = 0; k < sm->n_params; k++)
            if (st->decl[k].replicated && sm->layout.tp_rank != 0) st->save_tensors[k].n_pieces = 0;
        for (int g = 0; g < N_GROUPS; g++) {
            t->save_groups[g * t->n_local + i] = t->groups[g * t->n_local + i];
            t->save_groups[g * t->n_local + i].tensors = st->save_tensors;
        }
    }
    return 0;
}

int trainer_setup(trainer **out, const tetra_config *cfg, const tetra_job *job, int rank, int world,
                  const trainer_options *opt) {
    const tetra_config_values *c = &cfg->v;
    char err[2048];
    *out = NULL;
    if (check_supported(cfg, &job->dims, world)) return 1;
    trainer *t = calloc(1, sizeof *t);
    if (!t) {
        log_error("out of host memory");
        return 1;
    }
    t->cfg = cfg;
    t->c = c;
    t->job = *job;
    if (opt) t->opt = *opt;
    t->rank = rank;
    t->world = world;
    if (setup_backend(t) || setup_mesh(t) || setup_shape(t)) goto fail;
    int max_t = t->shape.seq_len;
    if (c->validation.enable && t->vshape.seq_len > max_t) max_t = t->vshape.seq_len;
    t->shape.accum = job->dims.grad_accum_steps;
    if (setup_stages(t, max_t, err, sizeof err)) {
        log_error("%s", err);
        goto fail;
    }
    t->n_params = (double)llama3_num_params(&t->args);
    t->flops_per_token = llama3_flops_per_token(&t->args, t->shape.seq_len);
    if (plan_stages(t)) goto fail;
    if (t->opt.dry_run) {
        if (t->opt.plan_out) fill_plan(t, t->opt.plan_out);
        else log_plan(t);
        trainer_teardown(t);
        return 0;
    }
    start_point sp;
    memset(&sp, 0, sizeof sp);
    if (setup_weights(t, &sp) || open_data(t) || alloc_buffers(t) || setup_ckpt_groups(t)) goto fail;
    if (sp.found) {
        if (train_load_checkpoint(t, sp.path, sp.model_only, err, sizeof err)) {
            if (rank == 0) log_error("%s", err);
            goto fail;
        }
        if (rank == 0 && sp.initial)
            log_info("checkpoint: started from checkpoint.initial_sp.path %s%s", sp.path,
                     sp.model_only ? " (model weights only)" : "");
    }
    /* the parameters are initialised or loaded: converters derive their state from them
     * (Float8's precomputed weight scales, which its all-gather needs from the first step) */
    train_converters_post_optimizer(t);
    int64_t total = c->lr_scheduler.total_steps > 0 ? c->lr_scheduler.total_steps : c->training.steps;
    lr_schedule_init(&t->lrs, total, c->lr_scheduler.warmup_steps, c->lr_scheduler.decay_ratio,
                     c->lr_scheduler.decay_type, c->lr_scheduler.min_lr_factor);
    *out = t;
    return 0;
fail:
    if (t->plan_ready) write_memory_snapshot(t, 0, "start-up failed", 1);
    trainer_teardown(t);
    return 1;
}

/* ----------------------------------------------------------------------------
 * the loop */

/* The mixture's realised shares so far, a record of metrics.jsonl and TensorBoard
 * scalars (docs/data.md) */
/* The visible attention (query, key) pairs of this rank's sequences of the step just
 * loaded: T(T+1)/2 each under the causal mask, the sum over their documents under
 * block_causal (mfu_computed counts the attention the mask leaves). */
static double step_attention_pairs(const trainer *t) {
    const int rows = (int)t->c->training.local_batch_size * t->shape.accum;
    if (t->args.attn_mask_type != LLAMA3_MASK_BLOCK_CAUSAL || !t->batch.doc)
        return (double)rows * 0.5 * (double)t->shape.seq_len * (double)(t->shape.seq_len + 1);
    double p = 0.0;
    for (int r = 0; r < rows; r++) p += llama3_doc_pairs(t->batch.doc + (size_t)r * t->shape.seq_len, t->shape.seq_len);
    return p;
}

static void log_mix(trainer *t, int64_t step) {
    char line[1 << 16];
    if (dl_mix_json(t->train, line, sizeof line) != 0) return;
    uint64_t counts[MIX_MAX_SOURCES];
    double shares[MIX_MAX_SOURCES];
    const int n = dl_num_sources(t->train);
    const uint64_t drawn = dl_position(t->train);
    dl_source_counts(t->train, drawn, counts);
    for (int i = 0; i < n; i++) shares[i] = drawn ? (double)counts[i] / (double)drawn : 0.0;
    metrics_log_mix(t->ml, step, line, n, shares);
}

static void run_validation(trainer *t, int64_t step) {
    double tv = now_s();
    double loss_sum = 0.0, src_loss[MIX_MAX_SOURCES] = {0}, src_tok[MIX_MAX_SOURCES] = {0};
    int64_t tokens = 0;
    const int n_src = dl_num_sources(t->val);
    dl_rewind(t->val);
    const int64_t vsteps = t->c->validation.steps; /* batches; of each source in a mixture */
    int64_t src_batches[MIX_MAX_SOURCES] = {0};
    for (int64_t s = 0; n_src > 1 || vsteps < 0 || s < vsteps; s++) {
        if (t->cp.size > 1) {
            int got = dl_next_docs(t->val, t->vbatch.full_in, t->vbatch.full_lab, t->vbatch.doc);
            if (got < 0) {
                log_error("validation data: %s", dl_error(t->val));
                comm_abort_explained(1);
            }
            if (!got) break;
            train_shard_batch(t, t->vbatch.in, t->vbatch.lab, t->vbatch.full_in, t->vbatch.full_lab, t->vshape.batch,
                              t->vshape.seq_len);
        } else {
            int got = dl_next_docs(t->val, t->vbatch.in, t->vbatch.lab, t->vbatch.doc);
            if (got < 0) {
                log_error("validation data: %s", dl_error(t->val));
                comm_abort_explained(1);
            }
            if (!got) break;
        }
        int64_t nv = 0;
        const double l = train_forward_only(t, t->vacts, (size_t)t->vshape.batch * (size_t)t->vshape.rows, t->vbatch.in,
                                            t->vbatch.lab, t->vbatch.doc, 0.0f, &nv);
        loss_sum += l;
        tokens += nv;
        src_loss[dl_last_source(t->val)] += l;
        src_tok[dl_last_source(t->val)] += (double)nv;
        if (n_src > 1 && vsteps >= 0 && ++src_batches[dl_last_source(t->val)] >= vsteps) dl_skip_source(t->val);
    }
    for (int i = 0; n_src > 1 && i < n_src; i++) { /* a mixture's sources, each on its own */
        const double ls = comm_all_reduce_f64(t->g_loss, src_loss[i], COMM_SUM);
        const double ts = comm_all_reduce_f64(t->g_loss, src_tok[i], COMM_SUM);
        if (t->ml && ts > 0)
            log_info("validate step: %lld  source %s  loss: %.4f  (%.0f tokens)", (long long)step,
                     dl_source_name(t->val, i), ls / ts, ts);
    }
    double vsum = comm_all_reduce_f64(t->g_loss, loss_sum, COMM_SUM);
    double vtokens = comm_all_reduce_f64(t->g_loss, (double)tokens, COMM_SUM);
    if (t->ml && vtokens > 0) metrics_log_validation(t->ml, step, vsum / vtokens, now_s() - tv);
}

/* Everything between setup and the first step: saver, seed checkpoint, logs, warm-up,
 * the memory freeze. 0 to train, 1 on error, 2 when there is nothing to train. */
static int prepare_run(trainer *t) {
    const tetra_config_values *c = t->c;
    const tetra_ops *ops = t->ops;
    char err[2048];
    if (t->tc.step >= c->training.steps && !c->checkpoint.create_seed_checkpoint) {
        if (t->rank == 0)
            log_info("checkpoint: resumed at step %lld, which is training.steps = %lld: nothing left to train",
                     (long long)t->tc.step, (long long)c->training.steps);
        return 2;
    }
    if (c->checkpoint.enable || c->checkpoint.create_seed_checkpoint) {
        ckpt_saver_options so;
        memset(&so, 0, sizeof so);
        so.dir = t->ckpt_dir;
        so.ops = ops;
        so.rank = t->rank;
        so.world = t->world;
        so.writer = comm_group_rank(comm_get(t->cw, MESH_G_DP_REPLICATE)) == 0; /* one replica writes */
        so.async = strcmp(c->checkpoint.async_mode, "disabled") != 0;
        so.pinned = !strcmp(c->checkpoint.async_mode, "async_with_pinned_mem");
        so.keep_latest_k = (int)c->checkpoint.keep_latest_k;
        t->saver = ckpt_saver_create(&so, err, sizeof err);
        if (!t->saver) {
            log_error("%s", err);
            return 1;
        }
    }
    if (c->checkpoint.create_seed_checkpoint) {
        /* TorchTitan's seed checkpoint: the initial model alone, as step 0 (tetra's init is
         * the same under every layout, so it is a convenience, not a necessity) */
        if (train_save_checkpoint(t, 0, 1, 0, err, sizeof err)) {
            log_error("%s", err);
            return 1;
        }
        log_info("checkpoint: seed checkpoint written to %s/step-0; exiting (create_seed_checkpoint)", t->ckpt_dir);
        return 2;
    }

    t->peak = c->metrics.peak_flops;
    t->peak_src = "metrics.peak_flops";
    if ((isnan(t->peak) || t->peak <= 0) && strcmp(ops->name, "cpu") != 0 && t->mixed) {
        /* on a known GPU, TorchTitan's denominator: the datasheet's dense bf16 peak */
        char name[160], e[256];
        const cuda_kernels_api *k = cuda_kernels(e, sizeof e);
        const double table = k && k->device_describe(0, name, (int)sizeof name) == 0 ? metrics_gpu_peak_bf16(name) : 0;
        if (table > 0) {
            t->peak = table;
            snprintf(t->peak_src_buf, sizeof t->peak_src_buf, "dense bf16 peak of %s", name);
            t->peak_src = t->peak_src_buf;
        }
    }
    if (isnan(t->peak) || t->peak <= 0) {
        t->peak = measure_peak_flops(ops, t->mixed, &t->peak_src);
        /* every rank shares the same cores: the slowest probe is the honest one */
        t->peak = comm_all_reduce_f64(t->g_world, t->peak, COMM_MIN);
        if (!(t->peak > 0)) {
            log_warn("MFU: the peak-FLOP/s probe could not allocate its matrices; MFU is logged as 0 (set "
                     "metrics.peak_flops to the device's peak)");
            t->peak = INFINITY;
        }
    }
    log_plan(t);
    log_info("training %lld steps, global batch %lld x %d tokens, dataset %s (%llu tokens, %llu steps/epoch)",
             (long long)c->training.steps, (long long)t->job.dims.global_batch_size, t->shape.seq_len, t->data_dir,
             t->train ? (unsigned long long)dl_num_tokens(t->train) : 0ull,
             t->train ? (unsigned long long)dl_steps_per_epoch(t->train) / (unsigned long long)t->shape.accum : 0ull);
    if (t->rank == 0 && c->training.dataset_mix.n > 0) { /* the shares the whole run will draw */
        char line[1 << 16];
        const uint64_t planned = (uint64_t)c->training.steps * (uint64_t)t->job.dims.global_batch_size;
        if (dl_mix_summary(t->train, planned, line, sizeof line) == 0)
            log_info("data mixture over the run's %llu sequences: %s", (unsigned long long)planned, line);
    }

    if (t->rank == 0 && !t->opt.external_batches) {
        /* metrics_open_at creates the dump folder; a resumed run drops the records an earlier attempt wrote past
         * its checkpoint, and a fresh run (step 1) starts a new file (docs/metrics.md) */
        t->ml = metrics_open_at(c->job.dump_folder, c->metrics.enable_tensorboard, c->metrics.save_tb_folder,
                                !c->metrics.disable_color_printing && log_color_wanted(STDOUT_FILENO), t->tc.step + 1,
                                err, sizeof err);
        if (!t->ml) {
            log_error("metrics: %s", err);
            return 1;
        }
    }

    if (c->profiling.enable_profiling) {
        char dir[8400];
        snprintf(dir, sizeof dir, "%s/%s", c->job.dump_folder, c->profiling.save_traces_folder);
        t->tr = trace_create(dir, t->rank, c->profiling.profile_freq, c->profiling.profiler_active, ops, t->cw, err,
                             sizeof err);
        if (!t->tr) {
            log_error("%s", err);
            return 1;
        }
        for (int i = 0; i < t->n_local; i++) t->st[i].tr = t->tr;
        if (t->rank == 0)
            log_info("profiling: the last %lld step%s of every %lld to %s/iteration_<step>/rank<r>_trace.json",
                     (long long)c->profiling.profiler_active, c->profiling.profiler_active == 1 ? "" : "s",
                     (long long)c->profiling.profile_freq, dir);
    }

    /* ---- all backend memory is taken now ----
     * On the GPU one warm-up microbatch (forward and backward through FSDP, results
     * discarded: every step starts by zeroing the gradients) lets the backend size its
     * scratch and build its GEMM and attention plans before the freeze; from then on any
     * allocation is an error that names its size and purpose. */
    if (strcmp(ops->name, "cpu") != 0) {
        train_warmup(t);
        if (t->vacts && t->vacts_own) {
            memset(t->vbatch.in, 0, (size_t)t->vshape.batch * (size_t)t->vshape.rows * sizeof(int32_t));
            memset(t->vbatch.lab, 0, (size_t)t->vshape.batch * (size_t)t->vshape.rows * sizeof(int32_t));
            train_forward_only(t, t->vacts, (size_t)t->vshape.batch * (size_t)t->vshape.rows, t->vbatch.in,
                               t->vbatch.lab, t->vbatch.doc, 0.0f, NULL);
        }
        ops->synchronize();
    }
    ops->memory_freeze(1);
    t->allocs_at_start = ops->alloc_count();
    char hb[32];
    fmt_bytes(hb, sizeof hb, (double)ops->allocated_bytes());
    size_t dfree = 0, dtotal = 0;
    ops->device_memory(&dfree, &dtotal);
    if (dtotal > 0) {
        char fb[32], tb2[32];
        fmt_bytes(fb, sizeof fb, (double)dfree);
        fmt_bytes(tb2, sizeof tb2, (double)dtotal);
        char nb[96] = "";
        if (comm_world_device_bytes(t->cw) > 0) {
            char nx[32];
            fmt_bytes(nx, sizeof nx, (double)comm_world_device_bytes(t->cw));
            snprintf(nb, sizeof nb, "; NCCL communicators %s", nx);
        }
        log_info("device memory: %s (%zu bytes) in %zu allocations taken at start-up%s; %s free of %s", hb,
                 ops->allocated_bytes(), t->allocs_at_start, nb, fb, tb2);
    } else {
        log_info("backend memory: %s (%zu bytes) in %zu allocations taken at start-up", hb, ops->allocated_bytes(),
                 t->allocs_at_start);
    }
    write_memory_snapshot(t, 0, "start-up", 0);
    return 0;
}

/* "3, 4" */
static const char *pp_stage_list(const trainer *t) {
    static char buf[256];
    buf[0] = '\0';
    for (int i = 0; i < t->n_local; i++)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%d", i ? ", " : "", t->st[i].index);
    return buf;
}

/* What the loop keeps between steps: the log window's sums and the pipeline's times. */
typedef struct {
    int64_t first_step;
    double log_t0, log_data;    /* the log window's start and its time loading data */
    int64_t log_steps;          /* steps in the log window */
    double log_pairs, log_seqs; /* visible attention pairs of this rank's sequences (mfu_computed) */
    int64_t nonfinite_run;      /* non-finite steps skipped in a row */
    double pp_busy, pp_total, pp_recv, pp_type_s[4];
    long pp_type_n[4];
} run_state;

/* Preemption (Slurm's SIGTERM or --signal=USR1, Ctrl-C; engine/run_guard.h): the step in
 * progress finishes, every rank learns of the signal at its end, a checkpoint is written
 * and the run exits 0. A signal during start-up stops the run before its first step. */
static int stopped_at_start(trainer *t, int64_t first_step) {
    const tetra_config_values *c = t->c;
    run_guard_set_stop_target(t->saver && !c->checkpoint.load_only ? t->ckpt_dir : NULL);
    int64_t early = 0;
    if (first_step <= c->training.steps) {
        early = comm_all_reduce_i64(t->g_world, run_guard_stop_request(t->rank), COMM_MAX);
        run_guard_stop_decided(early != 0, first_step);
    }
    if (early && t->rank == 0)
        log_warn("stopped by %s during start-up, before step %lld of %lld: nothing was trained, so nothing was "
                 "saved",
                 run_guard_signal_name((int)early), (long long)first_step, (long long)c->training.steps);
    return early != 0;
}

/* An async save finishing: publish it, or surface its error. 0, or -1. */
static int poll_async_save(trainer *t, int wait) {
    char err[2048];
    if (!t->saver || !ckpt_in_flight(t->saver)) return 0;
    const int pr = ckpt_poll(t->saver, wait, err, sizeof err);
    if (pr < 0) {
        if (t->rank == 0) log_error("%s", err);
        return -1;
    }
    if (pr > 0 && t->rank == 0) train_log_save(t->saver, 1);
    return 0;
}

/* This step's microbatches (whole sequences, then this rank's rows under context
 * parallel). 0, or -1 with the reason logged. */
static int load_batch(trainer *t, int64_t step, run_state *rs) {
    const tetra_config_values *c = t->c;
    const double t_data = now_s();
    const size_t stride = (size_t)c->training.local_batch_size * (size_t)t->shape.seq_len;
    const int cp = t->cp.size > 1;
    int32_t *in = cp ? t->batch.full_in : t->batch.in, *lab = cp ? t->batch.full_lab : t->batch.lab;
    int data_ok = 1;
    for (int a = 0; a < t->shape.accum && data_ok; a++)
        data_ok = dl_next_docs(t->train, in + (size_t)a * stride, lab + (size_t)a * stride,
                               t->batch.doc ? t->batch.doc + (size_t)a * stride : NULL) > 0;
    if (cp)
        train_shard_batch(t, t->batch.in, t->batch.lab, t->batch.full_in, t->batch.full_lab,
                          (int)c->training.local_batch_size * t->shape.accum, t->shape.seq_len);
    if (!data_ok) { /* every rank reads its own windows: the one that failed says why */
        log_error("training data, step %lld: %s", (long long)step, dl_error(t->train));
        return -1;
    }
    rs->log_data += now_s() - t_data;
    rs->log_pairs += step_attention_pairs(t);
    rs->log_seqs += (double)c->training.local_batch_size * t->shape.accum;
    return 0;
}

/* The pipeline's times of a step after the first (which warms caches and plans). */
static void add_pp_stats(const trainer *t, run_state *rs) {
    rs->pp_busy += t->pp_stats.compute_s;
    rs->pp_total += t->pp_step_s;
    rs->pp_recv += t->pp_stats.recv_wait_s;
    for (int k = 0; k < 4; k++) {
        rs->pp_type_s[k] += t->pp_stats.type_s[k];
        rs->pp_type_n[k] += t->pp_stats.type_n[k];
    }
}

/* A non-finite loss or gradient norm: stop, or skip the update (training.on_nonfinite)
 * until too many in a row. 0 to go on, -1 to stop. */
static int check_nonfinite(trainer *t, int64_t step, const step_result *r, run_state *rs) {
    const tetra_config_values *c = t->c;
    if (!r->nonfinite) {
        rs->nonfinite_run = 0;
        return 0;
    }
    if (strcmp(c->training.on_nonfinite, "skip") != 0) {
        if (t->rank == 0)
            log_error("step %lld: loss %g, gradient norm %g; stopping before the update, so the parameters "
                      "and the checkpoints stay finite (lower optimizer.lr or check the data; "
                      "training.on_nonfinite = \"skip\" skips such steps)",
                      (long long)step, r->loss, r->grad_norm);
        return -1;
    }
    if (t->rank == 0)
        log_warn("step %lld: loss %g, gradient norm %g: update skipped (training.on_nonfinite = \"skip\")",
                 (long long)step, r->loss, r->grad_norm);
    /* a bad batch passes; step after step of them means the run diverged: every rank
     * agrees on r->nonfinite, so every rank stops at the same step */
    const int64_t k = c->training.max_consecutive_nonfinite_steps;
    if (++rs->nonfinite_run >= k && k > 0) {
        if (t->rank == 0)
            log_error("step %lld: %lld non-finite steps in a row were skipped (training.max_consecutive_"
                      "nonfinite_steps = %lld): the run has diverged, stopping; the parameters and the "
                      "checkpoints are those of the last finite update (lower optimizer.lr or check the "
                      "data)",
                      (long long)step, (long long)rs->nonfinite_run, (long long)k);
        return -1;
    }
    return 0;
}

/* The metrics of a log step, averaged over the steps since the last one. */
static void log_step(trainer *t, int64_t step, const step_result *r, run_state *rs) {
    const tetra_config_values *c = t->c;
    const double dt = (now_s() - rs->log_t0) / (double)rs->log_steps;
    if (t->ml) {
        metrics_step s;
        memset(&s, 0, sizeof s);
        s.step = step;
        s.loss = r->loss;
        s.max_loss = r->max_loss;
        s.grad_norm = r->grad_norm;
        s.lr = r->lr;
        /* TorchTitan's tps is per device: the data-parallel rank's tokens over the
         * ranks that share them (tensor, pipeline and context parallel) */
        s.tps = (double)c->training.local_batch_size * t->shape.seq_len * t->shape.accum / dt /
            (double)(t->msh.size[MESH_TP] * t->msh.size[MESH_PP] * t->msh.size[MESH_CP]);
        s.tflops = t->flops_per_token * s.tps / 1e12;
        s.mfu = 100.0 * t->flops_per_token * s.tps / t->peak;
        const double fpt = llama3_flops_per_token_pairs(&t->args, rs->log_pairs / rs->log_seqs, t->shape.seq_len);
        s.tflops_computed = fpt * s.tps / 1e12;
        s.mfu_computed = 100.0 * fpt * s.tps / t->peak;
        s.mem_gib = (double)metrics_peak_rss_bytes() / (1024.0 * 1024 * 1024);
        s.mem_pct = 100.0 * (double)metrics_peak_rss_bytes() / (double)metrics_host_memory_bytes();
        s.step_time_s = dt;
        s.data_time_s = rs->log_data / (double)rs->log_steps;
        s.tokens_seen = t->tc.tokens_seen;
        metrics_log_step(t->ml, &s);
        if (c->training.dataset_mix.n > 0) log_mix(t, step);
    }
    rs->log_t0 = now_s();
    rs->log_data = 0.0;
    rs->log_steps = 0;
    rs->log_pairs = rs->log_seqs = 0.0;
}

/* A checkpoint at its interval, the first step (enable_first_step_checkpoint) and the
 * last; the last may be model-only in export_dtype, or Hugging Face safetensors, and is
 * written synchronously so the run ends with it complete. 0, or -1. */
static int save_at_interval(trainer *t, int64_t step) {
    const tetra_config_values *c = t->c;
    const int last = step == c->training.steps;
    if (!t->saver || c->checkpoint.load_only ||
        !(last || step % c->checkpoint.interval == 0 || (step == 1 && c->checkpoint.enable_first_step_checkpoint)))
        return 0;
    char err[2048];
    const int model_only = last && (c->checkpoint.last_save_model_only || c->checkpoint.last_save_in_hf);
    if (train_save_checkpoint(t, step, model_only, last, err, sizeof err)) {
        if (t->rank == 0) log_error("%s", err);
        return -1;
    }
    return 0;
}

/* A stop signal on any rank stops every rank after the same step, with a checkpoint.
 * 0 to go on, 1 to stop, -1 when the stop's save failed. */
static int stop_after(trainer *t, int64_t step) {
    const tetra_config_values *c = t->c;
    const int last = step == c->training.steps;
    const int64_t sig = comm_all_reduce_i64(t->g_world, (int64_t)run_guard_stop_request(t->rank), COMM_MAX);
    run_guard_stop_decided(sig && !last, last ? step : step + 1);
    if (!sig || last) return 0;
    const int saving = t->saver && !c->checkpoint.load_only;
    char err[2048];
    if (saving && step % c->checkpoint.interval != 0 && train_save_checkpoint(t, step, 0, 0, err, sizeof err)) {
        if (t->rank == 0) log_error("%s", err);
        return -1;
    }
    if (t->rank != 0) return 1;
    if (saving)
        log_warn("stopped by %s after step %lld of %lld: checkpoint step-%lld in %s; run the same "
                 "command again to resume",
                 run_guard_signal_name((int)sig), (long long)step, (long long)c->training.steps, (long long)step,
                 t->ckpt_dir);
    else
        log_warn("stopped by %s after step %lld of %lld; checkpoint.enable is false, so nothing was "
                 "saved",
                 run_guard_signal_name((int)sig), (long long)step, (long long)c->training.steps);
    return 1;
}

/* One step of the loop: load, step, log, save, validate, stop. 0 to go on, 1 to stop
 * (the run succeeded), -1 on an error. */
static int run_one_step(trainer *t, int64_t step, run_state *rs) {
    const tetra_config_values *c = t->c;
    char err[2048];
    run_guard_set_step(step);
    comm_set_step(t->cw, step);
    trace_step_begin(t->tr, step);
    trace_begin(t->tr, "data", "load batch");
    if (poll_async_save(t, 0) || load_batch(t, step, rs)) return -1;
    trace_end(t->tr);
    step_result r;
    train_step(t, &r);
    if (trace_step_end(t->tr, step, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    if (c->profiling.profile_freq > 0 && step % c->profiling.profile_freq == 0)
        write_memory_snapshot(t, step, "step", 0);
    t->tc.tokens_seen += c->training.local_batch_size * (int64_t)t->shape.seq_len * t->shape.accum * t->job.dims.dp;
    if (step > rs->first_step) add_pp_stats(t, rs);
    t->tc.step = step;
    rs->log_steps++;
    if (step == rs->first_step) {
        /* as TorchTitan: once every rank has finished a step, the shorter timeout applies */
        comm_barrier(t->g_world, NULL);
        comm_set_phase_training(t->cw);
    }
    if (check_nonfinite(t, step, &r, rs)) return -1;
    if (step == 1 || step % c->metrics.log_freq == 0 || step == c->training.steps) log_step(t, step, &r, rs);
    if (save_at_interval(t, step)) return -1;
    if (t->val && (step == 1 || step % c->validation.freq == 0 || step == c->training.steps)) {
        const double tv = now_s();
        run_validation(t, step);
        rs->log_t0 += now_s() - tv; /* validation time is not training throughput */
    }
    return stop_after(t, step);
}

/* The pipeline's bubble per rank, from steps 2 on. */
static void log_pipeline_summary(const trainer *t, const run_state *rs) {
    const double n = (double)(t->c->training.steps - rs->first_step);
    /* every pipeline rank reports, so the bubble of each can be read off */
    log_info("pipeline rank %d (stage%s %s): computing %.1f%% of the schedule's time, idle %.1f%% "
             "(%.3f s of %.3f s per step; %.3f s waiting for receives) over steps 2-%lld",
             t->pp_rank, t->n_local > 1 ? "s" : "", pp_stage_list(t), 100.0 * rs->pp_busy / rs->pp_total,
             100.0 * (1.0 - rs->pp_busy / rs->pp_total), rs->pp_busy / n, rs->pp_total / n, rs->pp_recv / n,
             (long long)t->c->training.steps);
    char per[160] = "";
    static const char *const names[4] = {"F", "I", "W", "B"};
    for (int k = 0; k < 4; k++)
        if (rs->pp_type_n[k] > 0)
            snprintf(per + strlen(per), sizeof per - strlen(per), "%s%s %.2f ms", per[0] ? ", " : "", names[k],
                     1e3 * rs->pp_type_s[k] / (double)rs->pp_type_n[k]);
    log_info("pipeline rank %d: mean time per stage action: %s", t->pp_rank, per);
}

/* The run's closing lines: communication, the pipeline's bubble, tensor parallel, memory. */
static void log_summary(const trainer *t, const run_state *rs) {
    const tetra_config_values *c = t->c;
    char rb[32];
    fmt_bytes(rb, sizeof rb, (double)metrics_peak_rss_bytes());
    fsdp_stats st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < t->n_local; i++) {
        fsdp_stats x = fsdp_get_stats(t->st[i].fs);
        st.all_gathers += x.all_gathers;
        st.reduce_scatters += x.reduce_scatters;
        st.all_reduces += x.all_reduces;
        st.wait_s += x.wait_s;
    }
    if (t->world > 1)
        log_info("communication: %ld all-gathers, %ld reduce-scatters, %ld all-reduces; %.2f s waiting", st.all_gathers,
                 st.reduce_scatters, st.all_reduces, st.wait_s);
    if (t->pp_size > 1 && rs->pp_total > 0) log_pipeline_summary(t, rs);
    if (t->msh.size[MESH_TP] > 1) {
        tp_stats ts = tp_get_stats();
        log_info("tensor parallel%s: %ld sequence-parallel collectives, %.1f MiB sent; %.2f s waiting",
                 t->st[0].model.tp_async ? " (async)" : "", ts.collectives, ts.bytes / (1024.0 * 1024.0), ts.wait_s);
    }
    const size_t allocs = t->ops->alloc_count() - t->allocs_at_start;
    if (t->tc.step < c->training.steps)
        log_info("training stopped at step %lld of %lld; peak resident memory %s; %zu backend allocations "
                 "during training",
                 (long long)t->tc.step, (long long)c->training.steps, rb, allocs);
    else
        log_info("training done: %lld steps; peak resident memory %s; %zu backend allocations during training",
                 (long long)c->training.steps, rb, allocs);
}

int trainer_run(const tetra_config *cfg, const tetra_job *job, int rank, int world, const trainer_options *opt) {
    trainer *t = NULL;
    int rc = trainer_setup(&t, cfg, job, rank, world, opt);
    if (rc || !t) return rc;
    rc = prepare_run(t);
    if (rc) {
        trainer_teardown(t);
        return rc == 2 ? 0 : rc;
    }
    run_state rs;
    memset(&rs, 0, sizeof rs);
    rs.log_t0 = now_s();
    rs.first_step = t->tc.step + 1;
    if (stopped_at_start(t, rs.first_step)) {
        trainer_teardown(t);
        return 0;
    }
    int st = 0;
    for (int64_t step = rs.first_step; step <= t->c->training.steps && st == 0; step++) st = run_one_step(t, step, &rs);
    rc = st < 0 ? 1 : 0;
    if (rc == 0 && poll_async_save(t, 1)) rc = 1;
    if (rc == 0) log_summary(t, &rs);
    trainer_teardown(t);
    return rc;
}
