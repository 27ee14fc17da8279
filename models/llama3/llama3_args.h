/* llama3_args.h — Llama 3 / 3.1 model arguments and the named flavors.
 *
 * Flavors are TorchTitan's (debugmodel, 8B, 70B, 405B) plus small ones the
 * tests use. Derived sizes (FFN hidden width, parameter count, FLOPs per
 * token) follow TorchTitan's formulas so logs and MFU agree with it.
 */
#ifndef TETRA_LLAMA3_ARGS_H
#define TETRA_LLAMA3_ARGS_H

#include <stdint.h>

typedef struct {
    const char *flavor;
    int dim;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int vocab_size;
    int multiple_of;
    double ffn_dim_multiplier;      /* 0 = none */
    double norm_eps;
    double rope_theta;
    /* Llama 3.1 RoPE frequency scaling */
    double rope_scaling_factor;     /* 8.0 */
    double rope_low_freq_factor;    /* 1.0 */
    double rope_high_freq_factor;   /* 4.0 */
    int rope_original_max_pos;      /* 8192 */
} llama3_args;

/* Fill *a for a flavor name; returns 0, or -1 for an unknown name. */
int llama3_flavor(const char *name, llama3_args *a);
/* Comma-separated list of flavor names (for messages). */
const char *llama3_flavor_names(void);

int llama3_head_dim(const llama3_args *a);
int64_t llama3_ffn_hidden(const llama3_args *a);
/* Total parameters and the embedding's share (untied embedding + output). */
int64_t llama3_num_params(const llama3_args *a);
int64_t llama3_num_embedding_params(const llama3_args *a);
/* TorchTitan's count: 6*(N - N_emb) + 6*L*H*(2*head_dim)*T, T = seq_len. */
double llama3_flops_per_token(const llama3_args *a, int seq_len);

#endif
