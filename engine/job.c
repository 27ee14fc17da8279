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

int job_resolve(const tetra_config *c, int world, tetra_job *job, char *err, size_t errlen) {
    memset(job, 0, sizeof *job);
    if (cfg_validate(c, world, &job->dims, err, errlen)) return -1;
    if (check_converters(c, err, errlen)) return -1;
    const tetra_config_values *v = &c->v;
    cfg_model(v, &job->model);
    if (pp_schedule_kind_parse(v->parallelism.pipeline_parallel_schedule, &job->pp_schedule)) {
        char where[600];
        cfg_origin_str(c, "parallelism", "pipeline_parallel_schedule", where, sizeof where);
        util_set_err(err, errlen, "%s: parallelism.pipeline_parallel_schedule \"%s\" is unknown (schedules: %s)", where,
                     v->parallelism.pipeline_parallel_schedule, pp_schedule_kind_list());
        return -1;
    }
    for (int i = 0; i < v->model.converters.n; i++) job->float8 |= !strcmp(v->model.converters.items[i], "float8");
    /* the schema's enums: their values were checked as they were read */
    fsdp_parse_reshard(v->parallelism.fsdp_reshard_after_forward, &job->reshard);
    cp_parse_rotate(v->parallelism.context_parallel_rotate_method, &job->cp_rotate);
    cp_parse_balancer(v->parallelism.context_parallel_load_balancer, &job->cp_balanced);
    return 0;
}
