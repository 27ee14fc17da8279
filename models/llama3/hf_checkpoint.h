/* hf_checkpoint.h — Hugging Face Llama safetensors out of (and into) tetra checkpoints.
 *
 * Export reads the "model/<name>" tensors of a checkpoint chunk by chunk (every
 * chunk CRC-checked), renames them to transformers' LlamaForCausalLM names
 * (models/llama3/hf.h), applies the q/k rotary permutation (interleaved pairs
 * -> rotate-half: hf_row[h hd + t hd/2 + i] = row[h hd + 2i + t]) and writes
 * them in the export dtype: one model.safetensors, or, above max_shard_bytes,
 * model-0000X-of-0000Y.safetensors plus model.safetensors.index.json
 * ({"metadata": {"total_size": bytes}, "weight_map": {name: file}}), and a
 * config.json with the LlamaForCausalLM fields. Memory stays bounded by a
 * block of rows (a few MiB) whatever the model size.
 */
#ifndef TETRA_LLAMA3_HF_CHECKPOINT_H
#define TETRA_LLAMA3_HF_CHECKPOINT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "models/llama3/llama3_args.h"

#define LLAMA3_HF_DEFAULT_SHARD_BYTES ((uint64_t)5 * 1000 * 1000 * 1000) /* HF's "5GB" */

typedef struct {
    tetra_dtype dtype;        /* float32, bfloat16 or float16 */
    uint64_t max_shard_bytes; /* 0 = LLAMA3_HF_DEFAULT_SHARD_BYTES */
    int quiet;                /* no progress lines on stdout */
} llama3_hf_options;

/* step_dir: a complete checkpoint (step-N). out_dir is created if needed.
 * Returns 0, or -1 with a message naming the file / tensor. */
int llama3_hf_export(const char *step_dir, const char *out_dir, const llama3_hf_options *o, char *err, size_t errlen);

/* The "model" object the trainer stores in every checkpoint: flavor, sizes, norm
 * eps, RoPE settings and the run's seq_len (max_position_embeddings on export). */
json_t *llama3_ckpt_model_json(const llama3_args *a, int max_seq_len);
/* config.json for those args (HF LlamaConfig fields). bos/eos < 0: omitted. */
json_t *llama3_hf_config_json(json_t *model, tetra_dtype dtype, int64_t bos_id, int64_t eos_id);

/* Import: a Hugging Face Llama checkpoint (file, folder or index) into a
 * single-rank, model-only tetra checkpoint <ckpt_dir>/step-<step>. The flavor is
 * given, or found by matching config.json next to the weights against the
 * known flavors. */
int llama3_hf_import(const char *hf_path, const char *ckpt_dir, int64_t step, const char *flavor, char *err,
                     size_t errlen);

#endif
