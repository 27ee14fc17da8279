/* Llama 3 model: counter-based init (known answers, determinism, slices,
 * statistics), backward split into I and W equal to the one-pass backward bit
 * for bit, independent microbatch activations, gradients against finite
 * differences, Hugging Face safetensors save/load (round trip, the q/k rotary
 * permutation, sharded folders, F16/BF16 inputs, error messages), stage-local
 * layouts against the full model, save policies (recompute) against keeping
 * everything, and the linear descriptors' implementation slot. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/ops.h"
#include "models/llama3/documents.h"
#include "models/llama3/hf.h"
#include "models/llama3/init.h"
#include "models/llama3/model.h"
#include "tests/check.h"

static char tmpdir[512];

static void make_model(llama3_model *m, const char *flavor, int max_seq) {
    llama3_args a;
    char err[512];
    if (llama3_flavor(flavor, &a) != 0 || llama3_model_init(m, &a, max_seq, ops_cpu(), err, sizeof err) != 0) {
        fprintf(stderr, "cannot build %s: %s\n", flavor, err);
        exit(1);
    }
}

/* deterministic test data from a small LCG */
static uint64_t lcg_state = 88172645463325252ull;
static uint32_t lcg(void) {
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(lcg_state >> 33);
}
static double unif(void) { return (lcg() + 0.5) / 2147483648.0; }

static void make_batch(int32_t *in, int32_t *tg, int n, int vocab, int ignore_every) {
    for (int i = 0; i < n; i++) {
        in[i] = (int32_t)(lcg() % (uint32_t)vocab);
        tg[i] = (int32_t)(lcg() % (uint32_t)vocab);
        if (ignore_every && i % ignore_every == ignore_every - 1) tg[i] = OPS_IGNORE_INDEX;
    }
}

/* ---------------------------------------------------------------------------- init */

static void test_philox(void) {
    /* Random123 known-answer vectors for philox4x32-10 */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
         0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
         0x24126ea1},
    };
    for (int v = 0; v < 3; v++) {
        uint32_t out[4];
        llama3_philox4x32_10(out, kat[v], kat[v] + 4);
        CHECK(!memcmp(out, kat[v] + 6, sizeof out), "philox vector %d: %08x %08x %08x %08x", v, out[0], out[1], out[2],
              out[3]);
    }
    /* the quantile inverts the normal CDF: x within 1.15e-9 relative of the exact
     * quantile, so Phi(x) within phi(x) |x| 1.15e-9 of p */
    const double ps[] = {1e-300, 1e-12, 0.001, 0.02425, 0.3, 0.5, 0.7, 0.97575, 0.999999};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        double x = llama3_normal_quantile(ps[i]);
        double q = ps[i] < 0.5 ? ps[i] : 1.0 - ps[i];
        double p = 0.5 * erfc(fabs(x) / sqrt(2.0)); /* the smaller tail, computed without cancellation */
        double pdf = exp(-0.5 * x * x) / sqrt(2.0 * 3.14159265358979323846);
        CHECK(fabs(p - q) <= 1.2e-9 * fabs(x) * pdf + 1e-15 * q, "quantile(%g) = %.17g -> tail %.17g", ps[i], x, p);
    }
}

static double std_of(const float *x, size_t n, double *mean_out) {
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) s += x[i];
    double mean = s / (double)n;
    for (size_t i = 0; i < n; i++) s2 += (x[i] - mean) * (x[i] - mean);
    if (mean_out) *mean_out = mean;
    return sqrt(s2 / (double)n);
}

static void test_init(void) {
    llama3_model m1, m2;
    make_model(&m1, "tiny", 64);
    make_model(&m2, "tiny", 64);
    llama3_init_weights(&m1, 1234);
    llama3_init_weights(&m2, 1234);
    const size_t bytes = m1.total_numel * sizeof(float);
    CHECK(!memcmp(m1.param_mem, m2.param_mem, bytes), "same seed, same bits");
    llama3_init_weights(&m2, 1235);
    CHECK(memcmp(m1.param_mem, m2.param_mem, bytes) != 0, "another seed, other weights");

    /* units tile the buffer; params are contiguous within their unit */
    size_t off = 0;
    for (int u = 0; u < m1.n_units; u++) {
        CHECK(m1.unit_offset[u] == off, "unit %d offset", u);
        off += m1.unit_numel[u];
    }
    CHECK(off == m1.total_numel && (int64_t)off == llama3_num_params(&m1.args), "total %zu vs %lld", off,
          (long long)llama3_num_params(&m1.args));

    /* every element is the RNG evaluated at (seed, name, index), and any slice agrees */
    for (int i = 0; i < m1.n_params; i++) {
        const llama3_param *p = &m1.params[i];
        const float *w = m1.param_mem + p->offset;
        for (int r = 0; r < 8; r++) {
            size_t j = lcg() % p->numel;
            float want =
                p->init_ones ? 1.0f : llama3_rng_trunc_normal(1234, p->name, j, p->init_std, p->init_lo, p->init_hi);
            CHECK(w[j] == want, "%s[%zu] = %g, rng gives %g", p->name, j, w[j], want);
        }
        size_t start = p->numel / 3, count = p->numel / 5 + 1;
        float *slice = malloc(count * sizeof(float));
        llama3_init_param_range(p, 1234, start, count, slice);
        CHECK(!memcmp(slice, w + start, count * sizeof(float)), "%s: slice [%zu, +%zu) differs", p->name, start, count);
        free(slice);
    }

    /* statistics: TorchTitan's stds; the output is cut at 3 sigma (std factor 0.98658) */
    const llama3_args *a = &m1.args;
    struct {
        const char *name;
        double std;
    } want[] = {
        {"tok_embeddings.weight", 1.0},
        {"layers.0.attention.wq.weight", 0.02},
        {"layers.1.feed_forward.w1.weight", 0.02},
        {"layers.0.attention.wo.weight", 0.02 / sqrt(2.0)},
        {"layers.1.attention.wo.weight", 0.02 / sqrt(4.0)},
        {"layers.1.feed_forward.w2.weight", 0.02 / sqrt(4.0)},
        {"layers.1.feed_forward.w3.weight", 0.02 / sqrt(4.0)},
        {"output.weight", 0.986582 / sqrt((double)a->dim)},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const llama3_param *p = llama3_find_param(&m1, want[i].name);
        CHECK(p != NULL, "%s", want[i].name);
        if (!p) continue;
        double mean, sd = std_of(m1.param_mem + p->offset, p->numel, &mean);
        double tol = 4.0 / sqrt(2.0 * (double)p->numel); /* 4 standard errors of a sample std */
        CHECK(fabs(sd / want[i].std - 1.0) < tol, "%s: std %g, want %g", want[i].name, sd, want[i].std);
        CHECK(fabs(mean) < 4.0 * want[i].std / sqrt((double)p->numel), "%s: mean %g", want[i].name, mean);
    }
    const llama3_param *po = llama3_find_param(&m1, "output.weight");
    float mx = 0;
    for (size_t j = 0; j < po->numel; j++) mx = fmaxf(mx, fabsf(m1.param_mem[po->offset + j]));
    CHECK(mx <= 3.0 / sqrt((double)a->dim) && mx > 2.5 / sqrt((double)a->dim), "output max |w| %g", mx);
    const llama3_param *pn = llama3_find_param(&m1, "layers.1.ffn_norm.weight");
    int ones = 1;
    for (size_t j = 0; j < pn->numel; j++) ones &= m1.param_mem[pn->offset + j] == 1.0f;
    CHECK(ones, "norm weights are 1");
    llama3_model_free(&m1);
    llama3_model_free(&m2);
}

/* ---------------------------------------------------------------------------- backward */

static void test_i_then_w(void) {
    llama3_model m;
    char err[256];
    make_model(&m, "tiny", 64);
    llama3_init_weights(&m, 42);
    const int b = 2, t = 24, n = b * t;
    int32_t in[48], tg[48], in2[48], tg2[48];
    make_batch(in, tg, n, m.args.vocab_size, 7);
    make_batch(in2, tg2, n, m.args.vocab_size, 0);
    llama3_acts *a = llama3_acts_create(&m, b, t, err, sizeof err);
    llama3_acts *a2 = llama3_acts_create(&m, b, t, err, sizeof err);
    CHECK(a && a2, "%s", err);
    const size_t bytes = m.total_numel * sizeof(float);
    float *g_full = malloc(bytes), *g_split = malloc(bytes);

    int64_t valid = 0;
    llama3_zero_grads(&m);
    double l1 = llama3_forward(&m, a, in, tg, 1.0f / 41.0f, &valid);
    CHECK(valid == 48 - 6, "valid %lld", (long long)valid);
    llama3_backward(&m, a);
    memcpy(g_full, m.grad_mem, bytes);

    /* all I passes first (layers L-1..0), then the W passes in the other order */
    llama3_zero_grads(&m);
    double l2 = llama3_forward(&m, a, in, tg, 1.0f / 41.0f, NULL);
    CHECK(l1 == l2, "forward is deterministic: %.9g vs %.9g", l1, l2);
    llama3_backward_head(&m, a);
    for (int l = m.args.n_layers - 1; l >= 0; l--) llama3_block_backward_input(&m, a, l);
    llama3_backward_embedding(&m, a);
    for (int l = 0; l < m.args.n_layers; l++) llama3_block_backward_weight(&m, a, l);
    memcpy(g_split, m.grad_mem, bytes);
    CHECK(!memcmp(g_full, g_split, bytes), "I then W equals the one-pass backward bit for bit");

    /* two microbatches in flight: fwd1 fwd2 bwd1 bwd2 == fwd1 bwd1 fwd2 bwd2 */
    llama3_zero_grads(&m);
    llama3_forward(&m, a, in, tg, 0.01f, NULL);
    llama3_backward(&m, a);
    llama3_forward(&m, a, in2, tg2, 0.01f, NULL);
    llama3_backward(&m, a);
    memcpy(g_full, m.grad_mem, bytes);
    llama3_zero_grads(&m);
    llama3_forward(&m, a, in, tg, 0.01f, NULL);
    llama3_forward(&m, a2, in2, tg2, 0.01f, NULL);
    llama3_backward(&m, a);
    llama3_backward(&m, a2);
    CHECK(!memcmp(g_full, m.grad_mem, bytes), "activations of two microbatches are independent");

    /* logits kept on request, or left in place by a forward without targets */
    CHECK(llama3_logits(a) == NULL, "no logits after a forward with targets");
    CHECK(llama3_acts_keep_logits(&m, a, 1) == 0, "keep logits");
    llama3_forward(&m, a, in, tg, 0.01f, NULL);
    const size_t lbytes = (size_t)n * m.args.vocab_size * sizeof(float);
    float *kept = malloc(lbytes);
    memcpy(kept, llama3_logits(a), lbytes);
    llama3_acts_keep_logits(&m, a, 0);
    llama3_forward(&m, a, in, NULL, 0.0f, NULL);
    CHECK(llama3_logits(a) && !memcmp(kept, llama3_logits(a), lbytes), "logits without targets");
    free(kept);

    size_t ab = llama3_acts_bytes(&m, b, t);
    CHECK(ab > 0 && ab < (size_t)64 << 20, "acts bytes %zu", ab);
    llama3_acts_free(&m, a);
    llama3_acts_free(&m, a2);
    free(g_full);
    free(g_split);
    llama3_model_free(&m);
}

/* The debug model at batch 8 x 2048 must fit in a few GB and nothing may grow with t^2. */
static void test_acts_memory(void) {
    llama3_model m;
    make_model(&m, "debugmodel", 4096);
    size_t b1 = llama3_acts_bytes(&m, 8, 1024), b2 = llama3_acts_bytes(&m, 8, 2048),
           b3 = llama3_acts_bytes(&m, 8, 3072);
    double gib = (double)b2 / (1 << 30);
    CHECK(gib < 3.0, "debugmodel 8 x 2048 activations %.2f GiB", gib);
    /* linear in t: the second difference vanishes up to alignment and workspace slack */
    double curv = ((double)b3 - 2.0 * (double)b2 + (double)b1) / (double)b2;
    CHECK(fabs(curv) < 0.01, "activation bytes not linear in seq_len: %zu %zu %zu", b1, b2, b3);
    printf("test_model: debugmodel activations at 8 x 2048: %.2f GiB\n", gib);
    llama3_model_free(&m);
}

/* loss mean over valid targets, evaluated at the current parameters */
static double eval_loss(llama3_model *m, llama3_acts *a, const int32_t *in, const int32_t *tg, int64_t valid) {
    return llama3_forward(m, a, in, tg, 1.0f, NULL) / (double)valid;
}

static void test_gradcheck(void) {
    llama3_model m;
    char err[256];
    make_model(&m, "tiny", 32);
    llama3_init_weights(&m, 7);
    /* norms away from 1 so their gradients are not special */
    for (int i = 0; i < m.n_params; i++) {
        const llama3_param *p = &m.params[i];
        if (p->init_ones)
            for (size_t j = 0; j < p->numel; j++) m.param_mem[p->offset + j] = (float)(0.5 + unif());
    }
    const int b = 2, t = 16, n = b * t;
    int32_t in[32], tg[32];
    make_batch(in, tg, n, 64, 5); /* a small id range: embedding rows get several tokens */
    llama3_acts *a = llama3_acts_create(&m, b, t, err, sizeof err);
    int64_t valid = 0;
    llama3_zero_grads(&m);
    llama3_forward(&m, a, in, tg, 1.0f, &valid);
    llama3_zero_grads(&m);
    double l0 = llama3_forward(&m, a, in, tg, (float)(1.0 / (double)valid), NULL) / (double)valid;
    llama3_backward(&m, a);
    float *grad = malloc(m.total_numel * sizeof(float));
    memcpy(grad, m.grad_mem, m.total_numel * sizeof(float));
    float *theta = malloc(m.total_numel * sizeof(float));
    memcpy(theta, m.param_mem, m.total_numel * sizeof(float));
    /* fp32 forward: the loss carries a few ulps of rounding noise */
    const double noise = 8.0 * fabs(l0) * 0x1p-24;

    double worst_dir = 0, worst_coord = 0;
    for (int i = 0; i < m.n_params; i++) {
        const llama3_param *p = &m.params[i];
        float *w = m.param_mem + p->offset;
        const float *g = grad + p->offset, *w0 = theta + p->offset;
        /* 1) a directional derivative along u = sign(g) * U(0.5, 1.5): every element of
         * the tensor at once, with the step sized to move the loss by about 1e-3 (larger steps leave the
         * linear range for wq/wk, whose gradients are small) */
        double gu = 0, gmax = 0;
        float *u = malloc(p->numel * sizeof(float));
        for (size_t j = 0; j < p->numel; j++) {
            u[j] = g[j] == 0.0f ? 0.0f : (g[j] > 0 ? 1.0f : -1.0f) * (float)(0.5 + unif());
            gu += (double)g[j] * u[j];
            gmax = fmax(gmax, fabs(g[j]));
        }
        CHECK(gmax > 0, "%s has a zero gradient", p->name);
        if (gmax == 0) {
            free(u);
            continue;
        }
        double h = 1e-3 / gu;
        double pred = 0;
        for (size_t j = 0; j < p->numel; j++) w[j] = (float)(w0[j] + h * u[j]);
        double lp = eval_loss(&m, a, in, tg, valid);
        for (size_t j = 0; j < p->numel; j++) {
            float wm = (float)(w0[j] - h * u[j]);
            pred += (double)g[j] * ((double)w[j] - (double)wm); /* the perturbation actually applied */
            w[j] = wm;
        }
        double lm = eval_loss(&m, a, in, tg, valid);
        memcpy(w, w0, p->numel * sizeof(float));
        double rel = fabs((lp - lm) - pred) / fabs(pred);
        worst_dir = fmax(worst_dir, rel);
        CHECK(rel < 2e-2, "%s: directional fd %.6g vs analytic %.6g (rel %.2e)", p->name, lp - lm, pred, rel);
        free(u);

        /* 2) single coordinates: the largest gradient and two random ones, stepped to move
         * the loss by 2e-3 (at most 0.25) so the rounding noise stays small beside it */
        size_t jmax = 0;
        for (size_t j = 0; j < p->numel; j++)
            if (fabs(g[j]) > fabs(g[jmax])) jmax = j;
        for (int c = 0; c < 3; c++) {
            size_t j = c == 0 ? jmax : lcg() % p->numel;
            double hj = fmin(2e-3 / fmax(fabs(g[j]), 1e-12), 0.25);
            float wp = (float)(w0[j] + hj), wm = (float)(w0[j] - hj);
            w[j] = wp;
            double lpj = eval_loss(&m, a, in, tg, valid);
            w[j] = wm;
            double lmj = eval_loss(&m, a, in, tg, valid);
            w[j] = w0[j];
            double fd = (lpj - lmj) / ((double)wp - (double)wm);
            double tol = 2e-2 * fabs(g[j]) + 2.0 * noise / ((double)wp - (double)wm);
            double e = fabs(fd - g[j]);
            if (c == 0) worst_coord = fmax(worst_coord, e / fabs(g[j]));
            CHECK(e <= tol, "%s[%zu]: fd %.6g vs analytic %.6g (tol %.2g)", p->name, j, fd, g[j], tol);
        }
    }
    printf("test_model: gradcheck worst relative error: directional %.2e, largest coordinate %.2e\n", worst_dir,
           worst_coord);
    llama3_acts_free(&m, a);
    free(grad);
    free(theta);
    llama3_model_free(&m);
}

/* ---------------------------------------------------------------------------- safetensors */

/* exact for values representable in f16 (the test only writes such values) */
static uint16_t f32_to_f16_exact(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7fffffffu) == 0) return sign;
    int e = (int)((u >> 23) & 0xff) - 127 + 15;
    return (uint16_t)(sign | (uint16_t)(e << 10) | (uint16_t)((u >> 13) & 0x3ffu));
}

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[2];
    const char *dtype; /* F32, F16, I32 */
    const float *data;
} st_tensor;

/* A minimal safetensors writer, independent of the one under test. */
static void write_st(const char *path, const st_tensor *ts, int n) {
    json_t *root = json_object();
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t numel = (size_t)ts[i].shape[0] * (size_t)(ts[i].ndim == 2 ? ts[i].shape[1] : 1);
        size_t bytes = numel * (strcmp(ts[i].dtype, "F16") ? 4 : 2);
        json_t *e = json_pack("{s:s, s:[], s:[I, I]}", "dtype", ts[i].dtype, "shape", "data_offsets", (json_int_t)off,
                              (json_int_t)(off + bytes));
        for (int d = 0; d < ts[i].ndim; d++)
            json_array_append_new(json_object_get(e, "shape"), json_integer(ts[i].shape[d]));
        json_object_set_new(root, ts[i].name, e);
        off += bytes;
    }
    char *hdr = json_dumps(root, JSON_COMPACT);
    uint64_t hl = strlen(hdr);
    FILE *f = fopen(path, "wb");
    fwrite(&hl, 8, 1, f); /* little-endian host */
    fwrite(hdr, 1, hl, f);
    for (int i = 0; i < n; i++) {
        size_t numel = (size_t)ts[i].shape[0] * (size_t)(ts[i].ndim == 2 ? ts[i].shape[1] : 1);
        if (!strcmp(ts[i].dtype, "F16")) {
            for (size_t j = 0; j < numel; j++) {
                uint16_t hv = f32_to_f16_exact(ts[i].data[j]);
                fwrite(&hv, 2, 1, f);
            }
        } else {
            fwrite(ts[i].data, 4, numel, f);
        }
    }
    fclose(f);
    free(hdr);
    json_decref(root);
}

/* The model's tensors in HF layout (q/k permuted by the formats reference formula),
 * as st_tensor rows; hf_names/data are owned by the caller's arrays. */
static int hf_tensors(const llama3_model *m, st_tensor *ts, char (*names)[128], float **bufs) {
    const int hd = llama3_head_dim(&m->args);
    for (int i = 0; i < m->n_params; i++) {
        const llama3_param *p = &m->params[i];
        llama3_hf_name(p->name, names[i], 128);
        const float *src = m->param_mem + p->offset;
        bufs[i] = malloc(p->numel * sizeof(float));
        int perm = strstr(p->name, "wq.weight") || strstr(p->name, "wk.weight");
        if (!perm) {
            memcpy(bufs[i], src, p->numel * sizeof(float));
        } else {
            int64_t cols = p->shape[1], heads = p->shape[0] / hd;
            for (int64_t h = 0; h < heads; h++)
                for (int tt = 0; tt < 2; tt++)
                    for (int ii = 0; ii < hd / 2; ii++)
                        memcpy(bufs[i] + (h * hd + tt * (hd / 2) + ii) * cols, src + (h * hd + 2 * ii + tt) * cols,
                               (size_t)cols * sizeof(float));
        }
        ts[i].name = names[i];
        ts[i].ndim = p->ndim;
        ts[i].shape[0] = p->shape[0];
        ts[i].shape[1] = p->shape[1];
        ts[i].dtype = "F32";
        ts[i].data = bufs[i];
    }
    return m->n_params;
}

static void expect_load_error(llama3_model *m, const char *path, const char *needle1, const char *needle2) {
    char err[1024] = "";
    int rc = llama3_load_hf(m, path, err, sizeof err);
    CHECK(rc != 0, "loading %s should fail", path);
    CHECK(strstr(err, needle1) && strstr(err, needle2), "message '%s' should name '%s' and '%s'", err, needle1,
          needle2);
}

static void test_hf(void) {
    llama3_model m, m2;
    char err[1024], path[1024];
    make_model(&m, "tiny", 32);
    make_model(&m2, "tiny", 32);
    llama3_init_weights(&m, 99);
    const size_t bytes = m.total_numel * sizeof(float);

    /* float32 round trip is exact */
    snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
    CHECK(llama3_save_hf(&m, path, "float32", err, sizeof err) == 0, "%s", err);
    CHECK(llama3_load_hf(&m2, path, err, sizeof err) == 0, "%s", err);
    CHECK(!memcmp(m.param_mem, m2.param_mem, bytes), "float32 save -> load is bit exact");
    llama3_init_weights(&m2, 1);
    CHECK(llama3_load_hf(&m2, tmpdir, err, sizeof err) == 0, "folder: %s", err);
    CHECK(!memcmp(m.param_mem, m2.param_mem, bytes), "folder load");

    /* the file holds HF names and the rotate-half row order */
    {
        FILE *f = fopen(path, "rb");
        uint64_t hl = 0;
        CHECK(fread(&hl, 8, 1, f) == 1 && hl % 8 == 0, "header length %llu multiple of 8", (unsigned long long)hl);
        char *hdr = calloc(1, hl + 1);
        CHECK(fread(hdr, 1, hl, f) == hl, "header");
        json_t *root = json_loads(hdr, 0, NULL);
        json_t *q = json_object_get(root, "model.layers.1.self_attn.k_proj.weight");
        CHECK(q && !strcmp(json_string_value(json_object_get(q, "dtype")), "F32"), "k_proj entry");
        CHECK(json_object_get(root, "lm_head.weight") && json_object_get(root, "model.embed_tokens.weight") &&
                  json_object_get(root, "model.layers.0.mlp.gate_proj.weight"),
              "HF names");
        int64_t begin = json_integer_value(json_array_get(json_object_get(q, "data_offsets"), 0));
        const llama3_param *pk = llama3_find_param(&m, "layers.1.attention.wk.weight");
        const int hd = llama3_head_dim(&m.args);
        const int64_t cols = pk->shape[1];
        /* hf row h*hd + t*hd/2 + i holds model row h*hd + 2i + t */
        const int64_t probes[][3] = {{0, 0, 1}, {0, 1, 0}, {1, 1, 3}, {1, 0, hd / 2 - 1}};
        float row[512];
        for (int k = 0; k < 4; k++) {
            int64_t h = probes[k][0], tt = probes[k][1], ii = probes[k][2];
            int64_t hf_row = h * hd + tt * (hd / 2) + ii, meta = h * hd + 2 * ii + tt;
            fseek(f, (long)(8 + hl + begin + hf_row * cols * 4), SEEK_SET);
            CHECK(fread(row, 4, (size_t)cols, f) == (size_t)cols, "read row");
            CHECK(!memcmp(row, m.param_mem + pk->offset + meta * cols, (size_t)cols * 4), "k_proj row %lld",
                  (long long)hf_row);
        }
        json_decref(root);
        free(hdr);
        fclose(f);
    }

    /* bfloat16: each weight rounded to nearest even */
    snprintf(path, sizeof path, "%s/bf16.safetensors", tmpdir);
    CHECK(llama3_save_hf(&m, path, "bfloat16", err, sizeof err) == 0, "%s", err);
    CHECK(llama3_load_hf(&m2, path, err, sizeof err) == 0, "%s", err);
    int bf_ok = 1;
    for (size_t j = 0; j < m.total_numel; j++) {
        uint32_t u;
        memcpy(&u, &m.param_mem[j], 4);
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        float r;
        memcpy(&r, &u, 4);
        bf_ok &= r == m2.param_mem[j];
    }
    CHECK(bf_ok, "bfloat16 save -> load rounds to nearest even");
    CHECK(llama3_save_hf(&m, path, "float8", err, sizeof err) != 0 && strstr(err, "float8"), "bad dtype: %s", err);

    /* sharded folder with an index, one shard F32 and one F16 (values exact in f16) */
    for (size_t j = 0; j < m.total_numel; j++) m.param_mem[j] = (float)((int)(lcg() % 257) - 128) / 64.0f;
    st_tensor ts[64];
    char names[64][128];
    float *bufs[64];
    int nt = hf_tensors(&m, ts, names, bufs);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/sharded", tmpdir);
    CHECK(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    int half = nt / 2;
    for (int i = half; i < nt; i++) ts[i].dtype = "F16";
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    write_st(path, ts, half);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    write_st(path, ts + half, nt - half);
    json_t *wm = json_object();
    for (int i = 0; i < nt; i++)
        json_object_set_new(
            wm, ts[i].name,
            json_string(i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors"));
    json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)bytes, "weight_map", wm);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_dump_file(idx, path, 0);
    json_decref(idx);
    CHECK(llama3_load_hf(&m2, dir, err, sizeof err) == 0, "sharded: %s", err);
    CHECK(!memcmp(m.param_mem, m2.param_mem, bytes), "sharded F32 + F16 load");
    CHECK(llama3_load_hf(&m2, path, err, sizeof err) == 0, "index path: %s", err);

    /* errors name the tensor and the file */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/missing.safetensors", tmpdir);
    st_tensor tmp = ts[5];
    ts[5] = ts[nt - 1]; /* drop tensor 5 */
    for (int i = 0; i < nt; i++) ts[i].dtype = "F32";
    write_st(bad, ts, nt - 1);
    expect_load_error(&m2, bad, tmp.name, "missing");
    ts[5] = tmp;

    snprintf(bad, sizeof bad, "%s/shape.safetensors", tmpdir);
    int64_t keep = ts[3].shape[0];
    ts[3].shape[0] = keep / 2;
    write_st(bad, ts, nt);
    expect_load_error(&m2, bad, ts[3].name, "shape.safetensors");
    ts[3].shape[0] = keep;

    snprintf(bad, sizeof bad, "%s/extra.safetensors", tmpdir);
    st_tensor extra[65];
    memcpy(extra, ts, (size_t)nt * sizeof *extra);
    extra[nt] = ts[nt - 1];
    extra[nt].name = "model.layers.7.mlp.up_proj.weight";
    write_st(bad, extra, nt + 1);
    expect_load_error(&m2, bad, "model.layers.7.mlp.up_proj.weight", "extra.safetensors");

    snprintf(bad, sizeof bad, "%s/dtype.safetensors", tmpdir);
    ts[2].dtype = "I32";
    write_st(bad, ts, nt);
    expect_load_error(&m2, bad, ts[2].name, "I32");
    ts[2].dtype = "F32";

    snprintf(bad, sizeof bad, "%s/notst.safetensors", tmpdir);
    FILE *f = fopen(bad, "w");
    fputs("this is not a safetensors file", f);
    fclose(f);
    expect_load_error(&m2, bad, "notst.safetensors", "safetensors");
    expect_load_error(&m2, "/nonexistent/model.safetensors", "/nonexistent/model.safetensors", "cannot open");

    /* a file of another flavor: the first tensor already disagrees */
    llama3_model dbg;
    make_model(&dbg, "debugmodel", 16);
    snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
    expect_load_error(&dbg, path, "expected", "model.safetensors");
    llama3_model_free(&dbg);

    for (int i = 0; i < nt; i++) free(bufs[i]);
    llama3_model_free(&m);
    llama3_model_free(&m2);
}

/* ---------------------------------------------------------------------------- layouts */

static void make_stage(llama3_model *m, const char *flavor, int max_seq, int l0, int l1, int emb, int head) {
    llama3_args a;
    char err[512];
    llama3_flavor(flavor, &a);
    llama3_layout lay = llama3_layout_full(&a);
    lay.layer_start = l0;
    lay.layer_end = l1;
    lay.has_embedding = emb;
    lay.has_head = head;
    if (llama3_model_init_layout(m, &a, &lay, LLAMA3_STORAGE_OWN, max_seq, ops_cpu(), err, sizeof err) != 0) {
        fprintf(stderr, "cannot build a stage of %s: %s\n", flavor, err);
        exit(1);
    }
}

/* A stage holds exactly its blocks' parameters, initialised to the full model's values,
 * and a chain of stages passing residuals computes the full model's loss and gradients
 * bit for bit. */
static void test_stage_local(void) {
    llama3_model full, st[3];
    char err[256];
    make_model(&full, "debugmodel", 64);
    llama3_init_weights(&full, 7);
    make_stage(&st[0], "debugmodel", 64, 0, 2, 1, 0);
    make_stage(&st[1], "debugmodel", 64, 2, 4, 0, 0);
    make_stage(&st[2], "debugmodel", 64, 4, 6, 0, 1);
    for (int i = 0; i < 3; i++) llama3_init_weights(&st[i], 7);

    /* layers 2-3 of 6, no embedding: 18 parameters in 2 units */
    const llama3_model *mid = &st[1];
    CHECK(mid->n_params == 18 && mid->n_units == 2, "stage 1: %d params in %d units", mid->n_params, mid->n_units);
    CHECK(!llama3_find_param(mid, "tok_embeddings.weight") && !llama3_find_param(mid, "output.weight") &&
              !llama3_find_param(mid, "layers.1.attention.wq.weight") &&
              !llama3_find_param(mid, "layers.4.attention.wq.weight"),
          "stage 1 holds nothing outside layers 2-3");
    CHECK(llama3_embedding_unit(mid) < 0 && llama3_head_unit(mid) < 0 && llama3_block_unit(mid, 2) == 0 &&
              llama3_block_unit(mid, 3) == 1 && llama3_block_unit(mid, 4) < 0,
          "stage 1 units");
    size_t held = 0;
    int same = 1;
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < st[i].n_params; k++) {
            const llama3_param *p = &st[i].params[k];
            const llama3_param *q = llama3_find_param(&full, p->name);
            same &= q && q->numel == p->numel && q->shape[0] == p->shape[0] && q->shape[1] == p->shape[1] &&
                !memcmp(st[i].param_mem + p->offset, full.param_mem + q->offset, p->numel * sizeof(float));
            held += p->numel;
        }
    }
    CHECK(same, "every stage parameter equals the full model's slice");
    CHECK(held == full.total_numel, "the stages together hold %zu of %zu elements", held, full.total_numel);
    CHECK(mid->total_numel < full.total_numel / 3, "stage 1 holds %zu of %zu", mid->total_numel, full.total_numel);

    const int b = 2, t = 32, n = b * t;
    int32_t in[64], tg[64];
    make_batch(in, tg, n, full.args.vocab_size, 5);
    llama3_acts *af = llama3_acts_create(&full, b, t, err, sizeof err);
    llama3_acts *a[3];
    for (int i = 0; i < 3; i++) a[i] = llama3_acts_create(&st[i], b, t, err, sizeof err);
    CHECK(af && a[0] && a[1] && a[2], "%s", err);
    const size_t rbytes = (size_t)n * full.args.dim * sizeof(float);
    CHECK(llama3_acts_bytes(&st[1], b, t) < llama3_acts_bytes(&full, b, t) / 2, "a middle stage keeps less");

    llama3_zero_grads(&full);
    double lf = llama3_forward(&full, af, in, tg, 0.02f, NULL);
    llama3_backward(&full, af);

    for (int i = 0; i < 3; i++) llama3_zero_grads(&st[i]);
    llama3_forward_embedding(&st[0], a[0], in);
    for (int l = 0; l < 6; l++) {
        int s = l / 2;
        if (l % 2 == 0 && s > 0) memcpy(llama3_acts_residual(a[s], l), llama3_acts_residual(a[s - 1], l), rbytes);
        llama3_block_forward(&st[s], a[s], l);
    }
    double ls = llama3_forward_head(&st[2], a[2], tg, 0.02f, NULL);
    CHECK(ls == lf, "stage chain loss %.9g vs full %.9g", ls, lf);
    llama3_backward_head(&st[2], a[2]);
    for (int l = 5; l >= 0; l--) {
        int s = l / 2;
        if (l % 2 == 1 && s < 2)
            memcpy(llama3_acts_residual_grad(a[s], l + 1), llama3_acts_residual_grad(a[s + 1], l + 1), rbytes);
        llama3_block_backward_input(&st[s], a[s], l);
        llama3_block_backward_weight(&st[s], a[s], l);
    }
    llama3_backward_embedding(&st[0], a[0]);
    same = 1;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < st[i].n_params; k++) {
            const llama3_param *p = &st[i].params[k];
            const llama3_param *q = llama3_find_param(&full, p->name);
            int eq = !memcmp(st[i].grad_mem + p->offset, full.grad_mem + q->offset, p->numel * sizeof(float));
            if (!eq) fprintf(stderr, "  gradient of %s differs\n", p->name);
            same &= eq;
        }
    CHECK(same, "stage gradients equal the full model's bit for bit");

    llama3_acts_free(&full, af);
    for (int i = 0; i < 3; i++) {
        llama3_acts_free(&st[i], a[i]);
        llama3_model_free(&st[i]);
    }
    llama3_model_free(&full);
}

/* ---------------------------------------------------------------------------- save policy */

/* Blocks that keep less recompute the rest in their I pass: the loss and every gradient
 * equal keeping everything, bit for bit, for any mask and any I/W order the workspace
 * has slots for; the microbatch costs only what it keeps. */
static void test_keep_policy(void) {
    llama3_model m;
    char err[256];
    make_model(&m, "debugmodel", 64);
    llama3_init_weights(&m, 11);
    const int b = 2, t = 32, n = b * t, L = m.args.n_layers;
    int32_t in[64], tg[64];
    make_batch(in, tg, n, m.args.vocab_size, 9);
    const size_t bytes = m.total_numel * sizeof(float);
    float *g_ref = malloc(bytes);

    llama3_acts *ar = llama3_acts_create(&m, b, t, err, sizeof err);
    llama3_zero_grads(&m);
    double l_ref = llama3_forward(&m, ar, in, tg, 1.0f / 50.0f, NULL);
    llama3_backward(&m, ar);
    memcpy(g_ref, m.grad_mem, bytes);
    llama3_acts_free(&m, ar);

    unsigned masks[4][6];
    for (int l = 0; l < L; l++) {
        masks[0][l] = LLAMA3_KEEP_NONE;                                                /* full AC */
        masks[1][l] = l % 2 ? LLAMA3_KEEP_ALL : LLAMA3_KEEP_NONE;                      /* every 2nd block */
        masks[2][l] = LLAMA3_KEEP_ATT | LLAMA3_KEEP_Q | LLAMA3_KEEP_V | LLAMA3_KEEP_A; /* op-level style */
        masks[3][l] = (unsigned)(l * 173 + 5) & LLAMA3_KEEP_ALL;                       /* arbitrary */
    }
    const char *names[4] = {"keep none", "every other block", "attention + every other matmul", "arbitrary"};
    const size_t all_bytes = llama3_acts_bytes_policy(&m, NULL, b, t);
    for (int k = 0; k < 4; k++) {
        for (int order = 0; order < 2; order++) {
            /* order 0: I then W per block (one slot); 1: every I, then every W (L slots) */
            llama3_workspace *ws = llama3_workspace_create(&m, b, t, 1, order ? L : 1, err, sizeof err);
            llama3_acts *a = ws ? llama3_acts_create_ws(&m, ws, masks[k], b, t, err, sizeof err) : NULL;
            CHECK(a != NULL, "%s", err);
            if (!a) continue;
            llama3_zero_grads(&m);
            double l2 = llama3_forward(&m, a, in, tg, 1.0f / 50.0f, NULL);
            llama3_backward_head(&m, a);
            if (order == 0) {
                for (int l = L - 1; l >= 0; l--) {
                    llama3_block_backward_input(&m, a, l);
                    llama3_block_backward_weight(&m, a, l);
                }
            } else {
                for (int l = L - 1; l >= 0; l--) llama3_block_backward_input(&m, a, l);
                for (int l = 0; l < L; l++) llama3_block_backward_weight(&m, a, l);
            }
            llama3_backward_embedding(&m, a);
            CHECK(l2 == l_ref, "%s: loss %.9g vs %.9g", names[k], l2, l_ref);
            CHECK(!memcmp(g_ref, m.grad_mem, bytes), "%s (%s): gradients equal keeping everything bit for bit",
                  names[k], order ? "all I then all W" : "I then W");
            llama3_acts_free(&m, a);
            llama3_workspace_free(&m, ws);
        }
        size_t kb = llama3_acts_bytes_policy(&m, masks[k], b, t);
        CHECK(kb < all_bytes, "%s keeps %zu bytes of %zu", names[k], kb, all_bytes);
        if (k == 0)
            printf("test_model: debugmodel 2 x 32: keep-all %zu bytes, keep-none %zu bytes per microbatch\n", all_bytes,
                   kb);
    }
    /* a block that keeps nothing holds only the residual stream: (L + 1) x 2 x [N, C] plus the head */
    const size_t none = llama3_acts_bytes_policy(&m, masks[0], b, t);
    const size_t resid = (size_t)(L + 1) * 2 * (size_t)n * m.args.dim * sizeof(float);
    CHECK(none < resid + (size_t)n * (m.args.vocab_size + 3 * m.args.dim + 8) * sizeof(float) + 4096,
          "keep-none microbatch %zu bytes, residual stream %zu", none, resid);
    free(g_ref);
    llama3_model_free(&m);
}

/* ---------------------------------------------------------------------------- linear descriptors */

static int lin_calls[3];
static void count_fwd(const model_linear_env *e, const model_linear *l, tetra_dtype yt, void *y, const void *x,
                      const void *w, int n, int row0, float beta, const void *c_in) {
    lin_calls[0]++;
    e->fallback->forward(e, l, yt, y, x, w, n, row0, beta, c_in);
}
static void count_bwd_in(const model_linear_env *e, const model_linear *l, tetra_dtype dxt, void *dx, const void *dy,
                         const void *w, int n, int row0, float beta) {
    lin_calls[1]++;
    e->fallback->backward_input(e, l, dxt, dx, dy, w, n, row0, beta);
}
static void count_bwd_w(const model_linear_env *e, const model_linear *l, float *dw, const void *dy, const void *x,
                        int n, float beta) {
    lin_calls[2]++;
    *(int *)l->impl_state += 1;
    e->fallback->backward_weight(e, l, dw, dy, x, n, beta);
}

/* Every projection runs through its descriptor: a replacement implementation (what a
 * converter installs) sees every call with the linear's sizes, and delegating gives the
 * same numbers. */
static void test_linear_impl(void) {
    llama3_model m;
    char err[256];
    make_model(&m, "tiny", 32);
    llama3_init_weights(&m, 3);
    const int b = 1, t = 16, L = m.args.n_layers;
    int32_t in[16], tg[16];
    make_batch(in, tg, b * t, m.args.vocab_size, 0);
    llama3_acts *a = llama3_acts_create(&m, b, t, err, sizeof err);
    const size_t bytes = m.total_numel * sizeof(float);
    float *g_ref = malloc(bytes);
    llama3_zero_grads(&m);
    double l_ref = llama3_forward(&m, a, in, tg, 0.1f, NULL);
    llama3_backward(&m, a);
    memcpy(g_ref, m.grad_mem, bytes);

    /* The default implementation runs wq, wk and wv as one linear (model.c); any other,
     * even a copy of it, as three: the same products to rounding (the input gradient's
     * three sums are one GEMM's) */
    const model_linear_impl plain = *llama3_linear_default();
    for (int i = 0; i < m.n_params; i++)
        if (m.is_linear[i]) m.linears[i].impl = &plain;
    llama3_zero_grads(&m);
    const double l_sep = llama3_forward(&m, a, in, tg, 0.1f, NULL);
    llama3_backward(&m, a);
    double gmax = 0.0, gdiff = 0.0;
    for (size_t i = 0; i < m.total_numel; i++) {
        gmax = fmax(gmax, fabs((double)g_ref[i]));
        gdiff = fmax(gdiff, fabs((double)g_ref[i] - (double)m.grad_mem[i]));
    }
    printf("test_model: one q/k/v projection against three linears: gradients differ by at most %.3g (largest %.3g)\n",
           gdiff, gmax);
    CHECK(l_sep == l_ref && gdiff <= 1e-6 * gmax,
          "one q/k/v projection against three linears: loss %.9g vs %.9g, gradients max diff %.3g of max %.3g", l_ref,
          l_sep, gdiff, gmax);
    memcpy(g_ref, m.grad_mem, bytes);

    static const model_linear_impl counting = {"counting", count_fwd, count_bwd_in, count_bwd_w, NULL, NULL, NULL};
    int n_lin = 0, *per = calloc((size_t)m.n_params, sizeof *per);
    for (int i = 0; i < m.n_params; i++) {
        if (!m.is_linear[i]) continue;
        n_lin++;
        const llama3_param *p = &m.params[i];
        CHECK(m.linears[i].out == p->shape[0] && m.linears[i].in == p->shape[1] && m.linears[i].impl == &plain,
              "%s: linear %d x %d", p->name, m.linears[i].in, m.linears[i].out);
        m.linears[i].impl = &counting;
        m.linears[i].impl_state = &per[i];
    }
    CHECK(n_lin == 7 * L + 1 && !m.is_linear[0], "%d projections (embedding is a lookup)", n_lin);
    memset(lin_calls, 0, sizeof lin_calls);
    llama3_zero_grads(&m);
    double l2 = llama3_forward(&m, a, in, tg, 0.1f, NULL);
    llama3_backward(&m, a);
    CHECK(lin_calls[0] == n_lin && lin_calls[1] == n_lin && lin_calls[2] == n_lin, "calls %d %d %d of %d", lin_calls[0],
          lin_calls[1], lin_calls[2], n_lin);
    int each = 1;
    for (int i = 0; i < m.n_params; i++) each &= !m.is_linear[i] || per[i] == 1;
    CHECK(each, "each linear's state saw its own weight-gradient call");
    CHECK(l2 == l_sep && !memcmp(g_ref, m.grad_mem, bytes), "a delegating implementation changes nothing");

    /* Fresh gradients (llama3_grads_fresh): over NaN garbage, two microbatches give what
     * zeroed gradients give (first writes overwrite, the second microbatch adds; a -0 may
     * come out +0, so compared as values) */
    for (int i = 0; i < m.n_params; i++)
        if (m.is_linear[i]) m.linears[i].impl = llama3_linear_default();
    llama3_zero_grads(&m);
    for (int k = 0; k < 2; k++) {
        llama3_forward(&m, a, in, tg, 0.1f, NULL);
        llama3_backward(&m, a);
    }
    memcpy(g_ref, m.grad_mem, bytes);
    for (size_t i = 0; i < m.total_numel; i++) m.grad_mem[i] = NAN;
    llama3_grads_fresh(&m);
    for (int k = 0; k < 2; k++) {
        llama3_forward(&m, a, in, tg, 0.1f, NULL);
        llama3_backward(&m, a);
    }
    size_t differ = 0;
    for (size_t i = 0; i < m.total_numel; i++) differ += !(m.grad_mem[i] == g_ref[i]);
    int none_left = 1;
    for (int i = 0; i < m.n_params; i++) none_left &= !m.grad_fresh[i];
    CHECK(differ == 0 && none_left, "fresh gradients over NaN, 2 microbatches: %zu of %zu differ from zeroed ones",
          differ, m.total_numel);
    free(per);
    free(g_ref);
    llama3_acts_free(&m, a);
    llama3_model_free(&m);
}

/* Document helpers and the FLOP count with the attention a mask leaves (mfu_computed). */
static void test_documents(void) {
    static const int32_t doc[8] = {4, 4, 4, 7, 7, 9, 9, 9}, bad[4] = {0, 1, 1, 0};
    CHECK(llama3_doc_pairs(doc, 8) == 6 + 3 + 6, "pairs within documents of 3, 2, 3: %g", llama3_doc_pairs(doc, 8));
    int32_t pos[8], rows[3] = {7, 3, 0};
    llama3_doc_positions(doc, 1, 8, NULL, 8, pos);
    static const int32_t want[8] = {0, 1, 2, 0, 1, 0, 1, 2};
    CHECK(!memcmp(pos, want, sizeof want), "positions within documents");
    llama3_doc_positions(doc, 1, 8, rows, 3, pos);
    CHECK(pos[0] == 2 && pos[1] == 0 && pos[2] == 0, "positions of rows at global positions 7, 3, 0");
    char err[256] = "";
    CHECK(llama3_doc_check(doc, 1, 8, err, sizeof err) == 0, "nondecreasing ids pass");
    CHECK(llama3_doc_check(bad, 1, 4, err, sizeof err) != 0 && strstr(err, "position 3"), "falling ids: %s", err);
    llama3_args a;
    llama3_flavor("debugmodel_flex_attn", &a);
    CHECK(a.attn_mask_type == LLAMA3_MASK_BLOCK_CAUSAL, "debugmodel_flex_attn is block_causal");
    const int T = 2048;
    const double tt = llama3_flops_per_token(&a, T), full = llama3_flops_per_token_pairs(&a, (double)T * T, T);
    CHECK(fabs(full - tt) <= 1e-9 * tt, "T^2 pairs is TorchTitan's count: %.9g vs %.9g", full, tt);
    const double dense = 6.0 * (double)(llama3_num_params(&a) - llama3_num_embedding_params(&a));
    const double causal = llama3_flops_per_token_pairs(&a, 0.5 * T * (T + 1.0), T);
    CHECK(fabs((causal - dense) / (tt - dense) - (T + 1.0) / (2.0 * T)) < 1e-12, "causal: half the attention");
}

int main(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/tetra_test_model_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_philox();
    test_init();
    test_i_then_w();
    test_acts_memory();
    test_gradcheck();
    test_hf();
    test_stage_local();
    test_keep_policy();
    test_linear_impl();
    test_documents();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    printf("test_model: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
