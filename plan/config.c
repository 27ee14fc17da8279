/* config.c — `tetra plan --job.config_file F --ngpu N`: memory, communication,
 * bubble and step time of a training config (estimate.h), the knobs that make
 * it fit, and `--recommend` (recommend.c). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt_format.h"
#include "config/config.h"
#include "models/llama3/family.h"
#include "plan/plan.h"
#include "plan/internal.h"
#include "plan/calibrate.h"
#include "plan/estimate.h"
#include "plan/hw.h"
#include "plan/ops.h"
#include "util/file.h"
#include "util/host.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static void usage(FILE *f) {
    char profiles[512];
    plan_hw_list(profiles, sizeof profiles);
    fprintf(f,
            "usage: tetra plan --job.config_file FILE [--section.key VALUE ...] --ngpu N [options]\n"
            "       tetra plan --job.config_file FILE --recommend --ngpu N [options]\n"
            "       tetra plan --job.config_file FILE --ops [--block N] [--hardware NAME] [--json]\n"
            "       tetra plan --calibrate [--out FILE]        (under mpirun for the network bandwidth)\n"
            "\n"
            "What a training config costs on N GPUs before it runs: memory per rank (the trainer's own\n"
            "dry-run layout of every pipeline rank), bytes per collective per mesh dimension, pipeline\n"
            "bubble (the schedule simulator), predicted step time, tokens/s/GPU and MFU from a roofline\n"
            "with stated overlap assumptions (docs/plan.md).\n"
            "\n"
            "  --ngpu N              ranks (default: the product of the config's explicit degrees)\n"
            "  --gpus-per-node G     ranks per node (default: the hardware profile's)\n"
            "  --hardware NAME|FILE  hardware profile (configs/hardware: %s; default h100-sxm)\n"
            "  --json                one JSON object instead of the report\n"
            "  --recommend           search layouts (degrees, schedule, microbatches, AC, float8, local\n"
            "                        batch) for this model and N GPUs; print the best that fit\n"
            "  --top K               layouts --recommend prints (default 5)\n"
            "  --ops                 every op one training step issues on the GPU, on one rank: launches,\n"
            "                        bytes, FLOPs and roofline time per op for one block (the middle one,\n"
            "                        or --block N), the head, the embedding and the optimizer; totals per\n"
            "                        phase and step; for float8, what it adds over bf16 (a prediction\n"
            "                        from the trainer's own op sequence; needs no GPU)\n"
            "  --calibrate           measure this machine (GEMM rate, memory and MPI bandwidth) and\n"
            "                        write it as a profile (--out, default outputs/hardware/cpu.toml)\n"
            "\n"
            "Training keys are those of tetra train (tetra train --help). With a GPU profile the plan\n"
            "is for training.device = cuda unless the config says cpu.\n"
            "Exit status: 0; 1 when the config cannot run at this rank count or does not fit; 2 for bad\n"
            "arguments.\n",
            profiles[0] ? profiles : "none found");
}

static int parse_int_opt(const char *opt, const char *s, int lo, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > (1 << 24)) {
        fprintf(stderr, "tetra plan: %s needs an integer >= %d, got '%s'\n", opt, lo, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static void fmt_gib(char *b, size_t n, double bytes) { snprintf(b, n, "%.2f GiB", bytes / GIB); }

static void fmt_bytes_h(char *b, size_t n, double bytes) {
    if (bytes >= GIB) snprintf(b, n, "%.2f GiB", bytes / GIB);
    else if (bytes >= 1024.0 * 1024.0) snprintf(b, n, "%.1f MiB", bytes / (1024.0 * 1024.0));
    else snprintf(b, n, "%.0f KiB", bytes / 1024.0);
}

static void fmt_time(char *b, size_t n, double s) {
    if (s >= 1.0) snprintf(b, n, "%.3f s", s);
    else if (s >= 1e-3) snprintf(b, n, "%.2f ms", s * 1e3);
    else snprintf(b, n, "%.1f us", s * 1e6);
}

static const char *ac_desc(const tetra_config_values *c, char *b, size_t n) {
    if (!strcmp(c->activation_checkpoint.mode, "selective"))
        snprintf(b, n, "selective %s", c->activation_checkpoint.selective_ac_option);
    else snprintf(b, n, "%s", c->activation_checkpoint.mode);
    return b;
}

json_t *plan_result_json(const plan_result *r, const tetra_config *cfg, const plan_hw *hw) {
    const tetra_config_values *c = &cfg->v;
    const trainer_plan *w = &r->rank[r->worst_pp_rank];
    char ac[64];
    json_t *o = json_object();
    json_object_set_new(o, "model", json_sprintf("%s %s", c->model.name, c->model.flavor));
    json_object_set_new(o, "hardware", json_string(hw->name));
    json_object_set_new(o, "ngpu", json_integer(r->ngpu));
    json_object_set_new(o, "gpus_per_node", json_integer(r->gpus_per_node));
    json_object_set_new(o, "layout",
                        json_pack("{s:i,s:i,s:i,s:i,s:i}", "pp", r->job.dims.pp, "dp_replicate",
                                  r->job.dims.dp_replicate, "dp_shard", r->job.dims.dp_shard, "cp", r->job.dims.cp,
                                  "tp", r->job.dims.tp));
    json_object_set_new(o, "local_batch_size", json_integer((json_int_t)c->training.local_batch_size));
    json_object_set_new(o, "seq_len", json_integer((json_int_t)c->training.seq_len));
    json_object_set_new(o, "global_batch_size", json_integer((json_int_t)r->job.dims.global_batch_size));
    json_object_set_new(o, "activation_checkpoint", json_string(ac_desc(c, ac, sizeof ac)));
    json_object_set_new(o, "float8", json_boolean(r->float8));
    if (r->job.dims.pp > 1)
        json_object_set_new(o, "pipeline_schedule", json_string(c->parallelism.pipeline_parallel_schedule));
    json_object_set_new(o, "peak_memory_gib", json_real(r->peak_bytes / GIB));
    json_object_set_new(o, "device_memory_gib", json_real(r->device_bytes / GIB));
    json_object_set_new(o, "fits", json_boolean(r->fits));
    json_object_set_new(o, "step_time_s", json_real(r->step_time_s));
    json_object_set_new(o, "tokens_per_s_per_gpu", json_real(r->tokens_per_s_per_gpu));
    json_object_set_new(o, "mfu", json_real(r->mfu));
    json_object_set_new(o, "mfu_computed", json_real(r->mfu_computed));
    /* pairs as an integer (the expected count rounded): the JSON's reals keep 6 digits */
    json_object_set_new(o, "attention",
                        json_pack("{s:s,s:I,s:s}", "mask", r->block_causal ? "block_causal" : "causal",
                                  "pairs_per_sequence", (json_int_t)llround(r->attn_pairs_per_seq), "source",
                                  r->attn_source));
    json_object_set_new(o, "bubble_fraction", json_real(r->bubble_fraction));
    json_t *mem = json_object();
    json_object_set_new(mem, "pipeline_rank", json_integer(r->worst_pp_rank));
    json_object_set_new(mem, "parameters_gib", json_real(w->param_bytes / GIB));
    json_object_set_new(mem, "gradients_gib", json_real(w->grad_bytes / GIB));
    json_object_set_new(mem, "optimizer_state_gib", json_real(w->optim_bytes / GIB));
    json_object_set_new(mem, "gathered_parameters_gib", json_real(w->work_param_bytes / GIB));
    json_object_set_new(mem, "unsharded_gradients_gib", json_real(w->work_grad_bytes / GIB));
    json_object_set_new(mem, "unsharded_gradient_buffers", json_integer(w->grad_arenas));
    json_object_set_new(mem, "unsharded_gradient_stages", json_integer(w->grad_arena_stages));
    json_object_set_new(mem, "reduce_staging_gib", json_real(w->reduce_bytes / GIB));
    json_object_set_new(mem, "activations_gib", json_real(w->act_bytes / GIB));
    json_object_set_new(mem, "activations_per_microbatch_gib", json_real(w->act_mb_bytes / GIB));
    json_object_set_new(mem, "microbatches_in_flight", json_integer(w->n_acts));
    json_object_set_new(mem, "workspace_gib", json_real(w->workspace_bytes / GIB));
    json_object_set_new(mem, "converters_gib", json_real(w->converter_bytes / GIB));
    json_object_set_new(mem, "nccl_gib", json_real(r->nccl.total_bytes / GIB));
    json_object_set_new(mem, "nccl",
                        json_pack("{s:i,s:f,s:f,s:f,s:f}", "communicators", r->nccl.communicators, "setup_gib",
                                  r->nccl.setup_bytes / GIB, "ring_gib", r->nccl.ring_bytes / GIB, "nvls_gib",
                                  r->nccl.nvls_bytes / GIB, "p2p_gib", r->nccl.p2p_bytes / GIB));
    json_object_set_new(mem, "reserved_gib", json_real(r->reserved_bytes / GIB));
    json_object_set_new(mem, "training_buffers_bytes", json_real(w->total_bytes));
    json_object_set_new(mem, "cpu_offload", json_boolean(w->offload));
    json_object_set_new(mem, "host_gib", json_real(w->host_bytes / GIB));
    json_t *per = json_array();
    for (int p = 0; p < r->job.dims.pp; p++) json_array_append_new(per, json_real(r->rank[p].total_bytes / GIB));
    json_object_set_new(mem, "per_pipeline_rank_gib", per);
    json_object_set_new(o, "memory", mem);
    json_t *comm = json_object();
    for (int i = 0; i < r->n_comm; i++) {
        const plan_comm *q = &r->comm[i];
        json_object_set_new(comm, q->name,
                            json_pack("{s:i,s:s,s:f,s:f,s:f}", "group_size", q->group_size, "link",
                                      q->inter_node ? "inter_node" : "intra_node", "bytes_per_step", q->bytes, "time_s",
                                      q->time_s, "exposed_s", q->exposed_s));
    }
    json_object_set_new(o, "communication", comm);
    json_object_set_new(o, "time",
                        json_pack("{s:f,s:f,s:f,s:f,s:f,s:f}", "compute_s", r->compute_s, "pipeline_s",
                                  r->pp_makespan_s, "optimizer_s", r->optimizer_s, "flops_per_token",
                                  r->model_flops_per_token, "hw_flops_per_rank", r->hw_flops_per_rank,
                                  "tokens_per_step", r->tokens_per_step));
    return o;
}

/* NCCL's line: on a GPU profile, where the trainer's collectives are NCCL's. */
static void print_nccl(const plan_result *r, const plan_hw *hw) {
    char b[32];
    if (plan_hw_is_host(hw)) return;
    fmt_gib(b, sizeof b, r->nccl.total_bytes);
    if (r->nccl.communicators == 0) {
        printf("  NCCL                  %10s  (one rank: no communicator)\n", b);
        return;
    }
    printf("  NCCL                  %10s  (%d communicator%s: tables, ring, NVLS and send/receive buffers; a "
           "model)\n",
           b, r->nccl.communicators, r->nccl.communicators == 1 ? "" : "s");
}

static void print_report(const plan_result *r, const tetra_config *cfg, const plan_hw *hw) {
    const tetra_config_values *c = &cfg->v;
    const trainer_plan *w = &r->rank[r->worst_pp_rank];
    char ac[64], b[8][32];
    printf("%s %s on %d x %s (%d per node): pp %d x dp_replicate %d x dp_shard %d x cp %d x tp %d; local batch "
           "%lld, seq_len %lld, global batch %lld; AC %s; %s%s\n",
           c->model.name, c->model.flavor, r->ngpu, hw->name, r->gpus_per_node, r->job.dims.pp,
           r->job.dims.dp_replicate, r->job.dims.dp_shard, r->job.dims.cp, r->job.dims.tp,
           (long long)c->training.local_batch_size, (long long)c->training.seq_len,
           (long long)r->job.dims.global_batch_size, ac_desc(c, ac, sizeof ac), w->mixed ? "bf16" : "fp32",
           r->float8 ? " + float8 linears" : "");
    if (r->job.dims.pp > 1)
        printf("pipeline: %s, %d stages, %d microbatches of %d per round, %d round%s\n",
               c->parallelism.pipeline_parallel_schedule, w->n_stages, w->n_microbatches, w->local_batch, w->accum,
               w->accum == 1 ? "" : "s");
    printf("\nmemory per rank%s:\n", r->job.dims.pp > 1 ? " (the largest pipeline rank)" : "");
    if (r->job.dims.pp > 1) printf("  pipeline rank         %d of %d\n", r->worst_pp_rank, r->job.dims.pp);
    fmt_gib(b[0], 32, w->param_bytes);
    if (w->offload)
        printf("  parameters            %10s  (the %s shard; the fp32 master is on the host)\n", b[0],
               w->mixed ? "bf16" : "fp32");
    else printf("  parameters            %10s  (fp32 master shard%s)\n", b[0], w->mixed ? " + bf16 copy" : "");
    fmt_gib(b[0], 32, w->grad_bytes);
    printf("  gradients             %10s\n", b[0]);
    fmt_gib(b[0], 32, w->optim_bytes);
    if (w->offload) printf("  optimizer state       %10s  (AdamW m, v: on the host)\n", b[0]);
    else printf("  optimizer state       %10s  (AdamW m, v)\n", b[0]);
    fmt_gib(b[0], 32, w->work_param_bytes);
    fmt_gib(b[1], 32, w->work_grad_bytes + w->reduce_bytes);
    printf("  gathered parameters   %10s\n", b[0]);
    if (w->grad_arena_stages > w->grad_arenas)
        printf("  gradient buffers      %10s  (unsharded: %d stages taking turns in %d; + reduce staging)\n", b[1],
               w->grad_arena_stages, w->grad_arenas);
    else printf("  gradient buffers      %10s  (unsharded + reduce staging)\n", b[1]);
    fmt_gib(b[0], 32, w->act_bytes);
    fmt_gib(b[1], 32, w->act_mb_bytes);
    fmt_gib(b[2], 32, w->workspace_bytes);
    if (w->n_local > 1) { /* microbatches of stages of different sizes: their sum */
        fmt_gib(b[1], 32, w->act_bytes - w->workspace_bytes);
        printf("  activations           %10s  (%d in flight over %d stages, %s + workspace %s)\n", b[0], w->n_acts,
               w->n_local, b[1], b[2]);
    } else {
        printf("  activations           %10s  (%d in flight x %s + workspace %s)\n", b[0], w->n_acts, b[1], b[2]);
    }
    if (w->converter_bytes > 0) {
        fmt_gib(b[0], 32, w->converter_bytes);
        printf("  converters            %10s\n", b[0]);
    }
    print_nccl(r, hw);
    fmt_gib(b[0], 32, r->reserved_bytes);
    printf("  reserved              %10s  (runtime, libraries, allocator: the profile's)\n", b[0]);
    fmt_gib(b[0], 32, r->peak_bytes);
    fmt_gib(b[1], 32, r->device_bytes);
    fmt_gib(b[2], 32, fabs(r->device_bytes - r->peak_bytes));
    if (r->fits) printf("  peak                  %10s  of %s: fits (%s free)\n", b[0], b[1], b[2]);
    else printf("  peak                  %10s  of %s: does not fit by %s\n", b[0], b[1], b[2]);
    if (w->offload) {
        fmt_gib(b[0], 32, w->host_bytes);
        printf("  host (cpu offload)    %10s  page-locked, per rank: fp32 master, AdamW m and v, two units' staging\n",
               b[0]);
    }
    printf("\nper step:\n");
    fmt_time(b[0], 32, r->compute_s);
    printf("  compute               %10s  (%.3g FLOPs on the slowest rank, recompute included)\n", b[0],
           r->hw_flops_per_rank);
    if (r->job.dims.pp > 1) {
        fmt_time(b[0], 32, r->pp_makespan_s);
        printf("  pipeline              %10s  (bubble %.1f%%)\n", b[0], 100.0 * r->bubble_fraction);
    }
    for (int i = 0; i < r->n_comm; i++) {
        const plan_comm *q = &r->comm[i];
        fmt_bytes_h(b[0], 32, q->bytes);
        fmt_time(b[1], 32, q->time_s);
        fmt_time(b[2], 32, q->exposed_s);
        printf("  %-9s %3d ranks  %10s sent, %s over %s; %s exposed\n", q->name, q->group_size, b[0], b[1],
               q->inter_node ? "the network" : "the node's links",
               !strcmp(q->name, "pp") ? "in the pipeline time" : b[2]);
    }
    fmt_time(b[0], 32, r->optimizer_s);
    printf("  optimizer             %10s\n", b[0]);
    fmt_time(b[0], 32, r->step_time_s);
    printf("  step time             %10s\n", b[0]);
    printf("  tokens/s/GPU          %10.0f\n", r->tokens_per_s_per_gpu);
    printf("  MFU                   %9.1f%%  (%.3g FLOPs/token, peak %.3g FLOP/s)\n", 100.0 * r->mfu,
           r->model_flops_per_token, hw->peak_bf16_flops);
    printf("  MFU (computed)        %9.1f%%  (the attention the mask leaves: %s)\n", 100.0 * r->mfu_computed,
           r->attn_source);
}

int plan_check_llama(const tetra_job *job, char *err, size_t errlen) {
    if (llama3_args_of(&job->model)) return 0;
    snprintf(err, errlen, "tetra plan: model.name \"%s\": the planner's cost model is Llama 3's (llama3)",
             job->model.family ? job->model.family->name : "?");
    return -1;
}

int plan_cfg_with(tetra_config *dst, const tetra_config *src, const char **kv, int n, char *err, size_t errlen) {
    char *text = NULL;
    size_t len = 0;
    cfg_init(dst);
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    cfg_print_toml(src, f);
    fclose(f);
    int rc = cfg_load_string(dst, "plan", text, len, err, errlen);
    free(text);
    for (int i = 0; rc == 0 && i < n; i++) rc = cfg_set_string(dst, kv[2 * i], kv[2 * i + 1], err, errlen);
    return rc;
}

int plan_try(plan_result *r, const tetra_config *base, const char **kv, int n, int ngpu, int gpn, const plan_hw *hw,
             char *err, size_t errlen) {
    tetra_config c;
    if (plan_cfg_with(&c, base, kv, n, err, errlen)) {
        cfg_free(&c);
        return -1;
    }
    int rc = plan_estimate(r, &c, ngpu, gpn, hw, err, errlen);
    cfg_free(&c);
    return rc;
}

/* When it does not fit: what each knob alone would make of the peak. */
static void print_knobs(const plan_result *r, const tetra_config *cfg, const plan_hw *hw) {
    const tetra_config_values *c = &cfg->v;
    static plan_result alt;
    char e[2048], lb[32], tp[32], pp[32];
    printf("\nknobs (each alone):\n");
    typedef struct {
        const char *what;
        const char *kv[6];
        int n;
    } knob;
    knob k[6];
    int nk = 0;
    if (strcmp(c->activation_checkpoint.mode, "full"))
        k[nk++] = (knob){"activation_checkpoint.mode = full", {"activation_checkpoint.mode", "full"}, 1};
    if (c->training.local_batch_size > 1) {
        snprintf(lb, sizeof lb, "%lld", (long long)(c->training.local_batch_size / 2));
        k[nk++] = (knob){"training.local_batch_size halved", {"training.local_batch_size", lb}, 1};
    }
    snprintf(tp, sizeof tp, "%d", r->job.dims.tp * 2);
    k[nk++] = (knob){"tensor_parallel_degree doubled", {"parallelism.tensor_parallel_degree", tp}, 1};
    snprintf(pp, sizeof pp, "%d", r->job.dims.pp * 2);
    k[nk++] = (knob){"pipeline_parallel_degree doubled", {"parallelism.pipeline_parallel_degree", pp}, 1};
    if (r->job.dims.dp_replicate > 1)
        k[nk++] =
            (knob){"no replication (all data parallel ranks shard)",
                   {"parallelism.data_parallel_replicate_degree", "1", "parallelism.data_parallel_shard_degree", "-1"},
                   2};
    for (int i = 0; i < nk; i++) {
        if (plan_try(&alt, cfg, k[i].kv, k[i].n, r->ngpu, r->gpus_per_node, hw, e, sizeof e)) {
            printf("  %-48s cannot run: %.200s\n", k[i].what, e);
            continue;
        }
        char pk[32];
        fmt_gib(pk, sizeof pk, alt.peak_bytes);
        printf("  %-48s peak %s (%s), %.0f tokens/s/GPU\n", k[i].what, pk, alt.fits ? "fits" : "does not fit",
               alt.tokens_per_s_per_gpu);
    }
}

static int calibrate_main(int argc, char **argv) {
    const char *outp = "outputs/hardware/cpu.toml";
    const char *basep = "cpu";
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--calibrate")) continue;
        if (!strcmp(argv[i], "--out") && i + 1 < argc) outp = argv[++i];
        else if (!strcmp(argv[i], "--hardware") && i + 1 < argc) basep = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            if (parse_int_opt("--threads", argv[++i], 1, &threads)) return 2;
        } else {
            fprintf(stderr,
                    "tetra plan --calibrate: unknown option '%s' (options: --out FILE, --hardware BASE, "
                    "--threads N)\n",
                    argv[i]);
            return 2;
        }
    }
    host_start(&argc, &argv);
    const int rank = host_rank();
    char err[2048];
    plan_hw base, out;
    int rc = 0;
    if (plan_hw_load(basep, &base, err, sizeof err)) {
        if (rank == 0) fprintf(stderr, "tetra plan --calibrate: %s\n", err);
        host_end();
        return 2;
    }
    if (plan_calibrate(&out, &base, threads, rank == 0 ? stdout : NULL, err, sizeof err)) {
        if (rank == 0) fprintf(stderr, "tetra plan --calibrate: %s\n", err);
        rc = 1;
    } else if (rank == 0) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s", outp);
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = 0;
            if (util_mkdir_p(dir) != 0) {
                fprintf(stderr, "tetra plan --calibrate: cannot create %s: %s\n", dir, strerror(errno));
                rc = 1;
            }
        }
        if (!rc && plan_hw_write(&out, outp, err, sizeof err)) {
            fprintf(stderr, "tetra plan --calibrate: %s\n", err);
            rc = 1;
        }
        if (!rc) printf("wrote %s (use it with --hardware %s)\n", outp, outp);
    }
    host_end();
    return rc;
}

static const char *const PLAN_OPTIONS[] = {"--ngpu",      "--gpus-per-node", "--hardware",  "--json",
                                           "--recommend", "--top",           "--calibrate", "--help"};

int plan_config_main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--calibrate")) return calibrate_main(argc, argv);
    const char *hwname = "h100-sxm";
    int ngpu = 0, gpn = 0, json = 0, recommend = 0, top = 5, ops = 0, block = -1;
    /* the planner's own options come out; the rest are training keys */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return 1;
    int nr = 0;
    rest[nr++] = "plan";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            free(rest);
            return 0;
        }
        if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--recommend")) recommend = 1;
        else if (!strcmp(a, "--ops")) ops = 1;
        else if (!strcmp(a, "--ngpu") || !strcmp(a, "--gpus-per-node") || !strcmp(a, "--hardware") ||
                 !strcmp(a, "--top") || !strcmp(a, "--block")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tetra plan: %s needs a value\n", a);
                free(rest);
                return 2;
            }
            const char *v = argv[++i];
            int bad = 0;
            if (!strcmp(a, "--ngpu")) bad = parse_int_opt(a, v, 1, &ngpu);
            else if (!strcmp(a, "--gpus-per-node")) bad = parse_int_opt(a, v, 1, &gpn);
            else if (!strcmp(a, "--top")) bad = parse_int_opt(a, v, 1, &top);
            else if (!strcmp(a, "--block")) bad = parse_int_opt(a, v, 0, &block);
            else hwname = v;
            if (bad) {
                free(rest);
                return 2;
            }
        } else if (!strncmp(a, "--", 2) && !strchr(a, '.')) { /* training keys are --section.key */
            const char *near = plan_nearest_option(a, PLAN_OPTIONS, sizeof PLAN_OPTIONS / sizeof *PLAN_OPTIONS);
            if (near) fprintf(stderr, "tetra plan: unknown option %s (did you mean %s?)\n", a, near);
            else fprintf(stderr, "tetra plan: unknown option %s; `tetra plan --help` lists the options\n", a);
            free(rest);
            return 2;
        } else rest[nr++] = argv[i];
    }
    char err[4096];
    plan_hw hw;
    if (plan_hw_load(hwname, &hw, err, sizeof err)) {
        fprintf(stderr, "tetra plan: --hardware: %s\n", err);
        free(rest);
        return 2;
    }
    tetra_config cfg;
    cfg_init(&cfg);
    int rc = cfg_parse_args(&cfg, nr, rest, stdout, err, sizeof err);
    free(rest);
    if (rc == 1) {
        cfg_free(&cfg);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "tetra plan: %s\n", err);
        cfg_free(&cfg);
        return 2;
    }
    /* a GPU profile plans the CUDA run unless the config insists on the CPU */
    if (strcmp(cfg.v.training.device, "cpu") &&
        cfg_set_string(&cfg, "training.device", plan_hw_is_host(&hw) ? "cpu" : "cuda", err, sizeof err)) {
        fprintf(stderr, "tetra plan: %s\n", err);
        cfg_free(&cfg);
        return 2;
    }
    if (ngpu <= 0) {
        const tetra_config_values *c = &cfg.v;
        ngpu = (int)(c->parallelism.pipeline_parallel_degree * c->parallelism.tensor_parallel_degree *
                     c->parallelism.context_parallel_degree * c->parallelism.data_parallel_replicate_degree *
                     (c->parallelism.data_parallel_shard_degree > 0 ? c->parallelism.data_parallel_shard_degree : 1));
    }
    if (ops) {
        rc = plan_ops_main(&cfg, &hw, block, json);
        cfg_free(&cfg);
        return rc;
    }
    if (recommend) {
        rc = plan_recommend(&cfg, ngpu, gpn, &hw, top, json);
        cfg_free(&cfg);
        return rc;
    }
    static plan_result r;
    if (plan_estimate(&r, &cfg, ngpu, gpn, &hw, err, sizeof err)) {
        fprintf(stderr, "tetra plan: %s\n", err);
        cfg_free(&cfg);
        return 1;
    }
    if (json) {
        json_t *o = plan_result_json(&r, &cfg, &hw);
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
        if (s) puts(s);
        free(s);
        json_decref(o);
    } else {
        print_report(&r, &cfg, &hw);
        if (!r.fits) print_knobs(&r, &cfg, &hw);
    }
    rc = r.fits ? 0 : 1;
    cfg_free(&cfg);
    return rc;
}
