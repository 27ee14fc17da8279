// util/dtype.c — element types (dtype.h). The CUDA backend library (lib/libtetra_cuda.so,
// kernels/cuda_plugin.h) is built with this file too.
#include "util/dtype.h"

size_t tetra_dtype_size(tetra_dtype t) {
    switch (t) {
    case TETRA_F32: return 4;
    case TETRA_BF16: return 2;
    case TETRA_F16: return 2;
    case TETRA_FP8_E4M3: return 1;
    case TETRA_FP8_E5M2: return 1;
    case TETRA_I32: return 4;
    }
    return 0;
}

const char *tetra_dtype_name(tetra_dtype t) {
    switch (t) {
    case TETRA_F32: return "float32";
    case TETRA_BF16: return "bfloat16";
    case TETRA_F16: return "float16";
    case TETRA_FP8_E4M3: return "float8_e4m3fn";
    case TETRA_FP8_E5M2: return "float8_e5m2";
    case TETRA_I32: return "int32";
    }
    return "?";
}
