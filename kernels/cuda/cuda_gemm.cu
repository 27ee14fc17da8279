// kernels/cuda/cuda_gemm.cu — every matmul of the CUDA backend, through cuBLASLt.
//
// Row-major C[m,n] = op(A) op(B) is the column-major C^T[n,m] = op(B)^T op(A)^T, so the
// row-major descriptor (ops_gemm_desc) maps onto one cuBLASLt call with A and B swapped:
// cuBLASLt's A is our B (transposed iff trans_b), its B is our A (transposed iff
// trans_a), m' = n, n' = m, and the leading dimensions carry over unchanged.
//
// Paths (each one checked against the CPU backend by tests/gpu/test_ops_cuda.c):
// - f32:  fp32 operands, CUBLAS_COMPUTE_32F (no TF32: the tests' reference path).
// - bf16: bf16 operands (fp8 operands of a mixed or unsupported pair are widened to bf16,
//         which holds every e4m3/e5m2 value exactly), fp32 accumulation, C fp32 or bf16.
// - fp8:  both operands fp8 (not e5m2 x e5m2), m, n, k multiples of 16. Hopper runs fp8
//         only in the "TN" layout (both operands K-major), so an operand stored the
//         other way (dx = dy W, dW = dy^T x) is transposed into a scratch copy first.
//         Tensorwise scales go to cuBLASLt's A/B_SCALE_POINTER; rowwise scales use the
//         outer-vector scale mode where this cuBLASLt offers it for the device, else the
//         unscaled product goes to an fp32 scratch and an epilogue kernel applies them.
// - epilogue: any case with dequant scales that cuBLASLt cannot apply itself (scaled
//         fp32/bf16 operands, rowwise without outer-vector support) and fp32 operands
//         with a bf16 C: the unscaled product in fp32 scratch, then
//         C = alpha * sa[i] * sb[j] * acc + beta * C, as the CPU backend computes it.
//
// One cuBLASLt handle and one 32 MiB workspace per process (made at backend init), every
// matmul on the backend's compute stream; matmul descriptors,
// layouts and the heuristic's algorithm are cached per (types, transposes, sizes,
// leading dims, batch and strides, fast accumulation, scale mode, pointer alignment).
//
// The path decisions are kernels/ops_paths.h's predicates, which kernels/op_costs.c
// (opc_gemm: the launches, packs and bytes of each path, for `tetra plan --ops`) shares;
// the simulator checks the two launch the same: change both together.
#include <cublasLt.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops_math.h"
#include "kernels/ops_paths.h"

static inline void tetra_cublas_check(cublasStatus_t s, const char *what, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "[cuBLAS ERROR] %s:%d: %s: %s (%s)\n", file, line, what, cublasLtGetStatusString(s),
                cublasLtGetStatusName(s));
        abort();
    }
}
#define CUBLAS_CHECK(x) tetra_cublas_check((x), #x, __FILE__, __LINE__)

#define LT_WORKSPACE_BYTES ((size_t)32 << 20)
#define LT_CACHE_SIZE 256

static cublasLtHandle_t lt_handle;
static void *lt_workspace;
static const char *last_path = "none";

extern "C" const char *cuda_gemm_last_path(void) { return last_path; }

// called once by backend init (cuda_backend.cu), before any GEMM
void cuda_gemm_init(void) {
    if (lt_handle) return;
    CUBLAS_CHECK(cublasLtCreate(&lt_handle));
    lt_workspace = cuda_internal_alloc(LT_WORKSPACE_BYTES, "the cuBLASLt workspace");
}

// ----------------------------------------------------------------------------
// element types

template <int T> struct Elem;
template <> struct Elem<TETRA_F32> { typedef float type; };
template <> struct Elem<TETRA_BF16> { typedef uint16_t type; };
template <> struct Elem<TETRA_FP8_E4M3> { typedef uint8_t type; };
template <> struct Elem<TETRA_FP8_E5M2> { typedef uint8_t type; };

template <int T> __device__ __forceinline__ float decode(typename Elem<T>::type x);
template <> __device__ __forceinline__ float decode<TETRA_F32>(float x) { return x; }
template <> __device__ __forceinline__ float decode<TETRA_BF16>(uint16_t x) { return tetra_bf16_to_f32(x); }
template <> __device__ __forceinline__ float decode<TETRA_FP8_E4M3>(uint8_t x) { return tetra_e4m3_to_f32(x); }
template <> __device__ __forceinline__ float decode<TETRA_FP8_E5M2>(uint8_t x) { return tetra_e5m2_to_f32(x); }

template <int T> __device__ __forceinline__ typename Elem<T>::type encode(float x);
template <> __device__ __forceinline__ float encode<TETRA_F32>(float x) { return x; }
template <> __device__ __forceinline__ uint16_t encode<TETRA_BF16>(float x) { return tetra_f32_to_bf16(x); }

// same type: the raw bits (an fp8 transpose must not touch e5m2 inf or NaN payloads)
template <int IN, int OUT> __device__ __forceinline__ typename Elem<OUT>::type convert(typename Elem<IN>::type x) {
    if constexpr (IN == OUT) return x;
    else return encode<OUT>(decode<IN>(x));
}

static cudaDataType lt_type(tetra_dtype t) {
    switch (t) {
    case TETRA_F32: return CUDA_R_32F;
    case TETRA_BF16: return CUDA_R_16BF;
    case TETRA_F16: return CUDA_R_16F;
    case TETRA_FP8_E4M3: return CUDA_R_8F_E4M3;
    case TETRA_FP8_E5M2: return CUDA_R_8F_E5M2;
    default: break;
    }
    fprintf(stderr, "[tetra] cuda_gemm: unsupported operand type %s\n", tetra_dtype_name(t));
    abort();
}

// ----------------------------------------------------------------------------
// operand packing: src [rows, cols] (leading dim ld, batch stride sstride) -> dense dst,
// [cols, rows] when TRANS else [rows, cols], batch stride rows * cols; converting IN to
// OUT on the way. 32 x 32 tiles through shared memory keep both sides coalesced.

template <int IN, int OUT, bool TRANS>
__global__ void __launch_bounds__(256) pack_kernel(typename Elem<OUT>::type *dst, const typename Elem<IN>::type *src,
                                                   int rows, int cols, int64_t ld, int64_t sstride, int batch) {
    typedef typename Elem<OUT>::type TO;
    __shared__ TO tile[32][33];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5; // 32 x 8 threads
    const int tiles_r = (rows + 31) / 32, tiles_c = (cols + 31) / 32;
    const size_t dstride = (size_t)rows * (size_t)cols;
    for (int z = blockIdx.z; z < batch; z += gridDim.z) {
        const typename Elem<IN>::type *s = src + (size_t)z * (size_t)sstride;
        TO *d = dst + (size_t)z * dstride;
        for (int tr = blockIdx.y; tr < tiles_r; tr += gridDim.y) {
            for (int tc = blockIdx.x; tc < tiles_c; tc += gridDim.x) {
                const int r0 = tr * 32, c0 = tc * 32;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int r = r0 + ty + 8 * i, c = c0 + tx;
                    if (r < rows && c < cols) tile[ty + 8 * i][tx] = convert<IN, OUT>(s[(size_t)r * (size_t)ld + c]);
                }
                __syncthreads();
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if constexpr (TRANS) {
                        int c = c0 + ty + 8 * i, r = r0 + tx; // dst row c, column r
                        if (r < rows && c < cols) d[(size_t)c * (size_t)rows + r] = tile[tx][ty + 8 * i];
                    } else {
                        int r = r0 + ty + 8 * i, c = c0 + tx;
                        if (r < rows && c < cols) d[(size_t)r * (size_t)cols + c] = tile[ty + 8 * i][tx];
                    }
                }
                __syncthreads();
            }
        }
    }
}

template <int IN, int OUT>
static void pack_launch(void *dst, const void *src, int rows, int cols, int64_t ld, int64_t sstride, int batch,
                        int trans) {
    dim3 grid((unsigned)((cols + 31) / 32), (unsigned)((rows + 31) / 32), (unsigned)batch);
    if (grid.x > 65535u) grid.x = 65535u;
    if (grid.y > 65535u) grid.y = 65535u;
    if (grid.z > 65535u) grid.z = 65535u;
    typedef typename Elem<OUT>::type TO;
    typedef typename Elem<IN>::type TI;
    if (trans)
        pack_kernel<IN, OUT, true>
            <<<grid, 256, 0, cuda_stream()>>>((TO *)dst, (const TI *)src, rows, cols, ld, sstride, batch);
    else
        pack_kernel<IN, OUT, false>
            <<<grid, 256, 0, cuda_stream()>>>((TO *)dst, (const TI *)src, rows, cols, ld, sstride, batch);
    CUDA_CHECK_LAUNCH();
}

// Dispatch on (in, out) types. out == in means a raw copy (transpose / repack only).
static void pack(void *dst, tetra_dtype out, const void *src, tetra_dtype in, int rows, int cols, int64_t ld,
                 int64_t sstride, int batch, int trans) {
#define PACK_CASE(I, O)                                                                                                \
    if (in == I && out == O) {                                                                                         \
        pack_launch<I, O>(dst, src, rows, cols, ld, sstride, batch, trans);                                            \
        return;                                                                                                        \
    }
    PACK_CASE(TETRA_FP8_E4M3, TETRA_FP8_E4M3)
    PACK_CASE(TETRA_FP8_E5M2, TETRA_FP8_E5M2)
    PACK_CASE(TETRA_FP8_E4M3, TETRA_BF16)
    PACK_CASE(TETRA_FP8_E5M2, TETRA_BF16)
    PACK_CASE(TETRA_BF16, TETRA_BF16)
    PACK_CASE(TETRA_FP8_E4M3, TETRA_F32)
    PACK_CASE(TETRA_FP8_E5M2, TETRA_F32)
    PACK_CASE(TETRA_BF16, TETRA_F32)
    PACK_CASE(TETRA_F32, TETRA_F32)
#undef PACK_CASE
    fprintf(stderr, "[tetra] cuda_gemm: no conversion %s -> %s\n", tetra_dtype_name(in), tetra_dtype_name(out));
    abort();
}

// ----------------------------------------------------------------------------
// epilogue of the general path: C = alpha * sa * sb * acc + beta * cin (acc NULL: k = 0),
// acc dense [batch, m, n], cin C itself or the descriptor's c_in; the CPU backend's
// formula, operation for operation.

template <bool BF16_OUT>
__global__ void epilogue_kernel(void *c, const void *cin, const float *acc, int m, int n, int64_t ldc, int64_t stride_c,
                                int batch, float alpha, const float *sa, const float *sb, int rowwise, float beta) {
    const size_t mn = (size_t)m * (size_t)n, total = mn * (size_t)batch;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        size_t bi = idx / mn, rem = idx - bi * mn;
        int i = (int)(rem / (size_t)n), j = (int)(rem - (size_t)i * (size_t)n);
        float a_s = sa ? sa[rowwise ? i : 0] : 1.0f;
        float b_s = sb ? sb[rowwise ? j : 0] : 1.0f;
        float r = __fmul_rn(__fmul_rn(__fmul_rn(alpha, a_s), b_s), acc ? acc[idx] : 0.0f);
        size_t ci = (size_t)bi * (size_t)stride_c + (size_t)i * (size_t)ldc + (size_t)j;
        if constexpr (BF16_OUT) {
            if (beta != 0.0f) r = __fadd_rn(r, __fmul_rn(beta, tetra_bf16_to_f32(((const uint16_t *)cin)[ci])));
            ((uint16_t *)c)[ci] = tetra_f32_to_bf16(r);
        } else {
            ((float *)c)[ci] = beta != 0.0f ? __fadd_rn(r, __fmul_rn(beta, ((const float *)cin)[ci])) : r;
        }
    }
}

// ----------------------------------------------------------------------------
// cuBLASLt call with a cache of descriptors and heuristic results

enum { SCALE_NONE = 0, SCALE_TENSOR = 1, SCALE_OUTER = 2 };

// One column-major cuBLASLt product: D[m x n] = alpha * opa(A) opb(B) + beta * C, C and D
// of one layout (C is D unless the call names another input).
// Compared with memcmp: 64-bit fields first and an even count of ints, so no padding.
typedef struct {
    int64_t lda, ldb, ldc;
    int64_t sa, sb, sc; // batch strides (elements)
    int ta, tb, tc;     // cudaDataType
    int opa, opb;       // 1 = transposed
    int m, n, k;
    int batch;
    int fast_accum;
    int scale_mode;
    int align_a, align_b, align_c;
} lt_key;

typedef struct {
    lt_key key;
    int used;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    cublasStatus_t status; // CUBLAS_STATUS_SUCCESS, or why no algorithm exists
} lt_plan;

static lt_plan lt_cache[LT_CACHE_SIZE];
static int lt_next = 0;

// largest power of two (<= 256) dividing the address and, for batches, the stride in bytes
static int align_of(const void *p, int64_t stride_bytes, int batch) {
    uintptr_t u = (uintptr_t)p | 256u;
    if (batch > 1) u |= (uintptr_t)stride_bytes;
    return (int)(u & (~u + 1));
}

static size_t lt_elem_size(cudaDataType t) {
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    default: return 1;
    }
}

static void plan_release(lt_plan *p) {
    if (!p->used) return;
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->desc);
    p->used = 0;
}

static cublasLtMatrixLayout_t make_layout(cudaDataType t, int64_t rows, int64_t cols, int64_t ld, int batch,
                                          int64_t stride) {
    cublasLtMatrixLayout_t l;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, t, (uint64_t)rows, (uint64_t)cols, ld));
    if (batch > 1) {
        int32_t bc = batch;
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
        CUBLAS_CHECK(
            cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
    return l;
}

// as, bs: the first call's A and B scale pointers (device; ignored without a scale mode)
static lt_plan *plan_get(const lt_key *key, const void *as, const void *bs) {
    for (int i = 0; i < LT_CACHE_SIZE; i++)
        if (lt_cache[i].used && !memcmp(&lt_cache[i].key, key, sizeof *key)) return &lt_cache[i];
    lt_plan *p = &lt_cache[lt_next];
    lt_next = (lt_next + 1) % LT_CACHE_SIZE;
    plan_release(p);
    memset(p, 0, sizeof *p);
    p->key = *key;
    p->used = 1;

    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = key->opa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key->opb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (key->ta == (int)CUDA_R_8F_E4M3 || key->ta == (int)CUDA_R_8F_E5M2) {
        int8_t fa = (int8_t)(key->fast_accum ? 1 : 0);
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa));
    }
    if (key->scale_mode == SCALE_OUTER) {
        int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        cublasStatus_t s1 =
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode);
        cublasStatus_t s2 =
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
        if (s1 != CUBLAS_STATUS_SUCCESS || s2 != CUBLAS_STATUS_SUCCESS) {
            p->status = s1 != CUBLAS_STATUS_SUCCESS ? s1 : s2;
        }
    }
    if (key->scale_mode != SCALE_NONE && p->status == CUBLAS_STATUS_SUCCESS) {
        // the heuristic sees the scale vectors the call names, as a complete descriptor
        // (each call sets its own again before running: plans outlive their first call)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &as, sizeof as));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bs, sizeof bs));
    }
    p->la = make_layout((cudaDataType)key->ta, key->opa ? key->k : key->m, key->opa ? key->m : key->k, key->lda,
                        key->batch, key->sa);
    p->lb = make_layout((cudaDataType)key->tb, key->opb ? key->n : key->k, key->opb ? key->k : key->n, key->ldb,
                        key->batch, key->sb);
    p->lc = make_layout((cudaDataType)key->tc, key->m, key->n, key->ldc, key->batch, key->sc);
    if (p->status != CUBLAS_STATUS_SUCCESS) return p;

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = LT_WORKSPACE_BYTES;
    uint32_t al_a = (uint32_t)key->align_a, al_b = (uint32_t)key->align_b, al_c = (uint32_t)key->align_c;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t s =
        cublasLtMatmulAlgoGetHeuristic(lt_handle, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS) p->status = s;
    else if (found < 1 || res.state != CUBLAS_STATUS_SUCCESS) p->status = CUBLAS_STATUS_NOT_SUPPORTED;
    else p->algo = res.algo;
    return p;
}

typedef struct {
    lt_key key;
    const void *a, *b;
    void *c;
    const void *cin;                // beta's C when it is not c, or NULL
    const float *a_scale, *b_scale; // device, for SCALE_TENSOR / SCALE_OUTER
    float alpha, beta;
} lt_call;

// Runs the product; returns a non-success status (and runs nothing) when cuBLASLt has
// no algorithm for this configuration or refuses it, so the caller can take another path.
static cublasStatus_t lt_matmul(lt_call *c) {
    cudaStream_t stream = cuda_stream(); // initialises the backend (and cuBLASLt) on first use
    lt_key *k = &c->key;
    k->align_a = align_of(c->a, k->sa * (int64_t)lt_elem_size((cudaDataType)k->ta), k->batch);
    k->align_b = align_of(c->b, k->sb * (int64_t)lt_elem_size((cudaDataType)k->tb), k->batch);
    k->align_c = align_of(c->c, k->sc * (int64_t)lt_elem_size((cudaDataType)k->tc), k->batch);
    if (c->cin) { // the algorithm's C alignment holds for both
        const int ai = align_of(c->cin, k->sc * (int64_t)lt_elem_size((cudaDataType)k->tc), k->batch);
        if (ai < k->align_c) k->align_c = ai;
    }
    const int scaled = k->scale_mode != SCALE_NONE;
    const void *as = !scaled ? NULL : c->a_scale ? (const void *)c->a_scale : (const void *)cuda_one();
    const void *bs = !scaled ? NULL : c->b_scale ? (const void *)c->b_scale : (const void *)cuda_one();
    lt_plan *p = plan_get(k, as, bs);
    if (p->status != CUBLAS_STATUS_SUCCESS) return p->status;
    if (scaled) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &as, sizeof as));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bs, sizeof bs));
    }
    cublasStatus_t s =
        cublasLtMatmul(lt_handle, p->desc, &c->alpha, c->a, p->la, c->b, p->lb, &c->beta, c->cin ? c->cin : c->c, p->lc,
                       c->c, p->lc, &p->algo, lt_workspace, LT_WORKSPACE_BYTES, stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
        p->status = s; // refused before running: remember, and let the caller take another path
        return s;
    }
    CUBLAS_CHECK(s);
    return CUBLAS_STATUS_SUCCESS;
}

// lt_matmul; where cuBLASLt refuses a batched product (a batch that broadcasts an operand
// with stride 0, say), its items one at a time, the same products. The items share one
// configuration but for their addresses' alignment, so all of them run or the first is
// refused before anything is written.
static cublasStatus_t lt_matmul_batch(lt_call *c) {
    cublasStatus_t s = lt_matmul(c);
    if (s == CUBLAS_STATUS_SUCCESS || c->key.batch <= 1) return s;
    const lt_key k = c->key;
    const size_t ea = lt_elem_size((cudaDataType)k.ta), eb = lt_elem_size((cudaDataType)k.tb);
    const size_t ec = lt_elem_size((cudaDataType)k.tc);
    for (int i = 0; i < k.batch; i++) {
        lt_call one = *c;
        one.key.batch = 1;
        one.key.sa = one.key.sb = one.key.sc = 0;
        one.a = (const char *)c->a + (size_t)i * (size_t)k.sa * ea;
        one.b = (const char *)c->b + (size_t)i * (size_t)k.sb * eb;
        one.c = (char *)c->c + (size_t)i * (size_t)k.sc * ec;
        if (c->cin) one.cin = (const char *)c->cin + (size_t)i * (size_t)k.sc * ec;
        if ((s = lt_matmul(&one)) != CUBLAS_STATUS_SUCCESS) return s;
    }
    return CUBLAS_STATUS_SUCCESS;
}

// ----------------------------------------------------------------------------
// the entry point

// An operand in row-major terms: stored [rows, cols] with leading dim ld (rows x cols is
// [k, m] / [m, k] for A, [n, k] / [k, n] for B as ops.h states).
typedef struct {
    const void *p;
    tetra_dtype t;
    int trans;
    int64_t ld, stride;
} operand;

// Stored shape of A ([k, m] when transposed else [m, k]) and of B ([n, k] or [k, n]).
static void stored_shape(const ops_gemm_desc *g, int is_b, int trans, int *rows, int *cols) {
    if (!is_b) {
        *rows = trans ? g->k : g->m;
        *cols = trans ? g->m : g->k;
    } else {
        *rows = trans ? g->n : g->k;
        *cols = trans ? g->k : g->n;
    }
}

// Convert an operand to `to` (dense, same orientation) in a scratch slot.
static operand widen(const ops_gemm_desc *g, operand o, int is_b, tetra_dtype to, int slot, int batch) {
    int rows, cols;
    stored_shape(g, is_b, o.trans, &rows, &cols);
    size_t per = (size_t)rows * (size_t)cols;
    void *dst = cuda_scratch(slot, per * (size_t)batch * tetra_dtype_size(to) + 256);
    pack(dst, to, o.p, o.t, rows, cols, o.ld, o.stride, batch, 0);
    operand r = {dst, to, o.trans, (int64_t)cols, (int64_t)per};
    return r;
}

// Make an fp8 operand K-major with a leading dim and batch stride that are multiples of
// 16 bytes: A as [m, k] (trans 0), B as [n, k] (trans 1), transposing or repacking into
// scratch when it is stored otherwise.
static operand kmajor(const ops_gemm_desc *g, operand o, int is_b, int slot, int batch) {
    int want_trans = is_b ? 1 : 0;
    int rows, cols;
    stored_shape(g, is_b, o.trans, &rows, &cols);
    if (ops_path_gemm_kmajor_ok(is_b, o.trans, o.ld, o.p, batch, o.stride)) return o;
    size_t per = (size_t)rows * (size_t)cols;
    void *dst = cuda_scratch(slot, per * (size_t)batch + 256);
    int transpose = o.trans != want_trans;
    pack(dst, o.t, o.p, o.t, rows, cols, o.ld, o.stride, batch, transpose);
    // K-major result: [m, k] or [n, k], leading dim k
    operand r = {dst, o.t, want_trans, (int64_t)g->k, (int64_t)per};
    return r;
}

static void run_epilogue(void *c, const float *acc, const ops_gemm_desc *g, int batch, const float *sa, const float *sb,
                         int rowwise) {
    size_t total = (size_t)g->m * (size_t)g->n * (size_t)batch;
    unsigned nb = tetra_blocks(total, TETRA_THREADS);
    cudaStream_t st = cuda_stream();
    const void *cin = g->c_in ? g->c_in : c;
    if (g->c_type == TETRA_BF16)
        epilogue_kernel<true><<<nb, TETRA_THREADS, 0, st>>>(c, cin, acc, g->m, g->n, g->ldc, g->stride_c, batch,
                                                            g->alpha, sa, sb, rowwise, g->beta);
    else
        epilogue_kernel<false><<<nb, TETRA_THREADS, 0, st>>>(c, cin, acc, g->m, g->n, g->ldc, g->stride_c, batch,
                                                             g->alpha, sa, sb, rowwise, g->beta);
    CUDA_CHECK_LAUNCH();
}

// Fill the cuBLASLt key for row-major operands a, b (already in the compute type) and
// output c of type ctype, leading dim ldc, batch stride sc.
static lt_call make_call(const ops_gemm_desc *g, operand a, operand b, void *c, tetra_dtype ctype, int64_t ldc,
                         int64_t sc, int batch) {
    lt_call call;
    memset(&call, 0, sizeof call);
    lt_key *k = &call.key;
    // swapped: cuBLASLt A = our B, cuBLASLt B = our A
    k->ta = (int)lt_type(b.t);
    k->tb = (int)lt_type(a.t);
    k->tc = (int)lt_type(ctype);
    k->opa = b.trans;
    k->opb = a.trans;
    k->m = g->n;
    k->n = g->m;
    k->k = g->k;
    k->lda = b.ld;
    k->ldb = a.ld;
    k->ldc = ldc;
    k->batch = batch;
    k->sa = batch > 1 ? b.stride : 0;
    k->sb = batch > 1 ? a.stride : 0;
    k->sc = batch > 1 ? sc : 0;
    call.a = b.p;
    call.b = a.p;
    call.c = c;
    call.alpha = 1.0f;
    call.beta = 0.0f;
    return call;
}

static void gemm_checked(cublasStatus_t s, const char *path) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "[cuBLAS ERROR] cuda_gemm (%s path): no algorithm: %s\n", path, cublasLtGetStatusString(s));
        abort();
    }
}

extern "C" void cuda_gemm(void *c, const void *a, const void *b, const ops_gemm_desc *g) {
    const int batch = g->batch > 1 ? g->batch : 1;
    if (g->m <= 0 || g->n <= 0) return;
    if (g->c_type != TETRA_F32 && g->c_type != TETRA_BF16) {
        fprintf(stderr, "[tetra] cuda_gemm: C must be float32 or bfloat16, not %s\n", tetra_dtype_name(g->c_type));
        abort();
    }
    const int rowwise = g->scale_rowwise && (g->a_scale || g->b_scale);
    if (g->k <= 0) { // empty sum: C = beta C
        run_epilogue(c, NULL, g, batch, NULL, NULL, 0);
        last_path = "k=0";
        return;
    }
    operand A = {a, g->a_type, g->trans_a ? 1 : 0, g->lda, g->stride_a};
    operand B = {b, g->b_type, g->trans_b ? 1 : 0, g->ldb, g->stride_b};

    // ---- fp8 on the tensor cores (the predicates are kernels/ops_paths.h's, which the
    // backend's description, kernels/op_costs.h, follows too)
    if (ops_path_gemm_fp8_pair(A.t, B.t) && ops_path_gemm_fp8_shape(g, c)) {
        operand Ak = kmajor(g, A, 0, SCRATCH_GEMM_A, batch);
        operand Bk = kmajor(g, B, 1, SCRATCH_GEMM_B, batch);
        if (!rowwise) {
            lt_call call = make_call(g, Ak, Bk, c, g->c_type, g->ldc, g->stride_c, batch);
            call.cin = g->c_in;
            call.key.fast_accum = g->fast_accum ? 1 : 0;
            call.key.scale_mode = SCALE_TENSOR;
            call.a_scale = g->b_scale; // swapped
            call.b_scale = g->a_scale;
            call.alpha = g->alpha;
            call.beta = g->beta;
            if (lt_matmul_batch(&call) == CUBLAS_STATUS_SUCCESS) {
                last_path = "fp8";
                return;
            }
        } else {
            // tried for each configuration: cuBLASLt may offer outer-vector scales for some
            // (output type, fast accumulation, sizes) and not others; a refused one is
            // remembered in its cached plan and falls through to the epilogue at once
            if (g->a_scale && g->b_scale) {
                lt_call call = make_call(g, Ak, Bk, c, g->c_type, g->ldc, g->stride_c, batch);
                call.cin = g->c_in;
                call.key.fast_accum = g->fast_accum ? 1 : 0;
                call.key.scale_mode = SCALE_OUTER;
                call.a_scale = g->b_scale; // cuBLASLt A (our B): one scale per its m' = n rows
                call.b_scale = g->a_scale; // cuBLASLt B (our A): one per its n' = m columns
                call.alpha = g->alpha;
                call.beta = g->beta;
                if (lt_matmul_batch(&call) == CUBLAS_STATUS_SUCCESS) {
                    last_path = "fp8+rowwise";
                    return;
                }
            }
            // unscaled fp8 product to fp32 scratch, scales in the epilogue
            float *acc = (float *)cuda_scratch(SCRATCH_GEMM_ACC, (size_t)g->m * g->n * batch * sizeof(float) + 256);
            lt_call call = make_call(g, Ak, Bk, acc, TETRA_F32, g->n, (int64_t)g->m * g->n, batch);
            call.key.fast_accum = g->fast_accum ? 1 : 0;
            if (lt_matmul_batch(&call) == CUBLAS_STATUS_SUCCESS) {
                run_epilogue(c, acc, g, batch, g->a_scale, g->b_scale, 1);
                last_path = "fp8+epilogue";
                return;
            }
        }
        // no fp8 algorithm for this case: fall through to the widened path
    }

    // ---- fp32 or bf16 compute
    tetra_dtype common = ops_path_gemm_common(A.t, B.t);
    if (A.t != common) A = widen(g, A, 0, common, SCRATCH_GEMM_A, batch);
    if (B.t != common) B = widen(g, B, 1, common, SCRATCH_GEMM_B, batch);
    if (ops_path_gemm_direct(g, common)) {
        lt_call call = make_call(g, A, B, c, g->c_type, g->ldc, g->stride_c, batch);
        call.cin = g->c_in;
        call.alpha = g->alpha;
        call.beta = g->beta;
        gemm_checked(lt_matmul_batch(&call), common == TETRA_F32 ? "f32" : "bf16");
        last_path = common == TETRA_F32 ? "f32" : "bf16";
        return;
    }
    float *acc = (float *)cuda_scratch(SCRATCH_GEMM_ACC, (size_t)g->m * g->n * batch * sizeof(float) + 256);
    lt_call call = make_call(g, A, B, acc, TETRA_F32, g->n, (int64_t)g->m * g->n, batch);
    gemm_checked(lt_matmul_batch(&call), common == TETRA_F32 ? "f32+epilogue" : "bf16+epilogue");
    run_epilogue(c, acc, g, batch, g->a_scale, g->b_scale, rowwise);
    last_path = common == TETRA_F32 ? "f32+epilogue" : "bf16+epilogue";
}
