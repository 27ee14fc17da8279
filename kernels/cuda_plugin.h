/* cuda_plugin.h — the CUDA backend as a library loaded on first use.
 *
 * The CUDA code (the .cu files of kernels/cuda and the NCCL comm backend parallel/comm_nccl.cu)
 * is built as its own shared library, lib/libtetra_cuda.so next to the executables'
 * bin/, linked against cudart, cuBLASLt, cuDNN and NCCL. Nothing loads it until a run
 * asks for the GPU (training.device = "cuda", or "auto" where the driver reports a
 * device; `tetra info`), so a CPU run
 * does not map those libraries at all: cuBLASLt alone costs a process about 150 MB
 * of resident memory the moment it is loaded, on every rank.
 *
 * The library exports one table per side (tetra_cuda_kernels_v1 here,
 * tetra_cuda_nccl_v1 in parallel/comm_nccl.h), found with dlsym. It is looked for
 * in $TETRA_CUDA_LIBRARY, then beside the object holding this loader (libtetra.so)
 * and in ../lib from it (bin/tetra, the test programs), then on the library path.
 */
#ifndef TETRA_KERNELS_CUDA_PLUGIN_H
#define TETRA_KERNELS_CUDA_PLUGIN_H

#include <stddef.h>

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_PLUGIN_ABI 11

typedef struct {
    int abi; /* CUDA_PLUGIN_ABI */
    /* the op table; NULL with a message when no usable device is present */
    const tetra_ops *(*ops)(char *err, size_t errlen);
    int (*device_count)(void);                       /* 0 without driver or device */
    int (*device_describe)(int i, char *buf, int n); /* "NVIDIA H100 ... (sm_90, 79.1 GiB)" */
    int (*cudnn_version)(void);                      /* 0 without cuDNN */
} cuda_kernels_api;

/* The kernels' table, loading the library on first use; NULL with the reason in err
 * (a build without the CUDA backend, or the library or one of its dependencies not
 * loadable). */
const cuda_kernels_api *cuda_kernels(char *err, size_t errlen);
/* GPUs the driver reports, asked of libcuda.so.1 alone (the driver's library, which
 * exists only where a driver is installed): 0 without driver or device. "auto"
 * devices ask this first, so a host without a GPU never loads the CUDA library. */
int cuda_driver_device_count(void);
/* A symbol of the library (loading it on first use); NULL with the reason in err. */
void *cuda_plugin_symbol(const char *name, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
