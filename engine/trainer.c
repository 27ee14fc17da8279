#include "engine/trainer.h"

#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/loader.h"
#include "engine/log.h"
#include "engine/lr_schedule.h"
#include "engine/metrics.h"
#include "kernels/ops.h"
#include "models/llama3/hf.h"
#include "models/llama3/model.h"
#include "parallel/comm.h"
#include "parallel/fsdp.h"
#include "parallel/mesh.h"

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

static int mkdir_p(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(tmp, 0755);
        *p = '/';
    }
    return (mkdir(tmp, 0755) == 0 || access(tmp, W_OK) == 0) ? 0 : -1;
}

/* The model driven unit by unit, so FSDP can gather each unit's parameters
 * before it runs and reduce its gradients right after (units: 0 embedding,
 * 1..L blocks, L+1 norm + output). With shard degree 1 the FSDP calls do no
 * communication except DDP's gradient all-reduce, and the sequence of model
 * calls is exactly llama3_forward / llama3_backward. */
static double sharded_forward(llama3_model *m, fsdp *fs, llama3_acts *a, const int32_t *in, const int32_t *lab,
                              float dloss_scale, int64_t *n_valid) {
    const int L = m->args.n_layers;
    fsdp_pre_forward(fs, 0);
    llama3_forward_embedding(m, a, in);
    fsdp_post_forward(fs, 0);
    for (int l = 0; l < L; l++) {
        fsdp_pre_forward(fs, l + 1);
        llama3_block_forward(m, a, l);
        fsdp_post_forward(fs, l + 1);
    }
    fsdp_pre_forward(fs, L + 1);
    double loss = llama3_forward_head(m, a, lab, dloss_scale, n_valid);
    fsdp_post_forward(fs, L + 1);
    return loss;
}

static void sharded_backward(llama3_model *m, fsdp *fs, llama3_acts *a, int last_microbatch) {
    const int L = m->args.n_layers;
    fsdp_pre_backward(fs, L + 1);
    llama3_backward_head(m, a);
    fsdp_post_backward(fs, L + 1, last_microbatch);
    for (int l = L - 1; l >= 0; l--) {
        fsdp_pre_backward(fs, l + 1);
        llama3_block_backward_input(m, a, l);
        llama3_block_backward_weight(m, a, l);
        fsdp_post_backward(fs, l + 1, last_microbatch);
    }
    fsdp_pre_backward(fs, 0);
    llama3_backward_embedding(m, a);
    fsdp_post_backward(fs, 0, last_microbatch);
}

typedef struct {
    double loss_sum;     /* summed token losses over the split's batches */
    int64_t tokens;      /* valid tokens */
} val_result;

static val_result run_validation(llama3_model *m, fsdp *fs, llama3_acts *acts, dl_loader *val, int32_t *h_in,
                                 int32_t *h_lab, int64_t max_steps) {
    val_result r = {0.0, 0};
    dl_rewind(val);
    for (int64_t s = 0; max_steps < 0 || s < max_steps; s++) {
        if (!dl_next(val, h_in, h_lab)) break;
        int64_t nv = 0;
        r.loss_sum += sharded_forward(m, fs, acts, h_in, h_lab, 0.0f, &nv);
        r.tokens += nv;
    }
    return r;
}

/* Initial weights of this rank's shard: the same values as the full init. */
typedef struct {
    const llama3_model *m;
    uint64_t seed;
} init_ctx;

static void init_fill(void *user, int param, size_t start, size_t count, float *host_out) {
    const init_ctx *c = user;
    llama3_init_param_range(&c->m->params[param], c->seed, start, count, host_out);
}

int trainer_run(const tetra_config *cfg, const cfg_parallel_dims *dims, int rank, int world) {
    const tetra_config_values *c = &cfg->v;
    char err[2048];
    int rc = 1;

    if (dims->tp > 1 || dims->pp > 1 || dims->cp > 1) {
        log_error("parallelism: tensor, pipeline and context parallel degrees must be 1 in this version "
                  "(got tp %d, pp %d, cp %d); data parallel (FSDP, HSDP, DDP) is supported",
                  dims->tp, dims->pp, dims->cp);
        return 1;
    }
    if (c->model.converters.n > 0) {
        log_error("%s: model.converters = [\"%s\"]: the Float8 converter is not available in this version",
                  cfg->file ? cfg->file : "command line", c->model.converters.items[0]);
        return 1;
    }
    if (c->checkpoint.enable || c->checkpoint.create_seed_checkpoint) {
        log_error("checkpoint.enable / create_seed_checkpoint: sharded checkpoints are not available in this "
                  "version; set checkpoint.enable = false");
        return 1;
    }
    if (c->checkpoint.initial_load_path && !c->checkpoint.initial_load_in_hf) {
        log_error("checkpoint.initial_load_path '%s': only Hugging Face safetensors can be loaded in this version "
                  "(set checkpoint.initial_load_in_hf = true)", c->checkpoint.initial_load_path);
        return 1;
    }
    fsdp_reshard_mode reshard;
    if (fsdp_parse_reshard(c->parallelism.fsdp_reshard_after_forward, &reshard)) {
        log_error("parallelism.fsdp_reshard_after_forward: \"%s\" is not one of default, always, never",
                  c->parallelism.fsdp_reshard_after_forward);
        return 1;
    }

    /* ---- threads and backend ---- */
    int threads = (int)c->training.threads;
    if (threads <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = (int)(cores / local_ranks());
        if (threads < 1) threads = 1;
    }
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    const tetra_ops *ops = ops_get(c->training.device, err, sizeof err);
    if (!ops) {
        log_error("training.device: %s", err);
        return 1;
    }

    /* ---- mesh and process groups ---- */
    mesh msh;
    if (mesh_init(&msh, world, dims->pp, dims->dp_replicate, dims->dp_shard, dims->cp, dims->tp, err, sizeof err)) {
        log_error("parallelism: %s", err);
        return 1;
    }
    comm_options copt;
    memset(&copt, 0, sizeof copt);
    copt.backend = COMM_BACKEND_MPI;
    if (!strcmp(ops->name, "cuda") && world > 1) {
        if (!comm_backend_available(COMM_BACKEND_NCCL)) {
            log_error("training.device = cuda with %d ranks needs the NCCL backend, which this build lacks "
                      "(build with libnccl, see docs/parallelism.md)", world);
            return 1;
        }
        copt.backend = COMM_BACKEND_NCCL;
    }
    copt.init_timeout_s = (double)c->comm.init_timeout_seconds;
    copt.train_timeout_s = (double)c->comm.train_timeout_seconds;
    copt.cuda_device = -1;
    comm_world *cw = comm_world_create(&msh, rank, &copt, err, sizeof err);
    if (!cw) {
        log_error("%s", err);
        return 1;
    }
    comm_group *g_world = comm_get(cw, MESH_G_WORLD), *g_loss = comm_get(cw, MESH_G_LOSS);

    /* ---- model ---- */
    llama3_args args;
    llama3_flavor(c->model.flavor, &args);
    const int B = (int)c->training.local_batch_size, T = (int)c->training.seq_len;
    int max_t = T;
    if (c->validation.enable && c->validation.seq_len > max_t) max_t = (int)c->validation.seq_len;
    llama3_model model;
    if (llama3_model_init(&model, &args, max_t, ops, err, sizeof err)) {
        log_error("model: %s", err);
        comm_world_free(cw);
        return 1;
    }

    /* ---- FSDP / HSDP / DDP over the model's units ---- */
    dt_param_decl *decl = calloc((size_t)model.n_params, sizeof *decl);
    if (!decl) {
        log_error("out of host memory");
        llama3_model_free(&model);
        comm_world_free(cw);
        return 1;
    }
    for (int i = 0; i < model.n_params; i++) {
        const llama3_param *p = &model.params[i];
        decl[i].name = p->name;
        decl[i].unit = p->unit;
        decl[i].ndim = p->ndim;
        decl[i].shape[0] = p->shape[0];
        decl[i].shape[1] = p->shape[1];
        decl[i].numel = p->numel;
        decl[i].offset = p->offset;
    }
    fsdp_config fc;
    memset(&fc, 0, sizeof fc);
    fc.ops = ops;
    fc.shard = comm_get(cw, MESH_G_FSDP);
    fc.replicate = comm_get(cw, MESH_G_DP_REPLICATE);
    fc.reshard = reshard;
    fc.pipeline_parallel = dims->pp > 1;
    fc.params = model.param_mem;
    fc.grads = model.grad_mem;
    fc.total_numel = model.total_numel;
    fc.n_units = model.n_units;
    fc.unit_offset = model.unit_offset;
    fc.unit_numel = model.unit_numel;
    fc.n_params = model.n_params;
    fc.params_decl = decl;
    fsdp *fs = fsdp_create(&fc, err, sizeof err);
    if (!fs) {
        log_error("%s", err);
        free(decl);
        llama3_model_free(&model);
        comm_world_free(cw);
        return 1;
    }
    fsdp_set_backward_needs_params(fs, 0, 0); /* the embedding's backward is a scatter: no weights read */

    /* Initial weights: each rank draws only its shard (the init is a function of
     * seed, name and element index, so every layout starts from the same model),
     * or loads the whole HF checkpoint and keeps its shard. */
    if (c->checkpoint.initial_load_path) {
        if (llama3_load_hf(&model, c->checkpoint.initial_load_path, err, sizeof err)) {
            log_error("checkpoint.initial_load_path: %s", err);
            fsdp_free(fs);
            free(decl);
            llama3_model_free(&model);
            comm_world_free(cw);
            return 1;
        }
        fsdp_shard_from_unsharded(fs);
        log_info("loaded Hugging Face weights from %s", c->checkpoint.initial_load_path);
    } else {
        init_ctx ic = {&model, (uint64_t)c->training.seed};
        if (fsdp_init_shards(fs, init_fill, &ic)) {
            log_error("out of host memory initialising the weights");
            fsdp_free(fs);
            free(decl);
            llama3_model_free(&model);
            comm_world_free(cw);
            return 1;
        }
    }

    /* ---- data: every rank of the batch group reads its own windows ---- */
    char data_dir[4096];
    if (dl_resolve_dataset(c->training.dataset, c->training.dataset_path, data_dir, sizeof data_dir, err,
                           sizeof err)) {
        log_error("training.dataset: %s", err);
        fsdp_free(fs);
        free(decl);
        llama3_model_free(&model);
        comm_world_free(cw);
        return 1;
    }
    const int dp_rank = comm_group_rank(comm_get(cw, MESH_G_BATCH)), dp = dims->dp;
    dl_loader *train = dl_open(data_dir, "train", T, B, dp_rank, dp, 0, (uint64_t)c->training.seed,
                               (uint32_t)args.vocab_size, err, sizeof err);
    if (!train) {
        log_error("training data: %s", err);
        fsdp_free(fs);
        free(decl);
        llama3_model_free(&model);
        comm_world_free(cw);
        return 1;
    }
    dl_loader *val = NULL;
    int VB = (int)c->validation.local_batch_size, VT = (int)c->validation.seq_len;
    if (c->validation.enable) {
        char vdir[4096];
        const char *vpath = c->validation.dataset_path ? c->validation.dataset_path : c->training.dataset_path;
        if (dl_resolve_dataset(c->validation.dataset, vpath, vdir, sizeof vdir, err, sizeof err)) {
            log_error("validation.dataset: %s", err);
            goto out_loader;
        }
        dl_config vc = {0};
        vc.seq_len = VT;
        vc.local_batch_size = VB;
        vc.dp_rank = dp_rank;
        vc.dp_size = dp;
        vc.expected_vocab_size = (uint32_t)args.vocab_size;
        vc.single_pass = 1;
        val = dl_open_config(vdir, "val", &vc, err, sizeof err);
        if (!val) {
            log_error("validation data: %s", err);
            goto out_loader;
        }
    }

    /* ---- buffers ---- */
    const int accum = dims->grad_accum_steps;
    const size_t tok = (size_t)B * T;
    const size_t local_numel = fsdp_local_numel(fs);
    int32_t *h_in = malloc(sizeof(int32_t) * tok * (size_t)accum);
    int32_t *h_lab = malloc(sizeof(int32_t) * tok * (size_t)accum);
    size_t vtok = (size_t)VB * VT;
    int32_t *hv_in = val ? malloc(sizeof(int32_t) * vtok) : NULL, *hv_lab = val ? malloc(sizeof(int32_t) * vtok) : NULL;
    /* AdamW moments for this rank's shard only */
    float *adam_m = ops->alloc(local_numel * sizeof(float));
    float *adam_v = ops->alloc(local_numel * sizeof(float));
    llama3_acts *acts = llama3_acts_create(&model, B, T, err, sizeof err);
    llama3_acts *vacts = NULL;
    if (acts && val) vacts = (VB == B && VT == T) ? acts : llama3_acts_create(&model, VB, VT, err, sizeof err);
    if (!h_in || !h_lab || !adam_m || !adam_v || !acts || (val && !vacts) || (val && (!hv_in || !hv_lab))) {
        log_error("out of memory allocating training buffers%s%s", acts ? "" : ": ", acts ? "" : err);
        goto out_buffers;
    }
    ops->fill(adam_m, 0.0f, local_numel);
    ops->fill(adam_v, 0.0f, local_numel);

    /* ---- what this run is ---- */
    double n_params = (double)llama3_num_params(&args);
    double flops_per_token = llama3_flops_per_token(&args, T);
    double peak = c->metrics.peak_flops;
    const char *peak_src = "metrics.peak_flops";
    if (isnan(peak) || peak <= 0) {
        peak = measure_peak_flops(ops);
        /* every rank shares the same cores: the slowest probe is the honest one */
        peak = comm_all_reduce_f64(g_world, peak, COMM_MIN);
        peak_src = "measured fp32 GEMM";
    }
    {
        const int S = fsdp_shard_degree(fs), R = fsdp_replicate_degree(fs);
        const char *mode = world == 1 ? "single rank"
                           : S == 1   ? "DDP (replicated)"
                           : R == 1   ? "FSDP (sharded)"
                                      : "HSDP (sharded x replicated)";
        char mdesc[160];
        mesh_describe(&msh, mdesc, sizeof mdesc);
        log_info("model %s %s: %.3fM parameters, %.3g FLOPs/token at seq_len %d", c->model.name, c->model.flavor,
                 n_params / 1e6, flops_per_token, T);
        log_info("backend %s, %d threads per rank; %s: %s, comm %s; gradient accumulation %d; "
                 "peak %.1f GFLOP/s per rank (%s)",
                 ops->name, threads, mdesc, mode, comm_backend_name(copt.backend), accum, peak / 1e9, peak_src);
        fsdp_memory mr = fsdp_memory_report(fs);
        char pb[32], gb[32], ob[32], ab[32], tb[32], ub[32];
        fmt_bytes(pb, sizeof pb, (double)mr.param_bytes);
        fmt_bytes(gb, sizeof gb, (double)mr.grad_bytes);
        fmt_bytes(ob, sizeof ob, (double)mr.optim_bytes);
        fmt_bytes(ab, sizeof ab, (double)llama3_acts_bytes(&model, B, T));
        fmt_bytes(tb, sizeof tb, (double)(mr.gather_bytes + mr.reduce_bytes));
        fmt_bytes(ub, sizeof ub, (double)mr.unsharded_bytes);
        if (S > 1)
            log_info("memory rank %d (shard %d of %d, fp32): parameters %s, gradients %s, optimizer state %s "
                     "persistent; transient: gathered units %s (all-gather + reduce-scatter staging), unsharded "
                     "working buffers %s; activations %s",
                     rank, comm_group_rank(fc.shard), S, pb, gb, ob, tb, ub, ab);
        else
            log_info("memory rank %d (fp32): parameters %s, gradients %s, optimizer state %s, activations %s", rank,
                     pb, gb, ob, ab);
        if (S > 1)
            log_info("fsdp: %d units sharded over %s (%d ranks), reshard_after_forward = %s%s", model.n_units,
                     comm_group_name(fc.shard), S, c->parallelism.fsdp_reshard_after_forward,
                     R > 1 ? ", gradients all-reduced over dp_replicate" : "");
        if (strcmp(c->activation_checkpoint.mode, "none") != 0)
            log_warn("activation_checkpoint.mode = \"%s\": activations are kept in full in this version "
                     "(no recomputation)", c->activation_checkpoint.mode);
        log_info("training %lld steps, global batch %lld x %d tokens, dataset %s (%llu tokens, %llu steps/epoch)",
                 (long long)c->training.steps, (long long)dims->global_batch_size, T, data_dir,
                 (unsigned long long)dl_num_tokens(train), (unsigned long long)dl_steps_per_epoch(train) / accum);
    }

    metrics_logger *ml = NULL;
    if (rank == 0) {
        mkdir_p(c->job.dump_folder);
        ml = metrics_open(c->job.dump_folder, c->metrics.enable_tensorboard, c->metrics.save_tb_folder,
                          !c->metrics.disable_color_printing && isatty(STDOUT_FILENO), err, sizeof err);
        if (!ml) {
            log_error("metrics: %s", err);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }

    lr_schedule sched;
    int64_t total = c->lr_scheduler.total_steps > 0 ? c->lr_scheduler.total_steps : c->training.steps;
    lr_schedule_init(&sched, total, c->lr_scheduler.warmup_steps, c->lr_scheduler.decay_ratio,
                     c->lr_scheduler.decay_type, c->lr_scheduler.min_lr_factor);

    double log_t0 = now_s(), log_data = 0.0;
    int64_t log_steps = 0, tokens_seen = 0;
    rc = 0;
    for (int64_t step = 1; step <= c->training.steps; step++) {
        comm_set_step(cw, step);
        double t_data = now_s();
        int64_t local_valid = 0;
        for (int a = 0; a < accum; a++) {
            int32_t *in = h_in + (size_t)a * tok, *lab = h_lab + (size_t)a * tok;
            dl_next(train, in, lab);
            for (size_t i = 0; i < tok; i++) local_valid += lab[i] != OPS_IGNORE_INDEX;
        }
        log_data += now_s() - t_data;
        /* the loss is the sum over every valid token of the global batch divided by their
         * global count, so each rank's gradient is already its share of the global mean */
        int64_t global_valid = comm_all_reduce_i64(g_loss, local_valid, COMM_SUM);
        float dloss_scale = global_valid > 0 ? (float)(1.0 / (double)global_valid) : 0.0f;

        fsdp_begin_step(fs);
        double loss_sum = 0.0;
        for (int a = 0; a < accum; a++) {
            int64_t nv = 0;
            loss_sum += sharded_forward(&model, fs, acts, h_in + (size_t)a * tok, h_lab + (size_t)a * tok,
                                        dloss_scale, &nv);
            sharded_backward(&model, fs, acts, a == accum - 1);
        }
        fsdp_finish_grads(fs);
        double grad_norm = sqrt(fsdp_grad_sq_norm(fs));
        /* torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), clamped to 1 */
        float clip = (float)(c->training.max_norm / (grad_norm + 1e-6));
        if (clip > 1.0f) clip = 1.0f;
        double lr = c->optimizer.lr * lr_factor(&sched, step - 1);
        ops->adamw_step(fsdp_master(fs), adam_m, adam_v, fsdp_grad(fs), local_numel, lr, c->optimizer.beta1,
                        c->optimizer.beta2, c->optimizer.eps, c->optimizer.weight_decay, (int)step, clip);
        ops->synchronize();
        fsdp_params_updated(fs);

        double local_avg = local_valid > 0 ? loss_sum / (double)local_valid : 0.0;
        double global_sum = comm_all_reduce_f64(g_loss, loss_sum, COMM_SUM);
        double max_loss = comm_all_reduce_f64(g_loss, local_avg, COMM_MAX);
        double loss = global_valid > 0 ? global_sum / (double)global_valid : 0.0;
        tokens_seen += (int64_t)tok * accum * dp;
        log_steps++;
        if (step == 1) {
            /* as TorchTitan: once every rank has finished a step, the shorter timeout applies */
            comm_barrier(g_world, NULL);
            comm_set_phase_training(cw);
        }
        if (!isfinite(loss)) {
            log_error("step %lld: loss is %f; stopping (lower optimizer.lr or check the data)", (long long)step,
                      loss);
            rc = 1;
            break;
        }

        if (step == 1 || step % c->metrics.log_freq == 0 || step == c->training.steps) {
            double dt = (now_s() - log_t0) / (double)log_steps;
            if (ml) {
                metrics_step s;
                memset(&s, 0, sizeof s);
                s.step = step;
                s.loss = loss;
                s.max_loss = max_loss;
                s.grad_norm = grad_norm;
                s.lr = lr;
                s.tps = (double)tok * accum / dt;
                s.tflops = flops_per_token * s.tps / 1e12;
                s.mfu = 100.0 * flops_per_token * s.tps / peak;
                s.mem_gib = (double)metrics_peak_rss_bytes() / (1024.0 * 1024 * 1024);
                s.mem_pct = 100.0 * (double)metrics_peak_rss_bytes() / (double)metrics_host_memory_bytes();
                s.step_time_s = dt;
                s.data_time_s = log_data / (double)log_steps;
                s.tokens_seen = tokens_seen;
                metrics_log_step(ml, &s);
            }
            log_t0 = now_s();
            log_data = 0.0;
            log_steps = 0;
        }
        if (val && (step == 1 || step % c->validation.freq == 0 || step == c->training.steps)) {
            double tv = now_s();
            val_result vr = run_validation(&model, fs, vacts, val, hv_in, hv_lab, c->validation.steps);
            double vsum = comm_all_reduce_f64(g_loss, vr.loss_sum, COMM_SUM);
            double vtokens = comm_all_reduce_f64(g_loss, (double)vr.tokens, COMM_SUM);
            if (ml && vtokens > 0) metrics_log_validation(ml, step, vsum / vtokens, now_s() - tv);
            log_t0 += now_s() - tv; /* validation time is not training throughput */
        }
    }
    if (rc == 0) {
        char rb[32];
        fmt_bytes(rb, sizeof rb, (double)metrics_peak_rss_bytes());
        fsdp_stats st = fsdp_get_stats(fs);
        if (world > 1)
            log_info("communication: %ld all-gathers, %ld reduce-scatters, %ld all-reduces; %.2f s waiting",
                     st.all_gathers, st.reduce_scatters, st.all_reduces, st.wait_s);
        log_info("training done: %lld steps; peak resident memory %s", (long long)c->training.steps, rb);
    }
    if (ml) metrics_close(ml);

out_buffers:
    if (vacts && vacts != acts) llama3_acts_free(&model, vacts);
    if (acts) llama3_acts_free(&model, acts);
    free(h_in);
    free(h_lab);
    free(hv_in);
    free(hv_lab);
    if (adam_m) ops->release(adam_m);
    if (adam_v) ops->release(adam_v);
out_loader:
    if (val) dl_close(val);
    dl_close(train);
    fsdp_free(fs);
    free(decl);
    llama3_model_free(&model);
    comm_world_free(cw);
    return rc;
}
