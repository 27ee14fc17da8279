// kernels/cuda/cuda_attention_args.cuh — what the attention kernels of the CUDA backend
// share: the call's shape as the kernels read it, and which (query, key) pairs are visible
// (causal offsets, grouped-query heads, the document mask). Included by cuda_attention.cu
// (the fp32 kernels and the bf16 dispatch) and cuda_attention_tc.cu (the bf16 tensor-core
// kernels); kernels/ops_docmask.h holds the document-mask rules the CPU kernel shares.
#pragma once
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/ops.h"
#include "kernels/ops_docmask.h"

typedef struct {
    int B, Sq, Sk, H, KV, D, rep;
    float scale;
    int causal;
    long long delta; // q_offset - k_offset
    int q_offset, k_offset;
    const int32_t *doc; // [B, doc_len] document ids of the global positions, or NULL
    int doc_len;
} attn_args;

static inline attn_args make_args(const ops_attn_shape *s) {
    attn_args a;
    a.B = s->b;
    a.Sq = s->sq;
    a.Sk = s->sk;
    a.H = s->h;
    a.KV = s->kv;
    a.D = s->d;
    a.rep = s->h / s->kv;
    a.scale = s->scale;
    a.causal = s->causal;
    a.delta = (long long)s->q_offset - (long long)s->k_offset;
    a.q_offset = s->q_offset;
    a.k_offset = s->k_offset;
    a.doc = s->doc;
    a.doc_len = s->doc_len;
    return a;
}

// keys visible to query row i, clamped to [0, Sk]
__host__ __device__ static inline int visible_keys(const attn_args &a, int i) {
    if (!a.causal) return a.Sk;
    long long n = a.delta + i + 1;
    return n < 0 ? 0 : (n > a.Sk ? a.Sk : (int)n);
}

// first query row that sees key j (0 without the mask), clamped to [0, Sq]
__host__ __device__ static inline int first_query(const attn_args &a, int j) {
    if (!a.causal) return 0;
    long long i = (long long)j - a.delta;
    return i < 0 ? 0 : (i > a.Sq ? a.Sq : (int)i);
}

// the first key row query row i of sequence b sees under the document mask (0 without)
__device__ static inline int doc_key_begin(const attn_args &a, int b, int i) {
    if (!a.doc) return 0;
    long long f = (long long)ops_doc_first(a.doc + (size_t)b * a.doc_len, a.q_offset + i) - a.k_offset;
    return f < 0 ? 0 : (f > a.Sk ? a.Sk : (int)f);
}

// one past the last query row of sequence b that sees key row j under the document mask
__device__ static inline int doc_query_end(const attn_args &a, int b, int j) {
    if (!a.doc) return a.Sq;
    long long e = (long long)ops_doc_end(a.doc + (size_t)b * a.doc_len, a.k_offset + j, a.doc_len) - a.q_offset;
    return e < 0 ? 0 : (e > a.Sq ? a.Sq : (int)e);
}

// Raises a kernel's dynamic shared memory limit to smem on its first launch (the
// attention kernels take more than the 48 KiB default).
template <typename K> static inline void attn_configure(K kernel, bool &configured, size_t smem) {
    if (!configured) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
}

__device__ __forceinline__ bool key_visible(const attn_args &a, int b, int qi, int kj) {
    if (a.causal && (long long)kj > a.delta + qi) return false;
    if (!a.doc) return true;
    const int32_t *d = a.doc + (size_t)b * a.doc_len;
    return d[a.q_offset + qi] == d[a.k_offset + kj];
}
