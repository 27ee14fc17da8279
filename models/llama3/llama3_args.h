/* llama3_args.h — Llama 3 / 3.1 model arguments and the named flavors.
 *
 * Flavors are TorchTitan's (debugmodel, 8B, 70B, 405B, and v0.2.2's document-masked
 * debugmodel_flex_attn, debugmodel_varlen_attn, 8B_flex, 8B_varlen: the same sizes with
 * attn_mask_type = block_causal; flex and varlen name TorchTitan's attention kernels,
 * here both are the one attention op) plus small ones the tests use. Derived sizes (FFN hidden width, parameter count, FLOPs per
 * token) follow TorchTitan's formulas so logs and MFU agree with it.
 */
#ifndef TETRA_LLAMA3_ARGS_H
#define TETRA_LLAMA3_ARGS_H

#include <stdint.h>

/* The attention mask: causal, or TorchTitan's block_causal (causal within each document
 * of a packed sequence: no token attends across a document boundary). */
typedef enum { LLAMA3_MASK_CAUSAL = 0, LLAMA3_MASK_BLOCK_CAUSAL = 1 } llama3_mask;

typedef struct {
    const char *flavor;
    int dim;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int vocab_size;
    int multiple_of;
    double ffn_dim_multiplier; /* 0 = none */
    double norm_eps;
    double rope_theta;
    /* Llama 3.1 RoPE frequency scaling */
    double rope_scaling_factor;   /* 8.0 */
    double rope_low_freq_factor;  /* 1.0 */
    double rope_high_freq_factor; /* 4.0 */
    int rope_original_max_pos;    /* 8192 */
    llama3_mask attn_mask_type;   /* the flavor's; model.attn_mask_type overrides it */
    /* RoPE position of a token = its position within its document (0 at each document's
     * first token) instead of within the sequence; model.reset_positions_at_document_boundaries */
    int reset_positions;
} llama3_args;

/* "causal" | "block_causal" -> *out; 0, or -1 for another name. */
int llama3_parse_mask(const char *name, llama3_mask *out);
const char *llama3_mask_name(llama3_mask m);
/* Does the model need each sequence's document ids (block_causal, or positions reset)? */
int llama3_needs_documents(const llama3_args *a);

/* Fill *a for a flavor name; returns 0, or -1 for an unknown name. */
int llama3_flavor(const char *name, llama3_args *a);
/* Comma-separated list of flavor names (for messages). */
const char *llama3_flavor_names(void);

int llama3_head_dim(const llama3_args *a);
int64_t llama3_ffn_hidden(const llama3_args *a);
/* Total parameters and the embedding's share (untied embedding + output). */
int64_t llama3_num_params(const llama3_args *a);
int64_t llama3_num_embedding_params(const llama3_args *a);
/* TorchTitan's count: 6*(N - N_emb) + 6*L*H*(2*head_dim)*T, T = seq_len. It counts every
 * query against every key of its sequence (T^2 score pairs), as if nothing were masked. */
double llama3_flops_per_token(const llama3_args *a, int seq_len);
/* The count with the attention the mask leaves: 6*(N - N_emb) + 12*L*H*head_dim*P/T, P the
 * visible (query, key) pairs of a sequence of T tokens: T(T+1)/2 causal, the sum of
 * n(n+1)/2 over its documents under block_causal. P = T^2 is TorchTitan's count. */
double llama3_flops_per_token_pairs(const llama3_args *a, double pairs_per_seq, int seq_len);

#endif
