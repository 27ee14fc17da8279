/* pipeline.h — how Llama 3 is cut into pipeline stages (TorchTitan's
 * pipeline_llm / generate_llm_fqn_per_model_part), so a TorchTitan config splits
 * the same way here.
 *
 * The embedding counts as `input_weight` blocks and norm + output as
 * `output_weight` blocks (pipeline_parallel_first/last_stage_less_layers, default
 * 1 each). Of the L + input_weight + output_weight effective layers each stage
 * gets an equal share, the first (total mod stages) one more; the first stage
 * holds the embedding and its share less input_weight blocks, the last holds its
 * share less output_weight blocks and the head. The number of stages is the
 * pipeline degree times the stages per rank: 1 for single-stage schedules and
 * 2 for multi-stage ones, or, with pipeline_parallel_layers_per_stage = n,
 * ceil(effective layers / n). (TorchTitan also refuses one stage per rank for the
 * multi-stage schedules; PyTorch's looped schedules run it, InterleavedZeroBubble
 * then being ZB-H1, so tetra accepts it.)
 */
#ifndef TETRA_LLAMA3_PIPELINE_H
#define TETRA_LLAMA3_PIPELINE_H

#include <stddef.h>

/* How many stages in all. layers_per_stage 0 = not set. single_stage: the
 * schedule runs one stage per rank (GPipe, 1F1B). 0, or -1 with the rule and
 * the numbers in err. */
int llama3_pp_num_stages(int n_layers, int pp, int layers_per_stage, int input_weight, int output_weight,
                         int single_stage, int *n_stages, char *err, size_t errlen);

/* Blocks [layer_start[s], layer_end[s]) of every stage s < n_stages. 0, or -1 with
 * the rule in err (more stages than effective layers, a weight larger than a
 * stage's share). */
int llama3_pp_split(int n_layers, int n_stages, int input_weight, int output_weight, int *layer_start, int *layer_end,
                    char *err, size_t errlen);

#endif
