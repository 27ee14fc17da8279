// kernels/ops_math.h — per-element math shared by the CPU backend (C11) and the CUDA
// backend (CUDA C++), so both compute the same function: exp, SiLU and its derivative,
// RMSNorm pieces, the RoPE rotation, bf16 and fp8 (e4m3fn, e5m2) conversions with
// round-to-nearest-even, and the AdamW element update.
//
// Everything here is branch-light and free of library calls other than sqrtf/fmaf so
// that loops over it vectorize on the CPU and inline on the GPU.
#ifndef TETRA_KERNELS_OPS_MATH_H
#define TETRA_KERNELS_OPS_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/ops.h"

#ifdef __CUDACC__
#define TETRA_HD static __host__ __device__ __forceinline__
#else
#define TETRA_HD static inline
#endif

// ----------------------------------------------------------------------------
// bit casts

TETRA_HD uint32_t tetra_f32_bits(float x) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

TETRA_HD float tetra_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

// Round a float of magnitude below 2^22 to the nearest integer, ties to even, with plain
// IEEE arithmetic (adding 1.5 * 2^23 leaves no fraction bits). Needs no rintf call, so
// the loops around it vectorize everywhere.
TETRA_HD float tetra_rne_int(float q) {
    const float magic = 12582912.0f; // 1.5 * 2^23
    return (q + magic) - magic;
}

// ----------------------------------------------------------------------------
// exp. A Cephes-style expf: n = rne(x log2 e), r = x - n ln 2 (two-part ln 2), a degree-6
// polynomial for e^r on [-ln2/2, ln2/2], times 2^n applied as two power-of-two factors so
// that both overflow (x > 88.72 -> inf) and the subnormal tail (down to x = -103.97)
// come out right. Max error about 1 ulp against the correctly rounded value
// (tests/unit/test_ops_cpu.c measures it). exp(-inf) = 0, exp(NaN) = NaN.
// exp(x) = y 2^fn for a clamped x: fn = round(x / ln2), y = exp(r) on the remainder
// r = x - fn ln2 in [-ln2/2, ln2/2] by a degree-7 polynomial
TETRA_HD float tetra_exp_reduced(float xc, float *fn_out) {
    float t = xc * 1.44269504088896341f;
    float fn = tetra_rne_int(t);
    float r = xc - fn * 0.693359375f; // ln2 high part: few bits, exact product
    r = r - fn * -2.12194440e-4f;     // ln2 low part
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    *fn_out = fn;
    return p * r * r + r + 1.0f;
}

TETRA_HD float tetra_expf(float x) {
    float xc = x < -104.0f ? -104.0f : x;
    xc = xc > 89.0f ? 89.0f : xc;
    float fn;
    float y = tetra_exp_reduced(xc, &fn);
    int n = (int)fn;             // in [-150, 129]
    int n1 = n / 2, n2 = n - n1; // each in [-75, 65]: a normal power of two
    float s1 = tetra_bits_f32((uint32_t)(n1 + 127) << 23);
    float s2 = tetra_bits_f32((uint32_t)(n2 + 127) << 23);
    return y * s1 * s2;
}

// exp of a softmax argument (a score minus its row's max or log-sum-exp: x <= 0 up to
// rounding): tetra_expf's reduction and polynomial with one power-of-two factor and one
// clamp. Bit-identical to tetra_expf on [-87.3, 88] (NaN stays NaN); below -87.3 it
// returns exp(-87.3) = 1.2e-38 rather than the subnormal tail or 0, invisible beside the
// row's largest term (exp(0) = 1); above 88 it overflows. A third fewer operations than
// tetra_expf, for the attention kernels' score tiles.
TETRA_HD float tetra_expf_softmax(float x) {
    float fn;
    float y = tetra_exp_reduced(x < -87.3f ? -87.3f : x, &fn);
    int n = (int)fn; // in [-126, 127] for x <= 88
    return y * tetra_bits_f32((uint32_t)(n + 127) << 23);
}

// ----------------------------------------------------------------------------
// SiLU (as torch: x / (1 + exp(-x)); backward s (1 + x (1 - s)), s = sigmoid(x))

TETRA_HD float tetra_silu(float x) { return x / (1.0f + tetra_expf(-x)); }

TETRA_HD float tetra_dsilu(float x) {
    float s = 1.0f / (1.0f + tetra_expf(-x));
    return s * (1.0f + x * (1.0f - s));
}

// ----------------------------------------------------------------------------
// RMSNorm pieces: rstd = 1/sqrt(sum(x^2)/C + eps) (torch: rsqrt(x.pow(2).mean() + eps));
// y = (x rstd) w; dx = rstd (w dy - x rstd^2 dot/C), dot = sum_j w_j dy_j x_j.

TETRA_HD float tetra_rms_rstd(float sumsq, int c, float eps) { return 1.0f / sqrtf(sumsq / (float)c + eps); }

TETRA_HD float tetra_rms_dx(float x, float w, float dy, float rstd, float dot_over_c) {
    return rstd * (w * dy - x * (rstd * rstd * dot_over_c));
}

// ----------------------------------------------------------------------------
// RoPE: the pair (x0, x1) is the complex number x0 + i x1, multiplied by cos + i sin
// (Meta/TorchTitan apply_rotary_emb with view_as_complex). Backward multiplies by the
// conjugate.

TETRA_HD void tetra_rope_rotate(float *o0, float *o1, float x0, float x1, float c, float s) {
    float y0 = x0 * c - x1 * s;
    float y1 = x0 * s + x1 * c;
    *o0 = y0;
    *o1 = y1;
}

TETRA_HD void tetra_rope_unrotate(float *o0, float *o1, float g0, float g1, float c, float s) {
    float y0 = g0 * c + g1 * s;
    float y1 = g1 * c - g0 * s;
    *o0 = y0;
    *o1 = y1;
}

// ----------------------------------------------------------------------------
// bf16: round to nearest even; NaN -> 0x7fc0 (as c10::BFloat16); overflow -> inf.

TETRA_HD uint16_t tetra_f32_to_bf16(float x) {
    uint32_t u = tetra_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

TETRA_HD float tetra_bf16_to_f32(uint16_t b) { return tetra_bits_f32((uint32_t)b << 16); }

// ----------------------------------------------------------------------------
// fp8. Encoders saturate (|x| >= max, inf included, -> +-max: torchao clamps before the
// cast), round to nearest even in the normal and the subnormal range, keep the sign of
// zero, and map NaN to the ml_dtypes/torch encodings (e4m3fn 0x7f, e5m2 0x7e, with sign).

TETRA_HD uint8_t tetra_f32_to_e4m3(float x) {
    uint32_t u = tetra_f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7f);      // NaN
    if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7e);     // >= 448: saturate
    if (a < 0x3c800000u) {                                   // < 2^-6: subnormal, units 2^-9
        float q = tetra_rne_int(tetra_bits_f32(a) * 512.0f); // 0..8 (8 = min normal)
        return (uint8_t)(sign | (uint8_t)q);
    }
    uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u); // rne 23 -> 3 mantissa bits
    r = (r >> 20) - ((127u - 7u) << 3);
    return (uint8_t)(sign | (uint8_t)r);
}

TETRA_HD uint8_t tetra_f32_to_e5m2(float x) {
    uint32_t u = tetra_f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7e);        // NaN
    if (a >= 0x47600000u) return (uint8_t)(sign | 0x7b);       // >= 57344: saturate
    if (a < 0x38800000u) {                                     // < 2^-14: subnormal, units 2^-16
        float q = tetra_rne_int(tetra_bits_f32(a) * 65536.0f); // 0..4
        return (uint8_t)(sign | (uint8_t)q);
    }
    uint32_t r = a + 0xfffffu + ((a >> 21) & 1u); // rne 23 -> 2 mantissa bits
    r = (r >> 21) - ((127u - 15u) << 2);
    return (uint8_t)(sign | (uint8_t)r);
}

TETRA_HD float tetra_e4m3_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t e = (b >> 3) & 0xfu, m = b & 0x7u;
    if ((b & 0x7fu) == 0x7fu) return tetra_bits_f32(sign | 0x7fc00000u);
    if (e == 0) return tetra_bits_f32(sign | tetra_f32_bits((float)m * (1.0f / 512.0f)));
    return tetra_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

TETRA_HD float tetra_e5m2_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t e = (b >> 2) & 0x1fu, m = b & 0x3u;
    if (e == 31) return tetra_bits_f32(sign | (m ? 0x7fc00000u : 0x7f800000u));
    if (e == 0) return tetra_bits_f32(sign | tetra_f32_bits((float)m * (1.0f / 65536.0f)));
    return tetra_bits_f32(sign | ((e + 112u) << 23) | (m << 21));
}

// Saturating quantisation as torchao: q = cast(clamp(x * scale, -max, max)); the encoders
// saturate themselves, so the clamp is implicit (and NaN stays NaN).
TETRA_HD uint8_t tetra_quant_e4m3(float x, float scale) { return tetra_f32_to_e4m3(x * scale); }
TETRA_HD uint8_t tetra_quant_e5m2(float x, float scale) { return tetra_f32_to_e5m2(x * scale); }

// torchao tensorwise scale: fp8_max / max(amax, 1e-12) in double, stored fp32; optionally
// rounded down to a power of two (rowwise recipe).
TETRA_HD float tetra_fp8_scale(float amax, float fp8_max, int pow2) {
    double a = (double)amax;
    double s = (double)fp8_max / (a > 1e-12 ? a : 1e-12);
    float sf = (float)s;
    if (pow2) sf = exp2f(floorf(log2f(sf)));
    return sf;
}

// ----------------------------------------------------------------------------
// AdamW element update, in the order of torch.optim.AdamW(foreach=False) in fp32. torch's
// vectorised CPU kernels fuse add(alpha=) and addcmul into one fma each; doing the same
// here reproduces its moments bit for bit (on the vector path; its scalar tail rounds twice).
// The host precomputes (in double, as Python does, then rounds to fp32) the coefficients
// of tetra_adamw_coef (kernels/ops.h): decay = 1 - lr wd, b1, omb1 = 1 - b1, b2,
// omb2 = 1 - b2, step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t), eps.

// The coefficients of one step, derived on the host as torch does: Python doubles,
// rounded to fp32 where they meet an fp32 tensor. Both backends take them from here,
// which is what makes their updates bit-identical.
TETRA_HD tetra_adamw_coef tetra_adamw_coefficients(double lr, double beta1, double beta2, double eps,
                                                   double weight_decay, int step, float grad_scale) {
    double bc1 = 1.0 - pow(beta1, (double)step);
    double bc2 = 1.0 - pow(beta2, (double)step);
    tetra_adamw_coef k;
    k.decay = (float)(1.0 - lr * weight_decay);
    k.b1 = (float)beta1;
    k.omb1 = (float)(1.0 - beta1);
    k.b2 = (float)beta2;
    k.omb2 = (float)(1.0 - beta2);
    k.neg_step_size = (float)(-(lr / bc1));
    k.bc2_sqrt = (float)sqrt(bc2);
    k.eps = (float)eps;
    k.grad_scale = grad_scale;
    return k;
}

// The optimizer's scalars of one step (ops.h optim_scalars), shared by both backends.
// host_k: the coefficients of a->expected_t as the host derived them (the CUDA launcher
// passes them: the device's pow may differ from the host's in the last bit), or NULL to
// derive them here.
TETRA_HD void tetra_optim_scalars(ops_optim_state *s, const ops_optim_args *a, const tetra_adamw_coef *host_k) {
    const double norm = sqrt(s->sq);
    if (!isfinite(norm)) {
        s->nonfinite++;
        s->run++;
        if (!s->first_bad) s->first_bad = a->step;
        s->last_bad = a->step;
        if (a->halt_first || (a->max_run > 0 && s->run >= a->max_run)) s->halted = 1;
        s->skip = 1;
        return;
    }
    s->run = 0;
    s->skip = s->halted;
    if (s->skip) return;
    float clip = (float)(a->max_norm / (norm + 1e-6));
    if (clip > 1.0f) clip = 1.0f;
    const int t = s->updates + 1;
    s->k = host_k && t == a->expected_t
        ? *host_k
        : tetra_adamw_coefficients(a->lr, a->beta1, a->beta2, a->eps, a->weight_decay, t, 1.0f);
    s->k.grad_scale = clip;
    s->updates = t;
}

// A product rounded on its own: nvcc (--fmad=true, its default) fuses a product into a
// later add even across statements, which the host compiler does not do; the update
// rounds param * decay before adding the step, as torch does.
TETRA_HD float tetra_mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

TETRA_HD void tetra_adamw_update(float *p, float *m, float *v, float grad, const tetra_adamw_coef *k) {
    float g = grad * k->grad_scale;
    float pp = tetra_mul_rn(*p, k->decay);          // param.mul_(1 - lr wd)
    float mm = fmaf(g, k->omb1, *m * k->b1);        // exp_avg.mul_(b1).add_(g, alpha=1-b1): fmadd
    float vv = fmaf(k->omb2 * g, g, *v * k->b2);    // exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2): fmadd
    float denom = sqrtf(vv) / k->bc2_sqrt + k->eps; // (v.sqrt() / bc2_sqrt).add_(eps)
    pp = pp + k->neg_step_size * mm / denom;        // param.addcdiv_(m, denom, -step_size)
    *p = pp;
    *m = mm;
    *v = vv;
}

#endif // TETRA_KERNELS_OPS_MATH_H
