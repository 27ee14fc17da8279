// tests/gpu/test_ops_cuda.c — the CUDA backend against the CPU backend, op by op and for
// whole training steps of a small Llama 3.
//
// Every op of kernels/ops.h runs on random inputs through both tables (ops_cpu() on host
// buffers, ops_cuda() on device buffers) and the results are compared:
// - exact (bit for bit): fills, scale, add, amax, transpose, casts (bf16, fp8 e4m3/e5m2
//   incl. the rounding edge cases), fp8 scales and their inverses, embedding forward and
//   backward (same summation order), AdamW;
// - fp32 ops, relative to the largest reference value: 1e-5 (elementwise, norms, RoPE,
//   SwiGLU, cross-entropy, reductions), 1e-4 for attention (different summation order
//   over long rows) and fp32 GEMMs through cuBLASLt;
// - GEMMs: bf16 operands with fp32 C 1e-4, with bf16 C 1e-2; fp8 operands (the CPU
//   emulates fp8 exactly) 1e-3, 2e-3 with fast accumulation, 1e-2 into bf16;
// - the *_bf16 ops (bf16 activations, fp32 math, one rounding per output): bf16 outputs
//   within 1 bf16 ulp of the CPU's (the unit of near-zero values floored at the fp32
//   twin's tolerance), fp32 statistics and parameter gradients as the fp32 ops (embedding
//   dwte bit for bit); attention via cuDNN (real GPUs, shapes it takes): out 2e-2,
//   gradients 5e-2, lse 1e-3, relative to the largest value;
// - memory: alloc_count / allocated_bytes bookkeeping, memory_freeze (alloc fails, ops
//   with reserved scratch still run, thaw), out of memory as NULL, scratch growth while
//   frozen aborting with its size and purpose (simulator only: it needs fork), and no
//   device allocation in steps 2-4 of the full steps.
// Shapes include sizes that are not multiples of any tile, unaligned pointers,
// grouped-query heads, ring-attention offsets (fully and partly masked blocks),
// vocabulary shards, ignored targets, in-place calls and accumulate-into-existing
// outputs. The full step: the "tiny" Llama 3 flavor, forward loss, every parameter
// gradient, then three AdamW steps compared by their losses (1e-5 before the first
// step, 1e-4 after); then the same in mixed precision (bf16 compute, see test_full_step).
//
// One line per check: op, shape, error, tolerance, verdict. Exit status 1 on any
// failure. Without a CUDA device it checks that ops_get reports that cleanly, prints
// "SKIP: no CUDA device (cudaGetDeviceCount = 0)" and exits 0 (ctest shows it skipped).
//
// The same source also builds as gpu/test_ops_cuda_sim (-DTETRA_CUDA_SIM=ON,
// cmake/gpu_tests.cmake): kernels/cuda/*.cu run on the CPU simulator of
// tests/gpu/test_ops_sim, with reference stand-ins for cuBLASLt and CUB, so the kernels'
// logic is checked on machines without a GPU (docs/cuda.md).
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config/config.h"
#include "plan/ops.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/op_costs.h"
#include "kernels/ops.h"
#include "kernels/ops_math.h"
#include "kernels/ops_record.h"
#include "models/llama3/model.h"

#ifdef TETRA_CUDA_LINKED
/* the simulator's counters (tests/gpu/test_ops_sim/include/sim.h) */
extern long sim_launches, sim_gemm_calls, sim_sorts, sim_copies;
#endif

static const tetra_ops *C; // CPU reference
static const tetra_ops *G; // CUDA
static int failures = 0, checks = 0;

// ----------------------------------------------------------------------------
// reporting

static void report(const char *op, const char *shape, double err, double tol, int ok) {
    checks++;
    if (!ok) failures++;
    printf("%-30s %-46s %11.3e %9.1e  %s\n", op, shape, err, tol, ok ? "ok" : "FAIL");
    fflush(stdout);
}

// A condition, with what was seen when it fails.
static void check(int ok, const char *op, const char *shape, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void check(int ok, const char *op, const char *shape, const char *fmt, ...) {
    report(op, shape, ok ? 0.0 : 1.0, 0.0, ok);
    if (ok) return;
    va_list ap;
    va_start(ap, fmt);
    printf("    ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

// Error of got against ref, relative to max |ref| over the finite entries. Non-finite
// reference entries must be matched exactly in kind (same infinity, or NaN).
static double rel_err(const float *got, const float *ref, size_t n, int *mismatch) {
    double maxref = 0.0, maxd = 0.0;
    *mismatch = 0;
    for (size_t i = 0; i < n; i++) {
        float r = ref[i], g = got[i];
        if (!isfinite(r) || !isfinite(g)) {
            int same = (isnan(r) && isnan(g)) || (r == g);
            if (!same) *mismatch = 1;
            continue;
        }
        double a = fabs((double)r);
        if (a > maxref) maxref = a;
        double d = fabs((double)g - (double)r);
        if (d > maxd) maxd = d;
    }
    return maxref > 0.0 ? maxd / maxref : maxd;
}

static void check_close(const char *op, const char *shape, const float *got, const float *ref, size_t n, double tol) {
    int mismatch;
    double e = rel_err(got, ref, n, &mismatch);
    report(op, shape, mismatch ? INFINITY : e, tol, !mismatch && e <= tol);
}

static void check_bits(const char *op, const char *shape, const void *got, const void *ref, size_t bytes) {
    const unsigned char *a = (const unsigned char *)got, *b = (const unsigned char *)ref;
    size_t diff = 0;
    for (size_t i = 0; i < bytes; i++) diff += a[i] != b[i];
    report(op, shape, (double)diff, 0.0, diff == 0);
}

// fp32 results bit for bit, except that a NaN matches any NaN: the payload of a NaN
// that passes through arithmetic is the hardware's (x86 keeps the operand's quiet NaN,
// the GPU returns its canonical 0x7fffffff).
static void check_f32_bits(const char *op, const char *shape, const float *got, const float *ref, size_t n) {
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) && isnan(ref[i])) continue;
        diff += memcmp(&got[i], &ref[i], 4) != 0;
    }
    report(op, shape, (double)diff, 0.0, diff == 0);
}

// bf16 results, in units in the last place (ulps) of the reference value. The unit of a
// reference near zero is floored at floor_rel * max|ref| (the fp32 twin's tolerance): the
// two backends' fp32 intermediates may differ by fp32 rounding, which moves a result
// across at most one bf16 rounding boundary, except where the fp32 value itself is the
// small difference of large terms. Non-finite references must be matched in kind.
static double bf16_ulps(const uint16_t *got, const uint16_t *ref, size_t n, double floor_rel, int *mismatch) {
    double maxref = 0.0, worst = 0.0;
    *mismatch = 0;
    for (size_t i = 0; i < n; i++) {
        double r = tetra_bf16_to_f32(ref[i]);
        if (isfinite(r) && fabs(r) > maxref) maxref = fabs(r);
    }
    for (size_t i = 0; i < n; i++) {
        double r = tetra_bf16_to_f32(ref[i]), g = tetra_bf16_to_f32(got[i]);
        if (!isfinite(r) || !isfinite(g)) {
            if (!((isnan(r) && isnan(g)) || r == g)) *mismatch = 1;
            continue;
        }
        int e = 0;
        double ulp = 0.0;
        if (r != 0.0) {
            frexp(r, &e); // |r| in [2^(e-1), 2^e): 8 significant bits
            ulp = ldexp(1.0, e - 8);
        }
        double unit = fmax(ulp, floor_rel * maxref);
        double d = fabs(g - r);
        double u = unit > 0.0 ? d / unit : (d > 0.0 ? INFINITY : 0.0);
        if (u > worst) worst = u;
    }
    return worst;
}

static void check_bf16(const char *op, const char *shape, const uint16_t *got, const uint16_t *ref, size_t n,
                       double floor_rel, double max_ulps) {
    int mismatch;
    double u = bf16_ulps(got, ref, n, floor_rel, &mismatch);
    report(op, shape, mismatch ? INFINITY : u, max_ulps, !mismatch && u <= max_ulps);
}

// bf16 values compared as numbers, relative to the largest reference (cuDNN's numerics)
static void check_bf16_rel(const char *op, const char *shape, const uint16_t *got, const uint16_t *ref, size_t n,
                           double tol) {
    float *g = (float *)malloc((n ? n : 1) * 4), *r = (float *)malloc((n ? n : 1) * 4);
    for (size_t i = 0; i < n; i++) {
        g[i] = tetra_bf16_to_f32(got[i]);
        r[i] = tetra_bf16_to_f32(ref[i]);
    }
    check_close(op, shape, g, r, n, tol);
    free(g);
    free(r);
}

// ----------------------------------------------------------------------------
// data

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t rnd(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 2685821657736338717ull) >> 32);
}
static double unif(void) { return (rnd() + 0.5) / 4294967296.0; }
static float randn(void) { return (float)(sqrt(-2.0 * log(unif())) * cos(6.283185307179586 * unif())); }

static float *hrandn(size_t n, float scale) {
    float *x = (float *)malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = randn() * scale;
    return x;
}

static void *hdup(const void *p, size_t bytes) {
    void *q = malloc(bytes ? bytes : 1);
    memcpy(q, p, bytes);
    return q;
}

// random bf16 values (a normal sample times scale, rounded)
static uint16_t *hrandn_bf16(size_t n, float scale) {
    float *x = hrandn(n, scale);
    uint16_t *b = (uint16_t *)malloc((n ? n : 1) * 2);
    for (size_t i = 0; i < n; i++) b[i] = tetra_f32_to_bf16(x[i]);
    free(x);
    return b;
}

static float *widen(const uint16_t *b, size_t n) {
    float *x = (float *)malloc((n ? n : 1) * 4);
    for (size_t i = 0; i < n; i++) x[i] = tetra_bf16_to_f32(b[i]);
    return x;
}

static void narrow(uint16_t *b, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) b[i] = tetra_f32_to_bf16(x[i]);
}

static void *dup_gpu(const void *h, size_t bytes) {
    void *d = G->alloc(bytes);
    if (!d) {
        fprintf(stderr, "device allocation of %zu bytes failed\n", bytes);
        exit(1);
    }
    G->copy_h2d(d, h, bytes);
    return d;
}

static void *from_gpu(const void *d, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    G->synchronize();
    G->copy_d2h(h, d, bytes);
    return h;
}

// ----------------------------------------------------------------------------
// table and selection

static void test_table(void) {
    char err[256] = "";
    const tetra_ops *o = ops_get("cuda", err, sizeof err);
    /* the table of the CUDA library (a copy marked host-memory on the simulator) */
    report("ops_get(\"cuda\")", err[0] ? err : "-", 0, 0, o && o->gemm == G->gemm && !strcmp(o->name, "cuda"));
    o = ops_get("auto", err, sizeof err);
    report("ops_get(\"auto\") picks cuda", "-", 0, 0, o && !strcmp(o->name, "cuda"));
    int complete = 1;
#define SLOT(f) complete &= G->f != NULL
    SLOT(alloc);
    SLOT(release);
    SLOT(copy_h2d);
    SLOT(copy_h2d_async);
    SLOT(copy_d2h);
    SLOT(copy);
    SLOT(synchronize);
    SLOT(fill);
    SLOT(scale);
    SLOT(axpy);
    SLOT(add);
    SLOT(sum_squares);
    SLOT(sum);
    SLOT(amax);
    SLOT(amax_rows);
    SLOT(amax_bf16);
    SLOT(amax_rows_bf16);
    SLOT(cast_bf16_to_fp8);
    SLOT(transpose);
    SLOT(amax_cols);
    SLOT(cast_transpose_to_fp8);
    SLOT(cast_f32_to_bf16);
    SLOT(cast_bf16_to_f32);
    SLOT(cast_f32_to_fp8);
    SLOT(cast_fp8_to_f32);
    SLOT(cast_fp8_to_bf16);
    SLOT(transpose_u8);
    SLOT(fp8_scale_from_amax);
    SLOT(fp8_quantize);
    SLOT(gemm);
    SLOT(embedding_forward);
    SLOT(embedding_backward);
    SLOT(rmsnorm_forward);
    SLOT(rmsnorm_backward_input);
    SLOT(rmsnorm_backward_weight);
    SLOT(rope_forward);
    SLOT(rope_backward);
    SLOT(swiglu_forward);
    SLOT(swiglu_backward);
    SLOT(attention_workspace_size);
    SLOT(attention_forward);
    SLOT(attention_backward);
    SLOT(attention_merge);
    SLOT(cross_entropy);
    SLOT(cross_entropy_bf16);
    SLOT(ce_shard_max);
    SLOT(ce_shard_sums);
    SLOT(ce_shard_finish);
    SLOT(adamw_step);
    SLOT(adamw_step_bf16);
    SLOT(adamw_step_amax);
    SLOT(embedding_forward_bf16);
    SLOT(embedding_backward_bf16);
    SLOT(rmsnorm_forward_bf16);
    SLOT(rmsnorm_backward_input_bf16);
    SLOT(rmsnorm_backward_weight_bf16);
    SLOT(rope_forward_bf16);
    SLOT(rope_backward_bf16);
    SLOT(swiglu_forward_bf16);
    SLOT(swiglu_backward_bf16);
    SLOT(attention_workspace_size_bf16);
    SLOT(attention_forward_bf16);
    SLOT(attention_backward_bf16);
    SLOT(alloc_count);
    SLOT(allocated_bytes);
    SLOT(memory_freeze);
    SLOT(device_memory);
    SLOT(compute_stream);
    SLOT(set_deterministic);
    complete &= C->adamw_step_bf16 != NULL;
#undef SLOT
    report("op tables complete", "cpu, cuda", 0, 0, complete);
    void *p = G->alloc(1000);
    report("alloc alignment", "1000 B", 0, 0, p && ((uintptr_t)p % 64) == 0);
    G->release(p);
}

// ----------------------------------------------------------------------------
// elementwise and reductions

static void test_elementwise(void) {
    const size_t sizes[] = {1, 5, 1000, ((size_t)1 << 20) + 3};
    char shape[96];
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        for (int off = 0; off < 2; off++) { // off = 1: pointers not 16-byte aligned
            size_t n = sizes[si], tot = n + 1;
            snprintf(shape, sizeof shape, "n=%zu%s", n, off ? " unaligned" : "");
            float *x = hrandn(tot, 1), *y = hrandn(tot, 1), *z = hrandn(tot, 1);
            float *dx = (float *)dup_gpu(x, tot * 4), *dy = (float *)dup_gpu(y, tot * 4),
                  *dz = (float *)dup_gpu(z, tot * 4);
            float *hy = (float *)hdup(y, tot * 4);

            C->fill(hy + off, 3.25f, n);
            G->fill(dy + off, 3.25f, n);
            float *r = (float *)from_gpu(dy, tot * 4);
            check_bits("fill", shape, r, hy, tot * 4);
            free(r);

            memcpy(hy, y, tot * 4);
            G->copy_h2d(dy, y, tot * 4);
            C->scale(hy + off, -0.37f, n);
            G->scale(dy + off, -0.37f, n);
            r = (float *)from_gpu(dy, tot * 4);
            check_bits("scale", shape, r, hy, tot * 4);
            free(r);

            C->axpy(hy + off, x + off, 1.7f, n);
            G->axpy(dy + off, dx + off, 1.7f, n);
            r = (float *)from_gpu(dy, tot * 4);
            check_close("axpy", shape, r, hy, tot, 1e-6);
            free(r);

            float *hz = (float *)hdup(z, tot * 4);
            C->add(hz + off, x + off, y + off, n);
            G->copy_h2d(dy, y, tot * 4);
            G->add(dz + off, dx + off, dy + off, n);
            r = (float *)from_gpu(dz, tot * 4);
            check_bits("add", shape, r, hz, tot * 4);
            free(r);

            // reductions: sum_squares accumulates onto the existing value
            float hs[2] = {2.5f, 0.0f}, gs[2];
            float *ds = (float *)dup_gpu(hs, sizeof hs);
            C->sum_squares(&hs[0], x + off, n);
            G->sum_squares(ds, dx + off, n);
            C->sum(&hs[1], x + off, n);
            G->sum(ds + 1, dx + off, n);
            G->synchronize();
            G->copy_d2h(gs, ds, sizeof gs);
            check_close("sum_squares (+=)", shape, &gs[0], &hs[0], 1, 1e-6);
            check_close("sum", shape, &gs[1], &hs[1], 1, 1e-6);
            float am_c, am_g;
            C->amax(&am_c, x + off, n);
            G->amax(ds, dx + off, n);
            G->synchronize();
            G->copy_d2h(&am_g, ds, 4);
            check_bits("amax", shape, &am_g, &am_c, 4);
            G->release(ds);
            free(x);
            free(y);
            free(z);
            free(hy);
            free(hz);
            G->release(dx);
            G->release(dy);
            G->release(dz);
        }
    }
    // amax: NaN propagates, n = 0 gives 0; amax_rows
    {
        size_t n = 5000;
        float *x = hrandn(n, 3);
        x[4321] = NAN;
        float *dx = (float *)dup_gpu(x, n * 4), *dout = (float *)G->alloc(64 * 4);
        float c_nan, g_nan, c_zero, g_zero;
        C->amax(&c_nan, x, n);
        G->amax(dout, dx, n);
        G->amax(dout + 1, dx, 0);
        C->amax(&c_zero, x, 0);
        float tmp[2];
        G->synchronize();
        G->copy_d2h(tmp, dout, 8);
        g_nan = tmp[0];
        g_zero = tmp[1];
        report("amax NaN propagates", "n=5000", 0, 0, isnan(c_nan) && isnan(g_nan));
        report("amax of nothing", "n=0", 0, 0, c_zero == 0.0f && g_zero == 0.0f);
        x[4321] = 1.0f;
        G->copy_h2d(dx, x, n * 4);
        const int rows = 37, cols = 135; // 4995 elements
        float hr[37], *gr;
        C->amax_rows(hr, x, rows, cols);
        G->amax_rows(dout, dx, rows, cols);
        gr = (float *)from_gpu(dout, rows * 4);
        check_bits("amax_rows", "37 x 135", gr, hr, rows * 4);
        free(gr);
        free(x);
        G->release(dx);
        G->release(dout);
    }
    // bf16 sources of fp8 scaling: amax, amax_rows and the fp8 cast of bf16 x equal the
    // fp32 ops on x widened (CPU), on both backends; 8-byte aligned (word loads) and
    // 2-byte aligned starts, tails, rows of a multiple of 8 and of none, edge values
    {
        const size_t cap = 100003 + 8;
        float *x = (float *)malloc(cap * 4);
        for (size_t i = 0; i < cap; i++) x[i] = randn() * ldexpf(1.0f, (int)(rnd() % 40) - 20);
        const float edge[] = {0.0f, -0.0f, INFINITY, -INFINITY, 448.0f, -500.0f, 57344.0f, 1e30f, 1e-40f, 3.0e38f};
        for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) x[i * 11 + 3] = edge[i];
        uint16_t *xb = (uint16_t *)malloc(cap * 2);
        C->cast_f32_to_bf16(xb, x, cap);
        C->cast_bf16_to_f32(x, xb, cap); // x: exactly the bf16 values
        uint16_t *dxb = (uint16_t *)dup_gpu(xb, cap * 2);
        float *dout = (float *)G->alloc(1024 * 4), c_am, c_am32, g_am;
        const size_t bsizes[] = {1, 7, 5003, 100003};
        for (size_t si = 0; si < 4; si++) {
            for (int off = 0; off < 2; off++) {
                char bshape[64];
                snprintf(bshape, sizeof bshape, "n=%zu%s", bsizes[si], off ? " unaligned" : "");
                C->amax_bf16(&c_am, xb + off, bsizes[si]);
                C->amax(&c_am32, x + off, bsizes[si]);
                G->amax_bf16(dout, dxb + off, bsizes[si]);
                G->synchronize();
                G->copy_d2h(&g_am, dout, 4);
                check_bits("amax_bf16 (cpu) == amax", bshape, &c_am, &c_am32, 4);
                check_bits("amax_bf16", bshape, &g_am, &c_am, 4);
            }
        }
        uint16_t nan16 = 0x7fc0, keep = xb[4321];
        G->copy_h2d(dxb + 4321, &nan16, 2);
        G->amax_bf16(dout, dxb, 5003);
        G->synchronize();
        G->copy_d2h(&g_am, dout, 4);
        G->copy_h2d(dxb + 4321, &keep, 2);
        report("amax_bf16 NaN propagates", "n=5003", 0, 0, isnan(g_am));
        const int rr = 37, rc = 135;
        float hr[37], hr32[37], *gr;
        C->amax_rows_bf16(hr, xb, rr, rc);
        C->amax_rows(hr32, x, rr, rc);
        G->amax_rows_bf16(dout, dxb, rr, rc);
        gr = (float *)from_gpu(dout, rr * 4);
        check_bits("amax_rows_bf16 (cpu) == amax_rows", "37 x 135", hr, hr32, rr * 4);
        check_bits("amax_rows_bf16", "37 x 135", gr, hr, rr * 4);
        free(gr);

        const int bshapes[][2] = {{67, 129}, {64, 136}, {1, 5}};
        float *scale = hrandn(67, 5);
        for (int r = 0; r < 67; r++) scale[r] = fabsf(scale[r]) * 4.0f + 0.01f;
        float *dscale = (float *)dup_gpu(scale, 67 * 4);
        uint8_t *hq = (uint8_t *)malloc(cap), *hq32 = (uint8_t *)malloc(cap), *gq;
        uint8_t *dq = (uint8_t *)G->alloc(cap);
        const tetra_dtype fmts[2] = {TETRA_FP8_E4M3, TETRA_FP8_E5M2};
        int cpu_diff = 0;
        for (int sh = 0; sh < 3; sh++) {
            const int rows = bshapes[sh][0], cols = bshapes[sh][1];
            const size_t n = (size_t)rows * cols;
            for (int fi = 0; fi < 2; fi++) {
                for (int mode = 0; mode < 3; mode++) { // no scale, tensorwise, rowwise
                    for (int off = 0; off < 2; off++) {
                        const float *sc = mode ? scale : NULL, *dsc = mode ? dscale : NULL;
                        char name[64], bshape[64];
                        snprintf(name, sizeof name, "cast bf16->%s%s", fi ? "e5m2" : "e4m3",
                                 mode == 0       ? " noscale"
                                     : mode == 2 ? " rowwise"
                                                 : "");
                        snprintf(bshape, sizeof bshape, "%d x %d%s", rows, cols, off ? " unaligned" : "");
                        C->cast_bf16_to_fp8(hq, xb + off, sc, mode == 2, rows, cols, fmts[fi]);
                        C->cast_f32_to_fp8(hq32, x + off, sc, mode == 2, rows, cols, fmts[fi]);
                        G->cast_bf16_to_fp8(dq + off, dxb + off, dsc, mode == 2, rows, cols, fmts[fi]);
                        gq = (uint8_t *)from_gpu(dq + off, n);
                        cpu_diff += memcmp(hq, hq32, n) != 0;
                        check_bits(name, bshape, gq, hq, n);
                        free(gq);
                    }
                }
            }
        }
        report("cast bf16->fp8 (cpu) == f32->fp8", "every case above", (double)cpu_diff, 0.0, cpu_diff == 0);
        free(x);
        free(xb);
        free(scale);
        free(hq);
        free(hq32);
        G->release(dxb);
        G->release(dout);
        G->release(dscale);
        G->release(dq);
    }
    // amax_cols and cast_transpose_to_fp8 (fp32 and bf16 x): on the CPU, equal to amax_rows
    // and the rowwise cast of x's fp32 transpose; on the device, equal to the CPU. Shapes
    // of whole tiles, partial tiles and one row/column (128 x 192 in bf16: the 64 x 64
    // vector tiles); a NaN and edge values in x.
    {
        const int tshapes[][2] = {{37, 135}, {64, 96}, {1, 70}, {70, 1}, {300, 517}, {128, 192}};
        for (int ts = 0; ts < 6; ts++) {
            const int rows = tshapes[ts][0], cols = tshapes[ts][1];
            const size_t n = (size_t)rows * cols;
            float *x = hrandn(n, 3.0f);
            for (size_t i = 0; i < n; i += 97) x[i] = ldexpf(x[i], 14); // saturating values
            if (n > 40) x[40] = NAN;
            uint16_t *xb = (uint16_t *)malloc(n * 2);
            C->cast_f32_to_bf16(xb, x, n);
            float *xw = (float *)malloc(n * 4), *xt = (float *)malloc(n * 4);
            for (int dt = 0; dt < 2; dt++) {
                const tetra_dtype xt_ = dt ? TETRA_BF16 : TETRA_F32;
                const void *hx = dt ? (const void *)xb : (const void *)x;
                if (dt) C->cast_bf16_to_f32(xw, xb, n);
                else memcpy(xw, x, n * 4);
                C->transpose(xt, xw, rows, cols);
                char bshape[64];
                snprintf(bshape, sizeof bshape, "%d x %d %s", rows, cols, dt ? "bf16" : "f32");
                float *ca = (float *)malloc((size_t)cols * 4), *cr = (float *)malloc((size_t)cols * 4), *ga;
                C->amax_cols(ca, hx, xt_, rows, cols);
                C->amax_rows(cr, xt, cols, rows);
                check_f32_bits("amax_cols (cpu) == amax_rows of x^T", bshape, ca, cr, (size_t)cols);
                void *dx = dup_gpu(hx, n * (dt ? 2 : 4));
                float *da = (float *)G->alloc((size_t)cols * 4);
                G->amax_cols(da, dx, xt_, rows, cols);
                ga = (float *)from_gpu(da, (size_t)cols * 4);
                check_f32_bits("amax_cols", bshape, ga, ca, (size_t)cols);
                float *scale = (float *)malloc((size_t)cols * 4);
                for (int c = 0; c < cols; c++) scale[c] = isnan(ca[c]) ? 1.0f : 448.0f / fmaxf(ca[c], 1e-12f);
                float *dscale = (float *)dup_gpu(scale, (size_t)cols * 4);
                uint8_t *hq = (uint8_t *)malloc(n), *hq2 = (uint8_t *)malloc(n), *gq;
                uint8_t *dq = (uint8_t *)G->alloc(n);
                for (int fi = 0; fi < 2; fi++) {
                    const tetra_dtype fmt = fi ? TETRA_FP8_E5M2 : TETRA_FP8_E4M3;
                    char name[64];
                    snprintf(name, sizeof name, "cast_transpose_to_fp8 %s", fi ? "e5m2" : "e4m3");
                    C->cast_transpose_to_fp8(hq, hx, xt_, scale, rows, cols, fmt);
                    C->cast_f32_to_fp8(hq2, xt, scale, 1, cols, rows, fmt);
                    check_bits("cast_transpose (cpu) == rowwise cast of x^T", bshape, hq, hq2, n);
                    G->cast_transpose_to_fp8(dq, dx, xt_, dscale, rows, cols, fmt);
                    gq = (uint8_t *)from_gpu(dq, n);
                    check_bits(name, bshape, gq, hq, n);
                    free(gq);
                }
                free(ca);
                free(cr);
                free(ga);
                free(scale);
                free(hq);
                free(hq2);
                G->release(dx);
                G->release(da);
                G->release(dscale);
                G->release(dq);
            }
            free(x);
            free(xb);
            free(xw);
            free(xt);
        }
    }
    // fp8_quantize (fp32 and bf16 x, both formats, row-major, transposed and both): on the
    // CPU, the bytes of fp8_scale_from_amax then the row cast and the column-scaled
    // transpose cast; on the device, equal to the CPU, also at an unaligned x (the scalar
    // path) and with x's amax 0 (the 1e-12 floor); 128 x 256 in bf16 takes the 64 x 64
    // vector tiles of the transposed cast.
    {
        const int qshapes[][2] = {{37, 135}, {64, 96}, {1, 70}, {70, 1}, {300, 517}, {128, 256}};
        for (int ts = 0; ts < 6; ts++) {
            const int rows = qshapes[ts][0], cols = qshapes[ts][1];
            const size_t n = (size_t)rows * cols;
            float *x = hrandn(n + 8, 3.0f);
            for (size_t i = 0; i < n; i += 97) x[i] = ldexpf(x[i], 14);
            if (ts == 3) memset(x, 0, (n + 8) * 4);
            uint16_t *xb = (uint16_t *)malloc((n + 8) * 2);
            C->cast_f32_to_bf16(xb, x, n + 8);
            for (int dt = 0; dt < 2; dt++)
                for (int off = 0; off < 2; off++) {
                    const tetra_dtype xt_ = dt ? TETRA_BF16 : TETRA_F32;
                    const void *hx = dt ? (const void *)(xb + off) : (const void *)(x + off);
                    char bshape[64];
                    snprintf(bshape, sizeof bshape, "%d x %d %s%s", rows, cols, dt ? "bf16" : "f32",
                             off ? " at +1" : "");
                    float am;
                    if (dt) C->amax_bf16(&am, (const uint16_t *)hx, n);
                    else C->amax(&am, (const float *)hx, n);
                    void *dx = dup_gpu(hx, n * (dt ? 2 : 4));
                    float *dam = (float *)dup_gpu(&am, 4), *dinv = (float *)G->alloc(4);
                    uint8_t *dq = (uint8_t *)G->alloc(n), *dqt = (uint8_t *)G->alloc(n);
                    uint8_t *hq = (uint8_t *)malloc(n), *hqt = (uint8_t *)malloc(n), *rq = (uint8_t *)malloc(n),
                            *rqt = (uint8_t *)malloc(n);
                    for (int fi = 0; fi < 2; fi++) {
                        const tetra_dtype fmt = fi ? TETRA_FP8_E5M2 : TETRA_FP8_E4M3;
                        const float fmax = fi ? OPS_FP8_E5M2_MAX : OPS_FP8_E4M3_MAX;
                        float sc, inv, hinv, *colsc = (float *)malloc((size_t)cols * 4);
                        C->fp8_scale_from_amax(&sc, &inv, &am, 1, 0, fmax, 0);
                        for (int c = 0; c < cols; c++) colsc[c] = sc;
                        if (dt) C->cast_bf16_to_fp8(rq, (const uint16_t *)hx, &sc, 0, rows, cols, fmt);
                        else C->cast_f32_to_fp8(rq, (const float *)hx, &sc, 0, rows, cols, fmt);
                        C->cast_transpose_to_fp8(rqt, hx, xt_, colsc, rows, cols, fmt);
                        C->fp8_quantize(hq, hqt, &hinv, hx, xt_, &am, rows, cols, fmt);
                        char name[64];
                        snprintf(name, sizeof name, "fp8_quantize (cpu) %s", fi ? "e5m2" : "e4m3");
                        check_bits(name, bshape, hq, rq, n);
                        check_bits(name, bshape, hqt, rqt, n);
                        check_f32_bits(name, bshape, &hinv, &inv, 1);
                        for (int mode = 0; mode < 3; mode++) { /* rows, transposed, both */
                            snprintf(name, sizeof name, "fp8_quantize %s %s", fi ? "e5m2" : "e4m3",
                                     mode == 0       ? "rows"
                                         : mode == 1 ? "transposed"
                                                     : "both");
                            G->fill((float *)dinv, 0.0f, 1);
                            G->fp8_quantize(mode != 1 ? dq : NULL, mode != 0 ? dqt : NULL, dinv, dx, xt_, dam, rows,
                                            cols, fmt);
                            if (mode != 1) {
                                uint8_t *g = (uint8_t *)from_gpu(dq, n);
                                check_bits(name, bshape, g, rq, n);
                                free(g);
                            }
                            if (mode != 0) {
                                uint8_t *g = (uint8_t *)from_gpu(dqt, n);
                                check_bits(name, bshape, g, rqt, n);
                                free(g);
                            }
                            float *gi = (float *)from_gpu(dinv, 4);
                            check_f32_bits(name, bshape, gi, &inv, 1);
                            free(gi);
                        }
                        free(colsc);
                    }
                    free(hq);
                    free(hqt);
                    free(rq);
                    free(rqt);
                    G->release(dx);
                    G->release(dam);
                    G->release(dinv);
                    G->release(dq);
                    G->release(dqt);
                }
            free(x);
            free(xb);
        }
    }
    // rmsnorm_forward_bf16 with the amax of its output: out and rstd the bits of the call
    // without it (also with more rows than the amax launch has blocks, and none), amax the
    // bits of amax_bf16 over out; on the CPU the same
    {
        const int ashapes[][2] = {{1, 7}, {33, 256}, {2100, 24}, {0, 8}};
        for (int si = 0; si < 4; si++) {
            const int n = ashapes[si][0], c = ashapes[si][1];
            const size_t nc = (size_t)n * c + 1;
            uint16_t *x = hrandn_bf16(nc, 2.0f), *w = hrandn_bf16((size_t)c, 1.0f);
            char ashape[64];
            snprintf(ashape, sizeof ashape, "n%d c%d", n, c);
            uint16_t *d_x = (uint16_t *)dup_gpu(x, nc * 2), *d_w = (uint16_t *)dup_gpu(w, (size_t)c * 2);
            uint16_t *d_o1 = (uint16_t *)G->alloc(nc * 2), *d_o2 = (uint16_t *)G->alloc(nc * 2);
            float *d_r1 = (float *)G->alloc((size_t)n * 4 + 4), *d_r2 = (float *)G->alloc((size_t)n * 4 + 4);
            float *d_am = (float *)G->alloc(8);
            G->rmsnorm_forward_bf16(d_o1, d_r1, NULL, d_x, d_w, n, c, 1e-5f);
            G->rmsnorm_forward_bf16(d_o2, d_r2, d_am, d_x, d_w, n, c, 1e-5f);
            G->amax_bf16(d_am + 1, d_o2, (size_t)n * c);
            void *o1 = from_gpu(d_o1, nc * 2), *o2 = from_gpu(d_o2, nc * 2);
            void *r1 = from_gpu(d_r1, (size_t)n * 4 + 4), *r2 = from_gpu(d_r2, (size_t)n * 4 + 4);
            float *am = (float *)from_gpu(d_am, 8);
            check_bits("rmsnorm_forward_bf16 with amax: out", ashape, o2, o1, (size_t)n * c * 2);
            check_bits("rmsnorm_forward_bf16 with amax: rstd", ashape, r2, r1, (size_t)n * 4);
            check_f32_bits("rmsnorm_forward_bf16 amax == amax_bf16 of out", ashape, am, am + 1, 1);
            uint16_t *co = (uint16_t *)malloc(nc * 2);
            float *cr = (float *)malloc((size_t)n * 4 + 4), cam[2];
            C->rmsnorm_forward_bf16(co, cr, cam, x, w, n, c, 1e-5f);
            C->amax_bf16(cam + 1, co, (size_t)n * c);
            check_f32_bits("rmsnorm_forward_bf16 (cpu) amax == amax_bf16 of out", ashape, cam, cam + 1, 1);
            free(co);
            free(cr);
            free(o1);
            free(o2);
            free(r1);
            free(r2);
            free(am);
            free(x);
            free(w);
            G->release(d_x);
            G->release(d_w);
            G->release(d_o1);
            G->release(d_o2);
            G->release(d_r1);
            G->release(d_r2);
            G->release(d_am);
        }
    }
    // transpose: partial tiles at both edges, one row, one column, several tiles each way
    // (300 x 517), and empty shapes. One guard element past the end, set before the call,
    // must come back untouched (nothing written out of bounds, nothing at all when empty).
    {
        const int shapes[][2] = {{37, 135}, {1, 1000}, {1000, 1}, {32, 64}, {300, 517}, {0, 64}, {64, 0}};
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int rows = shapes[si][0], cols = shapes[si][1];
            const size_t n = (size_t)rows * (size_t)cols;
            float *x = hrandn(n, 1.0f);
            float *hout = (float *)malloc((n + 1) * 4);
            for (size_t i = 0; i <= n; i++) hout[i] = -7.0f;
            float *dx = (float *)dup_gpu(x, (n ? n : 1) * 4), *dout = (float *)dup_gpu(hout, (n + 1) * 4);
            C->transpose(hout, x, rows, cols);
            G->transpose(dout, dx, rows, cols);
            float *gout = (float *)from_gpu(dout, (n + 1) * 4);
            char tshape[64];
            snprintf(tshape, sizeof tshape, "%d x %d (+1 guard)", rows, cols);
            check_bits("transpose", tshape, gout, hout, (n + 1) * 4);
            report("transpose guard untouched", tshape, 0, 0, hout[n] == -7.0f && gout[n] == -7.0f);
            /* the same shapes as bytes (fp8 codes) */
            uint8_t *hb = (uint8_t *)malloc(n + 1), *hbt = (uint8_t *)malloc(n + 1);
            for (size_t i = 0; i < n; i++) hb[i] = (uint8_t)(i * 37u + 11u);
            hbt[n] = 0xa5;
            uint8_t *db = (uint8_t *)dup_gpu(hb, n ? n : 1), *dbt = (uint8_t *)dup_gpu(hbt, n + 1);
            C->transpose_u8(hbt, hb, rows, cols);
            G->transpose_u8(dbt, db, rows, cols);
            uint8_t *gbt = (uint8_t *)from_gpu(dbt, n + 1);
            check_bits("transpose_u8", tshape, gbt, hbt, n + 1);
            report("transpose_u8 guard untouched", tshape, 0, 0, hbt[n] == 0xa5 && gbt[n] == 0xa5);
            free(hb);
            free(hbt);
            free(gbt);
            G->release(db);
            G->release(dbt);
            free(x);
            free(hout);
            free(gout);
            G->release(dx);
            G->release(dout);
        }
    }
}

// ----------------------------------------------------------------------------
// casts

static void test_casts(void) {
    const int rows = 67, cols = 129;
    const size_t n = (size_t)rows * cols;
    float *x = (float *)malloc(n * 4);
    // a spread of magnitudes plus the edge cases: ties, saturation, inf, NaN, signed
    // zero, subnormals of both formats
    for (size_t i = 0; i < n; i++) x[i] = randn() * ldexpf(1.0f, (int)(rnd() % 40) - 24);
    const float special[] = {0.0f,
                             -0.0f,
                             INFINITY,
                             -INFINITY,
                             NAN,
                             448.0f,
                             449.0f,
                             464.0f,
                             -500.0f,
                             57344.0f,
                             61440.0f,
                             1e30f,
                             1.0f + 1.0f / 256,
                             1.0f + 3.0f / 256,
                             ldexpf(1.0f, -9),
                             ldexpf(3.0f, -11),
                             ldexpf(1.0f, -16),
                             ldexpf(1.5f, -17),
                             1e-40f,
                             -1e-45f,
                             3.0e38f,
                             1.00390625f,
                             1.01171875f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) x[i * 7] = special[i];
    float *dx = (float *)dup_gpu(x, n * 4);
    char shape[64];
    snprintf(shape, sizeof shape, "%d x %d + edge cases", rows, cols);

    uint16_t *hb = (uint16_t *)malloc(n * 2), *gb;
    uint16_t *db = (uint16_t *)G->alloc(n * 2);
    C->cast_f32_to_bf16(hb, x, n);
    G->cast_f32_to_bf16(db, dx, n);
    gb = (uint16_t *)from_gpu(db, n * 2);
    check_bits("cast f32->bf16", shape, gb, hb, n * 2);
    float *hf = (float *)malloc(n * 4), *gf;
    float *df = (float *)G->alloc(n * 4);
    C->cast_bf16_to_f32(hf, hb, n);
    G->cast_bf16_to_f32(df, db, n);
    gf = (float *)from_gpu(df, n * 4);
    check_bits("cast bf16->f32", shape, gf, hf, n * 4);
    free(gb);
    free(gf);

    float *scale = hrandn(rows, 1);
    for (int r = 0; r < rows; r++) scale[r] = fabsf(scale[r]) * 4.0f + 0.01f;
    float *dscale = (float *)dup_gpu(scale, rows * 4);
    uint8_t *hq = (uint8_t *)malloc(n), *gq, *dq = (uint8_t *)G->alloc(n);
    const tetra_dtype fmts[2] = {TETRA_FP8_E4M3, TETRA_FP8_E5M2};
    for (int fi = 0; fi < 2; fi++) {
        for (int rowwise = 0; rowwise < 2; rowwise++) {
            for (int with_scale = 0; with_scale < 2; with_scale++) {
                if (rowwise && !with_scale) continue;
                char name[64];
                snprintf(name, sizeof name, "cast f32->%s%s%s", fi ? "e5m2" : "e4m3", rowwise ? " rowwise" : "",
                         with_scale ? "" : " noscale");
                C->cast_f32_to_fp8(hq, x, with_scale ? scale : NULL, rowwise, rows, cols, fmts[fi]);
                G->cast_f32_to_fp8(dq, dx, with_scale ? dscale : NULL, rowwise, rows, cols, fmts[fi]);
                gq = (uint8_t *)from_gpu(dq, n);
                check_bits(name, shape, gq, hq, n);
                free(gq);
                snprintf(name, sizeof name, "cast %s->f32%s", fi ? "e5m2" : "e4m3", rowwise ? " rowwise" : "");
                C->cast_fp8_to_f32(hf, hq, with_scale ? scale : NULL, rowwise, rows, cols, fmts[fi]);
                G->cast_fp8_to_f32(df, dq, with_scale ? dscale : NULL, rowwise, rows, cols, fmts[fi]);
                gf = (float *)from_gpu(df, n * 4);
                check_f32_bits(name, shape, gf, hf, n);
                free(gf);
                snprintf(name, sizeof name, "cast %s->bf16%s", fi ? "e5m2" : "e4m3", rowwise ? " rowwise" : "");
                C->cast_fp8_to_bf16(hb, hq, with_scale ? scale : NULL, rowwise, rows, cols, fmts[fi]);
                G->cast_fp8_to_bf16(db, dq, with_scale ? dscale : NULL, rowwise, rows, cols, fmts[fi]);
                gb = (uint16_t *)from_gpu(db, n * 2);
                check_bits(name, shape, gb, hb, n * 2);
                free(gb);
            }
        }
    }
    // fp8 scales from amax (with zero, tiny, huge and NaN-free inputs)
    float amax[64];
    for (int i = 0; i < 64; i++) amax[i] = fabsf(randn()) * ldexpf(1.0f, (int)(rnd() % 60) - 30);
    amax[0] = 0.0f;
    amax[1] = 1e-20f;
    amax[2] = 448.0f;
    amax[3] = 1.0f;
    float *damax = (float *)dup_gpu(amax, sizeof amax), *dsc = (float *)G->alloc(sizeof amax);
    float *dinv = (float *)G->alloc(sizeof amax);
    for (int pow2 = 0; pow2 < 2; pow2++) {
        float hs[64], hinv[64], *gs, *ginv;
        const char *name = pow2 ? "fp8_scale_from_amax pow2" : "fp8_scale_from_amax";
        // scales only (inv_scale NULL)
        C->fp8_scale_from_amax(hs, NULL, amax, 64, 0, OPS_FP8_E4M3_MAX, pow2);
        G->fp8_scale_from_amax(dsc, NULL, damax, 64, 0, OPS_FP8_E4M3_MAX, pow2);
        gs = (float *)from_gpu(dsc, sizeof amax);
        check_bits(name, "n=64", gs, hs, sizeof hs);
        free(gs);
        // with the dequant factors 1/scale, per element and broadcast from amax[k]: k = 0
        // (amax 0: the 1e-12 floor, the largest scale) and k = 5 (a random one)
        for (int bc = 0; bc < 3; bc++) {
            const int k = bc == 2 ? 5 : 0;
            char sshape[64];
            C->fp8_scale_from_amax(hs, hinv, amax + k, 64, bc != 0, OPS_FP8_E4M3_MAX, pow2);
            G->fp8_scale_from_amax(dsc, dinv, damax + k, 64, bc != 0, OPS_FP8_E4M3_MAX, pow2);
            gs = (float *)from_gpu(dsc, sizeof amax);
            ginv = (float *)from_gpu(dinv, sizeof amax);
            if (bc) snprintf(sshape, sizeof sshape, "n=64 broadcast amax[%d]: scale", k);
            else snprintf(sshape, sizeof sshape, "n=64 with inv_scale: scale");
            check_bits(name, sshape, gs, hs, sizeof hs);
            if (bc) snprintf(sshape, sizeof sshape, "n=64 broadcast amax[%d]: inv_scale", k);
            else snprintf(sshape, sizeof sshape, "n=64 with inv_scale: inv_scale");
            check_bits(name, sshape, ginv, hinv, sizeof hinv);
            free(gs);
            free(ginv);
        }
    }
    G->release(damax);
    G->release(dsc);
    G->release(dinv);
    free(x);
    free(hb);
    free(hf);
    free(scale);
    free(hq);
    G->release(dx);
    G->release(db);
    G->release(df);
    G->release(dscale);
    G->release(dq);
}

// ----------------------------------------------------------------------------
// gemm

typedef struct {
    tetra_dtype at, bt, ct;
    int ta, tb, m, n, k, pad, batch;
    float alpha, beta;
    int scales; // 0 none, 1 tensorwise, 2 rowwise
    int fast;
    double tol;
} gemm_case;

static const char *tname(tetra_dtype t) {
    switch (t) {
    case TETRA_F32: return "f32";
    case TETRA_BF16: return "bf16";
    case TETRA_FP8_E4M3: return "e4m3";
    case TETRA_FP8_E5M2: return "e5m2";
    default: return "?";
    }
}

// random operand of type t: [elems] values stored as t (fp8 quantised at a scale)
static void *make_operand(tetra_dtype t, size_t elems, float qscale) {
    float *x = hrandn(elems, 1);
    void *out;
    if (t == TETRA_F32) return x;
    if (t == TETRA_BF16) {
        out = malloc(elems * 2);
        C->cast_f32_to_bf16((uint16_t *)out, x, elems);
    } else {
        out = malloc(elems);
        C->cast_f32_to_fp8((uint8_t *)out, x, &qscale, 0, 1, (int)elems, t);
    }
    free(x);
    return out;
}

static void c_to_float(float *dst, const void *src, tetra_dtype t, size_t n) {
    if (t == TETRA_F32) memcpy(dst, src, n * 4);
    else
        for (size_t i = 0; i < n; i++) dst[i] = tetra_bf16_to_f32(((const uint16_t *)src)[i]);
}

// sep_c: beta's C in a buffer of its own (c_in), the output NaN before the call; bcast
// (batches): 1 every item reads the one A (stride_a 0), 2 the one B (stride_b 0)
static void run_gemm_c(const gemm_case *gc, int sep_c, int bcast) {
    const int batch = gc->batch > 1 ? gc->batch : 1;
    const int ar = gc->ta ? gc->k : gc->m, ac = gc->ta ? gc->m : gc->k;
    const int br = gc->tb ? gc->n : gc->k, bc = gc->tb ? gc->k : gc->n;
    ops_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.a_type = gc->at;
    g.b_type = gc->bt;
    g.c_type = gc->ct;
    g.trans_a = gc->ta;
    g.trans_b = gc->tb;
    g.m = gc->m;
    g.n = gc->n;
    g.k = gc->k;
    g.lda = ac + gc->pad;
    g.ldb = bc + gc->pad;
    g.ldc = gc->n + gc->pad;
    g.alpha = gc->alpha;
    g.beta = gc->beta;
    g.scale_rowwise = gc->scales == 2;
    g.fast_accum = gc->fast;
    g.batch = gc->batch;
    g.stride_a = bcast == 1 ? 0 : (int64_t)ar * g.lda;
    g.stride_b = bcast == 2 ? 0 : (int64_t)br * g.ldb;
    g.stride_c = (int64_t)gc->m * g.ldc;
    size_t na = bcast == 1 ? (size_t)ar * g.lda : (size_t)g.stride_a * batch;
    size_t nb = bcast == 2 ? (size_t)br * g.ldb : (size_t)g.stride_b * batch, nc = (size_t)g.stride_c * batch;
    size_t ea = tetra_dtype_size(gc->at), eb = tetra_dtype_size(gc->bt), ec = tetra_dtype_size(gc->ct);
    void *a = make_operand(gc->at, na, 64.0f), *b = make_operand(gc->bt, nb, 16.0f);
    // C: random when beta != 0, else NaN (beta = 0 must not read C)
    float *cf = hrandn(nc, 1);
    if (gc->beta == 0.0f)
        for (size_t i = 0; i < nc; i++) cf[i] = NAN;
    void *c = cf;
    if (gc->ct == TETRA_BF16) {
        c = malloc(nc * 2);
        C->cast_f32_to_bf16((uint16_t *)c, cf, nc);
        free(cf);
    }
    float *sa = NULL, *sb = NULL, *dsa = NULL, *dsb = NULL;
    if (gc->scales) {
        int la = gc->scales == 2 ? gc->m : 1, lb = gc->scales == 2 ? gc->n : 1;
        sa = hrandn(la, 1);
        sb = hrandn(lb, 1);
        for (int i = 0; i < la; i++) sa[i] = 1.0f / 64.0f * (0.5f + fabsf(sa[i]));
        for (int i = 0; i < lb; i++) sb[i] = 1.0f / 16.0f * (0.5f + fabsf(sb[i]));
        dsa = (float *)dup_gpu(sa, la * 4);
        dsb = (float *)dup_gpu(sb, lb * 4);
    }
    void *cin = NULL, *dcin = NULL, *inplace = NULL;
    if (sep_c) { // c moves to c_in; the output starts as NaN, so every element must be written
        cin = malloc(nc * ec);
        memcpy(cin, c, nc * ec);
        inplace = malloc(nc * ec);
        memcpy(inplace, c, nc * ec);
        memset(c, 0xff, nc * ec);
        for (size_t r = 0; r < nc / (size_t)g.ldc; r++) // the padding columns are nobody's output
            memcpy((char *)c + (r * (size_t)g.ldc + (size_t)gc->n) * ec,
                   (char *)cin + (r * (size_t)g.ldc + (size_t)gc->n) * ec, (size_t)gc->pad * ec);
        dcin = dup_gpu(cin, nc * ec);
        g.a_scale = sa, g.b_scale = sb;
        C->gemm(inplace, a, b, &g); // the same product with C = D, for the bits
    }
    void *da = dup_gpu(a, na * ea), *db = dup_gpu(b, nb * eb), *dc = dup_gpu(c, nc * ec);
    g.a_scale = sa;
    g.b_scale = sb;
    g.c_in = cin;
    C->gemm(c, a, b, &g);
    g.a_scale = dsa;
    g.b_scale = dsb;
    g.c_in = dcin;
    G->gemm(dc, da, db, &g);
    if (sep_c) {
        void *back = from_gpu(dcin, nc * ec);
        char sh[96];
        snprintf(sh, sizeof sh, "m%d n%d k%d beta %.2g %s", gc->m, gc->n, gc->k, (double)gc->beta, tname(gc->ct));
        check_bits("gemm c_in: CPU equals C = D", sh, c, inplace, nc * ec);
        check_bits("gemm c_in: left unchanged", sh, back, cin, nc * ec);
        free(back);
        free(cin);
        free(inplace);
        G->release(dcin);
    }
    void *gcv = from_gpu(dc, nc * ec);
    float *ref = (float *)malloc(nc * 4), *got = (float *)malloc(nc * 4);
    c_to_float(ref, c, gc->ct, nc);
    c_to_float(got, gcv, gc->ct, nc);
    char name[64], shape[128];
    snprintf(name, sizeof name, "gemm %sx%s->%s [%s]", tname(gc->at), tname(gc->bt), tname(gc->ct),
             cuda_gemm_last_path());
    snprintf(shape, sizeof shape, "%c%c m%d n%d k%d%s%s b%d a%.2g b%.2g%s%s", gc->ta ? 'T' : 'N', gc->tb ? 'T' : 'N',
             gc->m, gc->n, gc->k, gc->pad ? " pad" : "", gc->scales == 1 ? " tw" : (gc->scales == 2 ? " rw" : ""),
             batch, (double)gc->alpha, (double)gc->beta, gc->fast ? " fast" : "",
             bcast == 1       ? " A shared"
                 : bcast == 2 ? " B shared"
                              : "");
    check_close(name, shape, got, ref, nc, gc->tol);
    free(a);
    free(b);
    free(c);
    free(gcv);
    free(ref);
    free(got);
    free(sa);
    free(sb);
    G->release(da);
    G->release(db);
    G->release(dc);
    if (dsa) G->release(dsa);
    if (dsb) G->release(dsb);
}

static void run_gemm(const gemm_case *gc) { run_gemm_c(gc, 0, 0); }

static void test_gemm(void) {
    const tetra_dtype F = TETRA_F32, B = TETRA_BF16, E4 = TETRA_FP8_E4M3, E5 = TETRA_FP8_E5M2;
    // fp32: every transpose, odd sizes, padding, alpha/beta, batches, k = 0, scales
    for (int t = 0; t < 4; t++) {
        int ta = t >> 1, tb = t & 1;
        gemm_case c1 = {F, F, F, ta, tb, 37, 53, 29, 3, 1, 1.3f, 0.7f, 0, 0, 1e-5};
        gemm_case c2 = {F, F, F, ta, tb, 128, 96, 256, 0, 1, 1.0f, 0.0f, 0, 0, 1e-5};
        gemm_case c3 = {F, F, F, ta, tb, 17, 19, 23, 1, 3, 1.0f, 1.0f, 0, 0, 1e-5};
        run_gemm(&c1);
        run_gemm(&c2);
        run_gemm(&c3);
    }
    gemm_case f_small = {F, F, F, 0, 0, 1, 1, 1, 0, 1, 1.0f, 0.0f, 0, 0, 1e-6};
    gemm_case f_k0 = {F, F, F, 0, 1, 9, 7, 0, 1, 1, 1.0f, 0.5f, 0, 0, 0.0};
    gemm_case f_sc = {F, F, F, 0, 1, 33, 40, 50, 0, 1, 0.9f, 1.0f, 1, 0, 1e-5};
    gemm_case f_bf = {F, F, B, 0, 1, 33, 40, 50, 0, 1, 1.0f, 0.0f, 0, 0, 1e-2};
    gemm_case f_mx = {F, B, F, 1, 0, 48, 24, 72, 0, 1, 1.0f, 1.0f, 0, 0, 1e-5};
    run_gemm(&f_small);
    run_gemm(&f_k0);
    run_gemm(&f_sc);
    run_gemm(&f_bf);
    run_gemm(&f_mx);
    // bf16 operands, fp32 or bf16 C
    for (int t = 0; t < 4; t++) {
        int ta = t >> 1, tb = t & 1;
        gemm_case c1 = {B, B, F, ta, tb, 64, 48, 80, 0, 1, 1.0f, 1.0f, 0, 0, 1e-4};
        gemm_case c2 = {B, B, B, ta, tb, 33, 65, 17, 2, 1, 1.0f, 0.0f, 0, 0, 1e-2};
        gemm_case c3 = {B, B, F, ta, tb, 40, 24, 56, 0, 3, 0.5f, 0.0f, 0, 0, 1e-4};
        run_gemm(&c1);
        run_gemm(&c2);
        run_gemm(&c3);
    }
    // fp8: the three linear-layer layouts (y = x W^T: NT; dx = dy W: NN; dW = dy^T x: TN),
    // tensorwise and rowwise scales, fast accumulation, both formats, bf16 output,
    // batches, unsupported pairs and sizes (widened paths)
    const int lay[3][2] = {{0, 1}, {0, 0}, {1, 0}};
    for (int l = 0; l < 3; l++) {
        int ta = lay[l][0], tb = lay[l][1];
        gemm_case c1 = {E4, E4, F, ta, tb, 64, 128, 96, 0, 1, 1.0f, 0.0f, 1, 1, 2e-3};
        gemm_case c2 = {E5, E4, F, ta, tb, 64, 128, 96, 0, 1, 1.0f, 1.0f, 1, 0, 1e-3};
        gemm_case c3 = {E4, E5, B, ta, tb, 48, 32, 64, 0, 1, 1.0f, 0.0f, 1, 0, 1e-2};
        gemm_case c4 = {E4, E4, F, ta, tb, 64, 48, 80, 0, 1, 1.0f, 0.0f, 2, 1, 2e-3};
        gemm_case c5 = {E4, E4, B, ta, tb, 32, 64, 48, 0, 1, 1.0f, 0.0f, 2, 0, 1e-2};
        gemm_case c6 = {E4, E4, F, ta, tb, 32, 32, 48, 16, 2, 1.0f, 1.0f, 1, 0, 1e-3};
        run_gemm(&c1);
        run_gemm(&c2);
        run_gemm(&c3);
        run_gemm(&c4);
        run_gemm(&c5);
        run_gemm(&c6);
    }
    gemm_case e55 = {E5, E5, F, 0, 1, 64, 64, 64, 0, 1, 1.0f, 0.0f, 1, 0, 1e-3};
    gemm_case odd = {E4, E4, F, 0, 1, 40, 24, 20, 0, 1, 1.0f, 0.0f, 1, 0, 1e-3};
    gemm_case oddr = {E4, E5, F, 1, 0, 40, 24, 20, 3, 1, 1.0f, 0.5f, 2, 0, 1e-3};
    gemm_case nos = {E4, E4, F, 0, 1, 32, 32, 32, 0, 1, 2.0f, 0.0f, 0, 0, 1e-3};
    gemm_case mix = {E4, B, F, 0, 1, 32, 48, 64, 0, 1, 1.0f, 0.0f, 1, 0, 1e-4};
    run_gemm(&e55);
    run_gemm(&odd);
    run_gemm(&oddr);
    run_gemm(&nos);
    run_gemm(&mix);
    // beta's C in another buffer (a residual add without a copy): each path that applies beta
    const gemm_case sep[] = {
        {F, F, F, 0, 0, 37, 53, 29, 3, 1, 1.3f, 0.7f, 0, 0, 1e-5},    // fp32 direct
        {B, B, B, 0, 1, 64, 48, 80, 0, 1, 1.0f, 1.0f, 0, 0, 1e-2},    // bf16 direct (y = x W^T + r)
        {F, F, B, 0, 1, 33, 40, 50, 0, 1, 1.0f, 1.0f, 0, 0, 1e-2},    // fp32 -> bf16: the epilogue
        {E4, E4, B, 0, 1, 64, 128, 96, 0, 1, 1.0f, 1.0f, 1, 0, 1e-2}, // fp8 tensorwise
        {E4, E4, B, 0, 1, 32, 64, 48, 0, 1, 1.0f, 1.0f, 2, 0, 1e-2},  // fp8 rowwise
        {F, F, F, 0, 1, 9, 7, 0, 1, 2, 1.0f, 0.5f, 0, 0, 0.0},        // k = 0, batched
    };
    for (size_t i = 0; i < sizeof sep / sizeof sep[0]; i++) run_gemm_c(&sep[i], 1, 0);
    // two linears of one input as one batched GEMM (the model's wk/wv and w1/w3): the
    // forward reads x in both items (y = x W^T), the weight gradient too (dW += dy^T x)
    const gemm_case pair[] = {
        {B, B, B, 0, 1, 64, 48, 80, 0, 2, 1.0f, 0.0f, 0, 0, 1e-2}, // bf16 forward: A (x) shared
        {B, B, F, 1, 0, 48, 80, 64, 0, 2, 1.0f, 1.0f, 0, 0, 1e-2}, // bf16 weight gradient, accumulated: B (x) shared
        {F, F, F, 0, 1, 33, 21, 40, 0, 2, 1.0f, 0.0f, 0, 0, 1e-5}, // fp32 forward
        {F, F, F, 1, 0, 21, 40, 33, 0, 2, 1.0f, 0.0f, 0, 0, 1e-5}, // fp32 weight gradient, overwritten
    };
    for (size_t i = 0; i < sizeof pair / sizeof pair[0]; i++) run_gemm_c(&pair[i], 0, pair[i].ta ? 2 : 1);
}

// ----------------------------------------------------------------------------
// embedding, RMSNorm, RoPE, SwiGLU

static void test_embedding(void) {
    const int n = 300, c = 70, vocab = 50;
    int32_t tok[300];
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(rnd() % vocab);
    const int shards[2][2] = {{0, 50}, {10, 25}}; // (v_start, v_local): whole table, a middle shard
    for (int s = 0; s < 2; s++) {
        int v0 = shards[s][0], vl = shards[s][1];
        char shape[64];
        snprintf(shape, sizeof shape, "n%d c%d vocab[%d,%d)", n, c, v0, v0 + vl);
        float *wte = hrandn((size_t)vl * c, 1), *out = (float *)malloc((size_t)n * c * 4);
        float *dwte = (float *)dup_gpu(wte, (size_t)vl * c * 4), *dout = (float *)G->alloc((size_t)n * c * 4);
        int32_t *dtok = (int32_t *)dup_gpu(tok, sizeof tok);
        C->embedding_forward(out, tok, wte, n, c, v0, vl);
        G->embedding_forward(dout, dtok, dwte, n, c, v0, vl);
        float *got = (float *)from_gpu(dout, (size_t)n * c * 4);
        check_bits("embedding_forward", shape, got, out, (size_t)n * c * 4);
        free(got);
        // backward accumulates into an existing gradient; same order -> same bits
        float *gy = hrandn((size_t)n * c, 1), *dw = hrandn((size_t)vl * c, 1);
        float *dgy = (float *)dup_gpu(gy, (size_t)n * c * 4), *ddw = (float *)dup_gpu(dw, (size_t)vl * c * 4);
        C->embedding_backward(dw, gy, tok, n, c, v0, vl);
        G->embedding_backward(ddw, dgy, dtok, n, c, v0, vl);
        got = (float *)from_gpu(ddw, (size_t)vl * c * 4);
        check_bits("embedding_backward (+=)", shape, got, dw, (size_t)vl * c * 4);
        free(got);
        free(wte);
        free(out);
        free(gy);
        free(dw);
        G->release(dwte);
        G->release(dout);
        G->release(dtok);
        G->release(dgy);
        G->release(ddw);
    }
}

static void test_rmsnorm(void) {
    // The last shape is for the weight gradient alone: past 16384 rows its chunks grow
    // beyond 64 rows. The row kernels (one block a row) are covered by the others, and on
    // the CPU simulator 20000 of their blocks took most of this program's time.
    const int shapes[5][2] = {{1, 7}, {33, 256}, {300, 1000}, {5, 4096}, {20000, 40}};
    for (int si = 0; si < 5; si++) {
        int n = shapes[si][0], c = shapes[si][1], rows = si < 4;
        size_t nc = (size_t)n * c;
        char shape[64];
        snprintf(shape, sizeof shape, "n%d c%d", n, c);
        float *x = hrandn(nc, 2), *w = hrandn(c, 1), *dy = hrandn(nc, 1), *dx0 = hrandn(nc, 1), *dw0 = hrandn(c, 1);
        float *out = (float *)malloc(nc * 4), *rstd = (float *)malloc((size_t)n * 4);
        float *d_x = (float *)dup_gpu(x, nc * 4), *d_w = (float *)dup_gpu(w, c * 4),
              *d_dy = (float *)dup_gpu(dy, nc * 4);
        float *d_out = (float *)G->alloc(nc * 4), *d_rstd = (float *)G->alloc((size_t)n * 4);
        float *d_dx = (float *)dup_gpu(dx0, nc * 4), *d_dw = (float *)dup_gpu(dw0, c * 4);
        C->rmsnorm_forward(out, rstd, x, w, n, c, 1e-5f);
        float *g1 = NULL, *g2 = NULL, *g3 = NULL;
        if (rows) {
            G->rmsnorm_forward(d_out, d_rstd, d_x, d_w, n, c, 1e-5f);
            g1 = (float *)from_gpu(d_out, nc * 4), g2 = (float *)from_gpu(d_rstd, (size_t)n * 4);
            check_close("rmsnorm_forward out", shape, g1, out, nc, 1e-5);
            check_close("rmsnorm_forward rstd", shape, g2, rstd, n, 1e-5);
        }
        // backward halves from the CPU's rstd (isolates each op); both accumulate
        G->copy_h2d(d_rstd, rstd, (size_t)n * 4);
        if (rows) {
            C->rmsnorm_backward_input(dx0, dy, x, w, rstd, n, c, NULL);
            G->rmsnorm_backward_input(d_dx, d_dy, d_x, d_w, d_rstd, n, c, NULL);
            g3 = (float *)from_gpu(d_dx, nc * 4);
            check_close("rmsnorm_backward_input (+=)", shape, g3, dx0, nc, 1e-5);
            // dx = dres + d from another buffer: the in-place bits, dres untouched (both backends)
            float *acc = (float *)malloc(nc * 4), *sep = (float *)malloc(nc * 4);
            memcpy(acc, dx0, nc * 4);
            memset(sep, 0xff, nc * 4);
            C->rmsnorm_backward_input(acc, dy, x, w, rstd, n, c, NULL);
            C->rmsnorm_backward_input(sep, dy, x, w, rstd, n, c, dx0);
            check_bits("rmsnorm_backward_input dres", shape, sep, acc, nc * 4);
            float *d_acc = (float *)dup_gpu(g3, nc * 4), *d_sep = (float *)dup_gpu(sep, nc * 4);
            G->rmsnorm_backward_input(d_acc, d_dy, d_x, d_w, d_rstd, n, c, NULL);
            G->rmsnorm_backward_input(d_sep, d_dy, d_x, d_w, d_rstd, n, c, d_dx);
            float *ga = (float *)from_gpu(d_acc, nc * 4), *gs = (float *)from_gpu(d_sep, nc * 4);
            float *gd = (float *)from_gpu(d_dx, nc * 4);
            check_bits("rmsnorm_backward_input dres (cuda)", shape, gs, ga, nc * 4);
            check_bits("rmsnorm_backward_input dres unchanged (cuda)", shape, gd, g3, nc * 4);
            free(acc), free(sep), free(ga), free(gs), free(gd);
            G->release(d_acc), G->release(d_sep);
        }
        C->rmsnorm_backward_weight(dw0, dy, x, rstd, n, c, 1);
        G->rmsnorm_backward_weight(d_dw, d_dy, d_x, d_rstd, n, c, 1);
        float *g4 = (float *)from_gpu(d_dw, c * 4);
        check_close("rmsnorm_backward_weight (+=)", shape, g4, dw0, c, 1e-5);
        { // accumulate 0 over NaN: the sum alone, as accumulating onto zeros gives it (both backends)
            float *z = (float *)calloc((size_t)c, 4), *o = (float *)malloc((size_t)c * 4);
            for (int j = 0; j < c; j++) o[j] = NAN;
            float *d_z = (float *)dup_gpu(z, (size_t)c * 4), *d_o = (float *)dup_gpu(o, (size_t)c * 4);
            C->rmsnorm_backward_weight(z, dy, x, rstd, n, c, 1);
            C->rmsnorm_backward_weight(o, dy, x, rstd, n, c, 0);
            check_close("rmsnorm_backward_weight (=)", shape, o, z, c, 0.0);
            G->rmsnorm_backward_weight(d_z, d_dy, d_x, d_rstd, n, c, 1);
            G->rmsnorm_backward_weight(d_o, d_dy, d_x, d_rstd, n, c, 0);
            float *gz = (float *)from_gpu(d_z, (size_t)c * 4), *go = (float *)from_gpu(d_o, (size_t)c * 4);
            check_close("rmsnorm_backward_weight (=, cuda)", shape, go, gz, c, 0.0);
            free(z), free(o), free(gz), free(go);
            G->release(d_z), G->release(d_o);
        }
        free(g1);
        free(g2);
        free(g3);
        free(g4);
        free(x);
        free(w);
        free(dy);
        free(dx0);
        free(dw0);
        free(out);
        free(rstd);
        G->release(d_x);
        G->release(d_w);
        G->release(d_dy);
        G->release(d_out);
        G->release(d_rstd);
        G->release(d_dx);
        G->release(d_dw);
    }
}

static void test_rope(void) {
    const int b = 2, s = 37, nh = 3, d = 16, max_pos = 200;
    const size_t n = (size_t)b * s * nh * d;
    float *table = (float *)malloc((size_t)max_pos * d * 4);
    ops_rope_table(table, d, max_pos, 500000.0f, 1, 8.0f, 1.0f, 4.0f, 8192);
    float *dtable = (float *)dup_gpu(table, (size_t)max_pos * d * 4);
    int32_t pos[37];
    for (int i = 0; i < s; i++) pos[i] = (int32_t)(rnd() % max_pos);
    int32_t *dpos = (int32_t *)dup_gpu(pos, sizeof pos);
    for (int mode = 0; mode < 2; mode++) { // 0: offset positions, 1: explicit positions
        for (int bwd = 0; bwd < 2; bwd++) {
            float *x = hrandn(n, 1), *out = (float *)malloc(n * 4);
            float *dx = (float *)dup_gpu(x, n * 4), *dout = (float *)G->alloc(n * 4);
            if (!bwd) {
                C->rope_forward(out, x, table, mode ? pos : NULL, 50, b, s, nh, d, nh * d, nh * d);
                G->rope_forward(dout, dx, dtable, mode ? dpos : NULL, 50, b, s, nh, d, nh * d, nh * d);
                G->rope_forward(dx, dx, dtable, mode ? dpos : NULL, 50, b, s, nh, d, nh * d, nh * d); // in place
            } else {
                C->rope_backward(out, x, table, mode ? pos : NULL, 50, b, s, nh, d, nh * d, nh * d);
                G->rope_backward(dout, dx, dtable, mode ? dpos : NULL, 50, b, s, nh, d, nh * d, nh * d);
                G->rope_backward(dx, dx, dtable, mode ? dpos : NULL, 50, b, s, nh, d, nh * d, nh * d);
            }
            float *g1 = (float *)from_gpu(dout, n * 4), *g2 = (float *)from_gpu(dx, n * 4);
            const char *shape = mode ? "b2 s37 nh3 d16 pos[]" : "b2 s37 nh3 d16 offset 50";
            check_close(bwd ? "rope_backward" : "rope_forward", shape, g1, out, n, 1e-6);
            check_close(bwd ? "rope_backward in place" : "rope_forward in place", shape, g2, out, n, 1e-6);
            free(g1);
            free(g2);
            free(x);
            free(out);
            G->release(dx);
            G->release(dout);
        }
    }
    free(table);
    G->release(dtable);
    G->release(dpos);
}

// One RoPE call of table o: forward or backward (bwd), fp32 or bf16 (bf), rows of out_ld
// and x_ld elements (the backward's dx is out, its dout x)
static void rope_call(const tetra_ops *o, int bf, int bwd, void *out, const void *x, const float *table, int off, int b,
                      int s, int nh, int d, int out_ld, int x_ld) {
    if (bf && bwd)
        o->rope_backward_bf16((uint16_t *)out, NULL, (const uint16_t *)x, table, NULL, off, b, s, nh, d, out_ld, x_ld);
    else if (bf)
        o->rope_forward_bf16((uint16_t *)out, (const uint16_t *)x, table, NULL, off, b, s, nh, d, out_ld, x_ld);
    else if (bwd) o->rope_backward((float *)out, (const float *)x, table, NULL, off, b, s, nh, d, out_ld, x_ld);
    else o->rope_forward((float *)out, (const float *)x, table, NULL, off, b, s, nh, d, out_ld, x_ld);
}

// RoPE on rows of a wider tensor (the q or k columns of a fused projection's [N, H*D +
// 2 KV*D] output), read from them (forward) and written into them (backward), each in
// fp32 and bf16: the CPU's result on the tensor of its own, and the other columns
// untouched. Pitches of whole 16-byte vectors (the vector path) and odd ones (per pair).
static void test_rope_rows(void) {
    const int b = 2, s = 29, nh = 3, d = 16, max_pos = 64, own = nh * d;
    float *table = (float *)malloc((size_t)max_pos * d * 4);
    ops_rope_table(table, d, max_pos, 500000.0f, 0, 1.0f, 1.0f, 4.0f, 8192);
    float *dtable = (float *)dup_gpu(table, (size_t)max_pos * d * 4);
    for (int bf = 0; bf < 2; bf++)
        for (int odd = 0; odd < 2; odd++)
            for (int bwd = 0; bwd < 2; bwd++) {
                const size_t es = bf ? 2 : 4, rows = (size_t)b * s;
                const int ld = own + 2 * d + odd, col = d; /* the block's first column */
                const size_t nw = rows * (size_t)ld, no = rows * (size_t)own;
                void *wide = bf ? (void *)hrandn_bf16(nw, 1) : (void *)hrandn(nw, 1);
                void *x = malloc(no * es), *ref = malloc(no * es);
                for (size_t r = 0; r < rows; r++)
                    memcpy((char *)x + r * own * es, (char *)wide + (r * ld + col) * es, own * es);
                rope_call(C, bf, bwd, ref, x, table, 5, b, s, nh, d, own, own);
                /* forward: from the wide rows into a tensor of its own; backward: from x into the wide rows */
                void *d_wide = dup_gpu(wide, nw * es), *d_x = dup_gpu(x, no * es), *d_out = G->alloc(no * es);
                char *wcol = (char *)d_wide + (size_t)col * es;
                if (bwd) rope_call(G, bf, 1, wcol, d_x, dtable, 5, b, s, nh, d, ld, own);
                else rope_call(G, bf, 0, d_out, wcol, dtable, 5, b, s, nh, d, own, ld);
                char *gw = (char *)from_gpu(d_wide, nw * es), *got = (char *)from_gpu(d_out, no * es);
                if (bwd) { /* the block's columns out of the wide rows; the rest as they were */
                    for (size_t r = 0; r < rows; r++) {
                        memcpy(got + r * own * es, gw + (r * ld + col) * es, own * es);
                        memcpy(gw + (r * ld + col) * es, (char *)wide + (r * ld + col) * es, own * es);
                    }
                }
                char shape[96];
                snprintf(shape, sizeof shape, "b2 s29 nh3 d16 rows of %d%s", ld, bwd ? " (dx)" : " (x)");
                const char *op = bf ? (bwd ? "rope_backward_bf16 into rows" : "rope_forward_bf16 from rows")
                                    : (bwd ? "rope_backward into rows" : "rope_forward from rows");
                if (bf) check_bf16(op, shape, (const uint16_t *)got, (const uint16_t *)ref, no, 1e-6, 1.0);
                else check_close(op, shape, (const float *)got, (const float *)ref, no, 1e-6);
                if (bwd)
                    check_bits(bf ? "rope_backward_bf16 into rows: other columns"
                                  : "rope_backward into rows: other columns",
                               shape, gw, wide, nw * es);
                free(gw);
                free(got);
                free(wide);
                free(x);
                free(ref);
                G->release(d_wide);
                G->release(d_x);
                G->release(d_out);
            }
    free(table);
    G->release(dtable);
}

static void test_swiglu(void) {
    const size_t n = 100007;
    float *a = hrandn(n, 3), *g = hrandn(n, 1), *dy = hrandn(n, 1);
    float *out = (float *)malloc(n * 4), *da = (float *)malloc(n * 4), *dg = (float *)malloc(n * 4);
    float *d_a = (float *)dup_gpu(a, n * 4), *d_g = (float *)dup_gpu(g, n * 4), *d_dy = (float *)dup_gpu(dy, n * 4);
    float *d_out = (float *)G->alloc(n * 4);
    C->swiglu_forward(out, a, g, n);
    G->swiglu_forward(d_out, d_a, d_g, n);
    float *r = (float *)from_gpu(d_out, n * 4);
    check_close("swiglu_forward", "n=100007", r, out, n, 1e-5);
    free(r);
    C->swiglu_backward(da, dg, dy, a, g, n);
    G->swiglu_backward(d_a, d_g, d_dy, d_a, d_g, n); // in place, as the model calls it
    float *ra = (float *)from_gpu(d_a, n * 4), *rg = (float *)from_gpu(d_g, n * 4);
    check_close("swiglu_backward da (in place)", "n=100007", ra, da, n, 1e-5);
    check_close("swiglu_backward dg (in place)", "n=100007", rg, dg, n, 1e-5);
    free(ra);
    free(rg);
    free(a);
    free(g);
    free(dy);
    free(out);
    free(da);
    free(dg);
    G->release(d_a);
    G->release(d_g);
    G->release(d_dy);
    G->release(d_out);
}

// ----------------------------------------------------------------------------
// bf16 activations: each *_bf16 op against the CPU backend's *_bf16 op ("ref:bf16") or,
// where the CPU table lacks it, against the fp32 CPU op on the widened inputs with the
// outputs rounded to nearest even ("ref:f32"), which is the op's contract.
// Tolerances: bf16 outputs within 1 ulp (near-zero units floored at the fp32 twin's
// relative tolerance, see bf16_ulps); fp32 parameter gradients and statistics as the
// fp32 ops (embedding dwte bit for bit: same order of the same fp32 sums).

static const char *ref_tag(const void *cpu_op) { return cpu_op ? "ref:bf16" : "ref:f32"; }

static void test_embedding_bf16(void) {
    const int n = 300, c = 70, vocab = 50;
    int32_t tok[300];
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(rnd() % vocab);
    const int shards[2][2] = {{0, 50}, {10, 25}};
    for (int s = 0; s < 2; s++) {
        int v0 = shards[s][0], vl = shards[s][1];
        const size_t nw = (size_t)vl * c, no = (size_t)n * c;
        char shape[96];
        snprintf(shape, sizeof shape, "n%d c%d vocab[%d,%d) %s", n, c, v0, v0 + vl,
                 ref_tag((const void *)C->embedding_forward_bf16));
        uint16_t *wte = hrandn_bf16(nw, 1), *out = (uint16_t *)malloc(no * 2);
        int32_t *dtok = (int32_t *)dup_gpu(tok, sizeof tok);
        uint16_t *d_wte = (uint16_t *)dup_gpu(wte, nw * 2), *d_out = (uint16_t *)G->alloc(no * 2);
        if (C->embedding_forward_bf16) {
            C->embedding_forward_bf16(out, tok, wte, n, c, v0, vl);
        } else {
            float *wf = widen(wte, nw), *of = (float *)malloc(no * 4);
            C->embedding_forward(of, tok, wf, n, c, v0, vl);
            narrow(out, of, no);
            free(wf);
            free(of);
        }
        G->embedding_forward_bf16(d_out, dtok, d_wte, n, c, v0, vl);
        uint16_t *got = (uint16_t *)from_gpu(d_out, no * 2);
        check_bits("embedding_forward_bf16", shape, got, out, no * 2);
        free(got);
        // backward: fp32 dwte += bf16 dout, in token order as the CPU: the same bits
        snprintf(shape, sizeof shape, "n%d c%d vocab[%d,%d) %s", n, c, v0, v0 + vl,
                 ref_tag((const void *)C->embedding_backward_bf16));
        uint16_t *gy = hrandn_bf16(no, 1);
        float *dw = hrandn(nw, 1);
        uint16_t *d_gy = (uint16_t *)dup_gpu(gy, no * 2);
        float *d_dw = (float *)dup_gpu(dw, nw * 4);
        if (C->embedding_backward_bf16) {
            C->embedding_backward_bf16(dw, gy, tok, n, c, v0, vl);
        } else {
            float *gf = widen(gy, no);
            C->embedding_backward(dw, gf, tok, n, c, v0, vl);
            free(gf);
        }
        G->embedding_backward_bf16(d_dw, d_gy, dtok, n, c, v0, vl);
        float *gw = (float *)from_gpu(d_dw, nw * 4);
        check_bits("embedding_backward_bf16 (+=)", shape, gw, dw, nw * 4);
        free(gw);
        free(wte);
        free(out);
        free(gy);
        free(dw);
        G->release(dtok);
        G->release(d_wte);
        G->release(d_out);
        G->release(d_gy);
        G->release(d_dw);
    }
}

static void test_rmsnorm_bf16(void) {
    // 1100 rows: more than the 1024 blocks of an amax launch, so a block takes several
    const int shapes[5][2] = {{1, 7}, {33, 256}, {300, 1000}, {5, 4096}, {1100, 32}};
    for (int si = 0; si < 5; si++) {
        int n = shapes[si][0], c = shapes[si][1];
        size_t nc = (size_t)n * c;
        char shape[96];
        uint16_t *x = hrandn_bf16(nc, 2), *w = hrandn_bf16(c, 1), *dy = hrandn_bf16(nc, 1), *dx = hrandn_bf16(nc, 1);
        float *dw = hrandn(c, 1);
        uint16_t *out = (uint16_t *)malloc(nc * 2);
        float *rstd = (float *)malloc((size_t)n * 4);
        uint16_t *d_x = (uint16_t *)dup_gpu(x, nc * 2), *d_w = (uint16_t *)dup_gpu(w, c * 2);
        uint16_t *d_dy = (uint16_t *)dup_gpu(dy, nc * 2), *d_dx = (uint16_t *)dup_gpu(dx, nc * 2);
        uint16_t *d_out = (uint16_t *)G->alloc(nc * 2);
        float *d_rstd = (float *)G->alloc((size_t)n * 4), *d_dw = (float *)dup_gpu(dw, c * 4);
        float *xf = widen(x, nc), *wf = widen(w, c), *dyf = widen(dy, nc);

        snprintf(shape, sizeof shape, "n%d c%d %s", n, c, ref_tag((const void *)C->rmsnorm_forward_bf16));
        if (C->rmsnorm_forward_bf16) {
            C->rmsnorm_forward_bf16(out, rstd, NULL, x, w, n, c, 1e-5f);
        } else {
            float *of = (float *)malloc(nc * 4);
            C->rmsnorm_forward(of, rstd, xf, wf, n, c, 1e-5f);
            narrow(out, of, nc);
            free(of);
        }
        G->rmsnorm_forward_bf16(d_out, d_rstd, NULL, d_x, d_w, n, c, 1e-5f);
        uint16_t *g1 = (uint16_t *)from_gpu(d_out, nc * 2);
        float *g2 = (float *)from_gpu(d_rstd, (size_t)n * 4);
        check_bf16("rmsnorm_forward_bf16 out", shape, g1, out, nc, 1e-5, 1.0);
        check_close("rmsnorm_forward_bf16 rstd", shape, g2, rstd, n, 1e-5);

        // backward halves from the CPU's rstd; dx (bf16) and dw (fp32) accumulate
        G->copy_h2d(d_rstd, rstd, (size_t)n * 4);
        snprintf(shape, sizeof shape, "n%d c%d %s", n, c, ref_tag((const void *)C->rmsnorm_backward_input_bf16));
        if (C->rmsnorm_backward_input_bf16) {
            C->rmsnorm_backward_input_bf16(dx, NULL, dy, x, w, rstd, n, c, NULL);
        } else {
            float *dxf = widen(dx, nc);
            C->rmsnorm_backward_input(dxf, dyf, xf, wf, rstd, n, c, NULL);
            narrow(dx, dxf, nc);
            free(dxf);
        }
        G->rmsnorm_backward_input_bf16(d_dx, NULL, d_dy, d_x, d_w, d_rstd, n, c, NULL);
        uint16_t *g3 = (uint16_t *)from_gpu(d_dx, nc * 2);
        check_bf16("rmsnorm_bwd_input_bf16 (+=)", shape, g3, dx, nc, 1e-5, 1.0);
        { // dx = bf16(dres + d) from another buffer: the in-place bits on the device, dres untouched
            uint16_t *nan16 = (uint16_t *)malloc(nc * 2);
            memset(nan16, 0xff, nc * 2);
            uint16_t *d_acc = (uint16_t *)dup_gpu(g3, nc * 2), *d_sep = (uint16_t *)dup_gpu(nan16, nc * 2);
            G->rmsnorm_backward_input_bf16(d_acc, NULL, d_dy, d_x, d_w, d_rstd, n, c, NULL);
            G->rmsnorm_backward_input_bf16(d_sep, NULL, d_dy, d_x, d_w, d_rstd, n, c, d_dx);
            uint16_t *ga = (uint16_t *)from_gpu(d_acc, nc * 2), *gs = (uint16_t *)from_gpu(d_sep, nc * 2);
            uint16_t *gd = (uint16_t *)from_gpu(d_dx, nc * 2);
            check_bits("rmsnorm_bwd_input_bf16 dres (cuda)", shape, gs, ga, nc * 2);
            check_bits("rmsnorm_bwd_input_bf16 dres unchanged (cuda)", shape, gd, g3, nc * 2);
            if (C->rmsnorm_backward_input_bf16) {
                uint16_t *acc = (uint16_t *)malloc(nc * 2);
                memcpy(acc, dx, nc * 2);
                C->rmsnorm_backward_input_bf16(acc, NULL, dy, x, w, rstd, n, c, NULL);
                C->rmsnorm_backward_input_bf16(nan16, NULL, dy, x, w, rstd, n, c, dx);
                check_bits("rmsnorm_bwd_input_bf16 dres", shape, nan16, acc, nc * 2);
                free(acc);
            }
            free(nan16), free(ga), free(gs), free(gd);
            G->release(d_acc), G->release(d_sep);
        }
        { // the amax of what it writes (amax_bf16's over dx) in the same launch, dx unchanged by it
            uint16_t *d_am = (uint16_t *)G->alloc(nc * 2), *d_no = (uint16_t *)G->alloc(nc * 2);
            float *d_amax = (float *)G->alloc(4), ref = 0.0f;
            G->rmsnorm_backward_input_bf16(d_am, d_amax, d_dy, d_x, d_w, d_rstd, n, c, d_dx);
            G->rmsnorm_backward_input_bf16(d_no, NULL, d_dy, d_x, d_w, d_rstd, n, c, d_dx);
            uint16_t *gam = (uint16_t *)from_gpu(d_am, nc * 2), *gno = (uint16_t *)from_gpu(d_no, nc * 2);
            float *gmax = (float *)from_gpu(d_amax, 4);
            C->amax_bf16(&ref, gam, nc);
            check_bits("rmsnorm_bwd_input_bf16 amax (cuda)", shape, gmax, &ref, 4);
            check_bits("rmsnorm_bwd_input_bf16 dx with amax (cuda)", shape, gam, gno, nc * 2);
            if (C->rmsnorm_backward_input_bf16) {
                uint16_t *cam = (uint16_t *)malloc(nc * 2), *cno = (uint16_t *)malloc(nc * 2);
                float camax = -1.0f, cref = 0.0f;
                C->rmsnorm_backward_input_bf16(cam, &camax, dy, x, w, rstd, n, c, dx);
                C->rmsnorm_backward_input_bf16(cno, NULL, dy, x, w, rstd, n, c, dx);
                C->amax_bf16(&cref, cam, nc);
                check_bits("rmsnorm_bwd_input_bf16 amax", shape, &camax, &cref, 4);
                check_bits("rmsnorm_bwd_input_bf16 dx with amax", shape, cam, cno, nc * 2);
                free(cam), free(cno);
            }
            free(gam), free(gno), free(gmax);
            G->release(d_am), G->release(d_no), G->release(d_amax);
        }

        snprintf(shape, sizeof shape, "n%d c%d %s", n, c, ref_tag((const void *)C->rmsnorm_backward_weight_bf16));
        if (C->rmsnorm_backward_weight_bf16) C->rmsnorm_backward_weight_bf16(dw, dy, x, rstd, n, c, 1);
        else C->rmsnorm_backward_weight(dw, dyf, xf, rstd, n, c, 1);
        G->rmsnorm_backward_weight_bf16(d_dw, d_dy, d_x, d_rstd, n, c, 1);
        float *g4 = (float *)from_gpu(d_dw, c * 4);
        check_close("rmsnorm_bwd_weight_bf16 (+=)", shape, g4, dw, c, 1e-5);
        free(g1);
        free(g2);
        free(g3);
        free(g4);
        free(x);
        free(w);
        free(dy);
        free(dx);
        free(dw);
        free(out);
        free(rstd);
        free(xf);
        free(wf);
        free(dyf);
        G->release(d_x);
        G->release(d_w);
        G->release(d_dy);
        G->release(d_dx);
        G->release(d_out);
        G->release(d_rstd);
        G->release(d_dw);
    }
}

// RoPE's two CUDA paths (16-byte vectors; one pair a thread when the head dim or an
// address does not allow vectors) against the CPU: bf16 bit for bit, fp32 within 1e-6
static void test_rope_paths(void) {
    const int b = 2, s = 9, nh = 3, max_pos = 64;
    const int dims[3] = {16, 16, 6}, shift[3] = {0, 1, 0}; // aligned, unaligned by one element, d % 8 != 0
    for (int c = 0; c < 3; c++) {
        const int d = dims[c];
        const size_t n = (size_t)b * s * nh * d;
        float *table = (float *)malloc((size_t)max_pos * d * 4);
        ops_rope_table(table, d, max_pos, 500000.0f, 0, 1.0f, 1.0f, 1.0f, 8192);
        float *dtable = (float *)dup_gpu(table, (size_t)max_pos * d * 4);
        char shape[64];
        snprintf(shape, sizeof shape, "b%d s%d nh%d d%d%s", b, s, nh, d, shift[c] ? " unaligned" : "");
        for (int bf = 0; bf < 2; bf++) {
            const size_t es = bf ? 2 : 4, k = (size_t)shift[c];
            void *x = bf ? (void *)hrandn_bf16(n + 1, 1) : (void *)hrandn(n + 1, 1);
            void *ref = malloc((n + 1) * es), *dx = dup_gpu(x, (n + 1) * es), *dy = G->alloc((n + 1) * es);
            for (int bwd = 0; bwd < 2; bwd++) {
                rope_call(C, bf, bwd, (char *)ref + k * es, (char *)x + k * es, table, 3, b, s, nh, d, nh * d, nh * d);
                rope_call(G, bf, bwd, (char *)dy + k * es, (char *)dx + k * es, dtable, 3, b, s, nh, d, nh * d, nh * d);
                void *got = from_gpu(dy, (n + 1) * es);
                char op[64];
                snprintf(op, sizeof op, "rope_%s%s paths", bwd ? "backward" : "forward", bf ? "_bf16" : "");
                if (bf) check_bits(op, shape, (char *)got + k * es, (char *)ref + k * es, n * es);
                else
                    check_close(op, shape, (float *)got + k, (float *)ref + k, n, 1e-6); // fp32: the CPU's own rounding
                free(got);
            }
            free(x), free(ref);
            G->release(dx), G->release(dy);
        }
        free(table);
        G->release(dtable);
    }
}

static void test_rope_bf16(void) {
    const int b = 2, s = 37, nh = 3, d = 16, max_pos = 200;
    const size_t n = (size_t)b * s * nh * d;
    float *table = (float *)malloc((size_t)max_pos * d * 4);
    ops_rope_table(table, d, max_pos, 500000.0f, 1, 8.0f, 1.0f, 4.0f, 8192);
    float *dtable = (float *)dup_gpu(table, (size_t)max_pos * d * 4);
    int32_t pos[37];
    for (int i = 0; i < s; i++) pos[i] = (int32_t)(rnd() % max_pos);
    int32_t *dpos = (int32_t *)dup_gpu(pos, sizeof pos);
    for (int mode = 0; mode < 2; mode++) {
        for (int bwd = 0; bwd < 2; bwd++) {
            uint16_t *x = hrandn_bf16(n, 1), *out = (uint16_t *)malloc(n * 2);
            uint16_t *dx = (uint16_t *)dup_gpu(x, n * 2), *dout = (uint16_t *)G->alloc(n * 2);
            const int32_t *hp = mode ? pos : NULL, *gp = mode ? dpos : NULL;
            const void *cop = bwd ? (const void *)C->rope_backward_bf16 : (const void *)C->rope_forward_bf16;
            if (cop && bwd) {
                C->rope_backward_bf16(out, NULL, x, table, hp, 50, b, s, nh, d, nh * d, nh * d);
            } else if (cop) {
                C->rope_forward_bf16(out, x, table, hp, 50, b, s, nh, d, nh * d, nh * d);
            } else {
                float *xf = widen(x, n), *of = (float *)malloc(n * 4);
                (bwd ? C->rope_backward : C->rope_forward)(of, xf, table, hp, 50, b, s, nh, d, nh * d, nh * d);
                narrow(out, of, n);
                free(xf);
                free(of);
            }
            if (!bwd) {
                G->rope_forward_bf16(dout, dx, dtable, gp, 50, b, s, nh, d, nh * d, nh * d);
                G->rope_forward_bf16(dx, dx, dtable, gp, 50, b, s, nh, d, nh * d, nh * d); // in place
            } else {
                /* in place with the amax of what it writes: the bits amax_bf16 finds there */
                float *d_am = (float *)G->alloc(8);
                G->rope_backward_bf16(dout, NULL, dx, dtable, gp, 50, b, s, nh, d, nh * d, nh * d);
                G->rope_backward_bf16(dx, d_am, dx, dtable, gp, 50, b, s, nh, d, nh * d, nh * d);
                G->amax_bf16(d_am + 1, dx, n);
                float *g_am = (float *)from_gpu(d_am, 8);
                check_f32_bits("rope_backward_bf16 amax == amax_bf16 of dx", "b2 s37 nh3 d16", g_am, g_am + 1, 1);
                free(g_am);
                G->release(d_am);
            }
            uint16_t *g1 = (uint16_t *)from_gpu(dout, n * 2), *g2 = (uint16_t *)from_gpu(dx, n * 2);
            char shape[96];
            snprintf(shape, sizeof shape, "b2 s37 nh3 d16 %s %s", mode ? "pos[]" : "offset 50", ref_tag(cop));
            check_bf16(bwd ? "rope_backward_bf16" : "rope_forward_bf16", shape, g1, out, n, 1e-6, 1.0);
            check_bf16(bwd ? "rope_backward_bf16 in place" : "rope_forward_bf16 in place", shape, g2, out, n, 1e-6,
                       1.0);
            free(g1);
            free(g2);
            free(x);
            free(out);
            G->release(dx);
            G->release(dout);
        }
    }
    free(table);
    G->release(dtable);
    G->release(dpos);
}

static void test_swiglu_bf16(void) {
    const size_t n = 100007;
    uint16_t *a = hrandn_bf16(n, 3), *g = hrandn_bf16(n, 1), *dy = hrandn_bf16(n, 1);
    uint16_t *out = (uint16_t *)malloc(n * 2), *da = (uint16_t *)malloc(n * 2), *dg = (uint16_t *)malloc(n * 2);
    uint16_t *d_a = (uint16_t *)dup_gpu(a, n * 2), *d_g = (uint16_t *)dup_gpu(g, n * 2);
    uint16_t *d_dy = (uint16_t *)dup_gpu(dy, n * 2), *d_out = (uint16_t *)G->alloc(n * 2);
    float *af = widen(a, n), *gf = widen(g, n), *dyf = widen(dy, n);
    char shape[64];
    snprintf(shape, sizeof shape, "n=100007 %s", ref_tag((const void *)C->swiglu_forward_bf16));
    if (C->swiglu_forward_bf16) {
        C->swiglu_forward_bf16(out, NULL, a, g, n);
    } else {
        float *of = (float *)malloc(n * 4);
        C->swiglu_forward(of, af, gf, n);
        narrow(out, of, n);
        free(of);
    }
    /* with the amax of what it writes: the bits amax_bf16 finds in the output */
    float *d_am = (float *)G->alloc(4 * sizeof(float));
    G->swiglu_forward_bf16(d_out, d_am, d_a, d_g, n);
    uint16_t *r = (uint16_t *)from_gpu(d_out, n * 2);
    check_bf16("swiglu_forward_bf16", shape, r, out, n, 1e-5, 1.0);
    G->amax_bf16(d_am + 2, d_out, n);
    float *g_am = (float *)from_gpu(d_am, 4 * sizeof(float));
    check_f32_bits("swiglu_forward_bf16 amax == amax_bf16 of out", shape, g_am, g_am + 2, 1);
    free(g_am);
    free(r);
    snprintf(shape, sizeof shape, "n=100007 %s", ref_tag((const void *)C->swiglu_backward_bf16));
    if (C->swiglu_backward_bf16) {
        float c_am[2], c_am2[2];
        C->swiglu_backward_bf16(da, dg, c_am, c_am + 1, dy, a, g, n);
        C->amax_bf16(c_am2, da, n);
        C->amax_bf16(c_am2 + 1, dg, n);
        check_f32_bits("swiglu_backward_bf16 (cpu) amax == amax_bf16 of da, dg", shape, c_am, c_am2, 2);
    } else {
        float *daf = (float *)malloc(n * 4), *dgf = (float *)malloc(n * 4);
        C->swiglu_backward(daf, dgf, dyf, af, gf, n);
        narrow(da, daf, n);
        narrow(dg, dgf, n);
        free(daf);
        free(dgf);
    }
    G->swiglu_backward_bf16(d_a, d_g, d_am, d_am + 1, d_dy, d_a, d_g, n); // in place, as the model calls it
    uint16_t *ra = (uint16_t *)from_gpu(d_a, n * 2), *rg = (uint16_t *)from_gpu(d_g, n * 2);
    check_bf16("swiglu_bwd_bf16 da (in place)", shape, ra, da, n, 1e-5, 1.0);
    check_bf16("swiglu_bwd_bf16 dg (in place)", shape, rg, dg, n, 1e-5, 1.0);
    G->amax_bf16(d_am + 2, d_a, n);
    G->amax_bf16(d_am + 3, d_g, n);
    g_am = (float *)from_gpu(d_am, 4 * sizeof(float));
    check_f32_bits("swiglu_backward_bf16 amax == amax_bf16 of da, dg", shape, g_am, g_am + 2, 2);
    free(g_am);
    G->release(d_am);
    free(ra);
    free(rg);
    free(a);
    free(g);
    free(dy);
    free(out);
    free(da);
    free(dg);
    free(af);
    free(gf);
    free(dyf);
    G->release(d_a);
    G->release(d_g);
    G->release(d_dy);
    G->release(d_out);
}

// ----------------------------------------------------------------------------
// attention

// Document ids [b, n] (host) for block-causal cases: row r is cut into documents whose
// lengths cycle through lens[] from index r (so rows differ); ids rise by 2 from 3 (only
// their order matters).
static int32_t *doc_ids(int b, int n, const int *lens, int nlens) {
    int32_t *d = (int32_t *)malloc((size_t)b * n * sizeof(int32_t));
    for (int r = 0; r < b; r++) {
        int id = 3, li = r, left = lens[r % nlens];
        for (int p = 0; p < n; p++, left--) {
            if (left == 0) id += 2, li++, left = lens[li % nlens];
            d[(size_t)r * n + p] = id;
        }
    }
    return d;
}

// doc: NULL, or the document ids [b, doc_len] (host memory) of a block-causal case; the
// CPU reads them there, the device from its own copy.
static void test_attention_case(int b, int sq, int sk, int h, int kv, int d, int causal, int qo, int ko,
                                const int32_t *doc, int doc_len) {
    ops_attn_shape s = {b, sq, sk, h, kv, d, 1.0f / sqrtf((float)d), causal, qo, ko, doc, doc_len};
    ops_attn_shape sg = s;
    if (doc) sg.doc = (const int32_t *)dup_gpu(doc, (size_t)b * doc_len * sizeof(int32_t));
    const size_t nq = (size_t)b * sq * h * d, nk = (size_t)b * sk * kv * d, nl = (size_t)b * h * sq;
    char shape[96];
    snprintf(shape, sizeof shape, "b%d sq%d sk%d h%d kv%d d%d %s q@%d k@%d", b, sq, sk, h, kv, d,
             doc ? "block_causal" : (causal ? "causal" : "full"), qo, ko);
    float *q = hrandn(nq, 1), *k = hrandn(nk, 1), *v = hrandn(nk, 1), *dout = hrandn(nq, 1);
    float *out = (float *)malloc(nq * 4), *lse = (float *)malloc(nl * 4);
    float *dq = hrandn(nq, 1), *dk = hrandn(nk, 1), *dv = hrandn(nk, 1); // accumulated into
    float *d_q = (float *)dup_gpu(q, nq * 4), *d_k = (float *)dup_gpu(k, nk * 4), *d_v = (float *)dup_gpu(v, nk * 4);
    float *d_do = (float *)dup_gpu(dout, nq * 4), *d_out = (float *)G->alloc(nq * 4),
          *d_lse = (float *)G->alloc(nl * 4);
    float *d_dq = (float *)dup_gpu(dq, nq * 4), *d_dk = (float *)dup_gpu(dk, nk * 4),
          *d_dv = (float *)dup_gpu(dv, nk * 4);
    void *ws = G->alloc(G->attention_workspace_size(&s));

    C->attention_forward(out, lse, q, k, v, &s, NULL);
    G->attention_forward(d_out, d_lse, d_q, d_k, d_v, &sg, ws);
    float *g_out = (float *)from_gpu(d_out, nq * 4), *g_lse = (float *)from_gpu(d_lse, nl * 4);
    check_close("attention_forward out", shape, g_out, out, nq, 1e-4);
    check_close("attention_forward lse", shape, g_lse, lse, nl, 1e-4);

    // backward from the CPU's out and lse (isolates the op); half the cases with NULL ws
    G->copy_h2d(d_out, out, nq * 4);
    G->copy_h2d(d_lse, lse, nl * 4);
    C->attention_backward(dq, dk, dv, dout, q, k, v, out, lse, &s, NULL);
    G->attention_backward(d_dq, d_dk, d_dv, d_do, d_q, d_k, d_v, d_out, d_lse, &sg, (sq & 1) ? NULL : ws);
    float *g_dq = (float *)from_gpu(d_dq, nq * 4), *g_dk = (float *)from_gpu(d_dk, nk * 4);
    float *g_dv = (float *)from_gpu(d_dv, nk * 4);
    check_close("attention_backward dq (+=)", shape, g_dq, dq, nq, 1e-4);
    check_close("attention_backward dk (+=)", shape, g_dk, dk, nk, 1e-4);
    check_close("attention_backward dv (+=)", shape, g_dv, dv, nk, 1e-4);

    free(q);
    free(k);
    free(v);
    free(dout);
    free(out);
    free(lse);
    free(dq);
    free(dk);
    free(dv);
    free(g_out);
    free(g_lse);
    free(g_dq);
    free(g_dk);
    free(g_dv);
    G->release(d_q);
    G->release(d_k);
    G->release(d_v);
    G->release(d_do);
    G->release(d_out);
    G->release(d_lse);
    G->release(d_dq);
    G->release(d_dk);
    G->release(d_dv);
    G->release(ws);
    if (doc) G->release((void *)sg.doc);
}

static void test_attention(void) {
    test_attention_case(1, 1, 1, 1, 1, 16, 1, 0, 0, NULL, 0);
    test_attention_case(2, 67, 67, 4, 2, 16, 1, 0, 0, NULL, 0); // the debug model's head dim, GQA
    test_attention_case(1, 130, 130, 8, 8, 64, 1, 0, 0, NULL, 0);
    test_attention_case(2, 45, 77, 6, 3, 40, 0, 0, 0, NULL, 0);    // full attention, odd head dim
    test_attention_case(1, 64, 64, 4, 1, 128, 1, 64, 0, NULL, 0);  // ring block: every key visible
    test_attention_case(1, 64, 96, 4, 2, 128, 1, 0, 32, NULL, 0);  // ring block: rows 0..31 see nothing
    test_attention_case(1, 50, 50, 2, 2, 32, 1, 0, 100, NULL, 0);  // fully masked block pair
    test_attention_case(1, 33, 70, 4, 4, 256, 1, 40, 0, NULL, 0);  // head dim 256
    test_attention_case(1, 200, 200, 8, 2, 128, 1, 0, 0, NULL, 0); // Llama 3 head dim, GQA 4, many tiles
    test_attention_case(3, 97, 97, 2, 1, 24, 1, 0, 0, NULL, 0);
    // block_causal: boundaries on the kernels' 32- and 64-row tile edges and inside tiles,
    // one whole-sequence document, 1-token documents, and a ring block whose first rows'
    // document starts after its keys end (they see nothing: out 0, lse -inf)
    static const int edges[] = {1, 31, 32, 64, 5, 17}, whole[] = {130}, single[] = {1}, ring[] = {40, 100, 52};
    int32_t *doc = doc_ids(2, 150, edges, 6);
    test_attention_case(2, 150, 150, 8, 2, 16, 1, 0, 0, doc, 150);
    free(doc);
    doc = doc_ids(1, 130, whole, 1);
    test_attention_case(1, 130, 130, 4, 4, 128, 1, 0, 0, doc, 130);
    free(doc);
    doc = doc_ids(1, 70, single, 1);
    test_attention_case(1, 70, 70, 2, 1, 32, 1, 0, 0, doc, 70);
    free(doc);
    doc = doc_ids(1, 192, ring, 3);
    test_attention_case(1, 64, 64, 4, 2, 64, 1, 128, 0, doc, 192);
    test_attention_case(1, 64, 64, 4, 2, 64, 1, 128, 64, doc, 192);
    free(doc);

    // merge of partial results (incl. rows where either side saw nothing)
    const int b = 2, sq = 41, h = 3, d = 24;
    const size_t no = (size_t)b * sq * h * d, nl = (size_t)b * h * sq;
    float *o1 = hrandn(no, 1), *o2 = hrandn(no, 1), *l1 = hrandn(nl, 2), *l2 = hrandn(nl, 2);
    for (size_t i = 0; i < nl; i += 7) l1[i] = -INFINITY;
    for (size_t i = 3; i < nl; i += 11) l2[i] = -INFINITY;
    float *d1 = (float *)dup_gpu(o1, no * 4), *d2 = (float *)dup_gpu(o2, no * 4);
    float *e1 = (float *)dup_gpu(l1, nl * 4), *e2 = (float *)dup_gpu(l2, nl * 4);
    C->attention_merge(o1, l1, o2, l2, b, sq, h, d);
    G->attention_merge(d1, e1, d2, e2, b, sq, h, d);
    float *go = (float *)from_gpu(d1, no * 4), *gl = (float *)from_gpu(e1, nl * 4);
    check_close("attention_merge out", "b2 sq41 h3 d24 (-inf rows)", go, o1, no, 1e-5);
    check_close("attention_merge lse", "b2 sq41 h3 d24 (-inf rows)", gl, l1, nl, 1e-5);
    free(o1);
    free(o2);
    free(l1);
    free(l2);
    free(go);
    free(gl);
    G->release(d1);
    G->release(d2);
    G->release(e1);
    G->release(e2);
}

// bf16 attention against the CPU's bf16 op or, while the CPU table lacks it, the fp32 op
// on the widened inputs (out and dq/dk/dv rounded; the bf16 backward WRITES its
// gradients, so the device buffers start as garbage). The built-in path (always in the
// simulator, and for shapes cuDNN does not take): bf16 outputs within 1 ulp, units
// floored at 1e-4 of the largest value (the fp32 attention tolerance), lse 1e-4. cuDNN's
// fused SDPA rounds P and dS to bf16 inside: out 2e-2, gradients 5e-2, lse 1e-3 relative to
// the largest reference value.
// The CPU's bf16 attention forward and backward (the fp32 ops over widened inputs, rounded,
// where the CPU backend has no bf16 op): what the bf16 attention tests compare with.
static void attention_bf16_reference(uint16_t *out, float *lse, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                                     const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *dout,
                                     const ops_attn_shape *s) {
    const size_t nq = (size_t)s->b * s->sq * s->h * s->d, nk = (size_t)s->b * s->sk * s->kv * s->d;
    float *qf = widen(q, nq), *kf = widen(k, nk), *vf = widen(v, nk), *of = (float *)malloc(nq * 4);
    if (C->attention_forward_bf16) {
        C->attention_forward_bf16(out, lse, q, k, v, s, NULL);
    } else {
        C->attention_forward(of, lse, qf, kf, vf, s, NULL);
        narrow(out, of, nq);
    }
    if (C->attention_backward_bf16) {
        C->attention_backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, s, NULL);
    } else {
        float *wo = widen(out, nq), *gf = widen(dout, nq);
        float *dqf = (float *)calloc(nq, 4), *dkf = (float *)calloc(nk, 4), *dvf = (float *)calloc(nk, 4);
        C->attention_backward(dqf, dkf, dvf, gf, qf, kf, vf, wo, lse, s, NULL);
        narrow(dq, dqf, nq);
        narrow(dk, dkf, nk);
        narrow(dv, dvf, nk);
        float *tmp[] = {wo, gf, dqf, dkf, dvf};
        for (int i = 0; i < 5; i++) free(tmp[i]);
    }
    float *tmp[] = {qf, kf, vf, of};
    for (int i = 0; i < 4; i++) free(tmp[i]);
}

static void test_attention_bf16_case(int b, int sq, int sk, int h, int kv, int d, int causal, int qo, int ko,
                                     const int32_t *doc, int doc_len) {
    ops_attn_shape s = {b, sq, sk, h, kv, d, 1.0f / sqrtf((float)d), causal, qo, ko, doc, doc_len};
    ops_attn_shape sg = s;
    if (doc) sg.doc = (const int32_t *)dup_gpu(doc, (size_t)b * doc_len * sizeof(int32_t));
    const char *mask = doc ? "block_causal" : (causal ? "causal" : "full");
    const size_t nq = (size_t)b * sq * h * d, nk = (size_t)b * sk * kv * d, nl = (size_t)b * h * sq;
    char shape[128];
    uint16_t *q = hrandn_bf16(nq, 1), *k = hrandn_bf16(nk, 1), *v = hrandn_bf16(nk, 1), *dout = hrandn_bf16(nq, 1);
    uint16_t *out = (uint16_t *)malloc(nq * 2), *dq = (uint16_t *)malloc(nq * 2);
    uint16_t *dk = (uint16_t *)malloc(nk * 2), *dv = (uint16_t *)malloc(nk * 2);
    float *lse = (float *)malloc(nl * 4);
    const int cpu_fwd = C->attention_forward_bf16 != NULL, cpu_bwd = C->attention_backward_bf16 != NULL;
    attention_bf16_reference(out, lse, dq, dk, dv, q, k, v, dout, &s);
    uint16_t *d_q = (uint16_t *)dup_gpu(q, nq * 2), *d_k = (uint16_t *)dup_gpu(k, nk * 2);
    uint16_t *d_v = (uint16_t *)dup_gpu(v, nk * 2), *d_do = (uint16_t *)dup_gpu(dout, nq * 2);
    uint16_t *d_out = (uint16_t *)G->alloc(nq * 2);
    float *d_lse = (float *)G->alloc(nl * 4);
    // gradients start as garbage (0xffff: bf16 NaN): the op must write every element
    uint16_t *junk = (uint16_t *)malloc((nq > nk ? nq : nk) * 2);
    memset(junk, 0xff, (nq > nk ? nq : nk) * 2);
    uint16_t *d_dq = (uint16_t *)dup_gpu(junk, nq * 2), *d_dk = (uint16_t *)dup_gpu(junk, nk * 2);
    uint16_t *d_dv = (uint16_t *)dup_gpu(junk, nk * 2);
    const int use_ws = !(sq & 1); // half the cases with the caller's workspace, half with NULL
    const size_t ws_bytes = G->attention_workspace_size_bf16(&sg);
    void *ws = use_ws ? G->alloc(ws_bytes) : NULL;

    G->attention_forward_bf16(d_out, d_lse, d_q, d_k, d_v, &sg, ws);
    const char *fpath = cuda_attention_bf16_last_path();
    const int fcudnn = !strcmp(fpath, "cudnn");
    uint16_t *g_out = (uint16_t *)from_gpu(d_out, nq * 2);
    float *g_lse = (float *)from_gpu(d_lse, nl * 4);
    snprintf(shape, sizeof shape, "b%d s%d/%d h%d/%d d%d %s@%d/%d [%s] %s", b, sq, sk, h, kv, d, mask, qo, ko, fpath,
             cpu_fwd ? "ref:bf16" : "ref:f32");
    if (doc) report("attention_forward_bf16 doc mask path", shape, fcudnn, 0, !fcudnn); // built-in only
    if (fcudnn) check_bf16_rel("attention_forward_bf16 out", shape, g_out, out, nq, 2e-2);
    else check_bf16("attention_forward_bf16 out", shape, g_out, out, nq, 1e-4, 1.0);
    check_close("attention_forward_bf16 lse", shape, g_lse, lse, nl, fcudnn ? 1e-3 : 1e-4);

    // backward from the CPU's out and lse (isolates the op)
    G->copy_h2d(d_out, out, nq * 2);
    G->copy_h2d(d_lse, lse, nl * 4);
    G->attention_backward_bf16(d_dq, d_dk, d_dv, d_do, d_q, d_k, d_v, d_out, d_lse, &sg, ws);
    const char *bpath = cuda_attention_bf16_last_path();
    const int bcudnn = !strcmp(bpath, "cudnn");
    snprintf(shape, sizeof shape, "b%d s%d/%d h%d/%d d%d %s@%d/%d [%s] %s", b, sq, sk, h, kv, d, mask, qo, ko, bpath,
             cpu_bwd ? "ref:bf16" : "ref:f32");
    uint16_t *g_dq = (uint16_t *)from_gpu(d_dq, nq * 2), *g_dk = (uint16_t *)from_gpu(d_dk, nk * 2);
    uint16_t *g_dv = (uint16_t *)from_gpu(d_dv, nk * 2);
    if (doc) report("attention_backward_bf16 doc mask path", shape, bcudnn, 0, !bcudnn);
    if (bcudnn) {
        check_bf16_rel("attention_backward_bf16 dq", shape, g_dq, dq, nq, 5e-2);
        check_bf16_rel("attention_backward_bf16 dk", shape, g_dk, dk, nk, 5e-2);
        check_bf16_rel("attention_backward_bf16 dv", shape, g_dv, dv, nk, 5e-2);
    } else {
        check_bf16("attention_backward_bf16 dq", shape, g_dq, dq, nq, 1e-4, 1.0);
        check_bf16("attention_backward_bf16 dk", shape, g_dk, dk, nk, 1e-4, 1.0);
        check_bf16("attention_backward_bf16 dv", shape, g_dv, dv, nk, 1e-4, 1.0);
    }
    free(q);
    free(k);
    free(v);
    free(dout);
    free(out);
    free(dq);
    free(dk);
    free(dv);
    free(lse);
    free(junk);
    free(g_out);
    free(g_lse);
    free(g_dq);
    free(g_dk);
    free(g_dv);
    G->release(d_q);
    G->release(d_k);
    G->release(d_v);
    G->release(d_do);
    G->release(d_out);
    G->release(d_lse);
    G->release(d_dq);
    G->release(d_dk);
    G->release(d_dv);
    if (ws) G->release(ws);
    if (doc) G->release((void *)sg.doc);
}

static void test_attention_bf16(void) {
    test_attention_bf16_case(2, 67, 67, 4, 2, 16, 1, 0, 0, NULL, 0);    // GQA 2, causal diagonal
    test_attention_bf16_case(1, 130, 130, 8, 2, 128, 1, 0, 0, NULL, 0); // Llama 3 head dim, GQA 4
    test_attention_bf16_case(2, 45, 77, 6, 3, 40, 0, 0, 0, NULL, 0);    // full attention, odd head dim
    test_attention_bf16_case(1, 64, 64, 4, 1, 64, 1, 64, 0, NULL, 0);   // ring block: every key visible
    test_attention_bf16_case(1, 64, 96, 4, 2, 64, 1, 0, 32, NULL, 0);   // ring block: rows 0..31 see nothing
    test_attention_bf16_case(1, 50, 50, 2, 2, 32, 1, 0, 100, NULL, 0);  // fully masked pair: zeros, lse -inf
    test_attention_bf16_case(1, 33, 70, 4, 4, 256, 1, 40, 0, NULL, 0);  // head dim 256
    // the built-in tensor-core kernels' 64 x 64 tiles: a partial last tile, GQA 8, a padded
    // head dim (80 in tiles of 128)
    test_attention_bf16_case(1, 200, 200, 8, 1, 128, 1, 0, 0, NULL, 0);
    test_attention_bf16_case(1, 150, 150, 4, 2, 80, 1, 0, 0, NULL, 0);
    // block_causal (always the built-in kernels: cuDNN's SDPA is not used with a document mask)
    static const int lens[] = {3, 29, 32, 1}, ring[] = {40, 100, 52}, edges[] = {64, 1, 63, 70, 2};
    int32_t *doc = doc_ids(2, 67, lens, 4);
    test_attention_bf16_case(2, 67, 67, 4, 2, 16, 1, 0, 0, doc, 67);
    free(doc);
    doc = doc_ids(1, 192, ring, 3);
    test_attention_bf16_case(1, 64, 64, 4, 2, 64, 1, 128, 0, doc, 192);
    free(doc);
    doc = doc_ids(1, 200, edges, 5); // documents ending on, before and after the 64-row tile edges
    test_attention_bf16_case(1, 200, 200, 8, 2, 128, 1, 0, 0, doc, 200);
    free(doc);
}

// training.deterministic: the bf16 attention backward gives the same bits twice, within its
// path's gate of the CPU, and takes cuDNN (its deterministic graph) wherever the usual
// backward of the shape does; the built-in kernel only where cuDNN has no such plan.
static void test_attention_bf16_deterministic_case(int b, int s_len, int h, int kv, int d) {
    ops_attn_shape s = {b, s_len, s_len, h, kv, d, 1.0f / sqrtf((float)d), 1, 0, 0, NULL, 0};
    const size_t nq = (size_t)b * s_len * h * d, nk = (size_t)b * s_len * kv * d, nl = (size_t)b * h * s_len;
    uint16_t *q = hrandn_bf16(nq, 1), *k = hrandn_bf16(nk, 1), *v = hrandn_bf16(nk, 1), *dout = hrandn_bf16(nq, 1);
    uint16_t *out = (uint16_t *)malloc(nq * 2), *dq = (uint16_t *)malloc(nq * 2);
    uint16_t *dk = (uint16_t *)malloc(nk * 2), *dv = (uint16_t *)malloc(nk * 2);
    float *lse = (float *)malloc(nl * 4);
    attention_bf16_reference(out, lse, dq, dk, dv, q, k, v, dout, &s);
    uint16_t *d_q = (uint16_t *)dup_gpu(q, nq * 2), *d_k = (uint16_t *)dup_gpu(k, nk * 2);
    uint16_t *d_v = (uint16_t *)dup_gpu(v, nk * 2), *d_do = (uint16_t *)dup_gpu(dout, nq * 2);
    uint16_t *d_out = (uint16_t *)dup_gpu(out, nq * 2);
    float *d_lse = (float *)dup_gpu(lse, nl * 4);
    uint16_t *d_g[2][3];
    for (int r = 0; r < 2; r++) {
        d_g[r][0] = (uint16_t *)G->alloc(nq * 2);
        d_g[r][1] = (uint16_t *)G->alloc(nk * 2);
        d_g[r][2] = (uint16_t *)G->alloc(nk * 2);
    }
    // the usual backward's path for this shape, then the deterministic one twice
    G->set_deterministic(0);
    void *ws = G->alloc(G->attention_workspace_size_bf16(&s));
    G->attention_backward_bf16(d_g[0][0], d_g[0][1], d_g[0][2], d_do, d_q, d_k, d_v, d_out, d_lse, &s, ws);
    const int usual_cudnn = !strcmp(cuda_attention_bf16_last_path(), "cudnn");
    G->release(ws);
    G->set_deterministic(1);
    ws = G->alloc(G->attention_workspace_size_bf16(&s));
    for (int r = 0; r < 2; r++)
        G->attention_backward_bf16(d_g[r][0], d_g[r][1], d_g[r][2], d_do, d_q, d_k, d_v, d_out, d_lse, &s, ws);
    const char *path = cuda_attention_bf16_last_path();
    const int det_cudnn = !strcmp(path, "cudnn");
    G->set_deterministic(0);
    char shape[128];
    snprintf(shape, sizeof shape, "b%d s%d h%d/%d d%d causal [%s]", b, s_len, h, kv, d, path);
    check(det_cudnn == usual_cudnn, "attention_bwd_bf16 determ. path", shape,
          "the usual backward took %s, the deterministic one %s", usual_cudnn ? "cuDNN" : "the built-in kernel", path);
    const size_t n[3] = {nq, nk, nk};
    const uint16_t *ref[3] = {dq, dk, dv};
    static const char *name[3] = {"attention_bwd_bf16 determ. dq", "attention_bwd_bf16 determ. dk",
                                  "attention_bwd_bf16 determ. dv"};
    static const char *twice[3] = {"attn_bwd_bf16 determ. dq bits", "attn_bwd_bf16 determ. dk bits",
                                   "attn_bwd_bf16 determ. dv bits"};
    for (int i = 0; i < 3; i++) {
        uint16_t *a = (uint16_t *)from_gpu(d_g[0][i], n[i] * 2), *c = (uint16_t *)from_gpu(d_g[1][i], n[i] * 2);
        size_t diff = 0;
        for (size_t j = 0; j < n[i]; j++) diff += a[j] != c[j];
        check(diff == 0, twice[i], shape, "%zu of %zu elements differ between two runs", diff, n[i]);
        if (det_cudnn) check_bf16_rel(name[i], shape, a, ref[i], n[i], 5e-2);
        else check_bf16(name[i], shape, a, ref[i], n[i], 1e-4, 1.0);
        free(a);
        free(c);
    }
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++) G->release(d_g[r][i]);
    void *dev[] = {ws, d_q, d_k, d_v, d_do, d_out, d_lse};
    for (int i = 0; i < 7; i++) G->release(dev[i]);
    void *host[] = {q, k, v, dout, out, dq, dk, dv, lse};
    for (int i = 0; i < 9; i++) free(host[i]);
}

static void test_attention_bf16_deterministic(void) {
    test_attention_bf16_deterministic_case(2, 67, 4, 2, 16);   // GQA 2, odd length
    test_attention_bf16_deterministic_case(1, 256, 8, 2, 128); // Llama 3 head dim, GQA 4
}

// ----------------------------------------------------------------------------
// cross-entropy

static void test_cross_entropy_fused(int n, int v) {
    const size_t nv = (size_t)n * v;
    float *z = hrandn(nv, 3), *loss = (float *)malloc((size_t)n * 4), *dz = (float *)malloc(nv * 4);
    int32_t *t = (int32_t *)malloc((size_t)n * 4);
    for (int i = 0; i < n; i++) t[i] = (int32_t)(rnd() % (uint32_t)v);
    if (n > 3) {
        t[1] = OPS_IGNORE_INDEX;
        t[3] = v + 5; // out of range: treated as ignored
    }
    const float scale = 1.0f / (float)n;
    char shape[64];
    snprintf(shape, sizeof shape, "n%d V%d (ignored targets)", n, v);
    float *d_z = (float *)dup_gpu(z, nv * 4), *d_loss = (float *)G->alloc((size_t)n * 4),
          *d_dz = (float *)G->alloc(nv * 4);
    int32_t *d_t = (int32_t *)dup_gpu(t, (size_t)n * 4);

    // loss only
    C->cross_entropy(NULL, loss, z, t, n, v, scale);
    G->cross_entropy(NULL, d_loss, d_z, d_t, n, v, scale);
    float *gl = (float *)from_gpu(d_loss, (size_t)n * 4);
    check_close("cross_entropy losses", shape, gl, loss, n, 1e-5);
    free(gl);
    // with dlogits into another buffer
    C->cross_entropy(dz, loss, z, t, n, v, scale);
    G->cross_entropy(d_dz, d_loss, d_z, d_t, n, v, scale);
    float *gd = (float *)from_gpu(d_dz, nv * 4);
    check_close("cross_entropy dlogits", shape, gd, dz, nv, 1e-5);
    free(gd);
    // in place (dlogits == logits)
    G->cross_entropy(d_z, d_loss, d_z, d_t, n, v, scale);
    gd = (float *)from_gpu(d_z, nv * 4);
    gl = (float *)from_gpu(d_loss, (size_t)n * 4);
    check_close("cross_entropy in place dlogits", shape, gd, dz, nv, 1e-5);
    check_close("cross_entropy in place losses", shape, gl, loss, n, 1e-5);
    free(gd);
    free(gl);
    // bf16 logits and dlogits: the bits of this backend's fp32 dlogits over the logits
    // widened cast to bf16 (also in place), and the CPU's within bf16 rounding
    {
        uint16_t *d_d16 = (uint16_t *)G->alloc(nv * 2), *d_c16 = (uint16_t *)G->alloc(nv * 2);
        uint16_t *d_z16 = (uint16_t *)G->alloc(nv * 2);
        float *d_z2 = (float *)dup_gpu(z, nv * 4), *d_l2 = (float *)G->alloc((size_t)n * 4);
        G->cast_f32_to_bf16(d_z16, d_z2, nv);
        G->cast_bf16_to_f32(d_z2, d_z16, nv);
        G->cross_entropy(d_dz, d_loss, d_z2, d_t, n, v, scale);
        G->cast_f32_to_bf16(d_c16, d_dz, nv);
        G->cross_entropy_bf16(d_d16, d_l2, d_z16, d_t, n, v, scale);
        G->cross_entropy_bf16(d_z16, d_l2, d_z16, d_t, n, v, scale); /* in place */
        uint16_t *gi16 = (uint16_t *)from_gpu(d_z16, nv * 2);
        uint16_t *g16 = (uint16_t *)from_gpu(d_d16, nv * 2), *c16 = (uint16_t *)from_gpu(d_c16, nv * 2);
        float *gl2 = (float *)from_gpu(d_l2, (size_t)n * 4), *gl1 = (float *)from_gpu(d_loss, (size_t)n * 4);
        check_bits("cross_entropy_bf16 == cast(cross_entropy)", shape, g16, c16, nv * 2);
        check_bits("cross_entropy_bf16 losses", shape, gl2, gl1, (size_t)n * 4);
        check_bits("cross_entropy_bf16 in place == cast(cross_entropy)", shape, gi16, c16, nv * 2);
        free(gi16);
        G->release(d_z16);
        float *g32 = (float *)malloc(nv * 4);
        C->cast_bf16_to_f32(g32, g16, nv);
        check_close("cross_entropy_bf16 dlogits against the CPU", shape, g32, dz, nv, 1e-2);
        free(g32);
        free(g16);
        free(c16);
        free(gl2);
        free(gl1);
        G->release(d_d16);
        G->release(d_c16);
        G->release(d_z2);
        G->release(d_l2);
    }
    free(z);
    free(loss);
    free(dz);
    free(t);
    G->release(d_z);
    G->release(d_loss);
    G->release(d_dz);
    G->release(d_t);
}

// Loss parallel: the vocabulary in two shards, the three phases per shard with the
// reductions between them done on the host (as the all-reduces would).
static void test_cross_entropy_sharded(void) {
    const int n = 29, v = 1000, split = 400;
    const int v0[2] = {0, split}, vl[2] = {split, v - split};
    float *z = hrandn((size_t)n * v, 3);
    int32_t t[29];
    for (int i = 0; i < n; i++) t[i] = (int32_t)(rnd() % v);
    t[2] = OPS_IGNORE_INDEX;
    const float scale = 0.05f;
    float *zs[2], *d_zs[2];
    int32_t *d_t = (int32_t *)dup_gpu(t, sizeof t);
    for (int s = 0; s < 2; s++) { // shard s: columns [v0, v0 + vl) of every row
        zs[s] = (float *)malloc((size_t)n * vl[s] * 4);
        for (int i = 0; i < n; i++) memcpy(zs[s] + (size_t)i * vl[s], z + (size_t)i * v + v0[s], (size_t)vl[s] * 4);
        d_zs[s] = (float *)dup_gpu(zs[s], (size_t)n * vl[s] * 4);
    }
    float mx_c[2][29], mx_g[2][29], se_c[2][29], se_g[2][29], tl_c[2][29], tl_g[2][29];
    float *d_buf = (float *)G->alloc(8 * 29 * 4);
    for (int s = 0; s < 2; s++) {
        C->ce_shard_max(mx_c[s], zs[s], n, vl[s]);
        G->ce_shard_max(d_buf + s * 29, d_zs[s], n, vl[s]);
    }
    G->synchronize();
    G->copy_d2h(mx_g, d_buf, sizeof mx_g);
    check_bits("ce_shard_max", "n29 V1000 in 2 shards", mx_g, mx_c, sizeof mx_c);
    float gmax_c[29], gmax_g[29];
    for (int i = 0; i < n; i++) {
        gmax_c[i] = fmaxf(mx_c[0][i], mx_c[1][i]);
        gmax_g[i] = fmaxf(mx_g[0][i], mx_g[1][i]);
    }
    float *d_max = d_buf + 2 * 29;
    G->copy_h2d(d_max, gmax_g, sizeof gmax_g);
    for (int s = 0; s < 2; s++) {
        C->ce_shard_sums(se_c[s], tl_c[s], zs[s], gmax_c, t, n, vl[s], v0[s]);
        G->ce_shard_sums(d_buf + 3 * 29, d_buf + 4 * 29, d_zs[s], d_max, d_t, n, vl[s], v0[s]);
        G->synchronize();
        G->copy_d2h(se_g[s], d_buf + 3 * 29, sizeof se_g[s]);
        G->copy_d2h(tl_g[s], d_buf + 4 * 29, sizeof tl_g[s]);
    }
    check_close("ce_shard_sums sum_exp", "n29 V1000 in 2 shards", &se_g[0][0], &se_c[0][0], 58, 1e-5);
    check_close("ce_shard_sums target_logit", "n29 V1000 in 2 shards", &tl_g[0][0], &tl_c[0][0], 58, 1e-6);
    float S_c[29], T_c[29], S_g[29], T_g[29];
    for (int i = 0; i < n; i++) {
        S_c[i] = se_c[0][i] + se_c[1][i];
        T_c[i] = tl_c[0][i] + tl_c[1][i];
        S_g[i] = se_g[0][i] + se_g[1][i];
        T_g[i] = tl_g[0][i] + tl_g[1][i];
    }
    float *d_S = d_buf + 5 * 29, *d_T = d_buf + 6 * 29, *d_loss = d_buf + 7 * 29;
    G->copy_h2d(d_S, S_g, sizeof S_g);
    G->copy_h2d(d_T, T_g, sizeof T_g);
    float loss_c[29], loss_g[29];
    for (int s = 0; s < 2; s++) {
        float *dz = (float *)malloc((size_t)n * vl[s] * 4);
        C->ce_shard_finish(dz, loss_c, zs[s], gmax_c, S_c, T_c, t, n, vl[s], v0[s], scale);
        G->ce_shard_finish(d_zs[s], d_loss, d_zs[s], d_max, d_S, d_T, d_t, n, vl[s], v0[s], scale); // in place
        float *gd = (float *)from_gpu(d_zs[s], (size_t)n * vl[s] * 4);
        G->copy_d2h(loss_g, d_loss, sizeof loss_g);
        check_close(s ? "ce_shard_finish dlogits shard 1" : "ce_shard_finish dlogits shard 0", "n29 V1000 in 2 shards",
                    gd, dz, (size_t)n * vl[s], 1e-5);
        check_close("ce_shard_finish losses", "n29 V1000 in 2 shards", loss_g, loss_c, n, 1e-5);
        free(gd);
        free(dz);
    }
    // the sharded loss equals the fused one
    float *d_z = (float *)dup_gpu(z, (size_t)n * v * 4), fused[29];
    G->cross_entropy(NULL, d_loss, d_z, d_t, n, v, scale);
    G->synchronize();
    G->copy_d2h(fused, d_loss, sizeof fused);
    check_close("sharded loss == fused loss", "n29 V1000 (cuda)", loss_g, fused, n, 1e-5);
    for (int s = 0; s < 2; s++) {
        free(zs[s]);
        G->release(d_zs[s]);
    }
    free(z);
    G->release(d_buf);
    G->release(d_t);
    G->release(d_z);
}

// ----------------------------------------------------------------------------
// AdamW: the same coefficients and the same fused updates give the same bits

// The optimizer's scalars on the device (ops.h optim_scalars) against the CPU's, and
// AdamW driven by them against AdamW given the same step and clip coefficient on the host:
// a finite step (clipped), a skipped (NaN) step that leaves everything as it was, a step
// whose expected t is stale (the device derives the coefficients), and halting.
// One step's scalars on both backends from the first n stage sums of squares and two
// microbatch losses; gs receives the device's state.
static void optim_both(ops_optim_state *hs, ops_optim_state *d_s, ops_optim_state *gs, double *hsq, double *d_sq,
                       const float *norms, const float *d_norms, int n, const float *losses, const float *d_losses,
                       const ops_optim_args *a) {
    C->grad_sq_to_f64(hsq, norms, n, losses, 2);
    G->grad_sq_to_f64(d_sq, d_norms, n, d_losses, 2);
    C->sum_f64(&hs->sq, hsq, n);
    G->sum_f64(&d_s->sq, d_sq, n);
    C->optim_scalars(hs, a);
    G->optim_scalars(d_s, a);
    G->copy_d2h(gs, d_s, sizeof *gs);
}

static void test_optim_scalars(void) {
    const size_t n = 5003;
    float *p = hrandn(n, 0.02f), *m = hrandn(n, 0.01f), *v = hrandn(n, 0.001f), *g = hrandn(n, 0.1f);
    for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
    float *d_p = (float *)dup_gpu(p, n * 4), *d_m = (float *)dup_gpu(m, n * 4), *d_v = (float *)dup_gpu(v, n * 4);
    float *d_g = (float *)dup_gpu(g, n * 4);
    float *q = (float *)malloc(n * 4), *qm = (float *)malloc(n * 4), *qv = (float *)malloc(n * 4);
    memcpy(q, p, n * 4), memcpy(qm, m, n * 4), memcpy(qv, v, n * 4);
    ops_optim_state hs, gs;
    memset(&hs, 0, sizeof hs);
    hs.updates = 6;
    ops_optim_state *d_s = (ops_optim_state *)dup_gpu(&hs, sizeof hs);
    double *d_sq = (double *)G->alloc(2 * sizeof(double)), hsq[2];
    float norms[2] = {3.0f, 1.25f}, losses[2] = {2.5f, 3.5f};
    float *d_norms = (float *)dup_gpu(norms, sizeof norms), *d_losses = (float *)dup_gpu(losses, sizeof losses);
    // a finite step: sum of squares 4.25, norm 2.06, clipped to max_norm 1
    ops_optim_args a = {3e-4, 0.9, 0.95, 1e-8, 0.1, 1.0, 10, 7, 5, 0};
    optim_both(&hs, d_s, &gs, hsq, d_sq, norms, d_norms, 2, losses, d_losses, &a);
    check_bits("optim_scalars state", "finite step, t 7", &gs, &hs, sizeof gs);
    const float clip = (float)(1.0 / (sqrt(4.25) + 1e-6));
    check(hs.updates == 7 && !hs.skip && hs.k.grad_scale == clip, "optim_scalars", "finite step: t 7, clipped",
          "updates %d skip %d clip %g (want %g)", hs.updates, hs.skip, hs.k.grad_scale, clip);
    C->adamw_step(p, m, v, g, n, 0, 0, 0, 0, 0, 0, 0.0f, &hs);
    G->adamw_step(d_p, d_m, d_v, d_g, n, 0, 0, 0, 0, 0, 0, 0.0f, d_s);
    C->adamw_step(q, qm, qv, g, n, 3e-4, 0.9, 0.95, 1e-8, 0.1, 7, clip, NULL);
    check_bits("adamw_step with the device's scalars", "n=5003 t=7 (CPU, host arguments)", p, q, n * 4);
    float *gp = (float *)from_gpu(d_p, n * 4);
    check_bits("adamw_step with the device's scalars", "n=5003 t=7 (cuda)", gp, p, n * 4);
    free(gp);
    // a NaN loss: the norm is NaN, nothing moves, the step is recorded
    losses[1] = NAN;
    G->copy_h2d(d_losses, losses, sizeof losses);
    a.step = 11, a.expected_t = 8;
    optim_both(&hs, d_s, &gs, hsq, d_sq, norms, d_norms, 2, losses, d_losses, &a);
    check(memcmp(&gs, &hs, sizeof gs) == 0 && hs.skip && hs.nonfinite == 1 && hs.first_bad == 11 && hs.updates == 7 &&
              !hs.halted,
          "optim_scalars", "NaN loss", "skip %d nonfinite %d first_bad %lld updates %d halted %d (same on cuda: %d)",
          hs.skip, hs.nonfinite, (long long)hs.first_bad, hs.updates, hs.halted, memcmp(&gs, &hs, sizeof gs) == 0);
    memcpy(q, p, n * 4);
    C->adamw_step(p, m, v, g, n, 0, 0, 0, 0, 0, 0, 0.0f, &hs);
    G->adamw_step(d_p, d_m, d_v, d_g, n, 0, 0, 0, 0, 0, 0, 0.0f, d_s);
    gp = (float *)from_gpu(d_p, n * 4);
    check_bits("adamw_step skipped", "n=5003 (CPU)", p, q, n * 4);
    check_bits("adamw_step skipped", "n=5003 (cuda)", gp, q, n * 4);
    free(gp);
    // finite again, but the host expected t 9 (it did not know of the skip): t is 8
    losses[1] = 3.5f;
    G->copy_h2d(d_losses, losses, sizeof losses);
    a.step = 12, a.expected_t = 9;
    optim_both(&hs, d_s, &gs, hsq, d_sq, norms, d_norms, 1, losses, d_losses, &a);
    tetra_adamw_coef k8 = tetra_adamw_coefficients(3e-4, 0.9, 0.95, 1e-8, 0.1, 8, 1.0f);
    k8.grad_scale = hs.k.grad_scale;
    check(hs.updates == 8 && hs.run == 0 && memcmp(&hs.k, &k8, sizeof k8) == 0, "optim_scalars", "stale expected t",
          "updates %d run %d, coefficients of t 8: %d", hs.updates, hs.run, memcmp(&hs.k, &k8, sizeof k8) == 0);
    check(gs.updates == 8 && fabsf(gs.k.neg_step_size / hs.k.neg_step_size - 1.0f) < 1e-6f &&
              fabsf(gs.k.bc2_sqrt / hs.k.bc2_sqrt - 1.0f) < 1e-6f,
          "optim_scalars", "stale expected t (cuda: the device's pow)", "updates %d step size %g / %g", gs.updates,
          gs.k.neg_step_size, hs.k.neg_step_size);
    // halt_first: the first non-finite step halts, and no finite step updates after it
    hs.sq = INFINITY;
    a.halt_first = 1, a.step = 13;
    C->optim_scalars(&hs, &a);
    hs.sq = 1.0;
    a.step = 14;
    C->optim_scalars(&hs, &a);
    check(hs.halted && hs.skip && hs.updates == 8 && hs.last_bad == 13 && hs.first_bad == 11, "optim_scalars",
          "halt_first", "halted %d skip %d updates %d last_bad %lld", hs.halted, hs.skip, hs.updates,
          (long long)hs.last_bad);
    free(p), free(m), free(v), free(g), free(q), free(qm), free(qv);
    G->release(d_p), G->release(d_m), G->release(d_v), G->release(d_g), G->release(d_s), G->release(d_sq);
    G->release(d_norms), G->release(d_losses);
}

static void test_adamw(void) {
    const size_t n = 100003;
    float *p = hrandn(n, 0.02f), *m = hrandn(n, 0.01f), *v = hrandn(n, 0.001f), *g = hrandn(n, 0.1f);
    for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
    float *d_p = (float *)dup_gpu(p, n * 4), *d_m = (float *)dup_gpu(m, n * 4), *d_v = (float *)dup_gpu(v, n * 4);
    float *d_g = (float *)dup_gpu(g, n * 4);
    C->adamw_step(p, m, v, g, n, 3e-4, 0.9, 0.95, 1e-8, 0.1, 7, 0.5f, NULL);
    G->adamw_step(d_p, d_m, d_v, d_g, n, 3e-4, 0.9, 0.95, 1e-8, 0.1, 7, 0.5f, NULL);
    float *gp = (float *)from_gpu(d_p, n * 4), *gm = (float *)from_gpu(d_m, n * 4), *gv = (float *)from_gpu(d_v, n * 4);
    check_bits("adamw_step param", "n=100003 t=7", gp, p, n * 4);
    check_bits("adamw_step m", "n=100003 t=7", gm, m, n * 4);
    check_bits("adamw_step v", "n=100003 t=7", gv, v, n * 4);
    free(gp);
    free(gm);
    free(gv);
    uint16_t *p16 = (uint16_t *)malloc(n * 2), *d_p16 = (uint16_t *)G->alloc(n * 2), *g16;
    C->adamw_step_bf16(p, p16, m, v, g, n, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1, 1.0f, NULL);
    G->adamw_step_bf16(d_p, d_p16, d_m, d_v, d_g, n, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1, 1.0f, NULL);
    gp = (float *)from_gpu(d_p, n * 4);
    g16 = (uint16_t *)from_gpu(d_p16, n * 2);
    check_bits("adamw_step_bf16 param", "n=100003 t=1", gp, p, n * 4);
    check_bits("adamw_step_bf16 bf16 copy", "n=100003 t=1", g16, p16, n * 2);
    free(gp);
    free(g16);
    free(p16);
    free(p);
    free(m);
    free(v);
    free(g);
    G->release(d_p);
    G->release(d_m);
    G->release(d_v);
    G->release(d_g);
    G->release(d_p16);
}

// adamw_step_amax: the update's bits are adamw_step's, and each stretch's amax is a pass's
// over the written copy: stretches inside one chunk, across chunk edges, empty, at the
// end, one holding a NaN; bf16 and fp32 copies, a vector and a scalar tail, a skipped step.
static void test_adamw_amax(void) {
    const size_t n = 20003; // five chunks of 4096: stretches end inside them and cross their edges
    enum { NS = 6 };
    const int64_t off[NS] = {0, 100, 5000, 5000, 9000, 15001}, len[NS] = {37, 4000, 0, 3001, 6000, 5002};
    float *p = hrandn(n, 0.02f), *m = hrandn(n, 0.01f), *v = hrandn(n, 0.001f), *g = hrandn(n, 0.1f);
    for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
    p[17000] = NAN; // the last stretch's amax is NaN
    p[9100] = 3.0f; // a large weight inside a stretch that spans chunks
    float *d_p = (float *)dup_gpu(p, n * 4), *d_m = (float *)dup_gpu(m, n * 4), *d_v = (float *)dup_gpu(v, n * 4);
    float *d_g = (float *)dup_gpu(g, n * 4), *d_amax = (float *)G->alloc(NS * 4);
    int64_t *d_off = (int64_t *)dup_gpu(off, sizeof off), *d_len = (int64_t *)dup_gpu(len, sizeof len);
    uint16_t *p16 = (uint16_t *)malloc(n * 2), *d_p16 = (uint16_t *)G->alloc(n * 2);
    float amax[NS], want[NS], *gamax;
    ops_optim_state hs;
    memset(&hs, 0, sizeof hs);
    for (int round = 0; round < 3; round++) {
        const int bf = round != 0, skip = round == 2; // the skip after a bf16 round: the copy is current
        hs.skip = skip;
        hs.k = tetra_adamw_coefficients(1e-3, 0.9, 0.95, 1e-8, 0.1, round + 1, 1.0f);
        ops_optim_state *d_s = (ops_optim_state *)dup_gpu(&hs, sizeof hs);
        const ops_amax_segments hseg = {NS, off, len, amax}, dseg = {NS, d_off, d_len, d_amax};
        C->adamw_step_amax(p, bf ? p16 : NULL, m, v, g, n, 0, 0, 0, 0, 0, 0, 0.0f, &hs, &hseg);
        G->adamw_step_amax(d_p, bf ? d_p16 : NULL, d_m, d_v, d_g, n, 0, 0, 0, 0, 0, 0, 0.0f, d_s, &dseg);
        for (int k = 0; k < NS; k++) {
            want[k] = 0.0f;
            if (len[k] && bf) C->amax_bf16(want + k, p16 + off[k], (size_t)len[k]);
            else if (len[k]) C->amax(want + k, p + off[k], (size_t)len[k]);
        }
        char what[96];
        snprintf(what, sizeof what, "n=20003, 6 stretches, %s copy%s", bf ? "bf16" : "fp32", skip ? ", skipped" : "");
        check_bits("adamw_step_amax amax (CPU) = a pass per stretch", what, amax, want, sizeof want);
        check(amax[5] != amax[5] && amax[4] > 2.9f && amax[2] == 0.0f, "adamw_step_amax", what,
              "NaN stretch %g, large %g, empty %g", amax[5], amax[4], amax[2]);
        gamax = (float *)from_gpu(d_amax, sizeof want);
        float *gp = (float *)from_gpu(d_p, n * 4);
        check_bits("adamw_step_amax amax (cuda)", what, gamax, want, sizeof want);
        check_bits("adamw_step_amax param (cuda)", what, gp, p, n * 4);
        if (bf) {
            uint16_t *g16 = (uint16_t *)from_gpu(d_p16, n * 2);
            check_bits("adamw_step_amax bf16 copy (cuda)", what, g16, p16, n * 2);
            free(g16);
        }
        free(gp), free(gamax);
        G->release(d_s);
    }
    free(p), free(m), free(v), free(g), free(p16);
    G->release(d_p), G->release(d_m), G->release(d_v), G->release(d_g), G->release(d_p16);
    G->release(d_amax), G->release(d_off), G->release(d_len);
}

// ----------------------------------------------------------------------------
// memory accounting, freeze, out of memory, the compute stream

static int on_simulator(void) {
    char dev[256];
    return cuda_device_describe(0, dev, (int)sizeof dev) == 0 && strstr(dev, "simulator") != NULL;
}

// copy_2d (cudaMemcpy2DAsync) against the CPU table's, bit for bit over the whole
// destination buffer: odd widths and pitches, gaps between rows, unaligned starts, no
// rows or no width; bytes outside the rectangle keep their values, the source its own.
// Its own byte stream, so the random inputs of the tests after it stay what they were.
static void test_copy_2d(void) {
    static const size_t cases[][6] = {/* width, dpitch, spitch, rows, dst offset, src offset (bytes) */
                                      {1, 1, 1, 1, 0, 0},
                                      {3, 7, 5, 11, 1, 3},
                                      {13, 13, 29, 9, 0, 5},
                                      {13, 31, 13, 9, 7, 0},
                                      {100, 100, 100, 7, 2, 0},
                                      {0, 16, 16, 5, 0, 0},
                                      {12, 16, 20, 0, 0, 0},
                                      {516, 4128, 516, 4099, 1548, 0},
                                      {516, 516, 4128, 4099, 0, 2580}};
    report("copy_2d in both tables", "-", 0, 0, G->copy_2d != NULL && C->copy_2d != NULL);
    if (!G->copy_2d || !C->copy_2d) return;
    uint64_t st = 0x6A09E667F3BCC909ull;
    char shape[96];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const size_t *c = cases[i], guard = 67;
        const size_t dn = c[4] + (c[3] ? (c[3] - 1) * c[1] + c[0] : 0) + guard;
        const size_t sn = c[5] + (c[3] ? (c[3] - 1) * c[2] + c[0] : 0) + guard;
        unsigned char *src = (unsigned char *)malloc(sn), *dst = (unsigned char *)malloc(dn);
        for (size_t j = 0; j < sn + dn; j++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            if (j < sn) src[j] = (unsigned char)(st >> 56);
            else dst[j - sn] = (unsigned char)(st >> 56);
        }
        unsigned char *d_src = (unsigned char *)dup_gpu(src, sn), *d_dst = (unsigned char *)dup_gpu(dst, dn);
        C->copy_2d(dst + c[4], c[1], src + c[5], c[2], c[0], c[3]);
        G->copy_2d(d_dst + c[4], c[1], d_src + c[5], c[2], c[0], c[3]);
        unsigned char *got = (unsigned char *)from_gpu(d_dst, dn), *gsrc = (unsigned char *)from_gpu(d_src, sn);
        snprintf(shape, sizeof shape, "w=%zu dp=%zu sp=%zu rows=%zu at +%zu/+%zu", c[0], c[1], c[2], c[3], c[4], c[5]);
        check_bits("copy_2d (whole dst)", shape, got, dst, dn);
        check_bits("copy_2d source unchanged", shape, gsrc, src, sn);
        free(src);
        free(dst);
        free(got);
        free(gsrc);
        G->release(d_src);
        G->release(d_dst);
    }
}

static void test_memory(void) {
    char shape[96];
    const size_t c0 = G->alloc_count(), b0 = G->allocated_bytes();
    // the backend's own buffers (cuBLASLt workspace, scratch) are counted from init on
    snprintf(shape, sizeof shape, "%.1f MiB held", (double)b0 / 1048576.0);
    report("allocated_bytes >= own 32 MiB", shape, 0, 0, b0 >= ((size_t)32 << 20));
    void *p = G->alloc(1000);
    report("alloc_count +1 per alloc", "1000 B", 0, 0, p && G->alloc_count() == c0 + 1);
    report("allocated_bytes +1000", "1000 B", 0, 0, G->allocated_bytes() == b0 + 1000);
    G->release(p);
    report("release returns the bytes", "1000 B", 0, 0, G->allocated_bytes() == b0 && G->alloc_count() == c0 + 1);

    size_t fr = 0, tot = 0;
    G->device_memory(&fr, &tot);
    snprintf(shape, sizeof shape, "free %.0f of %.0f MiB", (double)fr / 1048576.0, (double)tot / 1048576.0);
    report("device_memory", shape, 0, 0, tot > 0 && fr <= tot);
    report("compute_stream", "-", 0, 0, G->compute_stream() != NULL && C->compute_stream() == NULL);

    // frozen: alloc fails (with a message on stderr) and counts nothing; ops whose scratch
    // already exists still run
    printf("(a \"requested during training\" and an \"out of device memory\" message on stderr are expected)\n");
    float h[3] = {1.0f, 2.0f, 2.0f}, sum = 0.0f;
    float *d = (float *)dup_gpu(h, sizeof h);
    const size_t c1 = G->alloc_count(), b1 = G->allocated_bytes();
    G->memory_freeze(1);
    void *q = G->alloc(4096);
    G->sum_squares(d + 2, d, 2); // reduction scratch: reserved at init
    G->synchronize();
    G->copy_d2h(&sum, d + 2, 4);
    report("frozen: alloc fails", "4096 B", 0, 0, q == NULL && G->alloc_count() == c1 && G->allocated_bytes() == b1);
    report("frozen: ops still run", "sum_squares", fabs(sum - 7.0f), 0, sum == 7.0f);
    G->memory_freeze(0);
    q = G->alloc(4096);
    report("thawed: alloc works", "4096 B", 0, 0, q != NULL && G->alloc_count() == c1 + 1);
    G->release(q);
    G->release(d);
    // out of memory: NULL, counted nowhere
    const size_t c2 = G->alloc_count(), b2 = G->allocated_bytes();
    void *huge = G->alloc((size_t)1 << 52);
    report("out of memory: NULL", "4 PiB", 0, 0, huge == NULL && G->alloc_count() == c2 && G->allocated_bytes() == b2);
    if (huge) G->release(huge);

    // Scratch growth while frozen aborts with the size and purpose. A forked child shows it
    // on the simulator (a CUDA context does not survive fork on a real device).
    if (on_simulator()) {
        int fds[2];
        if (pipe(fds) != 0) {
            report("frozen: scratch growth aborts", "pipe failed", 0, 0, 0);
            return;
        }
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            dup2(fds[1], 2);
            const int n = 1, c = 1 << 20; // rmsnorm dw partials: 8 MiB, more than any earlier call
            float *x = (float *)G->alloc((size_t)c * 4), *r = (float *)G->alloc(4);
            float *w = (float *)G->alloc((size_t)c * 4);
            G->memory_freeze(1);
            G->rmsnorm_backward_weight(w, x, x, r, n, c, 1);
            _exit(0); // not reached: the growth aborts
        }
        close(fds[1]);
        char msg[1024] = "";
        size_t got = 0;
        ssize_t k;
        while (got + 1 < sizeof msg && (k = read(fds[0], msg + got, sizeof msg - 1 - got)) > 0) got += (size_t)k;
        msg[got] = 0;
        close(fds[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        int ok = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && strstr(msg, "cuda: device allocation of") &&
            strstr(msg, "requested during training") && strstr(msg, "rmsnorm weight-gradient");
        report("frozen: scratch growth aborts", "rmsnorm dw 8 MiB (child)", 0, 0, ok);
        if (!ok) fprintf(stderr, "child stderr: %s\n", msg);
    }
}

// ----------------------------------------------------------------------------
// a full step of a small Llama 3 on both backends

// dt = TETRA_BF16: both models in mixed precision (bf16 compute copies and activations,
// fp32 gradients and master weights, adamw_step_bf16). The backends' GEMMs accumulate in
// different orders, each bf16 rounding of an activation can land one ulp apart (2^-8
// relative), and on a GPU cuDNN's attention rounds P and dS to bf16 inside, so the
// tolerances are those of a bf16 computation: loss 5e-3 (step 1) and 1e-2 (after
// optimizer steps), gradients 5e-2 relative to each tensor's largest value (the
// simulator, built-in attention, measures about 5e-6 and 3e-3).
static void test_full_step(tetra_dtype dt) {
    const int bf16 = dt == TETRA_BF16;
    const char *tag = bf16 ? "full step bf16" : "full step";
    const double tol_loss1 = bf16 ? 5e-3 : 1e-5, tol_loss = bf16 ? 1e-2 : 1e-4, tol_grad = bf16 ? 5e-2 : 1e-4;
    char name[64];
    llama3_args args;
    char err[512];
    if (llama3_flavor("tiny", &args) != 0) {
        report("full step: flavor tiny", "missing", 0, 0, 0);
        return;
    }
    const int B = 2, T = 48, n = B * T;
    llama3_model mc, mg;
    if (llama3_model_init(&mc, &args, T, C, err, sizeof err) != 0 ||
        llama3_model_init(&mg, &args, T, G, err, sizeof err) != 0) {
        report("full step: model init", err, 0, 0, 0);
        return;
    }
    llama3_init_weights(&mc, 1234);
    llama3_init_weights(&mg, 1234);
    if (bf16 &&
        (llama3_model_set_compute_dtype(&mc, TETRA_BF16, err, sizeof err) != 0 ||
         llama3_model_set_compute_dtype(&mg, TETRA_BF16, err, sizeof err) != 0)) {
        report("full step bf16: compute dtype", err, 0, 0, 0);
        return;
    }
    llama3_acts *ac = llama3_acts_create(&mc, B, T, err, sizeof err);
    llama3_acts *ag = llama3_acts_create(&mg, B, T, err, sizeof err);
    if (!ac || !ag) {
        report("full step: activations", err, 0, 0, 0);
        return;
    }
    int32_t in[96], tg[96];
    for (int i = 0; i < n; i++) {
        in[i] = (int32_t)(rnd() % (uint32_t)args.vocab_size);
        tg[i] = (int32_t)(rnd() % (uint32_t)args.vocab_size);
    }
    tg[5] = OPS_IGNORE_INDEX;
    const size_t total = mc.total_numel;
    float *mom_c[2], *mom_g[2];
    for (int i = 0; i < 2; i++) {
        mom_c[i] = (float *)C->alloc(total * 4);
        mom_g[i] = (float *)G->alloc(total * 4);
        C->fill(mom_c[i], 0.0f, total);
        G->fill(mom_g[i], 0.0f, total);
    }
    char shape[160];
    size_t count_after_warmup = 0, bytes_after_warmup = 0;
    for (int step = 1; step <= 4; step++) {
        if (step == 2) { // step 1 warmed up: nothing allocates from here on
            count_after_warmup = G->alloc_count();
            bytes_after_warmup = G->allocated_bytes();
        }
        int64_t nv_c = 0, nv_g = 0;
        llama3_zero_grads(&mc);
        llama3_zero_grads(&mg);
        double lc = llama3_forward(&mc, ac, in, tg, 1.0f / 95.0f, &nv_c);
        double lg = llama3_forward(&mg, ag, in, tg, 1.0f / 95.0f, &nv_g);
        float flc = (float)(lc / (double)nv_c), flg = (float)(lg / (double)nv_g);
        snprintf(shape, sizeof shape, "tiny B%d T%d step %d (cpu %.6f)", B, T, step, (double)flc);
        // after optimizer steps the two runs' parameters differ by the rounding of every
        // earlier op (and AdamW's first steps amplify it where gradients are near 0)
        snprintf(name, sizeof name, "%s: loss", tag);
        check_close(name, shape, &flg, &flc, 1, step == 1 ? tol_loss1 : tol_loss);
        if (step == 4) break;
        llama3_backward(&mc, ac);
        llama3_backward(&mg, ag);
        float *gc = (float *)malloc(total * 4), *gg = (float *)from_gpu(mg.grad_mem, total * 4);
        C->copy_d2h(gc, mc.grad_mem, total * 4);
        if (step == 1) {
            // every parameter's gradient, worst one reported
            double worst = 0.0;
            const char *worst_name = "-";
            int bad = 0;
            for (int i = 0; i < mc.n_params; i++) {
                const llama3_param *p = &mc.params[i];
                int mismatch;
                double e = rel_err(gg + p->offset, gc + p->offset, p->numel, &mismatch);
                if (mismatch) bad = 1;
                if (e > worst) {
                    worst = e;
                    worst_name = p->name;
                }
            }
            snprintf(shape, sizeof shape, "%d params, worst %s", mc.n_params, worst_name);
            snprintf(name, sizeof name, "%s: gradients", tag);
            report(name, shape, bad ? INFINITY : worst, tol_grad, !bad && worst <= tol_grad);
        }
        free(gc);
        free(gg);
        if (bf16) { // fp32 master weights, then the bf16 compute copy in the same pass
            C->adamw_step_bf16(mc.param_mem, mc.param_bf16, mom_c[0], mom_c[1], mc.grad_mem, total, 1e-3, 0.9, 0.95,
                               1e-8, 0.1, step, 1.0f, NULL);
            G->adamw_step_bf16(mg.param_mem, mg.param_bf16, mom_g[0], mom_g[1], mg.grad_mem, total, 1e-3, 0.9, 0.95,
                               1e-8, 0.1, step, 1.0f, NULL);
        } else {
            C->adamw_step(mc.param_mem, mom_c[0], mom_c[1], mc.grad_mem, total, 1e-3, 0.9, 0.95, 1e-8, 0.1, step, 1.0f,
                          NULL);
            G->adamw_step(mg.param_mem, mom_g[0], mom_g[1], mg.grad_mem, total, 1e-3, 0.9, 0.95, 1e-8, 0.1, step, 1.0f,
                          NULL);
        }
    }
    snprintf(shape, sizeof shape, "steps 2-4: %zu allocs, %+lld bytes", G->alloc_count() - count_after_warmup,
             (long long)G->allocated_bytes() - (long long)bytes_after_warmup);
    snprintf(name, sizeof name, "%s: no device allocation", tag);
    report(name, shape, 0, 0, G->alloc_count() == count_after_warmup && G->allocated_bytes() == bytes_after_warmup);
    for (int i = 0; i < 2; i++) {
        C->release(mom_c[i]);
        G->release(mom_g[i]);
    }
    llama3_acts_free(&mc, ac);
    llama3_acts_free(&mg, ag);
    llama3_model_free(&mc);
    llama3_model_free(&mg);
}

// ----------------------------------------------------------------------------
// the trainer's own step on the device: FSDP hooks and working buffers (bf16 gathered
// under mixed precision), activation checkpointing (op-level: recompute in the I pass),
// clipping and AdamW, through trainer_capi (engine/trainer_capi.c), against the same
// trainer on the CPU. Under mpirun with memory MPI can move (the simulator), FSDP
// shards over the ranks (the per-unit working-buffer paths on the CUDA kernels), then
// tensor parallel splits the model over them, then pipeline parallel (ZBV: two stages
// per rank, point-to-point messages of device buffers, the V's turn as a device copy),
// then context parallel (attention on blocks at global offsets, all-gather and ring).

void *trainer_capi_create(int argc, char **argv, char *err, size_t errlen);
void trainer_capi_free(void *h);
const char *trainer_capi_backend(void *h);
double trainer_capi_step(void *h, const int32_t *inputs, const int32_t *labels, double *grad_norm, double *lr);

static int run_trainer(const char *device, int bf16, int world, int rank, int tp, int pp, int cp, double *loss,
                       double *gnorm, int steps) {
    char gb[16], tps[16], pps[16], cps[16], *argv[56];
    int argc = 0;
    snprintf(gb, sizeof gb, "%d", 2 * world / tp / pp / cp);
    snprintf(cps, sizeof cps, "%d", cp);
    snprintf(tps, sizeof tps, "%d", tp);
    snprintf(pps, sizeof pps, "%d", pp);
    const char *fixed[] = {"train",     "--model.flavor",
                           "tiny",      "--training.seq_len",
                           "32",        "--training.local_batch_size",
                           "2",         "--training.steps",
                           "10",        "--training.seed",
                           "5",         "--training.threads",
                           "1",         "--activation_checkpoint.mode",
                           "selective", "--activation_checkpoint.selective_ac_option",
                           "op",        "--lr_scheduler.warmup_steps",
                           "1",         "--training.global_batch_size"};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) argv[argc++] = (char *)fixed[i];
    argv[argc++] = gb;
    argv[argc++] = (char *)"--training.device";
    argv[argc++] = (char *)device;
    argv[argc++] = (char *)"--training.mixed_precision_param";
    argv[argc++] = (char *)(bf16 ? "bfloat16" : "float32");
    argv[argc++] = (char *)"--parallelism.tensor_parallel_degree";
    argv[argc++] = tps;
    argv[argc++] = (char *)"--parallelism.pipeline_parallel_degree";
    argv[argc++] = pps;
    argv[argc++] = (char *)"--parallelism.pipeline_parallel_schedule";
    argv[argc++] = (char *)"ZBVZeroBubble";
    argv[argc++] = (char *)"--parallelism.context_parallel_degree";
    argv[argc++] = cps;
    argv[argc++] = (char *)"--parallelism.context_parallel_rotate_method";
    argv[argc++] = (char *)(bf16 ? "alltoall" : "allgather");
    char err[2048];
    void *h = trainer_capi_create(argc, argv, err, sizeof err);
    if (!h) {
        fprintf(stderr, "trainer on %s: %s\n", device, err);
        return -1;
    }
    const char *want = strcmp(device, "cpu") ? "cuda" : "cpu";
    if (strcmp(trainer_capi_backend(h), want) != 0) {
        fprintf(stderr, "trainer on %s: computes on %s, not %s\n", device, trainer_capi_backend(h), want);
        trainer_capi_free(h);
        return -1;
    }
    uint64_t st = 77 + 1000 * (uint64_t)rank;
    for (int s = 0; s < steps; s++) {
        int32_t in[64], lab[64];
        for (int i = 0; i < 64; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            in[i] = (int32_t)((st >> 33) % 2048);
            lab[i] = (int32_t)((st >> 13) % 2048);
        }
        lab[7] = OPS_IGNORE_INDEX;
        loss[s] = trainer_capi_step(h, in, lab, &gnorm[s], NULL);
    }
    trainer_capi_free(h);
    return 0;
}

static void finalize_mpi(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

static void test_trainer(int bf16, int tp, int pp, int cp) {
    int world = 1, rank = 0, inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided;
        MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        atexit(finalize_mpi);
    }
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    enum { STEPS = 3 };
    double lc[STEPS], gc[STEPS], lg[STEPS], gg[STEPS];
    char name[64], shape[160];
    if (world % (tp * pp * cp)) return;
    snprintf(name, sizeof name, "trainer %s%s", bf16 ? "bf16" : "fp32",
             tp > 1       ? " tp"
                 : pp > 1 ? " pp"
                 : cp > 1 ? " cp"
                          : "");
    /* "auto" is the device here (the configuration refuses "cuda" in a build whose library
     * has no CUDA backend of its own, as the simulator's) */
    if (run_trainer("cpu", bf16, world, rank, tp, pp, cp, lc, gc, STEPS) ||
        run_trainer("auto", bf16, world, rank, tp, pp, cp, lg, gg, STEPS)) {
        report(name, "setup failed", 0, 0, 0);
        return;
    }
    for (int s = 0; s < STEPS; s++) {
        float fc[2] = {(float)lc[s], (float)gc[s]}, fg[2] = {(float)lg[s], (float)gg[s]};
        snprintf(shape, sizeof shape, "tiny, %s %d, AC op, step %d: loss, grad norm",
                 tp > 1          ? "tp"
                     : pp > 1    ? "pp (ZBV)"
                     : cp > 1    ? (bf16 ? "cp ring" : "cp allgather")
                     : world > 1 ? "fsdp"
                                 : "ranks",
                 tp > 1       ? tp
                     : pp > 1 ? pp
                     : cp > 1 ? cp
                              : world,
                 s + 1);
        check_close(name, shape, fg, fc, 2, bf16 ? (s ? 2e-2 : 5e-3) : (s ? 1e-4 : 1e-5));
    }
}

// ----------------------------------------------------------------------------
// launch counts against the backend's shape-only description (kernels/op_costs.h)
//
// Simulator only (its counters): every op through the recording table (kernels/ops_record.h)
// wrapped around the simulated backend, and for each call the kernels launched
// (sim_launch), cuBLASLt matmuls, CUB sorts and stream copies/memsets the simulator saw
// must equal what the description says for the same arguments, and the GEMM and bf16
// attention paths the backend reports must be the described ones. Several shapes, every
// dtype path of the GEMM (f32, bf16, each fp8 layout, rowwise with and without cuBLASLt's
// outer-vector scales, the widened and epilogue fallbacks, k = 0, batches), aligned and
// unaligned pointers, empty and fully masked calls. Then whole training steps of a small
// model through the trainer (bf16 with op-level AC, float8 tensorwise): the simulator's
// counts over the step equal the sum of the recorded descriptions.

#ifdef TETRA_CUDA_LINKED
typedef struct {
    long k, g, s, c;
} sim_counts;

static sim_counts sim_now(void) {
    sim_counts n = {sim_launches, sim_gemm_calls, sim_sorts, sim_copies};
    return n;
}

static op_cost_device sim_device(void) {
    op_cost_device d;
    memset(&d, 0, sizeof d);
    d.sm_major = 9; /* the simulator's cudaGetDeviceProperties */
    d.cudnn_version = cuda_cudnn_version();
    d.outer_vector_scales = getenv("SIM_NO_OUTER") == NULL;
    return d;
}

/* the records since n0 (one call) against the simulator's counts since b; path: what the
 * backend reports for the call (NULL: not checked) */
static void launches_check(const char *shape, sim_counts b, size_t n0, const char *path) {
    const ops_record_entry *e = ops_record_entries();
    const size_t n = ops_record_count();
    op_cost want;
    memset(&want, 0, sizeof want);
    for (size_t i = n0; i < n; i++) op_cost_add(&want, &e[i].cost);
    const sim_counts a = sim_now();
    const long k = a.k - b.k, g = a.g - b.g, s = a.s - b.s, c = a.c - b.c;
    const char *wpath = n > n0 ? e[n0].cost.path : "";
    int ok = n == n0 + 1 && k == want.kernels && g == want.gemms && s == want.sorts && c == want.copies &&
        want.cudnn == 0 && (!path || !wpath[0] || !strcmp(path, wpath));
    char name[64], what[200];
    snprintf(name, sizeof name, "launches %s", n > n0 ? op_kind_name(e[n0].cost.op) : "(none recorded)");
    snprintf(what, sizeof what, "%s: k %ld/%d g %ld/%d s %ld/%d c %ld/%d%s%s%s%s", shape, k, want.kernels, g,
             want.gemms, s, want.sorts, c, want.copies, wpath[0] ? " " : "", wpath, path && wpath[0] ? " = " : "",
             path && wpath[0] ? path : "");
    report(name, what, 0, 0, ok);
}

#define LC(shape, path, call)                                                                                          \
    do {                                                                                                               \
        const sim_counts b_ = sim_now();                                                                               \
        const size_t n0_ = ops_record_count();                                                                         \
        call;                                                                                                          \
        launches_check(shape, b_, n0_, path);                                                                          \
    } while (0)

static ops_gemm_desc lc_gemm(tetra_dtype a, tetra_dtype b, tetra_dtype c, int ta, int tb, int m, int n, int k,
                             float beta) {
    ops_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.a_type = a;
    g.b_type = b;
    g.c_type = c;
    g.trans_a = ta;
    g.trans_b = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.lda = ta ? m : k;
    g.ldb = tb ? k : n;
    g.ldc = n;
    g.alpha = 1.0f;
    g.beta = beta;
    return g;
}

static void lc_gemms(const tetra_ops *R, char *A, char *B, char *Cm, float *sa, float *sb) {
    const tetra_dtype F = TETRA_F32, H = TETRA_BF16, E4 = TETRA_FP8_E4M3, E5 = TETRA_FP8_E5M2;
    struct {
        const char *what;
        ops_gemm_desc g;
        int scaled, a_off, c_off;
    } cs[] = {
        {"f32 NN", lc_gemm(F, F, F, 0, 0, 24, 40, 8, 0.0f), 0, 0, 0},
        {"bf16 NT +C", lc_gemm(H, H, H, 0, 1, 32, 48, 16, 1.0f), 0, 0, 0},
        {"bf16 TN -> f32 +C", lc_gemm(H, H, F, 1, 0, 48, 32, 64, 1.0f), 0, 0, 0},
        {"f32 -> bf16 (epilogue)", lc_gemm(F, F, H, 0, 1, 16, 16, 16, 0.0f), 0, 0, 0},
        {"bf16 scaled (epilogue)", lc_gemm(H, H, H, 0, 1, 16, 32, 16, 0.0f), 1, 0, 0},
        {"e4m3 x e4m3^T (K-major)", lc_gemm(E4, E4, H, 0, 1, 32, 48, 64, 0.0f), 1, 0, 0},
        {"e5m2 x e4m3 (B packed)", lc_gemm(E5, E4, H, 0, 0, 32, 64, 48, 1.0f), 1, 0, 0},
        {"e5m2^T x e4m3 (both packed)", lc_gemm(E5, E4, F, 1, 0, 48, 32, 64, 0.0f), 1, 0, 0},
        {"e5m2 x e5m2 (widened)", lc_gemm(E5, E5, F, 0, 1, 32, 32, 32, 0.0f), 1, 0, 0},
        {"e4m3 m=24 (widened)", lc_gemm(E4, E4, H, 0, 1, 24, 32, 32, 0.0f), 1, 0, 0},
        {"e4m3 x bf16 (A widened)", lc_gemm(E4, H, F, 0, 1, 32, 32, 32, 0.0f), 0, 0, 0},
        {"e4m3 A at +16 (in place)", lc_gemm(E4, E4, F, 0, 1, 16, 32, 48, 0.0f), 1, 16, 0},
        {"e4m3 A at +1 (packed)", lc_gemm(E4, E4, F, 0, 1, 16, 32, 48, 0.0f), 1, 1, 0},
        {"e4m3 C at +2 (widened)", lc_gemm(E4, E4, H, 0, 1, 16, 32, 48, 0.0f), 1, 0, 2},
        {"k = 0", lc_gemm(H, H, H, 0, 1, 16, 16, 0, 1.0f), 0, 0, 0},
        {"m = 0", lc_gemm(H, H, H, 0, 1, 0, 16, 16, 0.0f), 0, 0, 0},
    };
    char shape[160];
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        ops_gemm_desc g = cs[i].g;
        if (cs[i].scaled) {
            g.a_scale = sa;
            g.b_scale = sb;
        }
        snprintf(shape, sizeof shape, "gemm %dx%dx%d %s", g.m, g.n, g.k, cs[i].what);
        LC(shape, g.m > 0 ? cuda_gemm_last_path() : NULL, R->gemm(Cm + cs[i].c_off, A + cs[i].a_off, B, &g));
    }
    /* batches */
    ops_gemm_desc g = lc_gemm(H, H, F, 0, 1, 16, 16, 16, 0.0f);
    g.batch = 3;
    g.stride_a = g.stride_b = g.stride_c = 256;
    LC("gemm 16x16x16 bf16 x3", cuda_gemm_last_path(), R->gemm(Cm, A, B, &g));
    g = lc_gemm(E4, E4, F, 0, 1, 16, 16, 16, 0.0f);
    g.batch = 2;
    g.stride_a = g.stride_b = 256;
    g.stride_c = 256;
    g.a_scale = sa;
    g.b_scale = sb;
    LC("gemm 16x16x16 e4m3 x2", cuda_gemm_last_path(), R->gemm(Cm, A, B, &g));
}

/* rowwise fp8: cuBLASLt's outer-vector scales as the simulator offers them, then refused
 * (SIM_NO_OUTER; new shapes, so no cached plan says otherwise) */
static void lc_rowwise(const tetra_ops *G0, char *A, char *B, char *Cm, float *sa, float *sb) {
    const tetra_dtype E4 = TETRA_FP8_E4M3;
    for (int refuse = 0; refuse < 2; refuse++) {
        if (refuse) setenv("SIM_NO_OUTER", "1", 1);
        op_cost_device dev = sim_device();
        const tetra_ops *R = ops_record_table(&dev, G0);
        ops_record_set_active(1);
        for (int tb = 1; tb >= 0; tb--) {
            ops_gemm_desc g = lc_gemm(E4, E4, TETRA_BF16, 0, tb, 32 + 16 * refuse, 48, 32, 1.0f);
            g.a_scale = sa;
            g.b_scale = sb;
            g.scale_rowwise = 1;
            char shape[96];
            snprintf(shape, sizeof shape, "gemm rowwise %s%s", tb ? "NT" : "NN", refuse ? ", outer refused" : "");
            LC(shape, cuda_gemm_last_path(), R->gemm(Cm, A, B, &g));
        }
        if (refuse) unsetenv("SIM_NO_OUTER");
    }
}

static void lc_elementwise(const tetra_ops *R, float *X, float *Y, float *Z, uint16_t *H, uint8_t *Q, float *S) {
    for (int u = 0; u < 2; u++) { /* 16-byte aligned, then not (the scalar kernels) */
        float *x = X + u, *y = Y + u;
        LC(u ? "unaligned" : "n=1000", NULL, R->fill(x, 1.0f, 1000));
        LC(u ? "unaligned" : "n=1000", NULL, R->scale(x, 0.5f, 1000));
        LC(u ? "unaligned" : "n=1000", NULL, R->axpy(y, x, 0.5f, 1000));
        LC(u ? "unaligned" : "n=1000", NULL, R->add(Z, x, y, 1000));
    }
    LC("n=0", NULL, R->fill(X, 1.0f, 0));
    LC("n=0", NULL, R->sum_squares(Z, X, 0));
    LC("n=20000", NULL, R->sum_squares(Z, X, 20000));
    LC("n=0", NULL, R->sum(Z, X, 0));
    LC("n=5000", NULL, R->sum(Z, X, 5000));
    LC("n=0", NULL, R->amax(Z, X, 0));
    LC("n=5000", NULL, R->amax(Z, X, 5000));
    LC("n=0", NULL, R->amax_bf16(Z, H, 0));
    LC("n=5001", NULL, R->amax_bf16(Z, H, 5001));
    LC("7x0", NULL, R->amax_rows(Z, X, 7, 0));
    LC("7x33", NULL, R->amax_rows(Z, X, 7, 33));
    LC("7x33", NULL, R->amax_rows_bf16(Z, H, 7, 33));
    LC("0x40", NULL, R->amax_cols(Z, X, TETRA_F32, 0, 40));
    LC("9x40 f32", NULL, R->amax_cols(Z, X, TETRA_F32, 9, 40));
    LC("9x40 bf16", NULL, R->amax_cols(Z, H, TETRA_BF16, 9, 40));
    LC("33x17", NULL, R->transpose(Z, X, 33, 17));
    LC("33x17", NULL, R->transpose_u8(Q, Q + 1024, 33, 17));
    LC("0x17", NULL, R->transpose_u8(Q, Q + 1024, 0, 17));
    LC("n=999", NULL, R->cast_f32_to_bf16(H, X, 999));
    LC("n=999", NULL, R->cast_bf16_to_f32(Z, H, 999));
    LC("5x64 e4m3", NULL, R->cast_f32_to_fp8(Q, X, S, 0, 5, 64, TETRA_FP8_E4M3));
    LC("5x64 e5m2 rowwise", NULL, R->cast_f32_to_fp8(Q, X, S, 1, 5, 64, TETRA_FP8_E5M2));
    LC("5x64 e4m3", NULL, R->cast_bf16_to_fp8(Q, H, S, 0, 5, 64, TETRA_FP8_E4M3));
    LC("5x63 e5m2 at +1", NULL, R->cast_bf16_to_fp8(Q + 1, H + 1, S, 0, 5, 63, TETRA_FP8_E5M2));
    LC("40x24 bf16", NULL, R->cast_transpose_to_fp8(Q, H, TETRA_BF16, S, 40, 24, TETRA_FP8_E4M3));
    LC("40x24 f32", NULL, R->cast_transpose_to_fp8(Q, X, TETRA_F32, S, 40, 24, TETRA_FP8_E5M2));
    LC("64x128 bf16 (whole tiles)", NULL, R->cast_transpose_to_fp8(Q, H, TETRA_BF16, S, 64, 128, TETRA_FP8_E4M3));
    LC("5x64 e4m3 rowwise", NULL, R->cast_fp8_to_f32(Z, Q, S, 1, 5, 64, TETRA_FP8_E4M3));
    LC("n=7", NULL, R->fp8_scale_from_amax(S, S + 8, Z, 7, 0, OPS_FP8_E4M3_MAX, 1));
    LC("n=0", NULL, R->fp8_scale_from_amax(S, NULL, Z, 0, 1, OPS_FP8_E4M3_MAX, 0));
    LC("40x24 bf16 rows", NULL, R->fp8_quantize(Q, NULL, S + 8, H, TETRA_BF16, Z, 40, 24, TETRA_FP8_E4M3));
    LC("5x63 bf16 rows at +1", NULL, R->fp8_quantize(Q + 1, NULL, S + 8, H + 1, TETRA_BF16, Z, 5, 63, TETRA_FP8_E5M2));
    LC("40x24 f32 transposed", NULL, R->fp8_quantize(NULL, Q, S + 8, X, TETRA_F32, Z, 40, 24, TETRA_FP8_E5M2));
    LC("40x24 bf16 both", NULL, R->fp8_quantize(Q, Q + 1024, NULL, H, TETRA_BF16, Z, 40, 24, TETRA_FP8_E4M3));
    LC("64x128 bf16 both (whole tiles)", NULL,
       R->fp8_quantize(Q, Q + 8192, NULL, H, TETRA_BF16, Z, 64, 128, TETRA_FP8_E4M3));
    LC("empty, scale only", NULL, R->fp8_quantize(NULL, NULL, S + 8, H, TETRA_BF16, Z, 0, 24, TETRA_FP8_E4M3));
    LC("n=3000", NULL, R->adamw_step(X, Y, Z, X + 4096, 3000, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1, 1.0f, NULL));
    LC("n=3000", NULL, R->adamw_step_bf16(X, H, Y, Z, X + 4096, 3000, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1, 1.0f, NULL));
    {
        const int64_t so[2] = {10, 2000}, sl[2] = {1500, 1000};
        int64_t *ds = (int64_t *)R->alloc(sizeof so + sizeof sl);
        R->copy_h2d(ds, so, sizeof so);
        R->copy_h2d(ds + 2, sl, sizeof sl);
        const ops_amax_segments seg = {2, ds, ds + 2, S + 16};
        LC("n=3000, 2 stretches", NULL,
           R->adamw_step_amax(X, H, Y, Z, X + 4096, 3000, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1, 1.0f, NULL, &seg));
        R->release(ds);
    }
    float h[4] = {1, 2, 3, 4};
    LC("16 B", NULL, R->copy_h2d(X, h, sizeof h));
    LC("16 B", NULL, R->copy_d2h(h, X, sizeof h));
    LC("4000 B", NULL, R->copy(Y, X, 4000));
    LC("in place", NULL, R->copy(X, X, 4000));
    LC("9 x 40 B", NULL, R->copy_2d(Y, 64, X, 48, 40, 9));
}

static void lc_layers(const tetra_ops *R, float *X, float *Y, float *Z, uint16_t *H, float *W, int32_t *tok) {
    int32_t ht[24];
    for (int i = 0; i < 24; i++) ht[i] = (i * 7) % 50;
    R->copy_h2d(tok, ht, sizeof ht);
    const tetra_dtype dts[2] = {TETRA_F32, TETRA_BF16};
    for (int i = 0; i < 2; i++) {
        const int b = dts[i] == TETRA_BF16;
        char s[64];
        snprintf(s, sizeof s, "24x32 %s", b ? "bf16" : "f32");
        if (b) {
            LC(s, NULL, R->embedding_forward_bf16(H, tok, H + 4096, 24, 32, 10, 30));
            LC(s, NULL, R->embedding_backward_bf16(W, H, tok, 24, 32, 10, 30));
            LC(s, NULL, R->rmsnorm_forward_bf16(H, Z, NULL, H + 2048, H + 4096, 24, 32, 1e-5f));
            LC("24x32 with amax", NULL, R->rmsnorm_forward_bf16(H, Z, Y + 200000, H + 2048, H + 4096, 24, 32, 1e-5f));
            LC("2100x8 with amax", NULL, R->rmsnorm_forward_bf16(H, Z, Y + 200000, H + 8192, H + 4096, 2100, 8, 1e-5f));
            LC("0x8 with amax", NULL, R->rmsnorm_forward_bf16(H, Z, Y + 200000, H + 8192, H + 4096, 0, 8, 1e-5f));
            LC(s, NULL, R->rmsnorm_backward_input_bf16(H, NULL, H + 1024, H + 2048, H + 4096, Z, 24, 32, NULL));
            LC("24x32 with amax", NULL,
               R->rmsnorm_backward_input_bf16(H, Y + 200000, H + 1024, H + 2048, H + 4096, Z, 24, 32, NULL));
            LC(s, NULL, R->rmsnorm_backward_weight_bf16(W, H + 1024, H + 2048, Z, 24, 32, 1));
            LC("b2 s12 h2 d16", NULL, R->rope_forward_bf16(H, H, Y, NULL, 0, 2, 12, 2, 16, 32, 32));
            LC("b2 s12 h2 d16", NULL, R->rope_backward_bf16(H, NULL, H + 1024, Y, tok, 0, 2, 12, 2, 16, 32, 32));
            LC("b2 s12 h2 d16 with amax", NULL,
               R->rope_backward_bf16(H, Y + 200000, H + 1024, Y, tok, 0, 2, 12, 2, 16, 32, 32));
            LC("b1 s2048 h4 d64 with amax", NULL,
               R->rope_backward_bf16(H, Y + 200000, H, Y, NULL, 0, 1, 2048, 4, 64, 256, 256));
            LC("empty with amax", NULL, R->rope_backward_bf16(H, Y + 200000, H, Y, NULL, 0, 0, 12, 2, 16, 32, 32));
            LC("n=777", NULL, R->swiglu_forward_bf16(H, NULL, H + 1024, H + 2048, 777));
            LC("n=777", NULL, R->swiglu_backward_bf16(H, H + 1024, NULL, NULL, H + 2048, H, H + 1024, 777));
            LC("n=777 with amax", NULL, R->swiglu_forward_bf16(H, Z, H + 1024, H + 2048, 777));
            LC("n=300000 with amax", NULL, R->swiglu_forward_bf16(H, Z, H, H, 300000));
            LC("n=777 with amax", NULL, R->swiglu_backward_bf16(H, H + 1024, Z, Z + 8, H + 2048, H, H + 1024, 777));
            LC("n=0 with amax", NULL, R->swiglu_backward_bf16(H, H + 1024, NULL, Z + 8, H + 2048, H, H + 1024, 0));
        } else {
            LC(s, NULL, R->embedding_forward(X, tok, Y, 24, 32, 0, 50));
            LC(s, NULL, R->embedding_backward(W, X, tok, 24, 32, 0, 50));
            LC("24x32 vocab 0", NULL, R->embedding_backward(W, X, tok, 24, 32, 0, 0));
            LC(s, NULL, R->rmsnorm_forward(X, Z, Y, W, 24, 32, 1e-5f));
            LC(s, NULL, R->rmsnorm_backward_input(X, Y, Y + 1024, W, Z, 24, 32, NULL));
            LC("300x20", NULL, R->rmsnorm_backward_weight(W, Y, Y + 8192, Z, 300, 20, 1));
            LC("b2 s12 h2 d16", NULL, R->rope_forward(X, X, Y, NULL, 3, 2, 12, 2, 16, 32, 32));
            LC("d=1", NULL, R->rope_backward(X, X, Y, NULL, 0, 2, 12, 2, 1, 2, 2));
            LC("n=777", NULL, R->swiglu_forward(X, Y, Z, 777));
            LC("n=0", NULL, R->swiglu_backward(X, Y, Z, X, Y, 0));
        }
    }
    LC("n=6 v=300", NULL, R->cross_entropy(X, Z, X, tok, 6, 300, 0.1f));
    LC("n=6 v=300 no dlogits", NULL, R->cross_entropy(NULL, Z, X, tok, 6, 300, 0.1f));
    LC("n=6 v=300", NULL, R->cross_entropy_bf16(H, Z, H, tok, 6, 300, 0.1f));
    LC("n=6 v=100", NULL, R->ce_shard_max(Z, X, 6, 100));
    LC("n=6 v=100", NULL, R->ce_shard_sums(Z, Z + 8, X, Z + 16, tok, 6, 100, 0));
    LC("n=6 v=100", NULL, R->ce_shard_finish(X, Z, X, Z + 16, Z, Z + 8, tok, 6, 100, 0, 0.1f));
}

static void lc_attention(const tetra_ops *R, float *X, uint16_t *H, float *L, void *ws) {
    static const int cs[][8] = {/* b, sq, sk, h, kv, d, causal, q_offset (k_offset 0) */
                                {1, 40, 40, 4, 2, 16, 1, 0},
                                {2, 33, 33, 2, 1, 24, 1, 0},
                                {1, 16, 48, 2, 2, 16, 1, 32},
                                {1, 24, 24, 2, 1, 16, 0, 0},
                                {1, 16, 16, 2, 2, 16, 1, -16}};
    const size_t per = 8192; /* elements of each tensor's slot */
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        const int *c = cs[i];
        ops_attn_shape s = {c[0], c[1], c[2], c[3], c[4], c[5], 0.25f, c[6], c[7], 0, NULL, 0};
        char shape[96];
        snprintf(shape, sizeof shape, "b%d sq%d sk%d h%d/%d d%d%s q@%d", c[0], c[1], c[2], c[3], c[4], c[5],
                 c[6] ? " causal" : "", c[7]);
        float *q = X, *k = X + per, *v = X + 2 * per, *o = X + 3 * per, *dq = X + 4 * per, *dk = X + 5 * per,
              *dv = X + 6 * per, *dout = X + 7 * per;
        uint16_t *qh = H, *kh = H + per, *vh = H + 2 * per, *oh = H + 3 * per, *dqh = H + 4 * per, *dkh = H + 5 * per,
                 *dvh = H + 6 * per, *douth = H + 7 * per;
        if (c[7] >= 0) LC(shape, NULL, R->attention_forward(o, L, q, k, v, &s, ws));
        LC(shape, NULL, R->attention_backward(dq, dk, dv, dout, q, k, v, o, L, &s, ws));
        if (c[7] >= 0) LC(shape, cuda_attention_bf16_last_path(), R->attention_forward_bf16(oh, L, qh, kh, vh, &s, ws));
        LC(shape, c[7] >= 0 ? cuda_attention_bf16_last_path() : NULL,
           R->attention_backward_bf16(dqh, dkh, dvh, douth, qh, kh, vh, oh, L, &s, ws));
    }
    LC("b1 sq40 h4 d16", NULL, R->attention_merge(X, L, X + 8192, L + 1024, 1, 40, 4, 16));
}

static void test_launch_counts(void) {
    if (!on_simulator()) return;
    op_cost_device dev = sim_device();
    const tetra_ops *R = ops_record_table(&dev, G);
    if (!R) {
        report("launches: recording table", "-", 0, 0, 0);
        return;
    }
    ops_record_set_active(1);
    const size_t MB = (size_t)1 << 20;
    char *A = (char *)R->alloc(MB), *B = (char *)R->alloc(MB), *Cm = (char *)R->alloc(MB);
    float *X = (float *)R->alloc(MB), *Y = (float *)R->alloc(MB), *Z = (float *)R->alloc(MB);
    float *W = (float *)R->alloc(MB), *S = (float *)R->alloc(MB), *L = (float *)R->alloc(MB);
    uint16_t *H = (uint16_t *)R->alloc(MB);
    void *ws = R->alloc(MB);
    int32_t *tok = (int32_t *)R->alloc(4096);
    R->fill(S, 0.5f, 4096); /* scales */
    lc_gemms(R, A, B, Cm, S, S + 1024);
    lc_elementwise(R, X, Y, Z, H, (uint8_t *)A, S);
    lc_layers(R, X, Y, Z, H, W, tok);
    lc_attention(R, X, H, L, ws);
    lc_rowwise(G, A, B, Cm, S, S + 1024);
    ops_record_set_active(0);
    void *bufs[] = {A, B, Cm, X, Y, Z, W, S, L, H, ws, tok};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) G->release(bufs[i]);
}

/* ---- whole steps: the simulator's counts over the recorded step = the records' sum */

static sim_counts lc_step_begin;
static void lc_mark(void *user, int on) {
    (void)user;
    ops_record_set_active(on);
    if (on) lc_step_begin = sim_now();
}

static void lc_step(const char *what, const char *const *keys, int nkeys) {
    const char *base[] = {"train", "--model.flavor",     "tiny", "--model.n_layers",
                          "1",     "--training.seq_len", "32",   "--training.local_batch_size",
                          "2",     "--training.seed",    "5",    "--training.threads",
                          "1",     "--training.device",  "cuda", "--lr_scheduler.warmup_steps",
                          "1"};
    char *argv[48];
    int argc = 0;
    for (size_t i = 0; i < sizeof base / sizeof *base; i++) argv[argc++] = (char *)base[i];
    for (int i = 0; i < nkeys && argc < 48; i++) argv[argc++] = (char *)keys[i];
    tetra_config cfg;
    cfg_init(&cfg);
    char err[2048] = "";
    op_cost_device dev = sim_device();
    const tetra_ops *R = ops_record_table(&dev, G);
    int rc = cfg_parse_args(&cfg, argc, argv, stdout, err, sizeof err);
    if (!rc) rc = plan_ops_run(&cfg, R, 1, 0, lc_mark, NULL, err, sizeof err);
    cfg_free(&cfg);
    if (rc) {
        fprintf(stderr, "%s: %s\n", what, err);
        report("launches: trainer step", what, 0, 0, 0);
        return;
    }
    const sim_counts a = sim_now();
    op_cost sum;
    memset(&sum, 0, sizeof sum);
    const ops_record_entry *e = ops_record_entries();
    for (size_t i = 0; i < ops_record_count(); i++) op_cost_add(&sum, &e[i].cost);
    const long k = a.k - lc_step_begin.k, g = a.g - lc_step_begin.g, s = a.s - lc_step_begin.s,
               c = a.c - lc_step_begin.c;
    char shape[200];
    snprintf(shape, sizeof shape, "%s, %zu ops: k %ld/%d g %ld/%d s %ld/%d c %ld/%d", what, ops_record_count(), k,
             sum.kernels, g, sum.gemms, s, sum.sorts, c, sum.copies);
    report("launches: trainer step", shape, 0, 0,
           ops_record_count() > 0 && k == sum.kernels && g == sum.gemms && s == sum.sorts && c == sum.copies);
}

static void test_launch_counts_trainer(void) {
    if (!on_simulator()) return;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided;
        MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        atexit(finalize_mpi);
    }
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != 1) return;
    /* (fp32 and rowwise float8 are covered op by op above and, for the op sequence, against
     * the CPU backend by unit/test_op_costs: each simulated step costs seconds) */
    const char *bf16[] = {"--training.mixed_precision_param",
                          "bfloat16",
                          "--activation_checkpoint.mode",
                          "selective",
                          "--activation_checkpoint.selective_ac_option",
                          "op"};
    const char *f8t[] = {"--training.mixed_precision_param", "bfloat16", "--model.converters", "float8"};
    lc_step("tiny 1 block bf16, AC op", bf16, 6);
    lc_step("tiny 1 block float8 tensorwise", f8t, 4);
}
#else
static void test_launch_counts(void) {}
static void test_launch_counts_trainer(void) {}
#endif

int main(int argc, char **argv) {
    /* --trainer: only the trainer section (the simulator or one GPU under mpirun);
     * --trainer-bf16: only its bf16 pipeline and context parallel steps, the two that
     * gpu/test_sim_layouts does not compare (it runs every layout in fp32, and bf16
     * for fsdp x tp) */
    const int trainer_only = argc > 1 && !strcmp(argv[1], "--trainer");
    const int trainer_bf16 = argc > 1 && !strcmp(argv[1], "--trainer-bf16");
    char err[256] = "";
    C = ops_cpu();
    if (cuda_device_count() <= 0) {
        // what a GPU-less host must still get right: a clear error for "cuda", cpu for "auto"
        const tetra_ops *o = ops_get("cuda", err, sizeof err);
        int ok = o == NULL && strstr(err, "no CUDA device") != NULL;
        if (!ok) fprintf(stderr, "FAIL: ops_get(\"cuda\") without a device: %s\n", o ? "returned a table" : err);
        o = ops_get("auto", err, sizeof err);
        if (!o || strcmp(o->name, "cpu") != 0) {
            fprintf(stderr, "FAIL: ops_get(\"auto\") without a device should pick cpu\n");
            ok = 0;
        }
        if (!ok) return EXIT_FAILURE;
        printf("SKIP: no CUDA device (cudaGetDeviceCount = 0)\n");
        return EXIT_SUCCESS;
    }
    G = ops_cuda(err, sizeof err);
    if (!G) {
        fprintf(stderr, "FAIL: ops_cuda: %s\n", err);
        return EXIT_FAILURE;
    }
    char dev[256];
    if (cuda_device_describe(0, dev, (int)sizeof dev) != 0) snprintf(dev, sizeof dev, "?");
    int cudnn = cuda_cudnn_version();
    printf("device: %s; cuDNN: %d.%d.%d\n", dev, cudnn / 10000, (cudnn / 100) % 100, cudnn % 100);
    printf("%-30s %-46s %11s %9s  %s\n", "op", "shape", "error", "tol", "result");

    if (trainer_only) {
        test_trainer(0, 1, 1, 1);
        test_trainer(1, 1, 1, 1);
        test_trainer(0, 2, 1, 1); /* with two ranks: tensor parallel on the device's kernels */
        test_trainer(1, 2, 1, 1);
        test_trainer(0, 1, 2, 1); /* pipeline parallel */
        test_trainer(1, 1, 2, 1);
        test_trainer(0, 1, 1, 2); /* context parallel: attention blocks at global offsets */
        test_trainer(1, 1, 1, 2);
        printf("%d checks, %d failed\n", checks, failures);
        return failures ? EXIT_FAILURE : EXIT_SUCCESS;
    }
    if (trainer_bf16) {
        test_trainer(1, 1, 2, 1);
        test_trainer(1, 1, 1, 2);
        printf("%d checks, %d failed\n", checks, failures);
        return failures ? EXIT_FAILURE : EXIT_SUCCESS;
    }
    test_table();
    test_elementwise();
    test_casts();
    test_gemm();
    test_embedding();
    test_rmsnorm();
    test_rope();
    test_swiglu();
    test_embedding_bf16();
    test_rmsnorm_bf16();
    test_rope_bf16();
    test_rope_rows();
    test_rope_paths();
    test_swiglu_bf16();
    test_attention();
    test_attention_bf16();
    test_attention_bf16_deterministic();
    test_cross_entropy_fused(37, 1000);
    test_cross_entropy_fused(3, 128256);
    test_cross_entropy_sharded();
    test_adamw();
    test_adamw_amax();
    test_optim_scalars();
    test_memory();
    test_copy_2d();
    test_launch_counts();
    test_launch_counts_trainer();
    test_full_step(TETRA_F32);
    // mixed precision end to end, once the CPU table has the bf16 ops to compare with
    if (C->attention_forward_bf16 && C->rmsnorm_forward_bf16 && C->embedding_forward_bf16) test_full_step(TETRA_BF16);
    else printf("full step bf16: skipped (the CPU backend has no bf16 ops yet)\n");
    test_trainer(0, 1, 1, 1);
    test_trainer(1, 1, 1, 1);

    printf("%d checks, %d failed\n", checks, failures);
    return failures ? EXIT_FAILURE : EXIT_SUCCESS;
}
