// kernels/cpu/cpu_gemm.c — every matmul of the CPU backend, each dtype routed to the library that was fastest on
// this model's shapes in the training step (docs/performance.md; bench/gemm_cpu times the GEMMs alone).
// - fp32: oneDNN's matmul where the CPU has AVX-512 or OpenBLAS does not know it (OpenBLAS picks kernels by CPU
//   model, oneDNN by ISA bits); elsewhere OpenBLAS sgemm, single-threaded per panel of C across OpenMP threads.
//   TETRA_CPU_GEMM=openblas|onednn overrides. ops_cpu_blas_coretype names a kernel set to restart with (cli/main.c).
// - bf16 x bf16: oneDNN's matmul (AVX512-BF16/AMX, fp32 accumulation); without AVX512-BF16, widened like fp8.
// - fp8 (and widened bf16): exact fp32 copies on OpenBLAS sgemm whatever the fp32 route, so FSDP stays bit-identical
//   to 1 rank (tests/sh/test_float8.sh); scales go on the fp32 accumulator. bf16 C: alpha AB + beta C, rounded once.
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops_math.h"

void cpu_blas_init(void) {
    static atomic_int done = 0;
    if (atomic_load_explicit(&done, memory_order_acquire)) return;
    // One thread pool only: OpenBLAS's own pthreads would compete with (and spin against)
    // the OpenMP threads that call it.
    openblas_set_num_threads(1);
    atomic_store_explicit(&done, 1, memory_order_release);
}

void cpu_sgemm_serial(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                      const float *b, int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                a, lda, b, ldb, beta, c, ldc);
}

// Split C into one panel per thread along its longer side; each panel is an independent
// sgemm. Small products stay serial (threading them costs more than it saves).
static void sgemm_openblas(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                           int ldb, float beta, float *c, int ldc) {
    cpu_blas_init();
    int nt = omp_get_max_threads();
    double work = (double)m * (double)n * (double)k;
    if (nt <= 1 || work < 4.0e6 || omp_in_parallel()) {
        cpu_sgemm_serial(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    int split_rows = m >= n;
    int len = split_rows ? m : n;
    int step = (len + nt - 1) / nt;
    step = (step + 15) / 16 * 16; // panel edges on 16-element boundaries (vector/cache friendly)
    int parts = (len + step - 1) / step;
#pragma omp parallel for schedule(static)
    for (int p = 0; p < parts; p++) {
        int lo = p * step;
        int cnt = len - lo < step ? len - lo : step;
        if (split_rows) {
            const float *ap = ta ? a + lo : a + (size_t)lo * lda;
            cpu_sgemm_serial(ta, tb, cnt, n, k, alpha, ap, lda, b, ldb, beta, c + (size_t)lo * ldc, ldc);
        } else {
            const float *bp = tb ? b + (size_t)lo * ldb : b + lo;
            cpu_sgemm_serial(ta, tb, m, cnt, k, alpha, a, lda, bp, ldb, beta, c + lo, ldc);
        }
    }
}

// Row kernels of the widening and the epilogues: CPU_SIMD so the bf16 shifts and the
// fp32 -> bf16 rounding run on full vectors (these passes are O(m k + k n + m n) next to
// the O(m n k) product, and must stay small for the debug model's thin GEMMs).
CPU_SIMD static void widen_bf16_k(float *restrict o, const uint16_t *restrict x, int n) {
    for (int j = 0; j < n; j++) o[j] = tetra_bf16_to_f32(x[j]);
}
CPU_SIMD static void widen_e4m3_k(float *restrict o, const uint8_t *restrict x, int n) {
    for (int j = 0; j < n; j++) o[j] = tetra_e4m3_to_f32(x[j]);
}
CPU_SIMD static void widen_e5m2_k(float *restrict o, const uint8_t *restrict x, int n) {
    for (int j = 0; j < n; j++) o[j] = tetra_e5m2_to_f32(x[j]);
}
CPU_SIMD static void round_bf16_k(uint16_t *restrict o, const float *restrict x, int n) {
    for (int j = 0; j < n; j++) o[j] = tetra_f32_to_bf16(x[j]);
}
// rowwise-scaled epilogue of one row: r = (alpha sa) sb[j] acc[j] (+ beta C), as fp32
CPU_SIMD_EXACT static void epi_f32_k(float *restrict c, const float *restrict acc, float as, const float *restrict sb,
                                     float beta, int n) {
    for (int j = 0; j < n; j++) {
        float r = as * (sb ? sb[j] : 1.0f) * acc[j];
        c[j] = beta != 0.0f ? r + beta * c[j] : r; // beta == 0: C is not read
    }
}
CPU_SIMD_EXACT static void epi_bf16_k(uint16_t *restrict c, const float *restrict acc, float as,
                                      const float *restrict sb, float beta, int n) {
    for (int j = 0; j < n; j++) {
        float r = as * (sb ? sb[j] : 1.0f) * acc[j];
        if (beta != 0.0f) r += beta * tetra_bf16_to_f32(c[j]);
        c[j] = tetra_f32_to_bf16(r);
    }
}

// Widen a stored operand [rows, cols] (leading dim ld) of any supported type to dense
// fp32 [rows, cols]. fp8 is decoded without its scale (the scale goes to the epilogue).
// A per-call host temporary (malloc, not cpu_alloc): outside the memory accounting.
static float *widen(const void *x, tetra_dtype t, int rows, int cols, int ld) {
    if (t != TETRA_F32 && t != TETRA_BF16 && t != TETRA_FP8_E4M3 && t != TETRA_FP8_E5M2)
        abort(); // unsupported operand type (F16/I32): a programming error
    float *out = (float *)malloc((size_t)rows * (size_t)cols * sizeof(float) + 64);
    if (!out) abort();
#pragma omp parallel for schedule(static) if ((int64_t)rows * cols > CPU_CHUNK)
    for (int r = 0; r < rows; r++) {
        float *o = out + (size_t)r * cols;
        size_t base = (size_t)r * (size_t)ld;
        if (t == TETRA_F32) memcpy(o, (const float *)x + base, (size_t)cols * sizeof(float));
        else if (t == TETRA_BF16) widen_bf16_k(o, (const uint16_t *)x + base, cols);
        else if (t == TETRA_FP8_E4M3) widen_e4m3_k(o, (const uint8_t *)x + base, cols);
        else widen_e5m2_k(o, (const uint8_t *)x + base, cols);
    }
    return out;
}

// ----------------------------------------------------------------------------
// oneDNN matmul (fp32 x fp32, bf16 x bf16). A primitive is compiled (JIT) for one shape,
// strides, types, alpha and beta; a run meets a few dozen such keys, so they are kept in
// a small table and compiled once each. Their memory objects are rebound to the call's
// pointers. One lock covers lookup and execution: the backend issues GEMMs from one
// thread at a time, and oneDNN threads each one across the OpenMP pool itself.

typedef struct {
    int m, n, k, ta, tb, lda, ldb, ldc, ab_bf16, c_bf16;
    float alpha, beta;
} dnnl_key;

typedef struct {
    dnnl_key key;
    dnnl_primitive_t prim;
    dnnl_memory_t ma, mb, mc;
} dnnl_entry;

#define DNNL_CACHE 128
static struct {
    pthread_mutex_t lock;
    int probed;
    dnnl_engine_t eng; // NULL when oneDNN could not start: every GEMM on OpenBLAS
    dnnl_stream_t st;
    int bf16_can, bf16_on; // the CPU has AVX512-BF16; bf16 x bf16 goes to oneDNN
    int f32_on;            // fp32 x fp32 goes to oneDNN
    dnnl_entry e[DNNL_CACHE];
    int n, next; // entries in use; the next one to replace once full
} dn = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void dnnl_fail(const char *what, dnnl_status_t s, const dnnl_key *k) {
    fprintf(stderr, "tetra: oneDNN %s failed (status %d) for %s GEMM m=%d n=%d k=%d ta=%d tb=%d\n", what, (int)s,
            k->ab_bf16 ? "bf16" : "fp32", k->m, k->n, k->k, k->ta, k->tb);
    abort(); // the op table has no error channel: a failed GEMM must not go unnoticed
}
#define DN(call, what, key)                                                                                            \
    do {                                                                                                               \
        dnnl_status_t st_ = (call);                                                                                    \
        if (st_ != dnnl_success) dnnl_fail(what, st_, key);                                                            \
    } while (0)

// OpenBLAS runs one of its pre-AVX2 kernel sets: the fallback it takes for a CPU model it
// does not know, whatever the ISA.
static int openblas_old_kernels(void) {
    static const char *old[] = {"Prescott", "Core2",      "Penryn",    "Dunnington", "Nehalem",    "Atom",
                                "Katmai",   "Coppermine", "Northwood", "Banias",     "Sandybridge"};
    const char *core = openblas_get_corename();
    for (size_t i = 0; core && i < sizeof old / sizeof old[0]; i++)
        if (!strcmp(core, old[i])) return 1;
    return 0;
}

// the old kernels on a CPU with AVX2
static int openblas_fallback(void) {
    return dnnl_get_effective_cpu_isa() >= dnnl_cpu_isa_avx2 && openblas_old_kernels();
}

const char *ops_cpu_blas_coretype(void) {
    if (getenv("OPENBLAS_CORETYPE")) return NULL; // the user's choice stands
    if (!openblas_old_kernels()) return NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
    return NULL;
}

// Called with dn.lock held.
static void dnnl_probe(void) {
    if (dn.probed) return;
    dn.probed = 1;
    if (dnnl_engine_create(&dn.eng, dnnl_cpu, 0) != dnnl_success) {
        dn.eng = NULL;
        return;
    }
    if (dnnl_stream_create(&dn.st, dn.eng, dnnl_stream_default_flags) != dnnl_success) {
        dnnl_engine_destroy(dn.eng);
        dn.eng = NULL;
        return;
    }
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    dn.bf16_can = dn.bf16_on = isa >= dnnl_cpu_isa_avx512_core_bf16;
    const char *env = getenv("TETRA_CPU_GEMM");
    if (env && !strcmp(env, "onednn")) dn.f32_on = 1;
    else if (env && !strcmp(env, "openblas")) dn.f32_on = 0;
    else dn.f32_on = isa >= dnnl_cpu_isa_avx512_core || openblas_fallback();
}

int cpu_gemm_bf16_onednn(int on) {
    pthread_mutex_lock(&dn.lock);
    dnnl_probe();
    int was = dn.bf16_on;
    if (on >= 0) dn.bf16_on = on && dn.bf16_can; // only where the probe found the ISA
    pthread_mutex_unlock(&dn.lock);
    return was;
}

int cpu_gemm_f32_onednn(int on) {
    pthread_mutex_lock(&dn.lock);
    dnnl_probe();
    int was = dn.f32_on;
    if (on >= 0) dn.f32_on = on && dn.eng;
    pthread_mutex_unlock(&dn.lock);
    return was;
}

static void dnnl_compile(dnnl_entry *e) {
    const dnnl_key *k = &e->key;
    dnnl_memory_desc_t da, db, dc;
    dnnl_data_type_t tab = k->ab_bf16 ? dnnl_bf16 : dnnl_f32;
    // logical A [m, k] and B [k, n]; a transposed operand is the same bytes read with
    // swapped strides, as a BLAS leading dimension would read them
    dnnl_dims_t ad = {k->m, k->k}, bd = {k->k, k->n}, cd = {k->m, k->n};
    dnnl_dims_t as = {k->ta ? 1 : k->lda, k->ta ? k->lda : 1};
    dnnl_dims_t bs = {k->tb ? 1 : k->ldb, k->tb ? k->ldb : 1};
    dnnl_dims_t cs = {k->ldc, 1};
    DN(dnnl_memory_desc_init_by_strides(&da, 2, ad, tab, as), "memory desc", k);
    DN(dnnl_memory_desc_init_by_strides(&db, 2, bd, tab, bs), "memory desc", k);
    DN(dnnl_memory_desc_init_by_strides(&dc, 2, cd, k->c_bf16 ? dnnl_bf16 : dnnl_f32, cs), "memory desc", k);
    dnnl_matmul_desc_t md;
    DN(dnnl_matmul_desc_init(&md, &da, &db, NULL, &dc), "matmul desc", k);
    dnnl_primitive_attr_t attr;
    DN(dnnl_primitive_attr_create(&attr), "attr", k);
    if (k->alpha != 1.0f) DN(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha), "output scale", k);
    if (k->beta != 0.0f) {
        // C = alpha AB + beta C: the sum post-op reads C in its own type and adds in fp32
        dnnl_post_ops_t po;
        DN(dnnl_post_ops_create(&po), "post-ops", k);
        DN(dnnl_post_ops_append_sum(po, k->beta), "sum post-op", k);
        DN(dnnl_primitive_attr_set_post_ops(attr, po), "post-ops", k);
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, &md, attr, dn.eng, NULL);
    dnnl_primitive_attr_destroy(attr);
    if (st == dnnl_unimplemented) return; // no kernel for this key: e->prim stays NULL
    DN(st, "matmul primitive desc", k);
    // oneDNN's reference kernels (plain loops) are its last resort: the other route is faster
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl &&
        !strncmp(impl, "ref", 3)) {
        dnnl_primitive_desc_destroy(pd);
        return;
    }
    DN(dnnl_primitive_create(&e->prim, pd), "matmul primitive", k);
    dnnl_primitive_desc_destroy(pd);
    DN(dnnl_memory_create(&e->ma, &da, dn.eng, DNNL_MEMORY_NONE), "memory", k);
    DN(dnnl_memory_create(&e->mb, &db, dn.eng, DNNL_MEMORY_NONE), "memory", k);
    DN(dnnl_memory_create(&e->mc, &dc, dn.eng, DNNL_MEMORY_NONE), "memory", k);
}

static void dnnl_release(dnnl_entry *e) {
    if (!e->prim) return;
    dnnl_primitive_destroy(e->prim);
    dnnl_memory_destroy(e->ma);
    dnnl_memory_destroy(e->mb);
    dnnl_memory_destroy(e->mc);
}

// Runs C = alpha op(A) op(B) + beta C on oneDNN; 0 when oneDNN is not used for this key
// (the caller takes the other route).
static int gemm_onednn(void *c, const void *a, const void *b, const dnnl_key *key) {
    if (key->k <= 0 || omp_in_parallel()) return 0;
    pthread_mutex_lock(&dn.lock);
    dnnl_probe();
    if (!dn.eng || !(key->ab_bf16 ? dn.bf16_on : dn.f32_on)) {
        pthread_mutex_unlock(&dn.lock);
        return 0;
    }
    dnnl_entry *e = NULL;
    for (int i = 0; i < dn.n && !e; i++)
        if (!memcmp(&dn.e[i].key, key, sizeof *key)) e = &dn.e[i];
    if (!e) {
        if (dn.n < DNNL_CACHE) {
            e = &dn.e[dn.n++];
        } else {
            e = &dn.e[dn.next];
            dn.next = (dn.next + 1) % DNNL_CACHE;
            dnnl_release(e);
        }
        memset(e, 0, sizeof *e);
        e->key = *key;
        dnnl_compile(e);
    }
    if (!e->prim) {
        pthread_mutex_unlock(&dn.lock);
        return 0;
    }
    DN(dnnl_memory_set_data_handle(e->ma, (void *)a), "set A", key);
    DN(dnnl_memory_set_data_handle(e->mb, (void *)b), "set B", key);
    DN(dnnl_memory_set_data_handle(e->mc, c), "set C", key);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, e->ma}, {DNNL_ARG_WEIGHTS, e->mb}, {DNNL_ARG_DST, e->mc}};
    DN(dnnl_primitive_execute(e->prim, dn.st, 3, args), "matmul", key);
    DN(dnnl_stream_wait(dn.st), "stream wait", key);
    pthread_mutex_unlock(&dn.lock);
    return 1;
}

// fp32 C = alpha op(A) op(B) + beta C on the fp32 route (above)
static void sgemm_parallel(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                           int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return;
    dnnl_key key = {m, n, k, ta, tb, lda, ldb, ldc, 0, 0, alpha, beta};
    if (gemm_onednn(c, a, b, &key)) return;
    sgemm_openblas(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static void gemm_one(void *c, const void *a, const void *b, const ops_gemm_desc *g) {
    int m = g->m, n = g->n, k = g->k;
    if (m <= 0 || n <= 0) return;
    if (g->a_type == TETRA_BF16 && g->b_type == TETRA_BF16 && !g->a_scale && !g->b_scale) {
        dnnl_key key = {m,        n,      k, g->trans_a, g->trans_b, g->lda, g->ldb, g->ldc, 1, g->c_type == TETRA_BF16,
                        g->alpha, g->beta};
        if (gemm_onednn(c, a, b, &key)) return;
    }
    int plain =
        g->a_type == TETRA_F32 && g->b_type == TETRA_F32 && g->c_type == TETRA_F32 && !g->a_scale && !g->b_scale;
    if (plain) {
        sgemm_parallel(g->trans_a, g->trans_b, m, n, k, g->alpha, (const float *)a, g->lda, (const float *)b, g->ldb,
                       g->beta, (float *)c, g->ldc);
        return;
    }
    // stored shapes: A is [k, m] when transposed else [m, k]; B is [n, k] or [k, n]
    int ar = g->trans_a ? k : m, ac = g->trans_a ? m : k;
    int br = g->trans_b ? n : k, bc = g->trans_b ? k : n;
    const float *af = g->a_type == TETRA_F32 ? (const float *)a : NULL;
    const float *bf = g->b_type == TETRA_F32 ? (const float *)b : NULL;
    float *a_tmp = NULL, *b_tmp = NULL;
    int lda = g->lda, ldb = g->ldb;
    if (!af) {
        a_tmp = widen(a, g->a_type, ar, ac, g->lda);
        af = a_tmp;
        lda = ac;
    }
    if (!bf) {
        b_tmp = widen(b, g->b_type, br, bc, g->ldb);
        bf = b_tmp;
        ldb = bc;
    }
    const int par = (int64_t)m * n > CPU_CHUNK;

    int rowwise = g->scale_rowwise && (g->a_scale || g->b_scale);
    if (!rowwise) {
        // tensorwise: one scalar, folded into alpha
        float s = g->alpha * (g->a_scale ? g->a_scale[0] : 1.0f) * (g->b_scale ? g->b_scale[0] : 1.0f);
        const int fp8 = tetra_dtype_size(g->a_type) == 1 || tetra_dtype_size(g->b_type) == 1;
        if (g->c_type == TETRA_F32 && fp8 && g->beta != 0.0f) {
            // fp8 into fp32 C with beta (a weight gradient accumulating): the scaled product
            // whole, then one add, as cuBLASLt's epilogue forms it, so that microbatches
            // accumulated here round as a sum of per-rank products does
            float *acc = (float *)malloc((size_t)m * (size_t)n * sizeof(float) + 64);
            if (!acc) abort();
            sgemm_openblas(g->trans_a, g->trans_b, m, n, k, s, af, lda, bf, ldb, 0.0f, acc, n);
#pragma omp parallel for schedule(static) if (par)
            for (int i = 0; i < m; i++) {
                float *ci = (float *)c + (size_t)i * (size_t)g->ldc;
                const float *ai = acc + (size_t)i * n;
                for (int j = 0; j < n; j++) ci[j] = ai[j] + g->beta * ci[j];
            }
            free(acc);
        } else if (g->c_type == TETRA_F32) {
            sgemm_openblas(g->trans_a, g->trans_b, m, n, k, s, af, lda, bf, ldb, g->beta, (float *)c, g->ldc);
        } else {
            // bf16 C: s AB + beta C formed in an fp32 buffer by the sgemm itself, rounded once
            uint16_t *cb = (uint16_t *)c;
            float *acc = (float *)malloc((size_t)m * (size_t)n * sizeof(float) + 64);
            if (!acc) abort();
            if (g->beta != 0.0f) {
#pragma omp parallel for schedule(static) if (par)
                for (int i = 0; i < m; i++) widen_bf16_k(acc + (size_t)i * n, cb + (size_t)i * g->ldc, n);
            }
            sgemm_openblas(g->trans_a, g->trans_b, m, n, k, s, af, lda, bf, ldb, g->beta, acc, n);
#pragma omp parallel for schedule(static) if (par)
            for (int i = 0; i < m; i++) round_bf16_k(cb + (size_t)i * g->ldc, acc + (size_t)i * n, n);
            free(acc);
        }
    } else {
        // rowwise fp8 scales: the product unscaled, then per-row/per-column dequant
        float *acc = (float *)malloc((size_t)m * (size_t)n * sizeof(float) + 64);
        if (!acc) abort();
        sgemm_openblas(g->trans_a, g->trans_b, m, n, k, 1.0f, af, lda, bf, ldb, 0.0f, acc, n);
#pragma omp parallel for schedule(static) if (par)
        for (int i = 0; i < m; i++) {
            float as = g->alpha * (g->a_scale ? g->a_scale[i] : 1.0f);
            size_t ci = (size_t)i * (size_t)g->ldc;
            if (g->c_type == TETRA_F32) epi_f32_k((float *)c + ci, acc + (size_t)i * n, as, g->b_scale, g->beta, n);
            else epi_bf16_k((uint16_t *)c + ci, acc + (size_t)i * n, as, g->b_scale, g->beta, n);
        }
        free(acc);
    }
    free(a_tmp);
    free(b_tmp);
}

void cpu_gemm(void *c, const void *a, const void *b, const ops_gemm_desc *g) {
    int batch = g->batch > 1 ? g->batch : 1;
    size_t ea = tetra_dtype_size(g->a_type), eb = tetra_dtype_size(g->b_type), ec = tetra_dtype_size(g->c_type);
    if (g->c_in && g->c_in != c && g->beta != 0.0f && g->m > 0 && g->n > 0) /* the sums below accumulate into c */
        for (int i = 0; i < batch; i++)
            for (int r = 0; r < g->m; r++) {
                const size_t off = ((size_t)i * (size_t)g->stride_c + (size_t)r * (size_t)g->ldc) * ec;
                memcpy((char *)c + off, (const char *)g->c_in + off, (size_t)g->n * ec);
            }
    for (int i = 0; i < batch; i++) {
        gemm_one((char *)c + (size_t)i * (size_t)g->stride_c * ec,
                 (const char *)a + (size_t)i * (size_t)g->stride_a * ea,
                 (const char *)b + (size_t)i * (size_t)g->stride_b * eb, g);
    }
}
