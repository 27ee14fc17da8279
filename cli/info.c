#include "cli/info.h"

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda_plugin.h"
#include "util/host.h"

/* OpenBLAS-specific introspection; declared here so the generic cblas.h suffices. */
char *openblas_get_config(void);
int openblas_get_num_threads(void);

int info_gpu_count(void) {
    if (cuda_driver_device_count() <= 0) return 0; /* no driver, no device: the CUDA library stays unloaded */
    const cuda_kernels_api *k = cuda_kernels(NULL, 0);
    return k ? k->device_count() : 0;
}

int info_main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--gpu-count")) {
        printf("%d\n", info_gpu_count());
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: tetra info [--gpu-count]\n");
        return !(strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) * 2;
    }
    char mpi_version[256];
    host_mpi_version(mpi_version, sizeof mpi_version);
    printf("tetra 0.1.0\n");
    printf("  cpu cores (online):  %ld\n", sysconf(_SC_NPROCESSORS_ONLN));
    printf("  openmp max threads:  %d\n", omp_get_max_threads());
    printf("  blas:                %s\n", openblas_get_config());
    printf("  mpi:                 %s\n", mpi_version);
#ifdef TETRA_HAVE_CUDA
    char why[2048];
    const cuda_kernels_api *k = cuda_kernels(why, sizeof why);
    if (!k) {
        printf("  cuda backend:        built, not loadable: %s\n", why);
        return 0;
    }
    int n = k->device_count();
    printf("  cuda backend:        built (sm_80, sm_90a), lib/libtetra_cuda.so loaded\n");
    if (k->cudnn_version()) printf("  cudnn:               %d\n", k->cudnn_version());
    printf("  visible gpus:        %d\n", n);
    for (int i = 0; i < n; i++) {
        char buf[256];
        k->device_describe(i, buf, sizeof buf);
        printf("    [%d] %s\n", i, buf);
    }
#else
    printf("  cuda backend:        not built\n");
#endif
    return 0;
}
