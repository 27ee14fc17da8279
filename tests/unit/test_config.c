/* Config schema: defaults, TOML loading, CLI precedence, errors with
 * file:line and suggestions, cross-key rules, print_config round trip. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "models/llama3/family.h"
#include "config/compat.h"
#include "engine/job.h"
#include "tests/check.h"

static int load(tetra_config *c, const char *text, char *err, size_t n) {
    return cfg_load_string(c, "t.toml", text, strlen(text), err, n);
}

static void test_defaults(void) {
    tetra_config c;
    cfg_init(&c);
    CHECK(c.v.training.seq_len == 2048, "%lld", (long long)c.v.training.seq_len);
    CHECK(c.v.training.local_batch_size == 8, "lbs");
    CHECK(c.v.optimizer.lr == 8e-4, "lr %g", c.v.optimizer.lr);
    CHECK(c.v.optimizer.beta2 == 0.95, "beta2");
    CHECK(c.v.optimizer.weight_decay == 0.1, "wd");
    CHECK(c.v.lr_scheduler.warmup_steps == 200, "warmup");
    CHECK(isnan(c.v.lr_scheduler.decay_ratio), "decay_ratio unset by default");
    CHECK(c.v.parallelism.data_parallel_shard_degree == -1, "shard -1");
    CHECK(!strcmp(c.v.parallelism.pipeline_parallel_schedule, "1F1B"), "schedule");
    CHECK(!strcmp(c.v.activation_checkpoint.selective_ac_option, "2"), "sac");
    CHECK(c.v.compile.components.n == 2 && !strcmp(c.v.compile.components.items[1], "loss"), "components");
    CHECK(c.v.model.converters.n == 0, "converters empty");
    CHECK(c.v.checkpoint.keep_latest_k == 10, "keep");
    CHECK(c.v.comm.train_timeout_seconds == 100, "timeout");
    CHECK(c.v.job.config_file == NULL, "config_file unset");
    cfg_free(&c);
}

static void test_toml_and_cli(void) {
    tetra_config c;
    char err[1024];
    cfg_init(&c);
    const char *doc = "[training]\nseq_len = 512\nmax_norm = 2\n"
                      "[quantize.linear.float8]\nfilter_fqns = [\"output\", \"layers.0\"]\n"
                      "[model]\nconverters = [\"float8\"]\n";
    CHECK(load(&c, doc, err, sizeof err) == 0, "%s", err);
    CHECK(c.v.training.seq_len == 512, "seq_len");
    CHECK(c.v.training.max_norm == 2.0, "int accepted for float");
    CHECK(c.v.quantize_linear_float8.filter_fqns.n == 2, "list");
    char buf[256];
    CHECK(!strcmp(cfg_origin_str(&c, "training", "seq_len", buf, sizeof buf), "t.toml:2"), "%s", buf);

    /* CLI overrides the file, in every syntax */
    char *argv[] = {"train",
                    "--training.seq_len",
                    "256",
                    "--optimizer.lr=0.001",
                    "--metrics.enable_tensorboard",
                    "--checkpoint.no_enable",
                    "--model.converters",
                    "float8",
                    "--compile.components=model"};
    int argc = (int)(sizeof argv / sizeof argv[0]);
    CHECK(cfg_parse_args(&c, argc, argv, stdout, err, sizeof err) == 0, "%s", err);
    CHECK(c.v.training.seq_len == 256, "cli int");
    CHECK(c.v.optimizer.lr == 0.001, "cli float");
    CHECK(c.v.metrics.enable_tensorboard == 1, "flag");
    CHECK(c.v.checkpoint.enable == 0, "no_flag");
    CHECK(c.v.compile.components.n == 1, "cli list");
    CHECK(!strcmp(cfg_origin_str(&c, "training", "seq_len", buf, sizeof buf), "command line"), "%s", buf);
    char *argv2[] = {"train", "--metrics.enable_tensorboard=false"};
    CHECK(cfg_parse_args(&c, 2, argv2, stdout, err, sizeof err) == 0, "%s", err);
    CHECK(c.v.metrics.enable_tensorboard == 0, "flag=false");
    cfg_free(&c);
}

static void expect_load_error(const char *doc, const char *needle1, const char *needle2) {
    tetra_config c;
    char err[1024] = "";
    cfg_init(&c);
    int rc = load(&c, doc, err, sizeof err);
    CHECK(rc != 0, "document should be rejected: %s", doc);
    CHECK(strstr(err, needle1) != NULL, "error '%s' lacks '%s'", err, needle1);
    if (needle2) CHECK(strstr(err, needle2) != NULL, "error '%s' lacks '%s'", err, needle2);
    cfg_free(&c);
}

static void test_errors(void) {
    expect_load_error("[training]\nsequence_len = 4\n", "t.toml:2", "did you mean training.seq_len");
    /* TorchTitan's paper-era key moved sections: point to the new home */
    expect_load_error("[training]\nwarmup_steps = 4\n", "t.toml:2", "lr_scheduler.warmup_steps");
    expect_load_error("\n\n[trainig]\nsteps = 4\n", "t.toml:3", "did you mean [training]");
    expect_load_error("[training]\nseq_len = \"2048\"\n", "t.toml:2", "expects an integer, got string");
    expect_load_error("[optimizer]\nlr = true\n", "expects a number", NULL);
    expect_load_error("[parallelism]\npipeline_parallel_schedule = \"ZBV\"\n", "must be one of", "t.toml:2");
    expect_load_error("[model]\nconverters = [1]\n", "array of strings", NULL);
    expect_load_error("[training]\nsteps = 1\nsteps = 2\n", "t.toml:3", NULL); /* TOML duplicate key */
    expect_load_error("steps = 1\n", "inside a section", "training.steps");
    expect_load_error("[quantize.linear.float9]\nemulate = true\n", "unknown section", "quantize.linear.float8");

    tetra_config c;
    char err[1024];
    cfg_init(&c);
    char *argv[] = {"train", "--training.seqlen", "4"};
    CHECK(cfg_parse_args(&c, 3, argv, stdout, err, sizeof err) == -1, "unknown cli");
    CHECK(strstr(err, "--training.seq_len") != NULL, "%s", err);
    char *argv2[] = {"train", "--training.steps", "ten"};
    CHECK(cfg_parse_args(&c, 3, argv2, stdout, err, sizeof err) == -1, "bad int");
    CHECK(strstr(err, "expects an integer") != NULL, "%s", err);
    char *argv3[] = {"train", "--training.steps"};
    CHECK(cfg_parse_args(&c, 2, argv3, stdout, err, sizeof err) == -1, "missing value");
    char *argv4[] = {"train", "--job.config_file", "/nonexistent/x.toml"};
    CHECK(cfg_parse_args(&c, 3, argv4, stdout, err, sizeof err) == -1, "missing file");
    CHECK(strstr(err, "/nonexistent/x.toml") != NULL, "%s", err);
    cfg_free(&c);
}

static void expect_validate(const char *doc, int world, int ok, const char *needle) {
    tetra_config c;
    char err[1024] = "";
    cfg_init(&c);
    CHECK(load(&c, doc, err, sizeof err) == 0, "%s", err);
    tetra_job j;
    int rc = job_resolve(&c, world, &j, err, sizeof err);
    CHECK((rc == 0) == ok, "validate(%s, world %d) rc %d: %s", doc, world, rc, err);
    if (needle) CHECK(strstr(err, needle) != NULL, "error '%s' lacks '%s'", err, needle);
    cfg_free(&c);
}

static void test_validate(void) {
    tetra_config c;
    char err[1024];
    cfg_parallel_dims d;
    cfg_init(&c);
    CHECK(load(&c, "[parallelism]\ntensor_parallel_degree = 2\ndata_parallel_replicate_degree = 2\n", err,
               sizeof err) == 0,
          "%s", err);
    CHECK(cfg_validate(&c, 8, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.dp_shard == 2 && d.tp == 2 && d.dp_replicate == 2 && d.dp == 4, "shard -1 takes the rest: %d", d.dp_shard);
    CHECK(d.grad_accum_steps == 1 && d.global_batch_size == 32, "gbs %lld", (long long)d.global_batch_size);
    cfg_free(&c);

    expect_validate("[parallelism]\ntensor_parallel_degree = 3\n", 4, 0, "not divisible");
    expect_validate("[parallelism]\ndata_parallel_shard_degree = 2\n", 4, 0, "world size is 4");
    expect_validate("[parallelism]\ncontext_parallel_degree = 2\n[training]\nseq_len = 102\n", 2, 0,
                    "divisible by 2 x context_parallel_degree");
    expect_validate("[parallelism]\ntensor_parallel_degree = 3\n[model]\nflavor = \"8B\"\n", 3, 0, "n_kv_heads");
    expect_validate("[training]\nglobal_batch_size = 12\nlocal_batch_size = 8\n", 1, 0, "multiple of");
    expect_validate("[training]\nglobal_batch_size = 32\nlocal_batch_size = 8\n", 2, 1, NULL);
    expect_validate("[checkpoint]\nkeep_latest_k = 1\n", 1, 0, "keep_latest_k");
    expect_validate("[model]\nflavor = \"7B\"\n", 1, 0, "flavor");
    expect_validate("[model]\nconverters = [\"int4\"]\n", 1, 0, "unknown converter");
    expect_validate("[activation_checkpoint]\nselective_ac_option = \"every\"\n", 1, 0, "selective_ac_option");
    expect_validate("[lr_scheduler]\ndecay_ratio = 1.5\n", 1, 0, "t.toml:2");

    cfg_init(&c);
    CHECK(load(&c, "[training]\nglobal_batch_size = 64\n", err, sizeof err) == 0, "%s", err);
    CHECK(cfg_validate(&c, 4, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.grad_accum_steps == 2, "accumulation %d", d.grad_accum_steps);
    cfg_free(&c);
}

/* The typed job spec: the flavor with every model.* override applied, the schedule parsed
 * once, float8 found among the converters — what trainer, planner and recommender read. */
static void test_job_spec(void) {
    tetra_config c;
    char err[1024];
    tetra_job j;
    cfg_init(&c);
    CHECK(load(&c,
               "[model]\nflavor = \"8B\"\nn_layers = 4\nvocab_size = 32000\nattn_mask_type = \"block_causal\"\n"
               "reset_positions_at_document_boundaries = true\nconverters = [\"float8\"]\n"
               "[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = \"ZBVZeroBubble\"\n"
               "fsdp_reshard_after_forward = \"never\"\ncontext_parallel_rotate_method = \"alltoall\"\n"
               "context_parallel_load_balancer = \"none\"\n",
               err, sizeof err) == 0,
          "%s", err);
    CHECK(job_resolve(&c, 2, &j, err, sizeof err) == 0, "%s", err);
    CHECK(j.model.family == model_family_find("llama3") && llama3_args_of(&j.model), "model.name resolves to llama3");
    const llama3_args *jm = llama3_args_of(&j.model);
    CHECK(jm->dim == 4096 && jm->n_layers == 4 && jm->vocab_size == 32000, "model %d %d %d", jm->dim, jm->n_layers,
          jm->vocab_size);
    CHECK(jm->attn_mask_type == LLAMA3_MASK_BLOCK_CAUSAL && jm->reset_positions == 1, "mask %d reset %d",
          (int)jm->attn_mask_type, jm->reset_positions);
    CHECK(j.pp_schedule == PP_SCHED_ZBV && j.dims.pp == 2 && j.float8 == 1, "schedule %d pp %d float8 %d",
          (int)j.pp_schedule, j.dims.pp, j.float8);
    CHECK(j.reshard == FSDP_RESHARD_NEVER && j.cp_rotate == CP_ROTATE_ALLTOALL && j.cp_balanced == 0,
          "reshard %d rotate %d balanced %d", (int)j.reshard, (int)j.cp_rotate, j.cp_balanced);
    cfg_free(&c);
    /* the flavor's own values when nothing overrides them */
    cfg_init(&c);
    CHECK(load(&c, "[model]\nflavor = \"8B_flex\"\n", err, sizeof err) == 0, "%s", err);
    CHECK(job_resolve(&c, 1, &j, err, sizeof err) == 0, "%s", err);
    jm = llama3_args_of(&j.model);
    CHECK(jm->n_layers == 32 && jm->vocab_size == 128256 && jm->attn_mask_type == LLAMA3_MASK_BLOCK_CAUSAL &&
              j.pp_schedule == PP_SCHED_1F1B && !j.float8 && j.reshard == FSDP_RESHARD_DEFAULT &&
              j.cp_rotate == CP_ROTATE_ALLGATHER && j.cp_balanced == 1,
          "8B_flex: %d layers, vocab %d, mask %d", jm->n_layers, jm->vocab_size, (int)jm->attn_mask_type);
    cfg_free(&c);
}

static void test_print_roundtrip(void) {
    tetra_config a, b;
    char err[1024];
    cfg_init(&a);
    CHECK(load(&a,
               "[job]\ndescription = \"quote \\\" and \\\\ tab\\t\"\n[lr_scheduler]\ndecay_ratio = 0.8\n"
               "[optimizer]\nlr = 3e-4\n[quantize.linear.float8]\nfilter_fqns = [\"output\"]\n",
               err, sizeof err) == 0,
          "%s", err);
    char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    FILE *f = open_memstream(&t1, &n1);
    cfg_print_toml(&a, f);
    fclose(f);
    cfg_init(&b);
    CHECK(cfg_load_string(&b, "printed", t1, n1, err, sizeof err) == 0, "printed config must parse: %s", err);
    f = open_memstream(&t2, &n2);
    cfg_print_toml(&b, f);
    fclose(f);
    /* identical apart from the header line naming the source */
    const char *s1 = strchr(t1, '\n'), *s2 = strchr(t2, '\n');
    CHECK(s1 && s2 && !strcmp(s1, s2), "round trip differs:\n%s\n---\n%s", t1, t2);
    CHECK(b.v.optimizer.lr == 3e-4 && b.v.lr_scheduler.decay_ratio == 0.8, "values survive");
    CHECK(!strcmp(b.v.job.description, "quote \" and \\ tab\t"), "string escapes survive: %s", b.v.job.description);
    free(t1);
    free(t2);

    /* --help lists every key */
    char *h = NULL;
    size_t hn = 0;
    f = open_memstream(&h, &hn);
    cfg_print_help(f);
    fclose(f);
    for (int i = 0; i < cfg_n_keys; i++) {
        char opt[256];
        snprintf(opt, sizeof opt, "--%s.%s ", cfg_keys[i].section, cfg_keys[i].key);
        CHECK(strstr(h, opt) != NULL, "help lacks %s", opt);
    }
    free(h);
    cfg_free(&a);
    cfg_free(&b);
}

static void test_shipped_configs(void) {
    const char *files[] = {"configs/debug_model.toml", "configs/llama3_8b.toml", "configs/llama3_70b.toml",
                           "configs/llama3_405b.toml"};
    const int worlds[] = {1, 8, 8, 8};
    for (int i = 0; i < 4; i++) {
        tetra_config c;
        char err[1024];
        cfg_init(&c);
        CHECK(cfg_load_file(&c, files[i], err, sizeof err) == 0, "%s", err);
        cfg_parallel_dims d;
        CHECK(cfg_validate(&c, worlds[i], &d, err, sizeof err) == 0, "%s: %s", files[i], err);
        cfg_free(&c);
    }
    tetra_config c;
    char err[1024];
    cfg_init(&c);
    CHECK(cfg_load_file(&c, "configs/llama3_405b.toml", err, sizeof err) == 0, "%s", err);
    CHECK(c.v.optimizer.lr == 8e-5 && c.v.lr_scheduler.warmup_steps == 600 && c.v.training.steps == 3000,
          "405B preset values");
    CHECK(c.v.model.converters.n == 1 && c.v.quantize_linear_float8.enable_fsdp_float8_all_gather, "405B float8");
    cfg_free(&c);
}

/* ---------------------------------------------------------------------------- no silent keys
 * Every key of the schema, set to a value other than its default, either works (it is in
 * WORKS: its feature is built, and a test elsewhere exercises it), has no meaning in
 * tetra and says so in its help (MEANINGLESS), or is refused by the validation with a
 * message naming it. A key added to the schema without being sorted into one of these
 * fails here. */
static const char *const WORKS[] = {"job.config_file",
                                    "job.dump_folder",
                                    "job.description",
                                    "job.print_config",
                                    "job.save_config_file",
                                    "profiling.enable_profiling",
                                    "profiling.save_traces_folder",
                                    "profiling.profile_freq",
                                    "profiling.profiler_active",
                                    "profiling.save_memory_snapshot_folder",
                                    "profiling.enable_memory_snapshot",
                                    "metrics.log_freq",
                                    "metrics.enable_tensorboard",
                                    "metrics.disable_color_printing",
                                    "metrics.save_tb_folder",
                                    "metrics.peak_flops",
                                    "model.name",
                                    "model.flavor",
                                    "model.converters",
                                    "model.print_after_conversion",
                                    "model.n_layers",
                                    "model.vocab_size",
                                    "model.attn_mask_type",
                                    "model.reset_positions_at_document_boundaries",
                                    "optimizer.lr",
                                    "optimizer.beta1",
                                    "optimizer.beta2",
                                    "optimizer.eps",
                                    "optimizer.weight_decay",
                                    "lr_scheduler.warmup_steps",
                                    "lr_scheduler.total_steps",
                                    "lr_scheduler.decay_ratio",
                                    "lr_scheduler.decay_type",
                                    "lr_scheduler.min_lr_factor",
                                    "training.dataset",
                                    "training.dataset_path",
                                    "training.dataset_mix",
                                    "training.local_batch_size",
                                    "training.global_batch_size",
                                    "training.seq_len",
                                    "training.max_norm",
                                    "training.steps",
                                    "training.on_nonfinite",
                                    "training.max_consecutive_nonfinite_steps",
                                    "training.mixed_precision_param",
                                    "training.mixed_precision_reduce",
                                    "training.seed",
                                    "training.deterministic",
                                    "training.device",
                                    "training.threads",
                                    "training.cuda_graph",
                                    "parallelism.data_parallel_replicate_degree",
                                    "parallelism.data_parallel_shard_degree",
                                    "parallelism.fsdp_reshard_after_forward",
                                    "parallelism.tensor_parallel_degree",
                                    "parallelism.disable_loss_parallel",
                                    "parallelism.enable_async_tensor_parallel",
                                    "parallelism.pipeline_parallel_degree",
                                    "parallelism.pipeline_parallel_first_stage_less_layers",
                                    "parallelism.pipeline_parallel_last_stage_less_layers",
                                    "parallelism.pipeline_parallel_layers_per_stage",
                                    "parallelism.pipeline_parallel_schedule",
                                    "parallelism.pipeline_parallel_schedule_csv",
                                    "parallelism.pipeline_parallel_microbatch_size",
                                    "parallelism.context_parallel_degree",
                                    "parallelism.context_parallel_load_balancer",
                                    "parallelism.context_parallel_rotate_method",
                                    "checkpoint.enable",
                                    "checkpoint.folder",
                                    "checkpoint.interval",
                                    "checkpoint.initial_load_path",
                                    "checkpoint.initial_load_model_only",
                                    "checkpoint.initial_load_in_hf",
                                    "checkpoint.last_save_model_only",
                                    "checkpoint.last_save_in_hf",
                                    "checkpoint.export_dtype",
                                    "checkpoint.async_mode",
                                    "checkpoint.keep_latest_k",
                                    "checkpoint.load_step",
                                    "checkpoint.exclude_from_loading",
                                    "checkpoint.enable_first_step_checkpoint",
                                    "checkpoint.create_seed_checkpoint",
                                    "checkpoint.load_only",
                                    "activation_checkpoint.mode",
                                    "activation_checkpoint.selective_ac_option",
                                    "quantize.linear.float8.enable_fsdp_float8_all_gather",
                                    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
                                    "quantize.linear.float8.recipe_name",
                                    "quantize.linear.float8.filter_fqns",
                                    "quantize.linear.float8.emulate",
                                    "validation.enable",
                                    "validation.dataset",
                                    "validation.dataset_path",
                                    "validation.local_batch_size",
                                    "validation.seq_len",
                                    "validation.freq",
                                    "validation.steps",
                                    "comm.init_timeout_seconds",
                                    "comm.train_timeout_seconds",
                                    "comm.trace_buf_size",
                                    "comm.save_traces_folder",
                                    "comm.save_traces_file_prefix",
                                    "comm.backend",
                                    "debug.seed",
                                    "debug.deterministic",
                                    "memory_estimation.enable",
                                    "training.num_tokens_per_microbatch_per_dp_rank",
                                    "training.num_tokens_per_train_step",
                                    "training.max_context_length",
                                    "parallelism.num_pp_microbatches", /* tests/sh/test_torchtitan_configs.sh */
                                    "training.enable_cpu_offload"};    /* gpu/test_sim_offload */
static const char *const MEANINGLESS[] = {
    "model.hf_assets_path",                     /* read by `tetra data prepare --tokenizer`; training reads shards */
    "optimizer.implementation",                 /* one fused pass per shard whatever the style */
    "training.gc_freq",                         /* no garbage collector */
    "profiling.profiler_warmup",                /* the tracer needs no warm-up */
    "activation_checkpoint.preserve_rng_state", /* the forward draws no random numbers */
    "compile.enable", "compile.components", "compile.backend", /* kernels are compiled ahead of time */
    "parallelism.expert_parallel_degree", "parallelism.expert_tensor_parallel_degree",            /* refused unless 1 */
    "parallelism.module_fqns_per_model_part", "metrics.enable_wandb", "job.custom_config_module", /* refused */
    /* TorchTitan v0.2.2 keys with no meaning in C: accepted, and named in a start-up notice */
    "training.dataloader.num_workers", "training.dataloader.persistent_workers", "training.dataloader.pin_memory",
    "training.dataloader.prefetch_factor", "validation.dataloader.num_workers",
    "validation.dataloader.persistent_workers", "validation.dataloader.pin_memory",
    "validation.dataloader.prefetch_factor", "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns",
    "activation_checkpoint.memory_budget", "activation_checkpoint.determinism_check", "activation_checkpoint.debug",
    "parallelism.pipeline_parallel_expert_parallel_overlap", "checkpoint.enable_ft_dataloader_checkpoints",
    "quantize.linear.mx.mxfp8_dim1_cast_kernel_choice", "quantize.linear.mx.recipe_name",
    "quantize.linear.mx.filter_fqns", "memory_estimation.disable_fake_mode", "fault_tolerance.process_group",
    "fault_tolerance.process_group_timeout_ms", "fault_tolerance.replica_id", "fault_tolerance.group_size",
    "fault_tolerance.min_replica_size", "fault_tolerance.semi_sync_method", "fault_tolerance.sync_steps",
    "fault_tolerance.should_quantize", "fault_tolerance.fragment_sync_delay", "fault_tolerance.fragment_update_alpha",
    "fault_tolerance.num_fragments", "debug.deterministic_warn_only"};

/* cfg_compat_notices: did a line name `want`? */
typedef struct {
    const char *want;
    int seen;
} notice_probe;

static void probe_notice(const char *line, void *ctx) {
    notice_probe *p = ctx;
    size_t l = strlen(p->want);
    if (!strncmp(line, p->want, l) && line[l] == ' ' && strstr(line, "has no effect in tetra: ")) p->seen = 1;
}

static int listed(const char *const *list, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(list[i], name)) return 1;
    return 0;
}

static void test_no_silent_keys(void) {
    const size_t nw = sizeof WORKS / sizeof WORKS[0], nm = sizeof MEANINGLESS / sizeof MEANINGLESS[0];
    char full[160], val[64], err[1024];
    int refused = 0;
    /* the section of docs/configs.md that names the refused keys (the tests run in the source tree) */
    char *docs = NULL;
    FILE *df = fopen("docs/configs.md", "rb");
    if (df) {
        docs = calloc(1, 1 << 20);
        if (docs) {
            size_t got = fread(docs, 1, (1 << 20) - 1, df);
            docs[got] = 0;
            char *sec = strstr(docs, "## Keys without a feature behind them");
            char *next = sec ? strstr(sec + 3, "\n## ") : NULL;
            if (next) *next = 0;
            if (sec) memmove(docs, sec, strlen(sec) + 1);
            else docs[0] = 0;
        }
        fclose(df);
    }
    CHECK(docs && docs[0], "docs/configs.md and its section on keys without a feature are readable");
    for (int i = 0; i < cfg_n_keys; i++) {
        const cfg_key_desc *d = &cfg_keys[i];
        snprintf(full, sizeof full, "%s.%s", d->section, d->key);
        const int works = listed(WORKS, nw, full), meaningless = listed(MEANINGLESS, nm, full);
        CHECK(works + meaningless <= 1, "%s is listed twice", full);
        if (works) continue;
        /* a value other than the default */
        switch (d->type) {
        case CFG_T_BOOL: snprintf(val, sizeof val, "%s", d->def_i ? "false" : "true"); break;
        case CFG_T_INT: snprintf(val, sizeof val, "%lld", (long long)(d->def_i >= 0 ? d->def_i + 1 : 2)); break;
        case CFG_T_FLOAT: snprintf(val, sizeof val, "%g", isnan(d->def_f) ? 0.5 : d->def_f * 0.5 + 1e-3); break;
        case CFG_T_ENUM: {
            /* the first choice that is not the default */
            const char *p = d->choices;
            val[0] = 0;
            while (*p && !val[0]) {
                size_t l = strcspn(p, "|");
                if (strlen(d->def_s) != l || strncmp(p, d->def_s, l)) snprintf(val, sizeof val, "%.*s", (int)l, p);
                p += l + (p[l] == '|');
            }
            break;
        }
        default: snprintf(val, sizeof val, "xyz"); break;
        }
        if (!val[0]) continue; /* an enum of one choice cannot be set to anything else */
        tetra_config c;
        cfg_parallel_dims dims;
        cfg_init(&c);
        int set = cfg_set_string(&c, full, val, err, sizeof err);
        /* a retired key is refused as it is read, in any form */
        const int retired = cfg_compat_retired(full) != NULL;
        CHECK(set == 0 || (retired && strstr(err, full)), "%s = %s: %s", full, val, err);
        int bad = set != 0 || cfg_validate(&c, 1, &dims, err, sizeof err) != 0;
        notice_probe probe = {full, 0};
        if (!bad) cfg_compat_notices(&c, probe_notice, &probe);
        cfg_free(&c);
        /* its help says it has no effect and a start-up notice names it (or the validation refuses it),
         * except the few whose effect lies outside training (model.hf_assets_path) */
        if (meaningless && !bad && strcmp(full, "model.hf_assets_path") != 0)
            CHECK(probe.seen, "%s = %s has no effect, but no start-up notice names it", full, val);
        if (meaningless) continue;
        CHECK(bad && strstr(err, full), "%s = %s is accepted silently (sort it into WORKS or refuse it)", full, val);
        refused += bad;
        /* the docs list what is refused */
        if (bad && docs) {
            char cell[200];
            snprintf(cell, sizeof cell, "`%s", full);
            int listed_in_docs = strstr(docs, cell) != NULL;
            if (!listed_in_docs && !strcmp(d->section, "quantize.linear.float8"))
                listed_in_docs = strstr(docs, "`quantize.linear.float8.*` without") != NULL;
            CHECK(listed_in_docs, "%s is refused but docs/configs.md does not list it", full);
        }
    }
    free(docs);
    for (size_t i = 0; i < nw; i++) {
        char sec[96];
        const char *dot = strrchr(WORKS[i], '.');
        snprintf(sec, sizeof sec, "%.*s", (int)(dot - WORKS[i]), WORKS[i]);
        CHECK(cfg_find_key(sec, dot + 1) != NULL, "WORKS names an unknown key %s", WORKS[i]);
    }
    printf("no silent keys: %d keys, %zu work, %zu have no meaning in tetra, %d refused when set\n", cfg_n_keys, nw, nm,
           refused);
}

int main(void) {
    test_defaults();
    test_toml_and_cli();
    test_errors();
    test_validate();
    test_job_spec();
    test_print_roundtrip();
    test_shipped_configs();
    test_no_silent_keys();
    printf("test_config: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
