#include "config/compat.h"
#include "util/err.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- keys TorchTitan renamed or removed ------------------------------------
 * Every key of TorchTitan's job config since April 2024 that v0.2.2 no longer has
 * (tests/toml/torchtitan_v0.2.2_keys.tsv holds v0.2.2's), with where it went. */
typedef struct {
    const char *old, *now;
} compat_renamed;

static const compat_renamed renamed[] = {
    {"training.batch_size", "renamed training.local_batch_size"},
    {"training.warmup_steps", "moved to lr_scheduler.warmup_steps"},
    {"training.compile", "moved to compile.enable"},
    {"training.data_parallel_degree", "renamed parallelism.data_parallel_shard_degree"},
    {"training.data_parallel_replicate_degree", "moved to parallelism.data_parallel_replicate_degree"},
    {"training.data_parallel_shard_degree", "moved to parallelism.data_parallel_shard_degree"},
    {"training.data_parallel_type",
     "removed: \"ddp\" is parallelism.data_parallel_replicate_degree, \"fsdp\" is "
     "parallelism.data_parallel_shard_degree"},
    {"training.tensor_parallel_degree", "moved to parallelism.tensor_parallel_degree"},
    {"training.pipeline_parallel_degree", "moved to parallelism.pipeline_parallel_degree"},
    {"training.enable_loss_parallel", "replaced by parallelism.disable_loss_parallel (the opposite flag)"},
    {"training.disable_loss_parallel", "moved to parallelism.disable_loss_parallel"},
    {"training.fsdp_reshard_after_forward", "moved to parallelism.fsdp_reshard_after_forward"},
    {"training.fp8_linear", "replaced by model.converters = [\"float8\"]"},
    {"training.debug_moe_force_load_balance", "moved to debug.moe_force_load_balance"},
    {"experimental.pipeline_parallel_degree", "moved to parallelism.pipeline_parallel_degree"},
    {"experimental.pipeline_parallel_schedule", "moved to parallelism.pipeline_parallel_schedule"},
    {"experimental.pipeline_parallel_schedule_csv", "moved to parallelism.pipeline_parallel_schedule_csv"},
    {"experimental.pipeline_parallel_microbatches",
     "replaced by parallelism.pipeline_parallel_microbatch_size (sequences per microbatch = "
     "training.local_batch_size / the old count)"},
    {"experimental.pipeline_parallel_split_mode",
     "removed: stages are split by blocks (parallelism.pipeline_parallel_layers_per_stage)"},
    {"experimental.pipeline_parallel_split_points",
     "removed: stages are split by blocks (parallelism.pipeline_parallel_layers_per_stage, "
     "pipeline_parallel_first_stage_less_layers, pipeline_parallel_last_stage_less_layers)"},
    {"parallelism.pipeline_parallel_split_points",
     "removed: stages are split by blocks (parallelism.pipeline_parallel_layers_per_stage, "
     "pipeline_parallel_first_stage_less_layers, pipeline_parallel_last_stage_less_layers)"},
    {"experimental.context_parallel_degree", "moved to parallelism.context_parallel_degree"},
    {"experimental.context_parallel_rotate_method", "moved to parallelism.context_parallel_rotate_method"},
    {"experimental.enable_async_tensor_parallel", "moved to parallelism.enable_async_tensor_parallel"},
    {"experimental.enable_compiled_autograd", "removed (compiled autograd); tetra's backward is compiled C"},
    {"parallelism.enable_compiled_autograd", "removed (compiled autograd); tetra's backward is compiled C"},
    {"experimental.custom_model_path", "removed: a Python model module (tetra builds Llama 3 from model.flavor)"},
    {"checkpoint.enable_checkpoint", "renamed checkpoint.enable"},
    {"checkpoint.interval_type", "removed: checkpoint.interval counts steps"},
    {"checkpoint.model_weights_only", "renamed checkpoint.last_save_model_only"},
    {"checkpoint.last_save_model_weights_only", "renamed checkpoint.last_save_model_only"},
    {"checkpoint.initial_load_model_weights_only", "renamed checkpoint.initial_load_model_only"},
    {"checkpoint.last_save_in_safetensors_format", "renamed checkpoint.last_save_in_hf"},
    {"float8.enable_float8_linear", "replaced by model.converters = [\"float8\"]"},
    {"float8.enable_fsdp_float8_all_gather", "moved to quantize.linear.float8.enable_fsdp_float8_all_gather"},
    {"float8.precompute_float8_dynamic_scale_for_fsdp",
     "moved to quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp"},
    {"float8.recipe_name", "moved to quantize.linear.float8.recipe_name"},
    {"float8.filter_fqns", "moved to quantize.linear.float8.filter_fqns"},
    {"float8.emulate", "moved to quantize.linear.float8.emulate"},
    {"float8.force_recompute_fp8_weight_in_bwd", "removed (the float8 weight is not kept for backward by default)"},
    {"float8.moe_fqns_prototype", "moved to quantize.grouped_mm.float8.fqns (mixture of experts)"},
    {"float8.scaling_type_input", "removed: scaling is dynamic (quantize.linear.float8.recipe_name)"},
    {"float8.scaling_type_weight", "removed: scaling is dynamic (quantize.linear.float8.recipe_name)"},
    {"float8.scaling_type_grad_output", "removed: scaling is dynamic (quantize.linear.float8.recipe_name)"},
    {"mx.recipe_name", "moved to quantize.linear.mx.recipe_name"},
    {"mx.filter_fqns", "moved to quantize.linear.mx.filter_fqns"},
    {"mx.mxfp8_dim1_cast_kernel_choice", "moved to quantize.linear.mx.mxfp8_dim1_cast_kernel_choice"},
    {"mx.use_fp8_dim1_cast_triton_kernel", "replaced by quantize.linear.mx.mxfp8_dim1_cast_kernel_choice"},
    {"mx.moe_fqns_prototype", "moved to quantize.grouped_mm.mx.fqns (mixture of experts)"},
    {"job.print_args", "renamed job.print_config"},
    {"job.use_for_integration_test", "removed"},
    {"lr_scheduler.lr_min", "renamed lr_scheduler.min_lr_factor"},
    {"memory_estimation.enabled", "renamed memory_estimation.enable"},
    {"metrics.enable_color_printing", "replaced by metrics.disable_color_printing (the opposite flag)"},
    {"metrics.rank_0_only", "replaced by metrics.save_for_all_ranks (the opposite flag)"},
    {"model.norm_type", "removed: Llama 3's norm is RMSNorm"},
    {"model.use_flex_attn", "removed: the attention follows model.flavor"},
    {"optimizer.fused", "replaced by optimizer.implementation"},
    {"profiling.run_profiler", "renamed profiling.enable_profiling"},
    {"profiling.profile_every_x_iter", "renamed profiling.profile_freq"},
    {"validation.enabled", "renamed validation.enable"},
    {"fault_tolerance.module_fqns_per_model_fragment",
     "refused: Streaming DiLoCo's model fragments are TorchFT's, which tetra does not have"},
};

const char *cfg_compat_renamed(const char *full_key) {
    for (size_t i = 0; i < sizeof renamed / sizeof renamed[0]; i++)
        if (!strcmp(renamed[i].old, full_key)) return renamed[i].now;
    return NULL;
}

/* ---- keys tetra knows and refuses in any form ------------------------------- */
const char *cfg_compat_retired(const char *full_key) {
    if (!strcmp(full_key, "model.tokenizer_path"))
        return "deprecated in TorchTitan (model.hf_assets_path) and not read by tetra: training reads token "
               "shards, and `tetra data prepare --tokenizer` applies the tokenizer";
    return NULL;
}

/* ---- moved keys and the 2026 names -------------------------------------------- */

static cfg_origin *origin_of(tetra_config *c, const char *section, const char *key) {
    return &c->origin[cfg_find_key(section, key) - cfg_keys];
}

static int is_set(const tetra_config *c, const char *section, const char *key) {
    return c->origin[cfg_find_key(section, key) - cfg_keys].kind != CFG_FROM_DEFAULT;
}

/* `to` takes `value` from `from` (a moved or derived key); both set to different values
 * is an error naming both places. */
static int take(tetra_config *c, const char *fs, const char *fk, const char *ts, const char *tk, int64_t *dst,
                int64_t value, char *err, size_t n) {
    char w1[256], w2[256];
    if (is_set(c, ts, tk) && *dst != value) {
        util_set_err(err, n,
                     "%s: %s.%s = %" PRId64 " and %s: %s.%s gives %" PRId64 ": set one of them (they are the "
                     "same key in TorchTitan's other spelling)",
                     cfg_origin_str(c, ts, tk, w1, sizeof w1), ts, tk, *dst, cfg_origin_str(c, fs, fk, w2, sizeof w2),
                     fs, fk, value);
        return -1;
    }
    *dst = value;
    *origin_of(c, ts, tk) = *origin_of(c, fs, fk);
    return 0;
}

/* tokens / seq_len, exactly */
static int tokens_to_sequences(tetra_config *c, const char *key, int64_t tokens, int64_t *out, char *err, size_t n) {
    const int64_t T = c->v.training.seq_len;
    char w[256];
    if (tokens < 1 || T < 1 || tokens % T != 0) {
        util_set_err(err, n,
                     "%s: training.%s = %" PRId64 " is not a whole number of sequences of training.seq_len = "
                     "%" PRId64 " tokens; tetra batches whole sequences (TorchTitan's 2026 name converts only when "
                     "seq_len divides it)",
                     cfg_origin_str(c, "training", key, w, sizeof w), key, tokens, T);
        return -1;
    }
    *out = tokens / T;
    return 0;
}

static int resolve_moved(tetra_config *c, char *err, size_t n) {
    tetra_config_values *v = &c->v;
    if (is_set(c, "debug", "seed") &&
        take(c, "debug", "seed", "training", "seed", &v->training.seed, v->debug.seed, err, n))
        return -1;
    if (is_set(c, "debug", "deterministic")) {
        int64_t d = v->training.deterministic;
        if (take(c, "debug", "deterministic", "training", "deterministic", &d, v->debug.deterministic, err, n))
            return -1;
        v->training.deterministic = (int)d;
    }
    if (is_set(c, "training", "max_context_length") &&
        take(c, "training", "max_context_length", "training", "seq_len", &v->training.seq_len,
             v->training.max_context_length, err, n))
        return -1;
    return 0;
}

/* TorchTitan 2026: tokens per forward of one data-parallel rank, and pipeline microbatches
 * per step: local_batch_size = microbatches x sequences per forward */
static int resolve_batch(tetra_config *c, char *err, size_t n) {
    tetra_config_values *v = &c->v;
    const int tok = is_set(c, "training", "num_tokens_per_microbatch_per_dp_rank");
    const int nmb = is_set(c, "parallelism", "num_pp_microbatches");
    if (nmb && v->parallelism.num_pp_microbatches < 1) {
        char w[256];
        util_set_err(err, n, "%s: parallelism.num_pp_microbatches must be >= 1",
                     cfg_origin_str(c, "parallelism", "num_pp_microbatches", w, sizeof w));
        return -1;
    }
    const int64_t k = nmb ? v->parallelism.num_pp_microbatches : 1;
    if (tok) {
        int64_t mb;
        if (tokens_to_sequences(c, "num_tokens_per_microbatch_per_dp_rank",
                                v->training.num_tokens_per_microbatch_per_dp_rank, &mb, err, n) ||
            take(c, "training", "num_tokens_per_microbatch_per_dp_rank", "training", "local_batch_size",
                 &v->training.local_batch_size, k * mb, err, n))
            return -1;
        if ((nmb || v->parallelism.pipeline_parallel_degree > 1) &&
            take(c, "training", "num_tokens_per_microbatch_per_dp_rank", "parallelism",
                 "pipeline_parallel_microbatch_size", &v->parallelism.pipeline_parallel_microbatch_size, mb, err, n))
            return -1;
    } else if (nmb &&
               take(c, "parallelism", "num_pp_microbatches", "training", "local_batch_size",
                    &v->training.local_batch_size, k * v->parallelism.pipeline_parallel_microbatch_size, err, n)) {
        return -1;
    }
    if (is_set(c, "training", "num_tokens_per_train_step")) {
        int64_t g;
        if (tokens_to_sequences(c, "num_tokens_per_train_step", v->training.num_tokens_per_train_step, &g, err, n) ||
            take(c, "training", "num_tokens_per_train_step", "training", "global_batch_size",
                 &v->training.global_batch_size, g, err, n))
            return -1;
    }
    return 0;
}

int cfg_compat_resolve(tetra_config *c, char *err, size_t n) {
    if (resolve_moved(c, err, n)) return -1;
    return resolve_batch(c, err, n);
}

/* ---- features tetra does not have ---------------------------------------------- */

#define FT_MODULE "torchtitan.components.ft.config"

int cfg_compat_check(const tetra_config *c, char *err, size_t n) {
    const tetra_config_values *v = &c->v;
    const char *mb = "torch.compile's min-cut partitioner; tetra's recompute plans are none, selective (every "
                     "N-th block, or \"op\") and full, and `tetra plan` shows each plan's memory";
    const char *moe = "it configures mixture-of-experts layers, and Llama 3 is dense";
    const char *cm = v->job.custom_config_module ? v->job.custom_config_module : "";
    struct {
        int set;
        const char *section, *key, *why;
    } no[] = {
        {v->fault_tolerance.enable, "fault_tolerance", "enable",
         "TorchFT's replica groups are not built in tetra; ./run_train.sh with TETRA_MAX_RESTARTS=N restarts a "
         "failed run from its newest checkpoint (docs/getting_started.md); set it to false"},
        {!strcmp(v->activation_checkpoint.mode, "memory_budget"), "activation_checkpoint", "mode", mb},
        {v->activation_checkpoint.visualize_memory_budget_pareto, "activation_checkpoint",
         "visualize_memory_budget_pareto", mb},
        {v->checkpoint.initial_load_in_hf_quantized, "checkpoint", "initial_load_in_hf_quantized",
         "tetra reads Hugging Face safetensors in bf16, fp16 or fp32, not quantized ones"},
        {v->debug.moe_force_load_balance, "debug", "moe_force_load_balance", moe},
        {strcmp(v->parallelism.expert_parallel_comm_backend, "standard") != 0, "parallelism",
         "expert_parallel_comm_backend", moe},
        {v->quantize_grouped_mm_float8.fqns.n > 0, "quantize.grouped_mm.float8", "fqns", moe},
        {v->quantize_grouped_mm_mx.fqns.n > 0, "quantize.grouped_mm.mx", "fqns", moe},
        {v->experimental.custom_import && v->experimental.custom_import[0], "experimental", "custom_import",
         "it imports a Python module, and tetra runs no Python"},
        {v->experimental.custom_args_module && v->experimental.custom_args_module[0], "experimental",
         "custom_args_module", "it names a Python module, and tetra runs no Python"},
        {cm[0] && strcmp(cm, FT_MODULE) != 0, "job", "custom_config_module",
         "it names a Python module, and tetra reads only its own TOML keys (the one module it knows is " FT_MODULE
         ", whose fault_tolerance keys are in tetra's schema)"},
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (no[i].set) {
            char w[256];
            util_set_err(err, n, "%s: %s.%s is not supported: %s",
                         cfg_origin_str(c, no[i].section, no[i].key, w, sizeof w), no[i].section, no[i].key, no[i].why);
            return -1;
        }
    return 0;
}

/* ---- keys with no effect ----------------------------------------------------------- */
static const struct {
    const char *key, *why;
} no_effect[] = {
    {"training.dataloader.num_workers", "tetra's loader reads memory-mapped shards in the trainer's own process"},
    {"training.dataloader.persistent_workers", "tetra's loader has no worker processes"},
    {"training.dataloader.pin_memory", "the trainer stages batches itself"},
    {"training.dataloader.prefetch_factor", "tetra's loader has no worker processes"},
    {"validation.dataloader.num_workers", "tetra's loader reads memory-mapped shards in the trainer's own process"},
    {"validation.dataloader.persistent_workers", "tetra's loader has no worker processes"},
    {"validation.dataloader.pin_memory", "the trainer stages batches itself"},
    {"validation.dataloader.prefetch_factor", "tetra's loader has no worker processes"},
    {"training.gc_freq", "tetra has no garbage collector"},
    {"profiling.profiler_warmup", "tetra's tracer needs no warm-up"},
    {"compile.enable", "tetra's kernels are compiled ahead of time"},
    {"compile.components", "tetra's kernels are compiled ahead of time"},
    {"compile.backend", "tetra's kernels are compiled ahead of time"},
    {"optimizer.implementation", "tetra runs one fused AdamW pass per shard"},
    {"activation_checkpoint.preserve_rng_state", "tetra's forward draws no random numbers"},
    {"activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns",
     "tetra's per-op policy is fixed, and dense Llama 3 has no router"},
    {"activation_checkpoint.memory_budget", "it acts only with mode = \"memory_budget\", which tetra refuses"},
    {"activation_checkpoint.determinism_check", "tetra's recompute is bit-identical by construction"},
    {"activation_checkpoint.debug", "PyTorch's recompute log has no counterpart"},
    {"parallelism.pipeline_parallel_expert_parallel_overlap", "Llama 3 has no experts"},
    {"checkpoint.enable_ft_dataloader_checkpoints", "TorchFT is not built"},
    {"quantize.linear.mx.mxfp8_dim1_cast_kernel_choice", "the mx converter is not built"},
    {"quantize.linear.mx.recipe_name", "the mx converter is not built"},
    {"quantize.linear.mx.filter_fqns", "the mx converter is not built"},
    {"quantize.grouped_mm.mx.recipe_name", "Llama 3 has no experts"},
    {"memory_estimation.disable_fake_mode", "tetra's estimate never allocates device memory"},
    {"fault_tolerance.process_group", "TorchFT is not built"},
    {"fault_tolerance.process_group_timeout_ms", "TorchFT is not built"},
    {"fault_tolerance.replica_id", "TorchFT is not built"},
    {"fault_tolerance.group_size", "TorchFT is not built"},
    {"fault_tolerance.min_replica_size", "TorchFT is not built"},
    {"fault_tolerance.semi_sync_method", "TorchFT is not built"},
    {"fault_tolerance.sync_steps", "TorchFT is not built"},
    {"fault_tolerance.should_quantize", "TorchFT is not built"},
    {"fault_tolerance.fragment_sync_delay", "TorchFT is not built"},
    {"fault_tolerance.fragment_update_alpha", "TorchFT is not built"},
    {"fault_tolerance.num_fragments", "TorchFT is not built"},
    {"debug.deterministic_warn_only", "with deterministic = true every tetra kernel is deterministic"},
    {"job.custom_config_module", "the fault_tolerance keys of " FT_MODULE " are in tetra's schema"},
};

void cfg_compat_notices(const tetra_config *c, void (*emit)(const char *line, void *ctx), void *ctx) {
    for (size_t i = 0; i < sizeof no_effect / sizeof no_effect[0]; i++) {
        const char *dot = strrchr(no_effect[i].key, '.');
        char section[128];
        snprintf(section, sizeof section, "%.*s", (int)(dot - no_effect[i].key), no_effect[i].key);
        const cfg_key_desc *d = cfg_find_key(section, dot + 1);
        if (!d || !cfg_is_changed(c, d)) continue;
        char val[160], where[256], line[768];
        snprintf(line, sizeof line, "%s = %s (%s) has no effect in tetra: %s", no_effect[i].key,
                 cfg_value_text(c, d, val, sizeof val), cfg_origin_str(c, section, dot + 1, where, sizeof where),
                 no_effect[i].why);
        emit(line, ctx);
    }
}
