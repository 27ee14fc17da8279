/* bench/gpu_ops.c — per-op timings of the backend op table (kernels/ops.h) at the shapes of
 * one Llama 3 8B training step (seq 8192 x batch 1, bf16 mixed precision): every GEMM of a
 * block as the model issues it (forward, input gradient, weight gradient), attention
 * (cuDNN where it applies), the elementwise and reduction ops, the float8 tensorwise
 * passes and fp8 GEMMs, the output head with the fused cross-entropy, and AdamW over one
 * block's parameters. One markdown table: group | op | ms | TFLOP/s or GB/s | MB moved
 * (the minimum; not counted for GEMMs).
 *
 *   build/bench/gpu_ops                   the CUDA table, 8B shapes, 10 timed calls per op
 *   build/bench/gpu_ops --reps 5          fewer calls
 *   build/bench/gpu_ops --device cpu --small    the CPU table at debug-model shapes (a smoke
 *                                         test of the calls; its times mean little)
 *
 * Built by cmake/gpu_bench.cmake with the CUDA backend (the binary loads lib/libtetra_cuda.so
 * as `tetra` does); scripts/gpu_check runs it in its bench section. Without a device it says
 * so and exits 2.
 *
 * Operands are pseudo-random bf16 (about N(0, 0.05)), not constants: H100 GEMM clocks depend
 * on the bit activity of the operands. Each op is called twice to warm up, then `reps` times
 * between two synchronize() calls; the time is the host wall time divided by reps (launch
 * overhead is small at these sizes). Bytes are the minimum each op must move; rates are
 * FLOPs or those bytes over the time. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/ops.h"

static const tetra_ops *O;
static int REPS = 10;
static const char *GROUP = "";

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *dalloc(size_t bytes) {
    void *p = O->alloc(bytes ? bytes : 256);
    if (!p) {
        fprintf(stderr, "gpu_ops: cannot allocate %.2f GiB of %s memory\n", (double)bytes / (1 << 30), O->name);
        exit(1);
    }
    return p;
}

/* a pattern of random bf16 words, copied over every operand (fp32 buffers get pairs of
 * them: finite and small) */
static uint16_t *pattern;
static size_t PAT = (size_t)32 << 20; /* elements */
static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static void make_pattern(void) {
    uint16_t *h = malloc(PAT * 2);
    if (!h) {
        fprintf(stderr, "gpu_ops: out of host memory\n");
        exit(1);
    }
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < PAT; i++) {
        float acc = 0.f;
        for (int k = 0; k < 4; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            acc += (float)(s >> 40) / (float)(1u << 24) - 0.5f;
        }
        h[i] = bf16_of(acc * 0.1f);
    }
    pattern = dalloc(PAT * 2);
    O->copy_h2d(pattern, h, PAT * 2);
    free(h);
}
static void randomize(void *p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += PAT * 2) {
        size_t n = bytes - off < PAT * 2 ? bytes - off : PAT * 2;
        O->copy((char *)p + off, pattern, n);
    }
}
static void *rnd(size_t bytes) {
    void *p = dalloc(bytes);
    randomize(p, bytes);
    return p;
}

static void row(const char *label, double ms, double bytes, double flops) {
    if (flops > 0) printf("| %s | %s | %.3f | %.1f TFLOP/s | - |\n", GROUP, label, ms, flops / ms / 1e9);
    else printf("| %s | %s | %.3f | %.1f GB/s | %.0f |\n", GROUP, label, ms, bytes / ms / 1e6, bytes / 1e6);
    fflush(stdout);
}

#define TIME(label, work, bytes, flops)                                                                                \
    do {                                                                                                               \
        for (int w_ = 0; w_ < 2; w_++) {                                                                               \
            work;                                                                                                      \
        }                                                                                                              \
        O->synchronize();                                                                                              \
        double t0_ = now();                                                                                            \
        for (int r_ = 0; r_ < REPS; r_++) {                                                                            \
            work;                                                                                                      \
        }                                                                                                              \
        O->synchronize();                                                                                              \
        row(label, (now() - t0_) * 1e3 / REPS, (double)(bytes), (double)(flops));                                      \
    } while (0)

static ops_gemm_desc desc(tetra_dtype ab, tetra_dtype c, int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc,
                          float beta) {
    ops_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.a_type = g.b_type = ab;
    g.c_type = c;
    g.trans_a = ta, g.trans_b = tb;
    g.m = m, g.n = n, g.k = k;
    g.lda = lda, g.ldb = ldb, g.ldc = ldc;
    g.alpha = 1.f;
    g.beta = beta;
    return g;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: gpu_ops [--device cuda|cpu] [--reps N] [--small]\n"
            "  per-op timings of the op table at Llama 3 8B shapes (seq 8192, bf16); --small: debug-model\n"
            "  shapes (seq 256, dim 256), for a quick check of the calls on the CPU\n");
}

/* the model shapes one run measures; the upper-case names are the math's, and the bodies
 * below unpack them so each op's call reads as the formula it times */
typedef struct {
    const char *label; /* for the header line */
    int N, C, F, D, HD, KVD, V;
    int H, KV;
    size_t nc, nf, nkv;
} dims;

/* the operands several phases share; a phase allocates what only it uses itself */
typedef struct {
    uint16_t *x, *xn, *q, *k, *v, *att, *h, *a, *gg, *s, *dq, *dk, *dv, *tmp, *qkv;
    uint16_t *w_big, *w_c, *w_kv, *w_qkv, *wn;
    float *dw, *dw2, *rstd, *wn32, *lse, *freqs;
} buffers;

/* Returns -1 to go on measuring, or the exit code: 0 after --help, 2 after a bad option. */
static int parse_args(int argc, char **argv, const char **device, int *small) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) *device = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) REPS = atoi(argv[++i]) > 0 ? atoi(argv[i]) : REPS;
        else if (!strcmp(argv[i], "--small")) *small = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    return -1;
}

static int open_backend(const char *device) {
    char err[512];
    O = ops_get(device, err, sizeof err);
    if (!O) {
        fprintf(stderr, "gpu_ops: no %s backend to measure: %s\n", device, err);
        return 0;
    }
    return 1;
}

static dims choose_dims(int small) {
    /* Llama 3 8B: dim 4096, FFN 14336, 32 heads / 8 KV heads of 128, vocabulary 128,256 */
    dims dm = {"Llama 3 8B", 8192, 4096, 14336, 128, 4096, 1024, 128256, 0, 0, 0, 0, 0};
    if (small) { /* the debug model's dims at seq 256 */
        dm = (dims){"debug-model", 256, 256, 768, 64, 256, 128, 2048, 0, 0, 0, 0, 0};
        PAT = (size_t)1 << 20; /* the pattern need not outgrow the small operands it fills */
    }
    dm.H = dm.HD / dm.D, dm.KV = dm.KVD / dm.D;
    dm.nc = (size_t)dm.N * dm.C, dm.nf = (size_t)dm.N * dm.F, dm.nkv = (size_t)dm.N * dm.KVD;
    return dm;
}

static void print_header(const dims *dm) {
    printf("gpu_ops: %s backend, %s shapes: tokens %d, dim %d, ffn %d, heads %d/%d x %d, vocab %d; %d timed calls "
           "per op\n\n",
           O->name, dm->label, dm->N, dm->C, dm->F, dm->H, dm->KV, dm->D, dm->V, REPS);
    printf("| group | op | ms | rate | MB |\n|---|---|---|---|---|\n");
}

/* activations (bf16) and weights (bf16 compute copy, fp32 gradients) */
static void alloc_buffers(const dims *dm, buffers *b) {
    const int N = dm->N, C = dm->C, F = dm->F, D = dm->D, HD = dm->HD, KVD = dm->KVD, H = dm->H;
    const size_t nc = dm->nc, nf = dm->nf, nkv = dm->nkv;
    b->x = rnd(nc * 2), b->xn = rnd(nc * 2), b->q = rnd(nc * 2), b->k = rnd(nkv * 2), b->v = rnd(nkv * 2);
    b->att = rnd(nc * 2), b->h = rnd(nc * 2), b->a = rnd(nf * 2), b->gg = rnd(nf * 2), b->s = rnd(nf * 2);
    b->dq = rnd(nc * 2), b->dk = rnd(nkv * 2), b->dv = rnd(nkv * 2), b->tmp = rnd(nc * 2);
    b->qkv = rnd((size_t)N * (HD + 2 * KVD) * 2); /* the fused-QKV layout, for comparison */
    b->w_big = rnd((size_t)F * C * 2), b->w_c = rnd((size_t)C * C * 2), b->w_kv = rnd((size_t)KVD * C * 2);
    b->w_qkv = rnd((size_t)(HD + 2 * KVD) * C * 2);
    b->dw = rnd((size_t)F * C * 4), b->dw2 = rnd((size_t)F * C * 4);
    b->rstd = dalloc((size_t)N * 4), b->wn32 = dalloc((size_t)C * 4);
    b->wn = dalloc((size_t)C * 2);
    O->fill(b->rstd, 1.0f, (size_t)N);
    O->fill(b->wn32, 1.0f, (size_t)C);
    O->cast_f32_to_bf16(b->wn, b->wn32, (size_t)C);
    b->lse = dalloc((size_t)H * N * 4);
    b->freqs = dalloc((size_t)N * (D / 2) * 2 * 4);
    float *ht = malloc((size_t)N * (D / 2) * 2 * 4);
    ops_rope_table(ht, D, N, 500000.0f, 1, 8.0f, 1.0f, 4.0f, 8192);
    O->copy_h2d(b->freqs, ht, (size_t)N * (D / 2) * 2 * 4);
    free(ht);
}

/* each linear of a block as the model issues it: forward, input gradient, weight gradient */
static void bench_block_gemms(const dims *dm, const buffers *b) {
    const int N = dm->N, C = dm->C, F = dm->F, HD = dm->HD, KVD = dm->KVD;
    char lab[128];
    GROUP = "block GEMMs (bf16)";
    struct {
        const char *name;
        int out, in;
        uint16_t *w, *x, *y;
    } L[] = {{"wq", HD, C, b->w_c, b->xn, b->q},   {"wk", KVD, C, b->w_kv, b->xn, b->k},
             {"wv", KVD, C, b->w_kv, b->xn, b->v}, {"wo", C, HD, b->w_c, b->att, b->h},
             {"w1", F, C, b->w_big, b->xn, b->a},  {"w3", F, C, b->w_big, b->xn, b->gg},
             {"w2", C, F, b->w_big, b->s, b->h}};
    for (int i = 0; i < 7; i++) {
        const double fl = 2.0 * N * L[i].out * (double)L[i].in;
        float beta = (i == 3 || i == 6) ? 1.f : 0.f; /* wo, w2 add into the residual */
        ops_gemm_desc f = desc(TETRA_BF16, TETRA_BF16, 0, 1, N, L[i].out, L[i].in, L[i].in, L[i].in, L[i].out, beta);
        snprintf(lab, sizeof lab, "fwd %s [%d x %d x %d]", L[i].name, N, L[i].out, L[i].in);
        TIME(lab, O->gemm(L[i].y, L[i].x, L[i].w, &f), 0, fl);
        /* dx[N, in] = dy[N, out] W[out, in]: dy is the layer's output buffer, dx a scratch of N x in */
        uint16_t *dx = L[i].in == F ? b->s : b->tmp;
        ops_gemm_desc d = desc(TETRA_BF16, TETRA_BF16, 0, 0, N, L[i].in, L[i].out, L[i].out, L[i].in, L[i].in, 0.f);
        snprintf(lab, sizeof lab, "dgrad %s", L[i].name);
        TIME(lab, O->gemm(dx, L[i].y, L[i].w, &d), 0, fl);
        ops_gemm_desc wg = desc(TETRA_BF16, TETRA_F32, 1, 0, L[i].out, L[i].in, N, L[i].out, L[i].in, L[i].in, 1.f);
        snprintf(lab, sizeof lab, "wgrad %s (fp32 C, beta 1)", L[i].name);
        TIME(lab, O->gemm(b->dw, L[i].y, L[i].x, &wg), 0, fl);
    }
}

/* the model's q/k/v projection (wq, wk and wv as one linear): its three GEMMs, against the
 * separate ones above */
static void bench_fused_qkv(const dims *dm, const buffers *b) {
    const int N = dm->N, C = dm->C, Q = dm->HD + 2 * dm->KVD;
    const double fl = 2.0 * N * Q * (double)C;
    char lab[128];
    GROUP = "block GEMMs (bf16)";
    ops_gemm_desc f = desc(TETRA_BF16, TETRA_BF16, 0, 1, N, Q, C, C, C, Q, 0.f);
    snprintf(lab, sizeof lab, "fwd fused qkv [%d x %d x %d]", N, Q, C);
    TIME(lab, O->gemm(b->qkv, b->xn, b->w_qkv, &f), 0, fl);
    ops_gemm_desc d = desc(TETRA_BF16, TETRA_BF16, 0, 0, N, C, Q, Q, C, C, 0.f);
    TIME("dgrad fused qkv", O->gemm(b->tmp, b->qkv, b->w_qkv, &d), 0, fl);
    ops_gemm_desc wg = desc(TETRA_BF16, TETRA_F32, 1, 0, Q, C, N, Q, C, C, 1.f);
    TIME("wgrad fused qkv", O->gemm(b->dw, b->qkv, b->xn, &wg), 0, fl);
}

/* the model's pairs (wk with wv, w1 with w3) as one batched GEMM each, the input shared
 * (batch stride 0): the forward and the weight gradient, against the two calls above */
static void bench_paired(const dims *dm, const buffers *b) {
    const int N = dm->N, C = dm->C;
    const struct {
        const char *name;
        int out;
        uint16_t *x;
    } P[] = {{"wk+wv", dm->KVD, b->xn}, {"w1+w3", dm->F, b->xn}};
    char lab[128];
    GROUP = "block GEMMs (bf16)";
    for (int i = 0; i < 2; i++) {
        const int out = P[i].out;
        const double fl = 2.0 * 2.0 * N * out * (double)C;
        uint16_t *w = rnd((size_t)2 * out * C * 2), *y = rnd((size_t)2 * N * out * 2);
        float *dw = rnd((size_t)2 * out * C * 4);
        ops_gemm_desc f = desc(TETRA_BF16, TETRA_BF16, 0, 1, N, out, C, C, C, out, 0.f);
        f.batch = 2, f.stride_b = (int64_t)out * C, f.stride_c = (int64_t)N * out;
        snprintf(lab, sizeof lab, "fwd %s, one batched GEMM [2 x %d x %d x %d]", P[i].name, N, out, C);
        TIME(lab, O->gemm(y, P[i].x, w, &f), 0, fl);
        ops_gemm_desc wg = desc(TETRA_BF16, TETRA_F32, 1, 0, out, C, N, out, C, C, 1.f);
        wg.batch = 2, wg.stride_a = (int64_t)N * out, wg.stride_c = (int64_t)out * C;
        snprintf(lab, sizeof lab, "wgrad %s, one batched GEMM (fp32 C, beta 1)", P[i].name);
        TIME(lab, O->gemm(dw, y, P[i].x, &wg), 0, fl);
        O->release(w);
        O->release(y);
        O->release(dw);
    }
}

static void bench_attention(const dims *dm, const buffers *b) {
    const int N = dm->N, D = dm->D, H = dm->H, KV = dm->KV;
    char lab[128];
    GROUP = "attention (bf16, causal)";
    ops_attn_shape sh = {1, N, N, H, KV, D, 1.0f / sqrtf((float)D), 1, 0, 0, NULL, 0};
    size_t wsb = O->attention_workspace_size_bf16(&sh);
    void *ws = dalloc(wsb ? wsb : 256);
    const double ffl = 4.0 * N * (double)N * D * H / 2; /* causal: half the square */
    snprintf(lab, sizeof lab, "forward b1 s%d h%d kv%d d%d", N, H, KV, D);
    TIME(lab, O->attention_forward_bf16(b->att, b->lse, b->q, b->k, b->v, &sh, ws), 0, ffl);
    snprintf(lab, sizeof lab, "backward (workspace %.1f MiB)", (double)wsb / 1048576.0);
    TIME(lab, O->attention_backward_bf16(b->dq, b->dk, b->dv, b->tmp, b->q, b->k, b->v, b->att, b->lse, &sh, ws), 0,
         2.5 * ffl);
    O->release(ws);

    /* Document masks take the built-in kernels (tensor cores up to head dim 128): one
     * document over the whole sequence (the causal pairs, against cuDNN's rows above), then
     * documents of 256 to 1,024 tokens (about 600 on average). The group's name keeps these
     * rows out of gpu_check_tools.py's fused-attention factor. FLOPs count the visible pairs
     * at cuDNN's 4d forward and 10d backward, so the rates compare with the rows above. */
    GROUP = "document-masked attention (bf16, built-in kernels)";
    int32_t *ids = (int32_t *)malloc((size_t)N * sizeof(int32_t));
    int32_t *d_ids = (int32_t *)dalloc((size_t)N * sizeof(int32_t));
    for (int pass = 0; pass < 2; pass++) {
        double pairs = 0.0;
        int docs = 0;
        for (int i = 0, id = 0, len = 0; i < N; id++, docs++) {
            len = pass == 0 ? N : 256 + (int)((id * 397L) % 769); /* 256..1024 */
            if (len > N - i) len = N - i;
            for (int j = 0; j < len; j++) ids[i + j] = id;
            pairs += (double)len * (len + 1) / 2;
            i += len;
        }
        O->copy_h2d(d_ids, ids, (size_t)N * sizeof(int32_t));
        ops_attn_shape dm_sh = sh;
        dm_sh.doc = d_ids, dm_sh.doc_len = N;
        size_t dwsb = O->attention_workspace_size_bf16(&dm_sh);
        void *dws = dalloc(dwsb ? dwsb : 256);
        const double dfl = 4.0 * pairs * D * H;
        snprintf(lab, sizeof lab, "forward, %d document%s (%.0f%% of the causal pairs)", docs, docs == 1 ? "" : "s",
                 100.0 * pairs / ((double)N * (N + 1) / 2));
        TIME(lab, O->attention_forward_bf16(b->att, b->lse, b->q, b->k, b->v, &dm_sh, dws), 0, dfl);
        snprintf(lab, sizeof lab, "backward, %d document%s", docs, docs == 1 ? "" : "s");
        TIME(lab,
             O->attention_backward_bf16(b->dq, b->dk, b->dv, b->tmp, b->q, b->k, b->v, b->att, b->lse, &dm_sh, dws), 0,
             2.5 * dfl);
        O->release(dws);
    }
    O->release(d_ids);
    free(ids);
}

static void bench_elementwise(const dims *dm, const buffers *b) {
    const int N = dm->N, C = dm->C, F = dm->F, D = dm->D, H = dm->H, KV = dm->KV;
    const size_t nc = dm->nc, nf = dm->nf, nkv = dm->nkv;
    char lab[128];
    GROUP = "elementwise (bf16)";
    snprintf(lab, sizeof lab, "rmsnorm forward [%d x %d]", N, C);
    TIME(lab, O->rmsnorm_forward_bf16(b->xn, b->rstd, NULL, b->x, b->wn, N, C, 1e-5f), 2 * nc * 2, 0);
    TIME("rmsnorm backward_input",
         O->rmsnorm_backward_input_bf16(b->tmp, NULL, b->xn, b->x, b->wn, b->rstd, N, C, NULL), 4 * nc * 2, 0);
    TIME("rmsnorm backward_weight", O->rmsnorm_backward_weight_bf16(b->wn32, b->xn, b->x, b->rstd, N, C, 1), 2 * nc * 2,
         0);
    TIME("rope forward q (in place)", O->rope_forward_bf16(b->q, b->q, b->freqs, NULL, 0, 1, N, H, D, H * D, H * D),
         2 * nc * 2, 0);
    TIME("rope forward k (in place)", O->rope_forward_bf16(b->k, b->k, b->freqs, NULL, 0, 1, N, KV, D, KV * D, KV * D),
         2 * nkv * 2, 0);
    TIME("rope backward q", O->rope_backward_bf16(b->tmp, NULL, b->dq, b->freqs, NULL, 0, 1, N, H, D, H * D, H * D),
         2 * nc * 2, 0);
    /* what the q/k/v projection adds: RoPE reading q out of its [N, H*D + 2 KV*D] rows, and
     * v taken out of them by one strided copy */
    const int Q = H * D + 2 * KV * D;
    TIME("rope forward q from the qkv rows",
         O->rope_forward_bf16(b->q, b->qkv, b->freqs, NULL, 0, 1, N, H, D, H * D, Q), 2 * nc * 2, 0);
    TIME("copy_2d v out of the qkv rows",
         O->copy_2d(b->v, (size_t)KV * D * 2, b->qkv + (size_t)(H + KV) * D, (size_t)Q * 2, (size_t)KV * D * 2,
                    (size_t)N),
         2 * nkv * 2, 0);
    snprintf(lab, sizeof lab, "swiglu forward [%d x %d]", N, F);
    TIME(lab, O->swiglu_forward_bf16(b->s, NULL, b->a, b->gg, nf), 3 * nf * 2, 0);
    TIME("swiglu backward (in place)", O->swiglu_backward_bf16(b->a, b->gg, NULL, NULL, b->s, b->a, b->gg, nf),
         5 * nf * 2, 0);
    TIME("copy (residual)", O->copy(b->h, b->x, nc * 2), 2 * nc * 2, 0);
}

/* the float8 tensorwise passes (amax, scale, casts), then the fp8 GEMMs on their outputs */
static void bench_float8(const dims *dm, const buffers *b) {
    const int N = dm->N, C = dm->C, F = dm->F;
    const size_t nc = dm->nc, nf = dm->nf;
    char lab[128];
    GROUP = "float8 tensorwise";
    uint8_t *q8 = dalloc(nf), *q8b = dalloc((size_t)F * C), *qa = dalloc(nf), *qwt = dalloc((size_t)F * C),
            *qxt = dalloc(nc);
    float *am = dalloc(64), *sc = dalloc(64), *inv = dalloc(64), *am2 = dalloc(64), *sc2 = dalloc(64),
          *inv2 = dalloc(64);
    snprintf(lab, sizeof lab, "amax_bf16 [%d x %d]", N, C);
    TIME(lab, O->amax_bf16(am, b->xn, nc), nc * 2, 0);
    snprintf(lab, sizeof lab, "amax_bf16 [%d x %d]", N, F);
    TIME(lab, O->amax_bf16(am, b->a, nf), nf * 2, 0);
    TIME("fp8_scale_from_amax (1)", O->fp8_scale_from_amax(sc, inv, am, 1, 0, OPS_FP8_E4M3_MAX, 0), 8, 0);
    O->amax_bf16(am, b->xn, nc);
    O->fp8_scale_from_amax(sc, inv, am, 1, 0, OPS_FP8_E4M3_MAX, 0);
    O->amax_bf16(am2, b->w_big, (size_t)F * C);
    O->fp8_scale_from_amax(sc2, inv2, am2, 1, 0, OPS_FP8_E4M3_MAX, 0);
    snprintf(lab, sizeof lab, "cast_bf16_to_fp8 [%d x %d]", N, C);
    TIME(lab, O->cast_bf16_to_fp8(q8, b->xn, sc, 0, N, C, TETRA_FP8_E4M3), nc * 3, 0);
    snprintf(lab, sizeof lab, "cast_bf16_to_fp8 [%d x %d]", N, F);
    TIME(lab, O->cast_bf16_to_fp8(q8, b->a, sc, 0, N, F, TETRA_FP8_E4M3), nf * 3, 0);
    snprintf(lab, sizeof lab, "cast_bf16_to_fp8 weight [%d x %d]", F, C);
    TIME(lab, O->cast_bf16_to_fp8(q8b, b->w_big, sc2, 0, F, C, TETRA_FP8_E4M3), (size_t)F * C * 3, 0);
    float *scv = dalloc((size_t)C * 4); /* one scale per column of x (the rowwise recipe's op) */
    O->fp8_scale_from_amax(scv, NULL, am, C, 1, OPS_FP8_E4M3_MAX, 0);
    snprintf(lab, sizeof lab, "cast_transpose_to_fp8 [%d x %d]", N, C);
    TIME(lab, O->cast_transpose_to_fp8(q8, b->xn, TETRA_BF16, scv, N, C, TETRA_FP8_E4M3), nc * 3, 0);
    /* what float8/ issues now: one pass from the amax to the K-major codes (and the
     * transpose), the weight gradient accumulated by its GEMM */
    snprintf(lab, sizeof lab, "fp8_quantize [%d x %d]", N, C);
    TIME(lab, O->fp8_quantize(q8, NULL, inv, b->xn, TETRA_BF16, am, N, C, TETRA_FP8_E4M3), nc * 3, 0);
    snprintf(lab, sizeof lab, "fp8_quantize transposed [%d x %d]", N, F);
    TIME(lab, O->fp8_quantize(NULL, qa, inv, b->a, TETRA_BF16, am, N, F, TETRA_FP8_E5M2), nf * 3, 0);
    snprintf(lab, sizeof lab, "fp8_quantize weight and transposed [%d x %d]", F, C);
    TIME(lab, O->fp8_quantize(q8b, qwt, inv2, b->w_big, TETRA_BF16, am2, F, C, TETRA_FP8_E4M3), (size_t)F * C * 4, 0);
    snprintf(lab, sizeof lab, "swiglu_forward_bf16 with amax [%d x %d]", N, F);
    TIME(lab, O->swiglu_forward_bf16(b->s, am, b->a, b->gg, nf), 3 * nf * 2, 0);
    snprintf(lab, sizeof lab, "rmsnorm_forward_bf16 with amax [%d x %d]", N, C);
    TIME(lab, O->rmsnorm_forward_bf16(b->xn, b->rstd, am, b->x, b->wn, N, C, 1e-5f), 2 * nc * 2, 0);
    /* fp8 GEMMs as float8/ issues them for w1 (the largest linear), every operand
     * K-major: forward x . W^T; input gradient dy . (W^T)^T from W^T's codes; weight
     * gradient dy^T . (x^T)^T from the transposed codes, into the fp32 gradient (beta 1) */
    O->amax_bf16(am, b->xn, nc);
    O->fp8_quantize(q8, NULL, inv, b->xn, TETRA_BF16, am, N, C, TETRA_FP8_E4M3);
    O->fp8_quantize(q8b, NULL, inv2, b->w_big, TETRA_BF16, am2, F, C, TETRA_FP8_E4M3);
    const double fl = 2.0 * N * F * (double)C;
    ops_gemm_desc f = desc(TETRA_FP8_E4M3, TETRA_BF16, 0, 1, N, F, C, C, C, F, 0.f);
    f.a_scale = inv, f.b_scale = inv2, f.fast_accum = 1;
    TIME("fp8 gemm fwd w1 (K-major, fast accum)", O->gemm(b->a, q8, q8b, &f), 0, fl);
    O->fp8_quantize(NULL, qwt, inv2, b->w_big, TETRA_BF16, am2, F, C, TETRA_FP8_E4M3); /* W^T [C, F] */
    O->fp8_quantize(qa, NULL, inv, b->a, TETRA_BF16, am, N, F, TETRA_FP8_E5M2);        /* dy [N, F] */
    ops_gemm_desc d = desc(TETRA_FP8_E5M2, TETRA_BF16, 0, 1, N, C, F, F, F, C, 0.f);
    d.b_type = TETRA_FP8_E4M3, d.a_scale = inv, d.b_scale = inv2;
    TIME("fp8 gemm dgrad w1 (K-major)", O->gemm(b->xn, qa, qwt, &d), 0, fl);
    O->fp8_quantize(NULL, qa, inv, b->a, TETRA_BF16, am, N, F, TETRA_FP8_E5M2);     /* dy^T [F, N] */
    O->fp8_quantize(NULL, qxt, inv2, b->xn, TETRA_BF16, am2, N, C, TETRA_FP8_E4M3); /* x^T [C, N] */
    ops_gemm_desc wg = desc(TETRA_FP8_E5M2, TETRA_F32, 0, 1, F, C, N, N, N, C, 1.f);
    wg.b_type = TETRA_FP8_E4M3, wg.a_scale = inv, wg.b_scale = inv2;
    TIME("fp8 gemm wgrad w1 (K-major, beta 1)", O->gemm(b->dw2, qa, qxt, &wg), 0, fl);
}

/* the logits GEMM, the fused cross-entropy and the head's two gradients; its vocabulary-
 * sized buffers are released after, being the largest of the run */
static void bench_output_head(const dims *dm, const buffers *b) {
    const int N = dm->N, C = dm->C, V = dm->V;
    char lab[128];
    GROUP = "output head";
    float *logits = rnd((size_t)N * V * 4);
    uint16_t *w_out = rnd((size_t)V * C * 2), *dl16 = dalloc((size_t)N * V * 2);
    float *losses = dalloc((size_t)N * 4);
    int32_t *tg = dalloc((size_t)N * 4), *ht = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) ht[i] = (int32_t)(((unsigned)i * 7919u) % (unsigned)V);
    O->copy_h2d(tg, ht, (size_t)N * 4);
    free(ht);
    const double fl = 2.0 * N * (double)V * C;
    ops_gemm_desc f = desc(TETRA_BF16, TETRA_F32, 0, 1, N, V, C, C, C, V, 0.f);
    snprintf(lab, sizeof lab, "logits gemm (fp32 out) [%d x %d x %d]", N, V, C);
    TIME(lab, O->gemm(logits, b->xn, w_out, &f), 0, fl);
    O->cast_f32_to_bf16(dl16, logits, (size_t)N * V);
    O->scale(logits, 1e-3f, (size_t)N * V);
    snprintf(lab, sizeof lab, "cross_entropy fused [%d x %d]", N, V);
    TIME(lab, O->cross_entropy(logits, losses, logits, tg, N, V, 1.0f / (float)N), (size_t)N * V * 12, 0);
    TIME("cast dlogits fp32 to bf16", O->cast_f32_to_bf16(dl16, logits, (size_t)N * V), (size_t)N * V * 6, 0);
    ops_gemm_desc d = desc(TETRA_BF16, TETRA_BF16, 0, 0, N, C, V, V, C, C, 0.f);
    snprintf(lab, sizeof lab, "head dgrad (K = %d)", V);
    TIME(lab, O->gemm(b->tmp, dl16, w_out, &d), 0, fl);
    O->release(logits);
    float *dwo = rnd((size_t)V * C * 4);
    ops_gemm_desc wg = desc(TETRA_BF16, TETRA_F32, 1, 0, V, C, N, V, C, C, 1.f);
    TIME("head wgrad (fp32 C, beta 1)", O->gemm(dwo, dl16, b->xn, &wg), 0, fl);
    O->release(dwo);
    O->release(dl16);
    O->release(w_out);
}

/* AdamW and the gradient passes around it, over one block's parameters */
static void bench_optimizer(const dims *dm) {
    const int C = dm->C, F = dm->F, HD = dm->HD, KVD = dm->KVD;
    char lab[128];
    GROUP = "optimizer (one block)";
    const size_t n = (size_t)C * HD + 2 * (size_t)C * KVD + (size_t)HD * C + 3 * (size_t)C * F + 2 * (size_t)C;
    float *p = rnd(n * 4), *m = rnd(n * 4), *vv = dalloc(n * 4), *g = rnd(n * 4), *out = dalloc(64);
    uint16_t *p16 = dalloc(n * 2);
    O->fill(vv, 1e-4f, n);
    snprintf(lab, sizeof lab, "adamw_step_bf16 (%.1fM parameters)", (double)n / 1e6);
    TIME(lab, O->adamw_step_bf16(p, p16, m, vv, g, n, 1e-4, 0.9, 0.95, 1e-8, 0.1, 10, 1.0f, NULL), n * 30, 0);
    /* the same update reporting the amaxes of the block's 7 linears (Float8's weights) */
    const int64_t lin[7] = {(int64_t)C * HD, (int64_t)C * KVD, (int64_t)C * KVD, (int64_t)HD * C,
                            (int64_t)C * F,  (int64_t)C * F,   (int64_t)C * F};
    int64_t h[14], at = 0;
    for (int k = 0; k < 7; k++) h[k] = at, h[7 + k] = lin[k], at += lin[k];
    int64_t *d = dalloc(sizeof h);
    O->copy_h2d(d, h, sizeof h);
    const ops_amax_segments seg = {7, d, d + 7, out};
    snprintf(lab, sizeof lab, "adamw_step_amax (%.1fM parameters, 7 weight amaxes)", (double)n / 1e6);
    TIME(lab, O->adamw_step_amax(p, p16, m, vv, g, n, 1e-4, 0.9, 0.95, 1e-8, 0.1, 10, 1.0f, NULL, &seg), n * 30, 0);
    O->release(d);
    TIME("fill fp32 (zero the gradients)", O->fill(g, 0.0f, n), n * 4, 0);
    TIME("sum_squares fp32 (grad norm)", O->sum_squares(out, p, n), n * 4, 0);
}

int main(int argc, char **argv) {
    const char *device = "cuda";
    int small = 0;
    const int rc = parse_args(argc, argv, &device, &small);
    if (rc >= 0) return rc;
    if (!open_backend(device)) return 2;
    const dims dm = choose_dims(small);
    make_pattern();
    print_header(&dm);

    buffers b;
    alloc_buffers(&dm, &b);
    bench_block_gemms(&dm, &b);
    bench_fused_qkv(&dm, &b);
    bench_paired(&dm, &b);
    bench_attention(&dm, &b);
    bench_elementwise(&dm, &b);
    bench_float8(&dm, &b);
    bench_output_head(&dm, &b);
    bench_optimizer(&dm);
    printf("\ngpu_ops: done\n");
    return 0;
}
