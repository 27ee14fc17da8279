// tests/unit/test_ops_cpu.c — checks of the CPU backend that need no PyTorch:
// - attention backward against central finite differences of the forward (tiny case);
// - attention split into blocks with global offsets, merged, equals one call (forward,
//   and backward accumulated per block);
// - rounding edge cases of the bf16 / fp8 e4m3fn / e5m2 casts (ties to even,
//   saturation at 448 / 57344, inf, NaN, signed zero, subnormals) and decode round trips;
// - accuracy of the shared exp;
// - the softmax exp of the attention kernels equals the shared exp on its range;
// - memory: the attention workspace, and the heap the op takes besides (counted by
//   wrapping malloc), grow linearly with the sequence, never as S^2;
//   alloc_count / allocated_bytes track alloc and release (also from many threads), a
//   frozen alloc fails while release and the ops' own temporaries keep working;
// - the bf16 twins give the same bits on repeated calls and with any thread count;
// - the op table is complete and selectable.
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "kernels/ops_math.h"
#include "tests/check.h"

// ----------------------------------------------------------------------------
// small helpers

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float randn(void) {
    // xorshift64* + Box-Muller; quality is irrelevant here, reproducibility is not
    double u[2];
    for (int i = 0; i < 2; i++) {
        rng_state ^= rng_state >> 12;
        rng_state ^= rng_state << 25;
        rng_state ^= rng_state >> 27;
        u[i] = ((rng_state * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
    }
    return (float)(sqrt(-2.0 * log(u[0] + 1e-300)) * cos(6.283185307179586 * u[1]));
}

static float *randn_buf(size_t n, float scale) {
    float *x = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = randn() * scale;
    return x;
}

static float *zeros(size_t n) { return (float *)calloc(n, sizeof(float)); }

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static ops_attn_shape shape(int b, int sq, int sk, int h, int kv, int d, int causal, int qo, int ko) {
    ops_attn_shape s = {b, sq, sk, h, kv, d, 1.0f / sqrtf((float)d), causal, qo, ko, NULL, 0};
    return s;
}

// ----------------------------------------------------------------------------
// attention backward vs finite differences

// L = sum(out * w) for a fixed random w, in double
static double attn_loss(const float *q, const float *k, const float *v, const float *w, const ops_attn_shape *s,
                        float *out, float *lse) {
    cpu_attention_forward(out, lse, q, k, v, s, NULL);
    double acc = 0;
    size_t n = (size_t)s->b * s->sq * s->h * s->d;
    for (size_t i = 0; i < n; i++) acc += (double)out[i] * w[i];
    return acc;
}

static void test_attention_fd(void) {
    const int B = 1, S = 6, H = 4, KV = 2, D = 8;
    ops_attn_shape s = shape(B, S, S, H, KV, D, 1, 0, 0);
    size_t nq = (size_t)B * S * H * D, nk = (size_t)B * S * KV * D;
    float *q = randn_buf(nq, 1), *k = randn_buf(nk, 1), *v = randn_buf(nk, 1), *w = randn_buf(nq, 1);
    float *out = zeros(nq), *lse = zeros((size_t)B * H * S);
    float *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nk);
    attn_loss(q, k, v, w, &s, out, lse);
    cpu_attention_backward(dq, dk, dv, w, q, k, v, out, lse, &s, NULL);

    float *tmp_out = zeros(nq), *tmp_lse = zeros((size_t)B * H * S);
    const float h = 1e-2f;
    float *bufs[3] = {q, k, v}, *grads[3] = {dq, dk, dv};
    size_t sizes[3] = {nq, nk, nk};
    const char *names[3] = {"dq", "dk", "dv"};
    for (int t = 0; t < 3; t++) {
        float *fd = zeros(sizes[t]);
        for (size_t i = 0; i < sizes[t]; i++) {
            float keep = bufs[t][i];
            bufs[t][i] = keep + h;
            double lp = attn_loss(q, k, v, w, &s, tmp_out, tmp_lse);
            bufs[t][i] = keep - h;
            double lm = attn_loss(q, k, v, w, &s, tmp_out, tmp_lse);
            bufs[t][i] = keep;
            fd[i] = (float)((lp - lm) / (2.0 * h));
        }
        double e = rel_err(grads[t], fd, sizes[t]);
        printf("  attention %s vs finite differences: rel %.2e\n", names[t], e);
        CHECK(e < 1e-3, "attention %s vs finite differences: rel %.3e", names[t], e);
        free(fd);
    }
    free(q), free(k), free(v), free(w), free(out), free(lse), free(dq), free(dk), free(dv);
    free(tmp_out), free(tmp_lse);
}

// ----------------------------------------------------------------------------
// blocks with offsets + merge == one call

static void copy_rows(float *dst, const float *src, int b, int s_src, int r0, int rows, int width, int s_dst,
                      int to_block) {
    // [B, S, width] row slabs: to_block copies src rows r0.. into dst rows 0..; else back
    for (int bb = 0; bb < b; bb++)
        for (int r = 0; r < rows; r++) {
            if (to_block)
                memcpy(dst + ((size_t)bb * s_dst + r) * width, src + ((size_t)bb * s_src + r0 + r) * width,
                       (size_t)width * sizeof(float));
            else
                memcpy(dst + ((size_t)bb * s_dst + r0 + r) * width, src + ((size_t)bb * s_src + r) * width,
                       (size_t)width * sizeof(float));
        }
}

static void test_attention_blocks(void) {
    const int B = 2, H = 4, KV = 2, D = 16;
    const int bounds[] = {0, 70, 200, 211}; // irregular chunks: 70, 130, 11
    const int nc = 3, S = 211;
    const int wq = H * D, wk = KV * D;
    size_t nq = (size_t)B * S * wq, nk = (size_t)B * S * wk;
    float *q = randn_buf(nq, 1), *k = randn_buf(nk, 1), *v = randn_buf(nk, 1), *dout = randn_buf(nq, 1);
    float *out = zeros(nq), *lse = zeros((size_t)B * H * S);
    float *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nk);
    ops_attn_shape full = shape(B, S, S, H, KV, D, 1, 0, 0);
    cpu_attention_forward(out, lse, q, k, v, &full, NULL);
    cpu_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, &full, NULL);

    float *bout = zeros(nq), *blse = zeros((size_t)B * H * S);
    float *bdq = zeros(nq), *bdk = zeros(nk), *bdv = zeros(nk);
    for (int i = 0; i < nc; i++) {
        int q0 = bounds[i], sq = bounds[i + 1] - q0;
        float *qi = zeros((size_t)B * sq * wq), *doi = zeros((size_t)B * sq * wq);
        float *acc_o = zeros((size_t)B * sq * wq), *acc_l = zeros((size_t)B * H * sq);
        float *ob = zeros((size_t)B * sq * wq), *lb = zeros((size_t)B * H * sq), *dqi = zeros((size_t)B * sq * wq);
        copy_rows(qi, q, B, S, q0, sq, wq, sq, 1);
        copy_rows(doi, dout, B, S, q0, sq, wq, sq, 1);
        for (size_t t = 0; t < (size_t)B * H * sq; t++) acc_l[t] = -INFINITY;
        for (int j = 0; j < nc; j++) {
            int k0 = bounds[j], sk = bounds[j + 1] - k0;
            float *kj = zeros((size_t)B * sk * wk), *vj = zeros((size_t)B * sk * wk);
            copy_rows(kj, k, B, S, k0, sk, wk, sk, 1);
            copy_rows(vj, v, B, S, k0, sk, wk, sk, 1);
            ops_attn_shape bs = shape(B, sq, sk, H, KV, D, 1, q0, k0);
            cpu_attention_forward(ob, lb, qi, kj, vj, &bs, NULL);
            cpu_attention_merge(acc_o, acc_l, ob, lb, B, sq, H, D);
            free(kj), free(vj);
        }
        for (int j = 0; j < nc; j++) {
            int k0 = bounds[j], sk = bounds[j + 1] - k0;
            float *kj = zeros((size_t)B * sk * wk), *vj = zeros((size_t)B * sk * wk);
            float *dkj = zeros((size_t)B * sk * wk), *dvj = zeros((size_t)B * sk * wk);
            copy_rows(kj, k, B, S, k0, sk, wk, sk, 1);
            copy_rows(vj, v, B, S, k0, sk, wk, sk, 1);
            copy_rows(dkj, bdk, B, S, k0, sk, wk, sk, 1);
            copy_rows(dvj, bdv, B, S, k0, sk, wk, sk, 1);
            ops_attn_shape bs = shape(B, sq, sk, H, KV, D, 1, q0, k0);
            cpu_attention_backward(dqi, dkj, dvj, doi, qi, kj, vj, acc_o, acc_l, &bs, NULL);
            copy_rows(bdk, dkj, B, sk, k0, sk, wk, S, 0);
            copy_rows(bdv, dvj, B, sk, k0, sk, wk, S, 0);
            free(kj), free(vj), free(dkj), free(dvj);
        }
        copy_rows(bout, acc_o, B, sq, q0, sq, wq, S, 0);
        copy_rows(bdq, dqi, B, sq, q0, sq, wq, S, 0);
        for (int bb = 0; bb < B; bb++)
            for (int hh = 0; hh < H; hh++)
                memcpy(blse + ((size_t)bb * H + hh) * S + q0, acc_l + ((size_t)bb * H + hh) * sq,
                       (size_t)sq * sizeof(float));
        free(qi), free(doi), free(acc_o), free(acc_l), free(ob), free(lb), free(dqi);
    }
    double eo = rel_err(bout, out, nq), el = rel_err(blse, lse, (size_t)B * H * S);
    double eq = rel_err(bdq, dq, nq), ek = rel_err(bdk, dk, nk), ev = rel_err(bdv, dv, nk);
    printf("  attention 3x3 blocks + merge vs one call: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", eo, el, eq, ek,
           ev);
    CHECK(eo < 1e-6 && el < 1e-6, "blockwise forward differs: out %.3e lse %.3e", eo, el);
    CHECK(eq < 1e-6 && ek < 1e-6 && ev < 1e-6, "blockwise backward differs: %.3e %.3e %.3e", eq, ek, ev);

    // same inputs twice: bit-identical (no atomics, fixed reduction orders); and the other
    // backward schedule agrees up to summation order
    for (int mode = 1; mode <= 2; mode++) {
        float *dq2 = zeros(nq), *dk2 = zeros(nk), *dv2 = zeros(nk);
        float *dq3 = zeros(nq), *dk3 = zeros(nk), *dv3 = zeros(nk);
        cpu_attention_set_backward_mode(mode);
        cpu_attention_backward(dq2, dk2, dv2, dout, q, k, v, out, lse, &full, NULL);
        cpu_attention_backward(dq3, dk3, dv3, dout, q, k, v, out, lse, &full, NULL);
        CHECK(!memcmp(dq3, dq2, nq * 4) && !memcmp(dk3, dk2, nk * 4) && !memcmp(dv3, dv2, nk * 4),
              "attention backward (mode %d) is not deterministic", mode);
        double e = rel_err(dq2, dq, nq) + rel_err(dk2, dk, nk) + rel_err(dv2, dv, nk);
        CHECK(e < 1e-6, "attention backward mode %d differs from the automatic one: %.3e", mode, e);
        free(dq2), free(dk2), free(dv2), free(dq3), free(dk3), free(dv3);
    }
    cpu_attention_set_backward_mode(0);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    free(bout), free(blse), free(bdq), free(bdk), free(bdv);
}

// The 16-wide (AVX-512) tile kernel gives the bits of the 8-wide one: each output element
// is the same FMA chain whatever the vector width. Head dims 16 (8-row tiles), 24 (padded
// edges) and 64 (4 x 32 tiles); both backward schedules; a length off the tile grid.
static void test_attention_vector_width(void) {
    int wide = cpu_attention_set_vector_width(0);
    if (wide != 16) {
        printf("  attention vector width: this CPU runs the 8-wide kernel only (no x86-64-v4); nothing to compare\n");
        return;
    }
    const int dims[] = {16, 24, 64};
    for (int di = 0; di < 3; di++) {
        const int B = 1, H = 4, KV = 2, D = dims[di], S = 150;
        size_t nq = (size_t)B * S * H * D, nk = (size_t)B * S * KV * D, nl = (size_t)B * H * S;
        float *q = randn_buf(nq, 1), *k = randn_buf(nk, 1), *v = randn_buf(nk, 1), *dout = randn_buf(nq, 1);
        ops_attn_shape s = shape(B, S, S, H, KV, D, 1, 0, 0);
        for (int mode = 1; mode <= 2; mode++) {
            float *o[2], *l[2], *gq[2], *gk[2], *gv[2];
            cpu_attention_set_backward_mode(mode);
            for (int w = 0; w < 2; w++) {
                cpu_attention_set_vector_width(w ? 8 : 16);
                o[w] = zeros(nq), l[w] = zeros(nl), gq[w] = zeros(nq), gk[w] = zeros(nk), gv[w] = zeros(nk);
                cpu_attention_forward(o[w], l[w], q, k, v, &s, NULL);
                cpu_attention_backward(gq[w], gk[w], gv[w], dout, q, k, v, o[w], l[w], &s, NULL);
            }
            CHECK(!memcmp(o[0], o[1], nq * 4) && !memcmp(l[0], l[1], nl * 4),
                  "attention forward, head_dim %d: 16-wide and 8-wide kernels differ", D);
            CHECK(!memcmp(gq[0], gq[1], nq * 4) && !memcmp(gk[0], gk[1], nk * 4) && !memcmp(gv[0], gv[1], nk * 4),
                  "attention backward (mode %d), head_dim %d: 16-wide and 8-wide kernels differ", mode, D);
            for (int w = 0; w < 2; w++) free(o[w]), free(l[w]), free(gq[w]), free(gk[w]), free(gv[w]);
        }
        free(q), free(k), free(v), free(dout);
    }
    cpu_attention_set_backward_mode(0);
    cpu_attention_set_vector_width(0);
    printf("  attention: 16-wide and 8-wide tile kernels bit-identical (head_dim 16, 24, 64)\n");
}

// a query block that sees no key at all: zeros and lse = -inf, and merging it is a no-op
static void test_attention_masked_block(void) {
    const int B = 1, H = 2, KV = 1, D = 8, sq = 10, sk = 12;
    ops_attn_shape s = shape(B, sq, sk, H, KV, D, 1, 0, 50); // keys 50..61 after queries 0..9
    float *q = randn_buf((size_t)sq * H * D, 1), *k = randn_buf((size_t)sk * KV * D, 1);
    float *v = randn_buf((size_t)sk * KV * D, 1);
    float *out = randn_buf((size_t)sq * H * D, 1), *lse = zeros((size_t)H * sq);
    cpu_attention_forward(out, lse, q, k, v, &s, NULL);
    int bad = 0;
    for (int i = 0; i < sq * H * D; i++) bad += out[i] != 0.0f;
    for (int i = 0; i < sq * H; i++) bad += lse[i] != -INFINITY;
    CHECK(!bad, "fully masked block: %d entries not (0, -inf)", bad);
    float *acc = randn_buf((size_t)sq * H * D, 1), *acc_l = randn_buf((size_t)H * sq, 1);
    float *acc0 = (float *)malloc((size_t)sq * H * D * 4);
    memcpy(acc0, acc, (size_t)sq * H * D * 4);
    cpu_attention_merge(acc, acc_l, out, lse, B, sq, H, D);
    CHECK(!memcmp(acc, acc0, (size_t)sq * H * D * 4), "merging an empty block changed the result");
    free(q), free(k), free(v), free(out), free(lse), free(acc), free(acc_l), free(acc0);
}

// ----------------------------------------------------------------------------
// memory: workspace linear in S

// Every heap block the library's code takes goes through these (the test is linked with
// --wrap for malloc, posix_memalign and free): while tracking, the live bytes and their
// peak are counted, so a test can see what an op allocates beyond its workspace.
void *__real_malloc(size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);
void __real_free(void *p);
size_t malloc_usable_size(void *p);
static atomic_int heap_tracking;
static atomic_llong heap_live, heap_peak;

static void heap_note(void *p) {
    if (!p || !atomic_load(&heap_tracking)) return;
    long long now = atomic_fetch_add(&heap_live, (long long)malloc_usable_size(p)) + (long long)malloc_usable_size(p);
    long long was = atomic_load(&heap_peak);
    while (now > was && !atomic_compare_exchange_weak(&heap_peak, &was, now)) {
    }
}
/* the linker's --wrap names: defined here, called in place of the libc functions */
void *__wrap_malloc(size_t n);
int __wrap_posix_memalign(void **p, size_t align, size_t n);
void __wrap_free(void *p);
void *__wrap_malloc(size_t n) {
    void *p = __real_malloc(n);
    heap_note(p);
    return p;
}
int __wrap_posix_memalign(void **p, size_t align, size_t n) {
    int r = __real_posix_memalign(p, align, n);
    if (r == 0) heap_note(*p);
    return r;
}
void __wrap_free(void *p) {
    if (p && atomic_load(&heap_tracking)) atomic_fetch_sub(&heap_live, (long long)malloc_usable_size(p));
    __real_free(p);
}

// Peak heap bytes that one forward + backward takes (both backward schedules), with the
// workspace passed in (so all of it is the op's own temporaries), on 2 threads.
static long long attention_heap_peak(int S, int mode) {
    const int B = 1, H = 4, KV = 2, D = 16;
    ops_attn_shape s = shape(B, S, S, H, KV, D, 1, 0, 0);
    size_t nq = (size_t)B * S * H * D, nk = (size_t)B * S * KV * D;
    float *q = calloc(nq, 4), *k = calloc(nk, 4), *v = calloc(nk, 4), *out = calloc(nq, 4), *dout = calloc(nq, 4);
    float *dq = calloc(nq, 4), *dk = calloc(nk, 4), *dv = calloc(nk, 4), *lse = calloc((size_t)B * H * S, 4);
    void *ws = malloc(cpu_attention_workspace_size(&s));
    for (size_t i = 0; i < nq; i++) q[i] = 0.01f * (float)(i % 13), dout[i] = 0.02f * (float)(i % 7);
    for (size_t i = 0; i < nk; i++) k[i] = 0.03f * (float)(i % 11), v[i] = 0.01f * (float)(i % 5);
    cpu_attention_set_backward_mode(mode);
    atomic_store(&heap_live, 0);
    atomic_store(&heap_peak, 0);
    atomic_store(&heap_tracking, 1);
    cpu_attention_forward(out, lse, q, k, v, &s, ws);
    cpu_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, &s, ws);
    atomic_store(&heap_tracking, 0);
    cpu_attention_set_backward_mode(0);
    CHECK(atomic_load(&heap_live) == 0, "attention S=%d left %lld heap bytes allocated", S, atomic_load(&heap_live));
    free(q), free(k), free(v), free(out), free(dout), free(dq), free(dk), free(dv), free(lse), free(ws);
    return atomic_load(&heap_peak);
}

// The op allocates nothing of size S x S: what it takes from the heap beyond its workspace
// (per-thread tiles and copies of a kv head) grows linearly with S and stays far below
// even one head's scores.
static void test_attention_heap(void) {
    int threads = omp_get_max_threads();
    omp_set_num_threads(2);
    for (int mode = 1; mode <= 2; mode++) {
        long long p1 = attention_heap_peak(4096, mode), p2 = attention_heap_peak(8192, mode);
        double scores = 8192.0 * 8192.0 * sizeof(float); // one head's S x S at S = 8192
        printf("  attention heap (%s backward, 2 threads): S=4096 %.2f MiB, S=8192 %.2f MiB (one head's S^2 "
               "scores: %.0f MiB)\n",
               mode == 1 ? "fused" : "split", p1 / 1048576.0, p2 / 1048576.0, scores / 1048576.0);
        CHECK(p1 > 0, "the heap wrappers saw no allocation (is the test linked with --wrap?)");
        CHECK((double)p2 <= 2.1 * (double)p1 + 65536, "heap grows faster than linearly: %lld -> %lld", p1, p2);
        CHECK((double)p2 < scores / 16, "heap peak %lld is not far below one head's S^2 scores", p2);
    }
    omp_set_num_threads(threads);
}

static void test_attention_workspace(void) {
    ops_attn_shape s1 = shape(1, 4096, 4096, 32, 8, 128, 1, 0, 0);
    ops_attn_shape s2 = shape(1, 8192, 8192, 32, 8, 128, 1, 0, 0);
    size_t w1 = cpu_attention_workspace_size(&s1), w2 = cpu_attention_workspace_size(&s2);
    double s2sq = 8192.0 * 8192.0 * 32 * sizeof(float); // what a materialised B*H*S*S would take
    printf("  attention workspace: S=4096 %.2f MiB, S=8192 %.2f MiB (S^2 scores would be %.0f MiB)\n", w1 / 1048576.0,
           w2 / 1048576.0, s2sq / 1048576.0);
    CHECK((double)w2 <= 2.05 * (double)w1 + 4096, "workspace grows faster than linearly: %zu -> %zu", w1, w2);
    CHECK((double)w2 < s2sq / 64, "workspace %zu is not far below S^2", w2);
}

// ----------------------------------------------------------------------------
// casts

typedef struct {
    float x;
    unsigned code;
} cast_case;

static void test_casts(void) {
    const float nan = NAN, inf = INFINITY;
    const cast_case e4m3[] = {
        {0.0f, 0x00},     {-0.0f, 0x80},    {1.0f, 0x38},   {-1.0f, 0xb8},   {1.0625f, 0x38}, // tie between 1 (even) and 1.125 -> 1
        {1.1875f, 0x3a}, // tie between 1.125 (odd) and 1.25 -> 1.25
        {240.0f, 0x77},   {448.0f, 0x7e},   {449.0f, 0x7e}, {464.0f, 0x7e},  {1e9f, 0x7e},    {-1e9f, 0xfe},
        {inf, 0x7e},      {-inf, 0xfe},     {nan, 0x7f},    {-nan, 0xff},    {0x1p-9f, 0x01}, // smallest subnormal
        {0x1p-10f, 0x00},                   // tie between 0 (even) and 2^-9 -> 0
        {0x3p-10f, 0x02},                   // tie between 1 and 2 units -> 2
        {0x7p-9f, 0x07},  {0xfp-10f, 0x08}, // 7.5 units: tie 7/8 -> 8 = smallest normal
        {0x1p-6f, 0x08},  {0x1p-12f, 0x00}, {1e-45f, 0x00}, {-1e-45f, 0x80},
    };
    const cast_case e5m2[] = {
        {0.0f, 0x00},     {-0.0f, 0x80},    {1.0f, 0x3c},     {1.125f, 0x3c},   {1.375f, 0x3e},
        {-2.0f, 0xc0},    {57344.0f, 0x7b}, {61439.0f, 0x7b}, {61440.0f, 0x7b}, {1e30f, 0x7b},
        {inf, 0x7b},      {-inf, 0xfb},     {nan, 0x7e},      {-nan, 0xfe},     {0x1p-16f, 0x01},
        {0x1p-17f, 0x00}, {0x3p-17f, 0x02}, {0x1p-14f, 0x04}, {0x7p-17f, 0x04}, // 3.5 units: tie 3/4 -> 4 = smallest normal
    };
    const cast_case bf16[] = {
        {1.0f, 0x3f80},          {1.00390625f, 0x3f80}, // 1 + 2^-8: tie -> even (1.0)
        {1.01171875f, 0x3f82},                          // 1 + 3*2^-8: tie -> even (1 + 2^-6)
        {3.4028235e38f, 0x7f80},                        // FLT_MAX rounds up to inf
        {3.3895314e38f, 0x7f7f},                        // largest finite bf16
        {inf, 0x7f80},           {-inf, 0xff80},        {nan, 0x7fc0},
        {-0.0f, 0x8000},         {1e-45f, 0x0000},      {0x1p-134f, 0x0000}, // f32 bits 0x00008000: tie -> 0
        {0x3p-134f, 0x0002},                                                 // bits 0x00018000: tie -> 2
    };
    for (size_t i = 0; i < sizeof e4m3 / sizeof e4m3[0]; i++) {
        unsigned got = tetra_f32_to_e4m3(e4m3[i].x);
        CHECK(got == e4m3[i].code, "e4m3(%a) = 0x%02x, want 0x%02x", (double)e4m3[i].x, got, e4m3[i].code);
    }
    for (size_t i = 0; i < sizeof e5m2 / sizeof e5m2[0]; i++) {
        unsigned got = tetra_f32_to_e5m2(e5m2[i].x);
        CHECK(got == e5m2[i].code, "e5m2(%a) = 0x%02x, want 0x%02x", (double)e5m2[i].x, got, e5m2[i].code);
    }
    for (size_t i = 0; i < sizeof bf16 / sizeof bf16[0]; i++) {
        unsigned got = tetra_f32_to_bf16(bf16[i].x);
        CHECK(got == bf16[i].code, "bf16(%a) = 0x%04x, want 0x%04x", (double)bf16[i].x, got, bf16[i].code);
    }
    // round trips: every non-NaN code decodes and re-encodes to itself
    for (int c = 0; c < 256; c++) {
        float a = tetra_e4m3_to_f32((uint8_t)c), b = tetra_e5m2_to_f32((uint8_t)c);
        if ((c & 0x7f) != 0x7f) CHECK(tetra_f32_to_e4m3(a) == c, "e4m3 round trip 0x%02x", c);
        else CHECK(isnan(a), "e4m3 0x%02x should decode to NaN", c);
        int e5_special = (c & 0x7c) == 0x7c;
        if (!e5_special) CHECK(tetra_f32_to_e5m2(b) == c, "e5m2 round trip 0x%02x", c);
        else CHECK((c & 3) ? isnan(b) : isinf(b), "e5m2 0x%02x should decode to inf/NaN", c);
    }
    CHECK(tetra_e4m3_to_f32(0x7e) == 448.0f && tetra_e4m3_to_f32(0x01) == 0x1p-9f, "e4m3 decode extremes");
    CHECK(tetra_e5m2_to_f32(0x7b) == 57344.0f && tetra_e5m2_to_f32(0x01) == 0x1p-16f, "e5m2 decode extremes");
    // the op applies the scale before saturating
    float xs[4] = {1.0f, 300.0f, -1000.0f, NAN}, sc = 2.0f;
    uint8_t q[4];
    cpu_cast_f32_to_fp8(q, xs, &sc, 0, 1, 4, TETRA_FP8_E4M3);
    CHECK(q[0] == 0x40 && q[1] == 0x7e && q[2] == 0xfe && q[3] == 0x7f, "scaled cast: %02x %02x %02x %02x", q[0], q[1],
          q[2], q[3]);
    // fp8 -> bf16 in one pass: the bits of fp8 -> f32 -> bf16, for every code of both formats,
    // tensorwise (a scale that makes the products round), rowwise (one scale per row: 1, a
    // scale that overflows the large codes to inf, a tiny one that flushes to subnormals) and
    // without a scale
    uint8_t codes[4 * 256];
    for (int i = 0; i < 4 * 256; i++) codes[i] = (uint8_t)i;
    const float inv[4] = {0.3f, 1.0f, 1e36f, 1e-38f};
    float wide[4 * 256];
    uint16_t two[4 * 256], one[4 * 256];
    for (int fmt = 0; fmt < 2; fmt++) {
        const tetra_dtype f = fmt ? TETRA_FP8_E5M2 : TETRA_FP8_E4M3;
        for (int mode = 0; mode < 3; mode++) {
            const float *s = mode == 2 ? NULL : inv;
            cpu_cast_fp8_to_f32(wide, codes, s, mode == 1, 4, 256, f);
            cpu_cast_f32_to_bf16(two, wide, 4 * 256);
            cpu_cast_fp8_to_bf16(one, codes, s, mode == 1, 4, 256, f);
            int diff = 0;
            for (int i = 0; i < 4 * 256; i++) diff += one[i] != two[i];
            CHECK(diff == 0, "cast_fp8_to_bf16 (%s, %s): %d of 1024 differ from fp8 -> f32 -> bf16",
                  fmt ? "e5m2" : "e4m3",
                  mode == 0       ? "tensorwise"
                      : mode == 1 ? "rowwise"
                                  : "no scale",
                  diff);
        }
    }
    // transpose_u8 against the definition: tiles cut at both edges, a row, a column, empty
    const int tshape[][2] = {{37, 70}, {1, 300}, {300, 1}, {64, 64}, {0, 5}};
    for (size_t si = 0; si < sizeof tshape / sizeof tshape[0]; si++) {
        const int rows = tshape[si][0], cols = tshape[si][1];
        const size_t n = (size_t)rows * (size_t)cols;
        uint8_t *x = malloc(n + 1), *t = malloc(n + 1);
        for (size_t i = 0; i < n; i++) x[i] = (uint8_t)(i * 37u + 11u);
        t[n] = 0xa5;
        cpu_transpose_u8(t, x, rows, cols);
        int bad = t[n] != 0xa5;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) bad += t[(size_t)c * rows + r] != x[(size_t)r * cols + c];
        CHECK(bad == 0, "transpose_u8 %d x %d: %d bytes wrong (or the guard written)", rows, cols, bad);
        free(x);
        free(t);
    }
}

// ----------------------------------------------------------------------------
// exp accuracy

static void test_exp(void) {
    double worst = 0;
    float at = 0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -87.0f + (float)i * (175.5f / 2000000.0f);
        double ref = exp((double)x);
        float got = tetra_expf(x);
        if (ref > 3.4e38) continue;
        double ulp = ldexp(1.0, ilogb(ref) - 23);
        double e = fabs((double)got - ref) / ulp;
        if (e > worst) worst = e, at = x;
    }
    printf("  tetra_expf: max error %.2f ulp (at %g) over [-87, 88.5]\n", worst, (double)at);
    CHECK(worst < 2.0, "tetra_expf error %.2f ulp at %g", worst, (double)at);
    CHECK(tetra_expf(-INFINITY) == 0.0f, "exp(-inf)");
    CHECK(isinf(tetra_expf(100.0f)), "exp(100) should overflow to inf");
    CHECK(isnan(tetra_expf(NAN)), "exp(NaN)");
    CHECK(tetra_expf(0.0f) == 1.0f, "exp(0)");
    CHECK(tetra_expf(-100.0f) > 0.0f && tetra_expf(-100.0f) < 1e-43f, "exp(-100) subnormal: %g",
          (double)tetra_expf(-100.0f));
    // the attention kernels' exp: the same bits on [-87.3, 88], a floor of about 1e-38 below
    long differ = 0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -87.3f + (float)i * (175.3f / 2000000.0f);
        if (x > 88.0f) x = 88.0f;
        uint32_t a = tetra_f32_bits(tetra_expf_softmax(x)), b = tetra_f32_bits(tetra_expf(x));
        differ += a != b;
    }
    CHECK(differ == 0, "tetra_expf_softmax differs from tetra_expf at %ld of 2000001 points", differ);
    const float floor38 = tetra_expf(-87.3f); // 1.22e-38
    for (float x = -87.3f; x > -1000.0f; x -= 0.37f)
        CHECK(tetra_expf_softmax(x) == floor38, "tetra_expf_softmax(%g) = %g, not the floor exp(-87.3) = %g", (double)x,
              (double)tetra_expf_softmax(x), (double)floor38);
    CHECK(tetra_expf_softmax(-INFINITY) == floor38, "exp_softmax(-inf)");
    CHECK(isnan(tetra_expf_softmax(NAN)), "exp_softmax(NaN)");
}

// ----------------------------------------------------------------------------
// the table

static void test_table(void) {
    char err[256] = "";
    const tetra_ops *o = ops_get("cpu", err, sizeof err);
    CHECK(o != NULL, "ops_get(cpu): %s", err);
    if (!o) return;
    CHECK(!strcmp(o->name, "cpu"), "name");
#define SLOT(f) CHECK(o->f != NULL, "slot %s is empty", #f)
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
    SLOT(transpose);
    SLOT(cast_f32_to_bf16);
    SLOT(cast_bf16_to_f32);
    SLOT(cast_f32_to_fp8);
    SLOT(cast_fp8_to_f32);
    SLOT(cast_fp8_to_bf16);
    SLOT(transpose_u8);
    SLOT(fp8_scale_from_amax);
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
#undef SLOT
    CHECK(ops_get("auto", err, sizeof err) != NULL, "ops_get(auto)");
    CHECK(ops_get("gpu0", err, sizeof err) == NULL && err[0], "ops_get(gpu0) should fail with a message");
    void *p = o->alloc(1000);
    CHECK(p && ((uintptr_t)p % 64) == 0, "alloc alignment");
    o->release(p);
    // RMSNorm's I and W halves are independent of order (zero-bubble runs them apart)
    const int n = 33, c = 70;
    float *x = randn_buf((size_t)n * c, 1), *w = randn_buf(c, 1), *dy = randn_buf((size_t)n * c, 1);
    float *y = zeros((size_t)n * c), *r = zeros(n), *dx1 = zeros((size_t)n * c), *dx2 = zeros((size_t)n * c);
    float *dw1 = zeros(c), *dw2 = zeros(c);
    o->rmsnorm_forward(y, r, x, w, n, c, 1e-5f);
    o->rmsnorm_backward_input(dx1, dy, x, w, r, n, c, NULL);
    o->rmsnorm_backward_weight(dw1, dy, x, r, n, c, 1);
    o->rmsnorm_backward_weight(dw2, dy, x, r, n, c, 1);
    o->rmsnorm_backward_input(dx2, dy, x, w, r, n, c, NULL);
    CHECK(!memcmp(dx1, dx2, (size_t)n * c * 4) && !memcmp(dw1, dw2, (size_t)c * 4), "rmsnorm I/W order dependence");
    free(x), free(w), free(dy), free(y), free(r), free(dx1), free(dx2), free(dw1), free(dw2);
}

// ----------------------------------------------------------------------------
// memory accounting and freeze

static void test_memory(void) {
    char err[256] = "";
    const tetra_ops *o = ops_get("cpu", err, sizeof err);
    if (!o) return;
    size_t c0 = o->alloc_count(), b0 = o->allocated_bytes();
    void *p = o->alloc(1000), *q = o->alloc(4099), *z = o->alloc(0);
    CHECK(p && q && z, "alloc failed");
    CHECK(((uintptr_t)p % 64) == 0 && ((uintptr_t)q % 64) == 0 && ((uintptr_t)z % 64) == 0, "alloc alignment");
    memset(p, 0xab, 1000); // the whole requested size is usable (the header sits in front)
    memset(q, 0xcd, 4099);
    CHECK(o->alloc_count() == c0 + 3, "alloc_count %zu, want %zu", o->alloc_count(), c0 + 3);
    CHECK(o->allocated_bytes() == b0 + 5099, "allocated_bytes %zu, want %zu", o->allocated_bytes(), b0 + 5099);
    o->release(p);
    o->release(z);
    o->release(NULL);
    CHECK(o->allocated_bytes() == b0 + 4099, "after release: %zu, want %zu", o->allocated_bytes(), b0 + 4099);
    CHECK(o->alloc_count() == c0 + 3, "release changed alloc_count");

    // frozen: alloc fails (with a message on stderr) and changes no counter; release works,
    // and ops that need temporaries (GEMM widening, attention tiles and workspace) still run
    o->memory_freeze(1);
    fprintf(stderr, "  (the next line is an expected refusal)\n");
    void *r = o->alloc(123);
    CHECK(r == NULL, "alloc succeeded while frozen");
    CHECK(o->alloc_count() == c0 + 3 && o->allocated_bytes() == b0 + 4099, "frozen alloc changed the counters");
    o->release(q);
    CHECK(o->allocated_bytes() == b0, "release while frozen: %zu, want %zu", o->allocated_bytes(), b0);
    {
        ops_attn_shape s = shape(1, 70, 70, 4, 2, 16, 1, 0, 0);
        size_t nq = 70 * 4 * 16, nk = 70 * 2 * 16;
        float *x = randn_buf(nq, 1), *xk = randn_buf(nk, 1), *xv = randn_buf(nk, 1), *dq = zeros(nq);
        float *dk = zeros(nk), *dv = zeros(nk), *out = zeros(nq), *lse = zeros(4 * 70);
        uint16_t *hq = (uint16_t *)calloc(nq, 2), *hk = (uint16_t *)calloc(nk, 2), *hv = (uint16_t *)calloc(nk, 2);
        uint16_t *ho = (uint16_t *)calloc(nq, 2), *hdq = (uint16_t *)calloc(nq, 2);
        uint16_t *hdk = (uint16_t *)calloc(nk, 2), *hdv = (uint16_t *)calloc(nk, 2);
        cpu_cast_f32_to_bf16(hq, x, nq);
        cpu_cast_f32_to_bf16(hk, xk, nk);
        cpu_cast_f32_to_bf16(hv, xv, nk);
        o->attention_forward(out, lse, x, xk, xv, &s, NULL);
        o->attention_backward(dq, dk, dv, x, x, xk, xv, out, lse, &s, NULL);
        o->attention_forward_bf16(ho, lse, hq, hk, hv, &s, NULL);
        o->attention_backward_bf16(hdq, hdk, hdv, hq, hq, hk, hv, ho, lse, &s, NULL);
        ops_gemm_desc g = {0};
        g.a_type = g.b_type = g.c_type = TETRA_BF16;
        g.m = 70, g.n = 64, g.k = 32, g.lda = 32, g.ldb = 64, g.ldc = 64, g.alpha = 1.0f;
        o->gemm(ho, hq, hk, &g);
        int bad = 0;
        for (size_t i = 0; i < nq; i++) bad += !isfinite(out[i]) || !isfinite(tetra_bf16_to_f32(ho[i]));
        CHECK(!bad, "ops while frozen produced %d non-finite values", bad);
        free(x), free(xk), free(xv), free(dq), free(dk), free(dv), free(out), free(lse);
        free(hq), free(hk), free(hv), free(ho), free(hdq), free(hdk), free(hdv);
    }
    CHECK(o->alloc_count() == c0 + 3 && o->allocated_bytes() == b0, "ops allocated through alloc while frozen");
    o->memory_freeze(0);
    r = o->alloc(123);
    CHECK(r != NULL, "alloc after thaw failed");
    CHECK(o->alloc_count() == c0 + 4 && o->allocated_bytes() == b0 + 123, "counters after thaw");
    o->release(r);

    // concurrent alloc/release from many threads: the counters stay exact
    const int nt = 64;
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < nt; i++) {
        void *a = o->alloc((size_t)(i + 1) * 100);
        if (a) o->release(a);
    }
    CHECK(o->alloc_count() == c0 + 4 + (size_t)nt, "threaded alloc_count %zu, want %zu", o->alloc_count(),
          c0 + 4 + (size_t)nt);
    CHECK(o->allocated_bytes() == b0, "threaded allocated_bytes %zu, want %zu", o->allocated_bytes(), b0);

    size_t fr = 1, tot = 1;
    o->device_memory(&fr, &tot);
    CHECK(fr == 0 && tot == 0, "device_memory on the CPU: %zu %zu", fr, tot);
    CHECK(o->compute_stream() == NULL, "compute_stream on the CPU is not NULL");
    printf("  memory: alloc_count %zu, allocated_bytes %zu after the checks\n", o->alloc_count(), o->allocated_bytes());
}

// ----------------------------------------------------------------------------
// bf16 twins: the same bits with one thread and with all of them (the reductions keep
// fixed orders), and on a second call

static uint16_t *bf16_buf(size_t n, float scale) {
    float *f = randn_buf(n, scale);
    uint16_t *h = (uint16_t *)malloc(n * sizeof(uint16_t));
    cpu_cast_f32_to_bf16(h, f, n);
    free(f);
    return h;
}

typedef struct {
    uint16_t *out, *dx, *rope, *sw, *da, *dg, *att;
    float *rstd, *dw, *dwte, *lse;
} bf16_results;

static void bf16_run(bf16_results *r, const uint16_t *x, const uint16_t *w, const uint16_t *dy, const int32_t *tok,
                     const float *freqs, int n, int c, int v) {
    const int S = 100, H = 4, KV = 2, D = 16, B = 2; // rope/attention view x as [B, S, H, D] (n*c >= that)
    ops_attn_shape s = shape(B, S, S, H, KV, D, 1, 0, 0);
    size_t nx = (size_t)n * c;
    r->out = (uint16_t *)malloc(nx * 2), r->dx = (uint16_t *)malloc(nx * 2), r->rope = (uint16_t *)malloc(nx * 2);
    r->sw = (uint16_t *)malloc(nx * 2), r->da = (uint16_t *)malloc(nx * 2), r->dg = (uint16_t *)malloc(nx * 2);
    r->att = (uint16_t *)malloc((size_t)B * S * H * D * 2);
    r->rstd = zeros((size_t)n), r->dw = zeros((size_t)c), r->dwte = zeros((size_t)v * c), r->lse = zeros(B * H * S);
    memcpy(r->dx, dy, nx * 2);
    cpu_rmsnorm_forward_bf16(r->out, r->rstd, NULL, x, w, n, c, 1e-5f);
    cpu_rmsnorm_backward_input_bf16(r->dx, NULL, dy, x, w, r->rstd, n, c, NULL);
    cpu_rmsnorm_backward_weight_bf16(r->dw, dy, x, r->rstd, n, c, 1);
    cpu_embedding_backward_bf16(r->dwte, dy, tok, n, c, 0, v);
    cpu_rope_forward_bf16(r->rope, x, freqs, NULL, 0, n / 4, 4, c / 16, 16, c, c);
    cpu_swiglu_forward_bf16(r->sw, NULL, x, dy, nx);
    cpu_swiglu_backward_bf16(r->da, r->dg, NULL, NULL, r->out, x, dy, nx);
    cpu_attention_forward_bf16(r->att, r->lse, x, dy, x, &s, NULL);
}

static int bf16_same(const bf16_results *a, const bf16_results *b, int n, int c, int v) {
    size_t nx = (size_t)n * c, na = (size_t)2 * 100 * 4 * 16;
    return !memcmp(a->out, b->out, nx * 2) && !memcmp(a->dx, b->dx, nx * 2) && !memcmp(a->rope, b->rope, nx * 2) &&
        !memcmp(a->sw, b->sw, nx * 2) && !memcmp(a->da, b->da, nx * 2) && !memcmp(a->dg, b->dg, nx * 2) &&
        !memcmp(a->att, b->att, na * 2) && !memcmp(a->rstd, b->rstd, (size_t)n * 4) &&
        !memcmp(a->dw, b->dw, (size_t)c * 4) && !memcmp(a->dwte, b->dwte, (size_t)v * c * 4) &&
        !memcmp(a->lse, b->lse, (size_t)2 * 4 * 100 * 4);
}

static void bf16_free(bf16_results *r) {
    free(r->out), free(r->dx), free(r->rope), free(r->sw), free(r->da), free(r->dg), free(r->att);
    free(r->rstd), free(r->dw), free(r->dwte), free(r->lse);
}

static void test_bf16_determinism(void) {
    const int n = 400, c = 256, v = 50; // n*c well above CPU_CHUNK: the ops thread
    uint16_t *x = bf16_buf((size_t)n * c, 1), *w = bf16_buf(c, 1), *dy = bf16_buf((size_t)n * c, 1);
    int32_t *tok = (int32_t *)malloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) tok[i] = (i * 7) % v; // every token repeats
    float *freqs = zeros((size_t)n * 16);
    ops_rope_table(freqs, 16, n, 500000.0f, 0, 8.0f, 1.0f, 4.0f, 8192);
    bf16_results all, again, one;
    int nt = omp_get_max_threads();
    bf16_run(&all, x, w, dy, tok, freqs, n, c, v);
    bf16_run(&again, x, w, dy, tok, freqs, n, c, v);
    omp_set_num_threads(1);
    bf16_run(&one, x, w, dy, tok, freqs, n, c, v);
    omp_set_num_threads(nt);
    CHECK(bf16_same(&all, &again, n, c, v), "bf16 ops: two calls differ");
    CHECK(bf16_same(&all, &one, n, c, v), "bf16 ops: 1 thread and %d threads differ", nt);
    printf("  bf16 twins: identical over repeated calls and with 1 vs %d threads\n", nt);
    bf16_free(&all), bf16_free(&again), bf16_free(&one);
    free(x), free(w), free(dy), free(tok), free(freqs);
}

/* cross_entropy_bf16 over bf16 logits writes the bits the fp32 op's dlogits over the
 * logits widened to fp32 have, cast to bf16, with the same losses, also in place;
 * ignored and out-of-range targets give zero rows. */
static void test_cross_entropy_bf16(void) {
    const tetra_ops *o = ops_cpu();
    const int n = 9, v = 1500;
    const size_t nv = (size_t)n * v;
    float *z = malloc(nv * 4), *d = malloc(nv * 4), *l32 = malloc((size_t)n * 4), *l16 = malloc((size_t)n * 4);
    uint16_t *ref = malloc(nv * 2), *got = malloc(nv * 2), *z16 = malloc(nv * 2), *inplace = malloc(nv * 2);
    int32_t t[9];
    uint32_t x = 7;
    for (size_t i = 0; i < nv; i++) {
        x = x * 1664525u + 1013904223u;
        z[i] = (float)((x >> 8) % 20000) / 1000.0f - 10.0f;
    }
    for (int i = 0; i < n; i++) t[i] = (i * 389) % v;
    t[2] = OPS_IGNORE_INDEX;
    t[5] = v + 3;
    o->cast_f32_to_bf16(z16, z, nv);
    o->cast_bf16_to_f32(z, z16, nv); /* the logits the bf16 op sees, widened */
    o->cross_entropy(d, l32, z, t, n, v, 1.0f / 7.0f);
    o->cast_f32_to_bf16(ref, d, nv);
    o->cross_entropy_bf16(got, l16, z16, t, n, v, 1.0f / 7.0f);
    CHECK(!memcmp(got, ref, nv * 2) && !memcmp(l16, l32, (size_t)n * 4),
          "cross_entropy_bf16: the fp32 op's dlogits over the widened logits cast to bf16 and its losses, bit for bit");
    memcpy(inplace, z16, nv * 2);
    o->cross_entropy_bf16(inplace, l16, inplace, t, n, v, 1.0f / 7.0f);
    CHECK(!memcmp(inplace, ref, nv * 2) && !memcmp(l16, l32, (size_t)n * 4),
          "cross_entropy_bf16 in place (dlogits over the logits): the same bits");
    int zero = 1;
    for (int j = 0; j < v; j++) zero &= got[2 * (size_t)v + j] == 0 && got[5 * (size_t)v + j] == 0;
    CHECK(zero && l16[2] == 0.0f && l16[5] == 0.0f, "cross_entropy_bf16: ignored targets give zero rows and losses");
    free(z);
    free(d);
    free(l32);
    free(l16);
    free(ref);
    free(got);
    free(z16);
    free(inplace);
}

int main(void) {
    test_table();
    test_cross_entropy_bf16();
    test_memory();
    test_bf16_determinism();
    test_casts();
    test_exp();
    test_attention_fd();
    test_attention_blocks();
    test_attention_vector_width();
    test_attention_masked_block();
    test_attention_workspace();
    test_attention_heap();
    if (failures) {
        fprintf(stderr, "test_ops_cpu: %d failure(s)\n", failures);
        return EXIT_FAILURE;
    }
    printf("test_ops_cpu: all checks passed\n");
    return EXIT_SUCCESS;
}
