/* trainer.c — the training job: setup, the step loop, teardown (see trainer.h).
 * One optimizer step is train_step.c; checkpoint state is train_ckpt.c. */
#include "engine/trainer.h"

#include <inttypes.h>
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/log.h"
#include "engine/trainer_internal.h"
#include "models/llama3/hf.h"
#include "parallel/tp.h"

/* OpenBLAS' own thread control; declared here to keep to the generic cblas.h. */
void openblas_set_num_threads(int num_threads);

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Ranks on this host, so CPU threads are split between them. */
static int local_ranks(void) {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int n = 1;
    MPI_Comm_size(node, &n);
    MPI_Comm_free(&node);
    return n;
}

/* Achievable fp32 FLOP/s of this backend: the best of a few square GEMMs,
 * the denominator of MFU on the CPU (no vendor table applies there). */
static double measure_peak_flops(const tetra_ops *ops) {
    const int n = 1024;
    size_t bytes = (size_t)n * n * sizeof(float);
    float *a = ops->alloc(bytes), *b = ops->alloc(bytes), *c = ops->alloc(bytes);
    if (!a || !b || !c) {
        ops->release(a);
        ops->release(b);
        ops->release(c);
        return 0.0;
    }
    ops->fill(a, 0.5f, (size_t)n * n);
    ops->fill(b, 0.25f, (size_t)n * n);
    ops_gemm_desc g = {0};
    g.a_type = g.b_type = g.c_type = TETRA_F32;
    g.m = g.n = g.k = n;
    g.lda = g.ldb = g.ldc = n;
    g.alpha = 1.0f;
    g.beta = 0.0f;
    double best = 1e30;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = now_s();
        ops->gemm(c, a, b, &g);
        ops->synchronize();
        double dt = now_s() - t0;
        if (rep > 0 && dt < best) best = dt; /* first call warms caches and threads */
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
static unsigned *keep_none(const trainer *t) {
    const int nb = t->model.layout.layer_end - t->model.layout.layer_start;
    unsigned *k = calloc((size_t)(nb > 0 ? nb : 1), sizeof *k); /* LLAMA3_KEEP_NONE is 0 */
    return k;
}

static size_t validation_bytes(const trainer *t) {
    unsigned *none = keep_none(t);
    size_t b = none ? llama3_acts_bytes_policy(&t->model, none, t->VB, t->VT) +
                          llama3_workspace_bytes(&t->model, t->VB, t->VT, 1, 0)
                    : 0;
    free(none);
    return b;
}

static void log_plan(trainer *t) {
    const tetra_config_values *c = t->c;
    const int S = fsdp_shard_degree(t->fs), R = fsdp_replicate_degree(t->fs);
    const char *mode = t->world == 1 ? "single rank"
                       : S == 1      ? "DDP (replicated)"
                       : R == 1      ? "FSDP (sharded)"
                                     : "HSDP (sharded x replicated)";
    char mdesc[160];
    mesh_describe(&t->msh, mdesc, sizeof mdesc);
    log_info("model %s %s: %.3fM parameters, %.3g FLOPs/token at seq_len %d", c->model.name, c->model.flavor,
             t->n_params / 1e6, t->flops_per_token, t->T);
    if (t->opt.dry_run)
        log_info("dry run: backend %s (planned, nothing allocated), %d threads per rank; %s: %s; gradient "
                 "accumulation %d", t->ops->name, t->threads, mdesc, mode, t->accum);
    else
        log_info("backend %s, %d threads per rank; %s: %s, comm %s; gradient accumulation %d; peak %.1f GFLOP/s "
                 "per rank (%s)", t->ops->name, t->threads, mdesc, mode, comm_backend_name(comm_world_backend(t->cw)),
                 t->accum, t->peak / 1e9, t->peak_src);
    fsdp_memory mr = fsdp_memory_report(t->fs);
    const size_t acts1 = llama3_acts_bytes_policy(&t->model, t->keep, t->B, t->T);
    const size_t wsb = llama3_workspace_bytes(&t->model, t->B, t->T, t->n_dropping > 0, t->recompute_slots);
    size_t vb = 0;
    if (c->validation.enable && (t->VB != t->B || t->VT != t->T))
        vb = validation_bytes(t);
    const size_t persistent = mr.param_bytes + mr.compute_bytes + mr.grad_bytes + mr.optim_bytes;
    const size_t working = mr.work_param_bytes + mr.work_grad_bytes + mr.reduce_bytes;
    const size_t acts = (size_t)t->n_acts * acts1 + wsb + vb;
    char pb[32], gb[32], ob[32], wpb[32], wgb[32], rb[32], ab[32], a1[32], wb[32], vbs[32], tot[32];
    fmt_bytes(pb, sizeof pb, (double)(mr.param_bytes + mr.compute_bytes));
    fmt_bytes(gb, sizeof gb, (double)mr.grad_bytes);
    fmt_bytes(ob, sizeof ob, (double)mr.optim_bytes);
    fmt_bytes(wpb, sizeof wpb, (double)mr.work_param_bytes);
    fmt_bytes(wgb, sizeof wgb, (double)mr.work_grad_bytes);
    fmt_bytes(rb, sizeof rb, (double)mr.reduce_bytes);
    fmt_bytes(ab, sizeof ab, (double)acts);
    fmt_bytes(a1, sizeof a1, (double)acts1);
    fmt_bytes(wb, sizeof wb, (double)wsb);
    fmt_bytes(vbs, sizeof vbs, (double)vb);
    fmt_bytes(tot, sizeof tot, (double)(persistent + working + acts));
    const char *prec = t->mixed ? "bf16 compute: parameters include their bf16 copy; fp32 master weights, gradients "
                                  "and optimizer state"
                                : "fp32";
    char who[256], tpw[48] = "";
    if (t->model.layout.tp_size > 1)
        snprintf(tpw, sizeof tpw, "tp %d of %d, ", t->model.layout.tp_rank, t->model.layout.tp_size);
    if (S > 1)
        snprintf(who, sizeof who, "%sshard %d of %d, %s", tpw, comm_group_rank(comm_get(t->cw, MESH_G_FSDP)), S, prec);
    else snprintf(who, sizeof who, "%s%s", tpw, prec);
    char vpart[80] = "";
    if (vb) snprintf(vpart, sizeof vpart, " + validation %s", vbs);
    if (S > 1)
        log_info("memory rank %d (%s): persistent: parameters %s, gradients %s, optimizer state %s; working: gathered "
                 "parameters %s (%d resident unit%s + 2 slots), unsharded gradients %s, reduce staging %s; "
                 "activations %s (%d microbatch%s x %s + workspace %s%s); total %s",
                 t->rank, who, pb, gb, ob, wpb, mr.resident_units, mr.resident_units == 1 ? "" : "s", wgb, rb, ab,
                 t->n_acts, t->n_acts == 1 ? "" : "es", a1, wb, vpart, tot);
    else
        log_info("memory rank %d (%s): persistent: parameters %s, gradients %s, optimizer state %s; activations %s "
                 "(%d microbatch%s x %s + workspace %s%s); total %s",
                 t->rank, who, pb, gb, ob, ab, t->n_acts, t->n_acts == 1 ? "" : "es", a1, wb, vpart, tot);
    {
        /* what this rank sends per step, by parallelism */
        fsdp_traffic ft = fsdp_step_traffic(t->fs, t->accum);
        const double tpb = (double)t->accum * llama3_tp_traffic_bytes(&t->model, t->keep, t->B, t->T);
        const double mib = 1024.0 * 1024.0;
        if (S > 1 || R > 1 || tpb > 0)
            log_info("communication per step, rank %d sends: fsdp all-gather %.1f MiB, reduce-scatter %.1f MiB, "
                     "replicate all-reduce %.1f MiB; tensor parallel %.1f MiB", t->rank, ft.all_gather / mib,
                     ft.reduce_scatter / mib, ft.all_reduce / mib, tpb / mib);
    }
    if (t->n_dropping > 0) {
        char full[32];
        fmt_bytes(full, sizeof full, (double)llama3_acts_bytes_policy(&t->model, NULL, t->B, t->T));
        log_info("activation checkpointing: mode %s%s%s: %d of %d blocks recompute in backward; %s per microbatch "
                 "instead of %s, %d recompute slot%s in the workspace", c->activation_checkpoint.mode,
                 strcmp(c->activation_checkpoint.mode, "selective") ? "" : ", option ",
                 strcmp(c->activation_checkpoint.mode, "selective") ? "" : c->activation_checkpoint.selective_ac_option,
                 t->n_dropping, t->model.layout.layer_end - t->model.layout.layer_start, a1, full, t->recompute_slots,
                 t->recompute_slots == 1 ? "" : "s");
    }
    if (S > 1)
        log_info("fsdp: %d units sharded over %s (%d ranks), reshard_after_forward = %s%s", t->model.n_units,
                 comm_group_name(comm_get(t->cw, MESH_G_FSDP)), S, c->parallelism.fsdp_reshard_after_forward,
                 R > 1 ? ", gradients all-reduced over dp_replicate" : "");
}

/* ----------------------------------------------------------------------------
 * setup and teardown */

void trainer_teardown(trainer *t) {
    if (!t) return;
    const tetra_ops *ops = t->ops;
    if (t->ml) metrics_close(t->ml);
    if (ops && ops->memory_freeze) ops->memory_freeze(0);
    ckpt_saver_free(t->saver);
    if (t->model_ready) {
        if (t->vacts && (t->n_acts < 1 || t->vacts != t->acts[0])) llama3_acts_free(&t->model, t->vacts);
        for (int i = 0; i < t->n_acts && t->acts; i++) llama3_acts_free(&t->model, t->acts[i]);
        llama3_workspace_free(&t->model, t->vws);
        llama3_workspace_free(&t->model, t->ws);
    }
    free(t->acts);
    free(t->acts_mb);
    free(t->keep);
    free(t->save_tensors);
    free(t->h_in);
    free(t->h_lab);
    free(t->hv_in);
    free(t->hv_lab);
    if (t->adam_m) ops->release(t->adam_m);
    if (t->val) dl_close(t->val);
    if (t->train) dl_close(t->train);
    pp_schedule_free(t->sched);
    fsdp_free(t->fs);
    free(t->decl);
    if (t->model_ready) llama3_model_free(&t->model);
    comm_world_free(t->cw);
    free(t);
}

/* Refusals before anything is built: features of later versions, bad values. */
static int check_supported(const tetra_config *cfg, const cfg_parallel_dims *dims, int world) {
    const tetra_config_values *c = &cfg->v;
    if (dims->pp > 1 || dims->cp > 1) {
        log_error("parallelism: pipeline and context parallel degrees must be 1 in this version (got pp %d, cp %d); "
                  "data parallel (FSDP, HSDP, DDP) and tensor parallel are supported", dims->pp, dims->cp);
        return 1;
    }
    if (c->model.converters.n > 0) {
        log_error("%s: model.converters = [\"%s\"]: the Float8 converter is not available in this version",
                  cfg->file ? cfg->file : "command line", c->model.converters.items[0]);
        return 1;
    }
    if (c->checkpoint.create_seed_checkpoint && world != 1) {
        log_error("checkpoint.create_seed_checkpoint needs a single rank (got %d): run it with NGPU=1; the seed "
                  "checkpoint then loads under any layout", world);
        return 1;
    }
    fsdp_reshard_mode reshard;
    if (fsdp_parse_reshard(c->parallelism.fsdp_reshard_after_forward, &reshard)) {
        log_error("parallelism.fsdp_reshard_after_forward: \"%s\" is not one of default, always, never",
                  c->parallelism.fsdp_reshard_after_forward);
        return 1;
    }
    if (strcmp(c->training.mixed_precision_reduce, "float32") != 0) {
        log_error("training.mixed_precision_reduce = \"%s\": gradients are computed, accumulated and reduced in "
                  "float32 in this version (parameter gradients are fp32 in both precisions); set it to "
                  "\"float32\"", c->training.mixed_precision_reduce);
        return 1;
    }
    return 0;
}

int trainer_setup(trainer **out, const tetra_config *cfg, const cfg_parallel_dims *dims, int rank, int world,
                  const trainer_options *opt) {
    const tetra_config_values *c = &cfg->v;
    char err[2048];
    *out = NULL;
    if (check_supported(cfg, dims, world)) return 1;
    trainer *t = calloc(1, sizeof *t);
    if (!t) {
        log_error("out of host memory");
        return 1;
    }
    t->cfg = cfg;
    t->c = c;
    t->dims = *dims;
    if (opt) t->opt = *opt;
    t->rank = rank;
    t->world = world;
    const int dry = t->opt.dry_run;

    /* ---- threads and backend ---- */
    t->threads = (int)c->training.threads;
    if (t->threads <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        t->threads = (int)(cores / local_ranks());
        if (t->threads < 1) t->threads = 1;
    }
    omp_set_num_threads(t->threads);
    openblas_set_num_threads(t->threads);
    t->ops = dry ? ops_plan(c->training.device, err, sizeof err) : ops_get(c->training.device, err, sizeof err);
    if (!t->ops) {
        log_error("training.device: %s", err);
        goto fail;
    }
    const tetra_ops *ops = t->ops;
    if (!dry) ops->set_deterministic((int)c->training.deterministic);

    /* ---- precision ----
     * TorchTitan's default mixed_precision_param = bfloat16 applies on the GPU. The CPU
     * backend computes in fp32 unless the key is set explicitly (bf16 there is for
     * checking the mixed-precision path, not for speed). */
    t->mixed = !strcmp(c->training.mixed_precision_param, "bfloat16") &&
               (strcmp(ops->name, "cpu") != 0 || key_is_set(cfg, "training", "mixed_precision_param"));

    /* ---- mesh and process groups ---- */
    if (mesh_init(&t->msh, world, dims->pp, dims->dp_replicate, dims->dp_shard, dims->cp, dims->tp, err, sizeof err)) {
        log_error("parallelism: %s", err);
        goto fail;
    }
    comm_options copt;
    memset(&copt, 0, sizeof copt);
    copt.backend = COMM_BACKEND_MPI; /* a dry run communicates nothing on the device */
    if (!dry && !ops->host_memory && world > 1) {
        if (!comm_backend_available(COMM_BACKEND_NCCL)) {
            log_error("training.device = cuda with %d ranks needs the NCCL backend, which this build lacks "
                      "(build with libnccl, see docs/parallelism.md)", world);
            goto fail;
        }
        copt.backend = COMM_BACKEND_NCCL;
    }
    copt.init_timeout_s = (double)c->comm.init_timeout_seconds;
    copt.train_timeout_s = (double)c->comm.train_timeout_seconds;
    copt.cuda_device = -1;
    t->cw = comm_world_create(&t->msh, rank, &copt, err, sizeof err);
    if (!t->cw) {
        log_error("%s", err);
        goto fail;
    }
    t->g_world = comm_get(t->cw, MESH_G_WORLD);
    t->g_loss = comm_get(t->cw, MESH_G_LOSS);

    /* ---- the model for this rank's layout, without storage: FSDP provides it ---- */
    llama3_flavor(c->model.flavor, &t->args);
    if (c->model.n_layers > 0) t->args.n_layers = (int)c->model.n_layers;
    t->B = (int)c->training.local_batch_size;
    t->T = (int)c->training.seq_len;
    t->VB = (int)c->validation.local_batch_size;
    t->VT = (int)c->validation.seq_len;
    int max_t = t->T;
    if (c->validation.enable && t->VT > max_t) max_t = t->VT;
    llama3_layout layout = llama3_layout_full(&t->args);
    {
        int coord[MESH_NDIMS];
        mesh_coords(&t->msh, rank, coord);
        layout.tp_rank = coord[MESH_TP];
        layout.tp_size = t->msh.size[MESH_TP];
    }
    if (llama3_model_init_layout(&t->model, &t->args, &layout, dry ? LLAMA3_STORAGE_NONE : LLAMA3_STORAGE_EXTERNAL,
                                 max_t, ops, err, sizeof err) ||
        (t->mixed && llama3_model_set_compute_dtype(&t->model, TETRA_BF16, err, sizeof err))) {
        log_error("model: %s", err);
        if (t->model.params) t->model_ready = 1;
        goto fail;
    }
    t->model_ready = 1;
    /* the groups the layout computes over (degree 1: none) */
    t->model.ctx.tp = t->msh.size[MESH_TP] > 1 ? comm_get(t->cw, MESH_G_TP) : NULL;
    t->model.ctx.cp = t->msh.size[MESH_CP] > 1 ? comm_get(t->cw, MESH_G_CP) : NULL;
    t->model.tp_gather_logits = c->parallelism.disable_loss_parallel;
    t->model.tp_async = c->parallelism.enable_async_tensor_parallel;
    t->n_params = (double)llama3_num_params(&t->args);
    t->flops_per_token = llama3_flops_per_token(&t->args, t->T);

    /* ---- FSDP / HSDP / DDP over the model's units ---- */
    llama3_model *m = &t->model;
    t->decl = calloc((size_t)m->n_params, sizeof *t->decl);
    if (!t->decl) {
        log_error("out of host memory");
        goto fail;
    }
    for (int i = 0; i < m->n_params; i++) {
        const llama3_param *p = &m->params[i];
        dt_param_decl *d = &t->decl[i];
        d->name = p->name;
        d->unit = p->unit;
        d->ndim = p->ndim;
        for (int j = 0; j < p->ndim; j++) {
            d->shape[j] = p->shape[j];
            d->box_start[j] = p->box_start[j];
            d->box_shape[j] = p->box_shape[j];
        }
        d->numel = p->numel;
        d->offset = p->offset;
        d->replicated = p->tp_replicated;
    }
    fsdp_config fc;
    memset(&fc, 0, sizeof fc);
    fc.ops = ops;
    fc.shard = comm_get(t->cw, MESH_G_FSDP);
    fc.replicate = comm_get(t->cw, MESH_G_DP_REPLICATE);
    fc.tp = t->model.ctx.tp;
    fsdp_parse_reshard(c->parallelism.fsdp_reshard_after_forward, &fc.reshard);
    fc.pipeline_parallel = dims->pp > 1;
    fc.reduce_at_last_microbatch = dims->pp > 1;
    fc.compute_dtype = m->compute_dtype;
    fc.n_units = m->n_units;
    fc.unit_offset = m->unit_offset;
    fc.unit_numel = m->unit_numel;
    fc.n_params = m->n_params;
    fc.params_decl = t->decl;
    fc.unit_params = m->unit_params;
    fc.unit_grads = m->unit_grads;
    fc.plan_only = dry;
    t->fs = fsdp_create(&fc, err, sizeof err);
    if (!t->fs) {
        log_error("%s", err);
        goto fail;
    }
    /* the embedding's backward is a scatter: it reads no weights */
    fsdp_set_backward_needs_params(t->fs, llama3_embedding_unit(m), 0);

    /* ---- the step's schedule ---- */
    t->accum = dims->grad_accum_steps;
    t->tok = (size_t)t->B * (size_t)t->T;
    if (train_build_schedule(t, err, sizeof err)) {
        log_error("%s", err);
        goto fail;
    }
    /* ---- activation checkpointing: what each block keeps ---- */
    const int nb = m->layout.layer_end - m->layout.layer_start;
    t->keep = calloc((size_t)(nb > 0 ? nb : 1), sizeof *t->keep);
    if (!t->keep || llama3_ac_policy(m, c->activation_checkpoint.mode, c->activation_checkpoint.selective_ac_option,
                                     t->keep, err, sizeof err)) {
        log_error("%s", t->keep ? err : "out of host memory");
        goto fail;
    }
    for (int i = 0; i < nb; i++) t->n_dropping += t->keep[i] != LLAMA3_KEEP_ALL;
    if (t->n_dropping > 0) {
        /* a block holds a slot from its I pass to its W pass: one when every W follows its I,
         * else every dropping block of each microbatch whose W the schedule defers */
        const int deferred = pp_schedule_max_deferred_w(t->sched);
        t->recompute_slots = deferred > 0 ? deferred * t->n_dropping : 1;
    }
    if (dry) {
        log_plan(t);
        trainer_teardown(t);
        return 0;
    }

    /* ---- which checkpoint (if any) this run starts from ---- */
    char load_path[4096];
    int load_model_only = 0, load_initial = 0;
    int load_found = train_find_checkpoint(t, load_path, sizeof load_path, &load_model_only, &load_initial, err,
                                           sizeof err);
    if (load_found < 0) {
        if (rank == 0) log_error("%s", err);
        goto fail;
    }

    /* Initial weights: each rank draws only its shard (the init is a function of seed,
     * name and element index, so every layout starts from the same model), or reads its
     * pieces of a Hugging Face checkpoint; skipped when a checkpoint's weights replace
     * them below. */
    if (load_found && !train_ckpt_excluded(c, "model")) {
        /* the checkpoint's weights are loaded once the optimizer state exists */
    } else if (c->checkpoint.initial_load_path && c->checkpoint.initial_load_in_hf &&
               !(c->checkpoint.enable && load_found)) {
        hf_ctx hc;
        memset(&hc, 0, sizeof hc);
        hc.m = m;
        hc.rd = llama3_hf_open(&t->args, c->checkpoint.initial_load_path, hc.err, sizeof hc.err);
        int bad = !hc.rd || fsdp_init_shards(t->fs, hf_fill, &hc) != 0;
        llama3_hf_close(hc.rd);
        if (ckpt_agree(bad, hc.err, sizeof hc.err)) {
            log_error("checkpoint.initial_load_path: %s", hc.err);
            goto fail;
        }
        log_info("loaded Hugging Face weights from %s", c->checkpoint.initial_load_path);
    } else {
        init_ctx ic = {m, (uint64_t)c->training.seed};
        if (fsdp_init_shards(t->fs, init_fill, &ic)) {
            log_error("out of host memory initialising the weights");
            goto fail;
        }
    }

    /* ---- data: every rank of the batch group reads its own windows ---- */
    const int dp_rank = comm_group_rank(comm_get(t->cw, MESH_G_BATCH)), dp = dims->dp;
    if (!t->opt.external_batches) {
        if (dl_resolve_dataset(c->training.dataset, c->training.dataset_path, t->data_dir, sizeof t->data_dir, err,
                               sizeof err)) {
            log_error("training.dataset: %s", err);
            goto fail;
        }
        t->train = dl_open(t->data_dir, "train", t->T, t->B, dp_rank, dp, 0, (uint64_t)c->training.seed,
                           (uint32_t)t->args.vocab_size, err, sizeof err);
        if (!t->train) {
            log_error("training data: %s", err);
            goto fail;
        }
        if (c->validation.enable) {
            char vdir[4096];
            const char *vpath = c->validation.dataset_path ? c->validation.dataset_path : c->training.dataset_path;
            if (dl_resolve_dataset(c->validation.dataset, vpath, vdir, sizeof vdir, err, sizeof err)) {
                log_error("validation.dataset: %s", err);
                goto fail;
            }
            dl_config vc = {0};
            vc.seq_len = t->VT;
            vc.local_batch_size = t->VB;
            vc.dp_rank = dp_rank;
            vc.dp_size = dp;
            vc.expected_vocab_size = (uint32_t)t->args.vocab_size;
            vc.single_pass = 1;
            t->val = dl_open_config(vdir, "val", &vc, err, sizeof err);
            if (!t->val) {
                log_error("validation data: %s", err);
                goto fail;
            }
        }
    }

    /* ---- buffers ---- */
    const size_t local_numel = fsdp_local_numel(t->fs);
    t->h_in = malloc(sizeof(int32_t) * t->tok * (size_t)t->accum);
    t->h_lab = malloc(sizeof(int32_t) * t->tok * (size_t)t->accum);
    const size_t vtok = (size_t)t->VB * (size_t)t->VT;
    if (t->val) {
        t->hv_in = malloc(sizeof(int32_t) * vtok);
        t->hv_lab = malloc(sizeof(int32_t) * vtok);
    }
    /* AdamW moments for this rank's shard only, one allocation ("optimizer state") */
    const size_t adam_stride = (local_numel + 15) & ~(size_t)15;
    t->adam_m = ops->alloc(2 * adam_stride * sizeof(float));
    t->adam_v = t->adam_m ? t->adam_m + adam_stride : NULL;
    t->acts = calloc((size_t)t->n_acts, sizeof *t->acts);
    t->acts_mb = malloc((size_t)t->n_acts * sizeof *t->acts_mb);
    if (!t->h_in || !t->h_lab || !t->adam_m || !t->acts || !t->acts_mb || (t->val && (!t->hv_in || !t->hv_lab))) {
        log_error("out of memory allocating training buffers");
        goto fail;
    }
    ops->fill(t->adam_m, 0.0f, local_numel);
    ops->fill(t->adam_v, 0.0f, local_numel);
    t->ws = llama3_workspace_create(m, t->B, t->T, t->n_dropping > 0, t->recompute_slots, err, sizeof err);
    for (int i = 0; t->ws && i < t->n_acts; i++) {
        t->acts_mb[i] = -1;
        t->acts[i] = llama3_acts_create_ws(m, t->ws, t->keep, t->B, t->T, err, sizeof err);
        if (!t->acts[i]) break;
    }
    if (!t->ws || !t->acts[t->n_acts - 1]) {
        log_error("out of memory allocating activations: %s", err);
        goto fail;
    }
    if (t->val) {
        if (t->VB == t->B && t->VT == t->T) {
            t->vacts = t->acts[0];
        } else {
            unsigned *none = keep_none(t);
            t->vws = none ? llama3_workspace_create(m, t->VB, t->VT, 1, 0, err, sizeof err) : NULL;
            t->vacts = t->vws ? llama3_acts_create_ws(m, t->vws, none, t->VB, t->VT, err, sizeof err) : NULL;
            free(none);
            if (!t->vacts) {
                log_error("out of memory allocating validation activations: %s", err);
                goto fail;
            }
        }
    }

    /* ---- checkpoint groups, resume, seed checkpoint ---- */
    const dt_tensor *pieces = fsdp_tensors(t->fs);
    t->groups[G_MODEL] = (ckpt_group){"model/", pieces, m->n_params, fsdp_master(t->fs)};
    t->groups[G_EXP_AVG] = (ckpt_group){"optimizer/exp_avg/", pieces, m->n_params, t->adam_m};
    t->groups[G_EXP_AVG_SQ] = (ckpt_group){"optimizer/exp_avg_sq/", pieces, m->n_params, t->adam_v};
    /* every tensor-parallel rank holds the replicated parameters (the norms): one writes them */
    t->save_tensors = malloc((size_t)m->n_params * sizeof *t->save_tensors);
    if (!t->save_tensors) {
        log_error("out of host memory");
        goto fail;
    }
    memcpy(t->save_tensors, pieces, (size_t)m->n_params * sizeof *t->save_tensors);
    for (int i = 0; i < m->n_params; i++)
        if (t->decl[i].replicated && m->layout.tp_rank != 0) t->save_tensors[i].n_pieces = 0;
    for (int g = 0; g < N_GROUPS; g++) {
        t->save_groups[g] = t->groups[g];
        t->save_groups[g].tensors = t->save_tensors;
    }
    if (load_found) {
        if (train_load_checkpoint(t, load_path, load_model_only, err, sizeof err)) {
            if (rank == 0) log_error("%s", err);
            goto fail;
        }
        if (rank == 0 && load_initial)
            log_info("checkpoint: started from checkpoint.initial_load_path %s%s", load_path,
                     load_model_only ? " (model weights only)" : "");
    }
    int64_t total = c->lr_scheduler.total_steps > 0 ? c->lr_scheduler.total_steps : c->training.steps;
    lr_schedule_init(&t->lrs, total, c->lr_scheduler.warmup_steps, c->lr_scheduler.decay_ratio,
                     c->lr_scheduler.decay_type, c->lr_scheduler.min_lr_factor);
    *out = t;
    return 0;
fail:
    trainer_teardown(t);
    return 1;
}

/* ----------------------------------------------------------------------------
 * the loop */

static void run_validation(trainer *t, int64_t step) {
    double tv = now_s();
    double loss_sum = 0.0;
    int64_t tokens = 0;
    dl_rewind(t->val);
    for (int64_t s = 0; t->c->validation.steps < 0 || s < t->c->validation.steps; s++) {
        if (!dl_next(t->val, t->hv_in, t->hv_lab)) break;
        int64_t nv = 0;
        loss_sum += train_forward_only(t, t->vacts, t->hv_in, t->hv_lab, 0.0f, &nv);
        tokens += nv;
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
    if (isnan(t->peak) || t->peak <= 0) {
        t->peak = measure_peak_flops(ops);
        /* every rank shares the same cores: the slowest probe is the honest one */
        t->peak = comm_all_reduce_f64(t->g_world, t->peak, COMM_MIN);
        t->peak_src = "measured fp32 GEMM";
    }
    log_plan(t);
    log_info("training %lld steps, global batch %lld x %d tokens, dataset %s (%llu tokens, %llu steps/epoch)",
                 (long long)c->training.steps, (long long)t->dims.global_batch_size, t->T, t->data_dir,
                 t->train ? (unsigned long long)dl_num_tokens(t->train) : 0ull,
                 t->train ? (unsigned long long)dl_steps_per_epoch(t->train) / (unsigned long long)t->accum : 0ull);

    if (t->rank == 0 && !t->opt.external_batches) {
        /* metrics_open_at creates the dump folder; a resumed run drops the records an earlier attempt wrote past
         * its checkpoint */
        t->ml = metrics_open_at(c->job.dump_folder, c->metrics.enable_tensorboard, c->metrics.save_tb_folder,
                                !c->metrics.disable_color_printing && isatty(STDOUT_FILENO),
                                t->tc.step > 0 ? t->tc.step + 1 : 0, err, sizeof err);
        if (!t->ml) {
            log_error("metrics: %s", err);
            return 1;
        }
    }

    /* ---- all backend memory is taken now ----
     * On the GPU one warm-up microbatch (forward and backward through FSDP, results
     * discarded: every step starts by zeroing the gradients) lets the backend size its
     * scratch and build its GEMM and attention plans before the freeze; from then on any
     * allocation is an error that names its size and purpose. */
    if (strcmp(ops->name, "cpu") != 0) {
        train_warmup(t);
        if (t->vacts && t->vacts != t->acts[0]) {
            memset(t->hv_in, 0, (size_t)t->VB * (size_t)t->VT * sizeof(int32_t));
            memset(t->hv_lab, 0, (size_t)t->VB * (size_t)t->VT * sizeof(int32_t));
            train_forward_only(t, t->vacts, t->hv_in, t->hv_lab, 0.0f, NULL);
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
        log_info("device memory: %s in %zu allocations taken at start-up; %s free of %s", hb, t->allocs_at_start, fb,
                 tb2);
    } else {
        log_info("backend memory: %s in %zu allocations taken at start-up", hb, t->allocs_at_start);
    }
    return 0;
}

int trainer_run(const tetra_config *cfg, const cfg_parallel_dims *dims, int rank, int world,
                const trainer_options *opt) {
    trainer *t = NULL;
    int rc = trainer_setup(&t, cfg, dims, rank, world, opt);
    if (rc || !t) return rc;
    const tetra_config_values *c = t->c;
    const tetra_ops *ops = t->ops;
    char err[2048];
    rc = prepare_run(t);
    if (rc) {
        trainer_teardown(t);
        return rc == 2 ? 0 : rc;
    }

    double log_t0 = now_s(), log_data = 0.0;
    int64_t log_steps = 0;
    const int64_t first_step = t->tc.step + 1;
    for (int64_t step = first_step; step <= c->training.steps; step++) {
        comm_set_step(t->cw, step);
        if (t->saver && ckpt_in_flight(t->saver)) { /* an async save finishing: publish it, or surface its error */
            int pr = ckpt_poll(t->saver, 0, err, sizeof err);
            if (pr < 0) {
                if (rank == 0) log_error("%s", err);
                rc = 1;
                break;
            }
            if (pr > 0 && rank == 0) train_log_save(t->saver, 1);
        }
        double t_data = now_s();
        for (int a = 0; a < t->accum; a++)
            dl_next(t->train, t->h_in + (size_t)a * t->tok, t->h_lab + (size_t)a * t->tok);
        log_data += now_s() - t_data;

        step_result r;
        train_step(t, &r);
        t->tc.tokens_seen += (int64_t)t->tok * t->accum * t->dims.dp;
        t->tc.step = step;
        log_steps++;
        if (step == first_step) {
            /* as TorchTitan: once every rank has finished a step, the shorter timeout applies */
            comm_barrier(t->g_world, NULL);
            comm_set_phase_training(t->cw);
        }
        if (!isfinite(r.loss)) {
            log_error("step %lld: loss is %f; stopping (lower optimizer.lr or check the data)", (long long)step,
                      r.loss);
            rc = 1;
            break;
        }

        if (step == 1 || step % c->metrics.log_freq == 0 || step == c->training.steps) {
            double dt = (now_s() - log_t0) / (double)log_steps;
            if (t->ml) {
                metrics_step s;
                memset(&s, 0, sizeof s);
                s.step = step;
                s.loss = r.loss;
                s.max_loss = r.max_loss;
                s.grad_norm = r.grad_norm;
                s.lr = r.lr;
                s.tps = (double)t->tok * t->accum / dt;
                s.tflops = t->flops_per_token * s.tps / 1e12;
                s.mfu = 100.0 * t->flops_per_token * s.tps / t->peak;
                s.mem_gib = (double)metrics_peak_rss_bytes() / (1024.0 * 1024 * 1024);
                s.mem_pct = 100.0 * (double)metrics_peak_rss_bytes() / (double)metrics_host_memory_bytes();
                s.step_time_s = dt;
                s.data_time_s = log_data / (double)log_steps;
                s.tokens_seen = t->tc.tokens_seen;
                metrics_log_step(t->ml, &s);
            }
            log_t0 = now_s();
            log_data = 0.0;
            log_steps = 0;
        }
        const int last = step == c->training.steps;
        if (t->saver && !c->checkpoint.load_only &&
            (last || step % c->checkpoint.interval == 0 || (step == 1 && c->checkpoint.enable_first_step_checkpoint))) {
            /* the last save may be model-only in export_dtype, or Hugging Face safetensors; it is
             * written synchronously so the run ends with it complete */
            const int model_only = last && (c->checkpoint.last_save_model_only || c->checkpoint.last_save_in_hf);
            if (train_save_checkpoint(t, step, model_only, last, err, sizeof err)) {
                if (rank == 0) log_error("%s", err);
                rc = 1;
                break;
            }
        }
        if (t->val && (step == 1 || step % c->validation.freq == 0 || step == c->training.steps)) {
            double tv = now_s();
            run_validation(t, step);
            log_t0 += now_s() - tv; /* validation time is not training throughput */
        }
    }
    if (rc == 0 && t->saver && ckpt_in_flight(t->saver)) {
        int pr = ckpt_poll(t->saver, 1, err, sizeof err);
        if (pr < 0) {
            if (rank == 0) log_error("%s", err);
            rc = 1;
        } else if (pr > 0 && rank == 0) {
            train_log_save(t->saver, 1);
        }
    }
    if (rc == 0) {
        char rb[32];
        fmt_bytes(rb, sizeof rb, (double)metrics_peak_rss_bytes());
        fsdp_stats st = fsdp_get_stats(t->fs);
        if (world > 1)
            log_info("communication: %ld all-gathers, %ld reduce-scatters, %ld all-reduces; %.2f s waiting",
                     st.all_gathers, st.reduce_scatters, st.all_reduces, st.wait_s);
        if (t->msh.size[MESH_TP] > 1) {
            tp_stats ts = tp_get_stats();
            log_info("tensor parallel%s: %ld sequence-parallel collectives, %.1f MiB sent; %.2f s waiting",
                     t->model.tp_async ? " (async)" : "", ts.collectives, ts.bytes / (1024.0 * 1024.0), ts.wait_s);
        }
        log_info("training done: %lld steps; peak resident memory %s; %zu backend allocations during training",
                 (long long)c->training.steps, rb, ops->alloc_count() - t->allocs_at_start);
    }
    trainer_teardown(t);
    return rc;
}
