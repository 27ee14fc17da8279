#include "models/llama3/llama3_args.h"

#include <math.h>
#include <string.h>

/* dim, layers, heads, kv_heads, vocab, multiple_of, ffn multiplier, mask */
static const struct {
    const char *name;
    int dim, n_layers, n_heads, n_kv_heads, vocab_size, multiple_of;
    double ffn_dim_multiplier;
    llama3_mask mask;
} flavors[] = {
    {"debugmodel", 256, 6, 16, 16, 2048, 256, 0.0, LLAMA3_MASK_CAUSAL},
    /* TorchTitan v0.2.2's document-masked flavors (its flex / varlen attention backends) */
    {"debugmodel_flex_attn", 256, 6, 16, 16, 2048, 256, 0.0, LLAMA3_MASK_BLOCK_CAUSAL},
    {"debugmodel_varlen_attn", 256, 6, 16, 16, 2048, 256, 0.0, LLAMA3_MASK_BLOCK_CAUSAL},
    /* tiny models for fast tests: GQA and odd sizes on purpose */
    {"tiny", 64, 2, 4, 2, 2048, 32, 0.0, LLAMA3_MASK_CAUSAL},
    {"small", 512, 8, 8, 4, 2048, 256, 0.0, LLAMA3_MASK_CAUSAL},
    {"8B", 4096, 32, 32, 8, 128256, 1024, 1.3, LLAMA3_MASK_CAUSAL},
    {"8B_flex", 4096, 32, 32, 8, 128256, 1024, 1.3, LLAMA3_MASK_BLOCK_CAUSAL},
    {"8B_varlen", 4096, 32, 32, 8, 128256, 1024, 1.3, LLAMA3_MASK_BLOCK_CAUSAL},
    {"70B", 8192, 80, 64, 8, 128256, 4096, 1.3, LLAMA3_MASK_CAUSAL},
    {"405B", 16384, 126, 128, 8, 128256, 4096, 1.2, LLAMA3_MASK_CAUSAL},
};

int llama3_flavor(const char *name, llama3_args *a) {
    for (size_t i = 0; i < sizeof flavors / sizeof flavors[0]; i++) {
        if (strcmp(flavors[i].name, name) != 0) continue;
        memset(a, 0, sizeof *a);
        a->flavor = flavors[i].name;
        a->dim = flavors[i].dim;
        a->n_layers = flavors[i].n_layers;
        a->n_heads = flavors[i].n_heads;
        a->n_kv_heads = flavors[i].n_kv_heads;
        a->vocab_size = flavors[i].vocab_size;
        a->multiple_of = flavors[i].multiple_of;
        a->ffn_dim_multiplier = flavors[i].ffn_dim_multiplier;
        a->norm_eps = 1e-5;
        a->rope_theta = 500000.0;
        a->rope_scaling_factor = 8.0;
        a->rope_low_freq_factor = 1.0;
        a->rope_high_freq_factor = 4.0;
        a->rope_original_max_pos = 8192;
        a->attn_mask_type = flavors[i].mask;
        return 0;
    }
    return -1;
}

const char *llama3_flavor_names(void) {
    return "debugmodel, debugmodel_flex_attn, debugmodel_varlen_attn, tiny, small, 8B, 8B_flex, 8B_varlen, 70B, 405B";
}

int llama3_parse_mask(const char *name, llama3_mask *out) {
    if (!strcmp(name, "causal")) *out = LLAMA3_MASK_CAUSAL;
    else if (!strcmp(name, "block_causal")) *out = LLAMA3_MASK_BLOCK_CAUSAL;
    else return -1;
    return 0;
}

const char *llama3_mask_name(llama3_mask m) { return m == LLAMA3_MASK_BLOCK_CAUSAL ? "block_causal" : "causal"; }

int llama3_needs_documents(const llama3_args *a) {
    return a->attn_mask_type == LLAMA3_MASK_BLOCK_CAUSAL || a->reset_positions;
}

int llama3_head_dim(const llama3_args *a) { return a->dim / a->n_heads; }

int64_t llama3_ffn_hidden(const llama3_args *a) {
    int64_t h = (int64_t)(2 * 4 * (int64_t)a->dim) / 3;
    if (a->ffn_dim_multiplier > 0) h = (int64_t)(a->ffn_dim_multiplier * (double)h);
    return (int64_t)a->multiple_of * ((h + a->multiple_of - 1) / a->multiple_of);
}

int64_t llama3_num_embedding_params(const llama3_args *a) { return (int64_t)a->vocab_size * a->dim; }

int64_t llama3_num_params(const llama3_args *a) {
    int64_t d = a->dim, hd = llama3_head_dim(a), f = llama3_ffn_hidden(a);
    int64_t attn = d * a->n_heads * hd + 2 * d * a->n_kv_heads * hd + a->n_heads * hd * d;
    int64_t ffn = 3 * d * f;
    int64_t block = attn + ffn + 2 * d; /* two RMSNorm weights */
    return 2 * llama3_num_embedding_params(a) + a->n_layers * block + d;
}

double llama3_flops_per_token_pairs(const llama3_args *a, double pairs_per_seq, int seq_len) {
    double n = (double)(llama3_num_params(a) - llama3_num_embedding_params(a));
    return 6.0 * n + 12.0 * a->n_layers * a->n_heads * llama3_head_dim(a) * pairs_per_seq / seq_len;
}

double llama3_flops_per_token(const llama3_args *a, int seq_len) {
    double n = (double)(llama3_num_params(a) - llama3_num_embedding_params(a));
    return 6.0 * n + 6.0 * a->n_layers * a->n_heads * (2.0 * llama3_head_dim(a)) * seq_len;
}
