// kernels/cuda/cuda_cudnn.cu — what the build knows of cuDNN (cmake/cudnn.cmake defines
// TETRA_HAVE_CUDNN when it links it). The fp32 attention ops run on the built-in kernels
// of cuda_attention.cu; cuDNN's fused SDPA takes bf16/fp16/fp8 only and becomes the fast
// path of the bf16 attention ops (docs/cuda.md).
#include "kernels/cuda/cuda_device.h"

#ifdef TETRA_HAVE_CUDNN
#include <cudnn.h>
#endif

extern "C" int cuda_cudnn_version(void) {
#ifdef TETRA_HAVE_CUDNN
    return (int)cudnnGetVersion();
#else
    return 0;
#endif
}
