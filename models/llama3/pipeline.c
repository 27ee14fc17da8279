/* pipeline.c — stages of Llama 3 (see pipeline.h). */
#include "models/llama3/pipeline.h"

#include <stdio.h>

int llama3_pp_num_stages(int n_layers, int pp, int layers_per_stage, int input_weight, int output_weight,
                         int single_stage, int *n_stages, char *err, size_t errlen) {
    if (pp < 1 || n_layers < 0 || layers_per_stage < 0 || input_weight < 0 || output_weight < 0) {
        snprintf(err, errlen, "pipeline: bad sizes (pp %d, %d layers, %d per stage)", pp, n_layers, layers_per_stage);
        return -1;
    }
    if (layers_per_stage == 0) {
        *n_stages = pp * (single_stage ? 1 : 2);
        return 0;
    }
    const int eff = n_layers + input_weight + output_weight;
    const int total = (eff + layers_per_stage - 1) / layers_per_stage;
    if (total % pp != 0) {
        snprintf(err, errlen,
                 "parallelism.pipeline_parallel_layers_per_stage %d: %d layers + %d (embedding) + %d (norm and output) "
                 "= %d effective layers make %d stages, which pipeline_parallel_degree %d does not divide",
                 layers_per_stage, n_layers, input_weight, output_weight, eff, total, pp);
        return -1;
    }
    const int per_rank = total / pp;
    if (single_stage && per_rank != 1) {
        snprintf(err, errlen,
                 "parallelism.pipeline_parallel_layers_per_stage %d gives %d stages per rank, but a single-stage "
                 "schedule runs exactly 1 per rank (raise it to %d or more, or pick a multi-stage schedule)",
                 layers_per_stage, per_rank, (eff + pp - 1) / pp);
        return -1;
    }
    *n_stages = total;
    return 0;
}

int llama3_pp_split(int n_layers, int n_stages, int input_weight, int output_weight, int *layer_start, int *layer_end,
                    char *err, size_t errlen) {
    if (n_stages < 1) {
        snprintf(err, errlen, "pipeline: need at least one stage");
        return -1;
    }
    if (n_stages == 1) {
        layer_start[0] = 0;
        layer_end[0] = n_layers;
        return 0;
    }
    const int eff = n_layers + input_weight + output_weight;
    if (n_stages > eff) {
        snprintf(err, errlen,
                 "pipeline: %d stages but only %d effective layers (%d blocks + %d for the embedding + %d for norm and "
                 "output): use fewer stages or more layers",
                 n_stages, eff, n_layers, input_weight, output_weight);
        return -1;
    }
    const int per = eff / n_stages, extra = eff % n_stages;
    if (input_weight > per || output_weight > per) {
        snprintf(err, errlen,
                 "pipeline: parallelism.pipeline_parallel_%s_stage_less_layers = %d exceeds the %d effective layers "
                 "of the smallest stage (%d blocks over %d stages)",
                 input_weight > per ? "first" : "last", input_weight > per ? input_weight : output_weight, per,
                 n_layers, n_stages);
        return -1;
    }
    int cur = 0;
    for (int s = 0; s < n_stages; s++) {
        int share = per + (s < extra ? 1 : 0);
        if (s == 0) share -= input_weight;
        else if (s == n_stages - 1) share -= output_weight;
        layer_start[s] = cur;
        for (int k = 0; k < share && cur < n_layers; k++) cur++;
        layer_end[s] = cur;
    }
    if (cur != n_layers) { /* the shares always add up; a guard against edits */
        snprintf(err, errlen, "pipeline: the split covers %d of %d blocks", cur, n_layers);
        return -1;
    }
    return 0;
}
