/* hf.h — Hugging Face Llama checkpoints (safetensors) in and out of a llama3_model.
 *
 * Names follow transformers' LlamaForCausalLM: model.embed_tokens.weight,
 * model.layers.N.self_attn.{q,k,v,o}_proj.weight, model.layers.N.mlp.{gate,up,down}_proj.weight
 * (gate = w1, up = w3, down = w2), model.layers.N.{input,post_attention}_layernorm.weight,
 * model.norm.weight, lm_head.weight.
 *
 * q_proj and k_proj rows are stored in HF's rotate-half order: for head h,
 * i < head_dim/2 and t in {0, 1}, hf_row[h hd + t hd/2 + i] = meta_row[h hd + 2i + t]
 * (transformers' convert_llama_weights_to_hf permute). Saving applies it,
 * loading undoes it, so the model always holds TorchTitan's interleaved pairs.
 */
#ifndef TETRA_LLAMA3_HF_H
#define TETRA_LLAMA3_HF_H

#include <stddef.h>

#include "models/llama3/model.h"

/* HF name of a TorchTitan parameter name; 0, or -1 if it has none. */
int llama3_hf_name(const char *name, char *out, size_t outlen);

/* A Hugging Face checkpoint opened for reading pieces: a safetensors file, a folder
 * holding model.safetensors, or a folder (or index file) with
 * model.safetensors.index.json and its shards. Opening reads every header and checks
 * it against the whole model of these args: F32, BF16 and F16 tensors are accepted; a
 * missing, unexpected, duplicated or wrongly shaped tensor is an error naming the
 * tensor and the file. Then any rank reads just the elements it holds. */
typedef struct llama3_hf_reader llama3_hf_reader;
llama3_hf_reader *llama3_hf_open(const llama3_args *a, const char *path, char *err, size_t errlen);
void llama3_hf_close(llama3_hf_reader *r);
/* Elements [start, start + count) of the global row-major tensor of parameter `name`
 * (TorchTitan name; q/k rows in the model's interleaved order), as fp32 into host
 * memory. 0, or -1 with the file and tensor named. */
int llama3_hf_read(llama3_hf_reader *r, const char *name, size_t start, size_t count, float *out, char *err,
                   size_t errlen);

/* Load every parameter of a model with its own storage (llama3_model_init). Returns 0 or -1. */
int llama3_load_hf(llama3_model *m, const char *path, char *err, size_t errlen);

/* Write the parameters of a whole model with its own storage to one safetensors file
 * with HF names; dtype "float32" or "bfloat16" (round to nearest even). Written to a
 * temporary name, then renamed. */
int llama3_save_hf(const llama3_model *m, const char *path, const char *dtype, char *err, size_t errlen);

/* The same for any buffer in the parameter layout (backend memory, total_numel
 * floats): gradients or optimizer moments, e.g. to compare them with PyTorch. */
int llama3_save_hf_buffer(const llama3_model *m, const float *buf, const char *path, const char *dtype, char *err,
                          size_t errlen);

#endif
