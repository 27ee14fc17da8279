/* trainer_setup.c — a training job from its typed spec: the backend, the mesh, the
 * stages (the model's own parallelization), the schedule and memory plan, the weights,
 * the data, the buffers and the checkpoint groups; and teardown (trainer.h). */

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

/* Was section.key given in the TOML file or on the command line (not a default)? */
static int key_is_set(const tetra_config *cfg, const char *section, const char *key) {
    const cfg_key_desc *d = cfg_find_key(section, key);
    return d && cfg->origin && cfg->origin[d - cfg_keys].kind != CFG_FROM_DEFAULT;
}

/* ----------------------------------------------------------------------------
 * initial weights: every rank fills only its shard, from the counter-based init
 * or from a Hugging Face checkpoint read piece by piece */

typedef struct {
    const model_stage *m;
    uint64_t seed;
} init_ctx;

static int init_fill(void *user, int param, size_t start, size_t count, float *host_out) {
    const init_ctx *c = user;
    c->m->family->init_param_range(c->m, param, c->seed, start, count, host_out);
    return 0;
}

typedef struct {
    const model_stage *m;
    void *rd;
    char err[2048];
} hf_ctx;

static int hf_fill(void *user, int param, size_t start, size_t count, float *host_out) {
    hf_ctx *c = user;
    const model_family *f = c->m->family;
    return f->hf_read(c->rd, f->param_name(c->m, param), start, count, host_out, c->err, sizeof c->err);
}

/* ----------------------------------------------------------------------------
 * setup and teardown */

static void stage_free(const tetra_ops *ops, train_stage *s) {
    const model_family *f = s->model.family;
    if (s->model.impl)
        for (int i = 0; i < s->n_acts && s->acts; i++) f->acts_free(&s->model, s->acts[i]);
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
    if (s->model.impl) f->free(&s->model);
}

void trainer_teardown(trainer *t) {
    if (!t) return;
    const tetra_ops *ops = t->ops;
    if (t->ml) metrics_close(t->ml);
    if (ops && ops->memory_freeze) ops->memory_freeze(0);
    ckpt_saver_free(t->saver);
    for (int i = 0; i < t->n_local && t->st; i++) {
        train_stage *s = &t->st[i];
        if (!s->model.impl) continue;
        if (t->vacts_own && t->vacts && t->vacts[i]) s->model.family->acts_free(&s->model, t->vacts[i]);
        if (t->vws && t->vws[i]) s->model.family->workspace_free(&s->model, t->vws[i]);
    }
    free(t->vacts);
    free(t->vws);
    /* every stage's activations before the workspace they share */
    for (int i = 0; i < t->n_local && t->st; i++) {
        train_stage *st = &t->st[i];
        for (int k = 0; k < st->n_acts && st->acts && st->model.impl; k++) {
            st->model.family->acts_free(&st->model, st->acts[k]);
            st->acts[k] = NULL;
        }
    }
    for (int i = 0; i < t->n_local && t->st; i++)
        if (t->st[i].ws_owner && t->st[i].model.impl)
            t->st[i].model.family->workspace_free(&t->st[i].model, t->st[i].ws);
    for (int i = 0; i < t->n_local && t->st; i++) {
        train_stage *st = &t->st[i];
        for (int k = t->n_conv - 1; k >= 0 && st->conv_state; k--)
            if (t->conv[k]->destroy && st->conv_state[k]) t->conv[k]->destroy(st->conv_state[k]);
        free(st->conv_state);
        stage_free(ops, st);
    }
    /* after every FSDP has waited for its reductions */
    if (t->grad_arena_mem) ops->release(t->grad_arena_mem);
    if (t->step_dev) ops->release(t->step_dev);
    free(t->step_host);
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
    int rank_of[MODEL_MAX_STAGES];
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
    env.tp = st->model.tp;
    env.args = &t->args;
    env.weights_per_use = (env.shard && comm_group_size(env.shard) > 1) || t->opt.weights_per_use;
    env.stands_for_shard = t->opt.weights_per_use;
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
    const model_stage *m = &st->model;
    log_info("model after conversion, stage %d (blocks %d..%d), %d parameters:", st->index, m->block_start,
             m->block_end - 1, m->n_params);
    m->family->describe_params(m, log_param_line, NULL);
}

/* What the model's parallelization reads of the job and of this rank. */
static model_parallel_env parallel_env(const trainer *t, int max_t) {
    const tetra_config_values *c = t->c;
    model_parallel_env env;
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
 * rank's layout (the family's parallelize), converted, under FSDP. Without pipeline
 * parallel: one stage, the whole model. */
static int setup_stages(trainer *t, int max_t, char *err, size_t errlen) {
    const tetra_config_values *c = t->c;
    int coord[MESH_NDIMS];
    mesh_coords(&t->msh, t->rank, coord);
    t->pp_rank = coord[MESH_PP];
    t->pp_size = t->msh.size[MESH_PP];
    const model_family *f = t->args.family;
    const model_pp_spec pp = {t->pp_size, t->job.pp_schedule, (int)c->parallelism.pipeline_parallel_layers_per_stage,
                              (int)c->parallelism.pipeline_parallel_first_stage_less_layers,
                              (int)c->parallelism.pipeline_parallel_last_stage_less_layers};
    int start[MODEL_MAX_STAGES], end[MODEL_MAX_STAGES];
    if (f->pipeline_stages(&t->args, &pp, &t->n_stages, start, end, err, errlen)) return -1;
    if (t->pp_size == 1) {
        t->shape.batch = (int)c->training.local_batch_size;
        t->shape.n_mb = t->shape.accum;
    } else {
        t->shape.batch = (int)c->parallelism.pipeline_parallel_microbatch_size;
        t->shape.n_mb = (int)(c->training.local_batch_size / c->parallelism.pipeline_parallel_microbatch_size);
    }
    t->shape.tokens = (size_t)t->shape.batch * (size_t)t->shape.rows;
    if (find_converters(t, err, errlen) || place_stages(t, pp.kind, err, errlen)) return -1;
    const model_parallel_env env = parallel_env(t, max_t);
    for (int i = 0; i < t->n_local; i++) {
        train_stage *st = &t->st[i];
        model_stage *m = &st->model;
        char why[1024];
        if (f->parallelize(m, &t->args, st->index, t->n_stages, start[st->index], end[st->index], &env, why,
                           sizeof why)) {
            snprintf(err, errlen, "model (stage %d): %s", st->index, why);
            return -1;
        }
        if (convert_stage(t, st, err, errlen)) return -1;
        print_stage(t, st);
        st->fs = f->fully_shard(m, &env, &st->decl, why, sizeof why);
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

    if (c->training.cuda_graph) {
        /* a plan has no device: its table names the backend it stands for */
        const int none = dry ? !strcmp(ops->name, "cpu") : !ops->graph_begin;
        const char *why = none ? "needs the CUDA backend (training.device = \"cuda\"); this run computes on the CPU"
            : t->world > 1 ? "runs on one rank only: a step of several ranks waits for their collectives on the host"
            : c->training.enable_cpu_offload
            ? "does not run with training.enable_cpu_offload: the host's AdamW reads the step's scalars inside the step"
            : NULL;
        if (why) {
            log_error("training.cuda_graph %s (set it to false)", why);
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
    t->g_replicate = dims->dp_replicate > 1 ? comm_get(t->cw, MESH_G_DP_REPLICATE) : NULL;
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
            const int nb = st->model.block_end - st->model.block_start;
            st->keep = calloc((size_t)(nb > 0 ? nb : 1), sizeof *st->keep);
            if (!st->keep ||
                st->model.family->ac_policy(&st->model, c->activation_checkpoint.mode,
                                            c->activation_checkpoint.selective_ac_option, st->keep, err, sizeof err)) {
                log_error("%s", st->keep ? err : "out of host memory");
                free(peak);
                return -1;
            }
            for (int k = 0; k < nb; k++) st->n_dropping += st->keep[k] != st->model.keep_all;
            if (st->n_dropping > 0) st->recompute_slots = open_iw[i] > 0 ? open_iw[i] * st->n_dropping : 1;
            /* without I/W split no forward runs while a block holds its slot: the forward's
             * scratch can be the slot's memory */
            st->fwd_scratch = st->n_dropping == 0 ? 0 : open_iw[i] > 0 ? 1 : MODEL_FWD_SCRATCH_SHARED;
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
        const int fwd = !dropping ? 0 : split ? 1 : MODEL_FWD_SCRATCH_SHARED;
        if (!split) slots = dropping ? 1 : 0;
        size_t largest = 0;
        for (int i = 0; i < t->n_local; i++) {
            const model_stage *m = &t->st[i].model;
            const size_t b = m->family->workspace_bytes(m, t->shape.batch, t->shape.rows, fwd, slots);
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
    /* a head stage keeps each microbatch's loss sum of a step on the device (train_step.c) */
    for (int i = 0; i < t->n_local; i++)
        if (t->st[i].model.has_output) t->loss_cap = (t->pp_size > 1 ? t->shape.accum : 1) * t->shape.n_mb;
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
        const model_family *f = t->args.family;
        hc.rd = f->hf_open(&t->args, c->checkpoint.initial_load_path, hc.err, sizeof hc.err);
        int bad = !hc.rd;
        for (int i = 0; i < t->n_local && !bad; i++) {
            hc.m = &t->st[i].model;
            bad = fsdp_init_shards(t->st[i].fs, hf_fill, &hc) != 0;
        }
        if (hc.rd) f->hf_close(hc.rd);
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
        tcfg.expected_vocab_size = (uint32_t)t->args.family->vocab_size(&t->args);
        t->train = dl_open_mix((const char *const *)mix->items, mix->n, "train", &tcfg, err, sizeof err);
        snprintf(t->data_dir, sizeof t->data_dir, "a mixture of %d sources", mix->n);
    } else {
        if (dl_resolve_dataset(c->training.dataset, c->training.dataset_path, t->data_dir, sizeof t->data_dir, err,
                               sizeof err)) {
            log_error("training.dataset: %s", err);
            return -1;
        }
        t->train = dl_open(t->data_dir, "train", t->shape.seq_len, (int)c->training.local_batch_size, dp_rank, dp, 0,
                           (uint64_t)c->training.seed, (uint32_t)t->args.family->vocab_size(&t->args), err, sizeof err);
    }
    if (!t->train) {
        log_error("training data: %s", err);
        return -1;
    }
    if (t->args.family->needs_documents(&t->args) && !dl_has_documents(t->train)) {
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
    vc.expected_vocab_size = (uint32_t)t->args.family->vocab_size(&t->args);
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
    if (t->args.family->needs_documents(&t->args)) { /* whole sequences' ids; zeros (one document each) until loaded */
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
        model_workspace *ws = wo->model.family->workspace_create(&wo->model, t->shape.batch, t->shape.rows,
                                                                 wo->fwd_scratch, wo->recompute_slots, err, sizeof err);
        if (!ws) {
            log_error("out of memory allocating the workspace: %s", err);
            return -1;
        }
        for (int k = 0; k < t->n_local; k++) t->st[k].ws = ws;
    }
    for (int k = 0; st->ws && k < st->n_acts; k++) {
        st->acts_mb[k] = -1;
        st->acts[k] =
            st->model.family->acts_create(&st->model, st->ws, st->keep, t->shape.batch, t->shape.rows, err, sizeof err);
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
            if (!(st->send_buf[k] = ops->alloc(train_send_bytes(t, st)))) {
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
        const model_family *f = st->model.family;
        unsigned *none = train_keep_none(st);
        t->vws[i] =
            none ? f->workspace_create(&st->model, t->vshape.batch, t->vshape.rows, 1, 0, err, sizeof err) : NULL;
        t->vacts[i] = t->vws[i]
            ? f->acts_create(&st->model, t->vws[i], none, t->vshape.batch, t->vshape.rows, err, sizeof err)
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
    /* the optimizer's state, the head's loss sum of every microbatch of a step and each
     * stage's gradient sum of squares, read in one host wait on the steps that need them */
    const size_t bytes = train_step_scalar_bytes(t);
    t->step_dev = ops->alloc(bytes);
    t->step_host = calloc(1, bytes);
    if (!t->step_dev || !t->step_host) {
        log_error("out of memory allocating the step's scalars");
        return -1;
    }
    t->opt_dev = t->step_dev;
    t->sq_dev = (double *)(t->opt_dev + 1);
    t->loss_dev = (float *)(t->sq_dev + t->n_local);
    t->loss_host = (float *)((char *)t->step_host + ((char *)t->loss_dev - (char *)t->step_dev));
    ops->fill(t->loss_dev, 0.0f, (size_t)(t->loss_cap + t->n_local + 1));
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
        const model_stage *sm = &st->model;
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
            if (st->decl[k].replicated && sm->tp_rank != 0) st->save_tensors[k].n_pieces = 0;
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
    t->n_params = t->args.family->num_params(&t->args);
    t->flops_per_token = t->args.family->flops_per_token(&t->args, t->shape.seq_len);
    if (plan_stages(t)) goto fail;
    if (t->opt.dry_run) {
        if (t->opt.plan_out) train_fill_plan(t, t->opt.plan_out);
        else train_log_plan(t);
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
    if (t->plan_ready) train_memory_snapshot(t, 0, "start-up failed", 1);
    trainer_teardown(t);
    return 1;
}
