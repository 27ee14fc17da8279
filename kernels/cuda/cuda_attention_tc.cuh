// kernels/cuda/cuda_attention_tc.cuh — the bf16 attention's built-in kernels on the tensor
// cores (cuda_attention_tc.cu), for the calls cuDNN's fused SDPA does not take (document
// masks, causal blocks with unequal offsets, no deterministic plan, a build without
// cuDNN) with head dims up to 128 (ops_path_attention_tc). Same contract as the bf16 ops
// of kernels/ops.h: out and the gradients are written (rounded once), lse is
// max + log(sum) of the scaled, masked scores, a row that sees no key gets out = 0 and
// lse = -inf, and its gradients are zero.
#pragma once
#include <stdint.h>

#include "kernels/cuda/cuda_attention_args.cuh"

// out [B, Sq, H, D], lse [B, H, Sq]
void cuda_attention_tc_forward(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                               const attn_args &a);

// dq [B, Sq, H, D], dk and dv [B, Sk, KV, D]; Dv [B, H, Sq] = rowsum(dout * out), computed
// by the caller
void cuda_attention_tc_backward(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout, const uint16_t *q,
                                const uint16_t *k, const uint16_t *v, const float *lse, const float *Dv,
                                const attn_args &a);
