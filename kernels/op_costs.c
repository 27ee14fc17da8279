/* op_costs.c — the shape-only description of the CUDA backend (op_costs.h). Each
 * function follows its CUDA op in kernels/cuda line by line: the same early returns, the
 * same launches, the same path decisions (kernels/ops_paths.h). */
#include "kernels/op_costs.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kernels/ops_paths.h"

op_cost_device op_cost_device_h100(void) {
    op_cost_device d;
    memset(&d, 0, sizeof d);
    d.sm_major = 9;
    d.sm_minor = 0;
    d.cudnn_version = 91400;
    d.outer_vector_scales = 0;
    return d;
}

const char *op_flop_kind_name(op_flop_kind k) {
    static const char *const n[OPC_FLOP_KINDS] = {
        "gemm_bf16", "gemm_fp8", "gemm_f32", "attention_tensor_core", "attention_cuda_core", "elementwise"};
    return (int)k >= 0 && k < OPC_FLOP_KINDS ? n[k] : "?";
}

const char *op_kind_name(op_kind k) {
    static const char *const n[OPK_COUNT] = {"copy_h2d",
                                             "copy_d2h",
                                             "copy",
                                             "copy_2d",
                                             "synchronize",
                                             "fill",
                                             "scale",
                                             "axpy",
                                             "add",
                                             "sum_squares",
                                             "sum",
                                             "amax",
                                             "amax_rows",
                                             "amax_bf16",
                                             "amax_rows_bf16",
                                             "amax_cols",
                                             "transpose",
                                             "cast_f32_to_bf16",
                                             "cast_bf16_to_f32",
                                             "cast_f32_to_fp8",
                                             "cast_bf16_to_fp8",
                                             "cast_transpose_to_fp8",
                                             "cast_fp8_to_f32",
                                             "fp8_scale_from_amax",
                                             "fp8_quantize",
                                             "gemm",
                                             "embedding_forward",
                                             "embedding_backward",
                                             "rmsnorm_forward",
                                             "rmsnorm_backward_input",
                                             "rmsnorm_backward_weight",
                                             "rope_forward",
                                             "rope_backward",
                                             "swiglu_forward",
                                             "swiglu_backward",
                                             "attention_forward",
                                             "attention_backward",
                                             "attention_merge",
                                             "cross_entropy",
                                             "ce_shard_max",
                                             "ce_shard_sums",
                                             "ce_shard_finish",
                                             "adamw_step",
                                             "adamw_step_bf16",
                                             "embedding_forward_bf16",
                                             "embedding_backward_bf16",
                                             "rmsnorm_forward_bf16",
                                             "rmsnorm_backward_input_bf16",
                                             "rmsnorm_backward_weight_bf16",
                                             "rope_forward_bf16",
                                             "rope_backward_bf16",
                                             "swiglu_forward_bf16",
                                             "swiglu_backward_bf16",
                                             "attention_forward_bf16",
                                             "attention_backward_bf16",
                                             "cross_entropy_bf16",
                                             "grad_sq_to_f64",
                                             "sum_f64",
                                             "optim_scalars",
                                             "cast_fp8_to_bf16",
                                             "transpose_u8"};
    return (int)k >= 0 && k < OPK_COUNT ? n[k] : "?";
}

int op_cost_launches(const op_cost *c) { return c->kernels + c->gemms + c->sorts + c->cudnn + c->copies; }

double op_cost_flops(const op_cost *c) {
    double f = 0;
    for (int i = 0; i < OPC_FLOP_KINDS; i++) f += c->flops[i];
    return f;
}

void op_cost_add(op_cost *a, const op_cost *b) {
    a->kernels += b->kernels;
    a->gemms += b->gemms;
    a->sorts += b->sorts;
    a->cudnn += b->cudnn;
    a->copies += b->copies;
    a->syncs += b->syncs;
    a->read += b->read;
    a->written += b->written;
    a->host_bytes += b->host_bytes;
    for (int i = 0; i < OPC_FLOP_KINDS; i++) a->flops[i] += b->flops[i];
}

/* ---------------------------------------------------------------------------- helpers */

static void begin(op_cost *o, op_kind k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void begin(op_cost *o, op_kind k, const char *fmt, ...) {
    memset(o, 0, sizeof *o);
    o->op = k;
    int w = snprintf(o->what, sizeof o->what, "%s ", op_kind_name(k));
    if (w < 0 || (size_t)w >= sizeof o->what) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->what + w, sizeof o->what - (size_t)w, fmt, ap);
    va_end(ap);
}

static void set_path(op_cost *o, const char *p) { snprintf(o->path, sizeof o->path, "%s", p); }

static const char *dt(tetra_dtype t) {
    switch (t) {
    case TETRA_F32: return "f32";
    case TETRA_BF16: return "bf16";
    case TETRA_F16: return "f16";
    case TETRA_FP8_E4M3: return "e4m3";
    case TETRA_FP8_E5M2: return "e5m2";
    case TETRA_I32: return "i32";
    }
    return "?";
}

static double es(tetra_dtype t) { return (double)tetra_dtype_size(t); }

/* One elementwise kernel: r bytes read, w written, f fp32 operations. */
static void kernel(op_cost *o, double r, double w, double f) {
    o->kernels++;
    o->read += r;
    o->written += w;
    o->flops[OPC_FLOP_ELEMENT] += f;
}

/* kernels/cuda/cuda_backend.cu: partial blocks of the two-pass reductions */
/* the blocks of an element-wise kernel with an amax (tetra_blocks, at most 1024) */
static double swiglu_amax_blocks(size_t n) {
    size_t b = (n + 255) / 256;
    if (b < 1) b = 1;
    if (b > 1024) b = 1024;
    return (double)b;
}

static double red_parts(size_t n) {
    size_t p = (n + 8191) / 8192;
    if (p < 1) p = 1;
    if (p > 1024) p = 1024;
    return (double)p;
}

static size_t rc(int rows, int cols) { return (size_t)(rows > 0 ? rows : 0) * (size_t)(cols > 0 ? cols : 0); }

/* ---------------------------------------------------------------------------- memory */

void opc_copy_h2d(op_cost *o, const op_cost_device *d, void *dst, const void *src, size_t bytes) {
    (void)d, (void)dst, (void)src;
    begin(o, OPK_COPY_H2D, "%zu B", bytes);
    if (!bytes) return;
    o->copies = 1;
    o->syncs = 1; /* the host's buffer may be reused at once: the copy is waited for */
    o->host_bytes = (double)bytes;
    o->written = (double)bytes;
}

void opc_copy_h2d_async(op_cost *o, const op_cost_device *d, void *dst, const void *src, size_t bytes) {
    opc_copy_h2d(o, d, dst, src, bytes);
    o->syncs = 0;
}

void opc_copy_d2h(op_cost *o, const op_cost_device *d, void *dst, const void *src, size_t bytes) {
    (void)d, (void)dst, (void)src;
    begin(o, OPK_COPY_D2H, "%zu B", bytes);
    if (!bytes) return;
    o->copies = 1;
    o->syncs = 1;
    o->host_bytes = (double)bytes;
    o->read = (double)bytes;
}

void opc_copy(op_cost *o, const op_cost_device *d, void *dst, const void *src, size_t bytes) {
    (void)d;
    begin(o, OPK_COPY, "%.1f MiB", (double)bytes / 1048576.0);
    if (!bytes || dst == src) return;
    o->copies = 1;
    o->read = o->written = (double)bytes;
}

void opc_copy_2d(op_cost *o, const op_cost_device *d, void *dst, size_t dpitch, const void *src, size_t spitch,
                 size_t width, size_t rows) {
    (void)d, (void)dst, (void)dpitch, (void)src, (void)spitch;
    begin(o, OPK_COPY_2D, "%zu x %zu B", rows, width);
    if (!width || !rows) return;
    o->copies = 1;
    o->read = o->written = (double)width * (double)rows;
}

void opc_synchronize(op_cost *o, const op_cost_device *d) {
    (void)d;
    begin(o, OPK_SYNCHRONIZE, "stream");
    o->syncs = 1;
}

/* ---------------------------------------------------------------------------- elementwise and reductions */

void opc_fill(op_cost *o, const op_cost_device *d, float *x, float value, size_t n) {
    (void)d, (void)x, (void)value;
    begin(o, OPK_FILL, "%zu f32", n);
    if (n) kernel(o, 0, 4.0 * n, 0);
}

void opc_scale(op_cost *o, const op_cost_device *d, float *x, float alpha, size_t n) {
    (void)d, (void)x, (void)alpha;
    begin(o, OPK_SCALE, "%zu f32", n);
    if (n) kernel(o, 4.0 * n, 4.0 * n, (double)n);
}

void opc_axpy(op_cost *o, const op_cost_device *d, float *y, const float *x, float alpha, size_t n) {
    (void)d, (void)y, (void)x, (void)alpha;
    begin(o, OPK_AXPY, "%zu f32", n);
    if (n) kernel(o, 8.0 * n, 4.0 * n, 2.0 * n);
}

void opc_add(op_cost *o, const op_cost_device *d, float *out, const float *a, const float *b, size_t n) {
    (void)d, (void)out, (void)a, (void)b;
    begin(o, OPK_ADD, "%zu f32", n);
    if (n) kernel(o, 8.0 * n, 4.0 * n, (double)n);
}

/* partials in double, then one block sums them (and, accumulating, reads out) */
static void two_pass_sum(op_cost *o, size_t n, int accumulate, double per_elem) {
    const double p = red_parts(n);
    kernel(o, 4.0 * n, 8.0 * p, per_elem * n);
    kernel(o, 8.0 * p + (accumulate ? 4.0 : 0.0), 4.0, p);
}

void opc_sum_squares(op_cost *o, const op_cost_device *d, float *out, const float *x, size_t n) {
    (void)d, (void)out, (void)x;
    begin(o, OPK_SUM_SQUARES, "%zu f32", n);
    if (n) two_pass_sum(o, n, 1, 2.0);
}

void opc_sum(op_cost *o, const op_cost_device *d, float *out, const float *x, size_t n) {
    (void)d, (void)out, (void)x;
    begin(o, OPK_SUM, "%zu f32", n);
    two_pass_sum(o, n, 0, 1.0); /* both passes even for n = 0 (the final block writes 0) */
}

/* one launch: the partials, and the last block's reduction of them (n = 0: one block
 * writes 0) */
static void amax_passes(op_cost *o, size_t n, double elem) {
    const double p = red_parts(n);
    kernel(o, elem * n + 4.0 * p, 4.0 * p + 4.0, (double)n + p);
}

void opc_amax(op_cost *o, const op_cost_device *d, float *out, const float *x, size_t n) {
    (void)d, (void)out, (void)x;
    begin(o, OPK_AMAX, "%zu f32", n);
    amax_passes(o, n, 4.0);
}

void opc_amax_bf16(op_cost *o, const op_cost_device *d, float *out, const uint16_t *x, size_t n) {
    (void)d, (void)out, (void)x;
    begin(o, OPK_AMAX_BF16, "%zu bf16", n);
    amax_passes(o, n, 2.0);
}

/* one block per row; no columns: a fill of zeros */
static void amax_rows_passes(op_cost *o, int rows, int cols, double elem) {
    if (rows <= 0) return;
    if (cols <= 0) kernel(o, 0, 4.0 * rows, 0);
    else kernel(o, elem * rc(rows, cols), 4.0 * rows, (double)rc(rows, cols));
}

void opc_amax_rows(op_cost *o, const op_cost_device *d, float *out, const float *x, int rows, int cols) {
    (void)d, (void)out, (void)x;
    begin(o, OPK_AMAX_ROWS, "%dx%d f32", rows, cols);
    amax_rows_passes(o, rows, cols, 4.0);
}

void opc_amax_rows_bf16(op_cost *o, const op_cost_device *d, float *out, const uint16_t *x, int rows, int cols) {
    (void)d, (void)out, (void)x;
    begin(o, OPK_AMAX_ROWS_BF16, "%dx%d bf16", rows, cols);
    amax_rows_passes(o, rows, cols, 2.0);
}

void opc_amax_cols(op_cost *o, const op_cost_device *d, float *out, const void *x, tetra_dtype xt, int rows, int cols) {
    (void)d, (void)out, (void)x;
    begin(o, OPK_AMAX_COLS, "%dx%d %s", rows, cols, dt(xt));
    if (cols <= 0) return;
    if (rows <= 0) kernel(o, 0, 4.0 * cols, 0);
    else kernel(o, es(xt) * rc(rows, cols), 4.0 * cols, (double)rc(rows, cols));
}

void opc_transpose(op_cost *o, const op_cost_device *d, float *out, const float *x, int rows, int cols) {
    (void)d, (void)out, (void)x;
    begin(o, OPK_TRANSPOSE, "%dx%d f32", rows, cols);
    if (rows > 0 && cols > 0) kernel(o, 4.0 * rc(rows, cols), 4.0 * rc(rows, cols), 0);
}

void opc_transpose_u8(op_cost *o, const op_cost_device *d, uint8_t *out, const uint8_t *x, int rows, int cols) {
    (void)d, (void)out, (void)x;
    begin(o, OPK_TRANSPOSE_U8, "%dx%d u8", rows, cols);
    if (rows > 0 && cols > 0) kernel(o, (double)rc(rows, cols), (double)rc(rows, cols), 0);
}

/* ---------------------------------------------------------------------------- casts */

void opc_cast_f32_to_bf16(op_cost *o, const op_cost_device *d, uint16_t *out, const float *x, size_t n) {
    (void)d, (void)out, (void)x;
    begin(o, OPK_CAST_F32_TO_BF16, "%zu", n);
    if (n) kernel(o, 4.0 * n, 2.0 * n, (double)n);
}

void opc_cast_bf16_to_f32(op_cost *o, const op_cost_device *d, float *out, const uint16_t *x, size_t n) {
    (void)d, (void)out, (void)x;
    begin(o, OPK_CAST_BF16_TO_F32, "%zu", n);
    if (n) kernel(o, 2.0 * n, 4.0 * n, 0);
}

/* the scales an fp8 cast reads: one, or one per row */
static double scale_bytes(int rowwise, int rows) { return rowwise ? 4.0 * (rows > 0 ? rows : 0) : 4.0; }

void opc_cast_f32_to_fp8(op_cost *o, const op_cost_device *d, uint8_t *out, const float *x, const float *scale,
                         int rowwise, int rows, int cols, tetra_dtype fmt) {
    (void)d, (void)out, (void)x, (void)scale;
    begin(o, OPK_CAST_F32_TO_FP8, "%dx%d %s%s", rows, cols, dt(fmt), rowwise ? " rowwise" : "");
    const size_t n = rc(rows, cols);
    if (n) kernel(o, 4.0 * n + scale_bytes(rowwise, rows), (double)n, 2.0 * n);
}

void opc_cast_bf16_to_fp8(op_cost *o, const op_cost_device *d, uint8_t *out, const uint16_t *x, const float *scale,
                          int rowwise, int rows, int cols, tetra_dtype fmt) {
    (void)d, (void)out, (void)x, (void)scale;
    begin(o, OPK_CAST_BF16_TO_FP8, "%dx%d %s%s", rows, cols, dt(fmt), rowwise ? " rowwise" : "");
    const size_t n = rc(rows, cols);
    if (n) kernel(o, 2.0 * n + scale_bytes(rowwise, rows), (double)n, 2.0 * n);
}

void opc_cast_transpose_to_fp8(op_cost *o, const op_cost_device *d, uint8_t *out, const void *x, tetra_dtype xt,
                               const float *scale, int rows, int cols, tetra_dtype fmt) {
    (void)d, (void)out, (void)x, (void)scale;
    begin(o, OPK_CAST_TRANSPOSE_TO_FP8, "%dx%d %s to %s", rows, cols, dt(xt), dt(fmt));
    if (rows <= 0 || cols <= 0) return;
    const size_t n = rc(rows, cols);
    kernel(o, es(xt) * n + 4.0 * cols, (double)n, 2.0 * n);
}

/* codes and scales in, out_bytes per element out */
static void fp8_decode(op_cost *o, op_kind k, int rowwise, int rows, int cols, tetra_dtype fmt, double out_bytes) {
    begin(o, k, "%dx%d %s%s", rows, cols, dt(fmt), rowwise ? " rowwise" : "");
    const size_t n = rc(rows, cols);
    if (n) kernel(o, (double)n + scale_bytes(rowwise, rows), out_bytes * n, (double)n);
}

void opc_cast_fp8_to_f32(op_cost *o, const op_cost_device *d, float *out, const uint8_t *q, const float *inv_scale,
                         int rowwise, int rows, int cols, tetra_dtype fmt) {
    (void)d, (void)out, (void)q, (void)inv_scale;
    fp8_decode(o, OPK_CAST_FP8_TO_F32, rowwise, rows, cols, fmt, 4.0);
}

void opc_cast_fp8_to_bf16(op_cost *o, const op_cost_device *d, uint16_t *out, const uint8_t *q, const float *inv_scale,
                          int rowwise, int rows, int cols, tetra_dtype fmt) {
    (void)d, (void)out, (void)q, (void)inv_scale;
    fp8_decode(o, OPK_CAST_FP8_TO_BF16, rowwise, rows, cols, fmt, 2.0);
}

void opc_fp8_scale_from_amax(op_cost *o, const op_cost_device *d, float *scale, float *inv_scale, const float *amax,
                             int n, int broadcast, float fp8_max, int pow2) {
    (void)d, (void)scale, (void)amax, (void)fp8_max;
    begin(o, OPK_FP8_SCALE_FROM_AMAX, "%d%s%s", n, broadcast ? " broadcast" : "", pow2 ? " pow2" : "");
    if (n <= 0) return;
    kernel(o, 4.0 * (broadcast ? 1 : n), 4.0 * n * (inv_scale ? 2 : 1), 4.0 * n);
}

/* ---------------------------------------------------------------------------- gemm (cuda_gemm.cu) */

/* the pack kernel: an operand converted and/or transposed into a dense scratch copy */
static void pack(op_cost *o, size_t elems, tetra_dtype in, tetra_dtype out) {
    kernel(o, es(in) * elems, es(out) * elems, 0);
}

/* the epilogue kernel: C = alpha sa sb acc + beta C, acc fp32 [batch, m, n] (NULL for k = 0),
 * with the dequant scales there are (one, or one per row of A and per column of B) */
static void epilogue(op_cost *o, const ops_gemm_desc *g, double mn, int with_acc, int rowwise) {
    const double cs = es(g->c_type);
    double scales = 0.0;
    if (with_acc && g->a_scale) scales += rowwise ? 4.0 * g->m : 4.0;
    if (with_acc && g->b_scale) scales += rowwise ? 4.0 * g->n : 4.0;
    kernel(o, (with_acc ? 4.0 * mn : 0.0) + (g->beta != 0.0f ? cs * mn : 0.0) + scales, cs * mn, 3.0 * mn);
}

/* one cuBLASLt matmul of the operands as they are now (types ta, tb) into a C of type ct */
static void matmul(op_cost *o, const ops_gemm_desc *g, tetra_dtype ta, tetra_dtype tb, tetra_dtype ct, double beta_c,
                   op_flop_kind kind) {
    const int batch = g->batch > 1 ? g->batch : 1;
    const double mk = (double)g->m * g->k * batch, nk = (double)g->n * g->k * batch, mn = (double)g->m * g->n * batch;
    o->gemms++;
    o->read += es(ta) * mk + es(tb) * nk + beta_c * es(ct) * mn;
    o->written += es(ct) * mn;
    o->flops[kind] += 2.0 * (double)g->m * g->n * g->k * batch;
}

static int has_fp8_tensor_cores(const op_cost_device *d) {
    return d->sm_major > 8 || (d->sm_major == 8 && d->sm_minor >= 9);
}

void opc_gemm(op_cost *o, const op_cost_device *d, void *c, const void *a, const void *b, const ops_gemm_desc *g) {
    const int batch = g->batch > 1 ? g->batch : 1;
    char xb[16] = "";
    if (batch > 1) snprintf(xb, sizeof xb, " x%d", batch);
    begin(o, OPK_GEMM, "%dx%dx%d %s%s x %s%s -> %s%s%s", g->m, g->n, g->k, dt(g->a_type), g->trans_a ? "^T" : "",
          dt(g->b_type), g->trans_b ? "^T" : "", dt(g->c_type), g->beta != 0.0f ? " +C" : "", xb);
    if (g->m <= 0 || g->n <= 0) return;
    const int rowwise = g->scale_rowwise && (g->a_scale || g->b_scale);
    const double mn = (double)g->m * g->n * batch, beta_c = g->beta != 0.0f ? 1.0 : 0.0;
    if (g->k <= 0) { /* C = beta C */
        epilogue(o, g, mn, 0, 0);
        set_path(o, "k=0");
        return;
    }
    if (ops_path_gemm_fp8_pair(g->a_type, g->b_type) && ops_path_gemm_fp8_shape(g, c)) {
        /* both operands K-major: the other layout is transposed into scratch first */
        if (!ops_path_gemm_kmajor_ok(0, g->trans_a ? 1 : 0, g->lda, a, batch, g->stride_a))
            pack(o, (size_t)g->m * (size_t)g->k * (size_t)batch, g->a_type, g->a_type);
        if (!ops_path_gemm_kmajor_ok(1, g->trans_b ? 1 : 0, g->ldb, b, batch, g->stride_b))
            pack(o, (size_t)g->n * (size_t)g->k * (size_t)batch, g->b_type, g->b_type);
        if (has_fp8_tensor_cores(d)) {
            if (!rowwise) {
                matmul(o, g, g->a_type, g->b_type, g->c_type, beta_c, OPC_FLOP_GEMM_FP8);
                set_path(o, "fp8");
                return;
            }
            if (g->a_scale && g->b_scale && d->outer_vector_scales) {
                matmul(o, g, g->a_type, g->b_type, g->c_type, beta_c, OPC_FLOP_GEMM_FP8);
                o->read += 4.0 * (g->m + g->n);
                set_path(o, "fp8+rowwise");
                return;
            }
            /* the unscaled product into fp32 scratch, the scales in the epilogue */
            matmul(o, g, g->a_type, g->b_type, TETRA_F32, 0.0, OPC_FLOP_GEMM_FP8);
            epilogue(o, g, mn, 1, 1);
            set_path(o, "fp8+epilogue");
            return;
        }
        /* no fp8 kernels on this device: the packs were made for nothing, then widened */
    }
    const tetra_dtype common = ops_path_gemm_common(g->a_type, g->b_type);
    if (g->a_type != common) pack(o, (size_t)g->m * (size_t)g->k * (size_t)batch, g->a_type, common);
    if (g->b_type != common) pack(o, (size_t)g->n * (size_t)g->k * (size_t)batch, g->b_type, common);
    const op_flop_kind kind = common == TETRA_F32 ? OPC_FLOP_GEMM_F32 : OPC_FLOP_GEMM_BF16;
    if (ops_path_gemm_direct(g, common)) {
        matmul(o, g, common, common, g->c_type, beta_c, kind);
        set_path(o, common == TETRA_F32 ? "f32" : "bf16");
        return;
    }
    matmul(o, g, common, common, TETRA_F32, 0.0, kind);
    epilogue(o, g, mn, 1, rowwise);
    set_path(o, common == TETRA_F32 ? "f32+epilogue" : "bf16+epilogue");
}

/* ---------------------------------------------------------------------------- layers (cuda_layers.cu) */

static op_kind twin(tetra_dtype t, op_kind f32, op_kind bf16) { return t == TETRA_BF16 ? bf16 : f32; }

void opc_embedding_forward(op_cost *o, const op_cost_device *d, tetra_dtype t, void *out, const int32_t *tokens,
                           const void *wte, int n, int c, int v_start, int v_local) {
    (void)d, (void)out, (void)tokens, (void)wte, (void)v_start;
    begin(o, twin(t, OPK_EMBEDDING_FORWARD, OPK_EMBEDDING_FORWARD_BF16), "%dx%d of %d", n, c, v_local);
    if (n <= 0 || c <= 0) return;
    kernel(o, 4.0 * n + es(t) * rc(n, c), es(t) * rc(n, c), 0);
}

void opc_embedding_backward(op_cost *o, const op_cost_device *d, tetra_dtype t, float *dwte, const void *dout,
                            const int32_t *tokens, int n, int c, int v_start, int v_local) {
    (void)d, (void)dwte, (void)dout, (void)tokens, (void)v_start;
    begin(o, twin(t, OPK_EMBEDDING_BACKWARD, OPK_EMBEDDING_BACKWARD_BF16), "%dx%d into %d rows", n, c, v_local);
    if (n <= 0 || c <= 0 || v_local <= 0) return;
    int end_bit = 0;
    while (end_bit < 31 && ((int64_t)1 << end_bit) <= (int64_t)v_local) end_bit++;
    kernel(o, 4.0 * n, 8.0 * n, 0); /* (token, position) keys */
    /* CUB's radix sort, an estimate of its passes: a histogram read of the keys, then each
     * 8-bit digit reads and writes keys and values */
    const int passes = (end_bit + 7) / 8;
    o->sorts++;
    o->read += 4.0 * n + passes * 8.0 * n;
    o->written += passes * 8.0 * n;
    /* the runs' rows: at most min(n, v_local) distinct rows of dwte, read and written */
    const double rows = n < v_local ? n : v_local;
    kernel(o, 8.0 * n + es(t) * rc(n, c) + 4.0 * rows * c, 4.0 * rows * c, (double)rc(n, c));
}

/* with amax: at most 1024 blocks walk the rows, and the last one reduces their maxima
 * (kernels/cuda/cuda_layers.cu); no rows: one block writes 0 */
void opc_rmsnorm_forward(op_cost *o, const op_cost_device *d, tetra_dtype t, void *out, float *rstd, float *amax,
                         const void *x, const void *w, int n, int c) {
    (void)d, (void)out, (void)rstd, (void)x, (void)w;
    begin(o, twin(t, OPK_RMSNORM_FORWARD, OPK_RMSNORM_FORWARD_BF16), "%dx%d%s", n, c, amax ? " with amax" : "");
    if (n <= 0 || c <= 0) {
        if (amax) kernel(o, 0, 4.0, 0);
        return;
    }
    kernel(o, es(t) * rc(n, c) + es(t) * c, es(t) * rc(n, c) + 4.0 * n, 4.0 * rc(n, c));
    if (amax) {
        const double p = n < 1024 ? n : 1024;
        o->read += 4.0 * p;
        o->written += 4.0 * (p + 1);
        o->flops[OPC_FLOP_ELEMENT] += (double)rc(n, c);
    }
}

void opc_rmsnorm_backward_input(op_cost *o, const op_cost_device *d, tetra_dtype t, void *dx, float *amax,
                                const void *dout, const void *x, const void *w, const float *rstd, int n, int c) {
    (void)d, (void)dx, (void)dout, (void)x, (void)w, (void)rstd;
    begin(o, twin(t, OPK_RMSNORM_BACKWARD_INPUT, OPK_RMSNORM_BACKWARD_INPUT_BF16), "%dx%d%s", n, c,
          amax ? " with amax" : "");
    if (n <= 0 || c <= 0) {
        if (amax) kernel(o, 0, 4.0, 0);
        return;
    }
    /* dout, x and the residual gradient (dx itself or another buffer) read; dx written */
    kernel(o, 3.0 * es(t) * rc(n, c) + es(t) * c + 4.0 * n, es(t) * rc(n, c), 8.0 * rc(n, c));
    if (amax) { /* as rmsnorm_forward's: a partial per block (at most 1024), the last block's fold */
        const double p = n < 1024 ? n : 1024;
        o->read += 4.0 * p;
        o->written += 4.0 * (p + 1);
        o->flops[OPC_FLOP_ELEMENT] += (double)rc(n, c);
    }
}

void opc_rmsnorm_backward_weight(op_cost *o, const op_cost_device *d, tetra_dtype t, float *dw, const void *dout,
                                 const void *x, const float *rstd, int n, int c, int accumulate) {
    (void)d, (void)dw, (void)dout, (void)x, (void)rstd;
    begin(o, twin(t, OPK_RMSNORM_BACKWARD_WEIGHT, OPK_RMSNORM_BACKWARD_WEIGHT_BF16), "%dx%d%s", n, c,
          accumulate ? "" : " =");
    if (c <= 0) return;
    if (n <= 0) { /* no rows: an overwrite still writes the empty sum */
        if (!accumulate) kernel(o, 0.0, 4.0 * c, 0.0);
        return;
    }
    int rpc = (n + 255) / 256;
    if (rpc < 64) rpc = 64;
    const double chunks = (double)((n + rpc - 1) / rpc);
    kernel(o, 2.0 * es(t) * rc(n, c) + 4.0 * n, 8.0 * chunks * c, 3.0 * rc(n, c)); /* partials in double */
    /* their sum into dw (added to what it held, unless it overwrites) */
    kernel(o, 8.0 * chunks * c + (accumulate ? 4.0 * c : 0.0), 4.0 * c, chunks * c);
}

/* with amax: the same launch also writes a partial per block, which its last block reduces
 * (kernels/cuda/cuda_layers.cu); n = 0 still launches, to write 0 */
static void amax_tail(op_cost *o, size_t n, int k) {
    const double p = swiglu_amax_blocks(n);
    o->read += 4.0 * p * k;
    o->written += 4.0 * (p + 1) * k;
    o->flops[OPC_FLOP_ELEMENT] += (double)n * k;
}

/* with amax (backward, bf16): at most 1024 blocks, finished as amax is; empty: one block
 * writes 0 */
void opc_rope(op_cost *o, const op_cost_device *d, tetra_dtype t, int backward, void *out, float *amax, const void *x,
              int b, int s, int nh, int dh) {
    (void)d, (void)out, (void)x;
    begin(o,
          backward ? twin(t, OPK_ROPE_BACKWARD, OPK_ROPE_BACKWARD_BF16)
                   : twin(t, OPK_ROPE_FORWARD, OPK_ROPE_FORWARD_BF16),
          "b%d s%d h%d d%d%s", b, s, nh, dh, amax ? " with amax" : "");
    if (b <= 0 || s <= 0 || nh <= 0 || dh < 2) {
        if (amax) kernel(o, 0, 4.0, 0);
        return;
    }
    const double pairs = (double)b * s * nh * (dh / 2);
    /* the rows' angles: one (cos, sin) table row per position */
    kernel(o, 2.0 * es(t) * pairs + 8.0 * (double)s * (dh / 2), 2.0 * es(t) * pairs, 6.0 * pairs);
    if (amax) amax_tail(o, (size_t)pairs, 1);
}

void opc_swiglu_forward(op_cost *o, const op_cost_device *d, tetra_dtype t, void *out, float *amax, const void *a,
                        const void *g, size_t n) {
    (void)d, (void)out, (void)a, (void)g;
    begin(o, twin(t, OPK_SWIGLU_FORWARD, OPK_SWIGLU_FORWARD_BF16), "%zu%s", n, amax ? " with amax" : "");
    if (n || amax) kernel(o, 2.0 * es(t) * n, es(t) * n, 6.0 * n);
    if (amax) amax_tail(o, n, 1);
}

void opc_swiglu_backward(op_cost *o, const op_cost_device *d, tetra_dtype t, void *da, void *dg, float *amax_da,
                         float *amax_dg, const void *dout, const void *a, const void *g, size_t n) {
    (void)d, (void)da, (void)dg, (void)dout, (void)a, (void)g;
    const int amax = amax_da || amax_dg;
    begin(o, twin(t, OPK_SWIGLU_BACKWARD, OPK_SWIGLU_BACKWARD_BF16), "%zu%s", n, amax ? " with amax" : "");
    if (n || amax) kernel(o, 3.0 * es(t) * n, 2.0 * es(t) * n, 12.0 * n);
    if (amax) amax_tail(o, n, 2);
}

/* ---------------------------------------------------------------------------- attention (cuda_attention.cu) */

double opc_attention_pairs(const ops_attn_shape *s) {
    if (s->sq <= 0 || s->sk <= 0) return 0.0;
    if (!s->causal) return (double)s->sq * s->sk;
    const long long delta = (long long)s->q_offset - s->k_offset;
    double p = 0.0;
    for (int i = 0; i < s->sq; i++) {
        long long v = delta + i + 1;
        p += (double)(v < 0 ? 0 : v > s->sk ? s->sk : v);
    }
    return p;
}

static void attn_label(op_cost *o, op_kind k, const ops_attn_shape *s) {
    char off[48] = "";
    if (s->q_offset || s->k_offset) snprintf(off, sizeof off, " q@%d k@%d", s->q_offset, s->k_offset);
    begin(o, k, "b%d h%d/%d sq%d sk%d d%d%s%s", s->b, s->h, s->kv, s->sq, s->sk, s->d, s->causal ? " causal" : "", off);
}

/* cuDNN runs this direction: a cuDNN of a version without a known problem for it, a shape
 * it takes on this device, every tensor on 16 bytes (the plan is assumed to build) */
static int cudnn_runs(const op_cost_device *d, const ops_attn_shape *s, int backward, const void *const *ptrs, int n) {
    if (!d->cudnn_version || !ops_path_cudnn_sdpa_shape(s, d->sm_major, d->cudnn_version)) return 0;
    if (ops_path_cudnn_version_problem(d->cudnn_version, backward, s->sk) || ops_path_cudnn_shape_problem(s, backward))
        return 0;
    for (int i = 0; i < n; i++)
        if (!ops_path_aligned16(ptrs[i])) return 0;
    return 1;
}

void opc_attention_forward(op_cost *o, const op_cost_device *d, tetra_dtype t, void *out, float *lse, const void *q,
                           const void *k, const void *v, const ops_attn_shape *s) {
    attn_label(o, twin(t, OPK_ATTENTION_FORWARD, OPK_ATTENTION_FORWARD_BF16), s);
    if (s->b <= 0 || s->sq <= 0 || s->h <= 0) return;
    const double e = es(t), nq = (double)s->b * s->sq * s->h * s->d,
                 nk = (double)s->b * (s->sk > 0 ? s->sk : 0) * s->kv * s->d;
    const double flops = 4.0 * s->d * opc_attention_pairs(s) * s->b * s->h;
    o->read = e * (nq + 2.0 * nk);
    o->written = e * nq + 4.0 * s->b * s->h * s->sq;
    const void *ptrs[5] = {out, lse, q, k, v};
    if (t == TETRA_BF16 && cudnn_runs(d, s, 0, ptrs, 5)) {
        o->cudnn = 1;
        o->flops[OPC_FLOP_ATTN_TC] = flops;
        set_path(o, "cudnn");
        return;
    }
    o->kernels = 1;
    if (t == TETRA_BF16 && ops_path_attention_tc(s)) /* tensor cores: S, then P V as two bf16 terms */
        o->flops[OPC_FLOP_ATTN_TC] = 1.5 * flops;
    else o->flops[OPC_FLOP_ATTN_F32] = flops;
    set_path(o, "built-in");
}

void opc_attention_backward(op_cost *o, const op_cost_device *d, tetra_dtype t, void *dq, void *dk, void *dv,
                            const void *dout, const void *q, const void *k, const void *v, const void *out,
                            const float *lse, const ops_attn_shape *s) {
    attn_label(o, twin(t, OPK_ATTENTION_BACKWARD, OPK_ATTENTION_BACKWARD_BF16), s);
    const int masked = s->causal && (long long)s->q_offset - s->k_offset + s->sq <= 0;
    const double e = es(t);
    if (t == TETRA_F32) {
        if (s->b <= 0 || s->sq <= 0 || s->sk <= 0 || s->h <= 0 || masked) return;
    } else {
        if (s->b <= 0 || s->h <= 0 || s->kv <= 0 || s->d <= 0) return;
        const double nq = s->sq > 0 ? (double)s->b * s->sq * s->h * s->d : 0;
        const double nk = s->sk > 0 ? (double)s->b * s->sk * s->kv * s->d : 0;
        if (!nq || !nk || masked) { /* nothing visible: the written gradients are zeroed */
            o->copies = (nq ? 1 : 0) + (nk ? 2 : 0);
            o->written = e * (nq + 2.0 * nk);
            set_path(o, "zeros");
            return;
        }
    }
    const double nq = (double)s->b * s->sq * s->h * s->d, nk = (double)s->b * s->sk * s->kv * s->d;
    const double rows = (double)s->b * s->h * s->sq, pairs = opc_attention_pairs(s) * s->b * s->h;
    const void *ptrs[9] = {dq, dk, dv, dout, q, k, v, out, lse};
    if (t == TETRA_BF16 && cudnn_runs(d, s, 1, ptrs, 9)) {
        /* cuDNN's graph: q, k, v, out, dout and the lse in, dq, dk, dv out, and (an estimate of its
         * internal passes) the rowsum(dO O) and the fp32 dQ accumulator written and read back;
         * the deterministic graph writes dq directly, without the accumulator */
        const double acc = d->deterministic ? 0.0 : 4.0 * nq;
        o->cudnn = 1;
        o->read = e * (3.0 * nq + 2.0 * nk) + 4.0 * rows + 4.0 * rows + acc;
        o->written = e * (nq + 2.0 * nk) + 4.0 * rows + acc;
        if (!d->deterministic && ops_path_cudnn_zero_dq_accum(d->cudnn_version)) {
            o->copies = 1;
            o->written += 4.0 * nq;
        }
        o->flops[OPC_FLOP_ATTN_TC] = 10.0 * s->d * pairs; /* S, dP, dV, dK, dQ */
        set_path(o, "cudnn");
        return;
    }
    /* built-in: Dv = rowsum(dO O); a pass owning dK, dV; a pass owning dQ. The fp32 op adds
     * into the gradients (read and written), the bf16 op writes them. */
    const double acc = t == TETRA_F32 ? 1.0 : 0.0;
    kernel(o, 2.0 * e * nq, 4.0 * rows, 2.0 * nq);
    o->kernels += 2;
    o->read += 2.0 * (e * (2.0 * nq + 2.0 * nk) + 8.0 * rows) + acc * e * (nq + 2.0 * nk);
    o->written += e * (nq + 2.0 * nk);
    if (t == TETRA_BF16 && ops_path_attention_tc(s)) /* S and dP twice; dV, dK, dQ as two bf16 terms each */
        o->flops[OPC_FLOP_ATTN_TC] = 20.0 * s->d * pairs;
    else o->flops[OPC_FLOP_ATTN_F32] = 14.0 * s->d * pairs; /* S and dP twice (once per pass), dV, dK, dQ */
    set_path(o, "built-in");
}

void opc_attention_merge(op_cost *o, const op_cost_device *d, int b, int sq, int h, int dh) {
    (void)d;
    begin(o, OPK_ATTENTION_MERGE, "b%d sq%d h%d d%d", b, sq, h, dh);
    const double rows = (double)b * sq * h;
    if (rows <= 0) return;
    kernel(o, 8.0 * rows * dh + 8.0 * rows, 4.0 * rows * dh + 4.0 * rows, 3.0 * rows * dh);
}

/* ---------------------------------------------------------------------------- loss and optimizer */

/* A block per row, a pass over the row for the max and sum, another writing dlogits: the
 * row is read again from device memory when it does not stay on chip. */
static double row_passes(int v, size_t es, int grad) { return grad && (size_t)v * es > OPC_ON_CHIP_BYTES ? 2.0 : 1.0; }

void opc_cross_entropy(op_cost *o, const op_cost_device *d, const float *dlogits, int n, int v) {
    (void)d;
    begin(o, OPK_CROSS_ENTROPY, "%dx%d%s", n, v, dlogits ? " with dlogits" : "");
    if (n <= 0) return;
    const double nv = (double)n * v;
    kernel(o, row_passes(v, sizeof(float), dlogits != NULL) * 4.0 * nv + 4.0 * n, 4.0 * n + (dlogits ? 4.0 * nv : 0.0),
           (dlogits ? 8.0 : 5.0) * nv);
}

void opc_cross_entropy_bf16(op_cost *o, const op_cost_device *d, int n, int v) {
    (void)d;
    begin(o, OPK_CROSS_ENTROPY_BF16, "%dx%d", n, v);
    if (n <= 0) return;
    const double nv = (double)n * v;
    kernel(o, row_passes(v, sizeof(uint16_t), 1) * 2.0 * nv + 4.0 * n, 4.0 * n + 2.0 * nv, 8.0 * nv);
}

void opc_ce_shard_max(op_cost *o, const op_cost_device *d, int n, int v_local) {
    (void)d;
    begin(o, OPK_CE_SHARD_MAX, "%dx%d", n, v_local);
    if (n > 0) kernel(o, 4.0 * n * (double)v_local, 4.0 * n, (double)n * v_local);
}

void opc_ce_shard_sums(op_cost *o, const op_cost_device *d, int n, int v_local) {
    (void)d;
    begin(o, OPK_CE_SHARD_SUMS, "%dx%d", n, v_local);
    if (n > 0) kernel(o, 4.0 * n * (double)v_local + 8.0 * n, 8.0 * n, 3.0 * n * (double)v_local);
}

void opc_ce_shard_finish(op_cost *o, const op_cost_device *d, const float *dlogits, int n, int v_local) {
    (void)d;
    begin(o, OPK_CE_SHARD_FINISH, "%dx%d%s", n, v_local, dlogits ? " with dlogits" : "");
    if (n <= 0) return;
    const double nv = (double)n * v_local;
    kernel(o, 16.0 * n + (dlogits ? 4.0 * nv : 0.0), 4.0 * n + (dlogits ? 4.0 * nv : 0.0), dlogits ? 3.0 * nv : n);
}

void opc_adamw_step(op_cost *o, const op_cost_device *d, int bf16_copy, size_t n, int n_seg) {
    (void)d;
    if (n_seg > 0) begin(o, bf16_copy ? OPK_ADAMW_STEP_BF16 : OPK_ADAMW_STEP, "%zu, amax of %d", n, n_seg);
    else begin(o, bf16_copy ? OPK_ADAMW_STEP_BF16 : OPK_ADAMW_STEP, "%zu", n);
    if (n_seg > 0) { /* the maxima zeroed, then a block's search of the stretches per chunk */
        o->copies = 1;
        o->written += 4.0 * n_seg;
    }
    /* param, m, v and the gradient read; param, m, v (and the bf16 copy) written */
    if (n) kernel(o, 16.0 * n + (n_seg > 0 ? 16.0 * n_seg : 0.0), (bf16_copy ? 14.0 : 12.0) * n, 20.0 * n);
}

void opc_grad_sq_to_f64(op_cost *o, const op_cost_device *d, int n, int n_loss) {
    (void)d;
    begin(o, OPK_GRAD_SQ_TO_F64, "%d stage%s, %d loss%s", n, n == 1 ? "" : "s", n_loss, n_loss == 1 ? "" : "es");
    kernel(o, 4.0 * n + 4.0 * n_loss, 8.0 * n, (double)n_loss);
}

void opc_sum_f64(op_cost *o, const op_cost_device *d, int n) {
    (void)d;
    begin(o, OPK_SUM_F64, "%d", n);
    kernel(o, 8.0 * n, 8.0, (double)n);
}

void opc_optim_scalars(op_cost *o, const op_cost_device *d) {
    (void)d;
    begin(o, OPK_OPTIM_SCALARS, "norm, clip, AdamW coefficients");
    kernel(o, (double)sizeof(ops_optim_state), (double)sizeof(ops_optim_state), 16.0);
}

/* one kernel: row-major only, or the tiles of the transpose (writing the row-major copy
 * too when asked) */
void opc_fp8_quantize(op_cost *o, const op_cost_device *d, uint8_t *out, uint8_t *out_t, float *inv_scale,
                      const void *x, tetra_dtype xt, const float *amax, int rows, int cols, tetra_dtype fmt) {
    (void)d, (void)x, (void)amax;
    begin(o, OPK_FP8_QUANTIZE, "%dx%d %s to %s%s%s", rows, cols, dt(xt), dt(fmt), out || !out_t ? "" : " transposed",
          out && out_t ? " and transposed" : "");
    const size_t n = rc(rows, cols);
    if (!n || (!out && !out_t)) {
        if (inv_scale) kernel(o, 4.0, 4.0, 0); /* the dequant factor alone */
        return;
    }
    const double outs = (out ? 1.0 : 0.0) + (out_t ? 1.0 : 0.0);
    kernel(o, es(xt) * n + 4.0, outs * n + (inv_scale ? 4.0 : 0.0), 2.0 * n);
}
