// kernels/cuda/cuda_common.cuh — what every translation unit of the CUDA backend shares:
// error checks that abort with file:line, launch-size helpers, the compute stream,
// bf16/fp32 element access, deterministic warp and block reductions, and growable
// scratch buffers in device memory.
//
// Streams: every op runs on ONE compute stream, cuda_stream(), created at backend init
// with cudaStreamCreate's default flags, i.e. a blocking stream: work issued to the legacy
// default stream (synchronous cudaMemcpy, cudaEventRecord(ev, 0)) still waits for it and
// it for that work, so code outside the backend that assumes "stream 0" stays ordered.
// Kernel launches, cuBLASLt matmuls, CUB sorts, the cuDNN calls and the ops' copies are
// all issued on it; synchronize() waits for it. Collectives order themselves after it
// with events (ops.h compute_stream).
//
// Memory: device memory is taken at start-up. Backend init (the first alloc or op of the
// process; see cuda_ops.h) creates the stream, the cuBLASLt handle and workspace and the
// constant one; after that only ops.alloc and scratch growth allocate, both tracked
// (alloc_count, allocated_bytes) and both refused after memory_freeze(1).
#ifndef TETRA_KERNELS_CUDA_COMMON_CUH
#define TETRA_KERNELS_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/ops_math.h"

// ----------------------------------------------------------------------------
// error checks: print where and why, then abort (no error propagation, as llm.c)

static inline void tetra_cuda_check(cudaError_t e, const char *what, const char *file, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "[CUDA ERROR] %s:%d: %s: %s (%s)\n", file, line, what, cudaGetErrorString(e),
                cudaGetErrorName(e));
        abort();
    }
}
#define CUDA_CHECK(x) tetra_cuda_check((x), #x, __FILE__, __LINE__)
// after every kernel launch: catches bad launch configurations at once
#define CUDA_CHECK_LAUNCH() tetra_cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// ----------------------------------------------------------------------------
// launch sizes

#define TETRA_THREADS 256
// Grid-stride loops never need more blocks than this; more only adds scheduling cost.
#define TETRA_MAX_BLOCKS 8192

static inline unsigned tetra_blocks(size_t n, int threads) {
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    if (b < 1) b = 1;
    if (b > TETRA_MAX_BLOCKS) b = TETRA_MAX_BLOCKS;
    return (unsigned)b;
}

static inline int tetra_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// The backend's compute stream (initialises the backend on first use). Every launch in
// kernels/cuda passes it: k<<<grid, block, smem, cuda_stream()>>>(...).
cudaStream_t cuda_stream(void);

// ----------------------------------------------------------------------------
// element access for the kernels templated on the activation type (fp32 or bf16 stored as
// uint16_t): widen exactly on load, round once to nearest even on store (ops_math.h).

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(uint16_t x) { return tetra_bf16_to_f32(x); }
__device__ __forceinline__ void store_f32(float *p, float v) { *p = v; }
__device__ __forceinline__ void store_f32(uint16_t *p, float v) { *p = tetra_f32_to_bf16(v); }
// store_f32 that also returns the value as stored (what a later read would widen to)
__device__ __forceinline__ float store_f32_as(float *p, float v) {
    *p = v;
    return v;
}
__device__ __forceinline__ float store_f32_as(uint16_t *p, float v) {
    const uint16_t b = tetra_f32_to_bf16(v);
    *p = b;
    return tetra_bf16_to_f32(b);
}

// 16 bytes of T moved as one access (an aligned 16-byte struct compiles to one 128-bit load
// or store): N elements, each widened and rounded as the scalar accessors above do.
template <typename T> struct alignas(16) vec16 {
    static constexpr int N = 16 / (int)sizeof(T);
    T e[16 / sizeof(T)];
};
template <typename T> __device__ __forceinline__ vec16<T> load16(const T *p) { return *(const vec16<T> *)p; }
template <typename T> __device__ __forceinline__ void store16(T *p, const vec16<T> &v) { *(vec16<T> *)p = v; }

// ----------------------------------------------------------------------------
// reductions. Shuffle-xor trees and a fixed warp order: the same inputs in the same
// threads always give the same bits (no atomics anywhere in the backend's float sums).

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// max of |values| that keeps NaN (fmaxf would drop it)
__device__ __forceinline__ float nan_max(float a, float b) {
    if (a != a || b != b) return __int_as_float(0x7fc00000);
    return a > b ? a : b;
}

__device__ __forceinline__ float warp_nan_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// nan_max over a one-dimensional block (every thread gets it); shared: 32 floats
__device__ __forceinline__ float block_nan_max(float v, float *shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_nan_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float r = lane < nwarps ? shared[lane] : 0.0f;
    return warp_nan_max(r);
}

// amax in one launch (amax ops, and the element-wise kernels that emit the amax of what
// they write): each block hands in its K maxima m (block_nan_max results); thread 0 stores
// them as partials (part[j * gridDim.x + block], at most 1024 blocks, part from
// cuda_amax_part) and counts the block done; the last block to finish reduces the partials
// into *outs[j] (those not NULL) and resets the counter (cuda_amax_counter) for the next
// reduction. Maxima do not depend on order, so the bits are those of any order. last: a
// __shared__ int.
template <int K>
__device__ __forceinline__ void amax_finish(float *const *outs, float *part, unsigned *done, const float *m, float *sh,
                                            int *last) {
    if (threadIdx.x == 0) {
        for (int j = 0; j < K; j++) part[j * gridDim.x + blockIdx.x] = m[j];
        __threadfence();
        *last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!*last) return;
    __threadfence();
    const volatile float *vp = part;
    for (int j = 0; j < K; j++) {
        float r = 0.0f;
        for (int i = threadIdx.x; i < (int)gridDim.x; i += blockDim.x) r = nan_max(r, vp[j * gridDim.x + i]);
        r = block_nan_max(r, sh);
        if (threadIdx.x == 0 && outs[j]) *outs[j] = r;
    }
    if (threadIdx.x == 0) *done = 0;
}
#define TETRA_AMAX_MAX_BLOCKS 1024
// Block-wide sum; every thread gets the result. blockDim.x must be a multiple of 32
// (at most 1024); `shared` holds 32 elements. Starts with a barrier so it can be
// called repeatedly with the same scratch.
template <typename T> __device__ T block_sum(T v, T *shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    T r = lane < nwarps ? shared[lane] : (T)0;
    return warp_sum(r);
}

__device__ __forceinline__ float block_max(float v, float *shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float r = lane < nwarps ? shared[lane] : -INFINITY;
    return warp_max(r);
}

// ----------------------------------------------------------------------------
// scratch: growable device buffers, one per slot, reused across calls (all work is on
// one stream, so a slot is free again once the op that used it has been enqueued and a
// later op is enqueued after it). Growing synchronizes the device before freeing. Slots
// grow during the warm-up microbatch; growth after memory_freeze(1) is a bug and aborts
// with the size and the slot's purpose (its callers cannot fail).

enum {
    SCRATCH_REDUCE = 0, // partial sums of the two-pass reductions (reserved at init)
    SCRATCH_GEMM_A,     // converted / transposed operand A
    SCRATCH_GEMM_B,     // converted / transposed operand B
    SCRATCH_GEMM_ACC,   // fp32 accumulator of the general GEMM path
    SCRATCH_SORT,       // embedding backward: keys, values and the radix sort's temp
    SCRATCH_RMS_DW,     // rmsnorm weight-grad partials
    SCRATCH_ATTN,       // attention workspace when the caller passes NULL
    SCRATCH_SLOTS
};

void *cuda_scratch(int slot, size_t bytes);
// amax_finish's block counter and partials (2 x 1024 floats), on the compute stream
unsigned *cuda_amax_counter(void);
float *cuda_amax_part(void);
// A device float holding 1.0f (default dequant scale), made at backend init.
const float *cuda_one(void);

// Backend-internal device memory (cuBLASLt workspace, the constant one, scratch): counted
// in allocated_bytes; refused after memory_freeze(1) and on out-of-memory with a message
// naming `what`, then abort (none of their callers can fail).
void *cuda_internal_alloc(size_t bytes, const char *what);
void cuda_internal_free(void *p, size_t bytes);

// cuda_gemm.cu: the cuBLASLt handle and its workspace, created by backend init.
void cuda_gemm_init(void);

// cuda_backend.cu: wait for an event, counted as a host wait only when it has not fired.
void cuda_wait_event(cudaEvent_t ev);
// cuda_graph.cu: 1 while a step is being captured (ops.h graph_begin .. graph_end), and
// `bytes` of the captured step's page-locked staging for a host copy (aborts past what
// graph_begin was told).
int cuda_graph_capturing(void);
void *cuda_graph_stage(size_t bytes);

#endif // TETRA_KERNELS_CUDA_COMMON_CUH
