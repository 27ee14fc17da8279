// kernels/cuda/cuda_layers.cu — embedding, RMSNorm, RoPE, SwiGLU (fp32 and bf16
// activations) and the fused cross-entropy (fp32) of the CUDA backend. Per-element math
// comes from ops_math.h, the CPU backend's own header. Reductions that produce
// gradients are atomics-free and deterministic (same inputs, same bits, on any GPU).
// Each op's launches, passes and bytes are described in kernels/op_costs.c (opc_<op>),
// checked against these kernels on the simulator: change both together.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops_math.h"

// ----------------------------------------------------------------------------
// The kernels below are templates on the activation type T: float (the fp32 ops) or
// uint16_t holding bf16 (the *_bf16 ops). Both instantiations run the same fp32
// arithmetic (to_f32 widens exactly, store_f32 rounds once to nearest even), so a bf16
// op's result is its fp32 twin's, rounded. Parameter gradients (dwte, dw) stay fp32.

// ----------------------------------------------------------------------------
// embedding

template <typename T>
__global__ void embedding_fwd_kernel(T *out, const int32_t *tokens, const T *wte, int n, int c, int v_start,
                                     int v_local) {
    const size_t total = (size_t)n * (size_t)c, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        size_t i = idx / (size_t)c, j = idx - i * (size_t)c;
        int t = tokens[i] - v_start;
        out[idx] = (t >= 0 && t < v_local) ? wte[(size_t)t * (size_t)c + j] : (T)0; // other shard: zero row
    }
}

template <typename T>
static void embedding_forward(T *out, const int32_t *tokens, const T *wte, int n, int c, int v_start, int v_local) {
    if (n <= 0 || c <= 0) return;
    embedding_fwd_kernel<T><<<tetra_blocks((size_t)n * c, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(
        out, tokens, wte, n, c, v_start, v_local);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_embedding_forward(float *out, const int32_t *tokens, const float *wte, int n, int c, int v_start,
                                       int v_local) {
    embedding_forward(out, tokens, wte, n, c, v_start, v_local);
}

extern "C" void cuda_embedding_forward_bf16(uint16_t *out, const int32_t *tokens, const uint16_t *wte, int n, int c,
                                            int v_start, int v_local) {
    embedding_forward(out, tokens, wte, n, c, v_start, v_local); // a bit copy: exact
}

// Backward without float atomics: the (token, position) pairs are sorted by token with a
// stable radix sort, so each vocabulary row's occurrences form one run in increasing
// position order. The block at the start of a run adds the run's rows into dwte in that
// order: the same sum, in the same order, as the CPU backend.
__global__ void embedding_keys_kernel(uint32_t *keys, int32_t *vals, const int32_t *tokens, int n, int v_start,
                                      int v_local) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int t = tokens[i] - v_start;
    keys[i] = (uint32_t)((t >= 0 && t < v_local) ? t : v_local); // v_local: not in this shard, sorts last
    vals[i] = i;
}

template <typename T>
__global__ void embedding_bwd_kernel(float *dwte, const T *dout, const uint32_t *keys, const int32_t *vals, int n,
                                     int c, int v_local) {
    const int p = blockIdx.x;
    const uint32_t key = keys[p];
    if (key == (uint32_t)v_local || (p > 0 && keys[p - 1] == key)) return; // not the start of a run
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= c) return;
    float *row = dwte + (size_t)key * (size_t)c + j;
    float acc = *row;
    for (int q = p; q < n && keys[q] == key; q++) acc += to_f32(dout[(size_t)vals[q] * (size_t)c + j]);
    *row = acc;
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

template <typename T>
static void embedding_backward(float *dwte, const T *dout, const int32_t *tokens, int n, int c, int v_start,
                               int v_local) {
    if (n <= 0 || c <= 0 || v_local <= 0) return;
    cudaStream_t st = cuda_stream();
    int end_bit = 0;
    while (end_bit < 31 && ((int64_t)1 << end_bit) <= (int64_t)v_local) end_bit++; // keys in [0, v_local]
    size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                                               (const int32_t *)NULL, (int32_t *)NULL, n, 0, end_bit, st));
    size_t arr = align256((size_t)n * sizeof(int32_t));
    char *base = (char *)cuda_scratch(SCRATCH_SORT, 4 * arr + align256(temp_bytes));
    uint32_t *keys_in = (uint32_t *)base, *keys_out = (uint32_t *)(base + 2 * arr);
    int32_t *vals_in = (int32_t *)(base + arr), *vals_out = (int32_t *)(base + 3 * arr);
    void *temp = base + 4 * arr;
    embedding_keys_kernel<<<(n + TETRA_THREADS - 1) / TETRA_THREADS, TETRA_THREADS, 0, st>>>(keys_in, vals_in, tokens,
                                                                                             n, v_start, v_local);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in, vals_out, n, 0, end_bit, st));
    dim3 grid((unsigned)n, (unsigned)((c + TETRA_THREADS - 1) / TETRA_THREADS));
    embedding_bwd_kernel<T><<<grid, TETRA_THREADS, 0, st>>>(dwte, dout, keys_out, vals_out, n, c, v_local);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int n, int c,
                                        int v_start, int v_local) {
    embedding_backward(dwte, dout, tokens, n, c, v_start, v_local);
}

extern "C" void cuda_embedding_backward_bf16(float *dwte, const uint16_t *dout, const int32_t *tokens, int n, int c,
                                             int v_start, int v_local) {
    embedding_backward(dwte, dout, tokens, n, c, v_start, v_local);
}

// ----------------------------------------------------------------------------
// RMSNorm: one block per row

// Block b takes rows b, b + gridDim.x, ... (one row each when launched with a block per
// row). With AMAX (at most TETRA_AMAX_MAX_BLOCKS blocks) the maximum of what it stored
// goes to amax_finish.
template <typename T, int AMAX>
__global__ void __launch_bounds__(TETRA_THREADS)
    rmsnorm_fwd_kernel(T *out, float *rstd, float *amax, float *part, unsigned *done, const T *x, const T *w, int n,
                       int c, float eps) {
    __shared__ float sh[32];
    __shared__ int last;
    float m = 0.0f;
    for (int row = blockIdx.x; row < n; row += gridDim.x) {
        const size_t o = (size_t)row * (size_t)c;
        float ss = 0.0f;
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            float v = to_f32(x[o + j]);
            ss = fmaf(v, v, ss);
        }
        ss = block_sum(ss, sh);
        float r = tetra_rms_rstd(ss, c, eps);
        for (int j = threadIdx.x; j < c; j += blockDim.x) {
            const float v = store_f32_as(out + o + j, (to_f32(x[o + j]) * r) * to_f32(w[j]));
            if (AMAX) m = nan_max(m, fabsf(v));
        }
        if (threadIdx.x == 0) rstd[row] = r;
    }
    if (AMAX) {
        m = block_nan_max(m, sh);
        amax_finish<1>(&amax, part, done, &m, sh, &last);
    }
}

// dx = dx + d/dx, summed in fp32 (for bf16 dx: read, add, round once)
template <typename T>
__global__ void __launch_bounds__(TETRA_THREADS)
    rmsnorm_bwd_input_kernel(T *dx, const T *dout, const T *x, const T *w, const float *rstd, int c, const T *dres) {
    __shared__ float sh[32];
    const size_t o = (size_t)blockIdx.x * (size_t)c;
    float dot = 0.0f;
    for (int j = threadIdx.x; j < c; j += blockDim.x) dot += (to_f32(w[j]) * to_f32(dout[o + j])) * to_f32(x[o + j]);
    dot = block_sum(dot, sh);
    const float r = rstd[blockIdx.x], dot_c = dot / (float)c;
    for (int j = threadIdx.x; j < c; j += blockDim.x)
        store_f32(dx + o + j,
                  to_f32(dres[o + j]) + tetra_rms_dx(to_f32(x[o + j]), to_f32(w[j]), to_f32(dout[o + j]), r, dot_c));
}

template <typename T>
static void rmsnorm_forward(T *out, float *rstd, float *amax, const T *x, const T *w, int n, int c, float eps) {
    if (amax) {
        const int rows = n > 0 && c > 0 ? n : 0; /* none: one block writes 0 */
        const unsigned grid = rows < 1 ? 1u : rows < TETRA_AMAX_MAX_BLOCKS ? (unsigned)rows : TETRA_AMAX_MAX_BLOCKS;
        rmsnorm_fwd_kernel<T, 1><<<grid, TETRA_THREADS, 0, cuda_stream()>>>(out, rstd, amax, cuda_amax_part(),
                                                                            cuda_amax_counter(), x, w, rows, c, eps);
        CUDA_CHECK_LAUNCH();
        return;
    }
    if (n <= 0 || c <= 0) return;
    rmsnorm_fwd_kernel<T, 0><<<n, TETRA_THREADS, 0, cuda_stream()>>>(out, rstd, NULL, NULL, NULL, x, w, n, c, eps);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void rmsnorm_backward_input(T *dx, const T *dout, const T *x, const T *w, const float *rstd, int n, int c,
                                   const T *dres) {
    if (n <= 0 || c <= 0) return;
    rmsnorm_bwd_input_kernel<T><<<n, TETRA_THREADS, 0, cuda_stream()>>>(dx, dout, x, w, rstd, c, dres ? dres : dx);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int n, int c, float eps) {
    rmsnorm_forward(out, rstd, (float *)NULL, x, w, n, c, eps);
}

extern "C" void cuda_rmsnorm_forward_bf16(uint16_t *out, float *rstd, float *amax, const uint16_t *x, const uint16_t *w,
                                          int n, int c, float eps) {
    rmsnorm_forward(out, rstd, amax, x, w, n, c, eps);
}

extern "C" void cuda_rmsnorm_backward_input(float *dx, const float *dout, const float *x, const float *w,
                                            const float *rstd, int n, int c, const float *dres) {
    rmsnorm_backward_input(dx, dout, x, w, rstd, n, c, dres);
}

extern "C" void cuda_rmsnorm_backward_input_bf16(uint16_t *dx, const uint16_t *dout, const uint16_t *x,
                                                 const uint16_t *w, const float *rstd, int n, int c,
                                                 const uint16_t *dres) {
    rmsnorm_backward_input(dx, dout, x, w, rstd, n, c, dres);
}

// Weight gradient: a column reduction over rows, deterministic in two passes. Pass 1:
// the rows are cut into chunks (their number a function of n alone); block (column tile,
// chunk) sums its rows in a fixed order, in double, into partial[chunk, col]. Pass 2
// sums the chunks in order and adds to dw (fp32 for both activation types).
#define RMS_DW_MAX_CHUNKS 256

static int rms_rows_per_chunk(int n) {
    int r = (n + RMS_DW_MAX_CHUNKS - 1) / RMS_DW_MAX_CHUNKS;
    return r < 64 ? 64 : r;
}

template <typename T>
__global__ void __launch_bounds__(256) rmsnorm_dw_partial_kernel(double *partial, const T *dout, const T *x,
                                                                 const float *rstd, int n, int c, int rows_per_chunk) {
    __shared__ double sh[8][33];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int col = blockIdx.x * 32 + tx;
    const int r0 = blockIdx.y * rows_per_chunk;
    const int r1 = min(n, r0 + rows_per_chunk);
    double acc = 0.0;
    if (col < c) {
        for (int r = r0 + ty; r < r1; r += 8) {
            size_t o = (size_t)r * (size_t)c + col;
            acc += (double)(to_f32(dout[o]) * (to_f32(x[o]) * rstd[r]));
        }
    }
    sh[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && col < c) {
        double s = 0.0;
#pragma unroll
        for (int i = 0; i < 8; i++) s += sh[i][tx];
        partial[(size_t)blockIdx.y * (size_t)c + col] = s;
    }
}

__global__ void rmsnorm_dw_final_kernel(float *dw, const double *partial, int chunks, int c) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= c) return;
    double s = 0.0;
    for (int k = 0; k < chunks; k++) s += partial[(size_t)k * (size_t)c + col];
    dw[col] += (float)s;
}

template <typename T>
static void rmsnorm_backward_weight(float *dw, const T *dout, const T *x, const float *rstd, int n, int c) {
    if (n <= 0 || c <= 0) return;
    int rpc = rms_rows_per_chunk(n);
    int chunks = (n + rpc - 1) / rpc;
    double *partial = (double *)cuda_scratch(SCRATCH_RMS_DW, (size_t)chunks * (size_t)c * sizeof(double));
    dim3 grid((unsigned)((c + 31) / 32), (unsigned)chunks);
    cudaStream_t st = cuda_stream();
    rmsnorm_dw_partial_kernel<T><<<grid, 256, 0, st>>>(partial, dout, x, rstd, n, c, rpc);
    CUDA_CHECK_LAUNCH();
    rmsnorm_dw_final_kernel<<<(c + TETRA_THREADS - 1) / TETRA_THREADS, TETRA_THREADS, 0, st>>>(dw, partial, chunks, c);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_rmsnorm_backward_weight(float *dw, const float *dout, const float *x, const float *rstd, int n,
                                             int c) {
    rmsnorm_backward_weight(dw, dout, x, rstd, n, c);
}

extern "C" void cuda_rmsnorm_backward_weight_bf16(float *dw, const uint16_t *dout, const uint16_t *x, const float *rstd,
                                                  int n, int c) {
    rmsnorm_backward_weight(dw, dout, x, rstd, n, c);
}

// ----------------------------------------------------------------------------
// RoPE: one thread per (row, head, pair); reads both values before writing (in place ok)

template <bool INVERSE, typename T, int AMAX = 0>
__global__ void rope_kernel(T *out, const T *x, const float *freqs, const int32_t *pos, int pos_offset, int s, int nh,
                            int d, size_t total, float *amax = NULL, float *part = NULL, unsigned *done = NULL) {
    __shared__ float sh[AMAX ? 32 : 1];
    __shared__ int last;
    float m = 0.0f;
    const size_t half = (size_t)(d / 2);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t q = (size_t)blockIdx.x * blockDim.x + threadIdx.x; q < total; q += stride) {
        size_t rest = q / half, i = q - rest * half; // rest = row * nh + head
        size_t row = rest / (size_t)nh;              // b * s + si
        int si = (int)(row % (size_t)s);
        int p = pos ? pos[si] : pos_offset + si;
        size_t o = rest * (size_t)d + 2 * i;
        const float *f = freqs + ((size_t)p * half + i) * 2;
        float x0 = to_f32(x[o]), x1 = to_f32(x[o + 1]), y0, y1;
        if constexpr (INVERSE) tetra_rope_unrotate(&y0, &y1, x0, x1, f[0], f[1]);
        else tetra_rope_rotate(&y0, &y1, x0, x1, f[0], f[1]);
        y0 = store_f32_as(out + o, y0);
        y1 = store_f32_as(out + o + 1, y1);
        if (AMAX) m = nan_max(m, nan_max(fabsf(y0), fabsf(y1)));
    }
    if (AMAX) {
        m = block_nan_max(m, sh);
        amax_finish<1>(&amax, part, done, &m, sh, &last);
    }
}

template <typename T>
static void rope_launch(T *out, const T *x, const float *freqs, const int32_t *pos, int pos_offset, int b, int s,
                        int nh, int d, int inverse) {
    if (b <= 0 || s <= 0 || nh <= 0 || d < 2) return;
    size_t total = (size_t)b * (size_t)s * (size_t)nh * (size_t)(d / 2);
    unsigned nb = tetra_blocks(total, TETRA_THREADS);
    if (inverse)
        rope_kernel<true, T><<<nb, TETRA_THREADS, 0, cuda_stream()>>>(out, x, freqs, pos, pos_offset, s, nh, d, total);
    else
        rope_kernel<false, T><<<nb, TETRA_THREADS, 0, cuda_stream()>>>(out, x, freqs, pos, pos_offset, s, nh, d, total);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_rope_forward(float *out, const float *x, const float *freqs, const int32_t *pos, int pos_offset,
                                  int b, int s, int nh, int d) {
    rope_launch(out, x, freqs, pos, pos_offset, b, s, nh, d, 0);
}

extern "C" void cuda_rope_backward(float *dx, const float *dout, const float *freqs, const int32_t *pos, int pos_offset,
                                   int b, int s, int nh, int d) {
    rope_launch(dx, dout, freqs, pos, pos_offset, b, s, nh, d, 1);
}

extern "C" void cuda_rope_forward_bf16(uint16_t *out, const uint16_t *x, const float *freqs, const int32_t *pos,
                                       int pos_offset, int b, int s, int nh, int d) {
    rope_launch(out, x, freqs, pos, pos_offset, b, s, nh, d, 0);
}

// with the amax of dx: at most TETRA_AMAX_MAX_BLOCKS blocks; empty: one block writes 0
extern "C" void cuda_rope_backward_bf16(uint16_t *dx, float *amax, const uint16_t *dout, const float *freqs,
                                        const int32_t *pos, int pos_offset, int b, int s, int nh, int d) {
    if (!amax) {
        rope_launch(dx, dout, freqs, pos, pos_offset, b, s, nh, d, 1);
        return;
    }
    const int empty = b <= 0 || s <= 0 || nh <= 0 || d < 2;
    const size_t total = empty ? 0 : (size_t)b * (size_t)s * (size_t)nh * (size_t)(d / 2);
    unsigned nb = tetra_blocks(total, TETRA_THREADS);
    if (nb > TETRA_AMAX_MAX_BLOCKS) nb = TETRA_AMAX_MAX_BLOCKS;
    rope_kernel<true, uint16_t, 1>
        <<<nb, TETRA_THREADS, 0, cuda_stream()>>>(dx, dout, freqs, pos, pos_offset, empty ? 1 : s, empty ? 1 : nh,
                                                  empty ? 2 : d, total, amax, cuda_amax_part(), cuda_amax_counter());
    CUDA_CHECK_LAUNCH();
}

// ----------------------------------------------------------------------------
// SwiGLU

// With AMAX, the block maxima of what was stored go to amax_finish (amax[0]; backward:
// da into amax[0], dg into amax[1]).
template <typename T, int AMAX>
__global__ void swiglu_fwd_kernel(T *out, float *amax, float *part, unsigned *done, const T *a, const T *g, size_t n) {
    __shared__ float sh[32];
    __shared__ int last;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    float m = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = store_f32_as(out + i, tetra_silu(to_f32(a[i])) * to_f32(g[i]));
        if (AMAX) m = nan_max(m, fabsf(v));
    }
    if (AMAX) {
        m = block_nan_max(m, sh);
        amax_finish<1>(&amax, part, done, &m, sh, &last);
    }
}

template <typename T, int AMAX>
__global__ void swiglu_bwd_kernel(T *da, T *dg, float *amax_da, float *amax_dg, float *part, unsigned *done,
                                  const T *dout, const T *a, const T *g, size_t n) {
    __shared__ float sh[32];
    __shared__ int last;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    float m[2] = {0.0f, 0.0f};
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float ai = to_f32(a[i]), gi = to_f32(g[i]), d = to_f32(dout[i]);
        float dai = d * gi * tetra_dsilu(ai);
        float dgi = d * tetra_silu(ai);
        dai = store_f32_as(da + i, dai); // both inputs read before either write: in place is safe
        dgi = store_f32_as(dg + i, dgi);
        if (AMAX) {
            m[0] = nan_max(m[0], fabsf(dai));
            m[1] = nan_max(m[1], fabsf(dgi));
        }
    }
    if (AMAX) {
        m[0] = block_nan_max(m[0], sh);
        m[1] = block_nan_max(m[1], sh);
        float *outs[2] = {amax_da, amax_dg};
        amax_finish<2>(outs, part, done, m, sh, &last);
    }
}

static unsigned amax_blocks(size_t n) {
    const unsigned b = tetra_blocks(n, TETRA_THREADS);
    return b < TETRA_AMAX_MAX_BLOCKS ? b : TETRA_AMAX_MAX_BLOCKS;
}

template <typename T> static void swiglu_forward(T *out, float *amax, const T *a, const T *g, size_t n) {
    if (amax) {
        swiglu_fwd_kernel<T, 1><<<amax_blocks(n), TETRA_THREADS, 0, cuda_stream()>>>(out, amax, cuda_amax_part(),
                                                                                     cuda_amax_counter(), a, g, n);
    } else {
        if (!n) return;
        swiglu_fwd_kernel<T, 0>
            <<<tetra_blocks(n, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(out, NULL, NULL, NULL, a, g, n);
    }
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void swiglu_backward(T *da, T *dg, float *amax_da, float *amax_dg, const T *dout, const T *a, const T *g,
                            size_t n) {
    if (amax_da || amax_dg) {
        swiglu_bwd_kernel<T, 1><<<amax_blocks(n), TETRA_THREADS, 0, cuda_stream()>>>(
            da, dg, amax_da, amax_dg, cuda_amax_part(), cuda_amax_counter(), dout, a, g, n);
    } else {
        if (!n) return;
        swiglu_bwd_kernel<T, 0><<<tetra_blocks(n, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(
            da, dg, NULL, NULL, NULL, NULL, dout, a, g, n);
    }
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_swiglu_forward(float *out, const float *a, const float *g, size_t n) {
    swiglu_forward(out, (float *)NULL, a, g, n);
}

extern "C" void cuda_swiglu_backward(float *da, float *dg, const float *dout, const float *a, const float *g,
                                     size_t n) {
    swiglu_backward(da, dg, (float *)NULL, (float *)NULL, dout, a, g, n);
}

extern "C" void cuda_swiglu_forward_bf16(uint16_t *out, float *amax, const uint16_t *a, const uint16_t *g, size_t n) {
    swiglu_forward(out, amax, a, g, n);
}

extern "C" void cuda_swiglu_backward_bf16(uint16_t *da, uint16_t *dg, float *amax_da, float *amax_dg,
                                          const uint16_t *dout, const uint16_t *a, const uint16_t *g, size_t n) {
    swiglu_backward(da, dg, amax_da, amax_dg, dout, a, g, n);
}

// ----------------------------------------------------------------------------
// cross-entropy: one block per row. Fused: one pass for the online max and sum of
// exponentials (per thread, then combined), one pass writing dlogits (in place allowed:
// every thread reads z[t] before the barrier that precedes the first write).

#define CE_THREADS 512

// dlogits in fp32 (T = float) or bf16 (T = uint16_t: the fp32 value rounded once, as the
// cast op would round it)
template <typename T>
__device__ __forceinline__ void ce_write_grad(T *d, const float *z, float m, float a, int t, float dloss_scale, int v) {
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float e = __fmul_rn(tetra_expf(z[j] - m), a);
        store_f32(d + j, j == t ? __fsub_rn(e, dloss_scale) : e);
    }
}

template <typename T> __device__ __forceinline__ void ce_zero_row(T *d, int v) {
    for (int j = threadIdx.x; j < v; j += blockDim.x) store_f32(d + j, 0.0f);
}

template <typename T>
__global__ void __launch_bounds__(CE_THREADS)
    ce_fused_kernel(T *dlogits, float *losses, const float *logits, const int32_t *targets, int v, float dloss_scale) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    const size_t row = blockIdx.x;
    const float *z = logits + row * (size_t)v;
    T *d = dlogits ? dlogits + row * (size_t)v : NULL;
    const int t = targets[row];
    if (!(t >= 0 && t < v)) { // ignored (or out of range): no loss, zero gradient
        if (threadIdx.x == 0) losses[row] = 0.0f;
        if (d) ce_zero_row(d, v);
        return;
    }
    float m = -INFINITY, s = 0.0f;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float zj = z[j];
        if (zj > m) {
            s = s * tetra_expf(m - zj) + 1.0f;
            m = zj;
        } else {
            s += tetra_expf(zj - m);
        }
    }
    const float M = block_max(m, shf);
    double part = m == -INFINITY ? 0.0 : (double)(s * tetra_expf(m - M));
    const double S = block_sum(part, shd);
    const float zt = z[t] - M;
    const float sf = (float)S;
    if (threadIdx.x == 0) losses[row] = logf(sf) - zt;
    if (!d) return;
    __syncthreads(); // z[t] read by all before any write (d may alias z)
    ce_write_grad(d, z, M, dloss_scale / sf, t, dloss_scale, v);
}

extern "C" void cuda_cross_entropy(float *dlogits, float *losses, const float *logits, const int32_t *targets, int n,
                                   int v, float dloss_scale) {
    if (n <= 0) return;
    ce_fused_kernel<float><<<n, CE_THREADS, 0, cuda_stream()>>>(dlogits, losses, logits, targets, v, dloss_scale);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_cross_entropy_bf16(uint16_t *dlogits, float *losses, const float *logits, const int32_t *targets,
                                        int n, int v, float dloss_scale) {
    if (n <= 0) return;
    ce_fused_kernel<uint16_t><<<n, CE_THREADS, 0, cuda_stream()>>>(dlogits, losses, logits, targets, v, dloss_scale);
    CUDA_CHECK_LAUNCH();
}

__global__ void __launch_bounds__(CE_THREADS) ce_max_kernel(float *row_max, const float *logits, int v) {
    __shared__ float sh[32];
    const float *z = logits + (size_t)blockIdx.x * (size_t)v;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < v; j += blockDim.x) m = z[j] > m ? z[j] : m;
    m = block_max(m, sh);
    if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

__global__ void __launch_bounds__(CE_THREADS)
    ce_sums_kernel(float *sum_exp, float *target_logit, const float *logits, const float *row_max,
                   const int32_t *targets, int v_local, int v_start) {
    __shared__ double sh[32];
    const size_t row = blockIdx.x;
    const float *z = logits + row * (size_t)v_local;
    const float m = row_max[row];
    float s = 0.0f;
    for (int j = threadIdx.x; j < v_local; j += blockDim.x) s += tetra_expf(z[j] - m);
    double S = block_sum((double)s, sh);
    if (threadIdx.x == 0) {
        int t = targets[row] - v_start;
        sum_exp[row] = (float)S;
        target_logit[row] = (t >= 0 && t < v_local) ? z[t] - m : 0.0f; // ignored targets are < 0
    }
}

__global__ void __launch_bounds__(CE_THREADS)
    ce_finish_kernel(float *dlogits, float *losses, const float *logits, const float *row_max, const float *sum_exp,
                     const float *target_logit, const int32_t *targets, int v_local, int v_start, float dloss_scale) {
    const size_t row = blockIdx.x;
    const int valid = targets[row] >= 0; // the sharded ops cannot see V; negatives are ignored
    const float s = sum_exp[row];
    if (threadIdx.x == 0) losses[row] = valid ? logf(s) - target_logit[row] : 0.0f;
    if (!dlogits) return;
    float *d = dlogits + row * (size_t)v_local;
    if (!valid) {
        ce_zero_row(d, v_local);
        return;
    }
    int t = targets[row] - v_start;
    if (!(t >= 0 && t < v_local)) t = -1; // the -1 belongs to another shard
    ce_write_grad(d, logits + row * (size_t)v_local, row_max[row], dloss_scale / s, t, dloss_scale, v_local);
}

extern "C" void cuda_ce_shard_max(float *row_max, const float *logits, int n, int v_local) {
    if (n <= 0) return;
    ce_max_kernel<<<n, CE_THREADS, 0, cuda_stream()>>>(row_max, logits, v_local);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_ce_shard_sums(float *sum_exp, float *target_logit, const float *logits, const float *row_max,
                                   const int32_t *targets, int n, int v_local, int v_start) {
    if (n <= 0) return;
    ce_sums_kernel<<<n, CE_THREADS, 0, cuda_stream()>>>(sum_exp, target_logit, logits, row_max, targets, v_local,
                                                        v_start);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_ce_shard_finish(float *dlogits, float *losses, const float *logits, const float *row_max,
                                     const float *sum_exp, const float *target_logit, const int32_t *targets, int n,
                                     int v_local, int v_start, float dloss_scale) {
    if (n <= 0) return;
    ce_finish_kernel<<<n, CE_THREADS, 0, cuda_stream()>>>(dlogits, losses, logits, row_max, sum_exp, target_logit,
                                                          targets, v_local, v_start, dloss_scale);
    CUDA_CHECK_LAUNCH();
}
