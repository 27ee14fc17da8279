/* family.c — Llama 3's model_family table: thin adapters from the generic handles to
 * the model (model.h), its parallelization (parallelize.h), its weights (init.h, hf.h,
 * hf_checkpoint.h) and its document masks (documents.h). */
#define _POSIX_C_SOURCE 200809L

#include "models/llama3/family.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama3/documents.h"
#include "models/llama3/hf.h"
#include "models/llama3/hf_checkpoint.h"
#include "models/llama3/parallelize.h"

_Static_assert(sizeof(llama3_args) <= MODEL_ARGS_BYTES, "llama3_args must fit in model_args");
_Static_assert(LLAMA3_FWD_SCRATCH_SHARED == MODEL_FWD_SCRATCH_SHARED, "the shared forward scratch is one value");

model_args llama3_model_args(const llama3_args *a) {
    model_args m;
    memset(&m, 0, sizeof m);
    m.family = &llama3_family;
    memcpy(m.u.bytes, a, sizeof *a);
    return m;
}

const llama3_args *llama3_args_of(const model_args *a) {
    return a && a->family == &llama3_family ? (const llama3_args *)(const void *)a->u.bytes : NULL;
}

llama3_model *llama3_stage_model(const model_stage *s) { return s && s->family == &llama3_family ? s->impl : NULL; }

#define ARGS(a) ((const llama3_args *)(const void *)(a)->u.bytes)
#define MODEL(s) ((llama3_model *)(s)->impl)
#define ACTS(a) ((llama3_acts *)(void *)(a))

/* ---------------------------------------------------------------------------- the job */

static double num_params(const model_args *a) { return (double)llama3_num_params(ARGS(a)); }
static double flops_per_token(const model_args *a, int T) { return llama3_flops_per_token(ARGS(a), T); }
static double flops_per_token_pairs(const model_args *a, double pairs, int T) {
    return llama3_flops_per_token_pairs(ARGS(a), pairs, T);
}
static double attention_pairs(const model_args *a, const int32_t *doc, int T) {
    if (ARGS(a)->attn_mask_type != LLAMA3_MASK_BLOCK_CAUSAL || !doc) return 0.5 * (double)T * (double)(T + 1);
    return llama3_doc_pairs(doc, T);
}
static int needs_documents(const model_args *a) { return llama3_needs_documents(ARGS(a)); }
static int vocab_size(const model_args *a) { return ARGS(a)->vocab_size; }
static json_t *checkpoint_json(const model_args *a, int T) { return llama3_ckpt_model_json(ARGS(a), T); }

/* embedding, norm and output, and 9 tensors per block; a block past the last is named */
static int check_checkpoint(const model_args *ma, const char *const *names, int n, char *err, size_t errlen) {
    const llama3_args *a = ARGS(ma);
    const int64_t want = 3 + 9 * (int64_t)a->n_layers;
    const char *extra = NULL;
    for (int i = 0; i < n && !extra; i++) {
        int layer;
        if (sscanf(names[i], "layers.%d.", &layer) == 1 && layer >= a->n_layers) extra = names[i];
    }
    if (n == want) return 0;
    if (extra)
        snprintf(err, errlen,
                 "holds %d model tensors, this model %lld: it has 'model/%s' and this model has %d blocks "
                 "(model.flavor / model.n_layers differ from the saved run's)",
                 n, (long long)want, extra, a->n_layers);
    else snprintf(err, errlen, "holds %d model tensors, this model %lld (another model?)", n, (long long)want);
    return -1;
}

/* ---------------------------------------------------------------------------- stages */

static int pipeline_stages(const model_args *a, const model_pp_spec *pp, int *n_stages, int *start, int *end, char *err,
                           size_t errlen) {
    return llama3_pipeline_stages(ARGS(a), pp, n_stages, start, end, err, errlen);
}

static void stage_fields(model_stage *s, llama3_model *m) {
    s->impl = m;
    s->n_params = m->n_params;
    s->n_units = m->n_units;
    s->block_start = m->layout.layer_start;
    s->block_end = m->layout.layer_end;
    s->has_input = m->layout.has_embedding;
    s->has_output = m->layout.has_head;
    s->tp_rank = m->layout.tp_rank;
    s->tp_size = m->layout.tp_size;
    s->tp_async = m->tp_async;
    s->tp = m->ctx.tp;
    s->compute_dtype = m->compute_dtype;
    s->residual_width = (size_t)m->args.dim;
    s->keep_all = LLAMA3_KEEP_ALL;
}

static int parallelize(model_stage *s, const model_args *a, int stage, int n_stages, int start, int end,
                       const model_parallel_env *env, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->family = &llama3_family;
    llama3_model *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    if (llama3_parallelize_stage(m, ARGS(a), stage, n_stages, start, end, env, err, errlen)) {
        if (m->params) llama3_model_free(m);
        free(m);
        return -1;
    }
    stage_fields(s, m);
    return 0;
}

static fsdp *fully_shard(model_stage *s, const model_parallel_env *env, dt_param_decl **decl, char *err,
                         size_t errlen) {
    return llama3_fully_shard(MODEL(s), env, decl, err, errlen);
}

static int linears(model_stage *s, model_linear **out) {
    llama3_model *m = MODEL(s);
    int n = 0;
    for (int p = 0; p < m->n_params; p++)
        if (m->is_linear[p]) out[n++] = &m->linears[p];
    return n;
}

static void linear_names(const model_args *ma, void (*name)(void *, const char *), void *user) {
    static const char *const lin[] = {"attention.wq",    "attention.wk",    "attention.wv",   "attention.wo",
                                      "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"};
    char buf[96];
    for (int l = 0; l < ARGS(ma)->n_layers; l++)
        for (size_t j = 0; j < sizeof lin / sizeof lin[0]; j++) {
            snprintf(buf, sizeof buf, "layers.%d.%s", l, lin[j]);
            name(user, buf);
        }
    name(user, "output");
}

static void describe_params(const model_stage *s, void (*line)(void *, const char *), void *user) {
    llama3_describe_params(MODEL(s), line, user);
}

static void stage_free(model_stage *s) {
    if (!s->impl) return;
    llama3_model_free(MODEL(s));
    free(s->impl);
    s->impl = NULL;
}

/* ---------------------------------------------------------------------------- weights */

static const char *param_name(const model_stage *s, int p) { return MODEL(s)->params[p].name; }
static void init_param_range(const model_stage *s, int p, uint64_t seed, size_t start, size_t count, float *out) {
    llama3_init_param_range(&MODEL(s)->params[p], seed, start, count, out);
}
static void *hf_open(const model_args *a, const char *path, char *err, size_t errlen) {
    return llama3_hf_open(ARGS(a), path, err, errlen);
}
static int hf_read(void *rd, const char *name, size_t start, size_t count, float *out, char *err, size_t errlen) {
    return llama3_hf_read(rd, name, start, count, out, err, errlen);
}
static void hf_close(void *rd) { llama3_hf_close(rd); }
static int hf_export(const char *step_dir, const char *out_dir, tetra_dtype dtype, char *err, size_t errlen) {
    llama3_hf_options o;
    memset(&o, 0, sizeof o);
    o.dtype = dtype;
    return llama3_hf_export(step_dir, out_dir, &o, err, errlen);
}
static int hf_save_buffer(const model_stage *s, const float *buf, const char *path, char *err, size_t errlen) {
    return llama3_save_hf_buffer(MODEL(s), buf, path, "float32", err, errlen);
}

/* ---------------------------------------------------------------------------- memory */

static int ac_policy(const model_stage *s, const char *mode, const char *option, unsigned *keep, char *err,
                     size_t errlen) {
    return llama3_ac_policy(MODEL(s), mode, option, keep, err, errlen);
}
static double recompute_flops(const model_stage *s, unsigned keep, int *attention) {
    return llama3_recompute_linear_flops(&MODEL(s)->args, keep, s->tp_size, attention);
}
static model_workspace *workspace_create(const model_stage *s, int b, int t, int fwd, int slots, char *err,
                                         size_t errlen) {
    return (model_workspace *)(void *)llama3_workspace_create(MODEL(s), b, t, fwd, slots, err, errlen);
}
static void workspace_free(const model_stage *s, model_workspace *ws) {
    llama3_workspace_free(MODEL(s), (llama3_workspace *)(void *)ws);
}
static size_t workspace_bytes(const model_stage *s, int b, int t, int fwd, int slots) {
    return llama3_workspace_bytes(MODEL(s), b, t, fwd, slots);
}
static model_acts *acts_create(const model_stage *s, model_workspace *ws, const unsigned *keep, int b, int t, char *err,
                               size_t errlen) {
    return (model_acts *)(void *)llama3_acts_create_ws(MODEL(s), (llama3_workspace *)(void *)ws, keep, b, t, err,
                                                       errlen);
}
static void acts_free(const model_stage *s, model_acts *a) { llama3_acts_free(MODEL(s), ACTS(a)); }
static size_t acts_bytes(const model_stage *s, const unsigned *keep, int b, int t) {
    return llama3_acts_bytes_policy(MODEL(s), keep, b, t);
}
static double tp_traffic_bytes(const model_stage *s, const unsigned *keep, int b, int t) {
    return llama3_tp_traffic_bytes(MODEL(s), keep, b, t);
}

/* ---------------------------------------------------------------------------- passes */

static int set_documents(const model_stage *s, model_acts *a, const int32_t *doc, char *err, size_t errlen) {
    return llama3_acts_set_documents(MODEL(s), ACTS(a), doc, err, errlen);
}
static int unit_block(const model_stage *s, int u) {
    const llama3_unit *un = &MODEL(s)->units[u];
    return un->kind == LLAMA3_UNIT_BLOCK ? un->layer : -1;
}
static const char *unit_name(const model_stage *s, int u) { return MODEL(s)->units[u].name; }

static double forward(model_stage *s, model_acts *a, int u, const int32_t *tokens, const model_loss_io *loss) {
    llama3_model *m = MODEL(s);
    const llama3_unit *un = &m->units[u];
    switch (un->kind) {
    case LLAMA3_UNIT_EMBEDDING: llama3_forward_embedding(m, ACTS(a), tokens); return 0.0;
    case LLAMA3_UNIT_BLOCK: llama3_block_forward(m, ACTS(a), un->layer); return 0.0;
    default:
        if (!loss->loss_dev) return llama3_forward_head(m, ACTS(a), loss->targets, loss->dloss_scale, loss->n_valid);
        llama3_forward_head_to(m, ACTS(a), loss->targets, loss->dloss_scale, loss->n_valid, loss->loss_dev);
        return 0.0;
    }
}

static void backward_input(model_stage *s, model_acts *a, int u) {
    llama3_model *m = MODEL(s);
    const llama3_unit *un = &m->units[u];
    if (un->kind == LLAMA3_UNIT_BLOCK) llama3_block_backward_input(m, ACTS(a), un->layer);
    else if (un->kind == LLAMA3_UNIT_HEAD) llama3_backward_head_input(m, ACTS(a));
}

static void grads_fresh(model_stage *s) { llama3_grads_fresh(MODEL(s)); }

static void backward_weight(model_stage *s, model_acts *a, int u) {
    llama3_model *m = MODEL(s);
    const llama3_unit *un = &m->units[u];
    if (un->kind == LLAMA3_UNIT_BLOCK) llama3_block_backward_weight(m, ACTS(a), un->layer);
    else if (un->kind == LLAMA3_UNIT_HEAD) llama3_backward_head_weight(m, ACTS(a));
    else llama3_backward_embedding(m, ACTS(a));
}

static void *boundary(const model_stage *s, model_acts *a, int at_output, int grad) {
    const int l = at_output ? s->block_end : s->block_start;
    return grad ? llama3_acts_residual_grad(ACTS(a), l) : llama3_acts_residual(ACTS(a), l);
}

const model_family llama3_family = {
    .name = "llama3",
    .num_params = num_params,
    .flops_per_token = flops_per_token,
    .flops_per_token_pairs = flops_per_token_pairs,
    .attention_pairs = attention_pairs,
    .needs_documents = needs_documents,
    .vocab_size = vocab_size,
    .checkpoint_json = checkpoint_json,
    .check_checkpoint = check_checkpoint,
    .pipeline_stages = pipeline_stages,
    .parallelize = parallelize,
    .fully_shard = fully_shard,
    .linears = linears,
    .linear_names = linear_names,
    .describe_params = describe_params,
    .free = stage_free,
    .param_name = param_name,
    .init_param_range = init_param_range,
    .hf_open = hf_open,
    .hf_read = hf_read,
    .hf_close = hf_close,
    .hf_export = hf_export,
    .hf_save_buffer = hf_save_buffer,
    .ac_policy = ac_policy,
    .recompute_flops = recompute_flops,
    .workspace_create = workspace_create,
    .workspace_free = workspace_free,
    .workspace_bytes = workspace_bytes,
    .acts_create = acts_create,
    .acts_free = acts_free,
    .acts_bytes = acts_bytes,
    .tp_traffic_bytes = tp_traffic_bytes,
    .set_documents = set_documents,
    .unit_block = unit_block,
    .unit_name = unit_name,
    .forward = forward,
    .backward_input = backward_input,
    .backward_weight = backward_weight,
    .grads_fresh = grads_fresh,
    .boundary = boundary,
};
