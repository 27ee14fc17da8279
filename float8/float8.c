/* float8.c — the Float8 linear (float8.h): dynamic scaling, the fp8 GEMMs of each
 * recipe, and the weight-scale cache. */
#define _POSIX_C_SOURCE 200809L

#include "float8/float8.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"

/* What begin_rows learnt about an operand whose blocks follow. */
enum {
    REG_SELF = 0, /* each block's rows carry their own statistics (per-row scaling of whole rows) */
    REG_TENSOR,   /* reg[0]: the amax of the whole operand */
    REG_ROWS      /* reg[r]: the amax of row r over every column of the group */
};

typedef struct {
    struct float8_model *f;
    /* weight statistics of the current parameters (backend memory) and the generation
     * (optimizer step) each was computed for; -1: never */
    float *w_amax;     /* [1] the whole weight */
    float *w_row_amax; /* [out] per output channel, over every input channel (rowwise output) */
    float *w_col_amax; /* [in] per input channel, over every output channel (rowwise grad_input) */
    int gen_t, gen_r, gen_c;
    int reg_mode[2]; /* per model_operand */
    float *reg[2];   /* [max_rows] each */
    /* tensorwise, weights not sharded by FSDP: W quantised once per optimizer step, in both
     * GEMM layouts (W for the output, W^T for the input gradient), and its dequant factor */
    uint8_t *qw, *qwt; /* [out, in], [in, out] */
    float *w_inv;      /* [1] */
    int gen_q;
    /* tensorwise: the amax of the output gradient of this linear's last whole-operand
     * input-gradient call (dy_key, dy_n), which its weight-gradient call reads again */
    float *dy_amax; /* [1] */
    const void *dy_key;
    int dy_n;
    /* tensorwise: that call cast dy and its transpose in one pass; the transposed codes
     * wait in the ring (float8_model.ring) from byte dyt_at of its running count, with
     * their dequant factor, for the weight gradient (-1: none) */
    float *dy_inv; /* [1] */
    long long dyt_at;
    /* the float8 all-gather: where the last gather of this weight left its e4m3 codes
     * (the weight's place in FSDP's gathered buffer, which holds them instead of its
     * values), and the weight's index among the converted ones (its pre_inv) */
    const void *w_codes;
    int k;
    /* tensorwise: amaxes the model's producers write (amax_slot) for the next call on
     * the operand at pend[which] with pend_n rows: x's into x_amax, dy's into dy_amax */
    float *x_amax; /* [1] */
    const void *pend[2];
    int pend_n[2];
    const float *pend_at[2]; /* the model's float instead of x_amax / dy_amax (amax_from), or NULL */
} f8_lin;

/* One fp8 GEMM operand: the codes, their dequant factor(s) and format. */
typedef struct {
    const uint8_t *q;
    const float *inv;
    tetra_dtype fmt;
} f8_operand;

/* What the last call of any converted linear quantised, so the next linear on the same
 * input (model_linear.input_from) takes the codes instead of casting again. */
enum { CALL_NONE = 0, CALL_FORWARD, CALL_WEIGHT };

struct float8_model {
    const tetra_ops *ops;
    float8_config cfg;
    tetra_dtype cdt;
    comm_group *shard, *tp;
    int n;
    f8_lin *lin;    /* [n] */
    int *lin_param; /* [n] the model parameter of each */
    int gen;        /* optimizer steps seen: cached weight statistics older than this are stale */
    size_t bytes;
    void *mem;
    /* workspace shared by every converted linear (one GEMM at a time) */
    float *da, *db;                                       /* [max(operand, weight)] dequantised operands (emulate) */
    uint8_t *qa, *qb;                                     /* [max(operand, weight)] quantised operands */
    float *amax_a, *sc_a, *inv_a, *amax_b, *sc_b, *inv_b; /* [max(max_rows, max_dim)] */
    float *pre_amax; /* [n] the weights' amaxes (each f8_lin.w_amax is one of them) */
    /* tensorwise: a ring of transposed output-gradient codes (f8_lin.dyt_at), sized for
     * the largest group of linears that the model runs between one input-gradient pass
     * and its weight pass (a block's); ring_used counts every byte ever taken */
    uint8_t *ring;
    size_t ring_cap;
    long long ring_used;
    int cache_w; /* tensorwise weights quantised once per step (f8_lin.qw) */
    /* the last call of any converted linear (CALL_*, its linear, x and rows): its x's codes
     * are still in qa (forward) or qb (weight gradient) */
    const model_linear *last_lin;
    int last_call;
    const void *last_x;
    int last_n;
    float *pre_scale, *pre_inv; /* [n] their scales and dequant factors (the float8 all-gather's) */
    uint16_t *pre_bf16;         /* [n] */
    /* tensorwise: the stretches of the FSDP shard that hold the converted weights, whose
     * amaxes AdamW writes into pre_amax as it updates them (float8_optimizer_amax; ok: they
     * ascend, as the op needs), and whether this step's are there */
    ops_amax_segments seg;
    int seg_ok, amax_pending;
    /* the float8 all-gather: FSDP's gather codec, and each model parameter's converted
     * linear (-1: none) */
    fsdp_gather_codec codec;
    int *param_lin; /* [largest converted parameter + 1] */
};

int float8_parse_recipe(const char *s, float8_recipe *out) {
    if (!strcmp(s, "tensorwise")) *out = FLOAT8_TENSORWISE;
    else if (!strcmp(s, "rowwise")) *out = FLOAT8_ROWWISE;
    else if (!strcmp(s, "rowwise_with_gw_hp")) *out = FLOAT8_ROWWISE_GW_HP;
    else return -1;
    return 0;
}

const char *float8_recipe_name(float8_recipe r) {
    return r == FLOAT8_ROWWISE ? "rowwise" : r == FLOAT8_ROWWISE_GW_HP ? "rowwise_with_gw_hp" : "tensorwise";
}

int float8_wants(const float8_config *c, const char *name, long in_features, long out_features) {
    if (in_features % 16 || out_features % 16) return 0;
    for (int i = 0; i < c->n_filter; i++)
        if (c->filter[i][0] && strstr(name, c->filter[i])) return 0;
    return 1;
}

/* ---------------------------------------------------------------------------- helpers */

static f8_lin *state_of(const model_linear *l) { return (f8_lin *)l->impl_state; }

/* The statistics and the fp8 cast of an operand in the compute dtype: fp32, or bf16 read
 * as it is (the bf16 ops widen exactly, so the results are those of its fp32 copy without
 * writing one). */
static void x_amax(const struct float8_model *f, float *out, const void *x, int rows, int cols, int per_row) {
    const tetra_ops *ops = f->ops;
    if (f->cdt == TETRA_F32) {
        if (per_row) ops->amax_rows(out, (const float *)x, rows, cols);
        else ops->amax(out, (const float *)x, (size_t)rows * (size_t)cols);
    } else {
        if (per_row) ops->amax_rows_bf16(out, (const uint16_t *)x, rows, cols);
        else ops->amax_bf16(out, (const uint16_t *)x, (size_t)rows * (size_t)cols);
    }
}
static void x_cast(const struct float8_model *f, uint8_t *q, const void *x, const float *scale, int rowwise, int rows,
                   int cols, tetra_dtype fmt) {
    if (f->cdt == TETRA_F32) f->ops->cast_f32_to_fp8(q, (const float *)x, scale, rowwise, rows, cols, fmt);
    else f->ops->cast_bf16_to_fp8(q, (const uint16_t *)x, scale, rowwise, rows, cols, fmt);
}

static void reduce_max(comm_group *g, float *v, size_t n) {
    if (g && n) comm_all_reduce(g, v, n, COMM_F32, COMM_MAX, NULL);
}

/* The group whose ranks hold the other parts of the weight, and of each operand's
 * columns: a column-parallel linear splits the output features (dy's columns), a
 * row-parallel one the input features (x's columns). */
static comm_group *tp_if(const model_linear_env *e, const model_linear *l, model_linear_style s) {
    return e->tp && l->style == s ? e->tp : NULL;
}
static comm_group *tp_weight(const model_linear_env *e, const model_linear *l) {
    return e->tp && l->style != MODEL_LINEAR_REPLICATED ? e->tp : NULL;
}

/* A weight statistic, computed once per generation (optimizer step): the amax of m [rows,
 * cols] (per_row: of each row; per_col: of each column) into out, reduced over g. */
static const float *w_stat(const f8_lin *s, int *gen, float *out, const void *m, int rows, int cols, int per_row,
                           int per_col, comm_group *g) {
    if (*gen != s->f->gen) {
        if (per_col) s->f->ops->amax_cols(out, m, s->f->cdt, rows, cols);
        else x_amax(s->f, out, m, rows, cols, per_row);
        reduce_max(g, out, per_row ? (size_t)rows : per_col ? (size_t)cols : 1);
        *gen = s->f->gen;
    }
    return out;
}
static const float *w_tensor_amax(const model_linear_env *e, const model_linear *l, const void *w) {
    f8_lin *s = state_of(l);
    return w_stat(s, &s->gen_t, s->w_amax, w, l->out, l->in, 0, 0, tp_weight(e, l));
}
/* per output channel (rows of W [out, in]) */
static const float *w_row_amax(const model_linear_env *e, const model_linear *l, const void *w) {
    f8_lin *s = state_of(l);
    return w_stat(s, &s->gen_r, s->w_row_amax, w, l->out, l->in, 1, 0, tp_if(e, l, MODEL_LINEAR_ROWWISE));
}
/* per input channel (columns of W) */
static const float *w_col_amax(const model_linear_env *e, const model_linear *l, const void *w) {
    f8_lin *s = state_of(l);
    return w_stat(s, &s->gen_c, s->w_col_amax, w, l->out, l->in, 0, 1, tp_if(e, l, MODEL_LINEAR_COLWISE));
}

/* The statistics of a block's operand x [n, cols]: the announced ones (row0 >= 0 after
 * begin_rows) or x's own, into `own`. */
static const float *operand_amax(const f8_lin *s, model_operand which, int row0, const void *x, int n, int cols,
                                 int per_row, float *own) {
    if (row0 >= 0 && s->reg_mode[which] == REG_TENSOR && !per_row) return s->reg[which];
    if (row0 >= 0 && s->reg_mode[which] == REG_ROWS && per_row) return s->reg[which] + row0;
    x_amax(s->f, own, x, n, cols, per_row);
    return own;
}

/* C = op(A) op(B) + beta C on quantised operands (stored [m, k] or [k, m] for A, [n, k]
 * or [k, n] for B as trans_a/trans_b say), dequantised by their factors (per row of
 * op(A) and per column of op(B) when rowwise). B without trans_b under rowwise scaling
 * carries a broadcast (tensorwise) scale. */
static void fp8_gemm(struct float8_model *f, tetra_dtype c_type, void *c, f8_operand A, f8_operand B, int trans_a,
                     int trans_b, int m, int n, int k, int lda, int ldb, int ldc, int rowwise, int fast_accum,
                     float beta, const void *c_in) {
    const tetra_ops *ops = f->ops;
    ops_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.c_type = c_type;
    g.trans_a = trans_a;
    g.trans_b = trans_b;
    g.m = m;
    g.n = n;
    g.k = k;
    g.lda = lda;
    g.ldb = ldb;
    g.ldc = ldc;
    g.alpha = 1.0f;
    g.beta = beta;
    g.c_in = c_in;
    if (f->cfg.emulate) {
        /* dequantise (stored layouts) and multiply in fp32; a rowwise A is never transposed */
        const int a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
        const int b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
        ops->cast_fp8_to_f32(f->da, A.q, A.inv, rowwise, a_rows, a_cols, A.fmt);
        ops->cast_fp8_to_f32(f->db, B.q, B.inv, rowwise && trans_b, b_rows, b_cols, B.fmt);
        g.a_type = g.b_type = TETRA_F32;
        ops->gemm(c, f->da, f->db, &g);
        return;
    }
    g.a_type = A.fmt;
    g.b_type = B.fmt;
    g.a_scale = A.inv;
    g.b_scale = B.inv;
    g.scale_rowwise = rowwise;
    g.fast_accum = fast_accum;
    ops->gemm(c, A.q, B.q, &g);
}

/* the shared workspace operands */
static f8_operand op_a(const struct float8_model *f, tetra_dtype fmt) { return (f8_operand){f->qa, f->inv_a, fmt}; }
static f8_operand op_b(const struct float8_model *f, tetra_dtype fmt) { return (f8_operand){f->qb, f->inv_b, fmt}; }

/* ---------------------------------------------------------------------------- the linear */

static void f8_begin_rows(const model_linear_env *e, const model_linear *l, model_operand which, const void *local,
                          int rows, int cols, model_rows_layout layout) {
    f8_lin *s = state_of(l);
    struct float8_model *f = s->f;
    const float8_recipe r = f->cfg.recipe;
    f->last_call = CALL_NONE;
    /* the weight statistics the blocks will use, so that no block runs a collective; once
     * per step (cached until the parameters change), so the weight is read only then */
    const int tensor = r == FLOAT8_TENSORWISE || (which == MODEL_OPERAND_DY && r == FLOAT8_ROWWISE_GW_HP);
    const int gen = tensor ? s->gen_t : which == MODEL_OPERAND_X ? s->gen_r : s->gen_c;
    if (gen != f->gen) {
        const void *w = e->weight(e->model, l);
        if (tensor) {
            w_tensor_amax(e, l, w);
        } else if (which == MODEL_OPERAND_X) {
            w_row_amax(e, l, w);
        } else {
            w_col_amax(e, l, w);
        }
    }
    if (r == FLOAT8_TENSORWISE) {
        x_amax(f, s->reg[which], local, rows, cols, 0);
        if (layout != MODEL_ROWS_WHOLE) reduce_max(e->tp, s->reg[which], 1);
        s->reg_mode[which] = REG_TENSOR;
    } else if (layout == MODEL_ROWS_COL_SHARD) {
        x_amax(f, s->reg[which], local, rows, cols, 1);
        reduce_max(e->tp, s->reg[which], (size_t)rows);
        s->reg_mode[which] = REG_ROWS;
    } else {
        s->reg_mode[which] = REG_SELF;
    }
}

/* ---------------------------------------------------------------------------- tensorwise */

/* Is x (n rows, the whole operand) the input the last call quantised, for a linear that
 * the model runs right after that call's linear on the same tensor? Every call records
 * itself, so anything in between breaks the chain. */
static int chain_hit(const struct float8_model *f, const model_linear *l, int call, const void *x, int n, int row0) {
    return row0 < 0 && l->input_from && f->last_lin == l->input_from && f->last_call == call && f->last_x == x &&
        f->last_n == n;
}
static void chain_note(struct float8_model *f, const model_linear *l, int call, const void *x, int n, int row0) {
    f->last_lin = l;
    f->last_call = row0 < 0 ? call : CALL_NONE;
    f->last_x = x;
    f->last_n = n;
}

/* W (transposed: W^T [in, out]) in e4m3 with the whole weight's scale: from the step's
 * cache (both layouts written by one pass at the first use after each optimizer step), or
 * quantised now into qb */
static f8_operand tw_weight(const model_linear_env *e, const model_linear *l, const void *w, int transposed) {
    f8_lin *s = state_of(l);
    struct float8_model *f = s->f;
    if ((s->w_codes && s->w_codes == w) || f->cfg.codes_per_use) {
        /* gathered as codes: W as it came, W^T one byte transpose away */
        if (!transposed) return (f8_operand){(const uint8_t *)w, f->pre_inv + s->k, TETRA_FP8_E4M3};
        f->ops->transpose_u8(f->qb, (const uint8_t *)w, l->out, l->in);
        return (f8_operand){f->qb, f->pre_inv + s->k, TETRA_FP8_E4M3};
    }
    if (f->cache_w) {
        if (s->gen_q != f->gen) {
            f->ops->fp8_quantize(s->qw, s->qwt, s->w_inv, w, f->cdt, w_tensor_amax(e, l, w), l->out, l->in,
                                 TETRA_FP8_E4M3);
            s->gen_q = f->gen;
        }
        return (f8_operand){transposed ? s->qwt : s->qw, s->w_inv, TETRA_FP8_E4M3};
    }
    f->ops->fp8_quantize(transposed ? NULL : f->qb, transposed ? f->qb : NULL, f->inv_b, w, f->cdt,
                         w_tensor_amax(e, l, w), l->out, l->in, TETRA_FP8_E4M3);
    return op_b(f, TETRA_FP8_E4M3);
}

/* The amax of a whole operand the model is about to produce (models/linear.h): under
 * tensor parallel the operands' statistics come through begin_rows instead. */
static float *f8_amax_slot(const model_linear_env *e, const model_linear *l, model_operand which, const void *t,
                           int rows) {
    f8_lin *s = state_of(l);
    if (s->f->cfg.recipe != FLOAT8_TENSORWISE || e->tp) return NULL;
    s->pend[which] = t;
    s->pend_n[which] = rows;
    s->pend_at[which] = NULL;
    if (which == MODEL_OPERAND_DY) s->dy_key = NULL; /* the slot is about to hold another dy's amax */
    return which == MODEL_OPERAND_X ? s->x_amax : s->dy_amax;
}

/* The amax of a whole operand, kept by the model with the activation (models/linear.h):
 * a weight-gradient call then casts an activation the forward left without a pass of its
 * own. Tensorwise at tp 1, as amax_slot. */
static int f8_amax_from(const model_linear_env *e, const model_linear *l, model_operand which, const void *t, int rows,
                        const float *amax) {
    f8_lin *s = state_of(l);
    if (s->f->cfg.recipe != FLOAT8_TENSORWISE || e->tp || which != MODEL_OPERAND_X) return 0;
    s->pend[which] = t;
    s->pend_n[which] = rows;
    s->pend_at[which] = amax;
    return 1;
}

/* The announced amax, if this whole-operand call is the one it was announced for (each
 * announcement serves one call). */
static const float *pending_amax(f8_lin *s, model_operand which, const void *t, int n, int row0) {
    const int hit = row0 < 0 && s->pend[which] == t && s->pend_n[which] == n;
    const float *at = s->pend_at[which];
    s->pend[which] = NULL;
    s->pend_at[which] = NULL;
    if (!hit) return NULL;
    return at ? at : which == MODEL_OPERAND_X ? s->x_amax : s->dy_amax;
}

/* y = x W^T: x e4m3 [n, in] . W e4m3 [out, in], both K-major */
static void tw_forward(const model_linear_env *e, const model_linear *l, tetra_dtype yt, void *y, const void *x,
                       const void *w, int n, int row0, float beta, const void *c_in) {
    f8_lin *s = state_of(l);
    struct float8_model *f = s->f;
    const int in = l->in, out = l->out;
    const float *ax = pending_amax(s, MODEL_OPERAND_X, x, n, row0);
    if (!chain_hit(f, l, CALL_FORWARD, x, n, row0)) {
        if (!ax) ax = operand_amax(s, MODEL_OPERAND_X, row0, x, n, in, 0, f->amax_a);
        f->ops->fp8_quantize(f->qa, NULL, f->inv_a, x, f->cdt, ax, n, in, TETRA_FP8_E4M3);
    }
    fp8_gemm(f, yt, y, op_a(f, TETRA_FP8_E4M3), tw_weight(e, l, w, 0), 0, 1, n, out, in, in, in, out, 0, 1, beta, c_in);
    chain_note(f, l, CALL_FORWARD, x, n, row0);
}

/* `bytes` of the ring for codes that must outlive the calls of other linears: the start
 * of the region, its place in the running count at *at; NULL when the ring is smaller.
 * A region that does not fit before the ring's end starts at its beginning. */
static uint8_t *ring_take(struct float8_model *f, size_t bytes, long long *at) {
    const size_t need = (bytes + 63) & ~(size_t)63;
    if (!f->ring || need > f->ring_cap) return NULL;
    size_t off = (size_t)(f->ring_used % (long long)f->ring_cap);
    if (off + need > f->ring_cap) {
        f->ring_used += (long long)(f->ring_cap - off);
        off = 0;
    }
    *at = f->ring_used;
    f->ring_used += (long long)need;
    return f->ring + off;
}

/* The region taken at `at` of `bytes`, if nothing taken since has reached it. */
static const uint8_t *ring_held(const struct float8_model *f, long long at, size_t bytes) {
    const long long need = (long long)((bytes + 63) & ~(size_t)63);
    if (at < 0 || f->ring_used - at > (long long)f->ring_cap || f->ring_used - at < need) return NULL;
    return f->ring + (size_t)(at % (long long)f->ring_cap);
}

/* dx = dy W: dy e5m2 [n, out] . W^T e4m3 [in, out], both K-major. A whole operand's amax
 * is kept for the weight gradient, which reads the same dy. */
static void tw_backward_input(const model_linear_env *e, const model_linear *l, tetra_dtype dxt, void *dx,
                              const void *dy, const void *w, int n, int row0, float beta) {
    f8_lin *s = state_of(l);
    struct float8_model *f = s->f;
    const int in = l->in, out = l->out;
    const int keep = row0 < 0 && !e->tp;
    const float *ady = pending_amax(s, MODEL_OPERAND_DY, dy, n, row0);
    if (!ady) ady = operand_amax(s, MODEL_OPERAND_DY, row0, dy, n, out, 0, keep ? s->dy_amax : f->amax_a);
    s->dy_key = keep ? dy : NULL;
    s->dy_n = n;
    /* the weight gradient's dy^T from the same pass, where the ring holds it */
    uint8_t *qt = keep ? ring_take(f, (size_t)n * (size_t)out, &s->dyt_at) : NULL;
    if (!qt) s->dyt_at = -1;
    f->ops->fp8_quantize(f->qa, qt, qt ? s->dy_inv : f->inv_a, dy, f->cdt, ady, n, out, TETRA_FP8_E5M2);
    const f8_operand a = {f->qa, qt ? s->dy_inv : f->inv_a, TETRA_FP8_E5M2};
    fp8_gemm(f, dxt, dx, a, tw_weight(e, l, w, 1), 0, 1, n, in, out, out, out, in, 0, 0, beta, NULL);
    chain_note(f, l, CALL_NONE, NULL, 0, row0);
}

/* dW = dy^T x + beta dW (fp32, accumulated by the GEMM): dy^T e5m2 [out, n] . x^T e4m3 [in, n], both
 * K-major, each cast transposed in one pass. The input-gradient call left dy's amax when
 * it saw the same whole operand: dy stays unchanged from that call until this one (this
 * call reads it), and a later input-gradient call of this linear on another microbatch
 * cannot hold this dy's buffer, so the key identifies it. */
static void tw_backward_weight(const model_linear_env *e, const model_linear *l, float *dw, const void *dy,
                               const void *x, int n, float beta) {
    f8_lin *s = state_of(l);
    struct float8_model *f = s->f;
    const tetra_ops *ops = f->ops;
    const int in = l->in, out = l->out;
    const float *ady = s->dy_amax;
    const int same_dy = s->dy_key == dy && s->dy_n == n && !e->tp;
    f8_operand a = op_a(f, TETRA_FP8_E5M2);
    const uint8_t *qt = same_dy ? ring_held(f, s->dyt_at, (size_t)n * (size_t)out) : NULL;
    if (qt) {
        a = (f8_operand){qt, s->dy_inv, TETRA_FP8_E5M2};
    } else {
        if (!same_dy) {
            x_amax(f, f->amax_a, dy, n, out, 0);
            reduce_max(tp_if(e, l, MODEL_LINEAR_COLWISE), f->amax_a, 1);
            ady = f->amax_a;
        }
        ops->fp8_quantize(NULL, f->qa, f->inv_a, dy, f->cdt, ady, n, out, TETRA_FP8_E5M2);
    }
    const float *ax = pending_amax(s, MODEL_OPERAND_X, x, n, -1);
    if (!chain_hit(f, l, CALL_WEIGHT, x, n, -1)) {
        if (!ax) {
            x_amax(f, f->amax_b, x, n, in, 0);
            reduce_max(tp_if(e, l, MODEL_LINEAR_ROWWISE), f->amax_b, 1);
            ax = f->amax_b;
        }
        ops->fp8_quantize(NULL, f->qb, f->inv_b, x, f->cdt, ax, n, in, TETRA_FP8_E4M3);
    }
    fp8_gemm(f, TETRA_F32, dw, a, op_b(f, TETRA_FP8_E4M3), 0, 1, out, in, n, n, n, in, 0, 0, beta, NULL);
    chain_note(f, l, CALL_WEIGHT, x, n, -1);
}

/* y[n, out] = x[n, in] W[out, in]^T + beta y */
static void f8_forward(const model_linear_env *e, const model_linear *l, tetra_dtype yt, void *y, const void *x,
                       const void *w, int n, int row0, float beta, const void *c_in) {
    f8_lin *s = state_of(l);
    struct float8_model *f = s->f;
    const tetra_ops *ops = f->ops;
    const int in = l->in, out = l->out;
    if (f->cfg.recipe == FLOAT8_TENSORWISE) {
        tw_forward(e, l, yt, y, x, w, n, row0, beta, c_in);
        return;
    }
    f->last_call = CALL_NONE;
    /* rowwise: x per token, W per output channel */
    const float *ax = operand_amax(s, MODEL_OPERAND_X, row0, x, n, in, 1, f->amax_a);
    ops->fp8_scale_from_amax(f->sc_a, f->inv_a, ax, n, 0, OPS_FP8_E4M3_MAX, 1);
    ops->fp8_scale_from_amax(f->sc_b, f->inv_b, w_row_amax(e, l, w), out, 0, OPS_FP8_E4M3_MAX, 1);
    x_cast(f, f->qa, x, f->sc_a, 1, n, in, TETRA_FP8_E4M3);
    x_cast(f, f->qb, w, f->sc_b, 1, out, in, TETRA_FP8_E4M3);
    fp8_gemm(f, yt, y, op_a(f, TETRA_FP8_E4M3), op_b(f, TETRA_FP8_E4M3), 0, 1, n, out, in, in, in, out, 1, 1, beta,
             c_in);
}

/* dx[n, in] = dy[n, out] W[out, in] + beta dx */
static void f8_backward_input(const model_linear_env *e, const model_linear *l, tetra_dtype dxt, void *dx,
                              const void *dy, const void *w, int n, int row0, float beta) {
    f8_lin *s = state_of(l);
    struct float8_model *f = s->f;
    const tetra_ops *ops = f->ops;
    const int in = l->in, out = l->out;
    if (f->cfg.recipe == FLOAT8_TENSORWISE) {
        tw_backward_input(e, l, dxt, dx, dy, w, n, row0, beta);
        return;
    }
    f->last_call = CALL_NONE;
    /* dy e4m3 per token */
    const float *ady = operand_amax(s, MODEL_OPERAND_DY, row0, dy, n, out, 1, f->amax_a);
    ops->fp8_scale_from_amax(f->sc_a, f->inv_a, ady, n, 0, OPS_FP8_E4M3_MAX, 1);
    x_cast(f, f->qa, dy, f->sc_a, 1, n, out, TETRA_FP8_E4M3);
    if (f->cfg.recipe == FLOAT8_ROWWISE) { /* W per input channel: W^T [in, out] quantised by rows */
        ops->fp8_scale_from_amax(f->sc_b, f->inv_b, w_col_amax(e, l, w), in, 0, OPS_FP8_E4M3_MAX, 1);
        ops->cast_transpose_to_fp8(f->qb, w, f->cdt, f->sc_b, out, in, TETRA_FP8_E4M3);
        fp8_gemm(f, dxt, dx, op_a(f, TETRA_FP8_E4M3), op_b(f, TETRA_FP8_E4M3), 0, 1, n, in, out, out, out, in, 1, 0,
                 beta, NULL);
        return;
    }
    /* rowwise_with_gw_hp: W tensorwise, its one scale broadcast to every column */
    ops->fp8_scale_from_amax(f->sc_b, f->inv_b, w_tensor_amax(e, l, w), in, 1, OPS_FP8_E4M3_MAX, 1);
    x_cast(f, f->qb, w, f->sc_b, 0, out, in, TETRA_FP8_E4M3);
    fp8_gemm(f, dxt, dx, op_a(f, TETRA_FP8_E4M3), op_b(f, TETRA_FP8_E4M3), 0, 0, n, in, out, out, in, in, 1, 0, beta,
             NULL);
}

/* dW[out, in] += dy[n, out]^T x[n, in] (fp32) */
static void f8_backward_weight(const model_linear_env *e, const model_linear *l, float *dw, const void *dy,
                               const void *x, int n, float beta) {
    f8_lin *s = state_of(l);
    struct float8_model *f = s->f;
    const tetra_ops *ops = f->ops;
    if (f->cfg.recipe == FLOAT8_ROWWISE_GW_HP) {
        f->last_call = CALL_NONE;
        e->fallback->backward_weight(e, l, dw, dy, x, n, beta);
        return;
    }
    const int in = l->in, out = l->out;
    if (f->cfg.recipe == FLOAT8_TENSORWISE) {
        tw_backward_weight(e, l, dw, dy, x, n, beta);
        return;
    }
    f->last_call = CALL_NONE;
    /* rowwise: dy per output channel, x per input channel (over every token: nothing to
     * reduce across tensor-parallel ranks, whose rows here are whole) */
    ops->amax_cols(f->amax_a, dy, f->cdt, n, out);
    ops->fp8_scale_from_amax(f->sc_a, f->inv_a, f->amax_a, out, 0, OPS_FP8_E4M3_MAX, 1);
    ops->cast_transpose_to_fp8(f->qa, dy, f->cdt, f->sc_a, n, out, TETRA_FP8_E4M3); /* dy^T [out, n] */
    ops->amax_cols(f->amax_b, x, f->cdt, n, in);
    ops->fp8_scale_from_amax(f->sc_b, f->inv_b, f->amax_b, in, 0, OPS_FP8_E4M3_MAX, 1);
    ops->cast_transpose_to_fp8(f->qb, x, f->cdt, f->sc_b, n, in, TETRA_FP8_E4M3); /* x^T [in, n] */
    fp8_gemm(f, TETRA_F32, dw, op_a(f, TETRA_FP8_E4M3), op_b(f, TETRA_FP8_E4M3), 0, 1, out, in, n, n, n, in, 1, 0, beta,
             NULL);
}

static const model_linear_impl float8_linear = {"float8",      f8_forward,   f8_backward_input, f8_backward_weight,
                                                f8_begin_rows, f8_amax_slot, f8_amax_from};

/* ---------------------------------------------------------------------------- conversion */

static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

/* Does float8 convert the linear (its module name is the weight's name without ".weight";
 * the sizes are the global ones, as torchao sees the module)? */
static int converts(const model_linear *l, const float8_config *c) {
    char name[128];
    snprintf(name, sizeof name, "%s", l->name ? l->name : "");
    char *dot = strstr(name, ".weight");
    if (dot) *dot = 0;
    return float8_wants(c, name, (long)l->global_in, (long)l->global_out);
}

/* The length of the name's prefix up to its first all-digit part ("layers.3" of
 * "layers.3.attention.wq.weight"): the repeated unit the linear belongs to; 0 without one. */
static size_t unit_prefix(const char *name) {
    for (const char *p = name; p && *p;) {
        const char *end = strchr(p, '.');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 0 && strspn(p, "0123456789") == len) return (size_t)(p - name) + len;
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

/* The ring of transposed output-gradient codes: the model runs a unit's (a block's)
 * input gradients, then its weight gradients, so the largest unit's codes at `rows` rows
 * (each region 64-byte aligned, as ring_take takes them). */
static size_t ring_bytes(model_linear *const *sel, int n, size_t rows) {
    size_t best = 0;
    for (int i = 0; i < n; i++) {
        const char *a = sel[i]->name ? sel[i]->name : "";
        const size_t la = unit_prefix(a);
        size_t sum = 0;
        for (int j = 0; j < n; j++) {
            const char *b = sel[j]->name ? sel[j]->name : "";
            if (unit_prefix(b) == la && !strncmp(a, b, la)) sum += ((size_t)sel[j]->out * rows + 63) & ~(size_t)63;
        }
        best = max_z(best, sum);
    }
    return best;
}

float8_model *float8_convert(model_linear *const *lins, int n_lins, const tetra_ops *ops, tetra_dtype compute_dtype,
                             const float8_config *c, size_t max_rows, comm_group *shard, comm_group *tp, int dry_run,
                             char *err, size_t errlen) {
    struct float8_model *f = calloc(1, sizeof *f);
    if (!f) {
        snprintf(err, errlen, "float8: out of host memory");
        return NULL;
    }
    f->ops = ops;
    f->cfg = *c;
    f->cfg.filter = NULL;
    f->cfg.n_filter = 0;
    f->cdt = compute_dtype;
    f->shard = shard;
    f->tp = tp;
    f->gen = 0;
    if (c->fsdp_fp8_all_gather) f->cfg.precompute_scales = 1;
    if (f->cfg.precompute_scales && c->recipe != FLOAT8_TENSORWISE) {
        snprintf(err, errlen,
                 "float8: precomputed weight scales and the float8 all-gather need the tensorwise recipe "
                 "(got %s)",
                 float8_recipe_name(c->recipe));
        free(f);
        return NULL;
    }
    size_t max_dim = 1, max_w = 1;
    for (int i = 0; i < n_lins; i++) {
        if (!converts(lins[i], c)) continue;
        f->n++;
        const model_linear *l = lins[i];
        max_dim = max_z(max_dim, max_z((size_t)l->in, (size_t)l->out));
        max_w = max_z(max_w, (size_t)l->in * (size_t)l->out);
    }
    f->lin = calloc((size_t)(f->n > 0 ? f->n : 1), sizeof *f->lin);
    f->lin_param = calloc((size_t)(f->n > 0 ? f->n : 1), sizeof *f->lin_param);
    model_linear **sel = calloc((size_t)(f->n > 0 ? f->n : 1), sizeof *sel);
    if (!f->lin || !f->lin_param || !sel) {
        free(sel);
        snprintf(err, errlen, "float8: out of host memory");
        float8_free(f);
        return NULL;
    }
    const size_t R = max_rows > 0 ? max_rows : 1, rd = R * max_dim, big = max_z(rd, max_w), vec = max_z(R, max_dim);
    const int rows_any = c->recipe != FLOAT8_TENSORWISE;
    /* tensorwise weights quantised once per step where they stay whole on this rank: FSDP
     * frees its gathered weights between uses, so under it they are quantised at each use */
    f->cache_w = c->recipe == FLOAT8_TENSORWISE && !c->weights_per_use && (!shard || comm_group_size(shard) <= 1);
    /* one allocation, carved into 64-byte aligned views */
#define ALIGN64(x) (((x) + 63) & ~(size_t)63)
    size_t sz_lin = 0, cache_bytes = 0;
    for (int i = 0, k = 0; i < n_lins; i++) {
        if (!converts(lins[i], c)) continue;
        sel[k] = lins[i];
        f->lin_param[k++] = lins[i]->param;
        const model_linear *l = lins[i];
        sz_lin += 80 + (rows_any ? (size_t)l->out + (size_t)l->in + 32 : 0) + 2 * (R + 16);
        if (f->cache_w) cache_bytes += 2 * ALIGN64((size_t)l->out * (size_t)l->in);
    }
#define ALIGN16(x) (((x) + 15) & ~(size_t)15)
    size_t floats = ALIGN16(sz_lin) + (c->emulate ? 2 * ALIGN16(big) : 0) + 6 * ALIGN16(vec) +
        4 * ALIGN16((size_t)f->n + 1) +      /* pre_amax, pre_bf16 (as floats), pre_scale, pre_inv */
        2 * ALIGN16(2 * ((size_t)f->n + 1)); /* the stretches' int64 offsets and lengths */
    /* the ring serves whole operands, which a tensor-parallel rank never holds */
    f->ring_cap = c->recipe == FLOAT8_TENSORWISE && (!tp || comm_group_size(tp) <= 1) ? ring_bytes(sel, f->n, R) : 0;
    f->bytes = floats * sizeof(float) + 2 * ALIGN16(big) + cache_bytes + f->ring_cap;
    if (dry_run || f->n == 0) {
        free(sel);
        return f;
    }
    f->mem = ops->alloc(f->bytes);
    if (!f->mem) {
        snprintf(err, errlen, "float8: cannot allocate %.2f GiB of workspace", (double)f->bytes / (1 << 30));
        free(sel);
        float8_free(f);
        return NULL;
    }
    float *p = (float *)f->mem;
#define TAKE(n) (p += ALIGN16(n), p - ALIGN16(n))
    for (int k = 0; k < f->n; k++) {
        f8_lin *s = &f->lin[k];
        const model_linear *l = sel[k];
        s->f = f;
        s->gen_t = s->gen_r = s->gen_c = -1;
        s->gen_q = -1;
        p += 16; /* w_amax: an entry of pre_amax, below */
        s->w_inv = p;
        p += 16;
        s->dy_amax = p;
        p += 16;
        s->x_amax = p;
        p += 16;
        s->dy_inv = p;
        p += 16;
        s->dyt_at = -1;
        s->k = k;
        if (rows_any) {
            s->w_row_amax = p;
            p += ALIGN16((size_t)l->out);
            s->w_col_amax = p;
            p += ALIGN16((size_t)l->in);
        }
        s->reg[0] = p;
        p += ALIGN16(R);
        s->reg[1] = p;
        p += ALIGN16(R);
    }
    p = (float *)f->mem + ALIGN16(sz_lin);
    if (c->emulate) {
        f->da = TAKE(big);
        f->db = TAKE(big);
    }
    f->amax_a = TAKE(vec);
    f->sc_a = TAKE(vec);
    f->inv_a = TAKE(vec);
    f->amax_b = TAKE(vec);
    f->sc_b = TAKE(vec);
    f->inv_b = TAKE(vec);
    f->pre_amax = TAKE((size_t)f->n + 1);
    f->pre_bf16 = (uint16_t *)TAKE((size_t)f->n + 1);
    f->pre_scale = TAKE((size_t)f->n + 1);
    f->pre_inv = TAKE((size_t)f->n + 1);
    f->seg.off = (const int64_t *)TAKE(2 * ((size_t)f->n + 1));
    f->seg.len = (const int64_t *)TAKE(2 * ((size_t)f->n + 1));
    f->seg.amax = f->pre_amax;
    /* a weight's amax is its entry of pre_amax, which the precomputation and AdamW write */
    for (int k = 0; k < f->n; k++) f->lin[k].w_amax = f->pre_amax + k;
    f->qa = (uint8_t *)p;
    f->qb = f->qa + ALIGN16(big);
    uint8_t *qc = f->qb + ALIGN16(big);
    for (int k = 0; k < f->n && f->cache_w; k++) {
        const size_t wn = ALIGN64((size_t)sel[k]->out * (size_t)sel[k]->in);
        f->lin[k].qw = qc;
        f->lin[k].qwt = qc + wn;
        qc += 2 * wn;
    }
    f->ring = f->ring_cap ? qc : NULL;
#undef TAKE
#undef ALIGN16
#undef ALIGN64
    for (int k = 0; k < f->n; k++) {
        sel[k]->impl = &float8_linear;
        sel[k]->impl_state = &f->lin[k];
    }
    free(sel);
    return f;
}

int float8_converted(const float8_model *f) { return f ? f->n : 0; }
size_t float8_workspace_bytes(const float8_model *f) { return f && f->n ? f->bytes : 0; }

void float8_params_updated(float8_model *f, fsdp *fs) {
    if (!f) return;
    f->gen++;
    const int produced = f->amax_pending; /* by this step's AdamW (float8_optimizer_amax) */
    f->amax_pending = 0;
    if (!f->mem || !fs || (!produced && !f->cfg.precompute_scales)) return;
    /* the amax of every converted weight from this rank's pieces of the weights on the
     * device, then one MAX all-reduce per group; the compute copy is the master rounded to
     * bf16, and rounding is monotonic, so its amax is the master's amax rounded (the
     * value it is rounded to below): under bf16 compute the copy is read, which CPU
     * offload keeps on the device while the master is on the host. AdamW's amaxes are
     * those of the same copy. */
    const tetra_ops *ops = f->ops;
    if (!produced) {
        const dt_tensor *T = fsdp_tensors(fs);
        const float *master = fsdp_device_master(fs);
        const uint16_t *copy = fsdp_compute_shard(fs);
        for (int k = 0; k < f->n; k++) {
            const dt_tensor *t = &T[f->lin_param[k]];
            if (!t->n_pieces) ops->fill(f->pre_amax + k, 0.0f, 1);
            else if (copy) ops->amax_bf16(f->pre_amax + k, copy + t->piece.local_offset, t->piece.count);
            else ops->amax(f->pre_amax + k, master + t->piece.local_offset, t->piece.count);
        }
    }
    reduce_max(f->shard, f->pre_amax, (size_t)f->n);
    reduce_max(f->tp, f->pre_amax, (size_t)f->n);
    if (f->cdt == TETRA_BF16 && !produced) {
        ops->cast_f32_to_bf16(f->pre_bf16, f->pre_amax, (size_t)f->n);
        ops->cast_bf16_to_f32(f->pre_amax, f->pre_bf16, (size_t)f->n);
    }
    if (f->cfg.precompute_scales)
        ops->fp8_scale_from_amax(f->pre_scale, f->pre_inv, f->pre_amax, f->n, 0, OPS_FP8_E4M3_MAX, 0);
    for (int k = 0; k < f->n; k++) f->lin[k].gen_t = f->gen;
}

/* The stretches of fs's shard that hold the converted weights, in the device's table,
 * when they ascend (they do where the linears are declared in the order of their
 * parameters; otherwise the weights' amaxes keep their own passes). */
static int build_stretches(float8_model *f, fsdp *fs, char *err, size_t errlen) {
    const dt_tensor *T = fsdp_tensors(fs);
    int64_t *h = malloc(2 * (size_t)f->n * sizeof *h);
    if (!h) {
        snprintf(err, errlen, "float8: out of host memory");
        return -1;
    }
    int64_t end = 0;
    int ok = 1;
    for (int k = 0; k < f->n && ok; k++) {
        const dt_tensor *t = &T[f->lin_param[k]];
        const int64_t off = t->n_pieces ? (int64_t)t->piece.local_offset : end;
        const int64_t len = t->n_pieces ? (int64_t)t->piece.count : 0;
        ok = off >= end;
        h[k] = off;
        h[f->n + k] = len;
        end = off + len;
    }
    if (ok) {
        f->ops->copy_h2d((void *)f->seg.off, h, (size_t)f->n * sizeof *h);
        f->ops->copy_h2d((void *)f->seg.len, h + f->n, (size_t)f->n * sizeof *h);
        f->seg.n = f->n;
    }
    f->seg_ok = ok;
    free(h);
    return 0;
}

const ops_amax_segments *float8_optimizer_amax(float8_model *f, fsdp *fs) {
    if (!f || !f->seg_ok || !fs || fsdp_offloaded(fs) || !f->ops->adamw_step_amax) return NULL;
    f->amax_pending = 1;
    return &f->seg;
}

/* The float8 all-gather's codec: a converted weight travels as its e4m3 codes with the
 * precomputed scale (cast from the compute copy in one pass), and arrives dequantised
 * into the compute dtype in one pass, which the linear's cast with the same scale takes
 * back to the same codes. */
static void codec_encode(const fsdp_gather_codec *c, int param, uint8_t *dst, const void *src, tetra_dtype src_type,
                         size_t n) {
    const struct float8_model *f = c->user;
    const int k = f->param_lin[param];
    if (src_type == TETRA_BF16) f->ops->cast_bf16_to_fp8(dst, src, f->pre_scale + k, 0, 1, (int)n, TETRA_FP8_E4M3);
    else f->ops->cast_f32_to_fp8(dst, src, f->pre_scale + k, 0, 1, (int)n, TETRA_FP8_E4M3);
}
/* The gathered weight keeps its codes (byte i of its place: element i's), which its
 * linear reads directly (tw_weight): nothing else reads a converted weight. */
static void codec_decode(const fsdp_gather_codec *c, int param, void *param_dst, size_t first, tetra_dtype dst_type,
                         const uint8_t *src, size_t n) {
    (void)dst_type;
    struct float8_model *f = c->user;
    f8_lin *s = &f->lin[f->param_lin[param]];
    f->ops->copy((uint8_t *)param_dst + first, src, n);
    s->w_codes = param_dst;
}

int float8_attach_fsdp(float8_model *f, fsdp *fs, char *err, size_t errlen) {
    if (!f || !fs || f->n == 0) return 0;
    if (f->mem && f->cfg.recipe == FLOAT8_TENSORWISE && build_stretches(f, fs, err, errlen)) return -1;
    if (!f->cfg.fsdp_fp8_all_gather) return 0;
    int np = 0;
    for (int k = 0; k < f->n; k++)
        if (f->lin_param[k] + 1 > np) np = f->lin_param[k] + 1;
    f->param_lin = malloc((size_t)np * sizeof *f->param_lin);
    if (!f->param_lin) {
        snprintf(err, errlen, "float8: out of host memory");
        return -1;
    }
    for (int i = 0; i < np; i++) f->param_lin[i] = -1;
    for (int k = 0; k < f->n; k++) f->param_lin[f->lin_param[k]] = k;
    f->codec = (fsdp_gather_codec){"float8", 1, codec_encode, codec_decode, f};
    return fsdp_enable_coded_gather(fs, f->n, f->lin_param, &f->codec, err, errlen);
}

void float8_free(float8_model *f) {
    if (!f) return;
    if (f->mem) f->ops->release(f->mem);
    free(f->lin);
    free(f->lin_param);
    free(f->param_lin);
    free(f);
}
