#include "engine/info.h"

#include <cblas.h>
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifdef TETRA_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

/* OpenBLAS-specific introspection; declared here so the generic cblas.h suffices. */
char *openblas_get_config(void);
int openblas_get_num_threads(void);

int info_gpu_count(void) {
#ifdef TETRA_HAVE_CUDA
    return cuda_device_count();
#else
    return 0;
#endif
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
    char mpi_version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(mpi_version, &len);
    char *nl = strchr(mpi_version, ',');
    if (nl) *nl = 0;
    printf("tetra 0.1.0\n");
    printf("  cpu cores (online):  %ld\n", sysconf(_SC_NPROCESSORS_ONLN));
    printf("  openmp max threads:  %d\n", omp_get_max_threads());
    printf("  blas:                %s\n", openblas_get_config());
    printf("  mpi:                 %s\n", mpi_version);
#ifdef TETRA_HAVE_CUDA
    int n = info_gpu_count();
    printf("  cuda backend:        built (sm_90a)\n");
    printf("  visible gpus:        %d\n", n);
    for (int i = 0; i < n; i++) {
        char buf[256];
        cuda_device_describe(i, buf, sizeof buf);
        printf("    [%d] %s\n", i, buf);
    }
#else
    printf("  cuda backend:        not built\n");
#endif
    return 0;
}
