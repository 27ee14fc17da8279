/* info.h — `tetra info`: how this binary was built and what it can see. */
#ifndef TETRA_INFO_H
#define TETRA_INFO_H

/* Visible GPUs (0 without CUDA support or without devices). */
int info_gpu_count(void);

/* argv[0] is "info". `--gpu-count` prints only the number (for launchers). */
int info_main(int argc, char **argv);

#endif
