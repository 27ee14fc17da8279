#include "engine/job.h"

#include <string.h>

#include "engine/converter.h"
#include "util/err.h"

static int check_converters(const tetra_config *c, char *err, size_t n) {
    const cfg_list *l = &c->v.model.converters;
    char where[600];
    cfg_origin_str(c, "model", "converters", where, sizeof where);
    for (int i = 0; i < l->n; i++) {
        if (!converter_find(l->items[i])) {
            char names[256];
            converter_list(names, sizeof names);
            util_set_err(err, n, "%s: model.converters: unknown converter \"%s\" (available: %s)", where, l->items[i],
                         names);
            return -1;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(l->items[i], l->items[j])) {
                util_set_err(err, n, "%s: model.converters: \"%s\" is listed twice", where, l->items[i]);
                return -1;
            }
    }
    return 0;
}

/* The one rule for "flavor + overrides"; cfg_validate has checked every value. */
static void resolve_model(const tetra_config_values *v, llama3_args *a) {
    llama3_flavor(v->model.flavor, a);
    if (v->model.vocab_size > 0) a->vocab_size = (int)v->model.vocab_size;
    if (v->model.n_layers > 0) a->n_layers = (int)v->model.n_layers;
    if (v->model.attn_mask_type) llama3_parse_mask(v->model.attn_mask_type, &a->attn_mask_type);
    a->reset_positions = v->model.reset_positions_at_document_boundaries != 0;
}

int job_resolve(const tetra_config *c, int world, tetra_job *job, char *err, size_t errlen) {
    memset(job, 0, sizeof *job);
    if (cfg_validate(c, world, &job->dims, err, errlen)) return -1;
    if (check_converters(c, err, errlen)) return -1;
    const tetra_config_values *v = &c->v;
    resolve_model(v, &job->model);
    if (pp_schedule_kind_parse(v->parallelism.pipeline_parallel_schedule, &job->pp_schedule)) {
        char where[600];
        cfg_origin_str(c, "parallelism", "pipeline_parallel_schedule", where, sizeof where);
        util_set_err(err, errlen, "%s: parallelism.pipeline_parallel_schedule \"%s\" is unknown (schedules: %s)", where,
                     v->parallelism.pipeline_parallel_schedule, pp_schedule_kind_list());
        return -1;
    }
    for (int i = 0; i < v->model.converters.n; i++) job->float8 |= !strcmp(v->model.converters.items[i], "float8");
    return 0;
}
