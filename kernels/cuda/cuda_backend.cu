// kernels/cuda/cuda_backend.cu — the CUDA op table, backend init (the compute stream and
// everything else made once), memory and its accounting, plus the simple ops: fills,
// elementwise arithmetic, deterministic reductions, casts and AdamW. Per-element math
// comes from kernels/ops_math.h, the CPU backend's own header, so both backends compute
// the same functions.
//
// Every op here has a shape-only twin in kernels/op_costs.c (opc_<op>: its launches, passes
// and bytes, for `tetra plan --ops`); gpu/test_ops_cuda_sim checks the two launch the same.
// A change that adds or removes a launch or a pass changes the twin too.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include <nvtx3/nvToolsExt.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops_math.h"

// ----------------------------------------------------------------------------
// backend state: the compute stream, memory accounting, freeze

static cudaStream_t g_stream;
static int g_device = -1; // the device current at backend init
static std::once_flag g_init_once;
static float *g_one;

static std::mutex g_mem_mutex;                    // guards the three below
static std::unordered_map<void *, size_t> g_live; // ops.alloc blocks: pointer -> bytes asked
static size_t g_alloc_calls, g_alloc_bytes, g_internal_bytes;
static std::atomic<int> g_frozen(0);

static double mib(size_t b) { return (double)b / (1024.0 * 1024.0); }

// "cuda: out of device memory: asked X MiB, free Y MiB of Z MiB" (ops.alloc's callers
// add the category; the backend's own buffers name theirs here)
static void report_oom(size_t bytes, const char *what) {
    size_t fr = 0, tot = 0;
    char tail[256] = "";
    if (what) snprintf(tail, sizeof tail, " (%s)", what);
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "cuda: out of device memory: asked %.1f MiB%s (cudaMemGetInfo failed)\n", mib(bytes), tail);
        return;
    }
    fprintf(stderr, "cuda: out of device memory: asked %.1f MiB, free %.1f MiB of %.1f MiB%s\n", mib(bytes), mib(fr),
            mib(tot), tail);
}

static void report_frozen(size_t bytes, const char *what, const char *hint) {
    fprintf(stderr,
            "cuda: device allocation of %zu bytes for %s requested during training (memory is taken at "
            "start-up; %s)\n",
            bytes, what, hint);
}
// Every host wait goes through here, so that ops.h host_waits counts them all.
static std::atomic<uint64_t> g_host_waits;
static void host_wait(cudaStream_t st) { // NULL: the whole device
    if (cuda_graph_capturing()) {        // the capture would fail at its end, far from here
        fprintf(stderr,
                "cuda: a host wait (%s) inside a step captured as a CUDA graph: a bug; "
                "training.cuda_graph = false runs the step without a graph\n",
                st ? "stream synchronisation or blocking copy" : "device synchronisation");
        abort();
    }
    g_host_waits.fetch_add(1, std::memory_order_relaxed);
    if (st) CUDA_CHECK(cudaStreamSynchronize(st));
    else CUDA_CHECK(cudaDeviceSynchronize());
}
static uint64_t cuda_host_waits(void) { return g_host_waits.load(std::memory_order_relaxed); }
void cuda_wait_event(cudaEvent_t ev) {
    cudaError_t q = cudaEventQuery(ev);
    if (q == cudaErrorNotReady) {
        g_host_waits.fetch_add(1, std::memory_order_relaxed);
        CUDA_CHECK(cudaEventSynchronize(ev));
    } else {
        CUDA_CHECK(q);
    }
}

// blocks of the running amax reduction that have finished (0 between reductions)
static unsigned *g_amax_done;

// Backend init, once per process, on the device current at the first alloc or op (the
// trainer selects the rank's device before it allocates anything). Everything the ops
// would otherwise create lazily is made here.
static void backend_init(void) {
    CUDA_CHECK(cudaGetDevice(&g_device));
    // default flags: a blocking stream, ordered with the legacy default stream (see
    // cuda_common.cuh), so synchronous cudaMemcpy elsewhere still sees finished results
    CUDA_CHECK(cudaStreamCreate(&g_stream));
    g_one = (float *)cuda_internal_alloc(sizeof(float), "the constant 1.0f (default fp8 scale)");
    g_amax_done = (unsigned *)cuda_internal_alloc(sizeof(unsigned), "the amax reduction's block counter");
    CUDA_CHECK(cudaMemsetAsync(g_amax_done, 0, sizeof(unsigned), g_stream));
    const float h = 1.0f;
    CUDA_CHECK(cudaMemcpyAsync(g_one, &h, sizeof h, cudaMemcpyHostToDevice, g_stream));
    host_wait(g_stream);
    cuda_gemm_init();
    (void)cuda_scratch(SCRATCH_REDUCE, 1024 * sizeof(double)); // fixed size: reserved now
}

static inline void ensure_init(void) { std::call_once(g_init_once, backend_init); }

cudaStream_t cuda_stream(void) {
    ensure_init();
    return g_stream;
}

void *cuda_internal_alloc(size_t bytes, const char *what) {
    if (g_frozen.load(std::memory_order_relaxed)) {
        report_frozen(bytes, what, "the backend makes its own buffers at init and during the warm-up microbatch");
        abort();
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        cudaGetLastError();
        report_oom(bytes, what);
        abort();
    }
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    g_internal_bytes += bytes;
    return p;
}

void cuda_internal_free(void *p, size_t bytes) {
    if (!p) return;
    CUDA_CHECK(cudaFree(p));
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    g_internal_bytes -= bytes;
}

// ----------------------------------------------------------------------------
// scratch

static void *scratch_ptr[SCRATCH_SLOTS];
static size_t scratch_size[SCRATCH_SLOTS];
static const char *const scratch_what[SCRATCH_SLOTS] = {
    "scratch: reduction partials",
    "scratch: GEMM operand A (converted/transposed)",
    "scratch: GEMM operand B (converted/transposed)",
    "scratch: GEMM fp32 accumulator",
    "scratch: embedding backward sort",
    "scratch: rmsnorm weight-gradient partials",
    "scratch: attention workspace (the op was given workspace == NULL)",
};

void *cuda_scratch(int slot, size_t bytes) {
    if (bytes <= scratch_size[slot] && scratch_ptr[slot]) return scratch_ptr[slot];
    size_t want = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1); // whole MiB
    if (want < bytes) want = bytes;
    if (g_frozen.load(std::memory_order_relaxed)) { // before freeing: the message is the whole story
        report_frozen(want, scratch_what[slot],
                      "the backend's scratch grows during the warm-up microbatch, and this call needs more than it "
                      "did: warm up with the largest shapes before memory_freeze");
        abort();
    }
    if (scratch_ptr[slot]) {
        // the old buffer may still be read by work in flight
        host_wait(NULL);
        cuda_internal_free(scratch_ptr[slot], scratch_size[slot]);
        scratch_ptr[slot] = NULL;
        scratch_size[slot] = 0;
    }
    scratch_ptr[slot] = cuda_internal_alloc(want, scratch_what[slot]);
    scratch_size[slot] = want;
    return scratch_ptr[slot];
}

const float *cuda_one(void) {
    ensure_init();
    return g_one;
}

// ----------------------------------------------------------------------------
// memory

extern "C" void *cuda_alloc(size_t bytes) {
    ensure_init();
    if (g_frozen.load(std::memory_order_relaxed)) {
        report_frozen(bytes, "a backend buffer (ops.alloc)", "allocate every buffer before training starts");
        return NULL;
    }
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess || dev != g_device) {
        cudaGetLastError();
        fprintf(stderr,
                "cuda: allocation on device %d, but the backend was initialised on device %d (select the "
                "rank's device before the first op)\n",
                dev, g_device);
        return NULL;
    }
    void *p = NULL;
    // cudaMalloc returns 256-byte aligned memory (the contract asks for 64)
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        cudaGetLastError(); // clear the error: out of memory is reported as NULL
        report_oom(bytes, NULL);
        return NULL;
    }
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    g_live[p] = bytes;
    g_alloc_calls++;
    g_alloc_bytes += bytes;
    return p;
}

extern "C" void cuda_release(void *p) {
    if (!p) return;
    {
        std::lock_guard<std::mutex> lock(g_mem_mutex);
        auto it = g_live.find(p);
        if (it == g_live.end()) {
            fprintf(stderr, "cuda: release of %p, which cuda_alloc did not return or was already released\n", p);
            abort();
        }
        g_alloc_bytes -= it->second;
        g_live.erase(it);
    }
    CUDA_CHECK(cudaFree(p));
}

extern "C" size_t cuda_alloc_count(void) {
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    return g_alloc_calls;
}

extern "C" size_t cuda_allocated_bytes(void) {
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    return g_alloc_bytes + g_internal_bytes;
}

extern "C" void cuda_memory_freeze(int frozen) { g_frozen.store(frozen ? 1 : 0, std::memory_order_relaxed); }

extern "C" void cuda_device_memory(size_t *free_bytes, size_t *total_bytes) {
    ensure_init();
    size_t fr = 0, tot = 0;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    if (free_bytes) *free_bytes = fr;
    if (total_bytes) *total_bytes = tot;
}

extern "C" void *cuda_compute_stream(void) { return (void *)cuda_stream(); }
/* NVTX v3 is header-only: without a profiler attached a push is a test of a null pointer */
static void cuda_range_push(const char *name) { nvtxRangePushA(name); }
static void cuda_range_pop(void) { nvtxRangePop(); }

// Copies are issued on the compute stream, so they are ordered with the ops around them.
// Host-side copies wait for completion (the host may reuse or read its buffer at once);
// device-to-device copies do not.
extern "C" void cuda_copy_h2d(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    cudaStream_t st = cuda_stream();
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st));
    host_wait(st);
}

// copy_h2d_async stages src in a ring of page-locked host memory, so that the caller may
// change src as soon as the call returns and the runtime never stages pageable memory
// itself (which it may do by waiting for the stream). The ring has STAGE_SEGS segments;
// a copy goes into the current segment, or the next one when it does not fit, and a
// segment is written again only after the copies that last read it have run: an event
// recorded when the ring left it, waited for (a counted host wait) only when the device
// is a whole ring behind the host. A copy larger than a segment waits for itself.
enum { STAGE_SEGS = 8 };
static const size_t STAGE_SEG_BYTES = (size_t)2 << 20;
static char *g_stage;
static cudaEvent_t g_stage_ev[STAGE_SEGS];
static int g_stage_seg, g_stage_used[STAGE_SEGS];
static size_t g_stage_off;
static std::mutex g_stage_mutex;

static char *stage_take(size_t bytes) {
    if (!g_stage) {
        CUDA_CHECK(cudaHostAlloc((void **)&g_stage, STAGE_SEGS * STAGE_SEG_BYTES, cudaHostAllocDefault));
        for (int i = 0; i < STAGE_SEGS; i++)
            CUDA_CHECK(cudaEventCreateWithFlags(&g_stage_ev[i], cudaEventDisableTiming));
    }
    if (g_stage_off + bytes > STAGE_SEG_BYTES) { // leave the segment: its copies are queued
        CUDA_CHECK(cudaEventRecord(g_stage_ev[g_stage_seg], cuda_stream()));
        g_stage_used[g_stage_seg] = 1;
        g_stage_seg = (g_stage_seg + 1) % STAGE_SEGS;
        g_stage_off = 0;
        if (g_stage_used[g_stage_seg]) cuda_wait_event(g_stage_ev[g_stage_seg]);
    }
    char *p = g_stage + (size_t)g_stage_seg * STAGE_SEG_BYTES + g_stage_off;
    g_stage_off += (bytes + 255) & ~(size_t)255;
    return p;
}

extern "C" void cuda_copy_h2d_async(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (cuda_graph_capturing()) { // the graph reads its own staging when it runs
        void *p = cuda_graph_stage(bytes);
        memcpy(p, src, bytes);
        CUDA_CHECK(cudaMemcpyAsync(dst, p, bytes, cudaMemcpyHostToDevice, cuda_stream()));
        return;
    }
    if (bytes > STAGE_SEG_BYTES) {
        cuda_copy_h2d(dst, src, bytes);
        return;
    }
    std::lock_guard<std::mutex> lock(g_stage_mutex);
    char *p = stage_take(bytes);
    memcpy(p, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, p, bytes, cudaMemcpyHostToDevice, cuda_stream()));
}

extern "C" void cuda_copy_d2h(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    cudaStream_t st = cuda_stream();
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st));
    host_wait(st);
}

extern "C" void cuda_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream()));
}

extern "C" void cuda_synchronize(void) { host_wait(cuda_stream()); }

extern "C" void cuda_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows) {
    if (width && rows)
        CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, cuda_stream()));
}

// Before backend_init: the device every later resource is created on.
extern "C" int cuda_select_device(int index, char *err, size_t errlen) {
    const int n = cuda_device_count();
    if (n <= 0) {
        snprintf(err, errlen, "cuda: no device to select (cudaGetDeviceCount = 0)");
        return -1;
    }
    const int dev = ((index % n) + n) % n;
    if (g_device >= 0) { // backend_init ran: its resources live on g_device
        if (dev == g_device) return 0;
        snprintf(err, errlen, "cuda: device %d selected after the backend started on device %d", dev, g_device);
        return -1;
    }
    cudaError_t e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cudaSetDevice(%d): %s", dev, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

// Page-locked, so staged copies run at full PCIe/C2C speed and asynchronously.
static void *cuda_host_alloc(size_t bytes) {
    void *p = nullptr;
    if (cudaHostAlloc(&p, bytes ? bytes : 64, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
    }
    return p;
}

static void cuda_host_release(void *p) {
    if (p) CUDA_CHECK(cudaFreeHost(p));
}

// ----------------------------------------------------------------------------
// elementwise. Grid-stride loops; float4 accesses when every pointer is 16-byte aligned
// (the scalar tail covers n % 4).

template <bool VEC> __global__ void fill_kernel(float *x, float value, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x, t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t done = 0;
    if constexpr (VEC) {
        size_t n4 = n / 4;
        float4 v4 = make_float4(value, value, value, value);
        for (size_t i = t; i < n4; i += stride) reinterpret_cast<float4 *>(x)[i] = v4;
        done = n4 * 4;
    }
    for (size_t i = done + t; i < n; i += stride) x[i] = value;
}

template <bool VEC> __global__ void scale_kernel(float *x, float alpha, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x, t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t done = 0;
    if constexpr (VEC) {
        size_t n4 = n / 4;
        for (size_t i = t; i < n4; i += stride) {
            float4 v = reinterpret_cast<float4 *>(x)[i];
            v.x *= alpha;
            v.y *= alpha;
            v.z *= alpha;
            v.w *= alpha;
            reinterpret_cast<float4 *>(x)[i] = v;
        }
        done = n4 * 4;
    }
    for (size_t i = done + t; i < n; i += stride) x[i] *= alpha;
}

// y += alpha x, as the CPU: the product rounded, then the sum (no fused multiply-add)
template <bool VEC> __global__ void axpy_kernel(float *y, const float *x, float alpha, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x, t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t done = 0;
    if constexpr (VEC) {
        size_t n4 = n / 4;
        for (size_t i = t; i < n4; i += stride) {
            float4 a = reinterpret_cast<const float4 *>(x)[i];
            float4 v = reinterpret_cast<float4 *>(y)[i];
            v.x = __fadd_rn(v.x, __fmul_rn(alpha, a.x));
            v.y = __fadd_rn(v.y, __fmul_rn(alpha, a.y));
            v.z = __fadd_rn(v.z, __fmul_rn(alpha, a.z));
            v.w = __fadd_rn(v.w, __fmul_rn(alpha, a.w));
            reinterpret_cast<float4 *>(y)[i] = v;
        }
        done = n4 * 4;
    }
    for (size_t i = done + t; i < n; i += stride) y[i] = __fadd_rn(y[i], __fmul_rn(alpha, x[i]));
}

template <bool VEC> __global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x, t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t done = 0;
    if constexpr (VEC) {
        size_t n4 = n / 4;
        for (size_t i = t; i < n4; i += stride) {
            float4 u = reinterpret_cast<const float4 *>(a)[i];
            float4 w = reinterpret_cast<const float4 *>(b)[i];
            reinterpret_cast<float4 *>(out)[i] = make_float4(u.x + w.x, u.y + w.y, u.z + w.z, u.w + w.w);
        }
        done = n4 * 4;
    }
    for (size_t i = done + t; i < n; i += stride) out[i] = a[i] + b[i];
}

extern "C" void cuda_fill(float *x, float value, size_t n) {
    if (!n) return;
    if (tetra_aligned16(x))
        fill_kernel<true><<<tetra_blocks(n / 4 + 1, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(x, value, n);
    else fill_kernel<false><<<tetra_blocks(n, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(x, value, n);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_scale(float *x, float alpha, size_t n) {
    if (!n) return;
    if (tetra_aligned16(x))
        scale_kernel<true><<<tetra_blocks(n / 4 + 1, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(x, alpha, n);
    else scale_kernel<false><<<tetra_blocks(n, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(x, alpha, n);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_axpy(float *y, const float *x, float alpha, size_t n) {
    if (!n) return;
    if (tetra_aligned16(x) && tetra_aligned16(y))
        axpy_kernel<true><<<tetra_blocks(n / 4 + 1, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(y, x, alpha, n);
    else axpy_kernel<false><<<tetra_blocks(n, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(y, x, alpha, n);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_add(float *out, const float *a, const float *b, size_t n) {
    if (!n) return;
    if (tetra_aligned16(out) && tetra_aligned16(a) && tetra_aligned16(b))
        add_kernel<true><<<tetra_blocks(n / 4 + 1, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(out, a, b, n);
    else add_kernel<false><<<tetra_blocks(n, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(out, a, b, n);
    CUDA_CHECK_LAUNCH();
}

// ----------------------------------------------------------------------------
// reductions: two passes, no atomics. Pass 1 runs P blocks (P a function of n alone, not
// of the device) that each reduce a fixed, strided subset in double; pass 2 sums the P
// partials in one block in a fixed order. Same n and inputs -> same bits, on any GPU.

#define RED_MAX_PARTS 1024
#define RED_PER_BLOCK 8192

static int red_parts(size_t n) {
    size_t p = (n + RED_PER_BLOCK - 1) / RED_PER_BLOCK;
    if (p < 1) p = 1;
    if (p > RED_MAX_PARTS) p = RED_MAX_PARTS;
    return (int)p;
}

enum { RED_SUM = 0, RED_SUMSQ = 1 };

template <int OP>
__global__ void __launch_bounds__(TETRA_THREADS) reduce_partial_kernel(double *part, const float *x, size_t n) {
    __shared__ double sh[32];
    size_t stride = (size_t)gridDim.x * blockDim.x;
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double v = (double)x[i];
        acc += OP == RED_SUMSQ ? v * v : v;
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

// mode 0: out = sum; mode 1: out += sum (in double, as the CPU)
__global__ void __launch_bounds__(1024) reduce_final_kernel(float *out, const double *part, int parts, int accumulate) {
    __shared__ double sh[32];
    double v = (int)threadIdx.x < parts ? part[threadIdx.x] : 0.0;
    v = block_sum(v, sh);
    if (threadIdx.x == 0) out[0] = accumulate ? (float)((double)out[0] + v) : (float)v;
}

static void reduce_sum(float *out, const float *x, size_t n, int op, int accumulate) {
    int parts = red_parts(n);
    double *part = (double *)cuda_scratch(SCRATCH_REDUCE, RED_MAX_PARTS * sizeof(double));
    if (op == RED_SUMSQ) reduce_partial_kernel<RED_SUMSQ><<<parts, TETRA_THREADS, 0, cuda_stream()>>>(part, x, n);
    else reduce_partial_kernel<RED_SUM><<<parts, TETRA_THREADS, 0, cuda_stream()>>>(part, x, n);
    CUDA_CHECK_LAUNCH();
    reduce_final_kernel<<<1, 1024, 0, cuda_stream()>>>(out, part, parts, accumulate);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_sum_squares(float *out, const float *x, size_t n) {
    if (!n) return; // out += 0
    reduce_sum(out, x, n, RED_SUMSQ, 1);
}

extern "C" void cuda_sum(float *out, const float *x, size_t n) { reduce_sum(out, x, n, RED_SUM, 0); }

unsigned *cuda_amax_counter(void) { return g_amax_done; }
float *cuda_amax_part(void) { return (float *)cuda_scratch(SCRATCH_REDUCE, RED_MAX_PARTS * sizeof(double)); }

__global__ void __launch_bounds__(TETRA_THREADS)
    amax_kernel(float *out, float *part, unsigned *done, const float *x, size_t n) {
    __shared__ float sh[32];
    __shared__ int last;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    float m = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) m = nan_max(m, fabsf(x[i]));
    m = block_nan_max(m, sh);
    amax_finish<1>(&out, part, done, &m, sh, &last);
}

extern "C" void cuda_amax(float *out, const float *x, size_t n) {
    amax_kernel<<<red_parts(n), TETRA_THREADS, 0, cuda_stream()>>>(out, cuda_amax_part(), g_amax_done, x, n);
    CUDA_CHECK_LAUNCH();
}

__device__ __forceinline__ float load_f32(const float *x, size_t i) { return x[i]; }
__device__ __forceinline__ float load_f32(const uint16_t *x, size_t i) { return tetra_bf16_to_f32(x[i]); }
__device__ __forceinline__ float load_f32(const uint8_t *x, size_t i) { return (float)x[i]; } /* a byte's value */

// one block per row (x fp32 or bf16)
template <typename T>
__global__ void __launch_bounds__(TETRA_THREADS) amax_rows_kernel(float *out, const T *x, int cols) {
    __shared__ float sh[32];
    const size_t row = (size_t)blockIdx.x * (size_t)cols;
    float m = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = nan_max(m, fabsf(load_f32(x, row + j)));
    m = block_nan_max(m, sh);
    if (threadIdx.x == 0) out[blockIdx.x] = m;
}

template <typename T> static void amax_rows_launch(float *out, const T *x, int rows, int cols) {
    if (rows <= 0) return;
    if (cols <= 0) {
        cuda_fill(out, 0.0f, (size_t)rows);
        return;
    }
    amax_rows_kernel<T><<<rows, TETRA_THREADS, 0, cuda_stream()>>>(out, x, cols);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_amax_rows(float *out, const float *x, int rows, int cols) { amax_rows_launch(out, x, rows, cols); }

// ----------------------------------------------------------------------------
// transpose: 32 x 32 tiles through shared memory, so both the reads of x and the writes
// of out are coalesced along a row of 32 threads. Blocks of 32 x 8 threads move four
// rows each; the grid strides over the tiles (grid.y is capped at 65535).

#define TRANSPOSE_TILE 32
#define TRANSPOSE_ROWS 8

// The element a tile holds: x itself (transpose), or x quantised with its column's scale
// (cast_transpose_to_fp8, below) or with one scale from a device amax (fp8_quantize). Each
// thread calls begin() on its copy of the op once, before the first element.
struct tile_same {
    __device__ void begin() {}
    __device__ float operator()(float v, int) const { return v; }
};

// out = op(x)^T; out_rows (NULL: none) = op(x) as well, row-major
template <typename TO, typename TI, typename OP>
__global__ void __launch_bounds__(TRANSPOSE_TILE *TRANSPOSE_ROWS)
    transpose_tiles_kernel(TO *out, TO *out_rows, const TI *x, int rows, int cols, OP op) {
    // one padding column: the column-wise reads of the second phase fall in 32 banks
    __shared__ TO tile[TRANSPOSE_TILE][TRANSPOSE_TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int tiles_r = (rows + TRANSPOSE_TILE - 1) / TRANSPOSE_TILE;
    const int tiles_c = (cols + TRANSPOSE_TILE - 1) / TRANSPOSE_TILE;
    op.begin();
    // the tile loops depend on the block only, so every thread reaches each barrier
    for (int tr = blockIdx.y; tr < tiles_r; tr += gridDim.y) {
        for (int tc = blockIdx.x; tc < tiles_c; tc += gridDim.x) {
            const int r0 = tr * TRANSPOSE_TILE, c0 = tc * TRANSPOSE_TILE;
#pragma unroll
            for (int i = 0; i < TRANSPOSE_TILE; i += TRANSPOSE_ROWS) {
                int r = r0 + ty + i, c = c0 + tx;
                if (r < rows && c < cols) {
                    const size_t at = (size_t)r * (size_t)cols + c;
                    const TO v = (TO)op(load_f32(x, at), c);
                    tile[ty + i][tx] = v;
                    if (out_rows) out_rows[at] = v;
                }
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < TRANSPOSE_TILE; i += TRANSPOSE_ROWS) {
                int c = c0 + ty + i, r = r0 + tx; // out row c, column r
                if (r < rows && c < cols) out[(size_t)c * (size_t)rows + r] = tile[tx][ty + i];
            }
            __syncthreads(); // the tile is refilled by the next iteration
        }
    }
}

static dim3 transpose_grid(int rows, int cols) {
    unsigned gx = (unsigned)((cols + TRANSPOSE_TILE - 1) / TRANSPOSE_TILE);
    unsigned gy = (unsigned)((rows + TRANSPOSE_TILE - 1) / TRANSPOSE_TILE);
    return dim3(gx < 65535u ? gx : 65535u, gy < 65535u ? gy : 65535u);
}

template <typename T> static void transpose_launch(T *out, const T *x, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    dim3 block(TRANSPOSE_TILE, TRANSPOSE_ROWS);
    transpose_tiles_kernel<T, T, tile_same>
        <<<transpose_grid(rows, cols), block, 0, cuda_stream()>>>(out, (T *)NULL, x, rows, cols, tile_same());
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_transpose(float *out, const float *x, int rows, int cols) { transpose_launch(out, x, rows, cols); }

// fp8 codes, moved as bytes (a byte's value survives the float in between exactly)
extern "C" void cuda_transpose_u8(uint8_t *out, const uint8_t *x, int rows, int cols) {
    transpose_launch(out, x, rows, cols);
}

// bf16 operands (fp8 scaling reads bf16 activations without an fp32 copy): 8-byte
// words of four bf16 where x is 8-byte aligned, one element at a time for the rest.
__device__ __forceinline__ float abs_max4_bf16(float m, unsigned long long w) {
    for (int j = 0; j < 4; j++) m = nan_max(m, fabsf(tetra_bf16_to_f32((uint16_t)(w >> (16 * j)))));
    return m;
}

__global__ void __launch_bounds__(TETRA_THREADS)
    amax_bf16_kernel(float *out, float *part, unsigned *done, const uint16_t *x, size_t n, int vec) {
    __shared__ float sh[32];
    __shared__ int last;
    const size_t stride = (size_t)gridDim.x * blockDim.x, t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    float m = 0.0f;
    size_t done_n = 0;
    if (vec) {
        const unsigned long long *w = (const unsigned long long *)x;
        const size_t nw = n / 4;
        for (size_t i = t; i < nw; i += stride) m = abs_max4_bf16(m, w[i]);
        done_n = nw * 4;
    }
    for (size_t i = done_n + t; i < n; i += stride) m = nan_max(m, fabsf(tetra_bf16_to_f32(x[i])));
    m = block_nan_max(m, sh);
    amax_finish<1>(&out, part, done, &m, sh, &last);
}

extern "C" void cuda_amax_bf16(float *out, const uint16_t *x, size_t n) {
    amax_bf16_kernel<<<red_parts(n), TETRA_THREADS, 0, cuda_stream()>>>(out, cuda_amax_part(), g_amax_done, x, n,
                                                                        ((uintptr_t)x & 7) == 0);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_amax_rows_bf16(float *out, const uint16_t *x, int rows, int cols) {
    amax_rows_launch(out, x, rows, cols);
}

// column amax: a block per 32 columns; its 8 rows of threads stride down every row (a
// warp reads 32 neighbouring columns of a row), then fold their 8 partial maxima
template <typename T>
__global__ void __launch_bounds__(TRANSPOSE_TILE *TRANSPOSE_ROWS)
    amax_cols_kernel(float *out, const T *x, int rows, int cols) {
    __shared__ float sh[TRANSPOSE_ROWS][TRANSPOSE_TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y, c = blockIdx.x * TRANSPOSE_TILE + tx;
    float m = 0.0f;
    if (c < cols)
        for (int r = ty; r < rows; r += TRANSPOSE_ROWS)
            m = nan_max(m, fabsf(load_f32(x, (size_t)r * (size_t)cols + c)));
    sh[ty][tx] = m;
    __syncthreads();
    if (ty == 0) {
        for (int i = 1; i < TRANSPOSE_ROWS; i++) m = nan_max(m, sh[i][tx]);
        if (c < cols) out[c] = m;
    }
}

extern "C" void cuda_amax_cols(float *out, const void *x, tetra_dtype xt, int rows, int cols) {
    if (cols <= 0) return;
    if (rows <= 0) {
        cuda_fill(out, 0.0f, (size_t)cols);
        return;
    }
    dim3 block(TRANSPOSE_TILE, TRANSPOSE_ROWS), grid((unsigned)((cols + TRANSPOSE_TILE - 1) / TRANSPOSE_TILE));
    if (xt == TETRA_BF16)
        amax_cols_kernel<uint16_t><<<grid, block, 0, cuda_stream()>>>(out, (const uint16_t *)x, rows, cols);
    else amax_cols_kernel<float><<<grid, block, 0, cuda_stream()>>>(out, (const float *)x, rows, cols);
    CUDA_CHECK_LAUNCH();
}

// ----------------------------------------------------------------------------
// casts (the encoders of ops_math.h: round to nearest even, saturating fp8)

__global__ void to_bf16_kernel(uint16_t *out, const float *x, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = tetra_f32_to_bf16(x[i]);
}

__global__ void from_bf16_kernel(float *out, const uint16_t *x, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = tetra_bf16_to_f32(x[i]);
}

template <int FMT>
__global__ void to_fp8_kernel(uint8_t *out, const float *x, const float *scale, int rowwise, size_t cols, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float s = scale ? scale[rowwise ? i / cols : 0] : 1.0f;
        out[i] = FMT == TETRA_FP8_E5M2 ? tetra_quant_e5m2(x[i], s) : tetra_quant_e4m3(x[i], s);
    }
}

template <int FMT> __device__ __forceinline__ unsigned long long quant_fp8(float x, float s) {
    return FMT == TETRA_FP8_E5M2 ? tetra_quant_e5m2(x, s) : tetra_quant_e4m3(x, s);
}

// bf16 in: eight elements a step where x and out are 8-byte aligned (two words of four
// bf16 in, one word of eight fp8 out; under rowwise cols is a multiple of 8, so a step
// stays in one row and finds its scale with one division), one at a time otherwise.
template <int FMT>
__global__ void bf16_to_fp8_kernel(uint8_t *out, const uint16_t *x, const float *scale, int rowwise, size_t cols,
                                   size_t n, int vec) {
    const size_t stride = (size_t)gridDim.x * blockDim.x, t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t done = 0;
    if (vec) {
        const unsigned long long *w = (const unsigned long long *)x;
        unsigned long long *o = (unsigned long long *)out;
        const size_t n8 = n / 8, cols8 = cols / 8;
        for (size_t i = t; i < n8; i += stride) {
            const float s = scale ? scale[rowwise ? i / cols8 : 0] : 1.0f;
            const unsigned long long a = w[2 * i], b = w[2 * i + 1];
            unsigned long long r = 0;
            for (int j = 0; j < 4; j++) {
                r |= quant_fp8<FMT>(tetra_bf16_to_f32((uint16_t)(a >> (16 * j))), s) << (8 * j);
                r |= quant_fp8<FMT>(tetra_bf16_to_f32((uint16_t)(b >> (16 * j))), s) << (8 * j + 32);
            }
            o[i] = r;
        }
        done = n8 * 8;
    }
    for (size_t i = done + t; i < n; i += stride) {
        const float s = scale ? scale[rowwise ? i / cols : 0] : 1.0f;
        out[i] = (uint8_t)quant_fp8<FMT>(tetra_bf16_to_f32(x[i]), s);
    }
}

// x [rows, cols] to out [cols, rows] in fp8 with a scale per column of x: the tiles of
// the transpose, each element quantised as it enters shared memory
template <int FMT> struct tile_quant {
    const float *scale;
    __device__ void begin() {}
    __device__ uint8_t operator()(float v, int c) const { return (uint8_t)quant_fp8<FMT>(v, scale[c]); }
};

// bf16 x in whole 64 x 64 tiles (x on 16 bytes, the outputs on 8): a thread reads 8
// elements of a row with one 16-byte load and writes their 8 codes with one 8-byte store
// (the row-major codes, when asked for) and two 4-byte stores into the tile; then 8 codes of
// a column, one per tile row, with one 8-byte store of the transposed output. The tile's
// rows are 68 bytes apart, so the 8 rows a warp's column reads touch 4 banks, not 1.
// Every element is op(value, column), the code the 32 x 32 tiles give it with the same op.
#define QT_TILE 64
#define QT_PITCH 68
template <typename OP>
__global__ void __launch_bounds__(256)
    cast_t_vec_kernel(uint8_t *out_t, uint8_t *out, const uint16_t *x, int rows, int cols, OP op) {
    __shared__ unsigned int tile_words[QT_TILE * QT_PITCH / 4]; // words: the 4-byte stores stay aligned
    uint8_t *tile = (uint8_t *)tile_words;
    op.begin();
    const int t = threadIdx.x, tiles_r = rows / QT_TILE, tiles_c = cols / QT_TILE;
    // the tile loops depend on the block only, so every thread reaches each barrier
    for (int tr = blockIdx.y; tr < tiles_r; tr += gridDim.y) {
        for (int tc = blockIdx.x; tc < tiles_c; tc += gridDim.x) {
            const size_t r0 = (size_t)tr * QT_TILE, c0 = (size_t)tc * QT_TILE;
#pragma unroll
            for (int p = 0; p < 2; p++) {
                const int r = t / 8 + 32 * p, c = 8 * (t % 8);
                const size_t at = (r0 + r) * (size_t)cols + c0 + c;
                const uint4 v = *(const uint4 *)(x + at);
                const unsigned int h[4] = {v.x, v.y, v.z, v.w};
                unsigned long long q = 0;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int cc = (int)c0 + c + 2 * j;
                    q |= (unsigned long long)op(tetra_bf16_to_f32((uint16_t)(h[j] & 0xffffu)), cc) << (16 * j);
                    q |= (unsigned long long)op(tetra_bf16_to_f32((uint16_t)(h[j] >> 16)), cc + 1) << (16 * j + 8);
                }
                if (out) *(unsigned long long *)(out + at) = q;
                unsigned int *tw = (unsigned int *)(tile + r * QT_PITCH + c);
                tw[0] = (unsigned int)q;
                tw[1] = (unsigned int)(q >> 32);
            }
            __syncthreads();
#pragma unroll
            for (int p = 0; p < 2; p++) {
                const int c = t / 8 + 32 * p, r = 8 * (t % 8);
                unsigned long long q = 0;
#pragma unroll
                for (int j = 0; j < 8; j++) q |= (unsigned long long)tile[(r + j) * QT_PITCH + c] << (8 * j);
                *(unsigned long long *)(out_t + (c0 + c) * (size_t)rows + r0 + r) = q;
            }
            __syncthreads(); // the tile is refilled by the next iteration
        }
    }
}

// whether cast_t_vec_kernel applies: whole tiles of bf16 on 16 bytes, the outputs on 8
static int cast_t_vec(const void *x, tetra_dtype xt, const uint8_t *out_t, const uint8_t *out, int rows, int cols) {
    return xt == TETRA_BF16 && rows % QT_TILE == 0 && cols % QT_TILE == 0 && tetra_aligned16(x) &&
        ((uintptr_t)out_t & 7) == 0 && ((uintptr_t)out & 7) == 0;
}
static dim3 cast_t_vec_grid(int rows, int cols) {
    const unsigned gx = (unsigned)(cols / QT_TILE), gy = (unsigned)(rows / QT_TILE);
    return dim3(gx < 65535u ? gx : 65535u, gy < 65535u ? gy : 65535u);
}

__device__ __forceinline__ void from_fp8_put(float *out, size_t i, float v) { out[i] = v; }
// rounded as to_bf16_kernel rounds
__device__ __forceinline__ void from_fp8_put(uint16_t *out, size_t i, float v) { out[i] = tetra_f32_to_bf16(v); }

template <int FMT, typename OUT>
__global__ void from_fp8_kernel(OUT *out, const uint8_t *q, const float *inv_scale, int rowwise, size_t cols,
                                size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float s = inv_scale ? inv_scale[rowwise ? i / cols : 0] : 1.0f;
        float v = FMT == TETRA_FP8_E5M2 ? tetra_e5m2_to_f32(q[i]) : tetra_e4m3_to_f32(q[i]);
        from_fp8_put(out, i, v * s);
    }
}

// decode(q) * inv_scale into fp32 or bf16
template <typename OUT>
static void from_fp8_launch(OUT *out, const uint8_t *q, const float *inv_scale, int rowwise, int rows, int cols,
                            tetra_dtype fmt) {
    size_t n = (size_t)(rows > 0 ? rows : 0) * (size_t)(cols > 0 ? cols : 0);
    if (!n) return;
    unsigned nb = tetra_blocks(n, TETRA_THREADS);
    if (fmt == TETRA_FP8_E5M2)
        from_fp8_kernel<TETRA_FP8_E5M2>
            <<<nb, TETRA_THREADS, 0, cuda_stream()>>>(out, q, inv_scale, rowwise, (size_t)cols, n);
    else
        from_fp8_kernel<TETRA_FP8_E4M3>
            <<<nb, TETRA_THREADS, 0, cuda_stream()>>>(out, q, inv_scale, rowwise, (size_t)cols, n);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_cast_f32_to_bf16(uint16_t *out, const float *x, size_t n) {
    if (!n) return;
    to_bf16_kernel<<<tetra_blocks(n, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(out, x, n);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_cast_bf16_to_f32(float *out, const uint16_t *x, size_t n) {
    if (!n) return;
    from_bf16_kernel<<<tetra_blocks(n, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(out, x, n);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_cast_f32_to_fp8(uint8_t *out, const float *x, const float *scale, int rowwise, int rows, int cols,
                                     tetra_dtype fmt) {
    size_t n = (size_t)(rows > 0 ? rows : 0) * (size_t)(cols > 0 ? cols : 0);
    if (!n) return;
    unsigned nb = tetra_blocks(n, TETRA_THREADS);
    if (fmt == TETRA_FP8_E5M2)
        to_fp8_kernel<TETRA_FP8_E5M2><<<nb, TETRA_THREADS, 0, cuda_stream()>>>(out, x, scale, rowwise, (size_t)cols, n);
    else
        to_fp8_kernel<TETRA_FP8_E4M3><<<nb, TETRA_THREADS, 0, cuda_stream()>>>(out, x, scale, rowwise, (size_t)cols, n);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_cast_bf16_to_fp8(uint8_t *out, const uint16_t *x, const float *scale, int rowwise, int rows,
                                      int cols, tetra_dtype fmt) {
    size_t n = (size_t)(rows > 0 ? rows : 0) * (size_t)(cols > 0 ? cols : 0);
    if (!n) return;
    const int vec = ((uintptr_t)x & 7) == 0 && ((uintptr_t)out & 7) == 0 && (!rowwise || cols % 8 == 0);
    unsigned nb = tetra_blocks(vec ? (n + 7) / 8 : n, TETRA_THREADS);
    if (fmt == TETRA_FP8_E5M2)
        bf16_to_fp8_kernel<TETRA_FP8_E5M2>
            <<<nb, TETRA_THREADS, 0, cuda_stream()>>>(out, x, scale, rowwise, (size_t)cols, n, vec);
    else
        bf16_to_fp8_kernel<TETRA_FP8_E4M3>
            <<<nb, TETRA_THREADS, 0, cuda_stream()>>>(out, x, scale, rowwise, (size_t)cols, n, vec);
    CUDA_CHECK_LAUNCH();
}

template <int FMT>
static void cast_transpose_launch(uint8_t *out, const void *x, tetra_dtype xt, const float *scale, int rows, int cols) {
    dim3 block(TRANSPOSE_TILE, TRANSPOSE_ROWS), grid = transpose_grid(rows, cols);
    const tile_quant<FMT> q = {scale};
    if (cast_t_vec(x, xt, out, NULL, rows, cols))
        cast_t_vec_kernel<tile_quant<FMT>><<<cast_t_vec_grid(rows, cols), 256, 0, cuda_stream()>>>(
            out, (uint8_t *)NULL, (const uint16_t *)x, rows, cols, q);
    else if (xt == TETRA_BF16)
        transpose_tiles_kernel<uint8_t, uint16_t, tile_quant<FMT>>
            <<<grid, block, 0, cuda_stream()>>>(out, (uint8_t *)NULL, (const uint16_t *)x, rows, cols, q);
    else
        transpose_tiles_kernel<uint8_t, float, tile_quant<FMT>>
            <<<grid, block, 0, cuda_stream()>>>(out, (uint8_t *)NULL, (const float *)x, rows, cols, q);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_cast_transpose_to_fp8(uint8_t *out, const void *x, tetra_dtype xt, const float *scale, int rows,
                                           int cols, tetra_dtype fmt) {
    if (rows <= 0 || cols <= 0) return;
    if (fmt == TETRA_FP8_E5M2) cast_transpose_launch<TETRA_FP8_E5M2>(out, x, xt, scale, rows, cols);
    else cast_transpose_launch<TETRA_FP8_E4M3>(out, x, xt, scale, rows, cols);
}

extern "C" void cuda_cast_fp8_to_f32(float *out, const uint8_t *q, const float *inv_scale, int rowwise, int rows,
                                     int cols, tetra_dtype fmt) {
    from_fp8_launch(out, q, inv_scale, rowwise, rows, cols, fmt);
}

extern "C" void cuda_cast_fp8_to_bf16(uint16_t *out, const uint8_t *q, const float *inv_scale, int rowwise, int rows,
                                      int cols, tetra_dtype fmt) {
    from_fp8_launch(out, q, inv_scale, rowwise, rows, cols, fmt);
}

// tetra_fp8_scale, with the power of two built exactly: ldexpf(1, e) where the shared
// code calls exp2f(e) for an integer e (the host's exp2f is exact there; the device's
// exp2f only promises 2 ulp).
// inv_scale: '/' is the IEEE round-to-nearest division here because the backend is built
// without --use_fast_math (nvcc's default -prec-div=true), the same division as the CPU's.
__global__ void fp8_scale_kernel(float *scale, float *inv_scale, const float *amax, int n, int broadcast, float fp8_max,
                                 int pow2) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float sf = tetra_fp8_scale(amax[broadcast ? 0 : i], fp8_max, 0);
    if (pow2) {
        float e = floorf(log2f(sf));
        sf = (e >= -149.0f && e <= 127.0f) ? ldexpf(1.0f, (int)e) : exp2f(e);
    }
    scale[i] = sf;
    if (inv_scale) inv_scale[i] = 1.0f / sf;
}

extern "C" void cuda_fp8_scale_from_amax(float *scale, float *inv_scale, const float *amax, int n, int broadcast,
                                         float fp8_max, int pow2) {
    if (n <= 0) return;
    fp8_scale_kernel<<<(n + TETRA_THREADS - 1) / TETRA_THREADS, TETRA_THREADS, 0, cuda_stream()>>>(
        scale, inv_scale, amax, n, broadcast, fp8_max, pow2);
    CUDA_CHECK_LAUNCH();
}

// fp8_quantize: every thread derives the one scale from the device amax itself (the
// arithmetic of fp8_scale_kernel), so the scale costs no launch of its own; block 0
// writes the GEMM's dequant factor.
__device__ __forceinline__ float quantize_scale(const float *amax, float fp8_max, float *inv_scale) {
    const float s = tetra_fp8_scale(amax[0], fp8_max, 0);
    if (inv_scale && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) *inv_scale = 1.0f / s;
    return s;
}

// Row-major only. bf16 x 16-byte aligned (and out 8-byte aligned): eight elements a step,
// one 16-byte load and one 8-byte store; otherwise one at a time.
template <int FMT, typename T>
__global__ void quantize_rows_kernel(uint8_t *out, float *inv_scale, const T *x, const float *amax, size_t n, int vec) {
    const float s = quantize_scale(amax, FMT == TETRA_FP8_E5M2 ? OPS_FP8_E5M2_MAX : OPS_FP8_E4M3_MAX, inv_scale);
    const size_t stride = (size_t)gridDim.x * blockDim.x, t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t done = 0;
    if (vec) {
        const uint4 *w = (const uint4 *)x;
        unsigned long long *o = (unsigned long long *)out;
        const size_t n8 = n / 8;
        for (size_t i = t; i < n8; i += stride) {
            const uint4 v = w[i];
            const unsigned int h[4] = {v.x, v.y, v.z, v.w};
            unsigned long long r = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                r |= quant_fp8<FMT>(tetra_bf16_to_f32((uint16_t)(h[j] & 0xffffu)), s) << (16 * j);
                r |= quant_fp8<FMT>(tetra_bf16_to_f32((uint16_t)(h[j] >> 16)), s) << (16 * j + 8);
            }
            o[i] = r;
        }
        done = n8 * 8;
    }
    for (size_t i = done + t; i < n; i += stride) out[i] = (uint8_t)quant_fp8<FMT>(load_f32(x, i), s);
}

// Through the tiles of the transpose (transpose_tiles_kernel): x read once, each element
// quantised as it enters shared memory with the one scale each thread derives at begin()
template <int FMT> struct tile_quant_amax {
    const float *amax;
    float *inv_scale;
    float s;
    __device__ void begin() {
        s = quantize_scale(amax, FMT == TETRA_FP8_E5M2 ? OPS_FP8_E5M2_MAX : OPS_FP8_E4M3_MAX, inv_scale);
    }
    __device__ uint8_t operator()(float v, int) const { return (uint8_t)quant_fp8<FMT>(v, s); }
};

template <int FMT, typename T>
static void quantize_launch(uint8_t *out, uint8_t *out_t, float *inv_scale, const T *x, const float *amax, int rows,
                            int cols) {
    const size_t n = (size_t)rows * (size_t)cols;
    if (out_t && cast_t_vec(x, sizeof(T) == 2 ? TETRA_BF16 : TETRA_F32, out_t, out, rows, cols)) {
        const tile_quant_amax<FMT> q = {amax, inv_scale, 0.0f};
        cast_t_vec_kernel<tile_quant_amax<FMT>>
            <<<cast_t_vec_grid(rows, cols), 256, 0, cuda_stream()>>>(out_t, out, (const uint16_t *)x, rows, cols, q);
        CUDA_CHECK_LAUNCH();
        return;
    }
    if (out_t) {
        dim3 block(TRANSPOSE_TILE, TRANSPOSE_ROWS);
        const tile_quant_amax<FMT> q = {amax, inv_scale, 0.0f};
        transpose_tiles_kernel<uint8_t, T, tile_quant_amax<FMT>>
            <<<transpose_grid(rows, cols), block, 0, cuda_stream()>>>(out_t, out, x, rows, cols, q);
    } else {
        const int vec = sizeof(T) == 2 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)out & 7) == 0;
        quantize_rows_kernel<FMT, T>
            <<<tetra_blocks(vec ? (n + 7) / 8 : n, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(out, inv_scale, x,
                                                                                                      amax, n, vec);
    }
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_fp8_quantize(uint8_t *out, uint8_t *out_t, float *inv_scale, const void *x, tetra_dtype xt,
                                  const float *amax, int rows, int cols, tetra_dtype fmt) {
    const int e5 = fmt == TETRA_FP8_E5M2;
    if (rows <= 0 || cols <= 0 || (!out && !out_t)) {
        /* nothing to cast; the dequant factor is still written when asked for */
        if (!inv_scale) return;
        if (e5)
            quantize_rows_kernel<TETRA_FP8_E5M2, float><<<1, 32, 0, cuda_stream()>>>(NULL, inv_scale, NULL, amax, 0, 0);
        else
            quantize_rows_kernel<TETRA_FP8_E4M3, float><<<1, 32, 0, cuda_stream()>>>(NULL, inv_scale, NULL, amax, 0, 0);
        CUDA_CHECK_LAUNCH();
        return;
    }
    const int bf = xt == TETRA_BF16;
    const uint16_t *xb = (const uint16_t *)x;
    const float *xf = (const float *)x;
    if (e5 && bf) quantize_launch<TETRA_FP8_E5M2>(out, out_t, inv_scale, xb, amax, rows, cols);
    else if (e5) quantize_launch<TETRA_FP8_E5M2>(out, out_t, inv_scale, xf, amax, rows, cols);
    else if (bf) quantize_launch<TETRA_FP8_E4M3>(out, out_t, inv_scale, xb, amax, rows, cols);
    else quantize_launch<TETRA_FP8_E4M3>(out, out_t, inv_scale, xf, amax, rows, cols);
}

// ----------------------------------------------------------------------------
// AdamW: tetra_adamw_update per element with tetra_adamw_coefficients, both shared with
// the CPU backend. The explicit fmaf calls of the shared update and IEEE division and
// square root make the GPU result equal the CPU's.

// vec: every pointer 16-byte aligned (p16 8-byte): four elements a step, each array read
// and written with one 16-byte access (the bf16 copy with one 8-byte store), the rest one
// at a time; the same update per element either way.
__global__ void adamw_kernel(float *p, float *m, float *v, const float *g, uint16_t *p16, size_t n, tetra_adamw_coef k,
                             const ops_optim_state *dev, int vec) {
    if (dev) {
        if (dev->skip) return;
        k = dev->k;
    }
    const size_t stride = (size_t)gridDim.x * blockDim.x, t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t head = 0;
    if (vec) {
        const size_t n4 = n / 4;
        for (size_t i = t; i < n4; i += stride) {
            vec16<float> pv = load16(p + 4 * i), mv = load16(m + 4 * i), vv = load16(v + 4 * i);
            const vec16<float> gv = load16(g + 4 * i);
#pragma unroll
            for (int j = 0; j < 4; j++) tetra_adamw_update(&pv.e[j], &mv.e[j], &vv.e[j], gv.e[j], &k);
            store16(p + 4 * i, pv);
            store16(m + 4 * i, mv);
            store16(v + 4 * i, vv);
            if (p16) {
                const unsigned long long b = (unsigned long long)tetra_f32_to_bf16(pv.e[0]) |
                    (unsigned long long)tetra_f32_to_bf16(pv.e[1]) << 16 |
                    (unsigned long long)tetra_f32_to_bf16(pv.e[2]) << 32 |
                    (unsigned long long)tetra_f32_to_bf16(pv.e[3]) << 48;
                *(unsigned long long *)(p16 + 4 * i) = b;
            }
        }
        head = n4 * 4;
    }
    for (size_t i = head + t; i < n; i += stride) {
        float pp = p[i], mm = m[i], vv = v[i];
        tetra_adamw_update(&pp, &mm, &vv, g[i], &k);
        p[i] = pp;
        m[i] = mm;
        v[i] = vv;
        if (p16) p16[i] = tetra_f32_to_bf16(pp);
    }
}

static void adamw_launch(float *param, float *m, float *v, const float *grad, uint16_t *p16, size_t n,
                         tetra_adamw_coef k, const ops_optim_state *dev) {
    const int vec = tetra_aligned16(param) && tetra_aligned16(m) && tetra_aligned16(v) && tetra_aligned16(grad) &&
        ((uintptr_t)p16 & 7u) == 0;
    const size_t w = vec ? (n + 3) / 4 : n;
    adamw_kernel<<<tetra_blocks(w, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(param, m, v, grad, p16, n, k, dev,
                                                                                      vec);
    CUDA_CHECK_LAUNCH();
}

// adamw_step_amax: the update of adamw_kernel, and each stretch's max |w| of the compute
// copy. A block takes a chunk of 16 elements per thread at a time (so a chunk meets one
// stretch, or a few where one ends), keeps its elements' magnitudes in registers, and for
// each stretch the chunk meets reduces them over the block (block_nan_max) and hands the
// result to one atomicMax on the float's bits: non-negative floats (and the canonical NaN
// above +inf) order as their bits do, and a maximum does not depend on the order, so the
// bits are those of a pass per stretch. Skipped updates leave the weights and still report.
#define ADAMW_AMAX_PER_THREAD 16

__device__ __forceinline__ float adamw_mag(float p, const uint16_t *p16) {
    return fabsf(p16 ? tetra_bf16_to_f32(tetra_f32_to_bf16(p)) : p);
}

// the first stretch that ends after element i (seg.n when none)
__device__ __forceinline__ int stretch_after(const ops_amax_segments &seg, size_t i) {
    int lo = 0, hi = seg.n;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if ((size_t)(seg.off[mid] + seg.len[mid]) > i) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

__global__ void adamw_amax_kernel(float *p, float *m, float *v, const float *g, uint16_t *p16, size_t n,
                                  tetra_adamw_coef k, const ops_optim_state *dev, int vec, ops_amax_segments seg) {
    __shared__ float sh[32];
    int skip = 0;
    if (dev) {
        skip = dev->skip;
        k = dev->k;
    }
    const size_t chunk = (size_t)blockDim.x * ADAMW_AMAX_PER_THREAD;
    const size_t nchunks = (n + chunk - 1) / chunk;
    for (size_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
        const size_t base = c * chunk, end = base + chunk < n ? base + chunk : n;
        float mag[ADAMW_AMAX_PER_THREAD];
        size_t at[ADAMW_AMAX_PER_THREAD]; // the element of mag[j] (n: none)
#pragma unroll
        for (int j = 0; j < ADAMW_AMAX_PER_THREAD / 4; j++) {
            // vec: 4 consecutive elements a step; else 4 elements a block apart
            const size_t i0 = vec ? base + 4 * ((size_t)threadIdx.x + (size_t)j * blockDim.x)
                                  : base + threadIdx.x + (size_t)4 * j * blockDim.x;
            if (vec && i0 + 3 < end) {
                vec16<float> pv = load16(p + i0);
                if (!skip) {
                    vec16<float> mv = load16(m + i0), vv = load16(v + i0);
                    const vec16<float> gv = load16(g + i0);
#pragma unroll
                    for (int q = 0; q < 4; q++) tetra_adamw_update(&pv.e[q], &mv.e[q], &vv.e[q], gv.e[q], &k);
                    store16(p + i0, pv);
                    store16(m + i0, mv);
                    store16(v + i0, vv);
                    if (p16) {
                        const unsigned long long b = (unsigned long long)tetra_f32_to_bf16(pv.e[0]) |
                            (unsigned long long)tetra_f32_to_bf16(pv.e[1]) << 16 |
                            (unsigned long long)tetra_f32_to_bf16(pv.e[2]) << 32 |
                            (unsigned long long)tetra_f32_to_bf16(pv.e[3]) << 48;
                        *(unsigned long long *)(p16 + i0) = b;
                    }
                }
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    mag[4 * j + q] = adamw_mag(pv.e[q], p16);
                    at[4 * j + q] = i0 + q;
                }
                continue;
            }
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const size_t i = vec ? i0 + q : i0 + (size_t)q * blockDim.x;
                mag[4 * j + q] = 0.0f;
                at[4 * j + q] = n;
                if (i >= end) continue;
                float pp = p[i];
                if (!skip) {
                    float mm = m[i], vv = v[i];
                    tetra_adamw_update(&pp, &mm, &vv, g[i], &k);
                    p[i] = pp;
                    m[i] = mm;
                    v[i] = vv;
                    if (p16) p16[i] = tetra_f32_to_bf16(pp);
                }
                mag[4 * j + q] = adamw_mag(pp, p16);
                at[4 * j + q] = i;
            }
        }
        // the same stretches in every thread: the loop and its barriers are block-uniform
        for (int s = stretch_after(seg, base); s < seg.n && (size_t)seg.off[s] < end; s++) {
            const size_t lo = (size_t)seg.off[s], hi = lo + (size_t)seg.len[s];
            float r = 0.0f;
#pragma unroll
            for (int j = 0; j < ADAMW_AMAX_PER_THREAD; j++)
                if (at[j] >= lo && at[j] < hi) r = nan_max(r, mag[j]);
            r = block_nan_max(r, sh);
            if (threadIdx.x == 0 && hi > lo) atomicMax((unsigned *)(seg.amax + s), __float_as_uint(r));
        }
    }
}

extern "C" void cuda_adamw_step_amax(float *param, uint16_t *param_bf16, float *m, float *v, const float *grad,
                                     size_t n, double lr, double beta1, double beta2, double eps, double weight_decay,
                                     int step, float grad_scale, const ops_optim_state *dev,
                                     const ops_amax_segments *seg) {
    tetra_adamw_coef k = tetra_adamw_coefficients(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
    if (!seg || seg->n <= 0) {
        if (n) adamw_launch(param, m, v, grad, param_bf16, n, k, dev);
        return;
    }
    // the maxima start from 0 (an empty stretch keeps it)
    CUDA_CHECK(cudaMemsetAsync(seg->amax, 0, (size_t)seg->n * sizeof(float), cuda_stream()));
    if (!n) return;
    const int vec = tetra_aligned16(param) && tetra_aligned16(m) && tetra_aligned16(v) && tetra_aligned16(grad) &&
        ((uintptr_t)param_bf16 & 7u) == 0;
    const size_t chunk = (size_t)TETRA_THREADS * ADAMW_AMAX_PER_THREAD;
    adamw_amax_kernel<<<tetra_blocks((n + chunk - 1) / chunk, 1), TETRA_THREADS, 0, cuda_stream()>>>(
        param, m, v, grad, param_bf16, n, k, dev, vec, *seg);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_adamw_step(float *param, float *m, float *v, const float *grad, size_t n, double lr, double beta1,
                                double beta2, double eps, double weight_decay, int step, float grad_scale,
                                const ops_optim_state *dev) {
    if (!n) return;
    tetra_adamw_coef k = tetra_adamw_coefficients(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
    adamw_launch(param, m, v, grad, NULL, n, k, dev);
}

extern "C" void cuda_adamw_step_bf16(float *param, uint16_t *param_bf16, float *m, float *v, const float *grad,
                                     size_t n, double lr, double beta1, double beta2, double eps, double weight_decay,
                                     int step, float grad_scale, const ops_optim_state *dev) {
    if (!n) return;
    tetra_adamw_coef k = tetra_adamw_coefficients(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
    adamw_launch(param, m, v, grad, param_bf16, n, k, dev);
}

// The optimizer's scalars (ops.h ops_optim_state): one thread each, so that a step that
// logs nothing keeps its norm, clip coefficient and update count on the device.
__global__ void grad_sq_to_f64_kernel(double *out, const float *sq, int n, const float *loss, int n_loss) {
    if (threadIdx.x) return; // a block of one warp: the simulator runs whole warps
    double l = 0.0;
    for (int k = 0; k < n_loss; k++) l += (double)loss[k];
    for (int i = 0; i < n; i++) out[i] = (double)sq[i];
    if (n > 0 && !isfinite(l)) out[0] = (double)NAN;
}

__global__ void sum_f64_kernel(double *out, const double *in, int n) {
    if (threadIdx.x) return; // a block of one warp: the simulator runs whole warps
    double s = 0.0;
    for (int i = 0; i < n; i++) s += in[i];
    *out = s;
}

__global__ void optim_scalars_kernel(ops_optim_state *s, ops_optim_args a, tetra_adamw_coef host_k) {
    if (threadIdx.x) return; // a block of one warp: the simulator runs whole warps
    tetra_optim_scalars(s, &a, &host_k);
}

static void cuda_grad_sq_to_f64(double *out, const float *sq, int n, const float *loss, int n_loss) {
    grad_sq_to_f64_kernel<<<1, 32, 0, cuda_stream()>>>(out, sq, n, loss, n_loss);
    CUDA_CHECK_LAUNCH();
}

static void cuda_sum_f64(double *out, const double *in, int n) {
    sum_f64_kernel<<<1, 32, 0, cuda_stream()>>>(out, in, n);
    CUDA_CHECK_LAUNCH();
}

static void cuda_optim_scalars(ops_optim_state *s, const ops_optim_args *a) {
    // the coefficients of the expected t from the host's pow, as the host path derives them
    const tetra_adamw_coef k =
        tetra_adamw_coefficients(a->lr, a->beta1, a->beta2, a->eps, a->weight_decay, a->expected_t, 1.0f);
    optim_scalars_kernel<<<1, 32, 0, cuda_stream()>>>(s, *a, k);
    CUDA_CHECK_LAUNCH();
}

// ----------------------------------------------------------------------------
// the table

static tetra_ops make_table(void) {
    tetra_ops t;
    memset(&t, 0, sizeof t);
    t.name = "cuda";
    t.alloc = cuda_alloc;
    t.release = cuda_release;
    t.copy_h2d = cuda_copy_h2d;
    t.copy_h2d_async = cuda_copy_h2d_async;
    t.copy_d2h = cuda_copy_d2h;
    t.copy = cuda_copy;
    t.synchronize = cuda_synchronize;
    t.fill = cuda_fill;
    t.scale = cuda_scale;
    t.axpy = cuda_axpy;
    t.add = cuda_add;
    t.sum_squares = cuda_sum_squares;
    t.sum = cuda_sum;
    t.amax = cuda_amax;
    t.amax_rows = cuda_amax_rows;
    t.transpose = cuda_transpose;
    t.cast_f32_to_bf16 = cuda_cast_f32_to_bf16;
    t.cast_bf16_to_f32 = cuda_cast_bf16_to_f32;
    t.cast_f32_to_fp8 = cuda_cast_f32_to_fp8;
    t.cast_fp8_to_f32 = cuda_cast_fp8_to_f32;
    t.cast_fp8_to_bf16 = cuda_cast_fp8_to_bf16;
    t.transpose_u8 = cuda_transpose_u8;
    t.cast_bf16_to_fp8 = cuda_cast_bf16_to_fp8;
    t.amax_bf16 = cuda_amax_bf16;
    t.amax_rows_bf16 = cuda_amax_rows_bf16;
    t.amax_cols = cuda_amax_cols;
    t.cast_transpose_to_fp8 = cuda_cast_transpose_to_fp8;
    t.fp8_quantize = cuda_fp8_quantize;
    t.fp8_scale_from_amax = cuda_fp8_scale_from_amax;
    t.gemm = cuda_gemm;
    t.embedding_forward = cuda_embedding_forward;
    t.embedding_backward = cuda_embedding_backward;
    t.rmsnorm_forward = cuda_rmsnorm_forward;
    t.rmsnorm_backward_input = cuda_rmsnorm_backward_input;
    t.rmsnorm_backward_weight = cuda_rmsnorm_backward_weight;
    t.rope_forward = cuda_rope_forward;
    t.rope_backward = cuda_rope_backward;
    t.swiglu_forward = cuda_swiglu_forward;
    t.swiglu_backward = cuda_swiglu_backward;
    t.attention_workspace_size = cuda_attention_workspace_size;
    t.attention_forward = cuda_attention_forward;
    t.attention_backward = cuda_attention_backward;
    t.attention_merge = cuda_attention_merge;
    t.cross_entropy = cuda_cross_entropy;
    t.cross_entropy_bf16 = cuda_cross_entropy_bf16;
    t.ce_shard_max = cuda_ce_shard_max;
    t.ce_shard_sums = cuda_ce_shard_sums;
    t.ce_shard_finish = cuda_ce_shard_finish;
    t.adamw_step = cuda_adamw_step;
    t.adamw_step_bf16 = cuda_adamw_step_bf16;
    t.adamw_step_amax = cuda_adamw_step_amax;
    t.grad_sq_to_f64 = cuda_grad_sq_to_f64;
    t.sum_f64 = cuda_sum_f64;
    t.optim_scalars = cuda_optim_scalars;
    t.host_waits = cuda_host_waits;
    t.embedding_forward_bf16 = cuda_embedding_forward_bf16;
    t.embedding_backward_bf16 = cuda_embedding_backward_bf16;
    t.rmsnorm_forward_bf16 = cuda_rmsnorm_forward_bf16;
    t.rmsnorm_backward_input_bf16 = cuda_rmsnorm_backward_input_bf16;
    t.rmsnorm_backward_weight_bf16 = cuda_rmsnorm_backward_weight_bf16;
    t.rope_forward_bf16 = cuda_rope_forward_bf16;
    t.rope_backward_bf16 = cuda_rope_backward_bf16;
    t.swiglu_forward_bf16 = cuda_swiglu_forward_bf16;
    t.swiglu_backward_bf16 = cuda_swiglu_backward_bf16;
    t.attention_workspace_size_bf16 = cuda_attention_workspace_size_bf16;
    t.attention_forward_bf16 = cuda_attention_forward_bf16;
    t.attention_backward_bf16 = cuda_attention_backward_bf16;
    t.alloc_count = cuda_alloc_count;
    t.allocated_bytes = cuda_allocated_bytes;
    t.memory_freeze = cuda_memory_freeze;
    t.device_memory = cuda_device_memory;
    t.compute_stream = cuda_compute_stream;
    t.range_push = cuda_range_push;
    t.range_pop = cuda_range_pop;
    t.set_deterministic = cuda_set_deterministic;
    t.host_memory = 0; // device memory: collectives go through NCCL (or MPI, staged)
    t.select_device = cuda_select_device;
    t.host_alloc = cuda_host_alloc;
    t.host_release = cuda_host_release;
    t.copy_2d = cuda_copy_2d;
    t.graph_begin = cuda_graph_begin;
    t.graph_end = cuda_graph_end;
    t.graph_stats = cuda_graph_stats;
    return t;
}

extern "C" const tetra_ops *ops_cuda(char *err, size_t errlen) {
    static tetra_ops table;
    static int ready = 0;
    int n = cuda_device_count();
    if (n <= 0) {
        if (err && errlen)
            snprintf(err, errlen,
                     "device \"cuda\": no CUDA device is visible (cudaGetDeviceCount = 0); "
                     "use training.device = \"cpu\" or \"auto\"");
        return NULL;
    }
    if (!ready) {
        table = make_table();
        ready = 1;
    }
    return &table;
}
