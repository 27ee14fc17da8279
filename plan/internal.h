/* internal.h — the parts of `tetra plan` shared between its files. */
#ifndef TETRA_PLAN_INTERNAL_H
#define TETRA_PLAN_INTERNAL_H

#include <jansson.h>

#include "config/config.h"
#include "engine/job.h"
#include "plan/estimate.h"
#include "plan/hw.h"

/* `tetra plan --job.config_file ...` (argv[0] is "plan"). */
int plan_config_main(int argc, char **argv);
/* dst = a copy of src with kv[0..n) ("section.key", value pairs) changed (dst is
 * initialised either way: cfg_free it). 0 or -1 with err. */
int plan_cfg_with(tetra_config *dst, const tetra_config *src, const char **kv, int n, char *err, size_t errlen);
/* The one of names[0..n) a mistyped option ("--ngpus", "--ngpus=8") most likely meant, or NULL. */
const char *plan_nearest_option(const char *arg, const char *const *names, size_t n);
/* base with kv[0..n) ("section.key", value pairs) changed, estimated. 0 or -1 with err. */
int plan_try(plan_result *r, const tetra_config *base, const char **kv, int n, int ngpu, int gpus_per_node,
             const plan_hw *hw, char *err, size_t errlen);
/* The estimate as one JSON object (plan.h's keys). */
json_t *plan_result_json(const plan_result *r, const tetra_config *cfg, const plan_hw *hw);
/* The planner's cost model is Llama 3's (models/llama3/family.h): 0 when the job's model
 * is Llama, else -1 with err naming model.name. */
int plan_check_llama(const tetra_job *job, char *err, size_t errlen);
/* `--recommend`: prints the top layouts; the exit status. */
int plan_recommend(const tetra_config *cfg, int ngpu, int gpus_per_node, const plan_hw *hw, int top, int json);

#endif
