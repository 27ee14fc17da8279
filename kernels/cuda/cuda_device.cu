#include "kernels/cuda/cuda_device.h"

#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda_plugin.h"

extern "C" int cuda_device_count(void) {
    int n = 0;
    /* No driver or no device is a normal answer on CPU hosts, not an error. */
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int cuda_device_describe(int i, char *buf, int n) {
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, i);
    if (e != cudaSuccess) {
        snprintf(buf, (size_t)n, "%s", cudaGetErrorString(e));
        return -1;
    }
    snprintf(buf, (size_t)n, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return 0;
}

// The library's entry point for the C side (kernels/cuda_plugin.h).
extern "C" __attribute__((visibility("default"))) const cuda_kernels_api *tetra_cuda_kernels_v1(void) {
    static const cuda_kernels_api api = {CUDA_PLUGIN_ABI, ops_cuda, cuda_device_count, cuda_device_describe,
                                         cuda_cudnn_version};
    return &api;
}
