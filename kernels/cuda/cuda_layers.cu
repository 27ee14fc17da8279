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
// RMSNorm: one block per row. vec (a row of whole 16-byte vectors, every operand aligned):
// each thread takes N elements a step with 16-byte loads and stores, its share of the
// row's sum accumulated over them in order; otherwise one element a step.

// Block b takes rows b, b + gridDim.x, ... (one row each when launched with a block per
// row). With AMAX (at most TETRA_AMAX_MAX_BLOCKS blocks) the maximum of what it stored
// goes to amax_finish.
template <typename T, int AMAX>
__global__ void __launch_bounds__(TETRA_THREADS)
    rmsnorm_fwd_kernel(T *out, float *rstd, float *amax, float *part, unsigned *done, const T *x, const T *w, int n,
                       int c, float eps, int vec) {
    __shared__ float sh[32];
    __shared__ int last;
    constexpr int N = vec16<T>::N;
    float m = 0.0f;
    for (int row = blockIdx.x; row < n; row += gridDim.x) {
        const size_t o = (size_t)row * (size_t)c;
        float ss = 0.0f;
        if (vec) {
            for (int j = threadIdx.x * N; j < c; j += blockDim.x * N) {
                const vec16<T> xv = load16(x + o + j);
#pragma unroll
                for (int k = 0; k < N; k++) ss = fmaf(to_f32(xv.e[k]), to_f32(xv.e[k]), ss);
            }
        } else {
            for (int j = threadIdx.x; j < c; j += blockDim.x) {
                float v = to_f32(x[o + j]);
                ss = fmaf(v, v, ss);
            }
        }
        ss = block_sum(ss, sh);
        float r = tetra_rms_rstd(ss, c, eps);
        if (vec) {
            for (int j = threadIdx.x * N; j < c; j += blockDim.x * N) {
                const vec16<T> xv = load16(x + o + j), wv = load16(w + j);
                vec16<T> ov;
#pragma unroll
                for (int k = 0; k < N; k++) {
                    const float v = store_f32_as(&ov.e[k], (to_f32(xv.e[k]) * r) * to_f32(wv.e[k]));
                    if (AMAX) m = nan_max(m, fabsf(v));
                }
                store16(out + o + j, ov);
            }
        } else {
            for (int j = threadIdx.x; j < c; j += blockDim.x) {
                const float v = store_f32_as(out + o + j, (to_f32(x[o + j]) * r) * to_f32(w[j]));
                if (AMAX) m = nan_max(m, fabsf(v));
            }
        }
        if (threadIdx.x == 0) rstd[row] = r;
    }
    if (AMAX) {
        m = block_nan_max(m, sh);
        amax_finish<1>(&amax, part, done, &m, sh, &last);
    }
}

// dx = dres + d/dx, summed in fp32 (for bf16 dx: read, add, round once). Rows and AMAX as
// rmsnorm_fwd_kernel's: each row's sums are the same whichever block takes it.
template <typename T, int AMAX>
__global__ void __launch_bounds__(TETRA_THREADS)
    rmsnorm_bwd_input_kernel(T *dx, float *amax, float *part, unsigned *done, const T *dout, const T *x, const T *w,
                             const float *rstd, int n, int c, const T *dres, int vec) {
    __shared__ float sh[32];
    __shared__ int last;
    constexpr int N = vec16<T>::N;
    float m = 0.0f;
    for (int row = blockIdx.x; row < n; row += gridDim.x) {
        const size_t o = (size_t)row * (size_t)c;
        float dot = 0.0f;
        if (vec) {
            for (int j = threadIdx.x * N; j < c; j += blockDim.x * N) {
                const vec16<T> wv = load16(w + j), dv = load16(dout + o + j), xv = load16(x + o + j);
#pragma unroll
                for (int k = 0; k < N; k++) dot += (to_f32(wv.e[k]) * to_f32(dv.e[k])) * to_f32(xv.e[k]);
            }
        } else {
            for (int j = threadIdx.x; j < c; j += blockDim.x)
                dot += (to_f32(w[j]) * to_f32(dout[o + j])) * to_f32(x[o + j]);
        }
        dot = block_sum(dot, sh);
        const float r = rstd[row], dot_c = dot / (float)c;
        if (vec) {
            for (int j = threadIdx.x * N; j < c; j += blockDim.x * N) {
                const vec16<T> wv = load16(w + j), dv = load16(dout + o + j), xv = load16(x + o + j),
                               rv = load16(dres + o + j);
                vec16<T> out;
#pragma unroll
                for (int k = 0; k < N; k++) {
                    const float v = store_f32_as(
                        &out.e[k],
                        to_f32(rv.e[k]) + tetra_rms_dx(to_f32(xv.e[k]), to_f32(wv.e[k]), to_f32(dv.e[k]), r, dot_c));
                    if (AMAX) m = nan_max(m, fabsf(v));
                }
                store16(dx + o + j, out);
            }
        } else {
            for (int j = threadIdx.x; j < c; j += blockDim.x) {
                const float v = store_f32_as(
                    dx + o + j,
                    to_f32(dres[o + j]) + tetra_rms_dx(to_f32(x[o + j]), to_f32(w[j]), to_f32(dout[o + j]), r, dot_c));
                if (AMAX) m = nan_max(m, fabsf(v));
            }
        }
    }
    if (AMAX) {
        m = block_nan_max(m, sh);
        amax_finish<1>(&amax, part, done, &m, sh, &last);
    }
}

// whole vectors per row and every operand on 16 bytes (rows then stay aligned)
template <typename T>
static int rms_vec(int c, const void *a, const void *b, const void *d, const void *e = NULL, const void *f = NULL) {
    return c % vec16<T>::N == 0 && tetra_aligned16(a) && tetra_aligned16(b) && tetra_aligned16(d) &&
        (!e || tetra_aligned16(e)) && (!f || tetra_aligned16(f));
}

template <typename T>
static void rmsnorm_forward(T *out, float *rstd, float *amax, const T *x, const T *w, int n, int c, float eps) {
    if (amax) {
        const int rows = n > 0 && c > 0 ? n : 0; /* none: one block writes 0 */
        const unsigned grid = rows < 1 ? 1u : rows < TETRA_AMAX_MAX_BLOCKS ? (unsigned)rows : TETRA_AMAX_MAX_BLOCKS;
        rmsnorm_fwd_kernel<T, 1><<<grid, TETRA_THREADS, 0, cuda_stream()>>>(
            out, rstd, amax, cuda_amax_part(), cuda_amax_counter(), x, w, rows, c, eps, rms_vec<T>(c, out, x, w));
        CUDA_CHECK_LAUNCH();
        return;
    }
    if (n <= 0 || c <= 0) return;
    rmsnorm_fwd_kernel<T, 0><<<n, TETRA_THREADS, 0, cuda_stream()>>>(out, rstd, NULL, NULL, NULL, x, w, n, c, eps,
                                                                     rms_vec<T>(c, out, x, w));
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void rmsnorm_backward_input(T *dx, float *amax, const T *dout, const T *x, const T *w, const float *rstd, int n,
                                   int c, const T *dres) {
    const T *r = dres ? dres : dx;
    if (amax) {
        const int rows = n > 0 && c > 0 ? n : 0; /* none: one block writes 0 */
        const unsigned grid = rows < 1 ? 1u : rows < TETRA_AMAX_MAX_BLOCKS ? (unsigned)rows : TETRA_AMAX_MAX_BLOCKS;
        rmsnorm_bwd_input_kernel<T, 1>
            <<<grid, TETRA_THREADS, 0, cuda_stream()>>>(dx, amax, cuda_amax_part(), cuda_amax_counter(), dout, x, w,
                                                        rstd, rows, c, r, rms_vec<T>(c, dx, dout, x, w, r));
        CUDA_CHECK_LAUNCH();
        return;
    }
    if (n <= 0 || c <= 0) return;
    rmsnorm_bwd_input_kernel<T, 0><<<n, TETRA_THREADS, 0, cuda_stream()>>>(dx, NULL, NULL, NULL, dout, x, w, rstd, n, c,
                                                                           r, rms_vec<T>(c, dx, dout, x, w, r));
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
    rmsnorm_backward_input(dx, (float *)NULL, dout, x, w, rstd, n, c, dres);
}

extern "C" void cuda_rmsnorm_backward_input_bf16(uint16_t *dx, float *amax, const uint16_t *dout, const uint16_t *x,
                                                 const uint16_t *w, const float *rstd, int n, int c,
                                                 const uint16_t *dres) {
    rmsnorm_backward_input(dx, amax, dout, x, w, rstd, n, c, dres);
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

__global__ void rmsnorm_dw_final_kernel(float *dw, const double *partial, int chunks, int c, int accumulate) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= c) return;
    double s = 0.0;
    for (int k = 0; k < chunks; k++) s += partial[(size_t)k * (size_t)c + col];
    if (accumulate) dw[col] += (float)s;
    else dw[col] = (float)s;
}

template <typename T>
static void rmsnorm_backward_weight(float *dw, const T *dout, const T *x, const float *rstd, int n, int c,
                                    int accumulate) {
    if (c <= 0) return;
    if (n <= 0) { /* no rows: an overwrite still writes the empty sum */
        if (!accumulate) {
            rmsnorm_dw_final_kernel<<<(c + TETRA_THREADS - 1) / TETRA_THREADS, TETRA_THREADS, 0, cuda_stream()>>>(
                dw, (const double *)NULL, 0, c, 0);
            CUDA_CHECK_LAUNCH();
        }
        return;
    }
    int rpc = rms_rows_per_chunk(n);
    int chunks = (n + rpc - 1) / rpc;
    double *partial = (double *)cuda_scratch(SCRATCH_RMS_DW, (size_t)chunks * (size_t)c * sizeof(double));
    dim3 grid((unsigned)((c + 31) / 32), (unsigned)chunks);
    cudaStream_t st = cuda_stream();
    rmsnorm_dw_partial_kernel<T><<<grid, 256, 0, st>>>(partial, dout, x, rstd, n, c, rpc);
    CUDA_CHECK_LAUNCH();
    rmsnorm_dw_final_kernel<<<(c + TETRA_THREADS - 1) / TETRA_THREADS, TETRA_THREADS, 0, st>>>(dw, partial, chunks, c,
                                                                                               accumulate);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_rmsnorm_backward_weight(float *dw, const float *dout, const float *x, const float *rstd, int n,
                                             int c, int accumulate) {
    rmsnorm_backward_weight(dw, dout, x, rstd, n, c, accumulate);
}

extern "C" void cuda_rmsnorm_backward_weight_bf16(float *dw, const uint16_t *dout, const uint16_t *x, const float *rstd,
                                                  int n, int c, int accumulate) {
    rmsnorm_backward_weight(dw, dout, x, rstd, n, c, accumulate);
}

// ----------------------------------------------------------------------------
// RoPE: a block per row (grid-stride over rows), its threads over the row's (head, pair)
// units, so the index path divides 32-bit numbers only. With 16-byte aligned x, out and
// freqs and whole vectors per head, a thread takes N / 2 pairs in one 16-byte load and
// store (bf16: 4 pairs; fp32: 2); otherwise one pair. Each pair reads both values before
// writing (in place ok), with the same per-element math either way.

template <bool INVERSE>
__device__ __forceinline__ void rope_pair(float *y0, float *y1, float x0, float x1, float c, float s) {
    if constexpr (INVERSE) tetra_rope_unrotate(y0, y1, x0, x1, c, s);
    else tetra_rope_rotate(y0, y1, x0, x1, c, s);
}

template <bool INVERSE, typename T, int AMAX = 0>
__global__ void rope_kernel(T *out, const T *x, const float *freqs, const int32_t *pos, int pos_offset, int rows, int s,
                            int nh, int d, int out_ld, int x_ld, int vec, float *amax = NULL, float *part = NULL,
                            unsigned *done = NULL) {
    __shared__ float sh[AMAX ? 32 : 1];
    __shared__ int last;
    constexpr int P = vec16<T>::N / 2; // pairs per 16 bytes
    float m = 0.0f;
    const int half = d / 2, step = vec ? P : 1, units = nh * (half / step), per_head = half / step;
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
        const int si = row % s;
        const int p = pos ? pos[si] : pos_offset + si;
        const float *f = freqs + (size_t)p * (size_t)half * 2;
        const size_t xbase = (size_t)row * (size_t)x_ld, obase = (size_t)row * (size_t)out_ld;
        for (int u = threadIdx.x; u < units; u += blockDim.x) {
            const int head = u / per_head, i = (u - head * per_head) * step; // the unit's first pair
            const size_t e = (size_t)head * (size_t)d + 2 * (size_t)i, xo = xbase + e, o = obase + e;
            if (vec) {
                const vec16<T> xv = load16(x + xo);
                vec16<T> yv;
                float fc[2 * P];
#pragma unroll
                for (int k = 0; k < 2 * P; k += 4) {
                    const float4 f4 = *(const float4 *)(f + 2 * i + k);
                    fc[k] = f4.x, fc[k + 1] = f4.y, fc[k + 2] = f4.z, fc[k + 3] = f4.w;
                }
#pragma unroll
                for (int k = 0; k < P; k++) {
                    float y0, y1;
                    rope_pair<INVERSE>(&y0, &y1, to_f32(xv.e[2 * k]), to_f32(xv.e[2 * k + 1]), fc[2 * k],
                                       fc[2 * k + 1]);
                    y0 = store_f32_as(&yv.e[2 * k], y0);
                    y1 = store_f32_as(&yv.e[2 * k + 1], y1);
                    if (AMAX) m = nan_max(m, nan_max(fabsf(y0), fabsf(y1)));
                }
                store16(out + o, yv);
            } else {
                float y0, y1;
                rope_pair<INVERSE>(&y0, &y1, to_f32(x[xo]), to_f32(x[xo + 1]), f[2 * i], f[2 * i + 1]);
                y0 = store_f32_as(out + o, y0);
                y1 = store_f32_as(out + o + 1, y1);
                if (AMAX) m = nan_max(m, nan_max(fabsf(y0), fabsf(y1)));
            }
        }
    }
    if (AMAX) {
        m = block_nan_max(m, sh);
        amax_finish<1>(&amax, part, done, &m, sh, &last);
    }
}

// The 16-byte path: whole vectors per head (d a multiple of N, so every head starts on
// a vector, and each unit's N floats of freqs on 16 bytes), aligned bases and rows that
// start on 16 bytes (row pitches multiples of N).
template <typename T> static int rope_vec(const T *out, const T *x, const float *freqs, int d, int out_ld, int x_ld) {
    constexpr int N = vec16<T>::N;
    return d % N == 0 && out_ld % N == 0 && x_ld % N == 0 && tetra_aligned16(out) && tetra_aligned16(x) &&
        tetra_aligned16(freqs);
}

static unsigned row_blocks(int rows, unsigned cap) {
    return rows < 1 ? 1u : (unsigned)rows < cap ? (unsigned)rows : cap;
}

template <typename T>
static void rope_launch(T *out, const T *x, const float *freqs, const int32_t *pos, int pos_offset, int b, int s,
                        int nh, int d, int out_ld, int x_ld, int inverse) {
    if (b <= 0 || s <= 0 || nh <= 0 || d < 2) return;
    const int rows = b * s, vec = rope_vec(out, x, freqs, d, out_ld, x_ld);
    const unsigned nb = row_blocks(rows, TETRA_MAX_BLOCKS);
    if (inverse)
        rope_kernel<true, T><<<nb, TETRA_THREADS, 0, cuda_stream()>>>(out, x, freqs, pos, pos_offset, rows, s, nh, d,
                                                                      out_ld, x_ld, vec);
    else
        rope_kernel<false, T><<<nb, TETRA_THREADS, 0, cuda_stream()>>>(out, x, freqs, pos, pos_offset, rows, s, nh, d,
                                                                       out_ld, x_ld, vec);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_rope_forward(float *out, const float *x, const float *freqs, const int32_t *pos, int pos_offset,
                                  int b, int s, int nh, int d, int out_ld, int x_ld) {
    rope_launch(out, x, freqs, pos, pos_offset, b, s, nh, d, out_ld, x_ld, 0);
}

extern "C" void cuda_rope_backward(float *dx, const float *dout, const float *freqs, const int32_t *pos, int pos_offset,
                                   int b, int s, int nh, int d, int dx_ld, int dout_ld) {
    rope_launch(dx, dout, freqs, pos, pos_offset, b, s, nh, d, dx_ld, dout_ld, 1);
}

extern "C" void cuda_rope_forward_bf16(uint16_t *out, const uint16_t *x, const float *freqs, const int32_t *pos,
                                       int pos_offset, int b, int s, int nh, int d, int out_ld, int x_ld) {
    rope_launch(out, x, freqs, pos, pos_offset, b, s, nh, d, out_ld, x_ld, 0);
}

// with the amax of dx (a dx of its own, as the CPU's): at most TETRA_AMAX_MAX_BLOCKS
// blocks; empty: one block writes 0
extern "C" void cuda_rope_backward_bf16(uint16_t *dx, float *amax, const uint16_t *dout, const float *freqs,
                                        const int32_t *pos, int pos_offset, int b, int s, int nh, int d, int dx_ld,
                                        int dout_ld) {
    if (!amax) {
        rope_launch(dx, dout, freqs, pos, pos_offset, b, s, nh, d, dx_ld, dout_ld, 1);
        return;
    }
    if (dx_ld != nh * d) {
        fprintf(stderr, "rope_backward_bf16: an amax needs a dx of its own (dx_ld %d, nh*d %d)\n", dx_ld, nh * d);
        abort();
    }
    const int empty = b <= 0 || s <= 0 || nh <= 0 || d < 2, rows = empty ? 0 : b * s;
    rope_kernel<true, uint16_t, 1><<<row_blocks(rows, TETRA_AMAX_MAX_BLOCKS), TETRA_THREADS, 0, cuda_stream()>>>(
        dx, dout, freqs, pos, pos_offset, rows, empty ? 1 : s, empty ? 1 : nh, empty ? 2 : d, empty ? 2 : dx_ld,
        empty ? 2 : dout_ld, !empty && rope_vec(dx, dout, freqs, d, dx_ld, dout_ld), amax, cuda_amax_part(),
        cuda_amax_counter());
    CUDA_CHECK_LAUNCH();
}

// ----------------------------------------------------------------------------
// SwiGLU: elementwise, with 16-byte loads and stores when every operand is 16-byte aligned
// (N elements a step, the remainder one at a time); the same per-element math either way.

// With AMAX, the block maxima of what was stored go to amax_finish (amax[0]; backward:
// da into amax[0], dg into amax[1]).
template <typename T> __device__ __forceinline__ float swiglu_fwd_one(T *out, T a, T g) {
    return store_f32_as(out, tetra_silu(to_f32(a)) * to_f32(g));
}

template <typename T, int AMAX>
__global__ void swiglu_fwd_kernel(T *out, float *amax, float *part, unsigned *done, const T *a, const T *g, size_t n,
                                  int vec) {
    __shared__ float sh[32];
    __shared__ int last;
    constexpr int N = vec16<T>::N;
    const size_t stride = (size_t)gridDim.x * blockDim.x, t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    float m = 0.0f;
    size_t head = 0;
    if (vec) {
        const size_t nv = n / N;
        for (size_t i = t; i < nv; i += stride) {
            const vec16<T> av = load16(a + i * N), gv = load16(g + i * N);
            vec16<T> ov;
#pragma unroll
            for (int k = 0; k < N; k++) {
                const float v = swiglu_fwd_one(&ov.e[k], av.e[k], gv.e[k]);
                if (AMAX) m = nan_max(m, fabsf(v));
            }
            store16(out + i * N, ov);
        }
        head = nv * N;
    }
    for (size_t i = head + t; i < n; i += stride) {
        const float v = swiglu_fwd_one(out + i, a[i], g[i]);
        if (AMAX) m = nan_max(m, fabsf(v));
    }
    if (AMAX) {
        m = block_nan_max(m, sh);
        amax_finish<1>(&amax, part, done, &m, sh, &last);
    }
}

// da = dout g dsilu(a), dg = dout silu(a), stored; m[] takes their magnitudes
template <typename T, int AMAX>
__device__ __forceinline__ void swiglu_bwd_one(T *da, T *dg, float *m, T dout, T a, T g) {
    const float ai = to_f32(a), gi = to_f32(g), d = to_f32(dout);
    const float dai = store_f32_as(da, d * gi * tetra_dsilu(ai));
    const float dgi = store_f32_as(dg, d * tetra_silu(ai));
    if (AMAX) {
        m[0] = nan_max(m[0], fabsf(dai));
        m[1] = nan_max(m[1], fabsf(dgi));
    }
}

template <typename T, int AMAX>
__global__ void swiglu_bwd_kernel(T *da, T *dg, float *amax_da, float *amax_dg, float *part, unsigned *done,
                                  const T *dout, const T *a, const T *g, size_t n, int vec) {
    __shared__ float sh[32];
    __shared__ int last;
    constexpr int N = vec16<T>::N;
    const size_t stride = (size_t)gridDim.x * blockDim.x, t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    float m[2] = {0.0f, 0.0f};
    size_t head = 0;
    if (vec) { // every input read before either output is written: in place is safe
        const size_t nv = n / N;
        for (size_t i = t; i < nv; i += stride) {
            const vec16<T> dv = load16(dout + i * N), av = load16(a + i * N), gv = load16(g + i * N);
            vec16<T> dav, dgv;
#pragma unroll
            for (int k = 0; k < N; k++) swiglu_bwd_one<T, AMAX>(&dav.e[k], &dgv.e[k], m, dv.e[k], av.e[k], gv.e[k]);
            store16(da + i * N, dav);
            store16(dg + i * N, dgv);
        }
        head = nv * N;
    }
    for (size_t i = head + t; i < n; i += stride) swiglu_bwd_one<T, AMAX>(da + i, dg + i, m, dout[i], a[i], g[i]);
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

// threads needed: one per 16 bytes on the vector path
template <typename T> static size_t swiglu_work(size_t n, int vec) {
    return vec ? (n + vec16<T>::N - 1) / vec16<T>::N : n;
}

template <typename T> static void swiglu_forward(T *out, float *amax, const T *a, const T *g, size_t n) {
    const int vec = tetra_aligned16(out) && tetra_aligned16(a) && tetra_aligned16(g);
    const size_t w = swiglu_work<T>(n, vec);
    if (amax) {
        swiglu_fwd_kernel<T, 1><<<amax_blocks(w), TETRA_THREADS, 0, cuda_stream()>>>(out, amax, cuda_amax_part(),
                                                                                     cuda_amax_counter(), a, g, n, vec);
    } else {
        if (!n) return;
        swiglu_fwd_kernel<T, 0>
            <<<tetra_blocks(w, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(out, NULL, NULL, NULL, a, g, n, vec);
    }
    CUDA_CHECK_LAUNCH();
}

template <typename T>
static void swiglu_backward(T *da, T *dg, float *amax_da, float *amax_dg, const T *dout, const T *a, const T *g,
                            size_t n) {
    const int vec =
        tetra_aligned16(da) && tetra_aligned16(dg) && tetra_aligned16(dout) && tetra_aligned16(a) && tetra_aligned16(g);
    const size_t w = swiglu_work<T>(n, vec);
    if (amax_da || amax_dg) {
        swiglu_bwd_kernel<T, 1><<<amax_blocks(w), TETRA_THREADS, 0, cuda_stream()>>>(
            da, dg, amax_da, amax_dg, cuda_amax_part(), cuda_amax_counter(), dout, a, g, n, vec);
    } else {
        if (!n) return;
        swiglu_bwd_kernel<T, 0><<<tetra_blocks(w, TETRA_THREADS), TETRA_THREADS, 0, cuda_stream()>>>(
            da, dg, NULL, NULL, NULL, NULL, dout, a, g, n, vec);
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
// cast op would round it); logits Z the same (bf16 widened exactly)
template <typename T, typename Z>
__device__ __forceinline__ void ce_write_grad(T *d, const Z *z, float m, float a, int t, float dloss_scale, int v) {
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float e = __fmul_rn(tetra_expf(to_f32(z[j]) - m), a);
        store_f32(d + j, j == t ? __fsub_rn(e, dloss_scale) : e);
    }
}

template <typename T> __device__ __forceinline__ void ce_zero_row(T *d, int v) {
    for (int j = threadIdx.x; j < v; j += blockDim.x) store_f32(d + j, 0.0f);
}

template <typename T, typename Z>
__global__ void __launch_bounds__(CE_THREADS)
    ce_fused_kernel(T *dlogits, float *losses, const Z *logits, const int32_t *targets, int v, float dloss_scale) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    const size_t row = blockIdx.x;
    const Z *z = logits + row * (size_t)v;
    T *d = dlogits ? dlogits + row * (size_t)v : NULL;
    const int t = targets[row];
    if (!(t >= 0 && t < v)) { // ignored (or out of range): no loss, zero gradient
        if (threadIdx.x == 0) losses[row] = 0.0f;
        if (d) ce_zero_row(d, v);
        return;
    }
    float m = -INFINITY, s = 0.0f;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float zj = to_f32(z[j]);
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
    const float zt = to_f32(z[t]) - M;
    const float sf = (float)S;
    if (threadIdx.x == 0) losses[row] = logf(sf) - zt;
    if (!d) return;
    __syncthreads(); // z[t] read by all before any write (d may alias z)
    ce_write_grad(d, z, M, dloss_scale / sf, t, dloss_scale, v);
}

extern "C" void cuda_cross_entropy(float *dlogits, float *losses, const float *logits, const int32_t *targets, int n,
                                   int v, float dloss_scale) {
    if (n <= 0) return;
    ce_fused_kernel<float, float>
        <<<n, CE_THREADS, 0, cuda_stream()>>>(dlogits, losses, logits, targets, v, dloss_scale);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_cross_entropy_bf16(uint16_t *dlogits, float *losses, const uint16_t *logits,
                                        const int32_t *targets, int n, int v, float dloss_scale) {
    if (n <= 0) return;
    ce_fused_kernel<uint16_t, uint16_t>
        <<<n, CE_THREADS, 0, cuda_stream()>>>(dlogits, losses, logits, targets, v, dloss_scale);
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
