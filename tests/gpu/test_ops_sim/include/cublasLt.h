// tests/gpu/test_ops_sim/include/cublasLt.h — a fake cuBLASLt for the CUDA simulator (sim.h):
// the column-major semantics of cublasLtMatmul as documented (layouts, transposes,
// strided batches, alpha/beta, tensorwise and outer-vector dequant scales), computed on
// the host in double, plus the documented limits of the fp8 kernels (both operands fp8,
// not e5m2 x e5m2, "TN" layout only, k and leading dims multiples of 16, 16-byte
// alignment) so the callers' fallback paths run. SIM_NO_OUTER=1 refuses outer-vector
// scaling. Matmul checks each pointer against the alignment the heuristic was promised.
#pragma once
#include "sim.h"
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_INVALID_VALUE = 7
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum {
    CUDA_R_32F = 0,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14,
    CUDA_R_8F_E4M3 = 28,
    CUDA_R_8F_E5M2 = 29
} cudaDataType;
typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA,
    CUBLASLT_MATMUL_DESC_TRANSB,
    CUBLASLT_MATMUL_DESC_FAST_ACCUM,
    CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
    CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
    CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
    CUBLASLT_MATMUL_DESC_B_SCALE_POINTER
} cublasLtMatmulDescAttributes_t;
typedef enum {
    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
    CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET
} cublasLtMatrixLayoutAttribute_t;
typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES
} cublasLtMatmulPreferenceAttributes_t;
enum { CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F = 0, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F = 3 };

struct SimDesc {
    int transa, transb, fast, amode, bmode;
    const float *as, *bs;
    cublasComputeType_t ct;
};
struct SimLayout {
    cudaDataType t;
    uint64_t rows, cols;
    int64_t ld;
    int batch;
    int64_t stride;
};
struct SimPref {
    uint32_t al[4];
};
typedef SimDesc *cublasLtMatmulDesc_t;
typedef SimLayout *cublasLtMatrixLayout_t;
typedef SimPref *cublasLtMatmulPreference_t;
typedef void *cublasLtHandle_t;
typedef struct {
    uint32_t al[4];
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

const char *cublasLtGetStatusString(cublasStatus_t);
const char *cublasLtGetStatusName(cublasStatus_t);
cublasStatus_t cublasLtCreate(cublasLtHandle_t *);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *,
                                              size_t);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t, int64_t);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t, const void *,
                                                size_t);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                                    const void *, size_t);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t *,
                                              int *);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t, const void *B, cublasLtMatrixLayout_t, const void *beta,
                              const void *C, cublasLtMatrixLayout_t, void *D, cublasLtMatrixLayout_t,
                              const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t);
