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

typedef struct {
    double loss_sum;     /* summed token losses over the split's batches */
    int64_t tokens;      /* valid tokens */
} val_result;

static val_result run_validation(llama3_model *m, llama3_acts *acts, dl_loader *val, int32_t *h_in,
                                 int32_t *h_lab, int64_t max_steps) {
    val_result r = {0.0, 0};
    dl_rewind(val);
    for (int64_t s = 0; max_steps < 0 || s < max_steps; s++) {
        if (!dl_next(val, h_in, h_lab)) break;
        int64_t nv = 0;
        r.loss_sum += llama3_forward(m, acts, h_in, h_lab, 0.0f, &nv);
        r.tokens += nv;
    }
    return r;
}

int trainer_run(const tetra_config *cfg, const cfg_parallel_dims *dims, int rank, int world) {
    const tetra_config_values *c = &cfg->v;
    char err[2048];
    int rc = 1;

    if (dims->tp > 1 || dims->pp > 1 || dims->cp > 1) {
        log_error("parallelism: tensor, pipeline and context parallel degrees must be 1 in this version "
                  "(got tp %d, pp %d, cp %d); data parallel (replicate x shard) is supported",
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

    /* ---- model ---- */
    llama3_args args;
    llama3_flavor(c->model.flavor, &args);
    const int B = (int)c->training.local_batch_size, T = (int)c->training.seq_len;
    int max_t = T;
    if (c->validation.enable && c->validation.seq_len > max_t) max_t = (int)c->validation.seq_len;
    llama3_model model;
    if (llama3_model_init(&model, &args, max_t, ops, err, sizeof err)) {
        log_error("model: %s", err);
        return 1;
    }
    llama3_init_weights(&model, (uint64_t)c->training.seed);
    if (c->checkpoint.initial_load_path) {
        if (llama3_load_hf(&model, c->checkpoint.initial_load_path, err, sizeof err)) {
            log_error("checkpoint.initial_load_path: %s", err);
            llama3_model_free(&model);
            return 1;
        }
        log_info("loaded Hugging Face weights from %s", c->checkpoint.initial_load_path);
    }
    /* Replicas start from identical weights even if a rank's init differed. */
    if (world > 1) {
        float *host = malloc(model.total_numel * sizeof(float));
        ops->copy_d2h(host, model.param_mem, model.total_numel * sizeof(float));
        for (size_t off = 0; off < model.total_numel; off += (size_t)1 << 28) {
            size_t cnt = model.total_numel - off < ((size_t)1 << 28) ? model.total_numel - off : ((size_t)1 << 28);
            MPI_Bcast(host + off, (int)cnt, MPI_FLOAT, 0, MPI_COMM_WORLD);
        }
        ops->copy_h2d(model.param_mem, host, model.total_numel * sizeof(float));
        free(host);
    }

    /* ---- data ---- */
    char data_dir[4096];
    if (dl_resolve_dataset(c->training.dataset, c->training.dataset_path, data_dir, sizeof data_dir, err,
                           sizeof err)) {
        log_error("training.dataset: %s", err);
        llama3_model_free(&model);
        return 1;
    }
    const int dp_rank = rank % dims->dp, dp = dims->dp;
    dl_loader *train = dl_open(data_dir, "train", T, B, dp_rank, dp, 0, (uint64_t)c->training.seed,
                               (uint32_t)args.vocab_size, err, sizeof err);
    if (!train) {
        log_error("training data: %s", err);
        llama3_model_free(&model);
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
    int32_t *h_in = malloc(sizeof(int32_t) * tok * (size_t)accum);
    int32_t *h_lab = malloc(sizeof(int32_t) * tok * (size_t)accum);
    size_t vtok = (size_t)VB * VT;
    int32_t *hv_in = val ? malloc(sizeof(int32_t) * vtok) : NULL, *hv_lab = val ? malloc(sizeof(int32_t) * vtok) : NULL;
    float *adam_m = ops->alloc(model.total_numel * sizeof(float));
    float *adam_v = ops->alloc(model.total_numel * sizeof(float));
    float *scalar = ops->alloc(sizeof(float));
    llama3_acts *acts = llama3_acts_create(&model, B, T, err, sizeof err);
    llama3_acts *vacts = NULL;
    if (acts && val) vacts = (VB == B && VT == T) ? acts : llama3_acts_create(&model, VB, VT, err, sizeof err);
    float *grad_host = world > 1 ? malloc(model.total_numel * sizeof(float)) : NULL;
    if (!h_in || !h_lab || !adam_m || !adam_v || !scalar || !acts || (val && !vacts) ||
        (val && (!hv_in || !hv_lab)) || (world > 1 && !grad_host)) {
        log_error("out of memory allocating training buffers%s%s", acts ? "" : ": ", acts ? "" : err);
        goto out_buffers;
    }
    ops->fill(adam_m, 0.0f, model.total_numel);
    ops->fill(adam_v, 0.0f, model.total_numel);

    /* ---- what this run is ---- */
    double n_params = (double)llama3_num_params(&args);
    double flops_per_token = llama3_flops_per_token(&args, T);
    double peak = c->metrics.peak_flops;
    const char *peak_src = "metrics.peak_flops";
    if (isnan(peak) || peak <= 0) {
        peak = measure_peak_flops(ops);
        /* every rank shares the same cores: the slowest probe is the honest one */
        MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
        peak_src = "measured fp32 GEMM";
    }
    {
        char pb[32], gb[32], ob[32], ab[32];
        fmt_bytes(pb, sizeof pb, (double)model.total_numel * 4);
        fmt_bytes(gb, sizeof gb, (double)model.total_numel * 4);
        fmt_bytes(ob, sizeof ob, (double)model.total_numel * 8);
        fmt_bytes(ab, sizeof ab, (double)llama3_acts_bytes(&model, B, T));
        log_info("model %s %s: %.3fM parameters, %.3g FLOPs/token at seq_len %d", c->model.name, c->model.flavor,
                 n_params / 1e6, flops_per_token, T);
        log_info("backend %s, %d threads per rank, %d ranks (data parallel %d, gradient accumulation %d); "
                 "peak %.1f GFLOP/s per rank (%s)",
                 ops->name, threads, world, dp, accum, peak / 1e9, peak_src);
        log_info("memory per rank: parameters %s, gradients %s, optimizer state %s, activations %s", pb, gb, ob,
                 ab);
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
        double t_data = now_s();
        int64_t local_valid = 0;
        for (int a = 0; a < accum; a++) {
            int32_t *in = h_in + (size_t)a * tok, *lab = h_lab + (size_t)a * tok;
            dl_next(train, in, lab);
            for (size_t i = 0; i < tok; i++) local_valid += lab[i] != OPS_IGNORE_INDEX;
        }
        log_data += now_s() - t_data;
        int64_t global_valid = local_valid;
        MPI_Allreduce(MPI_IN_PLACE, &global_valid, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        float dloss_scale = global_valid > 0 ? (float)(1.0 / (double)global_valid) : 0.0f;

        llama3_zero_grads(&model);
        double loss_sum = 0.0;
        for (int a = 0; a < accum; a++) {
            int64_t nv = 0;
            loss_sum += llama3_forward(&model, acts, h_in + (size_t)a * tok, h_lab + (size_t)a * tok, dloss_scale,
                                       &nv);
            llama3_backward(&model, acts);
        }
        if (world > 1) {
            /* Each rank's gradient is already scaled by the global token count: summing gives the mean. */
            ops->copy_d2h(grad_host, model.grad_mem, model.total_numel * sizeof(float));
            for (size_t off = 0; off < model.total_numel; off += (size_t)1 << 28) {
                size_t cnt = model.total_numel - off;
                if (cnt > ((size_t)1 << 28)) cnt = (size_t)1 << 28;
                MPI_Allreduce(MPI_IN_PLACE, grad_host + off, (int)cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            }
            ops->copy_h2d(model.grad_mem, grad_host, model.total_numel * sizeof(float));
        }
        float sq = 0.0f;
        ops->fill(scalar, 0.0f, 1);
        ops->sum_squares(scalar, model.grad_mem, model.total_numel);
        ops->copy_d2h(&sq, scalar, sizeof(float));
        double grad_norm = sqrt((double)sq);
        /* torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), clamped to 1 */
        float clip = (float)(c->training.max_norm / (grad_norm + 1e-6));
        if (clip > 1.0f) clip = 1.0f;
        double lr = c->optimizer.lr * lr_factor(&sched, step - 1);
        ops->adamw_step(model.param_mem, adam_m, adam_v, model.grad_mem, model.total_numel, lr,
                        c->optimizer.beta1, c->optimizer.beta2, c->optimizer.eps, c->optimizer.weight_decay,
                        (int)step, clip);
        ops->synchronize();

        double sums[2] = {loss_sum, 0.0};
        double local_avg = local_valid > 0 ? loss_sum / (double)local_valid : 0.0, max_loss = local_avg;
        if (world > 1) {
            MPI_Allreduce(MPI_IN_PLACE, sums, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            MPI_Allreduce(MPI_IN_PLACE, &max_loss, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        }
        double loss = global_valid > 0 ? sums[0] / (double)global_valid : 0.0;
        tokens_seen += (int64_t)tok * accum * dp;
        log_steps++;
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
            val_result vr = run_validation(&model, vacts, val, hv_in, hv_lab, c->validation.steps);
            double vs[2] = {vr.loss_sum, (double)vr.tokens};
            MPI_Allreduce(MPI_IN_PLACE, vs, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            if (ml && vs[1] > 0) metrics_log_validation(ml, step, vs[0] / vs[1], now_s() - tv);
            log_t0 += now_s() - tv; /* validation time is not training throughput */
        }
    }
    if (rc == 0) {
        char rb[32];
        fmt_bytes(rb, sizeof rb, (double)metrics_peak_rss_bytes());
        log_info("training done: %lld steps; peak resident memory %s", (long long)c->training.steps, rb);
    }
    if (ml) metrics_close(ml);

out_buffers:
    if (vacts && vacts != acts) llama3_acts_free(&model, vacts);
    if (acts) llama3_acts_free(&model, acts);
    free(grad_host);
    free(h_in);
    free(h_lab);
    free(hv_in);
    free(hv_lab);
    ops->release(adam_m);
    ops->release(adam_v);
    ops->release(scalar);
out_loader:
    if (val) dl_close(val);
    dl_close(train);
    llama3_model_free(&model);
    return rc;
}
