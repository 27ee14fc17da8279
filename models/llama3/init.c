/* init.c — counter-based random numbers for weight init (see init.h). */
#include "models/llama3/init.h"

#include <math.h>

/* Philox constants (Random123: PHILOX_M4x32_0/1, PHILOX_W32_0/1). */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void llama3_philox4x32_10(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) { /* the key is bumped between rounds, not before the first */
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

uint64_t llama3_name_hash(const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}

double llama3_rng_uniform(uint64_t seed, uint64_t name_hash, uint64_t index) {
    uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)name_hash, (uint32_t)(name_hash >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t x[4];
    llama3_philox4x32_10(x, ctr, key);
    uint64_t bits = (((uint64_t)x[0] << 32) | x[1]) >> 11; /* 53 bits */
    return ((double)bits + 0.5) * 0x1p-53;                 /* never 0 or 1: the quantile stays finite */
}

/* Acklam's rational approximation: relative error below 1.15e-9, twenty times finer
 * than an fp32 ulp, so the rounded weights are those of the exact quantile but for
 * rare last-ulp ties. No refinement step: the central region (95% of draws) is then
 * pure arithmetic, fast and bit-reproducible on any IEEE machine, and the tails need
 * only log and sqrt. */
double llama3_normal_quantile(double p) {
    static const double a[6] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                                1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
    static const double b[5] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                                6.680131188771972e+01, -1.328068155288572e+01};
    static const double c[6] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                                -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
    static const double d[4] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                3.754408661907416e+00};
    const double plow = 0.02425, phigh = 1.0 - plow;
    double x;
    if (p < plow) {
        double q = sqrt(-2.0 * log(p));
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
    } else if (p <= phigh) {
        double q = p - 0.5, r = q * q;
        x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
            (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
    } else {
        double q = sqrt(-2.0 * log(1.0 - p));
        x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
    }
    return x;
}

static double normal_cdf(double z) {
    if (isinf(z)) return z < 0 ? 0.0 : 1.0;
    return 0.5 * erfc(-z / sqrt(2.0));
}

static float trunc_normal_at(uint64_t seed, uint64_t h, uint64_t index, double std, double lo, double hi, double plo,
                             double phi) {
    double u = llama3_rng_uniform(seed, h, index);
    double p = plo + (phi - plo) * u;
    double v = std * llama3_normal_quantile(p);
    if (v < lo) v = lo; /* the quantile's last-ulp error must not leave the range */
    if (v > hi) v = hi;
    return (float)v;
}

float llama3_rng_trunc_normal(uint64_t seed, const char *name, uint64_t index, double std, double lo, double hi) {
    return trunc_normal_at(seed, llama3_name_hash(name), index, std, lo, hi, normal_cdf(lo / std),
                           normal_cdf(hi / std));
}

void llama3_rng_trunc_normal_fill(float *out, uint64_t seed, const char *name, uint64_t start, size_t count, double std,
                                  double lo, double hi) {
    uint64_t h = llama3_name_hash(name);
    double plo = normal_cdf(lo / std), phi = normal_cdf(hi / std);
    int64_t n = (int64_t)count;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t j = 0; j < n; j++) out[j] = trunc_normal_at(seed, h, start + (uint64_t)j, std, lo, hi, plo, phi);
}
