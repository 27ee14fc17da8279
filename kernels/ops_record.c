/* ops_record.c — the recording op table (ops_record.h). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE: not in POSIX 2008 */
#include "kernels/ops_record.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/ops_shapes.h"

enum { SPAN_DEPTH = 64 };

static struct {
    op_cost_device dev;
    double doc_share; /* ops_record_set_doc_share */
    const tetra_ops *base;
    tetra_ops table;
    int active;
    ops_record_entry *rec;
    size_t n, cap;
    char **names;
    int n_names, cap_names;
    int stack[SPAN_DEPTH];
    int depth, too_deep;
    /* the address region of a table without a base: reserved, never accessible */
    char *region;
    size_t region_size, used, allocs;
} R;

/* ---------------------------------------------------------------------------- records */

static void keep(const op_cost *c) {
    if (R.n == R.cap) {
        size_t cap = R.cap ? 2 * R.cap : 4096;
        ops_record_entry *e = realloc(R.rec, cap * sizeof *e);
        if (!e) {
            fprintf(stderr, "ops_record: out of host memory after %zu records\n", R.n);
            abort();
        }
        R.rec = e;
        R.cap = cap;
    }
    R.rec[R.n].cost = *c;
    R.rec[R.n].span = R.depth > 0 ? R.stack[R.depth - 1] : -1; /* past SPAN_DEPTH: the deepest kept */
    R.n++;
}

/* describe (into c_) and keep the call while recording */
#define REC(describe)                                                                                                  \
    do {                                                                                                               \
        if (R.active) {                                                                                                \
            op_cost c_;                                                                                                \
            describe;                                                                                                  \
            keep(&c_);                                                                                                 \
        }                                                                                                              \
    } while (0)

void ops_record_set_active(int on) { R.active = on != 0; }
void ops_record_set_doc_share(double share) { R.doc_share = share > 0.0 && share < 1.0 ? share : 1.0; }

/* an attention call under a document mask: its FLOPs at the documents' share of the pairs */
static void doc_share(op_cost *c, const ops_attn_shape *s) {
    if (!s->doc || R.doc_share >= 1.0) return;
    c->flops[OPC_FLOP_ATTN_TC] *= R.doc_share;
    c->flops[OPC_FLOP_ATTN_F32] *= R.doc_share;
}
void ops_record_clear(void) { R.n = 0; }
size_t ops_record_count(void) { return R.n; }
const ops_record_entry *ops_record_entries(void) { return R.rec; }
const op_cost_device *ops_record_device(void) { return &R.dev; }

const char *ops_record_span_name(int span) { return span >= 0 && span < R.n_names ? R.names[span] : ""; }

static int intern(const char *name) {
    for (int i = R.n_names - 1; i >= 0; i--)
        if (!strcmp(R.names[i], name)) return i;
    if (R.n_names == R.cap_names) {
        int cap = R.cap_names ? 2 * R.cap_names : 64;
        char **n = realloc(R.names, (size_t)cap * sizeof *n);
        if (!n) return -1;
        R.names = n;
        R.cap_names = cap;
    }
    char *s = strdup(name);
    if (!s) return -1;
    R.names[R.n_names] = s;
    return R.n_names++;
}

static void r_range_push(const char *name) {
    if (R.depth < SPAN_DEPTH) R.stack[R.depth++] = intern(name ? name : "");
    else R.too_deep++;
    if (R.base && R.base->range_push) R.base->range_push(name);
}

static void r_range_pop(void) {
    if (R.too_deep) R.too_deep--;
    else if (R.depth > 0) R.depth--;
    if (R.base && R.base->range_pop) R.base->range_pop();
}

/* ---------------------------------------------------------------------------- memory */

/* Address space only: as much as the host grants, from 64 TiB down (an 8B model's step
 * takes a few hundred GB of addresses, a 405B one several TB). */
static int reserve_region(void) {
    if (R.region) return 0;
    for (size_t sz = (size_t)64 << 40; sz >= ((size_t)1 << 30); sz /= 2) {
        void *p = mmap(NULL, sz, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) {
            R.region = p;
            R.region_size = sz;
            return 0;
        }
    }
    return -1;
}

void ops_record_release(void) {
    if (R.region) munmap(R.region, R.region_size);
    R.region = NULL;
    R.region_size = R.used = 0;
}

/* 256-byte aligned, as cudaMalloc */
static void *r_alloc(size_t bytes) {
    if (R.base) return R.base->alloc(bytes);
    size_t want = (bytes + 255) & ~(size_t)255;
    if (!want) want = 256;
    if (want > R.region_size - R.used) {
        fprintf(stderr, "ops_record: %zu bytes asked, %zu of the %zu reserved are left\n", bytes,
                R.region_size - R.used, R.region_size);
        return NULL;
    }
    void *p = R.region + R.used;
    R.used += want;
    R.allocs++;
    return p;
}

static void r_release(void *p) {
    if (R.base) R.base->release(p);
}

static void r_copy_h2d(void *dst, const void *src, size_t bytes) {
    REC(opc_copy_h2d(&c_, &R.dev, dst, src, bytes));
    if (R.base) R.base->copy_h2d(dst, src, bytes);
}

static void r_copy_h2d_async(void *dst, const void *src, size_t bytes) {
    REC(opc_copy_h2d_async(&c_, &R.dev, dst, src, bytes));
    if (R.base) R.base->copy_h2d_async(dst, src, bytes);
}

static void r_copy_d2h(void *dst, const void *src, size_t bytes) {
    REC(opc_copy_d2h(&c_, &R.dev, dst, src, bytes));
    if (R.base) R.base->copy_d2h(dst, src, bytes);
    else if (bytes) memset(dst, 0, bytes); /* nothing was computed: every value reads as 0 */
}

static void r_copy(void *dst, const void *src, size_t bytes) {
    REC(opc_copy(&c_, &R.dev, dst, src, bytes));
    if (R.base) R.base->copy(dst, src, bytes);
}

static void r_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows) {
    REC(opc_copy_2d(&c_, &R.dev, dst, dpitch, src, spitch, width, rows));
    if (R.base) R.base->copy_2d(dst, dpitch, src, spitch, width, rows);
}

static void r_synchronize(void) {
    REC(opc_synchronize(&c_, &R.dev));
    if (R.base) R.base->synchronize();
}

static size_t r_alloc_count(void) { return R.base ? R.base->alloc_count() : R.allocs; }
static size_t r_allocated_bytes(void) { return R.base ? R.base->allocated_bytes() : R.used; }
static void r_memory_freeze(int frozen) {
    if (R.base) R.base->memory_freeze(frozen);
}
static void r_device_memory(size_t *free_bytes, size_t *total_bytes) {
    if (R.base) {
        R.base->device_memory(free_bytes, total_bytes);
        return;
    }
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
}
static void *r_compute_stream(void) { return R.base ? R.base->compute_stream() : NULL; }
static void r_set_deterministic(int on) {
    R.dev.deterministic = on != 0;
    if (R.base && R.base->set_deterministic) R.base->set_deterministic(on);
}
static void *r_host_alloc(size_t bytes) { return R.base ? R.base->host_alloc(bytes) : malloc(bytes ? bytes : 64); }
static void r_host_release(void *p) {
    if (R.base) R.base->host_release(p);
    else free(p);
}

/* ---------------------------------------------------------------------------- elementwise, reductions, casts */

static void r_fill(float *x, float value, size_t n) {
    REC(opc_fill(&c_, &R.dev, x, value, n));
    if (R.base) R.base->fill(x, value, n);
}
static void r_scale(float *x, float alpha, size_t n) {
    REC(opc_scale(&c_, &R.dev, x, alpha, n));
    if (R.base) R.base->scale(x, alpha, n);
}
static void r_axpy(float *y, const float *x, float alpha, size_t n) {
    REC(opc_axpy(&c_, &R.dev, y, x, alpha, n));
    if (R.base) R.base->axpy(y, x, alpha, n);
}
static void r_add(float *out, const float *a, const float *b, size_t n) {
    REC(opc_add(&c_, &R.dev, out, a, b, n));
    if (R.base) R.base->add(out, a, b, n);
}
static void r_sum_squares(float *out, const float *x, size_t n) {
    REC(opc_sum_squares(&c_, &R.dev, out, x, n));
    if (R.base) R.base->sum_squares(out, x, n);
}
static void r_sum(float *out, const float *x, size_t n) {
    REC(opc_sum(&c_, &R.dev, out, x, n));
    if (R.base) R.base->sum(out, x, n);
}
static void r_amax(float *out, const float *x, size_t n) {
    REC(opc_amax(&c_, &R.dev, out, x, n));
    if (R.base) R.base->amax(out, x, n);
}
static void r_amax_rows(float *out, const float *x, int rows, int cols) {
    REC(opc_amax_rows(&c_, &R.dev, out, x, rows, cols));
    if (R.base) R.base->amax_rows(out, x, rows, cols);
}
static void r_amax_bf16(float *out, const uint16_t *x, size_t n) {
    REC(opc_amax_bf16(&c_, &R.dev, out, x, n));
    if (R.base) R.base->amax_bf16(out, x, n);
}
static void r_amax_rows_bf16(float *out, const uint16_t *x, int rows, int cols) {
    REC(opc_amax_rows_bf16(&c_, &R.dev, out, x, rows, cols));
    if (R.base) R.base->amax_rows_bf16(out, x, rows, cols);
}
static void r_amax_cols(float *out, const void *x, tetra_dtype xt, int rows, int cols) {
    REC(opc_amax_cols(&c_, &R.dev, out, x, xt, rows, cols));
    if (R.base) R.base->amax_cols(out, x, xt, rows, cols);
}
static void r_transpose(float *out, const float *x, int rows, int cols) {
    REC(opc_transpose(&c_, &R.dev, out, x, rows, cols));
    if (R.base) R.base->transpose(out, x, rows, cols);
}
static void r_cast_f32_to_bf16(uint16_t *out, const float *x, size_t n) {
    REC(opc_cast_f32_to_bf16(&c_, &R.dev, out, x, n));
    if (R.base) R.base->cast_f32_to_bf16(out, x, n);
}
static void r_cast_bf16_to_f32(float *out, const uint16_t *x, size_t n) {
    REC(opc_cast_bf16_to_f32(&c_, &R.dev, out, x, n));
    if (R.base) R.base->cast_bf16_to_f32(out, x, n);
}
static void r_cast_f32_to_fp8(uint8_t *out, const float *x, const float *scale, int rowwise, int rows, int cols,
                              tetra_dtype fmt) {
    REC(opc_cast_f32_to_fp8(&c_, &R.dev, out, x, scale, rowwise, rows, cols, fmt));
    if (R.base) R.base->cast_f32_to_fp8(out, x, scale, rowwise, rows, cols, fmt);
}
static void r_cast_bf16_to_fp8(uint8_t *out, const uint16_t *x, const float *scale, int rowwise, int rows, int cols,
                               tetra_dtype fmt) {
    REC(opc_cast_bf16_to_fp8(&c_, &R.dev, out, x, scale, rowwise, rows, cols, fmt));
    if (R.base) R.base->cast_bf16_to_fp8(out, x, scale, rowwise, rows, cols, fmt);
}
static void r_cast_transpose_to_fp8(uint8_t *out, const void *x, tetra_dtype xt, const float *scale, int rows, int cols,
                                    tetra_dtype fmt) {
    REC(opc_cast_transpose_to_fp8(&c_, &R.dev, out, x, xt, scale, rows, cols, fmt));
    if (R.base) R.base->cast_transpose_to_fp8(out, x, xt, scale, rows, cols, fmt);
}
static void r_transpose_u8(uint8_t *out, const uint8_t *x, int rows, int cols) {
    REC(opc_transpose_u8(&c_, &R.dev, out, x, rows, cols));
    if (R.base) R.base->transpose_u8(out, x, rows, cols);
}
static void r_cast_fp8_to_bf16(uint16_t *out, const uint8_t *q, const float *inv_scale, int rowwise, int rows, int cols,
                               tetra_dtype fmt) {
    REC(opc_cast_fp8_to_bf16(&c_, &R.dev, out, q, inv_scale, rowwise, rows, cols, fmt));
    if (R.base) R.base->cast_fp8_to_bf16(out, q, inv_scale, rowwise, rows, cols, fmt);
}
static void r_cast_fp8_to_f32(float *out, const uint8_t *q, const float *inv_scale, int rowwise, int rows, int cols,
                              tetra_dtype fmt) {
    REC(opc_cast_fp8_to_f32(&c_, &R.dev, out, q, inv_scale, rowwise, rows, cols, fmt));
    if (R.base) R.base->cast_fp8_to_f32(out, q, inv_scale, rowwise, rows, cols, fmt);
}
static void r_fp8_quantize(uint8_t *out, uint8_t *out_t, float *inv_scale, const void *x, tetra_dtype xt,
                           const float *amax, int rows, int cols, tetra_dtype fmt) {
    REC(opc_fp8_quantize(&c_, &R.dev, out, out_t, inv_scale, x, xt, amax, rows, cols, fmt));
    if (R.base) R.base->fp8_quantize(out, out_t, inv_scale, x, xt, amax, rows, cols, fmt);
}
static void r_fp8_scale_from_amax(float *scale, float *inv_scale, const float *amax, int n, int broadcast,
                                  float fp8_max, int pow2) {
    REC(opc_fp8_scale_from_amax(&c_, &R.dev, scale, inv_scale, amax, n, broadcast, fp8_max, pow2));
    if (R.base) R.base->fp8_scale_from_amax(scale, inv_scale, amax, n, broadcast, fp8_max, pow2);
}

static void r_gemm(void *c, const void *a, const void *b, const ops_gemm_desc *g) {
    REC(opc_gemm(&c_, &R.dev, c, a, b, g));
    if (R.base) R.base->gemm(c, a, b, g);
}

/* ---------------------------------------------------------------------------- layers, fp32 */

static void r_embedding_forward(float *out, const int32_t *tokens, const float *wte, int n, int c, int v_start,
                                int v_local) {
    REC(opc_embedding_forward(&c_, &R.dev, TETRA_F32, out, tokens, wte, n, c, v_start, v_local));
    if (R.base) R.base->embedding_forward(out, tokens, wte, n, c, v_start, v_local);
}
static void r_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int n, int c, int v_start,
                                 int v_local) {
    REC(opc_embedding_backward(&c_, &R.dev, TETRA_F32, dwte, dout, tokens, n, c, v_start, v_local));
    if (R.base) R.base->embedding_backward(dwte, dout, tokens, n, c, v_start, v_local);
}
static void r_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int n, int c, float eps) {
    REC(opc_rmsnorm_forward(&c_, &R.dev, TETRA_F32, out, rstd, NULL, x, w, n, c));
    if (R.base) R.base->rmsnorm_forward(out, rstd, x, w, n, c, eps);
}
static void r_rmsnorm_backward_input(float *dx, const float *dout, const float *x, const float *w, const float *rstd,
                                     int n, int c, const float *dres) {
    REC(opc_rmsnorm_backward_input(&c_, &R.dev, TETRA_F32, dx, NULL, dout, x, w, rstd, n, c));
    if (R.base) R.base->rmsnorm_backward_input(dx, dout, x, w, rstd, n, c, dres);
}
static void r_rmsnorm_backward_weight(float *dw, const float *dout, const float *x, const float *rstd, int n, int c,
                                      int accumulate) {
    REC(opc_rmsnorm_backward_weight(&c_, &R.dev, TETRA_F32, dw, dout, x, rstd, n, c, accumulate));
    if (R.base) R.base->rmsnorm_backward_weight(dw, dout, x, rstd, n, c, accumulate);
}
static void r_rope_forward(float *out, const float *x, const float *freqs, const int32_t *pos, int pos_offset, int b,
                           int s, int nh, int d, int out_ld, int x_ld) {
    REC(opc_rope(&c_, &R.dev, TETRA_F32, 0, out, NULL, x, b, s, nh, d));
    if (R.base) R.base->rope_forward(out, x, freqs, pos, pos_offset, b, s, nh, d, out_ld, x_ld);
}
static void r_rope_backward(float *dx, const float *dout, const float *freqs, const int32_t *pos, int pos_offset, int b,
                            int s, int nh, int d, int dx_ld, int dout_ld) {
    REC(opc_rope(&c_, &R.dev, TETRA_F32, 1, dx, NULL, dout, b, s, nh, d));
    if (R.base) R.base->rope_backward(dx, dout, freqs, pos, pos_offset, b, s, nh, d, dx_ld, dout_ld);
}
static void r_swiglu_forward(float *out, const float *a, const float *g, size_t n) {
    REC(opc_swiglu_forward(&c_, &R.dev, TETRA_F32, out, NULL, a, g, n));
    if (R.base) R.base->swiglu_forward(out, a, g, n);
}
static void r_swiglu_backward(float *da, float *dg, const float *dout, const float *a, const float *g, size_t n) {
    REC(opc_swiglu_backward(&c_, &R.dev, TETRA_F32, da, dg, NULL, NULL, dout, a, g, n));
    if (R.base) R.base->swiglu_backward(da, dg, dout, a, g, n);
}

/* ---------------------------------------------------------------------------- attention, loss, optimizer */

static size_t r_attention_workspace_size(const ops_attn_shape *s) {
    return R.base ? R.base->attention_workspace_size(s) : ops_shape_cuda_attention_workspace(s);
}
static size_t r_attention_workspace_size_bf16(const ops_attn_shape *s) {
    /* cuDNN's plan-dependent part is known only on a device: the built-in kernels' share */
    return R.base ? R.base->attention_workspace_size_bf16(s) : ops_shape_cuda_attention_workspace(s);
}
static void r_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                const ops_attn_shape *s, void *workspace) {
    REC(opc_attention_forward(&c_, &R.dev, TETRA_F32, out, lse, q, k, v, s); doc_share(&c_, s));
    if (R.base) R.base->attention_forward(out, lse, q, k, v, s, workspace);
}
static void r_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                 const float *v, const float *out, const float *lse, const ops_attn_shape *s,
                                 void *workspace) {
    REC(opc_attention_backward(&c_, &R.dev, TETRA_F32, dq, dk, dv, dout, q, k, v, out, lse, s); doc_share(&c_, s));
    if (R.base) R.base->attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s, workspace);
}
static void r_attention_merge(float *out, float *lse, const float *out_blk, const float *lse_blk, int b, int sq, int h,
                              int d) {
    REC(opc_attention_merge(&c_, &R.dev, b, sq, h, d));
    if (R.base) R.base->attention_merge(out, lse, out_blk, lse_blk, b, sq, h, d);
}
static void r_cross_entropy_bf16(uint16_t *dlogits, float *losses, const uint16_t *logits, const int32_t *targets,
                                 int n, int v, float dloss_scale) {
    REC(opc_cross_entropy_bf16(&c_, &R.dev, n, v));
    if (R.base) R.base->cross_entropy_bf16(dlogits, losses, logits, targets, n, v, dloss_scale);
}
static void r_cross_entropy(float *dlogits, float *losses, const float *logits, const int32_t *targets, int n, int v,
                            float dloss_scale) {
    REC(opc_cross_entropy(&c_, &R.dev, dlogits, n, v));
    if (R.base) R.base->cross_entropy(dlogits, losses, logits, targets, n, v, dloss_scale);
}
static void r_ce_shard_max(float *row_max, const float *logits, int n, int v_local) {
    REC(opc_ce_shard_max(&c_, &R.dev, n, v_local));
    if (R.base) R.base->ce_shard_max(row_max, logits, n, v_local);
}
static void r_ce_shard_sums(float *sum_exp, float *target_logit, const float *logits, const float *row_max,
                            const int32_t *targets, int n, int v_local, int v_start) {
    REC(opc_ce_shard_sums(&c_, &R.dev, n, v_local));
    if (R.base) R.base->ce_shard_sums(sum_exp, target_logit, logits, row_max, targets, n, v_local, v_start);
}
static void r_ce_shard_finish(float *dlogits, float *losses, const float *logits, const float *row_max,
                              const float *sum_exp, const float *target_logit, const int32_t *targets, int n,
                              int v_local, int v_start, float dloss_scale) {
    REC(opc_ce_shard_finish(&c_, &R.dev, dlogits, n, v_local));
    if (R.base)
        R.base->ce_shard_finish(dlogits, losses, logits, row_max, sum_exp, target_logit, targets, n, v_local, v_start,
                                dloss_scale);
}
static void r_adamw_step(float *param, float *m, float *v, const float *grad, size_t n, double lr, double beta1,
                         double beta2, double eps, double weight_decay, int step, float grad_scale,
                         const ops_optim_state *dev) {
    REC(opc_adamw_step(&c_, &R.dev, 0, n, 0));
    if (R.base) R.base->adamw_step(param, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale, dev);
}
static void r_adamw_step_bf16(float *param, uint16_t *param_bf16, float *m, float *v, const float *grad, size_t n,
                              double lr, double beta1, double beta2, double eps, double weight_decay, int step,
                              float grad_scale, const ops_optim_state *dev) {
    REC(opc_adamw_step(&c_, &R.dev, 1, n, 0));
    if (R.base)
        R.base->adamw_step_bf16(param, param_bf16, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale,
                                dev);
}
static void r_adamw_step_amax(float *param, uint16_t *param_bf16, float *m, float *v, const float *grad, size_t n,
                              double lr, double beta1, double beta2, double eps, double weight_decay, int step,
                              float grad_scale, const ops_optim_state *dev, const ops_amax_segments *seg) {
    REC(opc_adamw_step(&c_, &R.dev, param_bf16 != NULL, n, seg ? seg->n : 0));
    if (R.base)
        R.base->adamw_step_amax(param, param_bf16, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale,
                                dev, seg);
}
static void r_grad_sq_to_f64(double *out, const float *sq, int n, const float *loss, int n_loss) {
    REC(opc_grad_sq_to_f64(&c_, &R.dev, n, n_loss));
    if (R.base) R.base->grad_sq_to_f64(out, sq, n, loss, n_loss);
}
static void r_sum_f64(double *out, const double *in, int n) {
    REC(opc_sum_f64(&c_, &R.dev, n));
    if (R.base) R.base->sum_f64(out, in, n);
}
static void r_optim_scalars(ops_optim_state *s, const ops_optim_args *a) {
    REC(opc_optim_scalars(&c_, &R.dev));
    if (R.base) R.base->optim_scalars(s, a);
}
static uint64_t r_host_waits(void) { return R.base ? R.base->host_waits() : 0; }

/* ---------------------------------------------------------------------------- layers, bf16 */

static void r_embedding_forward_bf16(uint16_t *out, const int32_t *tokens, const uint16_t *wte, int n, int c,
                                     int v_start, int v_local) {
    REC(opc_embedding_forward(&c_, &R.dev, TETRA_BF16, out, tokens, wte, n, c, v_start, v_local));
    if (R.base) R.base->embedding_forward_bf16(out, tokens, wte, n, c, v_start, v_local);
}
static void r_embedding_backward_bf16(float *dwte, const uint16_t *dout, const int32_t *tokens, int n, int c,
                                      int v_start, int v_local) {
    REC(opc_embedding_backward(&c_, &R.dev, TETRA_BF16, dwte, dout, tokens, n, c, v_start, v_local));
    if (R.base) R.base->embedding_backward_bf16(dwte, dout, tokens, n, c, v_start, v_local);
}
static void r_rmsnorm_forward_bf16(uint16_t *out, float *rstd, float *amax, const uint16_t *x, const uint16_t *w, int n,
                                   int c, float eps) {
    REC(opc_rmsnorm_forward(&c_, &R.dev, TETRA_BF16, out, rstd, amax, x, w, n, c));
    if (R.base) R.base->rmsnorm_forward_bf16(out, rstd, amax, x, w, n, c, eps);
}
static void r_rmsnorm_backward_input_bf16(uint16_t *dx, float *amax, const uint16_t *dout, const uint16_t *x,
                                          const uint16_t *w, const float *rstd, int n, int c, const uint16_t *dres) {
    REC(opc_rmsnorm_backward_input(&c_, &R.dev, TETRA_BF16, dx, amax, dout, x, w, rstd, n, c));
    if (R.base) R.base->rmsnorm_backward_input_bf16(dx, amax, dout, x, w, rstd, n, c, dres);
}
static void r_rmsnorm_backward_weight_bf16(float *dw, const uint16_t *dout, const uint16_t *x, const float *rstd, int n,
                                           int c, int accumulate) {
    REC(opc_rmsnorm_backward_weight(&c_, &R.dev, TETRA_BF16, dw, dout, x, rstd, n, c, accumulate));
    if (R.base) R.base->rmsnorm_backward_weight_bf16(dw, dout, x, rstd, n, c, accumulate);
}
static void r_rope_forward_bf16(uint16_t *out, const uint16_t *x, const float *freqs, const int32_t *pos,
                                int pos_offset, int b, int s, int nh, int d, int out_ld, int x_ld) {
    REC(opc_rope(&c_, &R.dev, TETRA_BF16, 0, out, NULL, x, b, s, nh, d));
    if (R.base) R.base->rope_forward_bf16(out, x, freqs, pos, pos_offset, b, s, nh, d, out_ld, x_ld);
}
static void r_rope_backward_bf16(uint16_t *dx, float *amax, const uint16_t *dout, const float *freqs,
                                 const int32_t *pos, int pos_offset, int b, int s, int nh, int d, int dx_ld,
                                 int dout_ld) {
    REC(opc_rope(&c_, &R.dev, TETRA_BF16, 1, dx, amax, dout, b, s, nh, d));
    if (R.base) R.base->rope_backward_bf16(dx, amax, dout, freqs, pos, pos_offset, b, s, nh, d, dx_ld, dout_ld);
}
static void r_swiglu_forward_bf16(uint16_t *out, float *amax, const uint16_t *a, const uint16_t *g, size_t n) {
    REC(opc_swiglu_forward(&c_, &R.dev, TETRA_BF16, out, amax, a, g, n));
    if (R.base) R.base->swiglu_forward_bf16(out, amax, a, g, n);
}
static void r_swiglu_backward_bf16(uint16_t *da, uint16_t *dg, float *amax_da, float *amax_dg, const uint16_t *dout,
                                   const uint16_t *a, const uint16_t *g, size_t n) {
    REC(opc_swiglu_backward(&c_, &R.dev, TETRA_BF16, da, dg, amax_da, amax_dg, dout, a, g, n));
    if (R.base) R.base->swiglu_backward_bf16(da, dg, amax_da, amax_dg, dout, a, g, n);
}
static void r_attention_forward_bf16(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                     const ops_attn_shape *s, void *workspace) {
    REC(opc_attention_forward(&c_, &R.dev, TETRA_BF16, out, lse, q, k, v, s); doc_share(&c_, s));
    if (R.base) R.base->attention_forward_bf16(out, lse, q, k, v, s, workspace);
}
static void r_attention_backward_bf16(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout, const uint16_t *q,
                                      const uint16_t *k, const uint16_t *v, const uint16_t *out, const float *lse,
                                      const ops_attn_shape *s, void *workspace) {
    REC(opc_attention_backward(&c_, &R.dev, TETRA_BF16, dq, dk, dv, dout, q, k, v, out, lse, s); doc_share(&c_, s));
    if (R.base) R.base->attention_backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, s, workspace);
}

/* ---------------------------------------------------------------------------- the table */

static void fill_table(tetra_ops *t) {
    memset(t, 0, sizeof *t);
    t->name = R.base ? R.base->name : "cuda";
    t->alloc = r_alloc;
    t->release = r_release;
    t->copy_h2d = r_copy_h2d;
    t->copy_h2d_async = r_copy_h2d_async;
    t->copy_d2h = r_copy_d2h;
    t->copy = r_copy;
    t->synchronize = r_synchronize;
    t->fill = r_fill;
    t->scale = r_scale;
    t->axpy = r_axpy;
    t->add = r_add;
    t->sum_squares = r_sum_squares;
    t->sum = r_sum;
    t->amax = r_amax;
    t->amax_rows = r_amax_rows;
    t->amax_bf16 = r_amax_bf16;
    t->amax_rows_bf16 = r_amax_rows_bf16;
    t->amax_cols = r_amax_cols;
    t->transpose = r_transpose;
    t->cast_f32_to_bf16 = r_cast_f32_to_bf16;
    t->cast_bf16_to_f32 = r_cast_bf16_to_f32;
    t->cast_f32_to_fp8 = r_cast_f32_to_fp8;
    t->cast_bf16_to_fp8 = r_cast_bf16_to_fp8;
    t->cast_transpose_to_fp8 = r_cast_transpose_to_fp8;
    t->cast_fp8_to_f32 = r_cast_fp8_to_f32;
    t->cast_fp8_to_bf16 = r_cast_fp8_to_bf16;
    t->transpose_u8 = r_transpose_u8;
    t->fp8_scale_from_amax = r_fp8_scale_from_amax;
    t->fp8_quantize = r_fp8_quantize;
    t->gemm = r_gemm;
    t->embedding_forward = r_embedding_forward;
    t->embedding_backward = r_embedding_backward;
    t->rmsnorm_forward = r_rmsnorm_forward;
    t->rmsnorm_backward_input = r_rmsnorm_backward_input;
    t->rmsnorm_backward_weight = r_rmsnorm_backward_weight;
    t->rope_forward = r_rope_forward;
    t->rope_backward = r_rope_backward;
    t->swiglu_forward = r_swiglu_forward;
    t->swiglu_backward = r_swiglu_backward;
    t->attention_workspace_size = r_attention_workspace_size;
    t->attention_forward = r_attention_forward;
    t->attention_backward = r_attention_backward;
    t->attention_merge = r_attention_merge;
    t->cross_entropy = r_cross_entropy;
    t->cross_entropy_bf16 = r_cross_entropy_bf16;
    t->ce_shard_max = r_ce_shard_max;
    t->ce_shard_sums = r_ce_shard_sums;
    t->ce_shard_finish = r_ce_shard_finish;
    t->adamw_step = r_adamw_step;
    t->adamw_step_bf16 = r_adamw_step_bf16;
    t->adamw_step_amax = r_adamw_step_amax;
    t->grad_sq_to_f64 = r_grad_sq_to_f64;
    t->sum_f64 = r_sum_f64;
    t->optim_scalars = r_optim_scalars;
    t->host_waits = r_host_waits;
    t->embedding_forward_bf16 = r_embedding_forward_bf16;
    t->embedding_backward_bf16 = r_embedding_backward_bf16;
    t->rmsnorm_forward_bf16 = r_rmsnorm_forward_bf16;
    t->rmsnorm_backward_input_bf16 = r_rmsnorm_backward_input_bf16;
    t->rmsnorm_backward_weight_bf16 = r_rmsnorm_backward_weight_bf16;
    t->rope_forward_bf16 = r_rope_forward_bf16;
    t->rope_backward_bf16 = r_rope_backward_bf16;
    t->swiglu_forward_bf16 = r_swiglu_forward_bf16;
    t->swiglu_backward_bf16 = r_swiglu_backward_bf16;
    t->attention_workspace_size_bf16 = r_attention_workspace_size_bf16;
    t->attention_forward_bf16 = r_attention_forward_bf16;
    t->attention_backward_bf16 = r_attention_backward_bf16;
    t->alloc_count = r_alloc_count;
    t->allocated_bytes = r_allocated_bytes;
    t->memory_freeze = r_memory_freeze;
    t->device_memory = r_device_memory;
    t->compute_stream = r_compute_stream;
    t->range_push = r_range_push;
    t->range_pop = r_range_pop;
    t->set_deterministic = r_set_deterministic;
    t->host_memory = R.base ? R.base->host_memory : 0;
    t->select_device = R.base ? R.base->select_device : NULL;
    t->host_alloc = r_host_alloc;
    t->host_release = r_host_release;
    t->copy_2d = r_copy_2d;
    /* a graph launches what was recorded: the ops between its ends are the records */
    t->graph_begin = R.base ? R.base->graph_begin : NULL;
    t->graph_end = R.base ? R.base->graph_end : NULL;
    t->graph_stats = R.base ? R.base->graph_stats : NULL;
}

const tetra_ops *ops_record_table(const op_cost_device *dev, const tetra_ops *base) {
    if (!base && reserve_region()) return NULL;
    R.dev = *dev;
    R.doc_share = 1.0;
    R.base = base;
    R.active = 0;
    R.n = 0;
    R.depth = R.too_deep = 0;
    R.used = R.allocs = 0;
    fill_table(&R.table);
    return &R.table;
}
