// tests/gpu/test_ops_sim/include/sim.h — a CPU simulator of the CUDA subset that
// kernels/cuda/*.cu use, so their kernels run (slowly) on a machine without a GPU.
//
// transform.py rewrites each .cu into C++ for it: kernel launches `k<<<g, b, smem, st>>>(...)`
// become sim_launch(...) calls and `extern __shared__` arrays read sim_dyn_smem(). The
// blocks of a launch run one after another; the threads of a block are coroutines that
// switch at __syncthreads, __syncwarp and warp shuffles, so barriers, shared memory and
// warp reductions behave as on the device (one block at a time: __shared__ is static).
// Device memory is host memory, filled with 0xff bytes (NaN) when allocated so reads of
// unwritten memory show, out of a simulated 16 GiB device (cudaMemGetInfo). Streams are
// tokens: work runs when it is issued, so every wait returns at once, except while a
// stream captures a CUDA graph: then the work is recorded (arguments by value, as the
// driver records a kernel node's parameters) and runs at each launch of the graph, and
// what a capture forbids (a wait, a synchronous copy, an allocation) fails and
// invalidates it, as on the device. Fake cuBLASLt
// (sim.cpp) and CUB (cub/) stand in for the libraries; cuDNN is absent. What it cannot
// show: timing, data races between blocks or streams, resource limits beyond the
// shared-memory size, and the real libraries' numerics.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
extern dim3 threadIdx, blockIdx, blockDim, gridDim;
// CUDA's 16-byte vector type (the vectorised loads of the element-wise kernels)
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};

typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 };
typedef void *cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
struct cudaDeviceProp {
    char name[256];
    int major, minor;
    size_t totalGlobalMem;
};

// What the simulated backend issued, counted for tests/gpu/test_ops_cuda.c to compare with
// the backend's shape-only description (kernels/op_costs.h): kernel launches (sim_launch),
// cuBLASLt matmuls (the fake library), CUB sorts (cub/) and stream copies and memsets.
extern "C" {
extern long sim_launches, sim_gemm_calls, sim_sorts, sim_copies;
}

// ---- CUDA graphs: stream capture records the work issued on the stream; the graph is
// the list of it, an executable graph a copy that cudaGraphLaunch runs in order.
enum {
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorGraphExecUpdateFailure = 910
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
struct SimGraph;
typedef SimGraph *cudaGraph_t;
typedef SimGraph *cudaGraphExec_t;
typedef void *cudaGraphNode_t;
enum cudaGraphExecUpdateResult { cudaGraphExecUpdateSuccess = 0, cudaGraphExecUpdateErrorTopologyChanged = 2 };
struct cudaGraphExecUpdateResultInfo {
    cudaGraphExecUpdateResult result;
    cudaGraphNode_t errorNode, errorFromNode;
};
// 1 while the stream captures: issued work goes to sim_capture instead of running
bool sim_capturing();
void sim_capture(std::function<void()> work);
// a call a capture forbids: invalidates it and returns the error
cudaError_t sim_capture_forbid(const char *what);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t e, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);

cudaError_t sim_malloc(void **p, size_t n);
template <typename T> cudaError_t cudaMalloc(T **p, size_t n) { return sim_malloc((void **)p, n); }
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k);
// Work runs when it is launched, so streams are tokens and every wait returns at once.
// Device memory: a simulated 16 GiB, of which the live allocations are used.
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t) {
    sim_copies++;
    if (sim_capturing()) { // the source is read when the graph runs, as on the device
        sim_capture([=]() { memmove(d, s, n); });
        return cudaSuccess;
    }
    return cudaMemcpy(d, s, n, k);
}
inline cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t rows,
                                     cudaMemcpyKind k, cudaStream_t) {
    sim_copies++;
    if (sim_capturing()) {
        sim_capture([=]() {
            for (size_t r = 0; r < rows; r++) memmove((char *)d + r * dpitch, (const char *)s + r * spitch, width);
        });
        return cudaSuccess;
    }
    for (size_t r = 0; r < rows; r++) {
        cudaError_t e = cudaMemcpy((char *)d + r * dpitch, (const char *)s + r * spitch, width, k);
        if (e) return e;
    }
    return cudaSuccess;
}
// Page-locked host memory is host memory here.
enum { cudaHostAllocDefault = 0 };
inline cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) {
    if (sim_capturing()) return sim_capture_forbid("cudaHostAlloc");
    *p = malloc(n);
    return *p ? cudaSuccess : 2;
}
inline cudaError_t cudaFreeHost(void *p) {
    if (sim_capturing()) return sim_capture_forbid("cudaFreeHost");
    free(p);
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : 101; }
inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) {
    sim_copies++;
    if (sim_capturing()) {
        sim_capture([=]() { memset(p, v, n); });
        return cudaSuccess;
    }
    memset(p, v, n);
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t *s) {
    static int token;
    *s = &token;
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
    return sim_capturing() ? sim_capture_forbid("cudaStreamSynchronize") : cudaSuccess;
}
// Events: the work before a record has run when it returns, so every event is complete.
typedef int *cudaEvent_t;
enum { cudaEventDisableTiming = 2, cudaErrorNotReady = 600 };
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
    static int token;
    *e = &token;
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaEventQuery(cudaEvent_t) {
    return sim_capturing() ? sim_capture_forbid("cudaEventQuery") : cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) {
    return sim_capturing() ? sim_capture_forbid("cudaEventSynchronize") : cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
    return sim_capturing() ? sim_capture_forbid("cudaDeviceSynchronize") : cudaSuccess;
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char *cudaGetErrorString(cudaError_t) { return "simulator error"; }
inline const char *cudaGetErrorName(cudaError_t) { return "simError"; }
template <typename F> cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int bytes) {
    return bytes <= 227 * 1024 ? cudaSuccess : 1;
}
inline cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
    snprintf(p->name, sizeof p->name, "CPU simulator");
    p->major = 9;
    p->minor = 0;
    p->totalGlobalMem = (size_t)16 << 30;
    return cudaSuccess;
}

void __syncthreads();
// Blocks run one after another, so an atomic is a plain read-modify-write and every
// write is visible to the next block.
inline unsigned int atomicAdd(unsigned int *p, unsigned int v) {
    const unsigned int o = *p;
    *p = o + v;
    return o;
}
inline unsigned int atomicMax(unsigned int *p, unsigned int v) {
    const unsigned int o = *p;
    if (v > o) *p = v;
    return o;
}
inline void __threadfence() {}
void __syncwarp(unsigned mask = 0xffffffffu);
double *sim_shfl_slots();
int sim_cur();
template <typename T> T __shfl_xor_sync(unsigned, T v, int o) {
    double *s = sim_shfl_slots();
    int t = sim_cur();
    s[t] = (double)v;
    __syncwarp();
    T r = (T)s[(t & ~31) | ((t & 31) ^ o)];
    __syncwarp();
    return r;
}
void *sim_dyn_smem();

// the device's IEEE intrinsics (the simulator is built with -ffp-contract=off)
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    memcpy(&u, &f, 4);
    return u;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
struct float4 {
    float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }

void sim_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> body);
