/* converter.c — the converter registry and the built-in Float8 converter (the glue from
 * [quantize.linear.float8] to float8/). */
#define _POSIX_C_SOURCE 200809L

#include "engine/converter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "telemetry/log.h"
#include "float8/float8.h"
#include "kernels/cuda_plugin.h"

/* ---------------------------------------------------------------------------- float8 */

/* The compute capability of the first GPU (e.g. 90), or 0 when it cannot be told. */
static int gpu_sm(void) {
    char err[256], buf[256];
    const cuda_kernels_api *api = cuda_kernels(err, sizeof err);
    if (!api || api->device_count() < 1 || api->device_describe(0, buf, (int)sizeof buf)) return 0;
    const char *p = strstr(buf, "(sm_");
    return p ? atoi(p + 4) : 0;
}

/* Does a filter entry name a linear of the whole model? */
typedef struct {
    const char *want;
    int hit;
} filter_probe;

static void probe_name(void *user, const char *name) {
    filter_probe *p = user;
    p->hit |= strstr(name, p->want) != NULL;
}

/* a filter entry that names no linear of the whole model is most likely a typo */
static void check_filter(const float8_config *fc, const model_args *args) {
    for (int i = 0; i < fc->n_filter; i++) {
        filter_probe p = {fc->filter[i], !fc->filter[i][0]};
        if (!p.hit && args && args->family->linear_names) args->family->linear_names(args, probe_name, &p);
        if (!p.hit)
            log_warn("quantize.linear.float8.filter_fqns: \"%s\" matches no linear layer of the model "
                     "(names look like layers.0.attention.wq, layers.3.feed_forward.w2, output)",
                     p.want);
    }
}

static int float8_hook_convert(void **state, model_stage *stage, const converter_env *env, char *err, size_t errlen) {
    const tetra_config_values *c = env->cfg;
    const char *file = env->config_file ? env->config_file : "command line";
    float8_config fc;
    memset(&fc, 0, sizeof fc);
    if (float8_parse_recipe(c->quantize_linear_float8.recipe_name, &fc.recipe)) {
        snprintf(err, errlen,
                 "%s: quantize.linear.float8.recipe_name \"%s\" is unknown (tensorwise, rowwise, "
                 "rowwise_with_gw_hp)",
                 file, c->quantize_linear_float8.recipe_name);
        return -1;
    }
    if (c->quantize_linear_float8.enable_fsdp_float8_all_gather && fc.recipe != FLOAT8_TENSORWISE) {
        snprintf(err, errlen,
                 "%s: quantize.linear.float8.enable_fsdp_float8_all_gather needs recipe_name = "
                 "\"tensorwise\" (got \"%s\"): the gathered weights carry one scale per tensor",
                 file, c->quantize_linear_float8.recipe_name);
        return -1;
    }
    if (c->quantize_linear_float8.precompute_float8_dynamic_scale_for_fsdp && fc.recipe != FLOAT8_TENSORWISE) {
        snprintf(err, errlen,
                 "%s: quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp needs "
                 "recipe_name = \"tensorwise\" (got \"%s\"): rowwise scales are per channel and computed per GEMM",
                 file, c->quantize_linear_float8.recipe_name);
        return -1;
    }
    fc.emulate = c->quantize_linear_float8.emulate;
    fc.precompute_scales = c->quantize_linear_float8.precompute_float8_dynamic_scale_for_fsdp;
    fc.fsdp_fp8_all_gather = c->quantize_linear_float8.enable_fsdp_float8_all_gather;
    fc.weights_per_use = env->weights_per_use;
    fc.codes_per_use = env->stands_for_shard && fc.fsdp_fp8_all_gather;
    fc.n_filter = c->quantize_linear_float8.filter_fqns.n;
    fc.filter = (const char *const *)c->quantize_linear_float8.filter_fqns.items;
    if (!strcmp(env->ops->name, "cuda") && !fc.emulate) {
        const int sm = gpu_sm();
        if (sm > 0 && sm < 89) {
            snprintf(err, errlen,
                     "%s: model.converters = [\"float8\"] needs float8 tensor cores (sm_89 or newer); "
                     "this GPU is sm_%d: set quantize.linear.float8.emulate = true to run the fp8 numerics on "
                     "fp32 GEMMs, or drop the converter",
                     file, sm);
            return -1;
        }
    }
    model_linear **lins = malloc((size_t)(stage->n_params > 0 ? stage->n_params : 1) * sizeof *lins);
    if (!lins) {
        snprintf(err, errlen, "float8: out of host memory");
        return -1;
    }
    const int n_lins = stage->family->linears ? stage->family->linears(stage, lins) : 0;
    float8_model *f = float8_convert(lins, n_lins, env->ops, stage->compute_dtype, &fc, env->max_rows, env->shard,
                                     env->tp, env->dry_run, err, errlen);
    free(lins);
    if (!f) return -1;
    *state = f;
    if (env->rank == 0 && env->stage == 0) {
        check_filter(&fc, env->args);
        const int pre = fc.precompute_scales || fc.fsdp_fp8_all_gather;
        log_info("Float8 %s%s: %d linear layers of stage %d in float8%s%s", float8_recipe_name(fc.recipe),
                 fc.emulate ? " (emulated: fp32 GEMMs on dequantised operands)" : "", float8_converted(f), env->stage,
                 pre ? ", weight scales precomputed after each step" : "",
                 fc.fsdp_fp8_all_gather ? ", FSDP all-gathers them in float8" : "");
    }
    return 0;
}

static int float8_hook_parallelized(void *state, model_stage *m, fsdp *fs, char *err, size_t errlen) {
    (void)m;
    return float8_attach_fsdp((float8_model *)state, fs, err, errlen);
}

static void float8_hook_post_optimizer(void *state, model_stage *m, fsdp *fs) {
    (void)m;
    float8_params_updated((float8_model *)state, fs);
}

static const ops_amax_segments *float8_hook_optimizer_amax(void *state, model_stage *m, fsdp *fs) {
    (void)m;
    return float8_optimizer_amax((float8_model *)state, fs);
}

static size_t float8_hook_bytes(const void *state) { return float8_workspace_bytes((const float8_model *)state); }

static void float8_hook_destroy(void *state) { float8_free((float8_model *)state); }

static const tetra_converter float8_converter = {
    "float8",          float8_hook_convert, float8_hook_parallelized,  NULL, float8_hook_post_optimizer,
    float8_hook_bytes, float8_hook_destroy, float8_hook_optimizer_amax};

/* ---------------------------------------------------------------------------- registry */

enum { MAX_CONVERTERS = 16 };
static const tetra_converter *registry[MAX_CONVERTERS] = {&float8_converter};
static int n_registry = 1;

const tetra_converter *converter_find(const char *name) {
    for (int i = 0; i < n_registry; i++)
        if (!strcmp(registry[i]->name, name)) return registry[i];
    return NULL;
}

int converter_register(const tetra_converter *c) {
    if (!c || !c->name || converter_find(c->name) || n_registry == MAX_CONVERTERS) return -1;
    registry[n_registry++] = c;
    return 0;
}

void converter_list(char *buf, size_t n) {
    size_t o = 0;
    if (n) buf[0] = 0;
    for (int i = 0; i < n_registry && o < n; i++) {
        int w = snprintf(buf + o, n - o, "%s%s", i ? ", " : "", registry[i]->name);
        if (w < 0) break;
        o += (size_t)w;
    }
}
