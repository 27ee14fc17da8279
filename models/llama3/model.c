/* model.c — Llama 3 on the op table: a layout's parameters, init,
 * activations with a save policy, forward, and backward split into I (input
 * gradients) and W (weight gradients).
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
 * What one block produces for its backward: xn1 and xn2 (with their rstd), q/k/v
 * after RoPE, the attention output and its log-sum-exp, h, the SwiGLU inputs
 * a = xn2 W1^T, g = xn2 W3^T and output s. Kept ones live in the microbatch's
 * llama3_acts, the others in the workspace (recomputed in the I pass). Nothing is
 * [t, t]: attention is the blockwise op. The I pass writes what the W pass needs
 * into the slots of activations it has finished with (dq/dk/dv over q/k/v, da/dg
 * over a/g, dL/dxn over xn) plus dh; W recomputes xn from (r, rstd) with the same
 * deterministic rmsnorm_forward, so I and W may run far apart (zero-bubble
 * pipelines) and still give the one-pass result bit for bit.
 */
#include "models/llama3/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama3/documents.h"
#include "models/llama3/init.h"
#include "parallel/cp.h"
#include "parallel/tp.h"

/* parameter order in a block */
enum { P_WQ, P_WK, P_WV, P_WO, P_W1, P_W2, P_W3, P_ATTN_NORM, P_FFN_NORM, P_PER_BLOCK };

static int n_blocks(const llama3_model *m) { return m->layout.layer_end - m->layout.layer_start; }
/* tensor-parallel degree: 1 runs the single-rank arithmetic unchanged */
static int tpn(const llama3_model *m) { return m->layout.tp_size; }
static int cpn(const llama3_model *m) { return m->layout.cp_size; }

/* local block index of global layer l (a caller passing a layer outside the layout is a bug) */
static int local_block(const llama3_model *m, int l) {
    int b = l - m->layout.layer_start;
    if (b < 0 || b >= n_blocks(m)) {
        fprintf(stderr, "llama3: block %d is not in this model's layout (blocks %d..%d)\n", l, m->layout.layer_start,
                m->layout.layer_end - 1);
        abort();
    }
    return b;
}

static int pidx_embedding(const llama3_model *m) { return m->layout.has_embedding ? 0 : -1; }
static int pidx_block(const llama3_model *m, int l, int which) {
    return (m->layout.has_embedding ? 1 : 0) + local_block(m, l) * P_PER_BLOCK + which;
}
static int pidx_norm(const llama3_model *m) { return (m->layout.has_embedding ? 1 : 0) + n_blocks(m) * P_PER_BLOCK; }
static int pidx_output(const llama3_model *m) { return pidx_norm(m) + 1; }

int llama3_embedding_unit(const llama3_model *m) { return m->layout.has_embedding ? 0 : -1; }
int llama3_head_unit(const llama3_model *m) { return m->layout.has_head ? m->n_units - 1 : -1; }
int llama3_block_unit(const llama3_model *m, int layer) {
    int b = layer - m->layout.layer_start;
    if (b < 0 || b >= n_blocks(m)) return -1;
    return (m->layout.has_embedding ? 1 : 0) + b;
}

static void need(const void *p, const llama3_model *m, int unit, const char *what) {
    if (p) return;
    fprintf(stderr,
            "llama3: unit %s was used while its %s are not bound (a schedule that skipped the unit's "
            "unshard, or a model without storage)\n",
            m->units[unit].name, what);
    abort();
}

/* The mixed-precision model reads bf16 compute copies of the parameters and keeps bf16
 * activations; gradients are fp32 in both precisions. */
static int mixed(const llama3_model *m) { return m->compute_dtype == TETRA_BF16; }
static size_t act_size(const llama3_model *m) { return mixed(m) ? sizeof(uint16_t) : sizeof(float); }
static void *act_at(const llama3_model *m, void *base, size_t elems) { return (char *)base + elems * act_size(m); }

/* this rank's share of the heads, hidden units and vocabulary */
static int heads_l(const llama3_model *m) { return m->args.n_heads / tpn(m); }
static int kv_l(const llama3_model *m) { return m->args.n_kv_heads / tpn(m); }
static size_t hd_l(const llama3_model *m) { return (size_t)heads_l(m) * llama3_head_dim(&m->args); }
static size_t kvd_l(const llama3_model *m) { return (size_t)kv_l(m) * llama3_head_dim(&m->args); }
static size_t ffn_l(const llama3_model *m) { return (size_t)llama3_ffn_hidden(&m->args) / (size_t)tpn(m); }
static size_t vocab_l(const llama3_model *m) { return (size_t)m->args.vocab_size / (size_t)tpn(m); }

static void *param_ptr(const llama3_model *m, int idx) {
    const llama3_param *p = &m->params[idx];
    void *base = m->unit_params[p->unit];
    need(base, m, p->unit, "parameters");
    return (char *)base + (p->offset - m->unit_offset[p->unit]) * act_size(m);
}
static float *grad_ptr(const llama3_model *m, int idx) {
    const llama3_param *p = &m->params[idx];
    float *base = m->unit_grads[p->unit];
    need(base, m, p->unit, "gradients");
    return base + (p->offset - m->unit_offset[p->unit]);
}

llama3_layout llama3_layout_full(const llama3_args *a) {
    llama3_layout l;
    memset(&l, 0, sizeof l);
    l.layer_start = 0;
    l.layer_end = a->n_layers;
    l.has_embedding = 1;
    l.has_head = 1;
    l.tp_rank = 0;
    l.tp_size = 1;
    l.cp_rank = 0;
    l.cp_size = 1;
    return l;
}

/* ----------------------------------------------------------------------------
 * linear layers (weights [out, in] as nn.Linear) through the gemm op */

static ops_gemm_desc gemm_desc(tetra_dtype ab, tetra_dtype c, int trans_a, int trans_b, int mm, int nn, int kk, int lda,
                               int ldb, int ldc, float beta) {
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

/* y[N, out] = x[N, in] W[out, in]^T + beta (c_in or y) */
static void default_forward(const model_linear_env *e, const model_linear *l, tetra_dtype yt, void *y, const void *x,
                            const void *w, int n, int row0, float beta, const void *c_in) {
    (void)row0;
    ops_gemm_desc g = gemm_desc(e->compute_dtype, yt, 0, 1, n, l->out, l->in, l->in, l->in, l->out, beta);
    g.c_in = c_in;
    e->ops->gemm(y, x, w, &g);
}
/* dx[N, in] = dy[N, out] W[out, in] + beta dx */
static void default_backward_input(const model_linear_env *e, const model_linear *l, tetra_dtype dxt, void *dx,
                                   const void *dy, const void *w, int n, int row0, float beta) {
    (void)row0;
    ops_gemm_desc g = gemm_desc(e->compute_dtype, dxt, 0, 0, n, l->in, l->out, l->out, l->in, l->in, beta);
    e->ops->gemm(dx, dy, w, &g);
}
/* dW[out, in] += dy[N, out]^T x[N, in]   (fp32 accumulation into the fp32 gradient) */
static void default_backward_weight(const model_linear_env *e, const model_linear *l, float *dw, const void *dy,
                                    const void *x, int n, float beta) {
    ops_gemm_desc g = gemm_desc(e->compute_dtype, TETRA_F32, 1, 0, l->out, l->in, n, l->out, l->in, l->in, beta);
    e->ops->gemm(dw, dy, x, &g);
}

static const model_linear_impl default_linear = {
    "gemm", default_forward, default_backward_input, default_backward_weight, NULL, NULL, NULL};

const model_linear_impl *llama3_linear_default(void) { return &default_linear; }

static const void *env_weight(const void *model, const model_linear *l) { return param_ptr(model, l->param); }

/* What an implementation's call sees of m (models/linear.h). */
static model_linear_env llama3_linear_env(const llama3_model *m) {
    model_linear_env e = {m->ops, m->compute_dtype, m->ctx.tp, &default_linear, m, env_weight};
    return e;
}

/* row0: see model_linear_impl (-1: the whole operand) */
static void lin_fwd_to(const llama3_model *m, int idx, tetra_dtype yt, void *y, const void *x, int n, int row0,
                       float beta) {
    const model_linear *l = &m->linears[idx];
    const model_linear_env e = llama3_linear_env(m);
    l->impl->forward(&e, l, yt, y, x, param_ptr(m, idx), n, row0, beta, NULL);
}
static void lin_fwd(const llama3_model *m, int idx, void *y, const void *x, int n, int row0, float beta) {
    lin_fwd_to(m, idx, m->compute_dtype, y, x, n, row0, beta);
}
/* y = x W^T + res over the whole operand: the residual read by the GEMM, not copied into y */
static void lin_fwd_res(const llama3_model *m, int idx, void *y, const void *x, int n, const void *res) {
    const model_linear *l = &m->linears[idx];
    const model_linear_env e = llama3_linear_env(m);
    l->impl->forward(&e, l, m->compute_dtype, y, x, param_ptr(m, idx), n, -1, 1.0f, res);
}
static void lin_bwd_input_to(const llama3_model *m, int idx, tetra_dtype dxt, void *dx, const void *dy, int n, int row0,
                             float beta) {
    const model_linear *l = &m->linears[idx];
    const model_linear_env e = llama3_linear_env(m);
    l->impl->backward_input(&e, l, dxt, dx, dy, param_ptr(m, idx), n, row0, beta);
}
static void lin_bwd_input(const llama3_model *m, int idx, void *dx, const void *dy, int n, int row0, float beta) {
    lin_bwd_input_to(m, idx, m->compute_dtype, dx, dy, n, row0, beta);
}
static void lin_begin(const llama3_model *m, int idx, model_operand which, const void *local, size_t rows, size_t cols,
                      model_rows_layout lay) {
    const model_linear *l = &m->linears[idx];
    const model_linear_env e = llama3_linear_env(m);
    if (l->impl->begin_rows) l->impl->begin_rows(&e, l, which, local, (int)rows, (int)cols, lay);
}
/* The device float where the linear's implementation wants the amax of the operand about
 * to be produced at t (rows x its columns), or NULL (model_linear_impl.amax_slot) */
static float *lin_amax_slot(const llama3_model *m, int idx, model_operand which, const void *t, size_t rows) {
    const model_linear *l = &m->linears[idx];
    if (!l->impl->amax_slot) return NULL;
    const model_linear_env e = llama3_linear_env(m);
    return l->impl->amax_slot(&e, l, which, t, (int)rows);
}
/* amax (the model's float kept with the activation t), when the linear's implementation
 * takes it for its next call on t (model_linear_impl.amax_from), else NULL */
static float *lin_amax_from(const llama3_model *m, int idx, model_operand which, const void *t, size_t rows,
                            float *amax) {
    const model_linear *l = &m->linears[idx];
    if (!amax || !l->impl->amax_from) return NULL;
    const model_linear_env e = llama3_linear_env(m);
    return l->impl->amax_from(&e, l, which, t, (int)rows, amax) ? amax : NULL;
}
/* 1 when param idx's gradient is written for the first time this step and holds no value
 * (llama3_grads_fresh): the write overwrites; then it accumulates */
static int take_fresh(const llama3_model *m, int idx) {
    const int f = m->grad_fresh[idx];
    m->grad_fresh[idx] = 0;
    return f;
}
static void lin_bwd_weight(const llama3_model *m, int idx, const void *dy, const void *x, int n) {
    const model_linear *l = &m->linears[idx];
    const model_linear_env e = llama3_linear_env(m);
    l->impl->backward_weight(&e, l, grad_ptr(m, idx), dy, x, n, take_fresh(m, idx) ? 0.0f : 1.0f);
}

/* Two linears of one shape on one input (wk and wv, w1 and w3) as one batched GEMM of
 * the default implementation: the second product's weight, output (y) or output gradient
 * (dy) and weight gradient each lie a positive stride past the first's, and the input
 * is read by both (stride 0). The same products as two calls (the CPU backend runs the
 * items in turn); one launch on the GPU. 0 when that does not apply (a converter's
 * implementation, other shapes, a stride that is not positive, gradients of which one is
 * fresh and the other not), and the caller runs the two linears one by one. */
static int pair_stride(const void *p0, const void *p1, size_t es, int64_t *stride) {
    const ptrdiff_t d = (const char *)p1 - (const char *)p0;
    *stride = d / (ptrdiff_t)es;
    return d > 0 && d % (ptrdiff_t)es == 0;
}
static int lin_pair_ok(const llama3_model *m, int i0, int i1) {
    const model_linear *l0 = &m->linears[i0], *l1 = &m->linears[i1];
    return l0->impl == &default_linear && l1->impl == &default_linear && l0->in == l1->in && l0->out == l1->out;
}
static int lin_fwd_pair(const llama3_model *m, int i0, int i1, void *y0, void *y1, const void *x, int n) {
    const size_t es = tetra_dtype_size(m->compute_dtype);
    const model_linear *l = &m->linears[i0];
    int64_t sw, sy;
    if (!lin_pair_ok(m, i0, i1) || !pair_stride(param_ptr(m, i0), param_ptr(m, i1), es, &sw) ||
        !pair_stride(y0, y1, es, &sy))
        return 0;
    ops_gemm_desc g = gemm_desc(m->compute_dtype, m->compute_dtype, 0, 1, n, l->out, l->in, l->in, l->in, l->out, 0.0f);
    g.batch = 2;
    g.stride_b = sw;
    g.stride_c = sy;
    m->ops->gemm(y0, x, param_ptr(m, i0), &g);
    return 1;
}
static int lin_bwd_weight_pair(const llama3_model *m, int i0, int i1, const void *dy0, const void *dy1, const void *x,
                               int n) {
    const size_t es = tetra_dtype_size(m->compute_dtype);
    const model_linear *l = &m->linears[i0];
    int64_t sdy, sg;
    if (!lin_pair_ok(m, i0, i1) || m->grad_fresh[i0] != m->grad_fresh[i1] || !pair_stride(dy0, dy1, es, &sdy) ||
        !pair_stride(grad_ptr(m, i0), grad_ptr(m, i1), sizeof(float), &sg))
        return 0;
    const float beta = take_fresh(m, i0) ? 0.0f : 1.0f;
    (void)take_fresh(m, i1);
    ops_gemm_desc g = gemm_desc(m->compute_dtype, TETRA_F32, 1, 0, l->out, l->in, n, l->out, l->in, l->in, beta);
    g.batch = 2;
    g.stride_a = sdy;
    g.stride_c = sg;
    m->ops->gemm(grad_ptr(m, i0), dy0, x, &g);
    return 1;
}

/* wq, wk and wv as one linear Wqkv [H*D + 2 KV*D, C] (per rank under tensor parallel):
 * the default implementation on all three, stored one after another in one unit, so
 * their rows, and their gradients', are the fused weight's. The forward's one GEMM writes
 * q|k|v rows into the scratch (RoPE and a strided copy take them apart); the I pass
 * leaves the three output gradients as rows [N, H*D + 2 KV*D] over the q, k, v buffer
 * (one region: llama3_keep_qkv), so the input and the weight gradient are one GEMM each.
 * Chosen on the layout alone, never on a keep mask, so every activation checkpointing
 * mode runs the same products; a converter's implementation keeps three linears. */
static int lin_follows(const llama3_model *m, int i0, int i1) {
    const model_linear *l0 = &m->linears[i0], *l1 = &m->linears[i1];
    const llama3_param *p0 = &m->params[i0], *p1 = &m->params[i1];
    return l0->impl == &default_linear && l1->impl == &default_linear && l0->in == l1->in && p0->unit == p1->unit &&
        p1->offset == p0->offset + (size_t)l0->out * (size_t)l0->in;
}
static int qkv_fused(const llama3_model *m, int l) {
    return lin_follows(m, pidx_block(m, l, P_WQ), pidx_block(m, l, P_WK)) &&
        lin_follows(m, pidx_block(m, l, P_WK), pidx_block(m, l, P_WV));
}
/* the forward's one GEMM: when it computes all of q, k and v (a recompute computes the
 * three or none: llama3_keep_qkv) */
static int qkv_fused_forward(const llama3_model *m, int l, unsigned compute) {
    const unsigned qkv = LLAMA3_KEEP_Q | LLAMA3_KEEP_K | LLAMA3_KEEP_V;
    return (compute & qkv) == qkv && qkv_fused(m, l);
}
static int qkv_cols(const llama3_model *m, int l) {
    return m->linears[pidx_block(m, l, P_WQ)].out + 2 * m->linears[pidx_block(m, l, P_WK)].out;
}
/* y[n, QKV] = x[n, C] Wqkv^T */
static void lin_fwd_qkv(const llama3_model *m, int l, void *y, const void *x, int n) {
    const int c = m->linears[pidx_block(m, l, P_WQ)].in, qkv = qkv_cols(m, l);
    ops_gemm_desc g = gemm_desc(m->compute_dtype, m->compute_dtype, 0, 1, n, qkv, c, c, c, qkv, 0.0f);
    m->ops->gemm(y, x, param_ptr(m, pidx_block(m, l, P_WQ)), &g);
}
/* dx[n, C] (dxt) = dqkv[n, QKV] Wqkv */
static void lin_bwd_input_qkv(const llama3_model *m, int l, tetra_dtype dxt, void *dx, const void *dqkv, int n) {
    const int c = m->linears[pidx_block(m, l, P_WQ)].in, qkv = qkv_cols(m, l);
    ops_gemm_desc g = gemm_desc(m->compute_dtype, dxt, 0, 0, n, c, qkv, qkv, c, c, 0.0f);
    m->ops->gemm(dx, dqkv, param_ptr(m, pidx_block(m, l, P_WQ)), &g);
}
/* dWqkv[QKV, C] (+)= dqkv[n, QKV]^T x[n, C]: the three gradients are fresh together or not
 * (llama3_grads_fresh marks all, and only this W pass writes them) */
static void lin_bwd_weight_qkv(const llama3_model *m, int l, const void *dqkv, const void *x, int n) {
    const int iq = pidx_block(m, l, P_WQ), ik = pidx_block(m, l, P_WK), iv = pidx_block(m, l, P_WV);
    const int c = m->linears[iq].in, qkv = qkv_cols(m, l);
    if (m->grad_fresh[iq] != m->grad_fresh[ik] || m->grad_fresh[ik] != m->grad_fresh[iv]) {
        fprintf(stderr, "llama3: block %d: wq, wk and wv gradients not fresh together\n", l);
        abort();
    }
    const float beta = take_fresh(m, iq) ? 0.0f : 1.0f;
    (void)take_fresh(m, ik);
    (void)take_fresh(m, iv);
    ops_gemm_desc g = gemm_desc(m->compute_dtype, TETRA_F32, 1, 0, qkv, c, n, qkv, c, c, beta);
    m->ops->gemm(grad_ptr(m, iq), dqkv, x, &g);
}

/* The element-wise ops in the compute dtype: one body of forward and backward for
 * both precisions (ops.h's *_bf16 twins compute the same functions). */
/* amax (bf16 only; NULL: none): where the op also writes max |out| */
static void rmsnorm_fwd_amax(const llama3_model *m, void *out, float *rstd, const void *x, const void *w, int n,
                             float *amax) {
    const int c = m->args.dim;
    const float eps = (float)m->args.norm_eps;
    if (mixed(m)) m->ops->rmsnorm_forward_bf16(out, rstd, amax, x, w, n, c, eps);
    else m->ops->rmsnorm_forward(out, rstd, x, w, n, c, eps);
}
static void rmsnorm_fwd(const llama3_model *m, void *out, float *rstd, const void *x, const void *w, int n) {
    rmsnorm_fwd_amax(m, out, rstd, x, w, n, NULL);
}
/* dx = dres + d rmsnorm (dres NULL: dx accumulates); amax (bf16 only, NULL: none) of dx
 * as it is written */
static void rmsnorm_bwd_input_amax(const llama3_model *m, void *dx, const void *dout, const void *x, const void *w,
                                   const float *rstd, int n, const void *dres, float *amax) {
    if (mixed(m)) m->ops->rmsnorm_backward_input_bf16(dx, amax, dout, x, w, rstd, n, m->args.dim, dres);
    else m->ops->rmsnorm_backward_input(dx, dout, x, w, rstd, n, m->args.dim, dres);
}
static void rmsnorm_bwd_input(const llama3_model *m, void *dx, const void *dout, const void *x, const void *w,
                              const float *rstd, int n, const void *dres) {
    rmsnorm_bwd_input_amax(m, dx, dout, x, w, rstd, n, dres, NULL);
}
/* the norm param idx's weight gradient */
static void rmsnorm_bwd_weight(const llama3_model *m, int idx, const void *dout, const void *x, const float *rstd,
                               int n) {
    float *dw = grad_ptr(m, idx);
    const int acc = !take_fresh(m, idx);
    if (mixed(m)) m->ops->rmsnorm_backward_weight_bf16(dw, dout, x, rstd, n, m->args.dim, acc);
    else m->ops->rmsnorm_backward_weight(dw, dout, x, rstd, n, m->args.dim, acc);
}
/* pos: the rows' global positions under context parallel, NULL for 0..t-1; out_ld, x_ld:
 * the rows' pitches in elements (nh*D, or H*D + 2 KV*D for the fused projection's rows) */
static void rope_fwd(const llama3_model *m, void *out, const void *x, const int32_t *pos, int b, int t, int nh,
                     int out_ld, int x_ld) {
    const int d = llama3_head_dim(&m->args);
    if (mixed(m)) m->ops->rope_forward_bf16(out, x, m->rope_table, pos, 0, b, t, nh, d, out_ld, x_ld);
    else m->ops->rope_forward(out, x, m->rope_table, pos, 0, b, t, nh, d, out_ld, x_ld);
}
static void rope_bwd(const llama3_model *m, void *dx, const void *dout, const int32_t *pos, int b, int t, int nh,
                     int dx_ld, int dout_ld, float *amax) {
    const int d = llama3_head_dim(&m->args);
    if (mixed(m)) m->ops->rope_backward_bf16(dx, amax, dout, m->rope_table, pos, 0, b, t, nh, d, dx_ld, dout_ld);
    else m->ops->rope_backward(dx, dout, m->rope_table, pos, 0, b, t, nh, d, dx_ld, dout_ld);
}
/* RoPE on a microbatch's q or k (rows of nh heads, pitches as rope_fwd's): at each row's
 * position within its document (a->dpos, per sequence: one call per sequence), else at
 * the rows' global positions. */
typedef struct {
    void *p;
    int ld;
} rows_at; /* rows of a [N, ld] buffer from p (a column block when ld is wider than them) */
static void rope_fwd_acts(const llama3_model *m, const llama3_acts *a, rows_at out, rows_at x, int nh);
static void rope_bwd_acts(const llama3_model *m, const llama3_acts *a, rows_at dx, rows_at dout, int nh, float *amax);
static void zero_acts(const llama3_model *m, void *x, size_t elems) {
    if (mixed(m)) m->ops->fill(x, 0.0f, elems / 2); /* bf16 zeros as fp32 zeros (elems is even: a multiple of dim) */
    else m->ops->fill(x, 0.0f, elems);
}

/* ----------------------------------------------------------------------------
 * activations: the workspace and one microbatch */

/* One block's activations (compute dtype unless marked fp32). */
typedef struct {
    void *xn1;       /* [N, C]   attention_norm output; after I: dL/dxn1 */
    float *rstd1;    /* [N] */
    void *q;         /* [N, H*D]  after RoPE; after I: dL/d(xn1 Wq^T) */
    void *k;         /* [N, KV*D] after RoPE; after I: dL/d(xn1 Wk^T) */
    void *v;         /* [N, KV*D] after I: dL/dv */
    void *att;       /* [N, H*D]  attention output (input of wo) */
    float *att_amax; /* [1] max |att|, taken as att is written (bf16 compute; lin_amax_from) */
    float *lse;      /* [B, H, T] log-sum-exp of the attention scores */
    void *h;         /* [N, C]   residual after attention */
    void *xn2;       /* [N, C]   ffn_norm output; after I: dL/dxn2 */
    float *rstd2;    /* [N] */
    void *a;         /* [N, F]   xn2 W1^T; after I: dL/da */
    void *g;         /* [N, F]   xn2 W3^T; after I: dL/dg */
    void *s;         /* [N, F]   silu(a) * g (input of w2) */
    float *s_amax;   /* [1] max |s|, written with s (bf16 compute; lin_amax_from) */
    void *dh;        /* [N, C]   dL/dh, from I for W (wo's weight gradient) */
    /* tensor parallel (P > 1): q/k/v/att/a/g/s hold the local heads and hidden units;
     * xn1/xn2 are the all-gathered norm outputs [N, C] (kept for W), h and the rstds
     * this rank's N/P rows, dh the all-gathered dL/dh; and from I for W: */
    void *dxn1l; /* [N/P, C] dL/dxn1 of this rank's rows (attention_norm's weight gradient) */
    void *dxn2l; /* [N/P, C] dL/dxn2 of this rank's rows */
    void *dop;   /* [N, C]   dL/dr_{l+1} all-gathered (w2's weight gradient) */
} layer_acts;

struct llama3_workspace {
    int max_b, max_t;
    size_t max_n;
    void *mem; /* the one backend allocation; everything below is a view */
    size_t bytes;
    int has_fwd;    /* fwd and slots exist (recompute_slots > 0) */
    layer_acts fwd; /* unkept activations during a forward (no dh) */
    int n_slots;
    layer_acts *slot;               /* [n_slots] a recomputed block between its I and W passes */
    const llama3_acts **slot_owner; /* [n_slots] */
    int *slot_layer;                /* [n_slots] */
    void *scratch;                  /* [N, max(F, 2 H*D + 2 KV*D, C)] reused inside one pass */
    float *rstd_scratch;            /* [N] */
    void *attn_ws;                  /* attention workspace */
    void *cp_ws;                    /* context parallel attention (parallel/cp.h) */
    /* tensor parallel (P > 1) */
    float *tp_full;  /* [N, C] fp32: a row-parallel partial sum before its reduce-scatter */
    float *tp_stage; /* [N, C] fp32: the reduce-scatter's blocks; then a residual in fp32 */
    float *tp_local; /* [N/P, C] fp32: the reduced rows */
    void *xn_local;  /* [N/P, C] a norm's output on this rank's rows, before the all-gather */
    float *lg_full;  /* [N, V] fp32: the gathered logits (loss parallel off), or NULL */
    float *lg_stage; /* [N, V] fp32 */
};

struct llama3_acts {
    int b, t;
    size_t n; /* tokens b*t */
    llama3_workspace *ws;
    int own_ws; /* created with a private workspace */
    void *mem;  /* the one backend allocation; everything below is a view */
    size_t bytes;
    int32_t *inputs;  /* [N] backend copy of the token ids (embedding) */
    int32_t *pos;     /* [t] global positions of the rows (context parallel), else NULL */
    int32_t *doc;     /* [b, t * cp] document ids of every global position (block_causal), else NULL */
    int32_t *dpos;    /* [b, t] each row's position within its document (reset_positions), else NULL */
    int32_t *targets; /* [N] (head) */
    float *loss_sum;  /* [1] */
    size_t nl;        /* rows of the residual stream on this rank: N / P */
    int nb;           /* local blocks */
    int l0;           /* global index of the first block (res[0] is r_l0) */
    void **res;       /* [nb+1] of [N/P, C]: r_{start} .. r_{end} (compute dtype) */
    void **dres;      /* [nb+1] of [N/P, C]: dL/dr (P > 1: two buffers, alternating; see shared_dres) */
    unsigned *keep;   /* [nb] save policy of each block */
    layer_acts *kept; /* [nb] the kept activations (NULL where not kept) */
    int *slot;        /* [nb] recompute slot held between I and W, or -1 */
    /* head (P > 1: V is the local vocabulary V/P, xnf the all-gathered norm output) */
    void *xnf;           /* [N, C]  final norm output */
    float *rstdf;        /* [N/P] */
    void *dxnf;          /* [N/P, C]  dL/dxnf of this rank's rows, from the head's I for its W */
    float *logits;       /* [N, V]  fp32 logits (fp32, or bf16 under tensor parallel: the bf16
                          * ones widened for the vocabulary-parallel loss); after the forward
                          * with targets: fp32 dlogits; NULL in bf16 at tp 1 */
    uint16_t *dlogits16; /* [N, V]  bf16 (mixed precision only): the output projection's bf16
                          * logits, then the bf16 dlogits for the output GEMMs */
    float *losses;       /* [N]     per-token cross-entropy */
    float *ce_stats;     /* [3, N]  vocab-parallel softmax statistics (P > 1) */
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
    s.h = heads_l(m);
    s.kv = kv_l(m);
    s.d = llama3_head_dim(ar);
    s.scale = (float)(1.0 / sqrt((double)s.d));
    s.causal = 1;
    return s;
}

static cp_ctx cp_of(const llama3_model *m) {
    cp_ctx c;
    c.g = m->ctx.cp;
    c.rotate = m->cp_ring ? CP_ROTATE_ALLTOALL : CP_ROTATE_ALLGATHER;
    c.balanced = m->cp_balanced;
    return c;
}

static cp_attn_dims cp_dims(const llama3_model *m, int b, int t) {
    ops_attn_shape s = attn_shape(m, b, t);
    cp_attn_dims d = {b, t, s.h, s.kv, s.d, s.scale, NULL};
    return d;
}

/* A microbatch's attention: its shape, with its document ids under block_causal. */
static ops_attn_shape attn_shape_acts(const llama3_model *m, const llama3_acts *a) {
    ops_attn_shape s = attn_shape(m, a->b, a->t);
    s.doc = a->doc;
    s.doc_len = a->doc ? a->t * cpn(m) : 0;
    return s;
}
static cp_attn_dims cp_dims_acts(const llama3_model *m, const llama3_acts *a) {
    cp_attn_dims d = cp_dims(m, a->b, a->t);
    d.doc = a->doc;
    return d;
}

static void rope_fwd_acts(const llama3_model *m, const llama3_acts *a, rows_at out, rows_at x, int nh) {
    if (!a->dpos) {
        rope_fwd(m, out.p, x.p, a->pos, a->b, a->t, nh, out.ld, x.ld);
        return;
    }
    for (int r = 0; r < a->b; r++) {
        const size_t row = (size_t)r * (size_t)a->t;
        rope_fwd(m, act_at(m, out.p, row * (size_t)out.ld), act_at(m, x.p, row * (size_t)x.ld), a->dpos + row, 1, a->t,
                 nh, out.ld, x.ld);
    }
}
/* amax (one call only, so not with per-document positions): of all of dx, as it is written */
static void rope_bwd_acts(const llama3_model *m, const llama3_acts *a, rows_at dx, rows_at dout, int nh, float *amax) {
    if (!a->dpos) {
        rope_bwd(m, dx.p, dout.p, a->pos, a->b, a->t, nh, dx.ld, dout.ld, amax);
        return;
    }
    for (int r = 0; r < a->b; r++) {
        const size_t row = (size_t)r * (size_t)a->t;
        rope_bwd(m, act_at(m, dx.p, row * (size_t)dx.ld), act_at(m, dout.p, row * (size_t)dout.ld), a->dpos + row, 1,
                 a->t, nh, dx.ld, dout.ld, NULL);
    }
}

static size_t scratch_cols(const llama3_model *m) {
    size_t c = (size_t)m->args.dim, hd = hd_l(m), kvd = kvd_l(m), f = ffn_l(m);
    size_t s = f;
    if (2 * hd + 2 * kvd > s) s = 2 * hd + 2 * kvd;
    if (c > s) s = c;
    return s;
}

/* Carve the fields of one block's activations selected by mask (plus the I-to-W ones
 * when with_dh) for n tokens, nl of them this rank's rows. */
static void carve_layer(const llama3_model *m, carver *cv, size_t n, size_t nl, unsigned mask, int with_dh,
                        layer_acts *t) {
    const size_t c = (size_t)m->args.dim, hd = hd_l(m), kvd = kvd_l(m), f = ffn_l(m);
    const size_t fl = sizeof(float), es = act_size(m);
    memset(t, 0, sizeof *t);
    if (mask & LLAMA3_KEEP_XN1) {
        t->xn1 = carve(cv, n * c * es);
        t->rstd1 = carve(cv, nl * fl);
    }
    if (mask & LLAMA3_KEEP_Q) { /* q, k, v: one region (llama3_keep_qkv) */
        t->q = carve(cv, n * (hd + 2 * kvd) * es);
        t->k = t->q ? (char *)t->q + n * hd * es : NULL;
        t->v = t->k ? (char *)t->k + n * kvd * es : NULL;
    }
    if (mask & LLAMA3_KEEP_ATT) {
        t->att = carve(cv, n * hd * es);
        t->lse = carve(cv, n * (size_t)heads_l(m) * fl);
        if (mixed(m)) t->att_amax = carve(cv, fl);
    }
    if (mask & LLAMA3_KEEP_H) t->h = carve(cv, nl * c * es);
    if (mask & LLAMA3_KEEP_XN2) {
        t->xn2 = carve(cv, n * c * es);
        t->rstd2 = carve(cv, nl * fl);
    }
    if (mask & LLAMA3_KEEP_A) t->a = carve(cv, n * f * es);
    if (mask & LLAMA3_KEEP_G) t->g = carve(cv, n * f * es);
    if (mask & LLAMA3_KEEP_S) t->s = carve(cv, n * f * es);
    if ((mask & LLAMA3_KEEP_S) && mixed(m)) t->s_amax = carve(cv, fl);
    if (with_dh) {
        t->dh = carve(cv, n * c * es);
        if (tpn(m) > 1) {
            t->dxn1l = carve(cv, nl * c * es);
            t->dxn2l = carve(cv, nl * c * es);
            t->dop = carve(cv, n * c * es);
        }
    }
}

static size_t workspace_layout(const llama3_model *m, llama3_workspace *ws, int fwd, int slots) {
    carver cv = {(char *)ws->mem, 0};
    const size_t n = ws->max_n, nl = n / (size_t)tpn(m), c = (size_t)m->args.dim;
    layer_acts tmp;
    ws->has_fwd = fwd != 0;
    if (fwd == LLAMA3_FWD_SCRATCH_SHARED && slots > 0) {
        /* slot 0 first (it also holds the gradients), then the forward view over its start */
        const size_t start = cv.off;
        carve_layer(m, &cv, n, nl, LLAMA3_KEEP_ALL, 1, ws->mem ? &ws->slot[0] : &tmp);
        const size_t end = cv.off;
        cv.off = start;
        carve_layer(m, &cv, n, nl, LLAMA3_KEEP_ALL, 0, ws->mem ? &ws->fwd : &tmp);
        if (cv.off < end) cv.off = end;
        for (int i = 1; i < slots; i++) carve_layer(m, &cv, n, nl, LLAMA3_KEEP_ALL, 1, ws->mem ? &ws->slot[i] : &tmp);
    } else {
        if (fwd) carve_layer(m, &cv, n, nl, LLAMA3_KEEP_ALL, 0, ws->mem ? &ws->fwd : &tmp);
        for (int i = 0; i < slots; i++) carve_layer(m, &cv, n, nl, LLAMA3_KEEP_ALL, 1, ws->mem ? &ws->slot[i] : &tmp);
    }
    if (tpn(m) > 1) {
        void *p = carve(&cv, n * c * sizeof(float));
        if (ws->mem) ws->tp_full = p;
        p = carve(&cv, n * c * sizeof(float));
        if (ws->mem) ws->tp_stage = p;
        p = carve(&cv, nl * c * sizeof(float));
        if (ws->mem) ws->tp_local = p;
        p = carve(&cv, nl * c * act_size(m));
        if (ws->mem) ws->xn_local = p;
        if (m->layout.has_head && m->tp_gather_logits) {
            const size_t v = (size_t)m->args.vocab_size;
            p = carve(&cv, n * v * sizeof(float));
            if (ws->mem) ws->lg_full = p;
            p = carve(&cv, n * v * sizeof(float));
            if (ws->mem) ws->lg_stage = p;
        }
    }
    void *p = carve(&cv, n * scratch_cols(m) * act_size(m));
    if (ws->mem) ws->scratch = p;
    p = carve(&cv, n * sizeof(float));
    if (ws->mem) ws->rstd_scratch = p;
    ops_attn_shape s = attn_shape(m, ws->max_b, ws->max_t);
    size_t wsb = mixed(m) ? m->ops->attention_workspace_size_bf16(&s) : m->ops->attention_workspace_size(&s);
    p = carve(&cv, wsb);
    if (ws->mem) ws->attn_ws = wsb ? p : NULL;
    if (cpn(m) > 1) {
        cp_ctx cc = cp_of(m);
        cp_attn_dims dim = cp_dims(m, ws->max_b, ws->max_t);
        size_t cb = cp_workspace_bytes(&cc, m->ops, &dim, mixed(m));
        p = carve(&cv, cb);
        if (ws->mem) ws->cp_ws = p;
    }
    return cv.off;
}

size_t llama3_workspace_bytes(const llama3_model *m, int max_b, int max_t, int forward_scratch, int recompute_slots) {
    llama3_workspace ws;
    memset(&ws, 0, sizeof ws);
    ws.max_b = max_b;
    ws.max_t = max_t;
    ws.max_n = (size_t)max_b * (size_t)max_t;
    return workspace_layout(m, &ws, forward_scratch, recompute_slots);
}

llama3_workspace *llama3_workspace_create(const llama3_model *m, int max_b, int max_t, int forward_scratch,
                                          int recompute_slots, char *err, size_t errlen) {
    if (max_b <= 0 || max_t <= 0 || max_t > m->max_seq_len || recompute_slots < 0) {
        snprintf(err, errlen, "llama3 workspace: batch %d x seq_len %d invalid (max_seq_len %d)", max_b, max_t,
                 m->max_seq_len);
        return NULL;
    }
    llama3_workspace *ws = calloc(1, sizeof *ws);
    if (!ws) goto oom;
    ws->max_b = max_b;
    ws->max_t = max_t;
    ws->max_n = (size_t)max_b * (size_t)max_t;
    ws->n_slots = recompute_slots;
    if (recompute_slots > 0) {
        ws->slot = calloc((size_t)recompute_slots, sizeof *ws->slot);
        ws->slot_owner = calloc((size_t)recompute_slots, sizeof *ws->slot_owner);
        ws->slot_layer = calloc((size_t)recompute_slots, sizeof *ws->slot_layer);
        if (!ws->slot || !ws->slot_owner || !ws->slot_layer) goto oom;
    }
    ws->bytes = llama3_workspace_bytes(m, max_b, max_t, forward_scratch, recompute_slots);
    ws->mem = m->ops->alloc(ws->bytes);
    if (!ws->mem) {
        snprintf(err, errlen, "llama3 workspace: cannot allocate %.2f GiB for batch %d x seq_len %d",
                 (double)ws->bytes / (1024.0 * 1024.0 * 1024.0), max_b, max_t);
        llama3_workspace_free(m, ws);
        return NULL;
    }
    workspace_layout(m, ws, forward_scratch, recompute_slots);
    return ws;
oom:
    snprintf(err, errlen, "llama3 workspace: out of host memory");
    llama3_workspace_free(m, ws);
    return NULL;
}

void llama3_workspace_free(const llama3_model *m, llama3_workspace *ws) {
    if (!ws) return;
    if (ws->mem) m->ops->release(ws->mem);
    free(ws->slot);
    free(ws->slot_owner);
    free(ws->slot_layer);
    free(ws);
}

/* Under tensor parallel no W pass reads dL/dr (w2's weight gradient takes the gathered
 * dop, the norms their local dxn): dL/dr_l lives only from I of block l (which writes it)
 * to I of block l-1 (which reads it), so two buffers, alternating, hold every block's,
 * whatever the schedule defers. dL/dr_0 stays in its buffer until the next backward of
 * these activations: the embedding's W and the pipeline's send read it there. At tp 1
 * W of block l reads dL/dr_{l+1} (w2's output gradient), at any later time under a
 * zero-bubble schedule, so every block keeps its own. */
static int shared_dres(const llama3_model *m) { return tpn(m) > 1; }

/* Lay out (or measure, with a->mem == NULL) every view of one microbatch. */
static size_t acts_layout(const llama3_model *m, llama3_acts *a) {
    const size_t n = a->n, nl = a->nl, c = (size_t)m->args.dim, v = vocab_l(m), fl = sizeof(float), es = act_size(m);
    carver cv = {(char *)a->mem, 0};
    const int measuring = a->mem == NULL;
    void *p;
    if (cpn(m) > 1) {
        p = carve(&cv, (size_t)a->t * sizeof(int32_t));
        if (!measuring) a->pos = p;
    }
    if (m->args.attn_mask_type == LLAMA3_MASK_BLOCK_CAUSAL) { /* the whole sequences' ids, on every cp rank */
        p = carve(&cv, (size_t)a->b * (size_t)a->t * (size_t)cpn(m) * sizeof(int32_t));
        if (!measuring) a->doc = p;
    }
    if (m->args.reset_positions) {
        p = carve(&cv, a->n * sizeof(int32_t));
        if (!measuring) a->dpos = p;
    }
    if (m->layout.has_embedding) {
        p = carve(&cv, n * sizeof(int32_t));
        if (!measuring) a->inputs = p;
    }
    const int shared = shared_dres(m);
    for (int i = 0; i <= a->nb; i++) {
        p = carve(&cv, nl * c * es);
        if (!measuring) a->res[i] = p;
        if (shared && i >= 2) {
            if (!measuring) a->dres[i] = a->dres[i & 1];
            continue;
        }
        p = carve(&cv, nl * c * es);
        if (!measuring) a->dres[i] = p;
    }
    for (int i = 0; i < a->nb; i++) {
        layer_acts t;
        carve_layer(m, &cv, n, nl, a->keep[i], a->keep[i] == LLAMA3_KEEP_ALL, &t);
        if (!measuring) a->kept[i] = t;
    }
    if (m->layout.has_head) {
        p = carve(&cv, n * sizeof(int32_t));
        if (!measuring) a->targets = p;
        p = carve(&cv, fl);
        if (!measuring) a->loss_sum = p;
        p = carve(&cv, n * c * es);
        if (!measuring) a->xnf = p;
        p = carve(&cv, nl * fl);
        if (!measuring) a->rstdf = p;
        p = carve(&cv, nl * c * es);
        if (!measuring) a->dxnf = p;
        if (!mixed(m) || tpn(m) > 1) { /* bf16 at tp 1: the loss reads and writes the bf16 buffer */
            p = carve(&cv, n * v * fl);
            if (!measuring) a->logits = p;
        }
        if (mixed(m)) {
            p = carve(&cv, n * v * sizeof(uint16_t));
            if (!measuring) a->dlogits16 = p;
        }
        p = carve(&cv, n * fl);
        if (!measuring) a->losses = p;
        if (tpn(m) > 1) {
            p = carve(&cv, 3 * n * fl);
            if (!measuring) a->ce_stats = p;
        }
    }
    return cv.off;
}

unsigned llama3_keep_qkv(unsigned keep) {
    keep &= LLAMA3_KEEP_ALL;
    const unsigned qkv = LLAMA3_KEEP_Q | LLAMA3_KEEP_K | LLAMA3_KEEP_V;
    return (keep & qkv) ? keep | qkv : keep;
}

size_t llama3_acts_bytes_policy(const llama3_model *m, const unsigned *keep, int b, int t) {
    llama3_acts a;
    memset(&a, 0, sizeof a);
    a.b = b;
    a.t = t;
    a.n = (size_t)b * (size_t)t;
    a.nl = a.n / (size_t)tpn(m);
    a.nb = n_blocks(m);
    unsigned *k = calloc((size_t)(a.nb > 0 ? a.nb : 1), sizeof *k);
    if (!k) return 0;
    for (int i = 0; i < a.nb; i++) k[i] = keep ? llama3_keep_qkv(keep[i]) : LLAMA3_KEEP_ALL;
    a.keep = k;
    size_t bytes = acts_layout(m, &a);
    free(k);
    return bytes;
}

size_t llama3_acts_bytes(const llama3_model *m, int b, int t) {
    return llama3_acts_bytes_policy(m, NULL, b, t) + llama3_workspace_bytes(m, b, t, 0, 0);
}

llama3_acts *llama3_acts_create_ws(const llama3_model *m, llama3_workspace *ws, const unsigned *keep, int b, int t,
                                   char *err, size_t errlen) {
    if (b <= 0 || t <= 0 || t > m->max_seq_len || !ws || (size_t)b * (size_t)t > ws->max_n || t > ws->max_t) {
        snprintf(err, errlen,
                 "llama3 activations: batch %d x seq_len %d invalid (max_seq_len %d, workspace for %d x %d)", b, t,
                 m->max_seq_len, ws ? ws->max_b : 0, ws ? ws->max_t : 0);
        return NULL;
    }
    if (t % tpn(m) != 0) {
        snprintf(err, errlen,
                 "llama3 activations: seq_len %d does not divide by the tensor-parallel degree %d "
                 "(sequence parallel splits every sequence's tokens over its ranks)",
                 t, tpn(m));
        return NULL;
    }
    llama3_acts *a = calloc(1, sizeof *a);
    if (!a) goto oom;
    a->b = b;
    a->t = t;
    a->n = (size_t)b * (size_t)t;
    a->nl = a->n / (size_t)tpn(m);
    a->ws = ws;
    a->nb = n_blocks(m);
    a->l0 = m->layout.layer_start;
    const size_t nb1 = (size_t)a->nb + 1;
    a->res = calloc(nb1, sizeof *a->res);
    a->dres = calloc(nb1, sizeof *a->dres);
    a->kept = calloc(nb1, sizeof *a->kept);
    a->keep = calloc(nb1, sizeof *a->keep);
    a->slot = calloc(nb1, sizeof *a->slot);
    if (!a->res || !a->dres || !a->kept || !a->keep || !a->slot) goto oom;
    for (int i = 0; i < a->nb; i++) {
        a->keep[i] = keep ? llama3_keep_qkv(keep[i]) : LLAMA3_KEEP_ALL;
        a->slot[i] = -1;
        if (a->keep[i] != LLAMA3_KEEP_ALL && !ws->has_fwd) {
            snprintf(err, errlen,
                     "llama3 activations: block %d keeps less than everything but the workspace has no "
                     "forward scratch",
                     m->layout.layer_start + i);
            llama3_acts_free(m, a);
            return NULL;
        }
    }
    a->bytes = acts_layout(m, a);
    a->mem = m->ops->alloc(a->bytes);
    if (!a->mem) {
        snprintf(err, errlen, "llama3 activations: cannot allocate %.2f GiB for batch %d x seq_len %d",
                 (double)a->bytes / (1024.0 * 1024.0 * 1024.0), b, t);
        llama3_acts_free(m, a);
        return NULL;
    }
    acts_layout(m, a);
    if (a->pos) { /* the rows' global positions, for RoPE */
        int32_t *h = malloc((size_t)t * sizeof *h);
        if (!h) goto oom;
        cp_positions(cpn(m), m->cp_balanced, m->layout.cp_rank, t * cpn(m), h);
        m->ops->copy_h2d(a->pos, h, (size_t)t * sizeof *h);
        free(h);
    }
    if (llama3_needs_documents(&m->args)) { /* until the first llama3_acts_set_documents: one document a sequence */
        int32_t *zero = calloc((size_t)b * (size_t)t * (size_t)cpn(m), sizeof *zero);
        if (!zero) goto oom;
        int rc = llama3_acts_set_documents(m, a, zero, err, errlen);
        free(zero);
        if (rc != 0) {
            llama3_acts_free(m, a);
            return NULL;
        }
    }
    return a;
oom:
    snprintf(err, errlen, "llama3 activations: out of host memory");
    llama3_acts_free(m, a);
    return NULL;
}

int llama3_acts_set_documents(const llama3_model *m, llama3_acts *a, const int32_t *doc, char *err, size_t errlen) {
    const int T = a->t * cpn(m);
    if (!a->doc && !a->dpos) return 0; /* causal, positions by sequence: nothing to keep */
    if (llama3_doc_check(doc, a->b, T, err, errlen) != 0) return -1;
    /* every microbatch's documents: no host wait (ops.h copy_h2d_async) */
    if (a->doc) m->ops->copy_h2d_async(a->doc, doc, (size_t)a->b * (size_t)T * sizeof *doc);
    if (a->dpos) {
        int32_t *rows = NULL, *pos = malloc(a->n * sizeof *pos);
        if (cpn(m) > 1) rows = malloc((size_t)a->t * sizeof *rows);
        if (!pos || (cpn(m) > 1 && !rows)) {
            free(pos);
            free(rows);
            snprintf(err, errlen, "llama3 activations: out of host memory");
            return -1;
        }
        if (rows) cp_positions(cpn(m), m->cp_balanced, m->layout.cp_rank, T, rows);
        llama3_doc_positions(doc, a->b, T, rows, a->t, pos);
        m->ops->copy_h2d_async(a->dpos, pos, a->n * sizeof *pos);
        free(pos);
        free(rows);
    }
    return 0;
}

llama3_acts *llama3_acts_create(const llama3_model *m, int b, int t, char *err, size_t errlen) {
    if (b <= 0 || t <= 0 || t > m->max_seq_len) {
        snprintf(err, errlen, "llama3 activations: batch %d x seq_len %d invalid (max_seq_len %d)", b, t,
                 m->max_seq_len);
        return NULL;
    }
    llama3_workspace *ws = llama3_workspace_create(m, b, t, 0, 0, err, errlen);
    if (!ws) return NULL;
    llama3_acts *a = llama3_acts_create_ws(m, ws, NULL, b, t, err, errlen);
    if (!a) {
        llama3_workspace_free(m, ws);
        return NULL;
    }
    a->own_ws = 1;
    return a;
}

void llama3_acts_free(const llama3_model *m, llama3_acts *a) {
    if (!a) return;
    if (a->ws && a->slot) /* a W pass that never ran must not leave its slot taken */
        for (int i = 0; i < a->nb; i++)
            if (a->slot[i] >= 0) a->ws->slot_owner[a->slot[i]] = NULL;
    if (a->mem) m->ops->release(a->mem);
    if (a->logits_copy) m->ops->release(a->logits_copy);
    if (a->own_ws) llama3_workspace_free(m, a->ws);
    free(a->res);
    free(a->dres);
    free(a->kept);
    free(a->keep);
    free(a->slot);
    free(a);
}

double llama3_tp_traffic_bytes(const llama3_model *m, const unsigned *keep, int b, int t) {
    const int P = tpn(m);
    if (P == 1) return 0.0;
    const double rows = (double)b * (double)t / P, c = m->args.dim;
    const double ag = (P - 1) * rows * c * (double)act_size(m), rs = (P - 1) * rows * c * sizeof(float);
    double bytes = 0.0;
    for (int i = 0; i < n_blocks(m); i++) {
        const unsigned k = keep ? keep[i] : LLAMA3_KEEP_ALL;
        /* forward: gather xn1 and xn2, reduce wo's and w2's sums; backward: gather dL/dr and
         * dL/dh, reduce dL/dxn2 and dL/dxn1; recomputing a norm output or h repeats its own */
        bytes += 2 * ag + 2 * rs + 2 * ag + 2 * rs;
        if (!(k & LLAMA3_KEEP_XN1)) bytes += ag;
        if (!(k & LLAMA3_KEEP_H)) bytes += rs;
        if (!(k & LLAMA3_KEEP_XN2)) bytes += ag;
    }
    if (m->layout.has_embedding) bytes += rs + ag; /* the lookup's sums; dL/dr_0 for its W */
    if (m->layout.has_head) bytes += ag + rs;      /* the final norm's output; dL/dxnf */
    return bytes;
}

int llama3_acts_keep_logits(const llama3_model *m, llama3_acts *a, int keep) {
    if (!keep) {
        if (a->logits_copy) m->ops->release(a->logits_copy);
        a->logits_copy = NULL;
        return 0;
    }
    if (a->logits_copy || !m->layout.has_head) return a->logits_copy ? 0 : -1;
    a->logits_copy = m->ops->alloc(a->n * vocab_l(m) * sizeof(float));
    return a->logits_copy ? 0 : -1;
}

const float *llama3_logits(const llama3_acts *a) {
    if (a->logits_copy) return a->logits_copy;
    return a->has_targets ? NULL : a->logits;
}

static int res_index(const llama3_acts *a, int l) {
    int i = l - a->l0;
    if (i < 0 || i > a->nb) {
        fprintf(stderr, "llama3: residual r_%d is not held by these activations (r_%d..r_%d)\n", l, a->l0,
                a->l0 + a->nb);
        abort();
    }
    return i;
}

void *llama3_acts_residual(llama3_acts *a, int l) { return a->res[res_index(a, l)]; }
void *llama3_acts_residual_grad(llama3_acts *a, int l) { return a->dres[res_index(a, l)]; }

/* 1 when fields b0 and b1 (LLAMA3_KEEP_*) of block l's views come from one set of buffers
 * (both kept, or both in the forward workspace or the recompute slot): carved in that
 * order, the second lies past the first whatever the allocator did with the sets. The
 * paired linears (lin_fwd_pair) are chosen on this, never on the addresses, so a step's
 * op sequence is the same on every backend and in every run. */
static int view_together(const llama3_model *m, const llama3_acts *a, int l, unsigned b0, unsigned b1) {
    const unsigned keep = a->keep[local_block(m, l)];
    return keep == LLAMA3_KEEP_ALL || !(keep & b0) == !(keep & b1);
}

/* The view of block l: kept fields from the microbatch, the others from the forward
 * scratch (forward) or the recompute slot (backward). */
static layer_acts block_view(const llama3_acts *a, int bl, int backward) {
    const unsigned keep = a->keep[bl];
    if (keep == LLAMA3_KEEP_ALL) return a->kept[bl];
    const layer_acts *k = &a->kept[bl];
    const layer_acts *o = backward ? &a->ws->slot[a->slot[bl]] : &a->ws->fwd;
    layer_acts v;
#define PICK(bit, f) v.f = (keep & (bit)) ? k->f : o->f
    PICK(LLAMA3_KEEP_XN1, xn1);
    PICK(LLAMA3_KEEP_XN1, rstd1);
    PICK(LLAMA3_KEEP_Q, q);
    PICK(LLAMA3_KEEP_K, k);
    PICK(LLAMA3_KEEP_V, v);
    PICK(LLAMA3_KEEP_ATT, att);
    PICK(LLAMA3_KEEP_ATT, lse);
    PICK(LLAMA3_KEEP_ATT, att_amax);
    PICK(LLAMA3_KEEP_H, h);
    PICK(LLAMA3_KEEP_XN2, xn2);
    PICK(LLAMA3_KEEP_XN2, rstd2);
    PICK(LLAMA3_KEEP_A, a);
    PICK(LLAMA3_KEEP_G, g);
    PICK(LLAMA3_KEEP_S, s);
    PICK(LLAMA3_KEEP_S, s_amax);
#undef PICK
    v.dh = backward ? o->dh : NULL;
    v.dxn1l = backward ? o->dxn1l : NULL;
    v.dxn2l = backward ? o->dxn2l : NULL;
    v.dop = backward ? o->dop : NULL;
    return v;
}

/* ----------------------------------------------------------------------------
 * parameters */

/* How tensor parallel splits a parameter: not at all (every rank holds it), by rows
 * (column-parallel linears, the vocabulary of the embedding and the output), or by
 * columns (row-parallel linears). */
enum { SPLIT_NONE, SPLIT_ROWS, SPLIT_COLS };

static void add_param(llama3_model *m, size_t *off, const char *name, int unit, int64_t rows, int64_t cols, int ones,
                      double std, double lo, double hi, int linear, int split) {
    const int i = m->n_params++;
    const int64_t P = m->layout.tp_size, r = m->layout.tp_rank;
    llama3_param *p = &m->params[i];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->unit = unit;
    p->ndim = cols > 0 ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols > 0 ? cols : 0;
    p->box_start[0] = p->box_start[1] = 0;
    p->box_shape[0] = p->shape[0];
    p->box_shape[1] = p->shape[1];
    if (split == SPLIT_ROWS) {
        p->box_shape[0] = rows / P;
        p->box_start[0] = r * p->box_shape[0];
    } else if (split == SPLIT_COLS) {
        p->box_shape[1] = cols / P;
        p->box_start[1] = r * p->box_shape[1];
    }
    p->tp_replicated = split == SPLIT_NONE;
    p->numel = (size_t)p->box_shape[0] * (size_t)(cols > 0 ? p->box_shape[1] : 1);
    p->offset = *off;
    p->init_ones = ones;
    p->init_std = std;
    p->init_lo = lo;
    p->init_hi = hi;
    *off += p->numel;
    llama3_unit *u = &m->units[unit];
    if (u->n_params == 0) u->first_param = i;
    u->n_params++;
    u->numel += p->numel;
    if (linear) {
        m->is_linear[i] = 1;
        m->linears[i].param = i;
        m->linears[i].name = p->name;
        m->linears[i].global_out = p->shape[0];
        m->linears[i].global_in = p->shape[1];
        m->linears[i].out = (int)p->box_shape[0];
        m->linears[i].in = (int)p->box_shape[1];
        m->linears[i].style = split == SPLIT_ROWS ? MODEL_LINEAR_COLWISE
            : split == SPLIT_COLS                 ? MODEL_LINEAR_ROWWISE
                                                  : MODEL_LINEAR_REPLICATED;
        m->linears[i].impl = &default_linear;
    }
}

static void begin_unit(llama3_model *m, int u, llama3_unit_kind kind, int layer, size_t off) {
    llama3_unit *x = &m->units[u];
    x->kind = kind;
    x->layer = layer;
    x->offset = off;
    if (kind == LLAMA3_UNIT_EMBEDDING) snprintf(x->name, sizeof x->name, "tok_embeddings");
    else if (kind == LLAMA3_UNIT_HEAD) snprintf(x->name, sizeof x->name, "norm+output");
    else snprintf(x->name, sizeof x->name, "layers.%d", layer);
}

static int alloc_own_storage(llama3_model *m, char *err, size_t errlen);

int llama3_model_init(llama3_model *m, const llama3_args *a, int max_seq_len, const tetra_ops *ops, char *err,
                      size_t errlen) {
    llama3_layout l = llama3_layout_full(a);
    return llama3_model_init_layout(m, a, &l, LLAMA3_STORAGE_OWN, max_seq_len, ops, err, errlen);
}

int llama3_model_init_layout(llama3_model *m, const llama3_args *a, const llama3_layout *layout, llama3_storage storage,
                             int max_seq_len, const tetra_ops *ops, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    const char *fl = a->flavor ? a->flavor : "model";
    if (a->dim <= 0 || a->n_layers <= 0 || a->n_heads <= 0 || a->n_kv_heads <= 0 || a->vocab_size <= 0 ||
        a->dim % a->n_heads != 0 || a->n_heads % a->n_kv_heads != 0 || llama3_head_dim(a) % 2 != 0) {
        snprintf(err, errlen,
                 "llama3 %s: invalid shape (dim %d, n_heads %d, n_kv_heads %d): dim must divide into heads of "
                 "even size and n_heads must be a multiple of n_kv_heads",
                 fl, a->dim, a->n_heads, a->n_kv_heads);
        return -1;
    }
    if (max_seq_len <= 0) {
        snprintf(err, errlen, "llama3: max_seq_len %d must be positive", max_seq_len);
        return -1;
    }
    if (layout->layer_start < 0 || layout->layer_end > a->n_layers || layout->layer_start > layout->layer_end ||
        (layout->layer_start == layout->layer_end && !layout->has_embedding && !layout->has_head)) {
        snprintf(err, errlen, "llama3 %s: layout blocks [%d, %d) outside the model's %d blocks, or empty", fl,
                 layout->layer_start, layout->layer_end, a->n_layers);
        return -1;
    }
    const int P = layout->tp_size;
    if (P < 1 || layout->tp_rank < 0 || layout->tp_rank >= P) {
        snprintf(err, errlen, "llama3 %s: tensor-parallel rank %d of %d", fl, layout->tp_rank, P);
        return -1;
    }
    if (a->n_heads % P || a->n_kv_heads % P || a->vocab_size % P || llama3_ffn_hidden(a) % P) {
        snprintf(
            err, errlen,
            "llama3 %s: tensor parallel degree %d must divide n_heads %d, n_kv_heads %d, vocab_size %d and the "
            "FFN hidden size %lld (each rank holds a whole share of the heads, the vocabulary and the hidden units)",
            fl, P, a->n_heads, a->n_kv_heads, a->vocab_size, (long long)llama3_ffn_hidden(a));
        return -1;
    }
    m->args = *a;
    m->ops = ops;
    m->max_seq_len = max_seq_len;
    m->layout = *layout;
    m->compute_dtype = TETRA_F32;

    const int nb = layout->layer_end - layout->layer_start;
    const int64_t C = a->dim, D = llama3_head_dim(a), HD = (int64_t)a->n_heads * D, KVD = (int64_t)a->n_kv_heads * D;
    const int64_t F = llama3_ffn_hidden(a), V = a->vocab_size;
    m->n_units = (layout->has_embedding ? 1 : 0) + nb + (layout->has_head ? 1 : 0);
    const size_t np = (size_t)(2 + P_PER_BLOCK * nb + (layout->has_embedding ? 1 : 0));
    m->params = calloc(np, sizeof *m->params);
    m->linears = calloc(np, sizeof *m->linears);
    m->is_linear = calloc(np, sizeof *m->is_linear);
    m->grad_fresh = calloc(np, sizeof *m->grad_fresh);
    m->units = calloc((size_t)m->n_units, sizeof *m->units);
    m->unit_offset = calloc((size_t)m->n_units, sizeof *m->unit_offset);
    m->unit_numel = calloc((size_t)m->n_units, sizeof *m->unit_numel);
    m->unit_params = calloc((size_t)m->n_units, sizeof *m->unit_params);
    m->unit_grads = calloc((size_t)m->n_units, sizeof *m->unit_grads);
    if (!m->params || !m->linears || !m->is_linear || !m->grad_fresh || !m->units || !m->unit_offset ||
        !m->unit_numel || !m->unit_params || !m->unit_grads) {
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
    int u = 0;
    if (layout->has_embedding) {
        begin_unit(m, u, LLAMA3_UNIT_EMBEDDING, -1, off);
        add_param(m, &off, "tok_embeddings.weight", u, V, C, 0, 1.0, -inf, inf, 0, SPLIT_ROWS);
        u++;
    }
    for (int l = layout->layer_start; l < layout->layer_end; l++, u++) {
        const double sd = s02 / sqrt(2.0 * (l + 1));
        begin_unit(m, u, LLAMA3_UNIT_BLOCK, l, off);
#define BLOCK_PARAM(suffix, rows, cols, ones, std, lin, split)                                                         \
    snprintf(name, sizeof name, "layers.%d.%s", l, suffix);                                                            \
    add_param(m, &off, name, u, rows, cols, ones, std, -2.0, 2.0, lin, split)
        BLOCK_PARAM("attention.wq.weight", HD, C, 0, s02, 1, SPLIT_ROWS);
        BLOCK_PARAM("attention.wk.weight", KVD, C, 0, s02, 1, SPLIT_ROWS);
        BLOCK_PARAM("attention.wv.weight", KVD, C, 0, s02, 1, SPLIT_ROWS);
        BLOCK_PARAM("attention.wo.weight", C, HD, 0, sd, 1, SPLIT_COLS);
        BLOCK_PARAM("feed_forward.w1.weight", F, C, 0, s02, 1, SPLIT_ROWS);
        BLOCK_PARAM("feed_forward.w2.weight", C, F, 0, sd, 1, SPLIT_COLS);
        BLOCK_PARAM("feed_forward.w3.weight", F, C, 0, sd, 1, SPLIT_ROWS);
        BLOCK_PARAM("attention_norm.weight", C, 0, 1, 0.0, 0, SPLIT_NONE);
        BLOCK_PARAM("ffn_norm.weight", C, 0, 1, 0.0, 0, SPLIT_NONE);
#undef BLOCK_PARAM
        /* the projections that follow another on the same input (block_forward_ops and
         * llama3_block_backward_weight call them in this order) */
        model_linear *lb = &m->linears[pidx_block(m, l, 0)];
        lb[P_WK].input_from = &lb[P_WQ];
        lb[P_WV].input_from = &lb[P_WK];
        lb[P_W3].input_from = &lb[P_W1];
    }
    if (layout->has_head) {
        begin_unit(m, u, LLAMA3_UNIT_HEAD, -1, off);
        add_param(m, &off, "norm.weight", u, C, 0, 1, 0.0, 0.0, 0.0, 0, SPLIT_NONE);
        const double so = 1.0 / sqrt((double)C);
        add_param(m, &off, "output.weight", u, V, C, 0, so, -3.0 * so, 3.0 * so, 1, SPLIT_ROWS);
        u++;
    }
    m->total_numel = off;
    for (int i = 0; i < m->n_units; i++) {
        m->unit_offset[i] = m->units[i].offset;
        m->unit_numel[i] = m->units[i].numel;
    }

    if (storage == LLAMA3_STORAGE_NONE) return 0;
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

    if (storage == LLAMA3_STORAGE_OWN && alloc_own_storage(m, err, errlen)) {
        llama3_model_free(m);
        return -1;
    }
    return 0;
}

static void bind_own_storage(llama3_model *m) {
    for (int u = 0; u < m->n_units; u++) {
        m->unit_params[u] =
            mixed(m) ? (void *)(m->param_bf16 + m->unit_offset[u]) : (void *)(m->param_mem + m->unit_offset[u]);
        m->unit_grads[u] = m->grad_mem + m->unit_offset[u];
    }
}

static int alloc_own_storage(llama3_model *m, char *err, size_t errlen) {
    const size_t bytes = m->total_numel * sizeof(float);
    m->own_storage = 1;
    m->param_mem = m->ops->alloc(bytes);
    m->grad_mem = m->ops->alloc(bytes);
    if (!m->param_mem || !m->grad_mem) {
        snprintf(err, errlen, "llama3 %s: cannot allocate 2 x %.2f GiB for parameters and gradients",
                 m->args.flavor ? m->args.flavor : "model", (double)bytes / (1024.0 * 1024.0 * 1024.0));
        return -1;
    }
    m->ops->fill(m->param_mem, 0.0f, m->total_numel);
    m->ops->fill(m->grad_mem, 0.0f, m->total_numel);
    bind_own_storage(m);
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
    free(m->linears);
    free(m->is_linear);
    free(m->grad_fresh);
    free(m->units);
    free(m->unit_offset);
    free(m->unit_numel);
    free(m->unit_params);
    free(m->unit_grads);
    memset(m, 0, sizeof *m);
}

int llama3_model_set_compute_dtype(llama3_model *m, tetra_dtype t, char *err, size_t errlen) {
    if (t != TETRA_F32 && t != TETRA_BF16) {
        snprintf(err, errlen, "llama3: compute dtype %s is not supported (float32 or bfloat16)", tetra_dtype_name(t));
        return -1;
    }
    if (m->own_storage) {
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
    }
    m->compute_dtype = t;
    if (m->own_storage) {
        bind_own_storage(m);
        llama3_sync_compute_params(m);
    }
    return 0;
}

void llama3_sync_compute_params(llama3_model *m) {
    if (m->own_storage && mixed(m)) m->ops->cast_f32_to_bf16(m->param_bf16, m->param_mem, m->total_numel);
}

const llama3_param *llama3_find_param(const llama3_model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

void llama3_zero_grads(llama3_model *m) {
    if (m->grad_mem) m->ops->fill(m->grad_mem, 0.0f, m->total_numel);
}

void llama3_grads_fresh(llama3_model *m) { memset(m->grad_fresh, 1, (size_t)m->n_params); }

void llama3_init_param_range(const llama3_param *p, uint64_t seed, size_t start, size_t count, float *host_out) {
    if (p->init_ones) {
        for (size_t j = 0; j < count; j++) host_out[j] = 1.0f;
        return;
    }
    llama3_rng_trunc_normal_fill(host_out, seed, p->name, start, count, p->init_std, p->init_lo, p->init_hi);
}

void llama3_init_weights(llama3_model *m, uint64_t seed) {
    if (!m->own_storage) {
        fprintf(stderr, "llama3_init_weights: the model has no storage of its own (initialise the shards)\n");
        abort();
    }
    /* Drawn on the host in chunks of rows of the rank's box, then copied: the values
     * are a function of (seed, name, global index) only, so chunking changes nothing. */
    const size_t chunk = (size_t)1 << 20;
    float *host = malloc(chunk * sizeof(float));
    if (!host) {
        fprintf(stderr, "llama3_init_weights: out of host memory\n");
        abort();
    }
    for (int i = 0; i < m->n_params; i++) {
        const llama3_param *p = &m->params[i];
        const size_t cols = p->ndim == 2 ? (size_t)p->shape[1] : 1, bcols = p->ndim == 2 ? (size_t)p->box_shape[1] : 1;
        const size_t brows = (size_t)p->box_shape[0];
        if (bcols == cols) { /* whole rows: one run of the global row-major order */
            const size_t g0 = (size_t)p->box_start[0] * cols;
            for (size_t s = 0; s < p->numel; s += chunk) {
                size_t cnt = p->numel - s < chunk ? p->numel - s : chunk;
                llama3_init_param_range(p, seed, g0 + s, cnt, host);
                m->ops->copy_h2d(m->param_mem + p->offset + s, host, cnt * sizeof(float));
            }
        } else { /* a column block: one run per row */
            for (size_t r = 0; r < brows; r++) {
                const size_t g0 = ((size_t)p->box_start[0] + r) * cols + (size_t)p->box_start[1];
                for (size_t s = 0; s < bcols; s += chunk) {
                    size_t cnt = bcols - s < chunk ? bcols - s : chunk;
                    llama3_init_param_range(p, seed, g0 + s, cnt, host);
                    m->ops->copy_h2d(m->param_mem + p->offset + r * bcols + s, host, cnt * sizeof(float));
                }
            }
        }
    }
    free(host);
    llama3_sync_compute_params(m);
}

/* ----------------------------------------------------------------------------
 * sequence parallel (P > 1): entering and leaving the parallel regions */

/* The GEMMs next to a sequence-parallel collective, for a block of rows: what an
 * all-gathered activation feeds, or what produces a partial sum to reduce-scatter. They
 * run once per rank's block of rows, in both modes: after the collective (sync) or as
 * the blocks arrive and before they leave (async TP, m->tp_async; parallel/tp.h). The
 * same calls on the same shapes give the same bits in any order; one call over every
 * row would not always (BLAS libraries pick other kernels for other sizes). */
enum {
    ROWS_QKV,      /* q, k, v = xn1 W^T (the projections in `compute`) */
    ROWS_WO,       /* tp_full = att Wo^T */
    ROWS_W13,      /* a, g = xn2 W1^T, xn2 W3^T (those in `compute`) */
    ROWS_W2,       /* tp_full = s W2^T */
    ROWS_DS,       /* scratch = dop W2 */
    ROWS_DXN2,     /* tp_full = da W1 + dg W3 */
    ROWS_DATT,     /* scratch = dh Wo */
    ROWS_DXN1,     /* tp_full = dq Wq + dk Wk + dv Wv */
    ROWS_LOGITS,   /* logits = xnf Output^T */
    ROWS_DXNF,     /* tp_full = dlogits Output */
    ROWS_EMBEDDING /* tp_full = this rank's vocabulary rows of the embedding (zeros elsewhere) */
};

typedef struct {
    llama3_model *m;
    llama3_acts *a;
    int l, what;
    const layer_acts *t;
    unsigned compute;
    int begun; /* the linears were told the whole operand (rows_begin): calls pass their row */
} rows_job;

static void rows_run(void *user, size_t r0, size_t rows) {
    const rows_job *j = user;
    llama3_model *m = j->m;
    llama3_acts *a = j->a;
    const layer_acts *t = j->t;
    const int l = j->l, n = (int)rows;
    const int rr = j->begun ? (int)r0 : -1; /* the block's first row in the announced operand */
    const size_t C = (size_t)m->args.dim, HD = hd_l(m), KVD = kvd_l(m), F = ffn_l(m), V = vocab_l(m);
#define AT(p, cols) act_at(m, (void *)(p), r0 *(cols))
    float *tpf = a->ws->tp_full + r0 * C;
    switch (j->what) {
    case ROWS_QKV:
        if (qkv_fused_forward(m, l, j->compute)) {
            const size_t qkv = (size_t)qkv_cols(m, l);
            lin_fwd_qkv(m, l, AT(a->ws->scratch, qkv), AT(t->xn1, C), n);
            break;
        }
        if (j->compute & LLAMA3_KEEP_Q) lin_fwd(m, pidx_block(m, l, P_WQ), AT(t->q, HD), AT(t->xn1, C), n, rr, 0.0f);
        if ((j->compute & (LLAMA3_KEEP_K | LLAMA3_KEEP_V)) == (LLAMA3_KEEP_K | LLAMA3_KEEP_V) &&
            lin_fwd_pair(m, pidx_block(m, l, P_WK), pidx_block(m, l, P_WV), AT(t->k, KVD), AT(t->v, KVD), AT(t->xn1, C),
                         n))
            break;
        if (j->compute & LLAMA3_KEEP_K) lin_fwd(m, pidx_block(m, l, P_WK), AT(t->k, KVD), AT(t->xn1, C), n, rr, 0.0f);
        if (j->compute & LLAMA3_KEEP_V) lin_fwd(m, pidx_block(m, l, P_WV), AT(t->v, KVD), AT(t->xn1, C), n, rr, 0.0f);
        break;
    case ROWS_WO: lin_fwd_to(m, pidx_block(m, l, P_WO), TETRA_F32, tpf, AT(t->att, HD), n, rr, 0.0f); break;
    case ROWS_W13:
        if ((j->compute & (LLAMA3_KEEP_A | LLAMA3_KEEP_G)) == (LLAMA3_KEEP_A | LLAMA3_KEEP_G) &&
            view_together(m, a, l, LLAMA3_KEEP_A, LLAMA3_KEEP_G) &&
            lin_fwd_pair(m, pidx_block(m, l, P_W1), pidx_block(m, l, P_W3), AT(t->a, F), AT(t->g, F), AT(t->xn2, C), n))
            break;
        if (j->compute & LLAMA3_KEEP_A) lin_fwd(m, pidx_block(m, l, P_W1), AT(t->a, F), AT(t->xn2, C), n, rr, 0.0f);
        if (j->compute & LLAMA3_KEEP_G) lin_fwd(m, pidx_block(m, l, P_W3), AT(t->g, F), AT(t->xn2, C), n, rr, 0.0f);
        break;
    case ROWS_W2: lin_fwd_to(m, pidx_block(m, l, P_W2), TETRA_F32, tpf, AT(t->s, F), n, rr, 0.0f); break;
    case ROWS_DS: lin_bwd_input(m, pidx_block(m, l, P_W2), AT(a->ws->scratch, F), AT(t->dop, C), n, rr, 0.0f); break;
    case ROWS_DXN2:
        lin_bwd_input_to(m, pidx_block(m, l, P_W1), TETRA_F32, tpf, AT(t->a, F), n, rr, 0.0f);
        lin_bwd_input_to(m, pidx_block(m, l, P_W3), TETRA_F32, tpf, AT(t->g, F), n, rr, 1.0f);
        break;
    case ROWS_DATT: lin_bwd_input(m, pidx_block(m, l, P_WO), AT(a->ws->scratch, HD), AT(t->dh, C), n, rr, 0.0f); break;
    case ROWS_DXN1:
        if (qkv_fused(m, l)) { /* t->q holds the rows of dqkv */
            lin_bwd_input_qkv(m, l, TETRA_F32, tpf, AT(t->q, (size_t)qkv_cols(m, l)), n);
            break;
        }
        lin_bwd_input_to(m, pidx_block(m, l, P_WQ), TETRA_F32, tpf, AT(t->q, HD), n, rr, 0.0f);
        lin_bwd_input_to(m, pidx_block(m, l, P_WK), TETRA_F32, tpf, AT(t->k, KVD), n, rr, 1.0f);
        lin_bwd_input_to(m, pidx_block(m, l, P_WV), TETRA_F32, tpf, AT(t->v, KVD), n, rr, 1.0f);
        break;
    case ROWS_LOGITS:
        if (mixed(m)) lin_fwd_to(m, pidx_output(m), TETRA_BF16, a->dlogits16 + r0 * V, AT(a->xnf, C), n, rr, 0.0f);
        else lin_fwd_to(m, pidx_output(m), TETRA_F32, a->logits + r0 * V, AT(a->xnf, C), n, rr, 0.0f);
        break;
    case ROWS_DXNF: {
        const void *dl = mixed(m) ? (const void *)(a->dlogits16 + r0 * V) : (const void *)(a->logits + r0 * V);
        lin_bwd_input_to(m, pidx_output(m), TETRA_F32, tpf, dl, n, rr, 0.0f);
        break;
    }
    case ROWS_EMBEDDING: {
        const llama3_param *p = &m->params[pidx_embedding(m)];
        const int v0 = (int)p->box_start[0], vl = (int)p->box_shape[0];
        if (mixed(m)) { /* bf16 rows, exact in fp32 */
            void *tmp = AT(a->ws->scratch, C);
            m->ops->embedding_forward_bf16(tmp, a->inputs + r0, param_ptr(m, pidx_embedding(m)), n, (int)C, v0, vl);
            m->ops->cast_bf16_to_f32(tpf, tmp, rows * C);
        } else {
            m->ops->embedding_forward(tpf, a->inputs + r0, param_ptr(m, pidx_embedding(m)), n, (int)C, v0, vl);
        }
        break;
    }
    }
#undef AT
}

/* Announce the operands of a job's linears before its blocks run (model_linear_impl's
 * begin_rows): `local` is this rank's rows of a row-gathered input (ROW_SHARD), or NULL
 * when the job reads a buffer that already holds every row (WHOLE, or COL_SHARD for the
 * row-parallel inputs and the column-parallel output gradients). */
static void rows_begin(rows_job *j, const void *local) {
    llama3_model *m = j->m;
    llama3_acts *a = j->a;
    const layer_acts *t = j->t;
    const int l = j->l;
    const size_t C = (size_t)m->args.dim, HD = hd_l(m), KVD = kvd_l(m), F = ffn_l(m), V = vocab_l(m);
    const model_rows_layout in = local ? MODEL_ROWS_ROW_SHARD : MODEL_ROWS_WHOLE, cols = MODEL_ROWS_COL_SHARD;
    const size_t rows = local ? a->nl : a->n, n = a->n;
    j->begun = 1;
    switch (j->what) {
    case ROWS_QKV: {
        const void *x = local ? local : t->xn1;
        if (j->compute & LLAMA3_KEEP_Q) lin_begin(m, pidx_block(m, l, P_WQ), MODEL_OPERAND_X, x, rows, C, in);
        if (j->compute & LLAMA3_KEEP_K) lin_begin(m, pidx_block(m, l, P_WK), MODEL_OPERAND_X, x, rows, C, in);
        if (j->compute & LLAMA3_KEEP_V) lin_begin(m, pidx_block(m, l, P_WV), MODEL_OPERAND_X, x, rows, C, in);
        break;
    }
    case ROWS_WO: lin_begin(m, pidx_block(m, l, P_WO), MODEL_OPERAND_X, t->att, n, HD, cols); break;
    case ROWS_W13: {
        const void *x = local ? local : t->xn2;
        if (j->compute & LLAMA3_KEEP_A) lin_begin(m, pidx_block(m, l, P_W1), MODEL_OPERAND_X, x, rows, C, in);
        if (j->compute & LLAMA3_KEEP_G) lin_begin(m, pidx_block(m, l, P_W3), MODEL_OPERAND_X, x, rows, C, in);
        break;
    }
    case ROWS_W2: lin_begin(m, pidx_block(m, l, P_W2), MODEL_OPERAND_X, t->s, n, F, cols); break;
    case ROWS_DS: lin_begin(m, pidx_block(m, l, P_W2), MODEL_OPERAND_DY, local, rows, C, in); break;
    case ROWS_DXN2:
        lin_begin(m, pidx_block(m, l, P_W1), MODEL_OPERAND_DY, t->a, n, F, cols);
        lin_begin(m, pidx_block(m, l, P_W3), MODEL_OPERAND_DY, t->g, n, F, cols);
        break;
    case ROWS_DATT: lin_begin(m, pidx_block(m, l, P_WO), MODEL_OPERAND_DY, local, rows, C, in); break;
    case ROWS_DXN1:
        lin_begin(m, pidx_block(m, l, P_WQ), MODEL_OPERAND_DY, t->q, n, HD, cols);
        lin_begin(m, pidx_block(m, l, P_WK), MODEL_OPERAND_DY, t->k, n, KVD, cols);
        lin_begin(m, pidx_block(m, l, P_WV), MODEL_OPERAND_DY, t->v, n, KVD, cols);
        break;
    case ROWS_LOGITS: lin_begin(m, pidx_output(m), MODEL_OPERAND_X, local ? local : a->xnf, rows, C, in); break;
    case ROWS_DXNF: {
        const void *dl = mixed(m) ? (const void *)a->dlogits16 : (const void *)a->logits;
        lin_begin(m, pidx_output(m), MODEL_OPERAND_DY, dl, n, V, cols);
        break;
    }
    case ROWS_EMBEDDING: j->begun = 0; break;
    }
}

/* job over every row: one call at tp 1, one per rank's block of rows under tensor
 * parallel (the shapes the collectives' paths use, so recomputation gives the same bits) */
static void rows_all(llama3_model *m, llama3_acts *a, rows_job *job) {
    if (tpn(m) == 1) {
        rows_run(job, 0, a->n);
        return;
    }
    rows_begin(job, NULL);
    for (int q = 0; q < tpn(m); q++) rows_run(job, (size_t)q * a->nl, a->nl);
}

/* full[N, C] = every rank's rows local[N/P, C] (compute dtype), then job over every block
 * of rows (the column-parallel linears after the collective) */
static void sp_gather_then(llama3_model *m, llama3_acts *a, void *full, const void *local, rows_job *job) {
    rows_begin(job, local);
    tp_column_parallel_in(m->ops, m->ctx.tp, full, local, a->nl, (size_t)m->args.dim, m->compute_dtype, m->tp_async,
                          rows_run, job);
}

static void sp_gather(llama3_model *m, llama3_acts *a, void *full, const void *local) {
    tp_all_gather_rows(m->ctx.tp, full, local, a->nl, (size_t)m->args.dim, m->compute_dtype);
}

/* job writes the partial sums ws->tp_full[N, C] (fp32) block by block (the row-parallel
 * linears before the collective); out_l[N/P, C] = this rank's rows of them reduced over the
 * group, with res_l plus that residual, rounded once to the compute dtype */
static void sp_exit(llama3_model *m, llama3_acts *a, rows_job *job, void *out_l, const void *res_l) {
    const tetra_ops *ops = m->ops;
    llama3_workspace *ws = a->ws;
    const size_t nc = a->nl * (size_t)m->args.dim;
    rows_begin(job, NULL);
    tp_row_parallel_out(ops, m->ctx.tp, ws->tp_local, ws->tp_full, ws->tp_stage, a->nl, (size_t)m->args.dim,
                        m->tp_async, rows_run, job);
    if (!mixed(m)) {
        if (res_l) ops->add(out_l, res_l, ws->tp_local, nc);
        else ops->copy(out_l, ws->tp_local, nc * sizeof(float));
        return;
    }
    if (res_l) {
        ops->cast_bf16_to_f32(ws->tp_stage, res_l, nc);
        ops->add(ws->tp_stage, ws->tp_stage, ws->tp_local, nc);
        ops->cast_f32_to_bf16(out_l, ws->tp_stage, nc);
    } else {
        ops->cast_f32_to_bf16(out_l, ws->tp_local, nc);
    }
}

/* ----------------------------------------------------------------------------
 * forward */

void llama3_forward_embedding(llama3_model *m, llama3_acts *a, const int32_t *inputs) {
    const tetra_ops *ops = m->ops;
    const int pe = pidx_embedding(m);
    if (pe < 0) {
        fprintf(stderr, "llama3_forward_embedding: this layout holds no embedding\n");
        abort();
    }
    const llama3_param *p = &m->params[pe];
    const int v0 = (int)p->box_start[0], vl = (int)p->box_shape[0], n = (int)a->n, C = m->args.dim;
    ops->copy_h2d_async(a->inputs, inputs, a->n * sizeof(int32_t)); /* no host wait (model.h) */
    if (tpn(m) > 1) {
        /* vocab parallel: a token's row comes from its owner, zeros from the others, so the
         * reduce-scatter to this rank's rows sums exactly */
        rows_job job = {m, a, -1, ROWS_EMBEDDING, NULL, 0, 0};
        sp_exit(m, a, &job, a->res[0], NULL);
        return;
    }
    if (mixed(m)) ops->embedding_forward_bf16(a->res[0], a->inputs, param_ptr(m, pe), n, C, v0, vl);
    else ops->embedding_forward(a->res[0], a->inputs, param_ptr(m, pe), n, C, v0, vl);
}

/* The ops of block l's forward whose outputs are in `compute` (LLAMA3_KEEP_* bits), into
 * the view t; with `output` also r_{l+1}. The forward computes everything; the I pass
 * of a block that did not keep everything recomputes the rest, bit for bit. Under
 * tensor parallel the norms run on this rank's rows and are all-gathered; wo and w2 give
 * partial sums, reduce-scattered back to the rows and added to the residual. */
static void block_forward_ops(llama3_model *m, llama3_acts *a, int l, const layer_acts *t, unsigned compute,
                              int output) {
    const tetra_ops *ops = m->ops;
    const int n = (int)a->n, nl = (int)a->nl, H = heads_l(m), KV = kv_l(m), tp = tpn(m) > 1;
    const size_t ff = a->n * ffn_l(m);
    const int bl = local_block(m, l);
    llama3_workspace *ws = a->ws;
    const void *x = a->res[bl];

    /* attention: h = x + wo(attn(rope(wq xn1), rope(wk xn1), wv xn1)) */
    rows_job qkv = {m, a, l, ROWS_QKV, t, compute & (LLAMA3_KEEP_Q | LLAMA3_KEEP_K | LLAMA3_KEEP_V), 0};
    if (compute & LLAMA3_KEEP_XN1) {
        const void *w = param_ptr(m, pidx_block(m, l, P_ATTN_NORM));
        if (tp) { /* the projections run on the gathered rows as they arrive */
            rmsnorm_fwd(m, ws->xn_local, t->rstd1, x, w, nl);
            sp_gather_then(m, a, t->xn1, ws->xn_local, &qkv);
            qkv.compute = 0;
        } else {
            /* wq's input (wk and wv read wq's cast of it): its amax comes with it */
            float *am = (qkv.compute & LLAMA3_KEEP_Q) && mixed(m)
                ? lin_amax_slot(m, pidx_block(m, l, P_WQ), MODEL_OPERAND_X, t->xn1, n)
                : NULL;
            rmsnorm_fwd_amax(m, t->xn1, t->rstd1, x, w, n, am);
        }
    }
    if (qkv.compute) rows_all(m, a, &qkv); /* projections whose input was kept (not gathered now) */
    const int hd = (int)hd_l(m), kvd = (int)kvd_l(m);
    if (qkv_fused_forward(m, l, compute)) { /* q|k|v rows in the scratch */
        const int cols = qkv_cols(m, l);
        const size_t es = act_size(m);
        rope_fwd_acts(m, a, (rows_at){t->q, hd}, (rows_at){ws->scratch, cols}, H);
        rope_fwd_acts(m, a, (rows_at){t->k, kvd}, (rows_at){act_at(m, ws->scratch, (size_t)hd), cols}, KV);
        ops->copy_2d(t->v, (size_t)kvd * es, act_at(m, ws->scratch, (size_t)(hd + kvd)), (size_t)cols * es,
                     (size_t)kvd * es, (size_t)n);
    } else {
        if (compute & LLAMA3_KEEP_Q) rope_fwd_acts(m, a, (rows_at){t->q, hd}, (rows_at){t->q, hd}, H);
        if (compute & LLAMA3_KEEP_K) rope_fwd_acts(m, a, (rows_at){t->k, kvd}, (rows_at){t->k, kvd}, KV);
    }
    if ((compute & LLAMA3_KEEP_ATT) && cpn(m) > 1) {
        cp_ctx cc = cp_of(m);
        cp_attn_dims dim = cp_dims_acts(m, a);
        cp_attention_forward(&cc, ops, mixed(m), t->att, t->lse, t->q, t->k, t->v, &dim, ws->cp_ws);
    } else if (compute & LLAMA3_KEEP_ATT) {
        ops_attn_shape s = attn_shape_acts(m, a);
        if (mixed(m)) ops->attention_forward_bf16(t->att, t->lse, t->q, t->k, t->v, &s, ws->attn_ws);
        else ops->attention_forward(t->att, t->lse, t->q, t->k, t->v, &s, ws->attn_ws);
    }
    if ((compute & LLAMA3_KEEP_ATT) && !tp) {
        /* wo's input: the attention does not report its amax, so one pass takes it here and
         * it stays with att for wo's forward and weight gradient */
        float *am = lin_amax_from(m, pidx_block(m, l, P_WO), MODEL_OPERAND_X, t->att, n, t->att_amax);
        if (am) ops->amax_bf16(am, t->att, (size_t)n * hd_l(m));
    }
    if (compute & LLAMA3_KEEP_H) {
        if (tp) {
            rows_job wo = {m, a, l, ROWS_WO, t, 0, 0};
            sp_exit(m, a, &wo, t->h, x);
        } else {
            lin_fwd_res(m, pidx_block(m, l, P_WO), t->h, t->att, n, x);
        }
    }

    /* feed-forward: out = h + w2(silu(w1 xn2) * w3 xn2) */
    rows_job w13 = {m, a, l, ROWS_W13, t, compute & (LLAMA3_KEEP_A | LLAMA3_KEEP_G), 0};
    if (compute & LLAMA3_KEEP_XN2) {
        const void *w = param_ptr(m, pidx_block(m, l, P_FFN_NORM));
        if (tp) {
            rmsnorm_fwd(m, ws->xn_local, t->rstd2, t->h, w, nl);
            sp_gather_then(m, a, t->xn2, ws->xn_local, &w13);
            w13.compute = 0;
        } else {
            float *am = (w13.compute & LLAMA3_KEEP_A) && mixed(m)
                ? lin_amax_slot(m, pidx_block(m, l, P_W1), MODEL_OPERAND_X, t->xn2, n)
                : NULL;
            rmsnorm_fwd_amax(m, t->xn2, t->rstd2, t->h, w, n, am);
        }
    }
    if (w13.compute) rows_all(m, a, &w13);
    if (compute & LLAMA3_KEEP_S) {
        /* w2's input: its amax comes with it, kept beside it for w2's forward (whole, tp 1)
         * and its weight gradient, which reads the kept or recomputed s */
        float *am = !tp ? lin_amax_from(m, pidx_block(m, l, P_W2), MODEL_OPERAND_X, t->s, n, t->s_amax) : NULL;
        if (mixed(m)) ops->swiglu_forward_bf16(t->s, am, t->a, t->g, ff);
        else ops->swiglu_forward(t->s, t->a, t->g, ff);
    }
    if (output) {
        void *out = a->res[bl + 1];
        if (tp) {
            rows_job w2 = {m, a, l, ROWS_W2, t, 0, 0};
            sp_exit(m, a, &w2, out, t->h);
        } else {
            lin_fwd_res(m, pidx_block(m, l, P_W2), out, t->s, n, t->h);
        }
    }
}

void llama3_block_forward(llama3_model *m, llama3_acts *a, int l) {
    const int bl = local_block(m, l);
    layer_acts t = block_view(a, bl, 0);
    block_forward_ops(m, a, l, &t, LLAMA3_KEEP_ALL, 1);
}

void llama3_forward_head_to(llama3_model *m, llama3_acts *a, const int32_t *targets, float dloss_scale,
                            int64_t *n_valid, float *loss_sum) {
    const tetra_ops *ops = m->ops;
    if (!m->layout.has_head) {
        fprintf(stderr, "llama3_forward_head: this layout holds no head\n");
        abort();
    }
    const int n = (int)a->n, Vl = (int)vocab_l(m);
    const void *w = param_ptr(m, pidx_norm(m));
    /* the logits: fp32, or in bf16 the output projection's bf16 (TorchTitan's, whose loss
     * widens them to fp32 as this one does); the loss is computed in fp32 either way */
    rows_job lg = {m, a, -1, ROWS_LOGITS, NULL, 0, 0};
    if (tpn(m) > 1) {
        rmsnorm_fwd(m, a->ws->xn_local, a->rstdf, a->res[a->nb], w, (int)a->nl);
        sp_gather_then(m, a, a->xnf, a->ws->xn_local, &lg);
    } else {
        rmsnorm_fwd(m, a->xnf, a->rstdf, a->res[a->nb], w, n);
        rows_all(m, a, &lg);
    }
    const size_t nv = a->n * (size_t)Vl;
    if (mixed(m) && tpn(m) > 1) ops->cast_bf16_to_f32(a->logits, a->dlogits16, nv); /* the vocabulary-parallel loss's */
    if (a->logits_copy && a->logits) ops->copy(a->logits_copy, a->logits, nv * sizeof(float));
    else if (a->logits_copy) ops->cast_bf16_to_f32(a->logits_copy, a->dlogits16, nv);
    if (!targets) {
        a->has_targets = 0;
        if (n_valid) *n_valid = 0;
        return;
    }
    int64_t valid = 0;
    for (size_t i = 0; i < a->n; i++) valid += targets[i] != OPS_IGNORE_INDEX;
    if (n_valid) *n_valid = valid;
    ops->copy_h2d_async(a->targets, targets, a->n * sizeof(int32_t)); /* no host wait (model.h) */
    /* fused: per-token losses, and dlogits written over the logits (in bf16 the bf16 dlogits
     * the backward reads, over the bf16 logits: the same bits as the cast below) */
    if (tpn(m) == 1 && mixed(m)) {
        ops->cross_entropy_bf16(a->dlogits16, a->losses, a->dlogits16, a->targets, n, Vl, dloss_scale);
    } else if (tpn(m) == 1) {
        ops->cross_entropy(a->logits, a->losses, a->logits, a->targets, n, Vl, dloss_scale);
    } else if (m->tp_gather_logits) {
        /* loss parallel off: every rank gathers the whole logits and takes its own columns
         * of the gradient back */
        llama3_workspace *ws = a->ws;
        tp_all_gather_cols(ops, m->ctx.tp, ws->lg_full, a->logits, ws->lg_stage, n, Vl);
        ops->cross_entropy(ws->lg_full, a->losses, ws->lg_full, a->targets, n, m->args.vocab_size, dloss_scale);
        tp_take_cols(ops, m->ctx.tp, a->logits, ws->lg_full, n, Vl);
    } else {
        const int v0 = (int)m->params[pidx_output(m)].box_start[0];
        tp_vocab_cross_entropy(ops, m->ctx.tp, a->logits, a->losses, a->logits, a->targets, n, Vl, v0, dloss_scale,
                               a->ce_stats);
    }
    if (mixed(m) && tpn(m) > 1) ops->cast_f32_to_bf16(a->dlogits16, a->logits, a->n * (size_t)Vl);
    ops->sum(loss_sum, a->losses, a->n);
    a->has_targets = 1;
}

double llama3_forward_head(llama3_model *m, llama3_acts *a, const int32_t *targets, float dloss_scale,
                           int64_t *n_valid) {
    llama3_forward_head_to(m, a, targets, dloss_scale, n_valid, a->loss_sum);
    if (!targets) return 0.0;
    float loss = 0.0f;
    m->ops->copy_d2h(&loss, a->loss_sum, sizeof loss);
    return (double)loss;
}

static void need_full(const llama3_model *m, const char *what) {
    if (m->layout.has_embedding && m->layout.has_head && m->layout.layer_start == 0 &&
        m->layout.layer_end == m->args.n_layers)
        return;
    fprintf(stderr, "%s: needs the whole model; this layout is a stage (blocks %d..%d%s%s)\n", what,
            m->layout.layer_start, m->layout.layer_end - 1, m->layout.has_embedding ? ", embedding" : "",
            m->layout.has_head ? ", head" : "");
    abort();
}

double llama3_forward(llama3_model *m, llama3_acts *a, const int32_t *inputs, const int32_t *targets, float dloss_scale,
                      int64_t *n_valid) {
    need_full(m, "llama3_forward");
    llama3_forward_embedding(m, a, inputs);
    for (int l = 0; l < m->args.n_layers; l++) llama3_block_forward(m, a, l);
    return llama3_forward_head(m, a, targets, dloss_scale, n_valid);
}

/* ----------------------------------------------------------------------------
 * backward */

static void need_dlogits(const llama3_acts *a) {
    if (!a->has_targets) {
        /* a programming error: without targets the buffer holds logits, not dlogits */
        fprintf(stderr, "llama3_backward: the last forward had no targets\n");
        abort();
    }
}

void llama3_backward_head_input(llama3_model *m, llama3_acts *a) {
    need_dlogits(a);
    const int n = (int)a->n, nl = (int)a->nl;
    const void *dlogits = mixed(m) ? (const void *)a->dlogits16 : (const void *)a->logits;
    void *dres = a->dres[a->nb];
    /* dxnf = dlogits Output (a partial sum over the vocabulary shards under tensor parallel);
     * dr_L = d rmsnorm (the residual stream starts here) */
    if (tpn(m) > 1) {
        rows_job dx = {m, a, -1, ROWS_DXNF, NULL, 0, 0};
        sp_exit(m, a, &dx, a->dxnf, NULL);
    } else {
        lin_bwd_input(m, pidx_output(m), a->dxnf, dlogits, n, -1, 0.0f);
    }
    zero_acts(m, dres, a->nl * (size_t)m->args.dim);
    rmsnorm_bwd_input(m, dres, a->dxnf, a->res[a->nb], param_ptr(m, pidx_norm(m)), a->rstdf, nl, NULL);
}

void llama3_backward_head_weight(llama3_model *m, llama3_acts *a) {
    need_dlogits(a);
    const int n = (int)a->n, nl = (int)a->nl;
    const void *dlogits = mixed(m) ? (const void *)a->dlogits16 : (const void *)a->logits;
    (void)param_ptr(m, pidx_norm(m)); /* W runs where the unit's parameters are gathered, as for blocks */
    lin_bwd_weight(m, pidx_output(m), dlogits, a->xnf, n);
    rmsnorm_bwd_weight(m, pidx_norm(m), a->dxnf, a->res[a->nb], a->rstdf, nl);
}

void llama3_backward_head(llama3_model *m, llama3_acts *a) {
    llama3_backward_head_input(m, a);
    llama3_backward_head_weight(m, a);
}

void llama3_block_backward_input(llama3_model *m, llama3_acts *a, int l) {
    const tetra_ops *ops = m->ops;
    const int n = (int)a->n, H = heads_l(m), KV = kv_l(m);
    const int HD = (int)hd_l(m), KVD = (int)kvd_l(m), F = (int)ffn_l(m);
    const size_t es = act_size(m);
    const int bl = local_block(m, l);
    llama3_workspace *ws = a->ws;

    /* a block that did not keep everything takes a recompute slot until its W pass and
     * recomputes what it dropped */
    if (a->keep[bl] != LLAMA3_KEEP_ALL) {
        if (a->slot[bl] < 0) {
            int s = -1;
            for (int i = 0; i < ws->n_slots && s < 0; i++)
                if (!ws->slot_owner[i]) s = i;
            if (s < 0) {
                fprintf(stderr,
                        "llama3: block %d needs a recompute slot but the workspace's %d are all held by blocks "
                        "waiting for their W pass (the schedule defers more W passes than it was sized for)\n",
                        l, ws->n_slots);
                abort();
            }
            ws->slot_owner[s] = a;
            ws->slot_layer[s] = l;
            a->slot[bl] = s;
        }
        layer_acts r = block_view(a, bl, 1);
        block_forward_ops(m, a, l, &r, ~a->keep[bl] & LLAMA3_KEEP_ALL, 0);
    }
    layer_acts tv = block_view(a, bl, 1);
    const layer_acts *t = &tv;
    const int tp = tpn(m) > 1;
    const void *dout = a->dres[bl + 1]; /* dL/dr_{l+1}: this rank's rows */

    /* feed-forward: ds = dout W2; (da, dg) over (a, g); dxn2 = da W1 + dg W3 (over xn2 at
     * tp 1; under tensor parallel a partial sum, reduce-scattered to this rank's rows) */
    void *ds = ws->scratch; /* [N, F] */
    if (tp) {               /* w2 is row-parallel: its output gradient for every row */
        rows_job job = {m, a, l, ROWS_DS, t, 0, 0};
        sp_gather_then(m, a, t->dop, dout, &job);
    } else {
        lin_bwd_input(m, pidx_block(m, l, P_W2), ds, dout, n, -1, 0.0f);
    }
    /* w1's and w3's output gradients: their amaxes come with them where those linears take
     * them next (whole, tp 1) */
    const int slots = !tp && mixed(m);
    float *am1 = slots ? lin_amax_slot(m, pidx_block(m, l, P_W1), MODEL_OPERAND_DY, t->a, n) : NULL;
    float *am3 = slots ? lin_amax_slot(m, pidx_block(m, l, P_W3), MODEL_OPERAND_DY, t->g, n) : NULL;
    if (mixed(m)) ops->swiglu_backward_bf16(t->a, t->g, am1, am3, ds, t->a, t->g, a->n * (size_t)F);
    else ops->swiglu_backward(t->a, t->g, ds, t->a, t->g, a->n * (size_t)F);
    void *dh_full = t->dh;    /* dL/dh of every row: wo's input gradient reads it, W keeps it */
    void *datt = ws->scratch; /* [N, HD] */
    if (tp) {
        rows_job job = {m, a, l, ROWS_DXN2, t, 0, 0};
        sp_exit(m, a, &job, t->dxn2l, NULL);
        /* dh = dout (residual) + d rmsnorm, on this rank's rows (kept in dr_l, which the
         * attention part then adds to), gathered for wo, whose input gradient runs on the
         * rows as they arrive */
        rmsnorm_bwd_input(m, a->dres[bl], t->dxn2l, t->h, param_ptr(m, pidx_block(m, l, P_FFN_NORM)), t->rstd2,
                          (int)a->nl, a->dres[bl + 1]);
        rows_job dj = {m, a, l, ROWS_DATT, t, 0, 0};
        sp_gather_then(m, a, dh_full, a->dres[bl], &dj);
    } else {
        void *dxn2 = t->xn2;
        lin_bwd_input(m, pidx_block(m, l, P_W1), dxn2, t->a, n, -1, 0.0f);
        lin_bwd_input(m, pidx_block(m, l, P_W3), dxn2, t->g, n, -1, 1.0f);
        /* dh = dout (residual) + d rmsnorm, with its amax where wo takes it next */
        rmsnorm_bwd_input_amax(m, t->dh, dxn2, t->h, param_ptr(m, pidx_block(m, l, P_FFN_NORM)), t->rstd2, n, dout,
                               slots ? lin_amax_slot(m, pidx_block(m, l, P_WO), MODEL_OPERAND_DY, t->dh, n) : NULL);
    }

    /* attention: datt = dh Wo; attention backward into scratch (it reads q/k/v, so it
     * cannot write over them; the fp32 op accumulates, so that scratch is zeroed); then
     * un-rotate into the q/k slots */
    void *dq = act_at(m, datt, a->n * (size_t)HD); /* [N, HD] */
    void *dk = act_at(m, dq, a->n * (size_t)HD);   /* [N, KVD] */
    void *dv = act_at(m, dk, a->n * (size_t)KVD);  /* [N, KVD] */
    if (!tp) lin_bwd_input(m, pidx_block(m, l, P_WO), datt, dh_full, n, -1, 0.0f);
    ops_attn_shape s = attn_shape_acts(m, a);
    if (cpn(m) > 1) {
        cp_ctx cc = cp_of(m);
        cp_attn_dims dim = cp_dims_acts(m, a);
        cp_attention_backward(&cc, ops, mixed(m), dq, dk, dv, datt, t->q, t->k, t->v, t->att, t->lse, &dim, ws->cp_ws);
    } else if (mixed(m)) {
        ops->attention_backward_bf16(dq, dk, dv, datt, t->q, t->k, t->v, t->att, t->lse, &s, ws->attn_ws);
    } else {
        ops->fill(dq, 0.0f, a->n * (size_t)(HD + 2 * KVD));
        ops->attention_backward(dq, dk, dv, datt, t->q, t->k, t->v, t->att, t->lse, &s, ws->attn_ws);
    }
    const int fused = qkv_fused(m, l);
    if (fused) { /* the rows of dqkv [N, H*D + 2 KV*D] over the q, k, v region */
        const int qkv = qkv_cols(m, l);
        rope_bwd_acts(m, a, (rows_at){t->q, qkv}, (rows_at){dq, (int)HD}, H, NULL);
        rope_bwd_acts(m, a, (rows_at){act_at(m, t->q, HD), qkv}, (rows_at){dk, (int)KVD}, KV, NULL);
        ops->copy_2d(act_at(m, t->q, HD + KVD), (size_t)qkv * es, dv, KVD * es, KVD * es, a->n);
    } else {
        /* wq's and wk's output gradients: their amaxes come with them where those linears
         * take them next (whole, tp 1, one RoPE call each) */
        const int rslots = !tp && mixed(m) && !a->dpos;
        rope_bwd_acts(m, a, (rows_at){t->q, (int)HD}, (rows_at){dq, (int)HD}, H,
                      rslots ? lin_amax_slot(m, pidx_block(m, l, P_WQ), MODEL_OPERAND_DY, t->q, n) : NULL);
        rope_bwd_acts(m, a, (rows_at){t->k, (int)KVD}, (rows_at){dk, (int)KVD}, KV,
                      rslots ? lin_amax_slot(m, pidx_block(m, l, P_WK), MODEL_OPERAND_DY, t->k, n) : NULL);
        ops->copy(t->v, dv, a->n * (size_t)KVD * es);
    }
    const void *w_attn_norm = param_ptr(m, pidx_block(m, l, P_ATTN_NORM));
    if (tp) {
        rows_job job = {m, a, l, ROWS_DXN1, t, 0, 0};
        sp_exit(m, a, &job, t->dxn1l, NULL);
        /* dr_l = dh (already there) + d rmsnorm */
        rmsnorm_bwd_input(m, a->dres[bl], t->dxn1l, a->res[bl], w_attn_norm, t->rstd1, (int)a->nl, NULL);
        return;
    }
    void *dxn1 = t->xn1;
    if (fused) {
        lin_bwd_input_qkv(m, l, m->compute_dtype, dxn1, t->q, n);
    } else {
        lin_bwd_input(m, pidx_block(m, l, P_WQ), dxn1, t->q, n, -1, 0.0f);
        lin_bwd_input(m, pidx_block(m, l, P_WK), dxn1, t->k, n, -1, 1.0f);
        lin_bwd_input(m, pidx_block(m, l, P_WV), dxn1, t->v, n, -1, 1.0f);
    }
    /* dr_l = dh (residual) + d rmsnorm: the output gradient of the block before, whose w2
     * takes it next (with its amax, when that block is on this stage) */
    float *am_prev =
        slots && bl > 0 ? lin_amax_slot(m, pidx_block(m, l - 1, P_W2), MODEL_OPERAND_DY, a->dres[bl], n) : NULL;
    rmsnorm_bwd_input_amax(m, a->dres[bl], dxn1, a->res[bl], w_attn_norm, t->rstd1, n, t->dh, am_prev);
}

void llama3_block_backward_weight(llama3_model *m, llama3_acts *a, int l) {
    const int n = (int)a->n, nl = (int)a->nl;
    const int bl = local_block(m, l);
    llama3_workspace *ws = a->ws;
    if (a->keep[bl] != LLAMA3_KEEP_ALL && a->slot[bl] < 0) {
        fprintf(stderr, "llama3: W pass of block %d before its I pass\n", l);
        abort();
    }
    layer_acts tv = block_view(a, bl, 1);
    const layer_acts *t = &tv;
    const int tp = tpn(m) > 1;
    /* the norm outputs: kept whole under tensor parallel; at tp 1 their slots hold dL/dxn
     * and W recomputes them (bit for bit) */
    void *xn = ws->scratch; /* [N, C] */
    const void *w_ffn_norm = param_ptr(m, pidx_block(m, l, P_FFN_NORM));
    const void *w_attn_norm = param_ptr(m, pidx_block(m, l, P_ATTN_NORM));

    /* feed-forward (s's amax was written with it, in the forward or the recompute) */
    if (!tp) lin_amax_from(m, pidx_block(m, l, P_W2), MODEL_OPERAND_X, t->s, n, t->s_amax);
    lin_bwd_weight(m, pidx_block(m, l, P_W2), tp ? t->dop : a->dres[bl + 1], t->s, n);
    if (!tp)
        rmsnorm_fwd_amax(m, xn, ws->rstd_scratch, t->h, w_ffn_norm, n,
                         mixed(m) ? lin_amax_slot(m, pidx_block(m, l, P_W1), MODEL_OPERAND_X, xn, n) : NULL);
    if (!view_together(m, a, l, LLAMA3_KEEP_A, LLAMA3_KEEP_G) ||
        !lin_bwd_weight_pair(m, pidx_block(m, l, P_W1), pidx_block(m, l, P_W3), t->a, t->g, tp ? t->xn2 : xn, n)) {
        lin_bwd_weight(m, pidx_block(m, l, P_W1), t->a, tp ? t->xn2 : xn, n);
        lin_bwd_weight(m, pidx_block(m, l, P_W3), t->g, tp ? t->xn2 : xn, n);
    }
    rmsnorm_bwd_weight(m, pidx_block(m, l, P_FFN_NORM), tp ? t->dxn2l : t->xn2, t->h, t->rstd2, nl);

    /* attention (att's amax was taken with it, in the forward or the recompute) */
    if (!tp) lin_amax_from(m, pidx_block(m, l, P_WO), MODEL_OPERAND_X, t->att, n, t->att_amax);
    lin_bwd_weight(m, pidx_block(m, l, P_WO), t->dh, t->att, n);
    if (!tp)
        rmsnorm_fwd_amax(m, xn, ws->rstd_scratch, a->res[bl], w_attn_norm, n,
                         mixed(m) ? lin_amax_slot(m, pidx_block(m, l, P_WQ), MODEL_OPERAND_X, xn, n) : NULL);
    if (qkv_fused(m, l)) {
        lin_bwd_weight_qkv(m, l, t->q, tp ? t->xn1 : xn, n);
    } else {
        lin_bwd_weight(m, pidx_block(m, l, P_WQ), t->q, tp ? t->xn1 : xn, n);
        if (!lin_bwd_weight_pair(m, pidx_block(m, l, P_WK), pidx_block(m, l, P_WV), t->k, t->v, tp ? t->xn1 : xn, n)) {
            lin_bwd_weight(m, pidx_block(m, l, P_WK), t->k, tp ? t->xn1 : xn, n);
            lin_bwd_weight(m, pidx_block(m, l, P_WV), t->v, tp ? t->xn1 : xn, n);
        }
    }
    rmsnorm_bwd_weight(m, pidx_block(m, l, P_ATTN_NORM), tp ? t->dxn1l : t->xn1, a->res[bl], t->rstd1, nl);

    if (a->slot[bl] >= 0) { /* the recomputed activations are spent */
        ws->slot_owner[a->slot[bl]] = NULL;
        a->slot[bl] = -1;
    }
}

void llama3_backward_embedding(llama3_model *m, llama3_acts *a) {
    const int pe = pidx_embedding(m);
    if (pe < 0) {
        fprintf(stderr, "llama3_backward_embedding: this layout holds no embedding\n");
        abort();
    }
    const llama3_param *p = &m->params[pe];
    const int v0 = (int)p->box_start[0], vl = (int)p->box_shape[0];
    /* every token's row: under tensor parallel gathered into tp_full, which only a
     * row-parallel exit (sp_exit) writes, inside its own call */
    const void *dout = a->dres[0];
    if (tpn(m) > 1) {
        sp_gather(m, a, a->ws->tp_full, a->dres[0]);
        dout = a->ws->tp_full;
    }
    /* a scatter-add: rows no token of the microbatch names keep what they hold, so a fresh
     * gradient is zeroed first (this rank's rows of the table) */
    if (take_fresh(m, pe)) m->ops->fill(grad_ptr(m, pe), 0.0f, p->numel);
    if (mixed(m)) m->ops->embedding_backward_bf16(grad_ptr(m, pe), dout, a->inputs, (int)a->n, m->args.dim, v0, vl);
    else m->ops->embedding_backward(grad_ptr(m, pe), dout, a->inputs, (int)a->n, m->args.dim, v0, vl);
}

void llama3_backward(llama3_model *m, llama3_acts *a) {
    need_full(m, "llama3_backward");
    llama3_backward_head(m, a);
    for (int l = m->args.n_layers - 1; l >= 0; l--) {
        llama3_block_backward_input(m, a, l);
        llama3_block_backward_weight(m, a, l);
    }
    llama3_backward_embedding(m, a);
}
