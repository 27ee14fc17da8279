#include "models/llama3/parallelize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama3/pipeline.h"

int llama3_pipeline_stages(const llama3_args *a, const model_pp_spec *pp, int *n_stages, int *start, int *end,
                           char *err, size_t errlen) {
    const int L = a->n_layers;
    if (pp->pp == 1) {
        *n_stages = 1;
        start[0] = 0;
        end[0] = L;
        return 0;
    }
    if (llama3_pp_num_stages(L, pp->pp, pp->layers_per_stage, pp->first_stage_less, pp->last_stage_less,
                             pp_schedule_kind_single_stage(pp->kind), n_stages, err, errlen))
        return -1;
    if (pp_schedule_kind_v(pp->kind) && *n_stages != 2 * pp->pp) {
        snprintf(err, errlen,
                 "parallelism.pipeline_parallel_schedule %s places exactly 2 stages per rank (V), but "
                 "pipeline_parallel_layers_per_stage %d gives %d stages for %d ranks",
                 pp_schedule_kind_name(pp->kind), pp->layers_per_stage, *n_stages, pp->pp);
        return -1;
    }
    if (*n_stages > MODEL_MAX_STAGES) {
        snprintf(err, errlen, "pipeline: %d stages; at most %d are supported", *n_stages, MODEL_MAX_STAGES);
        return -1;
    }
    return llama3_pp_split(L, *n_stages, pp->first_stage_less, pp->last_stage_less, start, end, err, errlen);
}

int llama3_parallelize_stage(llama3_model *m, const llama3_args *a, int stage, int n_stages, int start, int end,
                             const model_parallel_env *env, char *err, size_t errlen) {
    int coord[MESH_NDIMS];
    mesh_coords(env->msh, env->rank, coord);
    llama3_layout layout = llama3_layout_full(a);
    layout.layer_start = start;
    layout.layer_end = end;
    layout.has_embedding = stage == 0;
    layout.has_head = stage == n_stages - 1;
    layout.tp_rank = coord[MESH_TP];
    layout.tp_size = env->msh->size[MESH_TP];
    layout.cp_rank = env->cp_rank;
    layout.cp_size = env->cp_size;
    if (llama3_model_init_layout(m, a, &layout, env->dry_run ? LLAMA3_STORAGE_NONE : LLAMA3_STORAGE_EXTERNAL,
                                 env->max_rows, env->ops, err, errlen) ||
        (env->bf16 && llama3_model_set_compute_dtype(m, TETRA_BF16, err, errlen)))
        return -1;
    /* the groups the layout computes over (degree 1: none) */
    m->ctx.tp = env->msh->size[MESH_TP] > 1 ? comm_get(env->cw, MESH_G_TP) : NULL;
    m->ctx.cp = env->msh->size[MESH_CP] > 1 ? comm_get(env->cw, MESH_G_CP) : NULL;
    m->tp_gather_logits = !env->loss_parallel;
    m->tp_async = env->async_tp;
    m->cp_ring = env->rotate == CP_ROTATE_ALLTOALL;
    m->cp_balanced = env->cp_balanced;
    return 0;
}

/* Every parameter by its global coordinates: the tensor-parallel box this rank holds. */
static dt_param_decl *param_decls(const llama3_model *m) {
    dt_param_decl *decl = calloc((size_t)(m->n_params > 0 ? m->n_params : 1), sizeof *decl);
    if (!decl) return NULL;
    for (int p = 0; p < m->n_params; p++) {
        const llama3_param *q = &m->params[p];
        dt_param_decl *d = &decl[p];
        d->name = q->name;
        d->unit = q->unit;
        d->ndim = q->ndim;
        for (int j = 0; j < q->ndim; j++) {
            d->shape[j] = q->shape[j];
            d->box_start[j] = q->box_start[j];
            d->box_shape[j] = q->box_shape[j];
        }
        d->numel = q->numel;
        d->offset = q->offset;
        d->replicated = q->tp_replicated;
    }
    return decl;
}

fsdp *llama3_fully_shard(llama3_model *m, const model_parallel_env *env, dt_param_decl **decl, char *err,
                         size_t errlen) {
    *decl = param_decls(m);
    if (!*decl) {
        snprintf(err, errlen, "out of host memory");
        return NULL;
    }
    const int pipeline = env->msh->size[MESH_PP] > 1;
    fsdp_config fc;
    memset(&fc, 0, sizeof fc);
    fc.ops = env->ops;
    fc.shard = comm_get(env->cw, MESH_G_FSDP);
    fc.replicate = comm_get(env->cw, MESH_G_DP_REPLICATE);
    fc.tp = m->ctx.tp;
    fc.reshard = env->reshard;
    fc.pipeline_parallel = pipeline;
    fc.reduce_at_last_microbatch = pipeline;
    fc.external_work_grads = pipeline; /* the rank's gradient arenas, once the schedule is known */
    fc.compute_dtype = m->compute_dtype;
    fc.n_units = m->n_units;
    fc.unit_offset = m->unit_offset;
    fc.unit_numel = m->unit_numel;
    fc.n_params = m->n_params;
    fc.params_decl = *decl;
    fc.unit_params = m->unit_params;
    fc.unit_grads = m->unit_grads;
    fc.plan_only = env->dry_run;
    fc.offload = env->offload;
    fc.host_ops = env->host_ops;
    fsdp *fs = fsdp_create(&fc, err, errlen);
    if (!fs) return NULL;
    /* the embedding's backward is a scatter: it reads no weights */
    if (llama3_embedding_unit(m) >= 0) fsdp_set_backward_needs_params(fs, llama3_embedding_unit(m), 0);
    return fs;
}

void llama3_describe_params(const llama3_model *m, void (*line)(void *user, const char *text), void *user) {
    for (int p = 0; p < m->n_params; p++) {
        const llama3_param *q = &m->params[p];
        char shape[64] = "", text[256];
        for (int j = 0; j < q->ndim; j++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", j ? ", " : "",
                     (long long)q->shape[j]);
        snprintf(text, sizeof text, "  %-36s [%s]  %s", q->name, shape,
                 m->is_linear[p] ? m->linears[p].impl->name : "(not a linear)");
        line(user, text);
    }
}
