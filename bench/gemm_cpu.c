// bench/gemm_cpu.c — the GEMM libraries Debian ships, on the shapes the Llama 3 CPU runs
// use: OpenBLAS and BLIS sgemm (loaded side by side with dlopen, RTLD_LOCAL, since both
// export cblas_sgemm), oneDNN's sgemm, and oneDNN's matmul primitive in fp32 and in bf16
// (bf16 x bf16 -> fp32 accumulate, the AVX512-BF16 / AMX path). Every library runs on
// the same OpenMP threads: OpenBLAS and BLIS are called once per C panel, one panel per
// thread, as kernels/cpu/cpu_gemm.c does; oneDNN threads itself.
//
// Output: one row per shape and library, GFLOP/s (median of the timed repeats), and a
// check that every library's C agrees with OpenBLAS's (fp32 within 1e-4 relative, bf16
// within bf16 rounding of the inputs).
//
// Build and run: bench/gemm_cpu [--threads N] [--shapes debug|small|all]
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>

#define CHECK(x)                                                                                                       \
    do {                                                                                                               \
        if (!(x)) {                                                                                                    \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #x);                                      \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)
#define DNNL_CHECK(x) CHECK((x) == dnnl_success)

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                               float *, int);

static const char *isa_name(dnnl_cpu_isa_t isa) {
    if (isa >= dnnl_cpu_isa_avx512_core_amx) return "AMX";
    if (isa >= dnnl_cpu_isa_avx512_core_bf16) return "AVX512-BF16";
    if (isa >= dnnl_cpu_isa_avx512_core) return "AVX-512";
    if (isa >= dnnl_cpu_isa_avx2) return "AVX2";
    return "older than AVX2";
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// A shape: C[m, n] = A[m, k] op(B), B stored [n, k] (trans_b, a linear's forward x W^T) or
// [k, n] (the input gradient dy W), or A stored [k, m] (trans_a, the weight gradient dy^T x).
typedef struct {
    const char *what;
    int m, n, k, ta, tb;
} shape;

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// OpenBLAS/BLIS: one serial call per panel of C rows (or columns), one panel per thread.
static void blas_panels(cblas_sgemm_fn f, const shape *s, const float *a, const float *b, float *c) {
    int m = s->m, n = s->n, k = s->k, lda = s->ta ? m : k, ldb = s->tb ? k : n;
    int nt = omp_get_max_threads(), rows = m >= n, len = rows ? m : n;
    int step = ((len + nt - 1) / nt + 15) / 16 * 16, parts = (len + step - 1) / step;
#pragma omp parallel for schedule(static)
    for (int p = 0; p < parts; p++) {
        int lo = p * step, cnt = len - lo < step ? len - lo : step;
        if (rows)
            f(ROW_MAJOR, s->ta ? TRANS : NO_TRANS, s->tb ? TRANS : NO_TRANS, cnt, n, k, 1.0f,
              s->ta ? a + lo : a + (size_t)lo * lda, lda, b, ldb, 0.0f, c + (size_t)lo * n, n);
        else
            f(ROW_MAJOR, s->ta ? TRANS : NO_TRANS, s->tb ? TRANS : NO_TRANS, m, cnt, k, 1.0f, a, lda,
              s->tb ? b + (size_t)lo * ldb : b + lo, ldb, 0.0f, c + lo, n);
    }
}

// oneDNN matmul of one shape and element type, its memory descriptors strided so that
// the transposed operands are read in place (as a GEMM's lda would).
typedef struct {
    dnnl_engine_t eng;
    dnnl_stream_t st;
    dnnl_primitive_t prim;
    dnnl_memory_t ma, mb, mc;
} dnnl_mm;

// 0 when oneDNN has no implementation for this type on this CPU (bf16 before AVX512).
static int mm_init(dnnl_mm *x, const shape *s, dnnl_data_type_t t, void *a, void *b, float *c) {
    DNNL_CHECK(dnnl_engine_create(&x->eng, dnnl_cpu, 0));
    DNNL_CHECK(dnnl_stream_create(&x->st, x->eng, dnnl_stream_default_flags));
    dnnl_memory_desc_t da, db, dc;
    dnnl_dims_t ad = {s->m, s->k}, bd = {s->k, s->n}, cd = {s->m, s->n};
    dnnl_dims_t as = {s->ta ? 1 : s->k, s->ta ? s->m : 1};
    dnnl_dims_t bs = {s->tb ? 1 : s->n, s->tb ? s->k : 1};
    dnnl_dims_t cs = {s->n, 1};
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&da, 2, ad, t, as));
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&db, 2, bd, t, bs));
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&dc, 2, cd, dnnl_f32, cs));
    dnnl_matmul_desc_t md;
    DNNL_CHECK(dnnl_matmul_desc_init(&md, &da, &db, NULL, &dc));
    dnnl_primitive_desc_t pd;
    if (dnnl_primitive_desc_create(&pd, &md, NULL, x->eng, NULL) != dnnl_success) {
        dnnl_stream_destroy(x->st);
        dnnl_engine_destroy(x->eng);
        return 0;
    }
    DNNL_CHECK(dnnl_primitive_create(&x->prim, pd));
    DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
    DNNL_CHECK(dnnl_memory_create(&x->ma, &da, x->eng, a));
    DNNL_CHECK(dnnl_memory_create(&x->mb, &db, x->eng, b));
    DNNL_CHECK(dnnl_memory_create(&x->mc, &dc, x->eng, c));
    return 1;
}
static void mm_run(dnnl_mm *x) {
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, x->ma}, {DNNL_ARG_WEIGHTS, x->mb}, {DNNL_ARG_DST, x->mc}};
    DNNL_CHECK(dnnl_primitive_execute(x->prim, x->st, 3, args));
    DNNL_CHECK(dnnl_stream_wait(x->st));
}
static void mm_free(dnnl_mm *x) {
    dnnl_primitive_destroy(x->prim);
    dnnl_memory_destroy(x->ma);
    dnnl_memory_destroy(x->mb);
    dnnl_memory_destroy(x->mc);
    dnnl_stream_destroy(x->st);
    dnnl_engine_destroy(x->eng);
}

static double rel_err(const float *c, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)c[i] - ref[i]) * ((double)c[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

#define REPS 7
// median seconds of REPS runs of one library on one shape
#define TIME(call)                                                                                                     \
    ({                                                                                                                 \
        double ts[REPS];                                                                                               \
        call;                                                                                                          \
        for (int r = 0; r < REPS; r++) {                                                                               \
            double t0 = now();                                                                                         \
            call;                                                                                                      \
            ts[r] = now() - t0;                                                                                        \
        }                                                                                                              \
        qsort(ts, REPS, sizeof ts[0], cmp_d);                                                                          \
        ts[REPS / 2];                                                                                                  \
    })

int main(int argc, char **argv) {
    int threads = 2;
    const char *set = "all";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) set = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--threads N] [--shapes debug|small|all]\n", argv[0]);
            return 2;
        }
    }
    omp_set_num_threads(threads);
    void *hob = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    void *hbl = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!hob) {
        fprintf(stderr, "gemm_cpu: libopenblas.so.0: %s\n", dlerror());
        return 1;
    }
    cblas_sgemm_fn ob = (cblas_sgemm_fn)dlsym(hob, "cblas_sgemm");
    cblas_sgemm_fn bl = hbl ? (cblas_sgemm_fn)dlsym(hbl, "cblas_sgemm") : NULL;
    void (*ob_threads)(int) = (void (*)(int))dlsym(hob, "openblas_set_num_threads");
    if (ob_threads) ob_threads(1); // serial inside each panel, as the backend runs it
    if (hbl) {
        void (*bl_threads)(int) = (void (*)(int))dlsym(hbl, "bli_thread_set_num_threads");
        if (bl_threads) bl_threads(1);
    } else {
        printf("# BLIS not found (libblis.so.4): apt-get install libblis4-openmp\n");
    }

    // tokens x dims of the debug model (dim 256, ffn 768, vocab 2048) at seq 512 x batch 4
    // and 2048 x 8, and of `small` (dim 512, ffn 1536) at 512 x 4
    shape all[] = {
        {"debug qkvo fwd", 2048, 256, 256, 0, 1},   {"debug w1/w3 fwd", 2048, 768, 256, 0, 1},
        {"debug w2 fwd", 2048, 256, 768, 0, 1},     {"debug out fwd", 2048, 2048, 256, 0, 1},
        {"debug w1 dgrad", 2048, 256, 768, 0, 0},   {"debug w1 wgrad", 768, 256, 2048, 1, 0},
        {"debug out wgrad", 2048, 256, 2048, 1, 0}, {"debug 16K w1 fwd", 16384, 768, 256, 0, 1},
        {"small w1/w3 fwd", 2048, 1536, 512, 0, 1}, {"small w2 fwd", 2048, 512, 1536, 0, 1},
        {"small w1 wgrad", 1536, 512, 2048, 1, 0},  {"square 2048", 2048, 2048, 2048, 0, 0},
    };
    // OpenBLAS picks its kernels by CPU model; on a model it does not know it falls back to
    // old ones (Prescott: SSE3), whatever the ISA
    const char *(*ob_core)(void) = (const char *(*)(void))dlsym(hob, "openblas_get_corename");
    printf("threads %d; GFLOP/s, median of %d; rel err vs OpenBLAS; OpenBLAS kernels: %s; oneDNN ISA: %s\n", threads,
           REPS, ob_core ? ob_core() : "?", isa_name(dnnl_get_effective_cpu_isa()));
    printf("%-18s %6s %6s %6s | %9s %9s %9s %9s %9s | %8s %8s\n", "shape", "m", "n", "k", "openblas", "blis",
           "dnnl_sgemm", "dnnl_f32", "dnnl_bf16", "err f32", "err bf16");
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        shape *s = &all[i];
        if (strcmp(set, "all") && strncmp(s->what, set, strlen(set))) continue;
        size_t na = (size_t)s->m * s->k, nb = (size_t)s->k * s->n, nc = (size_t)s->m * s->n;
        float *a = malloc(na * 4), *b = malloc(nb * 4), *c0 = calloc(nc, 4), *c = calloc(nc, 4);
        uint16_t *a16 = malloc(na * 2), *b16 = malloc(nb * 2);
        float *a_r = malloc(na * 4), *b_r = malloc(nb * 4);
        CHECK(a && b && c0 && c && a16 && b16 && a_r && b_r);
        srand(1);
        for (size_t j = 0; j < na; j++) a[j] = (float)rand() / RAND_MAX - 0.5f;
        for (size_t j = 0; j < nb; j++) b[j] = (float)rand() / RAND_MAX - 0.5f;
        for (size_t j = 0; j < na; j++) a_r[j] = from_bf16(a16[j] = to_bf16(a[j]));
        for (size_t j = 0; j < nb; j++) b_r[j] = from_bf16(b16[j] = to_bf16(b[j]));
        double flop = 2.0 * s->m * s->n * s->k;

        double t_ob = TIME(blas_panels(ob, s, a, b, c0));
        double t_bl = 0, e_bl = 0;
        if (bl) {
            t_bl = TIME(blas_panels(bl, s, a, b, c));
            e_bl = rel_err(c, c0, nc);
        }
        char ta = s->ta ? 'T' : 'N', tb = s->tb ? 'T' : 'N';
        int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
        double t_ds = TIME(DNNL_CHECK(dnnl_sgemm(ta, tb, s->m, s->n, s->k, 1.0f, a, lda, b, ldb, 0.0f, c, s->n)));
        double e_ds = rel_err(c, c0, nc);
        dnnl_mm x;
        CHECK(mm_init(&x, s, dnnl_f32, a, b, c));
        double t_df = TIME(mm_run(&x));
        double e_df = rel_err(c, c0, nc);
        mm_free(&x);
        double t_dh = 0, e_dh = 0;
        if (mm_init(&x, s, dnnl_bf16, a16, b16, c)) {
            t_dh = TIME(mm_run(&x));
            mm_free(&x);
            // the bf16 product against fp32 on the rounded inputs: summation order only
            blas_panels(ob, s, a_r, b_r, c0);
            e_dh = rel_err(c, c0, nc);
        } else if (i == 0) {
            printf("# oneDNN has no bf16 matmul on this CPU (needs AVX512): its column reads 0\n");
        }
        double e_f32 = fmax(fmax(e_bl, e_ds), e_df);
        printf("%-18s %6d %6d %6d | %9.1f %9.1f %9.1f %9.1f %9.1f | %8.1e %8.1e\n", s->what, s->m, s->n, s->k,
               flop / t_ob * 1e-9, bl ? flop / t_bl * 1e-9 : 0.0, flop / t_ds * 1e-9, flop / t_df * 1e-9,
               t_dh > 0 ? flop / t_dh * 1e-9 : 0.0, e_f32, e_dh);
        CHECK(e_f32 < 1e-4 && e_dh < 1e-4);
        free(a), free(b), free(c0), free(c), free(a16), free(b16), free(a_r), free(b_r);
    }
    return 0;
}
