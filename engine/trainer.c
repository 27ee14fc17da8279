/* trainer.c — the training job's run: the step loop (data, metrics, saves, validation,
 * stop requests) around train_step (train_step.c); setup is trainer_setup.c, the
 * memory plan trainer_plan.c, checkpoint state train_ckpt.c (trainer.h). */

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
#include "models/model.h"
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

/* ----------------------------------------------------------------------------
 * the loop */

/* The visible attention (query, key) pairs of this rank's sequences of the step just
 * loaded: T(T+1)/2 each under the causal mask, the sum over their documents under
 * block_causal (mfu_computed counts the attention the mask leaves). */
static double step_attention_pairs(const trainer *t) {
    const int rows = (int)t->c->training.local_batch_size * t->shape.accum;
    const model_family *f = t->args.family;
    if (!t->batch.doc) return (double)rows * f->attention_pairs(&t->args, NULL, t->shape.seq_len);
    double p = 0.0;
    for (int r = 0; r < rows; r++)
        p += f->attention_pairs(&t->args, t->batch.doc + (size_t)r * t->shape.seq_len, t->shape.seq_len);
    return p;
}

/* The mixture's realised shares so far, a record of metrics.jsonl and TensorBoard
 * scalars (docs/data.md) */
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
    train_log_plan(t);
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
    train_fmt_bytes(hb, sizeof hb, (double)ops->allocated_bytes());
    size_t dfree = 0, dtotal = 0;
    ops->device_memory(&dfree, &dtotal);
    if (dtotal > 0) {
        char fb[32], tb2[32];
        train_fmt_bytes(fb, sizeof fb, (double)dfree);
        train_fmt_bytes(tb2, sizeof tb2, (double)dtotal);
        char nb[96] = "";
        if (comm_world_device_bytes(t->cw) > 0) {
            char nx[32];
            train_fmt_bytes(nx, sizeof nx, (double)comm_world_device_bytes(t->cw));
            snprintf(nb, sizeof nb, "; NCCL communicators %s", nx);
        }
        log_info("device memory: %s (%zu bytes) in %zu allocations taken at start-up%s; %s free of %s", hb,
                 ops->allocated_bytes(), t->allocs_at_start, nb, fb, tb2);
    } else {
        log_info("backend memory: %s (%zu bytes) in %zu allocations taken at start-up", hb, ops->allocated_bytes(),
                 t->allocs_at_start);
    }
    train_memory_snapshot(t, 0, "start-up", 0);
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
    uint64_t wait_mark, waits;  /* host waits (ops.h host_waits) at the step's start, and in the log window */
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
 * until too many in a row. The device decides at every step (ops.h optim_scalars: no
 * update from a stopping step on); the host learns it at the step's read, which on a
 * step that neither logs nor saves comes later. 0 to go on, -1 to stop. */
static int check_nonfinite(trainer *t, int64_t step, const step_result *r) {
    const tetra_config_values *c = t->c;
    if (!r->read || r->new_bad <= 0) return 0;
    const int me = t->rank == 0;
    char when[96] = "";
    if (!r->nonfinite || r->new_bad > 1)
        snprintf(when, sizeof when, " (%lld non-finite step%s since the last read)", (long long)r->new_bad,
                 r->new_bad == 1 ? "" : "s");
    if (strcmp(c->training.on_nonfinite, "skip") != 0) {
        if (me && r->nonfinite && r->first_bad == step)
            log_error("step %lld: loss %g, gradient norm %g; stopping before the update, so the parameters "
                      "and the checkpoints stay finite (lower optimizer.lr or check the data; "
                      "training.on_nonfinite = \"skip\" skips such steps)",
                      (long long)step, r->loss, r->grad_norm);
        else if (me)
            log_error("step %lld: the loss or gradient norm of step %lld was not finite%s; no update was applied "
                      "from it on, so the parameters and the checkpoints stay finite; stopping (lower "
                      "optimizer.lr or check the data; training.on_nonfinite = \"skip\" skips such steps)",
                      (long long)step, (long long)r->first_bad, when);
        return -1;
    }
    if (me && r->nonfinite)
        log_warn("step %lld: loss %g, gradient norm %g: update skipped (training.on_nonfinite = \"skip\")%s",
                 (long long)step, r->loss, r->grad_norm, when);
    else if (me) log_warn("step %lld: updates skipped%s (training.on_nonfinite = \"skip\")", (long long)step, when);
    /* a bad batch passes; step after step of them means the run diverged: every rank
     * agrees (the norm is reduced over them), so every rank stops at the same step */
    if (r->halted) {
        const int64_t k = c->training.max_consecutive_nonfinite_steps;
        if (me)
            log_error("step %lld: %lld non-finite steps in a row were skipped (training.max_consecutive_"
                      "nonfinite_steps = %lld): the run has diverged, stopping; the parameters and the "
                      "checkpoints are those of the last finite update (lower optimizer.lr or check the "
                      "data)",
                      (long long)step, (long long)(r->run > k ? r->run : k), (long long)k);
        return -1;
    }
    return 0;
}

/* The metrics of a log step, averaged over the steps since the last one. */
static void log_step(trainer *t, int64_t step, const step_result *r, run_state *rs) {
    const tetra_config_values *c = t->c;
    t->ops->synchronize(); /* a step ends without waiting for its update: the window's time includes it */
    const double dt = (now_s() - rs->log_t0) / (double)rs->log_steps;
    /* under a document mask every data-parallel rank's sequences have their own pairs:
     * mfu_computed counts those of the global batch */
    comm_group *batch = comm_get(t->cw, MESH_G_BATCH);
    if (t->args.family->needs_documents(&t->args) && comm_group_size(batch) > 1) {
        rs->log_pairs = comm_all_reduce_f64(batch, rs->log_pairs, COMM_SUM);
        rs->log_seqs = comm_all_reduce_f64(batch, rs->log_seqs, COMM_SUM);
    }
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
        const double fpt =
            t->args.family->flops_per_token_pairs(&t->args, rs->log_pairs / rs->log_seqs, t->shape.seq_len);
        s.tflops_computed = fpt * s.tps / 1e12;
        s.mfu_computed = 100.0 * fpt * s.tps / t->peak;
        s.mem_gib = (double)metrics_peak_rss_bytes() / (1024.0 * 1024 * 1024);
        s.mem_pct = 100.0 * (double)metrics_peak_rss_bytes() / (double)metrics_host_memory_bytes();
        s.step_time_s = dt;
        s.data_time_s = rs->log_data / (double)rs->log_steps;
        s.host_waits = (double)rs->waits / (double)rs->log_steps;
        s.tokens_seen = t->tc.tokens_seen;
        metrics_log_step(t->ml, &s);
        if (c->training.dataset_mix.n > 0) log_mix(t, step);
    }
    rs->log_t0 = now_s();
    rs->log_data = 0.0;
    rs->waits = 0;
    rs->log_steps = 0;
    rs->log_pairs = rs->log_seqs = 0.0;
}

/* A checkpoint at its interval, the first step (enable_first_step_checkpoint) and the
 * last; the last may be model-only in export_dtype, or Hugging Face safetensors, and is
 * written synchronously so the run ends with it complete. 0, or -1. */
static int save_due(const trainer *t, int64_t step) {
    const tetra_config_values *c = t->c;
    const int last = step == c->training.steps;
    return t->saver && !c->checkpoint.load_only &&
        (last || step % c->checkpoint.interval == 0 || (step == 1 && c->checkpoint.enable_first_step_checkpoint));
}

static int save_at_interval(trainer *t, int64_t step) {
    const tetra_config_values *c = t->c;
    const int last = step == c->training.steps;
    if (!save_due(t, step)) return 0;
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
static int stop_after(trainer *t, int64_t step, step_result *r) {
    const tetra_config_values *c = t->c;
    const int last = step == c->training.steps;
    const int64_t sig = comm_all_reduce_i64(t->g_world, (int64_t)run_guard_stop_request(t->rank), COMM_MAX);
    run_guard_stop_decided(sig && !last, last ? step : step + 1);
    if (!sig || last) return 0;
    const int saving = t->saver && !c->checkpoint.load_only;
    char err[2048];
    if (!r->read) { /* the checkpoint needs the update count, and a stopping run stops here */
        train_step_read(t, r);
        if (check_nonfinite(t, step, r)) return -1;
    }
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
    rs->wait_mark = t->ops->host_waits();
    if (poll_async_save(t, 0) || load_batch(t, step, rs)) return -1;
    trace_end(t->tr);
    step_result r;
    t->cur_step = step;
    train_step(t, &r);
    if (trace_step_end(t->tr, step, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    if (c->profiling.profile_freq > 0 && step % c->profiling.profile_freq == 0)
        train_memory_snapshot(t, step, "step", 0);
    t->tc.tokens_seen += c->training.local_batch_size * (int64_t)t->shape.seq_len * t->shape.accum * t->job.dims.dp;
    if (step > rs->first_step) add_pp_stats(t, rs);
    t->tc.step = step;
    rs->log_steps++;
    if (step == rs->first_step) {
        /* as TorchTitan: once every rank has finished a step, the shorter timeout applies */
        comm_barrier(t->g_world, NULL);
        comm_set_phase_training(t->cw);
    }
    /* the step's scalars stay on the device unless this step logs or saves */
    const int logs = step == 1 || step % c->metrics.log_freq == 0 || step == c->training.steps;
    if (logs || save_due(t, step)) {
        rs->waits += t->ops->host_waits() - rs->wait_mark;
        rs->wait_mark = UINT64_MAX;
        train_step_read(t, &r);
    }
    if (check_nonfinite(t, step, &r)) return -1;
    if (logs) log_step(t, step, &r, rs);
    if (save_at_interval(t, step)) return -1;
    if (t->val && (step == 1 || step % c->validation.freq == 0 || step == c->training.steps)) {
        const double tv = now_s();
        const uint64_t w = t->ops->host_waits();
        run_validation(t, step);
        rs->log_t0 += now_s() - tv; /* validation time is not training throughput */
        if (rs->wait_mark != UINT64_MAX) rs->wait_mark += t->ops->host_waits() - w; /* nor are its reads */
    }
    const int rc = stop_after(t, step, &r);
    if (rs->wait_mark != UINT64_MAX) rs->waits += t->ops->host_waits() - rs->wait_mark;
    return rc;
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
    train_fmt_bytes(rb, sizeof rb, (double)metrics_peak_rss_bytes());
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
    if (c->training.cuda_graph && t->ops->graph_stats) {
        ops_graph_stats g;
        t->ops->graph_stats(&g);
        log_info("cuda graph: %llu steps launched as one graph each (%llu built, %llu updated in place), %llu nodes "
                 "in the last",
                 (unsigned long long)g.launches, (unsigned long long)g.instantiations, (unsigned long long)g.updates,
                 (unsigned long long)g.nodes);
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
