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

#include "checkpoint/checkpoint.h"
#include "checkpoint/ckpt_hf.h"
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

/* ----------------------------------------------------------------------------
 * checkpoints (checkpoint/checkpoint.h has the protocol, docs/checkpoint.md the
 * user's view). Tensors: "model/<name>" (the fp32 master parameters: on the
 * CPU the parameters are the master weights), "optimizer/exp_avg/<name>" and
 * "optimizer/exp_avg_sq/<name>", each rank's FSDP piece; the rest of the
 * training state is JSON in metadata.json. */

enum { G_MODEL = 0, G_EXP_AVG, G_EXP_AVG_SQ, N_GROUPS };

static int excluded(const tetra_config_values *c, const char *what) {
    for (int i = 0; i < c->checkpoint.exclude_from_loading.n; i++)
        if (!strcmp(c->checkpoint.exclude_from_loading.items[i], what)) return 1;
    return 0;
}

/* <dump_folder>/<folder>; an absolute folder is used as is (as os.path.join). */
static void checkpoint_dir(const tetra_config_values *c, char *out, size_t n) {
    const char *f = c->checkpoint.folder && c->checkpoint.folder[0] ? c->checkpoint.folder : "checkpoint";
    if (f[0] == '/') snprintf(out, n, "%s", f);
    else ck_snprintf(out, n, "%s/%s", c->job.dump_folder && c->job.dump_folder[0] ? c->job.dump_folder : ".", f);
}

static int has_metadata(const char *dir) {
    char p[4200];
    ck_snprintf(p, sizeof p, "%s/metadata.json", dir);
    return access(p, F_OK) == 0;
}

/* Rank 0 looks, every rank learns the answer: 1 = path set, 0 = none, -1 = error. */
static int find_agreed(int rank, const char *dir, int64_t load_step, int newest_only, char *path, size_t n, char *err,
                       size_t errlen) {
    int rc = 0;
    char buf[4096 + 2048], note[2048] = "";
    memset(buf, 0, sizeof buf);
    if (rank == 0) {
        if (newest_only && has_metadata(dir)) { /* a step folder itself */
            ck_snprintf(path, n, "%s", dir);
            rc = 1;
        } else {
            rc = ckpt_find(dir, load_step, path, n, note, sizeof note, err, errlen);
        }
        ck_snprintf(buf, sizeof buf, "%s", rc == 1 ? path : rc < 0 ? err : "");
        if (note[0]) log_info("checkpoint: %s", note);
    }
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Bcast(buf, (int)sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    buf[sizeof buf - 1] = '\0';
    if (rc == 1) ck_snprintf(path, n, "%s", buf);
    if (rc < 0) ck_snprintf(err, errlen, "%s", buf);
    return rc;
}

typedef struct {
    int64_t step;        /* last completed training step */
    int64_t tokens_seen;
    int64_t lr_count;    /* scheduler steps taken (the LambdaLR count) */
    int64_t opt_step;    /* AdamW steps taken (bias correction) */
} train_counters;

static char *hex_encode(const unsigned char *p, size_t n) {
    char *s = malloc(2 * n + 1);
    if (!s) return NULL;
    for (size_t i = 0; i < n; i++) sprintf(s + 2 * i, "%02x", p[i]);
    s[2 * n] = '\0';
    return s;
}

static int hex_decode(const char *s, unsigned char *out, size_t n) {
    if (!s || strlen(s) != 2 * n) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (unsigned char)v;
    }
    return 0;
}

/* The state objects stored next to the tensors (rank 0's are used). */
static json_t *state_json(const tetra_config_values *c, const cfg_parallel_dims *dims, const llama3_args *args,
                          const train_counters *tc, const dl_loader *train, int T, int B, int accum, int model_only) {
    json_t *st = json_object(), *o;
    o = json_object();
    json_object_set_new(o, "step", json_integer(tc->step));
    json_object_set_new(o, "tokens_seen", json_integer(tc->tokens_seen));
    json_object_set_new(st, "train_state", o);
    json_object_set_new(st, "model", ckpt_llama3_model_json(args, T));
    o = json_object();
    json_object_set_new(o, "world", json_integer(dims->world));
    json_object_set_new(o, "pp", json_integer(dims->pp));
    json_object_set_new(o, "dp_replicate", json_integer(dims->dp_replicate));
    json_object_set_new(o, "dp_shard", json_integer(dims->dp_shard));
    json_object_set_new(o, "cp", json_integer(dims->cp));
    json_object_set_new(o, "tp", json_integer(dims->tp));
    json_object_set_new(st, "parallelism", o);
    o = json_object();
    json_object_set_new(o, "seed", json_integer(c->training.seed));
    json_object_set_new(o, "note", json_string("initial weights are a counter-based function of (seed, parameter "
                                               "name, element index) and training draws no random numbers (no "
                                               "dropout, no shuffling RNG state): there is no generator state"));
    json_object_set_new(st, "rng", o);
    o = json_object();
    int64_t bos = dl_bos_id(train), eos = dl_eos_id(train);
    if (bos >= 0) json_object_set_new(o, "bos_id", json_integer(bos));
    if (eos >= 0) json_object_set_new(o, "eos_id", json_integer(eos));
    json_object_set_new(st, "tokenizer", o);
    if (model_only) return st;
    o = json_object();
    json_object_set_new(o, "count", json_integer(tc->lr_count));
    json_object_set_new(o, "warmup_steps", json_integer(c->lr_scheduler.warmup_steps));
    json_object_set_new(o, "total_steps", json_integer(c->lr_scheduler.total_steps > 0 ? c->lr_scheduler.total_steps
                                                                                       : c->training.steps));
    json_object_set_new(o, "decay_type", json_string(c->lr_scheduler.decay_type));
    json_object_set_new(st, "lr_scheduler", o);
    o = json_object();
    json_object_set_new(o, "name", json_string("AdamW"));
    json_object_set_new(o, "step", json_integer(tc->opt_step));
    json_object_set_new(o, "lr", json_real(c->optimizer.lr));
    json_object_set_new(o, "beta1", json_real(c->optimizer.beta1));
    json_object_set_new(o, "beta2", json_real(c->optimizer.beta2));
    json_object_set_new(o, "eps", json_real(c->optimizer.eps));
    json_object_set_new(o, "weight_decay", json_real(c->optimizer.weight_decay));
    json_object_set_new(st, "optimizer", o);
    unsigned char dl[DL_STATE_BYTES];
    o = json_object();
    if (dl_state_save(train, dl, sizeof dl) == 0) {
        char *hex = hex_encode(dl, sizeof dl);
        json_object_set_new(o, "state", json_string(hex ? hex : ""));
        free(hex);
    }
    json_object_set_new(o, "position", json_integer((json_int_t)dl_position(train)));
    json_object_set_new(o, "global_batch_size", json_integer(dims->global_batch_size));
    json_object_set_new(o, "seq_len", json_integer(T));
    json_object_set_new(o, "dp_degree", json_integer(dims->dp));
    json_object_set_new(o, "local_batch_size", json_integer(B));
    json_object_set_new(o, "grad_accum_steps", json_integer(accum));
    json_object_set_new(st, "dataloader", o);
    return st;
}

static int64_t state_int(const ck_meta *m, const char *obj, const char *key, int64_t def) {
    json_t *v = json_object_get(json_object_get(m->state, obj), key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : def;
}

/* Load a checkpoint on every rank (collective). model_only: restore the
 * weights alone (initial_load_model_only, or a model-only checkpoint). */
static int load_checkpoint(const char *path, int model_only, const tetra_config_values *c,
                           const cfg_parallel_dims *dims, const ckpt_group *groups, dl_loader *train,
                           const tetra_ops *ops, int rank, train_counters *tc, char *err, size_t errlen) {
    double t0 = now_s();
    ckpt_reader *r = ckpt_reader_open(path, err, errlen);
    if (ckpt_agree(r == NULL, err, errlen)) {
        ckpt_reader_close(r);
        return -1;
    }
    const ck_meta *m = ckpt_reader_meta(r);
    int rest = !model_only && !m->model_only;
    if (!model_only && m->model_only && rank == 0 && m->step > 0)
        log_warn("checkpoint %s holds model weights only (a final model-only save): the optimizer, LR schedule, "
                 "data position and step start fresh", path);
    int failed = 0;
    if (!excluded(c, "model")) failed = ckpt_reader_load(r, &groups[G_MODEL], ops, err, errlen) != 0;
    if (ckpt_agree(failed, err, errlen)) goto fail;
    if (rest && !excluded(c, "optimizer")) {
        failed = ckpt_reader_load(r, &groups[G_EXP_AVG], ops, err, errlen) != 0 ||
                 ckpt_reader_load(r, &groups[G_EXP_AVG_SQ], ops, err, errlen) != 0;
        if (ckpt_agree(failed, err, errlen)) goto fail;
        tc->opt_step = state_int(m, "optimizer", "step", 0);
    }
    if (rest && !excluded(c, "lr_scheduler")) tc->lr_count = state_int(m, "lr_scheduler", "count", 0);
    if (rest && !excluded(c, "train_state")) {
        tc->step = state_int(m, "train_state", "step", m->step);
        tc->tokens_seen = state_int(m, "train_state", "tokens_seen", 0);
    }
    if (rest && !excluded(c, "dataloader")) {
        json_t *dl = json_object_get(m->state, "dataloader");
        unsigned char buf[DL_STATE_BYTES];
        if (hex_decode(json_string_value(json_object_get(dl, "state")), buf, sizeof buf) != 0) {
            ck_snprintf(err, errlen, "checkpoint %s: the data loader state is missing or malformed", path);
            failed = 1;
        } else if (dl_state_load(train, buf, sizeof buf, err, errlen) != 0) {
            char why[1024];
            ck_snprintf(why, sizeof why, "%s", err);
            ck_snprintf(err, errlen, "checkpoint %s: %s (exclude it with checkpoint.exclude_from_loading = "
                        "[\"dataloader\"] to start the data from the beginning)", path, why);
            failed = 1;
        }
        if (ckpt_agree(failed, err, errlen)) goto fail;
        int64_t g = state_int(m, "dataloader", "global_batch_size", dims->global_batch_size);
        int64_t saved_dp = state_int(m, "dataloader", "dp_degree", dims->dp);
        if (rank == 0 && g != dims->global_batch_size)
            log_warn("data loader: the global batch changed from %" PRId64 " to %lld sequences; the data continues "
                     "at global window %llu, so no window is skipped or repeated, but steps now consume %lld windows",
                     g, (long long)dims->global_batch_size, (unsigned long long)dl_position(train),
                     (long long)dims->global_batch_size);
        else if (rank == 0 && saved_dp != dims->dp)
            log_info("data loader: saved under %" PRId64 " data-parallel ranks, resumed under %d; the position "
                     "(global window %llu) is global, so every step reads the same global batch as before",
                     saved_dp, dims->dp, (unsigned long long)dl_position(train));
    }
    if (rank == 0) {
        uint64_t bytes = 0;
        for (int i = 0; i < m->n_files; i++) bytes += m->files[i].size;
        double dt = now_s() - t0;
        log_info("checkpoint: loaded %s (step %" PRId64 ", %s) in %.2f s: %.1f MiB, %.0f MB/s; saved under world "
                 "%" PRId64 " (dp_replicate %" PRId64 " x dp_shard %" PRId64 "), now world %d (dp_replicate %d x "
                 "dp_shard %d)",
                 path, m->step, rest ? "full state" : "model weights", dt, (double)bytes / (1024.0 * 1024.0),
                 dt > 0 ? (double)bytes / dt / 1e6 : 0.0,
                 state_int(m, "parallelism", "world", -1),
                 state_int(m, "parallelism", "dp_replicate", -1), state_int(m, "parallelism", "dp_shard", -1),
                 dims->world, dims->dp_replicate, dims->dp_shard);
    }
    ckpt_reader_close(r);
    return 0;
fail:
    ckpt_reader_close(r);
    return -1;
}

static void log_save(const ckpt_saver *sv, int async_done) {
    ckpt_save_report rep = ckpt_last_report(sv);
    double mib = (double)rep.total_bytes / (1024.0 * 1024.0);
    if (async_done)
        log_info("checkpoint: step-%" PRId64 " complete (async): %.1f MiB written in %.2f s behind training "
                 "(%.0f MB/s); staging stalled training %.3f s",
                 rep.step, mib, rep.write_s, rep.write_s > 0 ? (double)rep.total_bytes / rep.write_s / 1e6 : 0.0,
                 rep.stage_s);
    else
        log_info("checkpoint: saved step-%" PRId64 ": %.1f MiB in %.2f s (%.0f MB/s written, %.2f s until published)",
                 rep.step, mib, rep.write_s,
                 rep.write_s > 0 ? (double)rep.total_bytes / rep.write_s / 1e6 : 0.0, rep.total_s);
}

/* Was section.key given in the TOML file or on the command line (not a default)? */
static int key_is_set(const tetra_config *cfg, const char *section, const char *key) {
    const cfg_key_desc *d = cfg_find_key(section, key);
    return d && cfg->origin && cfg->origin[d - cfg_keys].kind != CFG_FROM_DEFAULT;
}

int trainer_run(const tetra_config *cfg, const cfg_parallel_dims *dims, int rank, int world) {
    const tetra_config_values *c = &cfg->v;
    char err[2048];
    int rc = 1;
    ckpt_saver *saver = NULL;
    train_counters tc = {0, 0, 0, 0};

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

    ops->set_deterministic((int)c->training.deterministic);

    /* ---- precision ----
     * TorchTitan's default mixed_precision_param = bfloat16 applies on the GPU. The CPU
     * backend computes in fp32 unless the key is set explicitly (bf16 there is for
     * checking the mixed-precision path, not for speed). */
    const int mixed = !strcmp(c->training.mixed_precision_param, "bfloat16") &&
                      (strcmp(ops->name, "cpu") != 0 || key_is_set(cfg, "training", "mixed_precision_param"));
    if (strcmp(c->training.mixed_precision_reduce, "float32") != 0) {
        log_error("training.mixed_precision_reduce = \"%s\": gradients are computed, accumulated and reduced in "
                  "float32 in this version (parameter gradients are fp32 in both precisions); set it to "
                  "\"float32\"", c->training.mixed_precision_reduce);
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
    if (c->model.n_layers > 0) args.n_layers = (int)c->model.n_layers;
    const int B = (int)c->training.local_batch_size, T = (int)c->training.seq_len;
    int max_t = T;
    if (c->validation.enable && c->validation.seq_len > max_t) max_t = (int)c->validation.seq_len;
    llama3_model model;
    if (llama3_model_init(&model, &args, max_t, ops, err, sizeof err) ||
        (mixed && llama3_model_set_compute_dtype(&model, TETRA_BF16, err, sizeof err))) {
        log_error("model: %s", err);
        llama3_model_free(&model);
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
    fc.compute_params = model.param_bf16;
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

    /* ---- which checkpoint (if any) this run starts from ----
     * The run's own newest complete checkpoint (or checkpoint.load_step) when
     * checkpoint.enable; otherwise, or when there is none, initial_load_path
     * (a tetra checkpoint, or Hugging Face safetensors with initial_load_in_hf).
     * Stale step-N.tmp-* folders of runs that died mid-save are removed first. */
    char ckpt_dir[4096], load_path[4096];
    checkpoint_dir(c, ckpt_dir, sizeof ckpt_dir);
    int load_found = 0, load_model_only = 0, load_initial = 0;
    if (c->checkpoint.enable) {
        if (rank == 0) {
            int n = ckpt_cleanup_stale(ckpt_dir);
            if (n > 0)
                log_info("checkpoint: removed %d incomplete save folder%s (step-*.tmp-*) of an earlier run in %s", n,
                         n == 1 ? "" : "s", ckpt_dir);
        }
        load_found = find_agreed(rank, ckpt_dir, c->checkpoint.load_step, 0, load_path, sizeof load_path, err,
                                 sizeof err);
        if (load_found < 0) {
            if (rank == 0) log_error("%s", err);
            fsdp_free(fs);
            free(decl);
            llama3_model_free(&model);
            comm_world_free(cw);
            return 1;
        }
    }
    if (!load_found && c->checkpoint.initial_load_path && !c->checkpoint.initial_load_in_hf) {
        load_found = find_agreed(rank, c->checkpoint.initial_load_path, -1, 1, load_path, sizeof load_path, err,
                                 sizeof err);
        if (load_found <= 0) {
            if (rank == 0)
                log_error("checkpoint.initial_load_path '%s': %s", c->checkpoint.initial_load_path,
                          load_found < 0 ? err : "no complete tetra checkpoint there (for Hugging Face safetensors "
                                                 "set checkpoint.initial_load_in_hf = true)");
            fsdp_free(fs);
            free(decl);
            llama3_model_free(&model);
            comm_world_free(cw);
            return 1;
        }
        load_initial = 1;
        load_model_only = c->checkpoint.initial_load_model_only;
    }

    /* Initial weights: each rank draws only its shard (the init is a function of
     * seed, name and element index, so every layout starts from the same model),
     * or loads the whole HF checkpoint and keeps its shard; skipped when a
     * checkpoint's weights replace them below. */
    if (load_found && !excluded(c, "model")) {
        /* the checkpoint's weights are loaded once the optimizer state exists */
    } else if (c->checkpoint.initial_load_path && c->checkpoint.initial_load_in_hf &&
               !(c->checkpoint.enable && load_found)) {
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
    /* AdamW moments for this rank's shard only, one allocation ("optimizer state") */
    const size_t adam_stride = (local_numel + 15) & ~(size_t)15;
    float *adam_m = ops->alloc(2 * adam_stride * sizeof(float));
    float *adam_v = adam_m ? adam_m + adam_stride : NULL;
    llama3_acts *acts = llama3_acts_create(&model, B, T, err, sizeof err);
    llama3_acts *vacts = NULL;
    if (acts && val) vacts = (VB == B && VT == T) ? acts : llama3_acts_create(&model, VB, VT, err, sizeof err);
    if (!h_in || !h_lab || !adam_m || !adam_v || !acts || (val && !vacts) || (val && (!hv_in || !hv_lab))) {
        log_error("out of memory allocating training buffers%s%s", acts ? "" : ": ", acts ? "" : err);
        goto out_buffers;
    }
    ops->fill(adam_m, 0.0f, local_numel);
    ops->fill(adam_v, 0.0f, local_numel);

    /* ---- checkpoint groups, resume, seed checkpoint ---- */
    const dt_tensor *pieces = fsdp_tensors(fs);
    ckpt_group groups[N_GROUPS] = {
        {"model/", pieces, model.n_params, fsdp_master(fs)},
        {"optimizer/exp_avg/", pieces, model.n_params, adam_m},
        {"optimizer/exp_avg_sq/", pieces, model.n_params, adam_v},
    };
    if (load_found) {
        if (load_checkpoint(load_path, load_model_only, c, dims, groups, train, ops, rank, &tc, err, sizeof err)) {
            if (rank == 0) log_error("%s", err);
            goto out_buffers;
        }
        fsdp_master_changed(fs);
        if (rank == 0 && load_initial)
            log_info("checkpoint: started from checkpoint.initial_load_path %s%s", load_path,
                     load_model_only ? " (model weights only)" : "");
    }
    if (tc.step >= c->training.steps && !c->checkpoint.create_seed_checkpoint) {
        if (rank == 0)
            log_info("checkpoint: resumed at step %lld, which is training.steps = %lld: nothing left to train",
                     (long long)tc.step, (long long)c->training.steps);
        rc = 0;
        goto out_buffers;
    }
    if (c->checkpoint.enable || c->checkpoint.create_seed_checkpoint) {
        ckpt_saver_options so;
        memset(&so, 0, sizeof so);
        so.dir = ckpt_dir;
        so.ops = ops;
        so.rank = rank;
        so.world = world;
        so.writer = comm_group_rank(comm_get(cw, MESH_G_DP_REPLICATE)) == 0; /* one replica writes */
        so.async = strcmp(c->checkpoint.async_mode, "disabled") != 0;
        so.pinned = !strcmp(c->checkpoint.async_mode, "async_with_pinned_mem");
        so.keep_latest_k = (int)c->checkpoint.keep_latest_k;
        saver = ckpt_saver_create(&so, err, sizeof err);
        if (!saver) {
            log_error("%s", err);
            goto out_buffers;
        }
    }
    if (c->checkpoint.create_seed_checkpoint) {
        /* TorchTitan's seed checkpoint: the initial model alone, as step 0 (tetra's init is
         * the same under every layout, so it is a convenience, not a necessity) */
        json_t *st = state_json(c, dims, &args, &tc, train, T, B, accum, 1);
        ckpt_save_request rq;
        memset(&rq, 0, sizeof rq);
        rq.step = 0;
        rq.groups = groups;
        rq.n_groups = 1;
        rq.dtype = TETRA_F32;
        rq.model_only = 1;
        rq.state = st;
        rq.sync = 1;
        int src = ckpt_save(saver, &rq, err, sizeof err);
        json_decref(st);
        if (src) {
            log_error("%s", err);
        } else {
            log_save(saver, 0);
            log_info("checkpoint: seed checkpoint written to %s/step-0; exiting (create_seed_checkpoint)", ckpt_dir);
            rc = 0;
        }
        goto out_buffers;
    }

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
        const char *prec = mixed ? "bf16 compute: bf16 parameter copy and activations, fp32 master weights, "
                                   "gradients and optimizer state"
                                 : "fp32";
        if (mixed) fmt_bytes(pb, sizeof pb, (double)(mr.param_bytes + mr.compute_bytes));
        if (S > 1)
            log_info("memory rank %d (shard %d of %d, %s): parameters %s, gradients %s, optimizer state %s "
                     "persistent; transient: gathered units %s (all-gather + reduce-scatter staging), unsharded "
                     "working buffers %s; activations %s",
                     rank, comm_group_rank(fc.shard), S, prec, pb, gb, ob, tb, ub, ab);
        else
            log_info("memory rank %d (%s): parameters %s, gradients %s, optimizer state %s, activations %s", rank,
                     prec, pb, gb, ob, ab);
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
        /* metrics_open_at creates the dump folder; a resumed run drops the records an earlier attempt wrote past its checkpoint */
        ml = metrics_open_at(c->job.dump_folder, c->metrics.enable_tensorboard, c->metrics.save_tb_folder,
                             !c->metrics.disable_color_printing && isatty(STDOUT_FILENO), tc.step > 0 ? tc.step + 1 : 0,
                             err, sizeof err);
        if (!ml) {
            log_error("metrics: %s", err);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }

    /* ---- all backend memory is taken now ----
     * On the GPU one warm-up microbatch (forward and backward on the model alone, no
     * communication, results discarded: every step starts by zeroing the gradients) lets
     * the backend size its scratch and build its GEMM and attention plans before the
     * freeze; from then on any allocation is an error that names its size and purpose. */
    if (strcmp(ops->name, "cpu") != 0) {
        int32_t *wt = calloc(tok > vtok ? tok : vtok, sizeof(int32_t));
        if (!wt) {
            log_error("out of host memory");
            goto out_metrics;
        }
        llama3_forward(&model, acts, wt, wt, 0.0f, NULL);
        llama3_backward(&model, acts);
        if (vacts && vacts != acts) llama3_forward(&model, vacts, wt, wt, 0.0f, NULL);
        ops->synchronize();
        free(wt);
    }
    ops->memory_freeze(1);
    const size_t allocs_at_start = ops->alloc_count();
    {
        char hb[32];
        fmt_bytes(hb, sizeof hb, (double)ops->allocated_bytes());
        size_t dfree = 0, dtotal = 0;
        ops->device_memory(&dfree, &dtotal);
        if (dtotal > 0) {
            char fb[32], tb2[32];
            fmt_bytes(fb, sizeof fb, (double)dfree);
            fmt_bytes(tb2, sizeof tb2, (double)dtotal);
            log_info("device memory: %s in %zu allocations taken at start-up; %s free of %s", hb, allocs_at_start,
                     fb, tb2);
        } else {
            log_info("backend memory: %s in %zu allocations taken at start-up", hb, allocs_at_start);
        }
    }

    lr_schedule sched;
    int64_t total = c->lr_scheduler.total_steps > 0 ? c->lr_scheduler.total_steps : c->training.steps;
    lr_schedule_init(&sched, total, c->lr_scheduler.warmup_steps, c->lr_scheduler.decay_ratio,
                     c->lr_scheduler.decay_type, c->lr_scheduler.min_lr_factor);

    double log_t0 = now_s(), log_data = 0.0;
    int64_t log_steps = 0;
    const int64_t first_step = tc.step + 1;
    rc = 0;
    for (int64_t step = first_step; step <= c->training.steps; step++) {
        comm_set_step(cw, step);
        if (saver && ckpt_in_flight(saver)) { /* an async save finishing: publish it, or surface its error */
            int pr = ckpt_poll(saver, 0, err, sizeof err);
            if (pr < 0) {
                if (rank == 0) log_error("%s", err);
                rc = 1;
                break;
            }
            if (pr > 0 && rank == 0) log_save(saver, 1);
        }
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
        double lr = c->optimizer.lr * lr_factor(&sched, tc.lr_count);
        tc.lr_count++;
        tc.opt_step++;
        if (mixed) /* fp32 master weights and moments; the bf16 compute copy is written in the same pass */
            ops->adamw_step_bf16(fsdp_master(fs), fsdp_compute_shard(fs), adam_m, adam_v, fsdp_grad(fs), local_numel,
                                 lr, c->optimizer.beta1, c->optimizer.beta2, c->optimizer.eps,
                                 c->optimizer.weight_decay, (int)tc.opt_step, clip);
        else
            ops->adamw_step(fsdp_master(fs), adam_m, adam_v, fsdp_grad(fs), local_numel, lr, c->optimizer.beta1,
                            c->optimizer.beta2, c->optimizer.eps, c->optimizer.weight_decay, (int)tc.opt_step, clip);
        ops->synchronize();
        fsdp_params_updated(fs);

        double local_avg = local_valid > 0 ? loss_sum / (double)local_valid : 0.0;
        double global_sum = comm_all_reduce_f64(g_loss, loss_sum, COMM_SUM);
        double max_loss = comm_all_reduce_f64(g_loss, local_avg, COMM_MAX);
        double loss = global_valid > 0 ? global_sum / (double)global_valid : 0.0;
        tc.tokens_seen += (int64_t)tok * accum * dp;
        tc.step = step;
        log_steps++;
        if (step == first_step) {
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
                s.tokens_seen = tc.tokens_seen;
                metrics_log_step(ml, &s);
            }
            log_t0 = now_s();
            log_data = 0.0;
            log_steps = 0;
        }
        const int last = step == c->training.steps;
        if (saver && !c->checkpoint.load_only &&
            (last || step % c->checkpoint.interval == 0 || (step == 1 && c->checkpoint.enable_first_step_checkpoint))) {
            /* the last save may be model-only in export_dtype, or Hugging Face safetensors; it is
             * written synchronously so the run ends with it complete */
            const int model_only = last && (c->checkpoint.last_save_model_only || c->checkpoint.last_save_in_hf);
            tetra_dtype edt = TETRA_F32;
            ck_dtype_parse(c->checkpoint.export_dtype, &edt);
            json_t *st = state_json(c, dims, &args, &tc, train, T, B, accum, model_only);
            ckpt_save_request rq;
            memset(&rq, 0, sizeof rq);
            rq.step = step;
            rq.groups = groups;
            rq.n_groups = model_only ? 1 : N_GROUPS;
            rq.dtype = model_only && !c->checkpoint.last_save_in_hf ? edt : TETRA_F32;
            rq.model_only = model_only;
            rq.state = st;
            rq.hf = last && c->checkpoint.last_save_in_hf;
            rq.hf_dtype = edt;
            rq.sync = last;
            double ts = now_s();
            int src = 0;
            if (ckpt_in_flight(saver)) { /* at most one save in flight: finish the previous one first */
                int pr = ckpt_poll(saver, 1, err, sizeof err);
                if (pr > 0 && rank == 0) log_save(saver, 1);
                src = pr < 0;
            }
            if (!src) src = ckpt_save(saver, &rq, err, sizeof err);
            json_decref(st);
            if (src) {
                if (rank == 0) log_error("%s", err);
                rc = 1;
                break;
            }
            if (rank == 0) {
                if (ckpt_in_flight(saver))
                    log_info("checkpoint: step %lld staged for an async save in %.3f s (%.3f s in ckpt_save); "
                             "training continues while it is written", (long long)step, ckpt_last_stage_s(saver),
                             now_s() - ts);
                else
                    log_save(saver, 0);
            }
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
    if (rc == 0 && saver && ckpt_in_flight(saver)) {
        int pr = ckpt_poll(saver, 1, err, sizeof err);
        if (pr < 0) {
            if (rank == 0) log_error("%s", err);
            rc = 1;
        } else if (pr > 0 && rank == 0) {
            log_save(saver, 1);
        }
    }
    if (rc == 0) {
        char rb[32];
        fmt_bytes(rb, sizeof rb, (double)metrics_peak_rss_bytes());
        fsdp_stats st = fsdp_get_stats(fs);
        if (world > 1)
            log_info("communication: %ld all-gathers, %ld reduce-scatters, %ld all-reduces; %.2f s waiting",
                     st.all_gathers, st.reduce_scatters, st.all_reduces, st.wait_s);
        log_info("training done: %lld steps; peak resident memory %s; %zu backend allocations during training",
                 (long long)c->training.steps, rb, ops->alloc_count() - allocs_at_start);
    }
out_metrics:
    if (ml) metrics_close(ml);
    ops->memory_freeze(0);

out_buffers:
    ckpt_saver_free(saver);
    if (vacts && vacts != acts) llama3_acts_free(&model, vacts);
    if (acts) llama3_acts_free(&model, acts);
    free(h_in);
    free(h_lab);
    free(hv_in);
    free(hv_lab);
    if (adam_m) ops->release(adam_m);
out_loader:
    if (val) dl_close(val);
    dl_close(train);
    fsdp_free(fs);
    free(decl);
    llama3_model_free(&model);
    comm_world_free(cw);
    return rc;
}
