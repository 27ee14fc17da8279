/* model.c — Llama 3 on the op table: parameter layout, init, activations,
 * forward, and backward split into I (input gradients) and W (weight
 * gradients).
 *
 * The math (TorchTitan llama3, fp32):
 *   r_0     = tok_embeddings[inputs]
 *   block l: xn1 = rmsnorm(r_l) * attention_norm
 *            q, k, v = rope(xn1 Wq^T), rope(xn1 Wk^T), xn1 Wv^T
 *            h   = r_l + sdpa_causal_gqa(q, k, v) Wo^T
 *            xn2 = rmsnorm(h) * ffn_norm
 *            r_{l+1} = h + (silu(xn2 W1^T) * (xn2 W3^T)) W2^T
 *   logits  = (rmsnorm(r_L) * norm) Output^T,  loss = sum CE * dloss_scale
 *
 * What one microbatch keeps (llama3_acts), per block: the residuals r_l and h,
 * xn1 and xn2, q/k/v after RoPE, the attention output and its log-sum-exp, the
 * SwiGLU inputs a = xn2 W1^T, g = xn2 W3^T and output s. Nothing is [t, t]:
 * attention is the blockwise op. The I pass writes what the W pass needs into
 * the slots of activations it has finished with (dq/dk/dv over q/k/v, da/dg
 * over a/g, dL/dxn over xn); W recomputes xn from (r, rstd) with the same
 * deterministic rmsnorm_forward, so I and W may run far apart (zero-bubble
 * pipelines) and still give the one-pass result bit for bit.
 */
#include "models/llama3/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama3/init.h"

/* parameter indices: 0 embedding, then 9 per block, then norm and output */
enum { P_WQ, P_WK, P_WV, P_WO, P_W1, P_W2, P_W3, P_ATTN_NORM, P_FFN_NORM, P_PER_BLOCK };
#define P_EMBEDDING 0

static int pidx_block(int layer, int which) { return 1 + layer * P_PER_BLOCK + which; }
static int pidx_norm(const llama3_model *m) { return 1 + m->args.n_layers * P_PER_BLOCK; }
static int pidx_output(const llama3_model *m) { return 2 + m->args.n_layers * P_PER_BLOCK; }

static float *grad_ptr(const llama3_model *m, int idx) { return m->grad_mem + m->params[idx].offset; }

/* The parameters the forward and backward read: the fp32 parameters, or their bf16
 * compute copies under mixed precision. */
static int mixed(const llama3_model *m) { return m->compute_dtype == TETRA_BF16; }
static void *param_ptr(const llama3_model *m, int idx) {
    return mixed(m) ? (void *)(m->param_bf16 + m->params[idx].offset) : (void *)(m->param_mem + m->params[idx].offset);
}
/* bytes of one activation element */
static size_t act_size(const llama3_model *m) { return mixed(m) ? sizeof(uint16_t) : sizeof(float); }
static void *act_at(const llama3_model *m, void *base, size_t elems) { return (char *)base + elems * act_size(m); }

/* ----------------------------------------------------------------------------
 * activations of one microbatch */

typedef struct {
    void *xn1;     /* [N, C]   attention_norm output; after I: dL/dxn1 */
    float *rstd1;  /* [N] */
    void *q;       /* [N, H*D]  after RoPE; after I: dL/d(xn1 Wq^T) */
    void *k;       /* [N, KV*D] after RoPE; after I: dL/d(xn1 Wk^T) */
    void *v;       /* [N, KV*D] after I: dL/dv */
    void *att;     /* [N, H*D]  attention output (input of wo) */
    float *lse;    /* [B, H, T] log-sum-exp of the attention scores */
    void *h;       /* [N, C]   residual after attention */
    void *xn2;     /* [N, C]   ffn_norm output; after I: dL/dxn2 */
    float *rstd2;  /* [N] */
    void *a;       /* [N, F]   xn2 W1^T; after I: dL/da */
    void *g;       /* [N, F]   xn2 W3^T; after I: dL/dg */
    void *s;       /* [N, F]   silu(a) * g (input of w2) */
    void *dh;      /* [N, C]   dL/dh, kept from I for W (wo's weight gradient) */
} layer_acts;

struct llama3_acts {
    int b, t;
    size_t n;            /* tokens b*t */
    void *mem;           /* the one backend allocation; everything below is a view */
    size_t bytes;
    int32_t *inputs;     /* [N] backend copy of the token ids */
    int32_t *targets;    /* [N] */
    float *loss_sum;     /* [1] */
    void **res;          /* [L+1] of [N, C]: r_0 .. r_L (compute dtype, as every activation below
                            unless marked fp32) */
    void **dres;         /* [L+1] of [N, C]: dL/dr_l */
    layer_acts *layer;   /* [L] */
    void *xnf;           /* [N, C]  final norm output */
    float *rstdf;        /* [N] */
    float *logits;       /* [N, V]  fp32 logits; after the forward with targets: fp32 dlogits */
    uint16_t *dlogits16; /* [N, V]  bf16 dlogits for the output GEMMs (mixed precision only) */
    float *losses;       /* [N]     per-token cross-entropy */
    void *scratch;       /* [N, max(F, 2 H*D + 2 KV*D, C)] reused inside one pass */
    float *rstd_scratch; /* [N] */
    void *attn_ws;       /* attention workspace */
    float *logits_copy;  /* [N, V] or NULL (llama3_acts_keep_logits) */
    int has_targets;     /* the last forward computed the loss (dlogits are valid) */
};

/* Bump allocator over one region; with base == NULL it only measures. */
typedef struct {
    char *base;
    size_t off;
} carver;

static void *carve(carver *c, size_t bytes) {
    size_t o = (c->off + 63) & ~(size_t)63; /* 64-byte views: whole cache lines, aligned vectors */
    c->off = o + bytes;
    return c->base ? (void *)(c->base + o) : NULL;
}

static ops_attn_shape attn_shape(const llama3_model *m, int b, int t) {
    const llama3_args *ar = &m->args;
    ops_attn_shape s;
    memset(&s, 0, sizeof s);
    s.b = b;
    s.sq = t;
    s.sk = t;
    s.h = ar->n_heads;
    s.kv = ar->n_kv_heads;
    s.d = llama3_head_dim(ar);
    s.scale = (float)(1.0 / sqrt((double)s.d));
    s.causal = 1;
    return s;
}

static size_t scratch_cols(const llama3_model *m) {
    const llama3_args *ar = &m->args;
    size_t c = (size_t)ar->dim, hd = (size_t)ar->n_heads * llama3_head_dim(ar);
    size_t kvd = (size_t)ar->n_kv_heads * llama3_head_dim(ar), f = (size_t)llama3_ffn_hidden(ar);
    size_t s = f;
    if (2 * hd + 2 * kvd > s) s = 2 * hd + 2 * kvd;
    if (c > s) s = c;
    return s;
}

/* Lay out (or measure, with a->mem == NULL) every view of one microbatch. */
static size_t acts_layout(const llama3_model *m, llama3_acts *a) {
    const llama3_args *ar = &m->args;
    const size_t n = a->n, L = (size_t)ar->n_layers, c = (size_t)ar->dim, v = (size_t)ar->vocab_size;
    const size_t hd = (size_t)ar->n_heads * llama3_head_dim(ar), kvd = (size_t)ar->n_kv_heads * llama3_head_dim(ar);
    const size_t f = (size_t)llama3_ffn_hidden(ar), fl = sizeof(float), es = act_size(m);
    carver cv = {(char *)a->mem, 0};
    const int measuring = a->mem == NULL;

    void *p;
    p = carve(&cv, n * sizeof(int32_t));
    if (!measuring) a->inputs = p;
    p = carve(&cv, n * sizeof(int32_t));
    if (!measuring) a->targets = p;
    p = carve(&cv, fl);
    if (!measuring) a->loss_sum = p;
    for (size_t l = 0; l <= L; l++) {
        p = carve(&cv, n * c * es);
        if (!measuring) a->res[l] = p;
        p = carve(&cv, n * c * es);
        if (!measuring) a->dres[l] = p;
    }
    for (size_t l = 0; l < L; l++) {
        layer_acts t;
        t.xn1 = carve(&cv, n * c * es);
        t.rstd1 = carve(&cv, n * fl);
        t.q = carve(&cv, n * hd * es);
        t.k = carve(&cv, n * kvd * es);
        t.v = carve(&cv, n * kvd * es);
        t.att = carve(&cv, n * hd * es);
        t.lse = carve(&cv, n * (size_t)ar->n_heads * fl);
        t.h = carve(&cv, n * c * es);
        t.xn2 = carve(&cv, n * c * es);
        t.rstd2 = carve(&cv, n * fl);
        t.a = carve(&cv, n * f * es);
        t.g = carve(&cv, n * f * es);
        t.s = carve(&cv, n * f * es);
        t.dh = carve(&cv, n * c * es);
        if (!measuring) a->layer[l] = t;
    }
    p = carve(&cv, n * c * es);
    if (!measuring) a->xnf = p;
    p = carve(&cv, n * fl);
    if (!measuring) a->rstdf = p;
    p = carve(&cv, n * v * fl);
    if (!measuring) a->logits = p;
    if (mixed(m)) {
        p = carve(&cv, n * v * sizeof(uint16_t));
        if (!measuring) a->dlogits16 = p;
    }
    p = carve(&cv, n * fl);
    if (!measuring) a->losses = p;
    p = carve(&cv, n * scratch_cols(m) * es);
    if (!measuring) a->scratch = p;
    p = carve(&cv, n * fl);
    if (!measuring) a->rstd_scratch = p;
    ops_attn_shape s = attn_shape(m, a->b, a->t);
    size_t ws = mixed(m) ? m->ops->attention_workspace_size_bf16(&s) : m->ops->attention_workspace_size(&s);
    p = carve(&cv, ws);
    if (!measuring) a->attn_ws = ws ? p : NULL;
    return cv.off;
}

size_t llama3_acts_bytes(const llama3_model *m, int b, int t) {
    llama3_acts a;
    memset(&a, 0, sizeof a);
    a.b = b;
    a.t = t;
    a.n = (size_t)b * (size_t)t;
    return acts_layout(m, &a);
}

llama3_acts *llama3_acts_create(const llama3_model *m, int b, int t, char *err, size_t errlen) {
    if (b <= 0 || t <= 0 || t > m->max_seq_len) {
        snprintf(err, errlen, "llama3 activations: batch %d x seq_len %d invalid (max_seq_len %d)", b, t,
                 m->max_seq_len);
        return NULL;
    }
    const int L = m->args.n_layers;
    llama3_acts *a = calloc(1, sizeof *a);
    if (!a) goto oom;
    a->b = b;
    a->t = t;
    a->n = (size_t)b * (size_t)t;
    a->res = calloc((size_t)L + 1, sizeof *a->res);
    a->dres = calloc((size_t)L + 1, sizeof *a->dres);
    a->layer = calloc((size_t)L, sizeof *a->layer);
    if (!a->res || !a->dres || !a->layer) goto oom;
    a->bytes = llama3_acts_bytes(m, b, t);
    a->mem = m->ops->alloc(a->bytes);
    if (!a->mem) {
        snprintf(err, errlen, "llama3 activations: cannot allocate %.2f GiB for batch %d x seq_len %d",
                 (double)a->bytes / (1024.0 * 1024.0 * 1024.0), b, t);
        llama3_acts_free(m, a);
        return NULL;
    }
    acts_layout(m, a);
    return a;
oom:
    snprintf(err, errlen, "llama3 activations: out of host memory");
    llama3_acts_free(m, a);
    return NULL;
}

void llama3_acts_free(const llama3_model *m, llama3_acts *a) {
    if (!a) return;
    if (a->mem) m->ops->release(a->mem);
    if (a->logits_copy) m->ops->release(a->logits_copy);
    free(a->res);
    free(a->dres);
    free(a->layer);
    free(a);
}

int llama3_acts_keep_logits(const llama3_model *m, llama3_acts *a, int keep) {
    if (!keep) {
        if (a->logits_copy) m->ops->release(a->logits_copy);
        a->logits_copy = NULL;
        return 0;
    }
    if (a->logits_copy) return 0;
    a->logits_copy = m->ops->alloc(a->n * (size_t)m->args.vocab_size * sizeof(float));
    return a->logits_copy ? 0 : -1;
}

const float *llama3_logits(const llama3_acts *a) {
    if (a->logits_copy) return a->logits_copy;
    return a->has_targets ? NULL : a->logits;
}

void *llama3_acts_residual(llama3_acts *a, int l) { return a->res[l]; }
void *llama3_acts_residual_grad(llama3_acts *a, int l) { return a->dres[l]; }

/* ----------------------------------------------------------------------------
 * parameters */

static void add_param(llama3_model *m, size_t *off, const char *name, int unit, int64_t rows, int64_t cols,
                      int ones, double std, double lo, double hi) {
    llama3_param *p = &m->params[m->n_params++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->unit = unit;
    p->ndim = cols > 0 ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols > 0 ? cols : 0;
    p->numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    p->offset = *off;
    p->init_ones = ones;
    p->init_std = std;
    p->init_lo = lo;
    p->init_hi = hi;
    *off += p->numel;
    m->unit_numel[unit] += p->numel;
}

int llama3_model_init(llama3_model *m, const llama3_args *a, int max_seq_len, const tetra_ops *ops, char *err,
                      size_t errlen) {
    memset(m, 0, sizeof *m);
    if (a->dim <= 0 || a->n_layers <= 0 || a->n_heads <= 0 || a->n_kv_heads <= 0 || a->vocab_size <= 0 ||
        a->dim % a->n_heads != 0 || a->n_heads % a->n_kv_heads != 0 || llama3_head_dim(a) % 2 != 0) {
        snprintf(err, errlen,
                 "llama3 %s: invalid shape (dim %d, n_heads %d, n_kv_heads %d): dim must divide into heads of "
                 "even size and n_heads must be a multiple of n_kv_heads",
                 a->flavor ? a->flavor : "model", a->dim, a->n_heads, a->n_kv_heads);
        return -1;
    }
    if (max_seq_len <= 0) {
        snprintf(err, errlen, "llama3: max_seq_len %d must be positive", max_seq_len);
        return -1;
    }
    m->args = *a;
    m->ops = ops;
    m->max_seq_len = max_seq_len;

    const int L = a->n_layers;
    const int64_t C = a->dim, D = llama3_head_dim(a), HD = (int64_t)a->n_heads * D, KVD = (int64_t)a->n_kv_heads * D;
    const int64_t F = llama3_ffn_hidden(a), V = a->vocab_size;
    m->n_units = L + 2;
    m->params = calloc((size_t)(3 + P_PER_BLOCK * L), sizeof *m->params);
    m->unit_offset = calloc((size_t)m->n_units, sizeof *m->unit_offset);
    m->unit_numel = calloc((size_t)m->n_units, sizeof *m->unit_numel);
    if (!m->params || !m->unit_offset || !m->unit_numel) {
        snprintf(err, errlen, "llama3: out of host memory");
        llama3_model_free(m);
        return -1;
    }

    /* TorchTitan's init: std 0.02 truncated at the ABSOLUTE bounds +-2 for the input
     * projections; depth-scaled std for the projections that write into the residual
     * (wo, w2) and for w3; embedding plain N(0, 1); output N(0, dim^-0.5) cut at 3 sigma. */
    const double inf = INFINITY, s02 = 0.02;
    size_t off = 0;
    char name[96];
    m->unit_offset[0] = off;
    add_param(m, &off, "tok_embeddings.weight", 0, V, C, 0, 1.0, -inf, inf);
    for (int l = 0; l < L; l++) {
        const int u = 1 + l;
        const double sd = s02 / sqrt(2.0 * (l + 1));
        m->unit_offset[u] = off;
#define BLOCK_PARAM(suffix, rows, cols, ones, std)                        \
    snprintf(name, sizeof name, "layers.%d.%s", l, suffix);              \
    add_param(m, &off, name, u, rows, cols, ones, std, -2.0, 2.0)
        BLOCK_PARAM("attention.wq.weight", HD, C, 0, s02);
        BLOCK_PARAM("attention.wk.weight", KVD, C, 0, s02);
        BLOCK_PARAM("attention.wv.weight", KVD, C, 0, s02);
        BLOCK_PARAM("attention.wo.weight", C, HD, 0, sd);
        BLOCK_PARAM("feed_forward.w1.weight", F, C, 0, s02);
        BLOCK_PARAM("feed_forward.w2.weight", C, F, 0, sd);
        BLOCK_PARAM("feed_forward.w3.weight", F, C, 0, sd);
        BLOCK_PARAM("attention_norm.weight", C, 0, 1, 0.0);
        BLOCK_PARAM("ffn_norm.weight", C, 0, 1, 0.0);
#undef BLOCK_PARAM
    }
    m->unit_offset[L + 1] = off;
    add_param(m, &off, "norm.weight", L + 1, C, 0, 1, 0.0, 0.0, 0.0);
    const double so = 1.0 / sqrt((double)C);
    add_param(m, &off, "output.weight", L + 1, V, C, 0, so, -3.0 * so, 3.0 * so);
    m->total_numel = off;

    const size_t bytes = m->total_numel * sizeof(float);
    m->param_mem = ops->alloc(bytes);
    m->grad_mem = ops->alloc(bytes);
    if (!m->param_mem || !m->grad_mem) {
        snprintf(err, errlen, "llama3 %s: cannot allocate 2 x %.2f GiB for parameters and gradients",
                 a->flavor ? a->flavor : "model", (double)bytes / (1024.0 * 1024.0 * 1024.0));
        llama3_model_free(m);
        return -1;
    }
    ops->fill(m->param_mem, 0.0f, m->total_numel);
    ops->fill(m->grad_mem, 0.0f, m->total_numel);

    /* RoPE table [max_seq_len, D/2, 2], as TorchTitan's precompute_freqs_cis */
    const size_t rope_n = (size_t)max_seq_len * (size_t)D;
    float *host = malloc(rope_n * sizeof(float));
    m->rope_table = ops->alloc(rope_n * sizeof(float));
    if (!host || !m->rope_table) {
        free(host);
        snprintf(err, errlen, "llama3: cannot allocate the RoPE table");
        llama3_model_free(m);
        return -1;
    }
    ops_rope_table(host, (int)D, max_seq_len, (float)a->rope_theta, a->rope_scaling_factor > 0.0,
                   (float)a->rope_scaling_factor, (float)a->rope_low_freq_factor, (float)a->rope_high_freq_factor,
                   a->rope_original_max_pos);
    ops->copy_h2d(m->rope_table, host, rope_n * sizeof(float));
    free(host);
    return 0;
}

void llama3_model_free(llama3_model *m) {
    if (m->ops) {
        if (m->param_mem) m->ops->release(m->param_mem);
        if (m->grad_mem) m->ops->release(m->grad_mem);
        if (m->rope_table) m->ops->release(m->rope_table);
        if (m->param_bf16) m->ops->release(m->param_bf16);
    }
    free(m->params);
    free(m->unit_offset);
    free(m->unit_numel);
    memset(m, 0, sizeof *m);
}

int llama3_model_set_compute_dtype(llama3_model *m, tetra_dtype t, char *err, size_t errlen) {
    if (t != TETRA_F32 && t != TETRA_BF16) {
        snprintf(err, errlen, "llama3: compute dtype %s is not supported (float32 or bfloat16)", ops_dtype_name(t));
        return -1;
    }
    if (t == TETRA_BF16 && !m->param_bf16) {
        m->param_bf16 = m->ops->alloc(m->total_numel * sizeof(uint16_t));
        if (!m->param_bf16) {
            snprintf(err, errlen, "llama3: cannot allocate %.2f GiB for the bf16 compute copy of the parameters",
                     (double)(m->total_numel * sizeof(uint16_t)) / (1024.0 * 1024.0 * 1024.0));
            return -1;
        }
    } else if (t == TETRA_F32 && m->param_bf16) {
        m->ops->release(m->param_bf16);
        m->param_bf16 = NULL;
    }
    m->compute_dtype = t;
    llama3_sync_compute_params(m);
    return 0;
}

void llama3_sync_compute_params(llama3_model *m) {
    if (mixed(m)) m->ops->cast_f32_to_bf16(m->param_bf16, m->param_mem, m->total_numel);
}

const llama3_param *llama3_find_param(const llama3_model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

void llama3_zero_grads(llama3_model *m) { m->ops->fill(m->grad_mem, 0.0f, m->total_numel); }

void llama3_init_param_range(const llama3_param *p, uint64_t seed, size_t start, size_t count, float *host_out) {
    if (p->init_ones) {
        for (size_t j = 0; j < count; j++) host_out[j] = 1.0f;
        return;
    }
    llama3_rng_trunc_normal_fill(host_out, seed, p->name, start, count, p->init_std, p->init_lo, p->init_hi);
}

void llama3_init_weights(llama3_model *m, uint64_t seed) {
    /* Drawn on the host in chunks, then copied: the values are a function of
     * (seed, name, index) only, so chunking changes nothing. */
    const size_t chunk = (size_t)1 << 20;
    float *host = malloc(chunk * sizeof(float));
    if (!host) {
        fprintf(stderr, "llama3_init_weights: out of host memory\n");
        abort();
    }
    for (int i = 0; i < m->n_params; i++) {
        const llama3_param *p = &m->params[i];
        for (size_t s = 0; s < p->numel; s += chunk) {
            size_t cnt = p->numel - s < chunk ? p->numel - s : chunk;
            llama3_init_param_range(p, seed, s, cnt, host);
            m->ops->copy_h2d(m->param_mem + p->offset + s, host, cnt * sizeof(float));
        }
    }
    free(host);
}

/* ----------------------------------------------------------------------------
 * linear layers through the gemm op (weights [out, in] as nn.Linear) */

static ops_gemm_desc gemm_desc(tetra_dtype ab, tetra_dtype c, int trans_a, int trans_b, int mm, int nn, int kk,
                               int lda, int ldb, int ldc, float beta) {
    ops_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.a_type = g.b_type = ab;
    g.c_type = c;
    g.trans_a = trans_a;
    g.trans_b = trans_b;
    g.m = mm;
    g.n = nn;
    g.k = kk;
    g.lda = lda;
    g.ldb = ldb;
    g.ldc = ldc;
    g.alpha = 1.0f;
    g.beta = beta;
    return g;
}

/* Activations and weights are in the compute dtype; outputs too, except where an fp32
 * result is asked for (the logits). Weight gradients are always fp32. */

/* y[N, out] = x[N, in] W[out, in]^T + beta y */
static void linear_forward_to(const llama3_model *m, tetra_dtype yt, void *y, const void *x, const void *w, int n,
                              int in, int out, float beta) {
    ops_gemm_desc g = gemm_desc(m->compute_dtype, yt, 0, 1, n, out, in, in, in, out, beta);
    m->ops->gemm(y, x, w, &g);
}
static void linear_forward(const llama3_model *m, void *y, const void *x, const void *w, int n, int in, int out,
                           float beta) {
    linear_forward_to(m, m->compute_dtype, y, x, w, n, in, out, beta);
}

/* dx[N, in] = dy[N, out] W[out, in] + beta dx */
static void linear_backward_input(const llama3_model *m, void *dx, const void *dy, const void *w, int n, int in,
                                  int out, float beta) {
    ops_gemm_desc g = gemm_desc(m->compute_dtype, m->compute_dtype, 0, 0, n, in, out, out, in, in, beta);
    m->ops->gemm(dx, dy, w, &g);
}

/* dW[out, in] += dy[N, out]^T x[N, in]   (fp32 accumulation into the fp32 gradient) */
static void linear_backward_weight(const llama3_model *m, float *dw, const void *dy, const void *x, int n, int in,
                                   int out) {
    ops_gemm_desc g = gemm_desc(m->compute_dtype, TETRA_F32, 1, 0, out, in, n, out, in, in, 1.0f);
    m->ops->gemm(dw, dy, x, &g);
}

/* The element-wise ops in the compute dtype: one body of forward and backward for
 * both precisions (ops.h's *_bf16 twins compute the same functions). */
static void rmsnorm_fwd(const llama3_model *m, void *out, float *rstd, const void *x, const void *w, int n) {
    const int c = m->args.dim;
    const float eps = (float)m->args.norm_eps;
    if (mixed(m))
        m->ops->rmsnorm_forward_bf16(out, rstd, x, w, n, c, eps);
    else
        m->ops->rmsnorm_forward(out, rstd, x, w, n, c, eps);
}
static void rmsnorm_bwd_input(const llama3_model *m, void *dx, const void *dout, const void *x, const void *w,
                              const float *rstd, int n) {
    if (mixed(m))
        m->ops->rmsnorm_backward_input_bf16(dx, dout, x, w, rstd, n, m->args.dim);
    else
        m->ops->rmsnorm_backward_input(dx, dout, x, w, rstd, n, m->args.dim);
}
static void rmsnorm_bwd_weight(const llama3_model *m, float *dw, const void *dout, const void *x, const float *rstd,
                               int n) {
    if (mixed(m))
        m->ops->rmsnorm_backward_weight_bf16(dw, dout, x, rstd, n, m->args.dim);
    else
        m->ops->rmsnorm_backward_weight(dw, dout, x, rstd, n, m->args.dim);
}
static void rope_fwd(const llama3_model *m, void *x, int b, int t, int nh) {
    const int d = llama3_head_dim(&m->args);
    if (mixed(m))
        m->ops->rope_forward_bf16(x, x, m->rope_table, NULL, 0, b, t, nh, d);
    else
        m->ops->rope_forward(x, x, m->rope_table, NULL, 0, b, t, nh, d);
}
static void rope_bwd(const llama3_model *m, void *dx, const void *dout, int b, int t, int nh) {
    const int d = llama3_head_dim(&m->args);
    if (mixed(m))
        m->ops->rope_backward_bf16(dx, dout, m->rope_table, NULL, 0, b, t, nh, d);
    else
        m->ops->rope_backward(dx, dout, m->rope_table, NULL, 0, b, t, nh, d);
}

/* ----------------------------------------------------------------------------
 * forward */

void llama3_forward_embedding(llama3_model *m, llama3_acts *a, const int32_t *inputs) {
    const tetra_ops *ops = m->ops;
    ops->copy_h2d(a->inputs, inputs, a->n * sizeof(int32_t));
    if (mixed(m))
        ops->embedding_forward_bf16(a->res[0], a->inputs, param_ptr(m, P_EMBEDDING), (int)a->n, m->args.dim, 0,
                                    m->args.vocab_size);
    else
        ops->embedding_forward(a->res[0], a->inputs, param_ptr(m, P_EMBEDDING), (int)a->n, m->args.dim, 0,
                               m->args.vocab_size);
}

void llama3_block_forward(llama3_model *m, llama3_acts *a, int l) {
    const tetra_ops *ops = m->ops;
    const llama3_args *ar = &m->args;
    const int n = (int)a->n, C = ar->dim, D = llama3_head_dim(ar), H = ar->n_heads, KV = ar->n_kv_heads;
    const int HD = H * D, KVD = KV * D, F = (int)llama3_ffn_hidden(ar);
    const size_t es = act_size(m);
    layer_acts *t = &a->layer[l];
    const void *x = a->res[l];
    void *out = a->res[l + 1];

    /* attention: h = x + wo(attn(rope(wq xn1), rope(wk xn1), wv xn1)) */
    rmsnorm_fwd(m, t->xn1, t->rstd1, x, param_ptr(m, pidx_block(l, P_ATTN_NORM)), n);
    linear_forward(m, t->q, t->xn1, param_ptr(m, pidx_block(l, P_WQ)), n, C, HD, 0.0f);
    linear_forward(m, t->k, t->xn1, param_ptr(m, pidx_block(l, P_WK)), n, C, KVD, 0.0f);
    linear_forward(m, t->v, t->xn1, param_ptr(m, pidx_block(l, P_WV)), n, C, KVD, 0.0f);
    rope_fwd(m, t->q, a->b, a->t, H);
    rope_fwd(m, t->k, a->b, a->t, KV);
    ops_attn_shape s = attn_shape(m, a->b, a->t);
    if (mixed(m))
        ops->attention_forward_bf16(t->att, t->lse, t->q, t->k, t->v, &s, a->attn_ws);
    else
        ops->attention_forward(t->att, t->lse, t->q, t->k, t->v, &s, a->attn_ws);
    ops->copy(t->h, x, a->n * (size_t)C * es);
    linear_forward(m, t->h, t->att, param_ptr(m, pidx_block(l, P_WO)), n, HD, C, 1.0f);

    /* feed-forward: out = h + w2(silu(w1 xn2) * w3 xn2) */
    rmsnorm_fwd(m, t->xn2, t->rstd2, t->h, param_ptr(m, pidx_block(l, P_FFN_NORM)), n);
    linear_forward(m, t->a, t->xn2, param_ptr(m, pidx_block(l, P_W1)), n, C, F, 0.0f);
    linear_forward(m, t->g, t->xn2, param_ptr(m, pidx_block(l, P_W3)), n, C, F, 0.0f);
    if (mixed(m))
        ops->swiglu_forward_bf16(t->s, t->a, t->g, a->n * (size_t)F);
    else
        ops->swiglu_forward(t->s, t->a, t->g, a->n * (size_t)F);
    ops->copy(out, t->h, a->n * (size_t)C * es);
    linear_forward(m, out, t->s, param_ptr(m, pidx_block(l, P_W2)), n, F, C, 1.0f);
}

double llama3_forward_head(llama3_model *m, llama3_acts *a, const int32_t *targets, float dloss_scale,
                           int64_t *n_valid) {
    const tetra_ops *ops = m->ops;
    const llama3_args *ar = &m->args;
    const int n = (int)a->n, C = ar->dim, V = ar->vocab_size, L = ar->n_layers;
    rmsnorm_fwd(m, a->xnf, a->rstdf, a->res[L], param_ptr(m, pidx_norm(m)), n);
    /* the logits are fp32 in both precisions: the loss and its gradient need the range */
    linear_forward_to(m, TETRA_F32, a->logits, a->xnf, param_ptr(m, pidx_output(m)), n, C, V, 0.0f);
    if (a->logits_copy) ops->copy(a->logits_copy, a->logits, a->n * (size_t)V * sizeof(float));
    if (!targets) {
        a->has_targets = 0;
        if (n_valid) *n_valid = 0;
        return 0.0;
    }
    int64_t valid = 0;
    for (size_t i = 0; i < a->n; i++) valid += targets[i] != OPS_IGNORE_INDEX;
    if (n_valid) *n_valid = valid;
    ops->copy_h2d(a->targets, targets, a->n * sizeof(int32_t));
    /* fused: per-token losses, and dlogits written over the logits */
    ops->cross_entropy(a->logits, a->losses, a->logits, a->targets, n, V, dloss_scale);
    if (mixed(m)) ops->cast_f32_to_bf16(a->dlogits16, a->logits, a->n * (size_t)V);
    ops->sum(a->loss_sum, a->losses, a->n);
    float loss = 0.0f;
    ops->copy_d2h(&loss, a->loss_sum, sizeof loss);
    a->has_targets = 1;
    return (double)loss;
}

double llama3_forward(llama3_model *m, llama3_acts *a, const int32_t *inputs, const int32_t *targets,
                      float dloss_scale, int64_t *n_valid) {
    llama3_forward_embedding(m, a, inputs);
    for (int l = 0; l < m->args.n_layers; l++) llama3_block_forward(m, a, l);
    return llama3_forward_head(m, a, targets, dloss_scale, n_valid);
}

/* ----------------------------------------------------------------------------
 * backward */

void llama3_backward_head(llama3_model *m, llama3_acts *a) {
    const tetra_ops *ops = m->ops;
    const llama3_args *ar = &m->args;
    const int n = (int)a->n, C = ar->dim, V = ar->vocab_size, L = ar->n_layers;
    if (!a->has_targets) {
        /* a programming error: without targets the buffer holds logits, not dlogits */
        fprintf(stderr, "llama3_backward: the last forward had no targets\n");
        abort();
    }
    const void *dlogits = mixed(m) ? (const void *)a->dlogits16 : (const void *)a->logits;
    void *dxnf = a->scratch; /* [N, C] */
    /* W: dOutput += dlogits^T xnf; I: dxnf = dlogits Output */
    linear_backward_weight(m, grad_ptr(m, pidx_output(m)), dlogits, a->xnf, n, C, V);
    linear_backward_input(m, dxnf, dlogits, param_ptr(m, pidx_output(m)), n, C, V, 0.0f);
    rmsnorm_bwd_weight(m, grad_ptr(m, pidx_norm(m)), dxnf, a->res[L], a->rstdf, n);
    if (mixed(m))
        ops->fill(a->dres[L], 0.0f, a->n * (size_t)C / 2); /* bf16 zeros as fp32 zeros (C is even) */
    else
        ops->fill(a->dres[L], 0.0f, a->n * (size_t)C);
    rmsnorm_bwd_input(m, a->dres[L], dxnf, a->res[L], param_ptr(m, pidx_norm(m)), a->rstdf, n);
}

void llama3_block_backward_input(llama3_model *m, llama3_acts *a, int l) {
    const tetra_ops *ops = m->ops;
    const llama3_args *ar = &m->args;
    const int n = (int)a->n, C = ar->dim, D = llama3_head_dim(ar), H = ar->n_heads, KV = ar->n_kv_heads;
    const int HD = H * D, KVD = KV * D, F = (int)llama3_ffn_hidden(ar);
    const size_t nc = a->n * (size_t)C, es = act_size(m);
    layer_acts *t = &a->layer[l];
    const void *dout = a->dres[l + 1]; /* dL/dr_{l+1} */

    /* feed-forward: ds = dout W2; (da, dg) over (a, g); dxn2 = da W1 + dg W3 over xn2 */
    void *ds = a->scratch; /* [N, F] */
    linear_backward_input(m, ds, dout, param_ptr(m, pidx_block(l, P_W2)), n, F, C, 0.0f);
    if (mixed(m))
        ops->swiglu_backward_bf16(t->a, t->g, ds, t->a, t->g, a->n * (size_t)F);
    else
        ops->swiglu_backward(t->a, t->g, ds, t->a, t->g, a->n * (size_t)F);
    void *dxn2 = t->xn2;
    linear_backward_input(m, dxn2, t->a, param_ptr(m, pidx_block(l, P_W1)), n, C, F, 0.0f);
    linear_backward_input(m, dxn2, t->g, param_ptr(m, pidx_block(l, P_W3)), n, C, F, 1.0f);
    /* dh = dout (residual) + d rmsnorm */
    ops->copy(t->dh, dout, nc * es);
    rmsnorm_bwd_input(m, t->dh, dxn2, t->h, param_ptr(m, pidx_block(l, P_FFN_NORM)), t->rstd2, n);

    /* attention: datt = dh Wo; attention backward into scratch (it reads q/k/v, so it
     * cannot write over them; the fp32 op accumulates, so that scratch is zeroed); then
     * un-rotate into the q/k slots */
    void *datt = a->scratch;                       /* [N, HD] */
    void *dq = act_at(m, datt, a->n * (size_t)HD); /* [N, HD] */
    void *dk = act_at(m, dq, a->n * (size_t)HD);   /* [N, KVD] */
    void *dv = act_at(m, dk, a->n * (size_t)KVD);  /* [N, KVD] */
    linear_backward_input(m, datt, t->dh, param_ptr(m, pidx_block(l, P_WO)), n, HD, C, 0.0f);
    ops_attn_shape s = attn_shape(m, a->b, a->t);
    if (mixed(m)) {
        ops->attention_backward_bf16(dq, dk, dv, datt, t->q, t->k, t->v, t->att, t->lse, &s, a->attn_ws);
    } else {
        ops->fill(dq, 0.0f, a->n * (size_t)(HD + 2 * KVD));
        ops->attention_backward(dq, dk, dv, datt, t->q, t->k, t->v, t->att, t->lse, &s, a->attn_ws);
    }
    rope_bwd(m, t->q, dq, a->b, a->t, H);
    rope_bwd(m, t->k, dk, a->b, a->t, KV);
    ops->copy(t->v, dv, a->n * (size_t)KVD * es);
    void *dxn1 = t->xn1;
    linear_backward_input(m, dxn1, t->q, param_ptr(m, pidx_block(l, P_WQ)), n, C, HD, 0.0f);
    linear_backward_input(m, dxn1, t->k, param_ptr(m, pidx_block(l, P_WK)), n, C, KVD, 1.0f);
    linear_backward_input(m, dxn1, t->v, param_ptr(m, pidx_block(l, P_WV)), n, C, KVD, 1.0f);
    /* dr_l = dh (residual) + d rmsnorm */
    ops->copy(a->dres[l], t->dh, nc * es);
    rmsnorm_bwd_input(m, a->dres[l], dxn1, a->res[l], param_ptr(m, pidx_block(l, P_ATTN_NORM)), t->rstd1, n);
}

void llama3_block_backward_weight(llama3_model *m, llama3_acts *a, int l) {
    const llama3_args *ar = &m->args;
    const int n = (int)a->n, C = ar->dim, D = llama3_head_dim(ar), H = ar->n_heads, KV = ar->n_kv_heads;
    const int HD = H * D, KVD = KV * D, F = (int)llama3_ffn_hidden(ar);
    layer_acts *t = &a->layer[l];
    void *xn = a->scratch; /* [N, C] the norm outputs, recomputed bit for bit */

    /* feed-forward */
    linear_backward_weight(m, grad_ptr(m, pidx_block(l, P_W2)), a->dres[l + 1], t->s, n, F, C);
    rmsnorm_fwd(m, xn, a->rstd_scratch, t->h, param_ptr(m, pidx_block(l, P_FFN_NORM)), n);
    linear_backward_weight(m, grad_ptr(m, pidx_block(l, P_W1)), t->a, xn, n, C, F);
    linear_backward_weight(m, grad_ptr(m, pidx_block(l, P_W3)), t->g, xn, n, C, F);
    rmsnorm_bwd_weight(m, grad_ptr(m, pidx_block(l, P_FFN_NORM)), t->xn2, t->h, t->rstd2, n);

    /* attention */
    linear_backward_weight(m, grad_ptr(m, pidx_block(l, P_WO)), t->dh, t->att, n, HD, C);
    rmsnorm_fwd(m, xn, a->rstd_scratch, a->res[l], param_ptr(m, pidx_block(l, P_ATTN_NORM)), n);
    linear_backward_weight(m, grad_ptr(m, pidx_block(l, P_WQ)), t->q, xn, n, C, HD);
    linear_backward_weight(m, grad_ptr(m, pidx_block(l, P_WK)), t->k, xn, n, C, KVD);
    linear_backward_weight(m, grad_ptr(m, pidx_block(l, P_WV)), t->v, xn, n, C, KVD);
    rmsnorm_bwd_weight(m, grad_ptr(m, pidx_block(l, P_ATTN_NORM)), t->xn1, a->res[l], t->rstd1, n);
}

void llama3_backward_embedding(llama3_model *m, llama3_acts *a) {
    if (mixed(m))
        m->ops->embedding_backward_bf16(grad_ptr(m, P_EMBEDDING), a->dres[0], a->inputs, (int)a->n, m->args.dim, 0,
                                        m->args.vocab_size);
    else
        m->ops->embedding_backward(grad_ptr(m, P_EMBEDDING), a->dres[0], a->inputs, (int)a->n, m->args.dim, 0,
                                   m->args.vocab_size);
}

void llama3_backward(llama3_model *m, llama3_acts *a) {
    llama3_backward_head(m, a);
    for (int l = m->args.n_layers - 1; l >= 0; l--) {
        llama3_block_backward_input(m, a, l);
        llama3_block_backward_weight(m, a, l);
    }
    llama3_backward_embedding(m, a);
}
