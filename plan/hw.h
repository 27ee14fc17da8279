/* hw.h — hardware profiles for `tetra plan`: what one device can do.
 *
 * A profile is a small TOML file (configs/hardware/<name>.toml) holding one flat
 * table of datasheet rates (FLOP/s, bytes/s), memory sizes (GiB in the file,
 * bytes here) and efficiency factors (the fraction of a rate that training
 * reaches). Every key is required and none may be added, so a typo in a
 * profile is an error naming the file, the line and the key, never a silently
 * defaulted number. One exception: `nvswitch` (a boolean, false when absent)
 * came later than profiles written by --calibrate and by users, which stay
 * valid without it. `plan_calibrate` (calibrate.h) measures the machine it
 * runs on into the same struct, and plan_hw_write saves it.
 */
#ifndef TETRA_PLAN_HW_H
#define TETRA_PLAN_HW_H

#include <stddef.h>

typedef struct {
    char name[64];
    char description[256];
    char path[1024];        /* the file it was read from ("" when measured) */
    double peak_bf16_flops; /* dense FLOP/s per device */
    double peak_fp8_flops;  /* 0: no fp8 GEMM on this device */
    double peak_fp32_flops;
    double memory_bytes;         /* device memory (memory_gib in the file) */
    double memory_bandwidth;     /* bytes/s */
    double intra_node_bandwidth; /* bytes/s per device per direction */
    double inter_node_bandwidth; /* bytes/s per device per direction */
    int gpus_per_node;
    /* fractions of the rates above that the operations themselves reach (a GEMM of the
     * dtype, fused attention; fp8 GEMMs without their casts, which are ops of their own) */
    double gemm_efficiency;
    double fp8_gemm_efficiency;
    double attention_efficiency;
    double comm_efficiency;            /* of intra_node_bandwidth */
    double inter_node_comm_efficiency; /* of inter_node_bandwidth */
    double memory_efficiency;          /* of memory_bandwidth */
    double reserved_bytes;             /* runtime memory outside the model's buffers (reserved_memory_gib) */
    int nvswitch;                      /* a node's GPUs are joined by NVSwitches with multicast (NVLS): NCCL's memory */
} plan_hw;

/* Load a profile. `name` is either a path (it contains '/' or ends in ".toml")
 * or a profile name looked up as <dir>/<name>.toml in, in order,
 * $TETRA_HARDWARE_DIR, ./configs/hardware and the source tree's
 * configs/hardware (when built with TETRA_SOURCE_DIR). Returns 0, or -1 with
 * err naming the file, line and key (missing key, wrong type, value out of
 * range, unknown key), or, for a name found nowhere, the places looked at and
 * the profiles found there. */
int plan_hw_load(const char *name, plan_hw *out, char *err, size_t errlen);

/* Names of the profiles (files *.toml, without the extension) in the first
 * directory of the search order that exists, sorted and separated by ", ";
 * "" when there is none. */
void plan_hw_list(char *buf, size_t n);
/* A CPU profile (named cpu..., no fp8): its memory is the host's, shared by the ranks
 * on it, its cores also move the bytes, and it plans training.device = cpu. */
int plan_hw_is_host(const plan_hw *hw);

/* Write a profile as TOML that plan_hw_load reads back to the same numbers,
 * atomically (<path>.tmp, then rename). A profile that would not load (a value
 * out of range, a name too long) is refused. Returns 0, or -1 with err. */
int plan_hw_write(const plan_hw *hw, const char *path, char *err, size_t errlen);

#endif
