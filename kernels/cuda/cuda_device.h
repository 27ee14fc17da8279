/* cuda_device.h — what the CUDA runtime sees on this host (C interface). */
#ifndef TETRA_CUDA_DEVICE_H
#define TETRA_CUDA_DEVICE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Number of visible GPUs; 0 when there is no driver or no device. */
int cuda_device_count(void);
/* Name and compute capability of device i into buf ("NVIDIA H100 80GB HBM3 (sm_90)");
 * returns 0, or -1 with the CUDA error text in buf. */
int cuda_device_describe(int i, char *buf, int n);
/* cuDNN version the process runs with (e.g. 91900 for 9.19.0), or 0 when the build has
 * no cuDNN (kernels/cuda/cuda_cudnn.cu). */
int cuda_cudnn_version(void);

#ifdef __cplusplus
}
#endif

#endif
