/* comm_dtype.c — element types of collectives (comm.h). Its own file: the CUDA
 * backend library (lib/libtetra_cuda.so, kernels/cuda_plugin.h) is built with it too. */
#include "parallel/comm.h"

size_t comm_dtype_size(comm_dtype t) {
    switch (t) {
    case COMM_F32: return 4;
    case COMM_F64: return 8;
    case COMM_I32: return 4;
    case COMM_I64: return 8;
    case COMM_BF16: return 2;
    case COMM_U8: return 1;
    }
    return 1;
}

const char *comm_dtype_name(comm_dtype t) {
    switch (t) {
    case COMM_F32: return "float32";
    case COMM_F64: return "float64";
    case COMM_I32: return "int32";
    case COMM_I64: return "int64";
    case COMM_BF16: return "bfloat16";
    case COMM_U8: return "uint8";
    }
    return "?";
}
