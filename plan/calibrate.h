/* calibrate.h — measure this machine as a hardware profile (hw.h).
 *
 * The CPU has no datasheet that predicts what tetra's kernels reach, so the
 * planner's CPU profile is measured: the CPU backend's fp32 GEMM, a STREAM
 * triad, and MPI between the ranks of the job, each with every rank running
 * at once, as in training.
 */
#ifndef TETRA_PLAN_CALIBRATE_H
#define TETRA_PLAN_CALIBRATE_H

#include <stddef.h>
#include <stdio.h>

#include "plan/hw.h"

/* Fills *out from `base`, keeping its efficiency factors (the shipped "cpu"
 * profile's are measured against the rates below), with what this machine
 * measures:
 *   name "cpu", a description naming the host, date and layout;
 *   peak_bf16_flops = peak_fp32_flops = the best fp32 GEMM rate of the CPU
 *   backend (ops.h gemm, square 1024..2048, best of several) and
 *   the base's gemm_efficiency (what the models' thinner GEMMs reach of that
 *   square-GEMM rate); peak_fp8_flops 0;
 *   memory_bytes = host RAM (or the container's memory limit, when lower);
 *   memory_bandwidth = STREAM triad bytes/s per rank;
 *   intra/inter_node_bandwidth = MPI point-to-point bytes/s per rank per
 *   direction (memory_bandwidth / 2 with one rank: a copy reads and writes;
 *   between nodes = within a node on one host);
 *   gpus_per_node = ranks per node; reserved_bytes = this process's resident
 *   memory (VmRSS) besides the calibration's buffers: the larger of VmRSS on
 *   entry and after the buffers are released (by then the thread pool,
 *   OpenBLAS's and MPI's buffers count, as they do in training).
 * An MPI all-reduce is timed too and logged against the point-to-point rate
 * (the comm_efficiency it implies).
 * Rates are the minimum over ranks (the slowest rank paces a step), memory
 * the smallest node's, ranks per node the fullest node's, so every rank fills
 * the same numbers. Collective over MPI_COMM_WORLD, which the
 * caller has initialised. threads: OpenMP threads per rank (<= 0: cores /
 * ranks on this host); the caller's thread count is restored on return.
 * One line per measurement goes to `log` when it is not NULL.
 * Returns 0, or -1 with err (on every rank). */
int plan_calibrate(plan_hw *out, const plan_hw *base, int threads, FILE *log, char *err, size_t errlen);

#endif
