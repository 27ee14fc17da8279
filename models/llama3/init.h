/* init.h — the counter-based random numbers behind llama3_init_weights.
 *
 * Every initial weight is a pure function of (seed, parameter name, global
 * element index): no generator state is carried from one element to the next,
 * so a rank that holds any shard of a parameter (FSDP range, TP block, PP
 * stage) computes exactly the elements the single-process run would, without
 * a seed checkpoint.
 *
 * Element i of parameter `name` under `seed`:
 *   ctr = (lo32(i), hi32(i), lo32(h), hi32(h)),  h = FNV-1a-64(name)
 *   key = (lo32(seed), hi32(seed))
 *   (x0, x1, x2, x3) = Philox4x32-10(ctr, key)
 *   bits = ((x0 << 32) | x1) >> 11,  u = (bits + 0.5) / 2^53, strictly inside (0, 1)
 *   truncated normal N(0, std) on [lo, hi] by inversion:
 *       p = Phi(lo/std) + (Phi(hi/std) - Phi(lo/std)) u,  value = clamp(std Phi^-1(p), lo, hi)
 *   (Phi by erfc in double; Phi^-1 by Acklam's approximation, see llama3_normal_quantile)
 *   rounded once to fp32. A plain normal is the same with lo = -inf, hi = +inf.
 */
#ifndef TETRA_LLAMA3_INIT_H
#define TETRA_LLAMA3_INIT_H

#include <stddef.h>
#include <stdint.h>

/* Philox4x32-10 (Salmon et al., SC'11; the Random123 reference rounds). */
void llama3_philox4x32_10(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2]);

/* FNV-1a 64-bit hash of a parameter name. */
uint64_t llama3_name_hash(const char *name);

/* The uniform in (0, 1) for (seed, name hash, index). */
double llama3_rng_uniform(uint64_t seed, uint64_t name_hash, uint64_t index);

/* Standard normal quantile Phi^-1(p), p in (0, 1), relative error below 1.15e-9
 * (Acklam's rational approximation). */
double llama3_normal_quantile(double p);

/* One element of a truncated normal N(0, std) cut to [lo, hi] (infinite bounds allowed). */
float llama3_rng_trunc_normal(uint64_t seed, const char *name, uint64_t index, double std, double lo, double hi);

/* out[j] = element (start + j) for j < count; host memory; OpenMP-parallel. */
void llama3_rng_trunc_normal_fill(float *out, uint64_t seed, const char *name, uint64_t start, size_t count, double std,
                                  double lo, double hi);

#endif
