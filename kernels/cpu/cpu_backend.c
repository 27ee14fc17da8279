// kernels/cpu/cpu_backend.c — the CPU op table, plus the simple ops: memory and its
// accounting, fills, elementwise arithmetic, deterministic reductions, casts and AdamW.
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops_math.h"

// ----------------------------------------------------------------------------
// memory. Every block carries a 64-byte header in front of it (its size and a tag), so
// release can keep allocated_bytes exact without a side table and the returned pointer
// keeps the 64-byte alignment. Per-call temporaries inside the ops (attention tiles,
// widened GEMM operands) use the C heap directly: they are not backend buffers and must
// keep working after memory_freeze.

#define CPU_HDR 64
#define CPU_HDR_TAG 0x7465747261686470ull // marks a live block from cpu_alloc

typedef struct {
    size_t bytes;
    uint64_t tag;
} cpu_block_hdr;

static atomic_size_t mem_count = 0; // successful cpu_alloc calls
static atomic_size_t mem_bytes = 0; // bytes currently held through cpu_alloc
static atomic_int mem_frozen = 0;

void *cpu_alloc(size_t bytes) {
    if (atomic_load_explicit(&mem_frozen, memory_order_relaxed)) {
        // after start-up every buffer must already exist: a late allocation is a bug
        fprintf(stderr,
                "cpu: allocation of %zu bytes requested after start-up (memory is frozen once training "
                "starts)\n",
                bytes);
        return NULL;
    }
    if (bytes > SIZE_MAX - CPU_HDR) return NULL;
    void *base = NULL;
    // 64-byte alignment: whole cache lines and aligned AVX-512 loads
    if (posix_memalign(&base, 64, CPU_HDR + (bytes ? bytes : 64)) != 0) return NULL;
    cpu_block_hdr *h = (cpu_block_hdr *)base;
    h->bytes = bytes;
    h->tag = CPU_HDR_TAG;
    atomic_fetch_add_explicit(&mem_count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&mem_bytes, bytes, memory_order_relaxed);
    return (char *)base + CPU_HDR;
}

void cpu_release(void *p) {
    if (!p) return;
    cpu_block_hdr *h = (cpu_block_hdr *)((char *)p - CPU_HDR);
    if (h->tag != CPU_HDR_TAG) {
        // not from cpu_alloc (or released twice): freeing it would corrupt the heap
        fprintf(stderr, "cpu: release of %p, which cpu_alloc did not return or was already released\n", p);
        abort();
    }
    h->tag = 0;
    atomic_fetch_sub_explicit(&mem_bytes, h->bytes, memory_order_relaxed);
    free(h);
}

size_t cpu_alloc_count(void) { return atomic_load_explicit(&mem_count, memory_order_relaxed); }

// The CPU backend keeps no scratch of its own between calls, so this is exactly the
// bytes held through cpu_alloc.
size_t cpu_allocated_bytes(void) { return atomic_load_explicit(&mem_bytes, memory_order_relaxed); }

void cpu_memory_freeze(int frozen) { atomic_store_explicit(&mem_frozen, frozen ? 1 : 0, memory_order_relaxed); }

void cpu_device_memory(size_t *free_bytes, size_t *total_bytes) {
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
}

void *cpu_compute_stream(void) { return NULL; }
/* every CPU op is deterministic already (fixed reduction orders, any thread count) */
void cpu_set_deterministic(int on) { (void)on; }

// Large copies are split across the threads (the model copies activations and
// gradients of a whole microbatch; a serial memcpy would leave the other threads idle).
void cpu_copy(void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return;
    const size_t piece = (size_t)CPU_CHUNK * sizeof(float);
    int64_t np = (int64_t)((bytes + piece - 1) / piece);
#pragma omp parallel for schedule(static) if (np > 8 && !omp_in_parallel())
    for (int64_t i = 0; i < np; i++) {
        size_t lo = (size_t)i * piece, len = bytes - lo < piece ? bytes - lo : piece;
        memcpy((char *)dst + lo, (const char *)src + lo, len);
    }
}

void cpu_synchronize(void) {}
static uint64_t cpu_host_waits(void) { return 0; }

// Host memory is already what MPI moves; staging buffers are plain heap blocks.
static void *cpu_host_alloc(size_t bytes) {
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}
static void cpu_host_release(void *p) { free(p); }

// Rows split across the threads when there are many (a vocabulary-parallel logits
// gather moves one short row per token).
void cpu_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows) {
    if (!width || !rows) return;
    const int64_t nr = (int64_t)rows;
#pragma omp parallel for schedule(static) if (nr * (int64_t)width > (int64_t)CPU_CHUNK * 32 && !omp_in_parallel())
    for (int64_t r = 0; r < nr; r++)
        memcpy((char *)dst + (size_t)r * dpitch, (const char *)src + (size_t)r * spitch, width);
}

// ----------------------------------------------------------------------------
// elementwise. Each op splits [0, n) into CPU_CHUNK pieces; the piece kernels are
// CPU_SIMD so they run with the widest vectors the machine has.

#define CHUNKS(n) (((int64_t)(n) + CPU_CHUNK - 1) / CPU_CHUNK)
#define CHUNK_LO(c) ((size_t)((c)*CPU_CHUNK))
#define CHUNK_HI(c, n) ((size_t)(((c) + 1) * CPU_CHUNK) < (n) ? (size_t)(((c) + 1) * CPU_CHUNK) : (n))

CPU_SIMD static void fill_k(float *x, float value, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = value;
}
CPU_SIMD static void scale_k(float *x, float alpha, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] *= alpha;
}
CPU_SIMD static void axpy_k(float *restrict y, const float *restrict x, float alpha, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += alpha * x[i];
}
CPU_SIMD static void add_k(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_fill(float *x, float value, size_t n) {
    int64_t nc = CHUNKS(n);
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) fill_k(x + CHUNK_LO(c), value, CHUNK_HI(c, n) - CHUNK_LO(c));
}

void cpu_scale(float *x, float alpha, size_t n) {
    int64_t nc = CHUNKS(n);
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) scale_k(x + CHUNK_LO(c), alpha, CHUNK_HI(c, n) - CHUNK_LO(c));
}

void cpu_axpy(float *y, const float *x, float alpha, size_t n) {
    int64_t nc = CHUNKS(n);
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) axpy_k(y + CHUNK_LO(c), x + CHUNK_LO(c), alpha, CHUNK_HI(c, n) - CHUNK_LO(c));
}

void cpu_add(float *out, const float *a, const float *b, size_t n) {
    int64_t nc = CHUNKS(n);
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) {
        size_t lo = CHUNK_LO(c);
        add_k(out + lo, a + lo, b + lo, CHUNK_HI(c, n) - lo);
    }
}

// ----------------------------------------------------------------------------
// reductions: per-chunk partials in double, summed in chunk order, so the result does
// not depend on the number of threads.

CPU_SIMD static double sumsq_k(const float *x, size_t n) {
    double acc = 0.0;
#pragma omp simd reduction(+ : acc)
    for (size_t i = 0; i < n; i++) acc += (double)x[i] * (double)x[i];
    return acc;
}
CPU_SIMD static double sum_k(const float *x, size_t n) {
    double acc = 0.0;
#pragma omp simd reduction(+ : acc)
    for (size_t i = 0; i < n; i++) acc += (double)x[i];
    return acc;
}
// max |x| with NaN propagation (once m is NaN no comparison replaces it)
static float amax_k(const float *x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > m || a != a) m = a;
        if (m != m) break;
    }
    return m;
}

typedef double (*reduce_fn)(const float *, size_t);

static double chunked_sum(reduce_fn fn, const float *x, size_t n) {
    int64_t nc = CHUNKS(n);
    if (nc <= 1) return n ? fn(x, n) : 0.0;
    double stack[64];
    double *part = nc <= 64 ? stack : (double *)malloc((size_t)nc * sizeof(double));
    if (!part) abort();
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nc; c++) part[c] = fn(x + CHUNK_LO(c), CHUNK_HI(c, n) - CHUNK_LO(c));
    double acc = 0.0;
    for (int64_t c = 0; c < nc; c++) acc += part[c];
    if (part != stack) free(part);
    return acc;
}

void cpu_sum_squares(float *out, const float *x, size_t n) {
    out[0] = (float)((double)out[0] + chunked_sum(sumsq_k, x, n));
}

void cpu_sum(float *out, const float *x, size_t n) { out[0] = (float)chunked_sum(sum_k, x, n); }

void cpu_amax(float *out, const float *x, size_t n) {
    int64_t nc = CHUNKS(n);
    float m = 0.0f;
#pragma omp parallel for schedule(static) reduction(max : m) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) {
        float a = amax_k(x + CHUNK_LO(c), CHUNK_HI(c, n) - CHUNK_LO(c));
        // the max reduction drops NaN; carry it as +inf in m and fix up below
        m = (a != a) ? INFINITY : (a > m ? a : m);
    }
    if (m == INFINITY) m = amax_k(x, n); // rare: inf or NaN present, recompute exactly
    out[0] = m;
}

void cpu_amax_rows(float *out, const float *x, int rows, int cols) {
#pragma omp parallel for schedule(static) if ((int64_t)rows * cols > CPU_CHUNK)
    for (int r = 0; r < rows; r++) out[r] = amax_k(x + (size_t)r * cols, (size_t)cols);
}

// bf16 x, widened exactly on the fly: the same values amax_k sees in x's fp32 copy
static float amax_bf16_k(const uint16_t *x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(tetra_bf16_to_f32(x[i]));
        if (a > m || a != a) m = a;
        if (m != m) break;
    }
    return m;
}

void cpu_amax_bf16(float *out, const uint16_t *x, size_t n) {
    int64_t nc = CHUNKS(n);
    float m = 0.0f;
#pragma omp parallel for schedule(static) reduction(max : m) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) {
        float a = amax_bf16_k(x + CHUNK_LO(c), CHUNK_HI(c, n) - CHUNK_LO(c));
        m = (a != a) ? INFINITY : (a > m ? a : m);
    }
    if (m == INFINITY) m = amax_bf16_k(x, n);
    out[0] = m;
}

void cpu_amax_rows_bf16(float *out, const uint16_t *x, int rows, int cols) {
#pragma omp parallel for schedule(static) if ((int64_t)rows * cols > CPU_CHUNK)
    for (int r = 0; r < rows; r++) out[r] = amax_bf16_k(x + (size_t)r * cols, (size_t)cols);
}

static inline float load_f32(const void *x, tetra_dtype xt, size_t i) {
    return xt == TETRA_BF16 ? tetra_bf16_to_f32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

// Blocks of 256 columns in parallel, each sweeping every row in order, so a column keeps
// its first NaN as amax_k over the column would.
void cpu_amax_cols(float *out, const void *x, tetra_dtype xt, int rows, int cols) {
    const int nb = (cols + 255) / 256;
#pragma omp parallel for schedule(static) if ((int64_t)rows * cols > CPU_CHUNK)
    for (int b = 0; b < nb; b++) {
        const int c0 = b * 256, c1 = c0 + 256 < cols ? c0 + 256 : cols;
        for (int c = c0; c < c1; c++) out[c] = 0.0f;
        for (int r = 0; r < rows; r++) {
            for (int c = c0; c < c1; c++) {
                const float a = fabsf(load_f32(x, xt, (size_t)r * (size_t)cols + (size_t)c)), m = out[c];
                if (m == m && (a > m || a != a)) out[c] = a;
            }
        }
    }
}

// ----------------------------------------------------------------------------
// transpose. A naive loop strides one side by a whole row per element; 32 x 32 tiles
// (4 KiB in, 4 KiB out) keep both sides' cache lines resident while a tile is copied.

#define CPU_TRANSPOSE_TILE 32

// One tile and the whole transpose, for an element type T (fp32 values, fp8 codes). Left
// as written by the formatter, which would join the pragma's line to the loop's.
// clang-format off
#define CPU_TRANSPOSE(NAME, T)                                                                                         \
    static void NAME##_tile(T *restrict out, const T *restrict x, int rows, int cols, int r0, int c0) {                \
        int r1 = r0 + CPU_TRANSPOSE_TILE < rows ? r0 + CPU_TRANSPOSE_TILE : rows;                                      \
        int c1 = c0 + CPU_TRANSPOSE_TILE < cols ? c0 + CPU_TRANSPOSE_TILE : cols;                                      \
        for (int c = c0; c < c1; c++) {                                                                                \
            T *o = out + (size_t)c * (size_t)rows;                                                                     \
            for (int r = r0; r < r1; r++) o[r] = x[(size_t)r * (size_t)cols + c];                                      \
        }                                                                                                              \
    }                                                                                                                  \
    void NAME(T *out, const T *x, int rows, int cols) {                                                                \
        if (rows <= 0 || cols <= 0) return;                                                                            \
        int tr = (rows + CPU_TRANSPOSE_TILE - 1) / CPU_TRANSPOSE_TILE;                                                 \
        int tc = (cols + CPU_TRANSPOSE_TILE - 1) / CPU_TRANSPOSE_TILE;                                                 \
        int64_t tiles = (int64_t)tr * tc;                                                                              \
        /* one flat loop over the tiles so thin shapes (one tile row) still split over threads */                      \
        _Pragma("omp parallel for schedule(static) if ((int64_t)rows * cols > CPU_CHUNK)")                            \
        for (int64_t t = 0; t < tiles; t++)                                                                            \
            NAME##_tile(out, x, rows, cols, (int)(t / tc) * CPU_TRANSPOSE_TILE, (int)(t % tc) * CPU_TRANSPOSE_TILE);   \
    }

// clang-format on

CPU_TRANSPOSE(cpu_transpose, float)
CPU_TRANSPOSE(cpu_transpose_u8, uint8_t)

// ----------------------------------------------------------------------------
// casts

CPU_SIMD static void to_bf16_k(uint16_t *out, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = tetra_f32_to_bf16(x[i]);
}
CPU_SIMD static void from_bf16_k(float *out, const uint16_t *x, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = tetra_bf16_to_f32(x[i]);
}
CPU_SIMD static void to_e4m3_k(uint8_t *out, const float *x, float scale, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = tetra_quant_e4m3(x[i], scale);
}
CPU_SIMD static void to_e5m2_k(uint8_t *out, const float *x, float scale, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = tetra_quant_e5m2(x[i], scale);
}

CPU_SIMD static void bf16_to_e4m3_k(uint8_t *out, const uint16_t *x, float scale, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = tetra_quant_e4m3(tetra_bf16_to_f32(x[i]), scale);
}
CPU_SIMD static void bf16_to_e5m2_k(uint8_t *out, const uint16_t *x, float scale, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = tetra_quant_e5m2(tetra_bf16_to_f32(x[i]), scale);
}

void cpu_cast_f32_to_bf16(uint16_t *out, const float *x, size_t n) {
    int64_t nc = CHUNKS(n);
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) to_bf16_k(out + CHUNK_LO(c), x + CHUNK_LO(c), CHUNK_HI(c, n) - CHUNK_LO(c));
}

void cpu_cast_bf16_to_f32(float *out, const uint16_t *x, size_t n) {
    int64_t nc = CHUNKS(n);
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) from_bf16_k(out + CHUNK_LO(c), x + CHUNK_LO(c), CHUNK_HI(c, n) - CHUNK_LO(c));
}

// rows of x (fp32 or bf16, xt) to fp8, each with its scale (or the one scale)
static void cast_rows_to_fp8(uint8_t *out, const void *x, tetra_dtype xt, const float *scale, int rowwise, int rows,
                             int cols, tetra_dtype fmt) {
#pragma omp parallel for schedule(static) if ((int64_t)rows * cols > CPU_CHUNK)
    for (int r = 0; r < rows; r++) {
        float s = scale ? scale[rowwise ? r : 0] : 1.0f;
        size_t o = (size_t)r * (size_t)cols;
        if (xt == TETRA_BF16) {
            const uint16_t *xr = (const uint16_t *)x + o;
            if (fmt == TETRA_FP8_E5M2) bf16_to_e5m2_k(out + o, xr, s, (size_t)cols);
            else bf16_to_e4m3_k(out + o, xr, s, (size_t)cols);
        } else {
            const float *xr = (const float *)x + o;
            if (fmt == TETRA_FP8_E5M2) to_e5m2_k(out + o, xr, s, (size_t)cols);
            else to_e4m3_k(out + o, xr, s, (size_t)cols);
        }
    }
}

void cpu_cast_f32_to_fp8(uint8_t *out, const float *x, const float *scale, int rowwise, int rows, int cols,
                         tetra_dtype fmt) {
    cast_rows_to_fp8(out, x, TETRA_F32, scale, rowwise, rows, cols, fmt);
}

void cpu_cast_bf16_to_fp8(uint8_t *out, const uint16_t *x, const float *scale, int rowwise, int rows, int cols,
                          tetra_dtype fmt) {
    cast_rows_to_fp8(out, x, TETRA_BF16, scale, rowwise, rows, cols, fmt);
}

// out[c, r] = fp8(x[r, c] * scale[c]) (per_col) or * scale[0], through tiles of x
static void cast_transpose_tiles(uint8_t *out, const void *x, tetra_dtype xt, const float *scale, int per_col, int rows,
                                 int cols, tetra_dtype fmt) {
    if (rows <= 0 || cols <= 0) return;
    const int tr = (rows + CPU_TRANSPOSE_TILE - 1) / CPU_TRANSPOSE_TILE;
    const int tc = (cols + CPU_TRANSPOSE_TILE - 1) / CPU_TRANSPOSE_TILE;
    const int64_t tiles = (int64_t)tr * tc;
#pragma omp parallel for schedule(static) if ((int64_t)rows * cols > CPU_CHUNK)
    for (int64_t t = 0; t < tiles; t++) {
        const int r0 = (int)(t / tc) * CPU_TRANSPOSE_TILE, c0 = (int)(t % tc) * CPU_TRANSPOSE_TILE;
        const int r1 = r0 + CPU_TRANSPOSE_TILE < rows ? r0 + CPU_TRANSPOSE_TILE : rows;
        const int c1 = c0 + CPU_TRANSPOSE_TILE < cols ? c0 + CPU_TRANSPOSE_TILE : cols;
        for (int c = c0; c < c1; c++) {
            uint8_t *o = out + (size_t)c * (size_t)rows;
            const float s = scale[per_col ? c : 0];
            for (int r = r0; r < r1; r++) {
                const float v = load_f32(x, xt, (size_t)r * (size_t)cols + (size_t)c);
                o[r] = fmt == TETRA_FP8_E5M2 ? tetra_quant_e5m2(v, s) : tetra_quant_e4m3(v, s);
            }
        }
    }
}

void cpu_cast_transpose_to_fp8(uint8_t *out, const void *x, tetra_dtype xt, const float *scale, int rows, int cols,
                               tetra_dtype fmt) {
    cast_transpose_tiles(out, x, xt, scale, 1, rows, cols, fmt);
}

// The cast of cast_rows_to_fp8 and the tiles of cpu_cast_transpose_to_fp8, with the one
// scale fp8_scale_from_amax would give.
void cpu_fp8_quantize(uint8_t *out, uint8_t *out_t, float *inv_scale, const void *x, tetra_dtype xt, const float *amax,
                      int rows, int cols, tetra_dtype fmt) {
    const float s = tetra_fp8_scale(amax[0], fmt == TETRA_FP8_E5M2 ? OPS_FP8_E5M2_MAX : OPS_FP8_E4M3_MAX, 0);
    if (inv_scale) inv_scale[0] = 1.0f / s;
    if (rows <= 0 || cols <= 0) return;
    if (out) cast_rows_to_fp8(out, x, xt, &s, 0, rows, cols, fmt);
    if (out_t) cast_transpose_tiles(out_t, x, xt, &s, 0, rows, cols, fmt);
}

// decode(q) * inv_scale into fp32, or rounded to bf16 (the bits of the fp32 value's cast)
static void fp8_to_rows(void *out, int bf16, const uint8_t *q, const float *inv_scale, int rowwise, int rows, int cols,
                        tetra_dtype fmt) {
#pragma omp parallel for schedule(static) if ((int64_t)rows * cols > CPU_CHUNK)
    for (int r = 0; r < rows; r++) {
        float s = inv_scale ? inv_scale[rowwise ? r : 0] : 1.0f;
        size_t o = (size_t)r * (size_t)cols;
        for (int j = 0; j < cols; j++) {
            float v = (fmt == TETRA_FP8_E5M2 ? tetra_e5m2_to_f32(q[o + j]) : tetra_e4m3_to_f32(q[o + j])) * s;
            if (bf16) ((uint16_t *)out)[o + j] = tetra_f32_to_bf16(v);
            else ((float *)out)[o + j] = v;
        }
    }
}

void cpu_cast_fp8_to_f32(float *out, const uint8_t *q, const float *inv_scale, int rowwise, int rows, int cols,
                         tetra_dtype fmt) {
    fp8_to_rows(out, 0, q, inv_scale, rowwise, rows, cols, fmt);
}

void cpu_cast_fp8_to_bf16(uint16_t *out, const uint8_t *q, const float *inv_scale, int rowwise, int rows, int cols,
                          tetra_dtype fmt) {
    fp8_to_rows(out, 1, q, inv_scale, rowwise, rows, cols, fmt);
}

void cpu_fp8_scale_from_amax(float *scale, float *inv_scale, const float *amax, int n, int broadcast, float fp8_max,
                             int pow2) {
    for (int i = 0; i < n; i++) {
        float s = tetra_fp8_scale(amax[broadcast ? 0 : i], fp8_max, pow2);
        scale[i] = s;
        // a plain fp32 division (no reciprocal estimate): the CUDA kernel does the same,
        // so the dequant factors match bit for bit
        if (inv_scale) inv_scale[i] = 1.0f / s;
    }
}

// ----------------------------------------------------------------------------
// AdamW

CPU_SIMD_EXACT static void adamw_k(float *restrict p, float *restrict m, float *restrict v, const float *restrict g,
                                   size_t n, tetra_adamw_coef k) {
    for (size_t i = 0; i < n; i++) tetra_adamw_update(p + i, m + i, v + i, g[i], &k);
}

void cpu_adamw_step(float *param, float *m, float *v, const float *grad, size_t n, double lr, double beta1,
                    double beta2, double eps, double weight_decay, int step, float grad_scale,
                    const ops_optim_state *dev) {
    if (dev && dev->skip) return;
    tetra_adamw_coef k = dev ? dev->k : tetra_adamw_coefficients(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
    int64_t nc = CHUNKS(n);
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) {
        size_t lo = CHUNK_LO(c);
        adamw_k(param + lo, m + lo, v + lo, grad + lo, CHUNK_HI(c, n) - lo, k);
    }
}

// AdamW on fp32 master weights, then the bf16 compute copy (ops.h adamw_step_bf16)
static void cpu_adamw_step_bf16(float *param, uint16_t *param_bf16, float *m, float *v, const float *grad, size_t n,
                                double lr, double beta1, double beta2, double eps, double weight_decay, int step,
                                float grad_scale, const ops_optim_state *dev) {
    if (dev && dev->skip) return;
    cpu_adamw_step(param, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale, dev);
    cpu_cast_f32_to_bf16(param_bf16, param, n);
}

// AdamW, then each stretch's max |w| of the compute copy (ops.h adamw_step_amax): a second
// read of the stretch, which the CPU's caches mostly serve
static void cpu_adamw_step_amax(float *param, uint16_t *param_bf16, float *m, float *v, const float *grad, size_t n,
                                double lr, double beta1, double beta2, double eps, double weight_decay, int step,
                                float grad_scale, const ops_optim_state *dev, const ops_amax_segments *seg) {
    if (param_bf16)
        cpu_adamw_step_bf16(param, param_bf16, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale,
                            dev);
    else cpu_adamw_step(param, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale, dev);
    for (int s = 0; seg && s < seg->n; s++) {
        const size_t off = (size_t)seg->off[s], len = (size_t)seg->len[s];
        if (!len) seg->amax[s] = 0.0f;
        else if (param_bf16) cpu_amax_bf16(seg->amax + s, param_bf16 + off, len);
        else cpu_amax(seg->amax + s, param + off, len);
    }
}

// The optimizer's scalars (ops.h ops_optim_state): the same arithmetic as the CUDA
// kernels, on one core.
static void cpu_grad_sq_to_f64(double *out, const float *sq, int n, const float *loss, int n_loss) {
    double l = 0.0;
    for (int k = 0; k < n_loss; k++) l += (double)loss[k];
    for (int i = 0; i < n; i++) out[i] = (double)sq[i];
    if (n > 0 && !isfinite(l)) out[0] = NAN;
}

static void cpu_sum_f64(double *out, const double *in, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += in[i];
    *out = s;
}

static void cpu_optim_scalars(ops_optim_state *s, const ops_optim_args *a) { tetra_optim_scalars(s, a, NULL); }

// ----------------------------------------------------------------------------
// the table

static const tetra_ops cpu_table = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .release = cpu_release,
    .copy_h2d = cpu_copy,
    .copy_h2d_async = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy = cpu_copy,
    .synchronize = cpu_synchronize,
    .fill = cpu_fill,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .add = cpu_add,
    .sum_squares = cpu_sum_squares,
    .sum = cpu_sum,
    .amax = cpu_amax,
    .amax_rows = cpu_amax_rows,
    .transpose = cpu_transpose,
    .cast_f32_to_bf16 = cpu_cast_f32_to_bf16,
    .cast_bf16_to_f32 = cpu_cast_bf16_to_f32,
    .cast_f32_to_fp8 = cpu_cast_f32_to_fp8,
    .cast_fp8_to_f32 = cpu_cast_fp8_to_f32,
    .cast_fp8_to_bf16 = cpu_cast_fp8_to_bf16,
    .transpose_u8 = cpu_transpose_u8,
    .cast_bf16_to_fp8 = cpu_cast_bf16_to_fp8,
    .amax_bf16 = cpu_amax_bf16,
    .amax_rows_bf16 = cpu_amax_rows_bf16,
    .amax_cols = cpu_amax_cols,
    .cast_transpose_to_fp8 = cpu_cast_transpose_to_fp8,
    .fp8_scale_from_amax = cpu_fp8_scale_from_amax,
    .fp8_quantize = cpu_fp8_quantize,
    .gemm = cpu_gemm,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward_input = cpu_rmsnorm_backward_input,
    .rmsnorm_backward_weight = cpu_rmsnorm_backward_weight,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .attention_workspace_size = cpu_attention_workspace_size,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_merge = cpu_attention_merge,
    .cross_entropy = cpu_cross_entropy,
    .cross_entropy_bf16 = cpu_cross_entropy_bf16,
    .ce_shard_max = cpu_ce_shard_max,
    .ce_shard_sums = cpu_ce_shard_sums,
    .ce_shard_finish = cpu_ce_shard_finish,
    .adamw_step = cpu_adamw_step,
    .adamw_step_bf16 = cpu_adamw_step_bf16,
    .grad_sq_to_f64 = cpu_grad_sq_to_f64,
    .sum_f64 = cpu_sum_f64,
    .optim_scalars = cpu_optim_scalars,
    .host_waits = cpu_host_waits,
    .adamw_step_amax = cpu_adamw_step_amax,
    .embedding_forward_bf16 = cpu_embedding_forward_bf16,
    .embedding_backward_bf16 = cpu_embedding_backward_bf16,
    .rmsnorm_forward_bf16 = cpu_rmsnorm_forward_bf16,
    .rmsnorm_backward_input_bf16 = cpu_rmsnorm_backward_input_bf16,
    .rmsnorm_backward_weight_bf16 = cpu_rmsnorm_backward_weight_bf16,
    .rope_forward_bf16 = cpu_rope_forward_bf16,
    .rope_backward_bf16 = cpu_rope_backward_bf16,
    .swiglu_forward_bf16 = cpu_swiglu_forward_bf16,
    .swiglu_backward_bf16 = cpu_swiglu_backward_bf16,
    .attention_workspace_size_bf16 = cpu_attention_workspace_size_bf16,
    .attention_forward_bf16 = cpu_attention_forward_bf16,
    .attention_backward_bf16 = cpu_attention_backward_bf16,
    .alloc_count = cpu_alloc_count,
    .allocated_bytes = cpu_allocated_bytes,
    .memory_freeze = cpu_memory_freeze,
    .device_memory = cpu_device_memory,
    .compute_stream = cpu_compute_stream,
    .set_deterministic = cpu_set_deterministic,
    .host_memory = 1,
    .host_alloc = cpu_host_alloc,
    .host_release = cpu_host_release,
    .copy_2d = cpu_copy_2d,
};

const tetra_ops *ops_cpu(void) {
    cpu_blas_init();
    return &cpu_table;
}
