/* The shape-only description of the CUDA backend (kernels/op_costs.h) and the recording
 * op table (kernels/ops_record.h):
 * - descriptions of a few ops at Llama 3 8B shapes against costs worked out by hand from
 *   kernels/cuda (launches of each kind, bytes, FLOPs, the path), including every fp8
 *   GEMM layout, rowwise with and without cuBLASLt's outer-vector scales, cuDNN against
 *   the built-in attention and the cuDNN version's memset;
 * - the recording run of `tetra plan --ops` (plan/ops.h) on a tiny model issues
 *   the same sequence of ops, in the same trace spans, as the real CPU backend is called
 *   with for the same step (the recording table wrapped around ops_cpu() counts the CPU's
 *   calls), in bf16, fp32 and float8; and the recording table computes nothing: its
 *   memory is never readable (a read faults).
 * The launch counts themselves are checked against the kernels on the CUDA simulator
 * (tests/gpu/test_ops_cuda.c, test_launch_counts). */
#include <mpi.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "plan/ops.h"
#include "kernels/op_costs.h"
#include "kernels/ops.h"
#include "kernels/ops_record.h"
#include "tests/check.h"

static int near(double a, double b) { return a == b || (a - b) * (a - b) <= 1e-18 * (a * a + b * b); }

/* launches of each kind, bytes moved and the path */
static void expect(const char *what, const op_cost *c, int kernels, int gemms, int cudnn, int copies, double bytes,
                   const char *path) {
    CHECK(c->kernels == kernels && c->gemms == gemms && c->cudnn == cudnn && c->copies == copies,
          "%s: launches k %d g %d cudnn %d copies %d, want %d %d %d %d", what, c->kernels, c->gemms, c->cudnn,
          c->copies, kernels, gemms, cudnn, copies);
    CHECK(near(c->read + c->written, bytes), "%s: %.0f bytes, want %.0f", what, c->read + c->written, bytes);
    CHECK(!strcmp(c->path, path), "%s: path '%s', want '%s'", what, c->path, path);
}

static ops_gemm_desc gemm(tetra_dtype a, tetra_dtype b, tetra_dtype c, int ta, int tb, int m, int n, int k) {
    ops_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.a_type = a;
    g.b_type = b;
    g.c_type = c;
    g.trans_a = ta;
    g.trans_b = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.lda = ta ? m : k;
    g.ldb = tb ? k : n;
    g.ldc = n;
    g.alpha = 1.0f;
    return g;
}

/* 256-byte aligned addresses (never dereferenced) */
#define P(x) ((void *)(uintptr_t)(0x10000000u + 0x1000000u * (x)))

static void test_gemms(void) {
    const op_cost_device h100 = op_cost_device_h100();
    const double N = 8192, C = 4096, F = 14336;
    op_cost c;
    float s[2];
    /* y = x W^T, bf16, into a residual (beta 1): one matmul, A, B and C read, C written */
    ops_gemm_desc g = gemm(TETRA_BF16, TETRA_BF16, TETRA_BF16, 0, 1, 8192, 4096, 4096);
    g.beta = 1.0f;
    opc_gemm(&c, &h100, P(1), P(2), P(3), &g);
    expect("bf16 wo forward", &c, 0, 1, 0, 0, 2 * (N * C + C * C + N * C) + 2 * N * C, "bf16");
    CHECK(near(c.flops[OPC_FLOP_GEMM_BF16], 2 * N * C * C), "bf16 FLOPs %g", c.flops[OPC_FLOP_GEMM_BF16]);
    /* float8 tensorwise forward: both K-major, no pack */
    g = gemm(TETRA_FP8_E4M3, TETRA_FP8_E4M3, TETRA_BF16, 0, 1, 8192, 14336, 4096);
    g.a_scale = s, g.b_scale = s + 1;
    opc_gemm(&c, &h100, P(1), P(2), P(3), &g);
    expect("fp8 w1 forward", &c, 0, 1, 0, 0, N * C + F * C + 2 * N * F, "fp8");
    CHECK(near(c.flops[OPC_FLOP_GEMM_FP8], 2 * N * F * C), "fp8 FLOPs %g", c.flops[OPC_FLOP_GEMM_FP8]);
    /* grad input dy W: W stored [k, n] is transposed into scratch (one byte each way) */
    g = gemm(TETRA_FP8_E5M2, TETRA_FP8_E4M3, TETRA_BF16, 0, 0, 8192, 4096, 14336);
    g.a_scale = s, g.b_scale = s + 1;
    opc_gemm(&c, &h100, P(1), P(2), P(3), &g);
    expect("fp8 w1 grad input", &c, 1, 1, 0, 0, 2 * F * C + (N * F + F * C + 2 * N * C), "fp8");
    /* grad weight dy^T x: both operands transposed */
    g = gemm(TETRA_FP8_E5M2, TETRA_FP8_E4M3, TETRA_F32, 1, 0, 14336, 4096, 8192);
    g.a_scale = s, g.b_scale = s + 1;
    opc_gemm(&c, &h100, P(1), P(2), P(3), &g);
    expect("fp8 w1 grad weight", &c, 2, 1, 0, 0, 2 * N * F + 2 * N * C + (N * F + N * C + 4 * F * C), "fp8");
    /* rowwise on the H100: no outer-vector scales, the fp32 product round trip and an epilogue */
    g = gemm(TETRA_FP8_E4M3, TETRA_FP8_E4M3, TETRA_BF16, 0, 1, 8192, 4096, 4096);
    g.a_scale = s, g.b_scale = s + 1, g.scale_rowwise = 1;
    opc_gemm(&c, &h100, P(1), P(2), P(3), &g);
    expect("fp8 rowwise (H100)", &c, 1, 1, 0, 0, (N * C + C * C + 4 * N * C) + (4 * N * C + 4 * (N + C) + 2 * N * C),
           "fp8+epilogue");
    op_cost_device outer = h100;
    outer.outer_vector_scales = 1;
    opc_gemm(&c, &outer, P(1), P(2), P(3), &g);
    expect("fp8 rowwise (outer-vector)", &c, 0, 1, 0, 0, N * C + C * C + 2 * N * C + 4 * (N + C), "fp8+rowwise");
    /* an fp8 operand at an odd address is packed; an output at one widens both operands */
    g = gemm(TETRA_FP8_E4M3, TETRA_FP8_E4M3, TETRA_F32, 0, 1, 64, 64, 64);
    opc_gemm(&c, &h100, P(1), (char *)P(2) + 1, P(3), &g);
    expect("fp8 A unaligned", &c, 1, 1, 0, 0, 2 * 4096.0 + (2 * 4096.0 + 4 * 4096.0), "fp8");
    opc_gemm(&c, &h100, (char *)P(1) + 4, P(2), P(3), &g);
    expect("fp8 C unaligned", &c, 2, 1, 0, 0, 2 * (4096.0 + 2 * 4096.0) + (2 * 2 * 4096.0 + 4 * 4096.0), "bf16");
    /* no fp8 tensor cores (sm_80): the K-major packs, then both operands widened */
    op_cost_device a100 = h100;
    a100.sm_major = 8;
    g = gemm(TETRA_FP8_E4M3, TETRA_FP8_E4M3, TETRA_F32, 0, 0, 64, 64, 64);
    opc_gemm(&c, &a100, P(1), P(2), P(3), &g);
    CHECK(c.kernels == 3 && c.gemms == 1 && !strcmp(c.path, "bf16"), "fp8 on sm_80: k %d g %d %s", c.kernels, c.gemms,
          c.path);
    /* fp32 into bf16: the epilogue; k = 0: only the epilogue */
    g = gemm(TETRA_F32, TETRA_F32, TETRA_BF16, 0, 1, 64, 64, 64);
    opc_gemm(&c, &h100, P(1), P(2), P(3), &g);
    expect("f32 into bf16", &c, 1, 1, 0, 0, 4 * (2 * 4096.0) + 4 * 4096.0 + 4 * 4096.0 + 2 * 4096.0, "f32+epilogue");
    g = gemm(TETRA_BF16, TETRA_BF16, TETRA_BF16, 0, 1, 64, 64, 0);
    g.beta = 1.0f;
    opc_gemm(&c, &h100, P(1), P(2), P(3), &g);
    expect("k = 0", &c, 1, 0, 0, 0, 2 * 2 * 4096.0, "k=0");
}

static void test_attention(void) {
    const op_cost_device h100 = op_cost_device_h100();
    op_cost c;
    /* 8B: b1 h32/8 s8192 d128 causal: q, k, v in, out and lse out */
    ops_attn_shape s = {1, 8192, 8192, 32, 8, 128, 0.088f, 1, 0, 0, NULL, 0};
    const double nq = 8192.0 * 32 * 128, nk = 8192.0 * 8 * 128, rows = 32 * 8192.0;
    const double pairs = 8192.0 * 8193 / 2;
    CHECK(near(opc_attention_pairs(&s), pairs), "causal pairs %g", opc_attention_pairs(&s));
    opc_attention_forward(&c, &h100, TETRA_BF16, P(1), P(2), P(3), P(4), P(5), &s);
    expect("cuDNN forward", &c, 0, 0, 1, 0, 2 * (nq + 2 * nk) + 2 * nq + 4 * rows, "cudnn");
    CHECK(near(c.flops[OPC_FLOP_ATTN_TC], 4.0 * 128 * pairs * 32), "cuDNN forward FLOPs %g", c.flops[OPC_FLOP_ATTN_TC]);
    opc_attention_backward(&c, &h100, TETRA_BF16, P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), &s);
    expect("cuDNN backward", &c, 0, 0, 1, 0,
           2 * (3 * nq + 2 * nk) + 8 * rows + 4 * nq + 2 * (nq + 2 * nk) + 4 * rows + 4 * nq, "cudnn");
    /* before cuDNN 9.6 the dQ accumulator is zeroed first */
    op_cost_device old = h100;
    old.cudnn_version = 90500;
    opc_attention_backward(&c, &old, TETRA_BF16, P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), &s);
    CHECK(c.cudnn == 1 && c.copies == 1, "cuDNN 9.5 backward: cudnn %d copies %d", c.cudnn, c.copies);
    /* deterministic: cuDNN's deterministic graph writes dq without the fp32 accumulator */
    op_cost_device det = h100;
    det.deterministic = 1;
    opc_attention_backward(&c, &det, TETRA_BF16, P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), &s);
    expect("deterministic backward", &c, 0, 0, 1, 0, 2 * (3 * nq + 2 * nk) + 8 * rows + 2 * (nq + 2 * nk) + 4 * rows,
           "cudnn");
    det.cudnn_version = 90500;
    opc_attention_backward(&c, &det, TETRA_BF16, P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), &s);
    CHECK(c.cudnn == 1 && c.copies == 0, "cuDNN 9.5 deterministic backward: cudnn %d copies %d", c.cudnn, c.copies);
    /* a misaligned gradient, a ring block with unequal offsets, a misaligned tensor: the built-in kernels */
    opc_attention_backward(&c, &h100, TETRA_BF16, (char *)P(1) + 2, P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), &s);
    expect("misaligned dq backward", &c, 3, 0, 0, 0,
           (2 * 2 * nq + 4 * rows) + 2 * (2 * (2 * nq + 2 * nk) + 8 * rows) + 2 * (nq + 2 * nk), "built-in");
    /* bf16 at head dim 128: the tensor-core kernels (S and dP in both passes, dV, dK and dQ
     * as two bf16 terms each); above 128 the fp32-FMA kernels */
    CHECK(near(c.flops[OPC_FLOP_ATTN_TC], 20.0 * 128 * pairs * 32) && c.flops[OPC_FLOP_ATTN_F32] == 0,
          "built-in backward FLOPs %g (tensor cores) %g (CUDA cores)", c.flops[OPC_FLOP_ATTN_TC],
          c.flops[OPC_FLOP_ATTN_F32]);
    ops_attn_shape wide = s;
    wide.d = 256, wide.h = 16, wide.kv = 4;
    opc_attention_backward(&c, &h100, TETRA_BF16, (char *)P(1) + 2, P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9),
                           &wide);
    CHECK(near(c.flops[OPC_FLOP_ATTN_F32], 14.0 * 256 * pairs * 16) && c.flops[OPC_FLOP_ATTN_TC] == 0,
          "built-in backward at head dim 256: FLOPs %g (CUDA cores) %g (tensor cores)", c.flops[OPC_FLOP_ATTN_F32],
          c.flops[OPC_FLOP_ATTN_TC]);
    opc_attention_forward(&c, &h100, TETRA_BF16, (char *)P(1) + 2, P(2), P(3), P(4), P(5), &s);
    CHECK(c.cudnn == 0 && near(c.flops[OPC_FLOP_ATTN_TC], 1.5 * 4.0 * 128 * pairs * 32),
          "built-in bf16 forward on the tensor cores: cudnn %d FLOPs %g", c.cudnn, c.flops[OPC_FLOP_ATTN_TC]);
    ops_attn_shape ring = s;
    ring.q_offset = 8192;
    opc_attention_forward(&c, &h100, TETRA_BF16, P(1), P(2), P(3), P(4), P(5), &ring);
    CHECK(c.kernels == 1 && c.cudnn == 0 && near(opc_attention_pairs(&ring), 8192.0 * 8192),
          "ring block: k %d cudnn %d pairs %g", c.kernels, c.cudnn, opc_attention_pairs(&ring));
    opc_attention_forward(&c, &h100, TETRA_BF16, (char *)P(1) + 2, P(2), P(3), P(4), P(5), &s);
    CHECK(c.kernels == 1 && !strcmp(c.path, "built-in"), "misaligned out: %s", c.path);
    /* fully masked: the fp32 op returns, the bf16 op zeroes its three gradients */
    ring.q_offset = -8192;
    opc_attention_backward(&c, &h100, TETRA_F32, P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), &ring);
    CHECK(op_cost_launches(&c) == 0, "masked fp32 backward: %d launches", op_cost_launches(&c));
    opc_attention_backward(&c, &h100, TETRA_BF16, P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), &ring);
    expect("masked bf16 backward", &c, 0, 0, 0, 3, 2 * (nq + 2 * nk), "zeros");
}

static void test_layers(void) {
    const op_cost_device d = op_cost_device_h100();
    op_cost c;
    const double N = 8192, C = 4096, V = 128256;
    /* rmsnorm dw: 128 chunks of 64 rows, partials in double, then their sum */
    opc_rmsnorm_backward_weight(&c, &d, TETRA_BF16, P(1), P(2), P(3), P(4), 8192, 4096, 1);
    expect("rmsnorm dw", &c, 2, 0, 0, 0, (2 * 2 * N * C + 4 * N + 8 * 128 * C) + (8 * 128 * C + 4 * C + 4 * C), "");
    /* cross-entropy over 128256 logits: the row (501 KiB) is read twice */
    opc_cross_entropy(&c, &d, P(1), 8192, 128256);
    expect("cross_entropy", &c, 1, 0, 0, 0, 2 * 4 * N * V + 4 * N + 4 * N + 4 * N * V, "");
    opc_cross_entropy(&c, &d, NULL, 8192, 128256);
    expect("cross_entropy, loss only", &c, 1, 0, 0, 0, 4 * N * V + 8 * N, "");
    /* embedding backward: keys, CUB's sort (17 key bits: 3 radix passes), the runs */
    opc_embedding_backward(&c, &d, TETRA_BF16, P(1), P(2), P(3), 8192, 4096, 0, 128256);
    CHECK(c.kernels == 2 && c.sorts == 1 && op_cost_launches(&c) == 3, "embedding backward: k %d sorts %d", c.kernels,
          c.sorts);
    CHECK(near(c.read + c.written, 12 * N + (4 * N + 3 * 16 * N) + (8 * N + 2 * N * C + 8 * N * C)),
          "embedding backward bytes %.0f", c.read + c.written);
    /* empty calls launch nothing, but sum always runs its two passes and amax its one launch */
    opc_fill(&c, &d, P(1), 0.0f, 0);
    CHECK(op_cost_launches(&c) == 0, "fill n=0");
    opc_sum(&c, &d, P(1), P(2), 0);
    CHECK(c.kernels == 2, "sum n=0: %d kernels", c.kernels);
    opc_amax(&c, &d, P(1), P(2), 0);
    CHECK(c.kernels == 1, "amax n=0: %d kernels", c.kernels);
    opc_amax_bf16(&c, &d, P(1), P(2), 1000);
    /* one launch: 1000 bf16 read, one partial written and read back, the result written */
    CHECK(c.kernels == 1 && near(c.read + c.written, 2000 + 4 + 4 + 4), "amax_bf16: k %d, %.0f B", c.kernels,
          c.read + c.written);
    opc_adamw_step(&c, &d, 1, 1000, 0);
    expect("adamw bf16", &c, 1, 0, 0, 0, 30000, "");
    /* with the amax of 3 stretches: a memset of the maxima, the same kernel and its search */
    opc_adamw_step(&c, &d, 1, 1000, 3);
    CHECK(c.kernels == 1 && c.copies == 1 && near(c.read + c.written, 30000 + 3 * 16 + 3 * 4),
          "adamw_step_amax: k %d copies %d, %.0f B", c.kernels, c.copies, c.read + c.written);
    opc_copy_h2d(&c, &d, P(1), P(2), 64);
    CHECK(c.copies == 1 && c.syncs == 1 && c.host_bytes == 64, "copy_h2d: copies %d syncs %d", c.copies, c.syncs);
    opc_copy_h2d_async(&c, &d, P(1), P(2), 64);
    CHECK(c.copies == 1 && c.syncs == 0 && c.host_bytes == 64, "copy_h2d_async: copies %d syncs %d", c.copies, c.syncs);
    CHECK(!strcmp(op_kind_name(OPK_ATTENTION_BACKWARD_BF16), "attention_backward_bf16") &&
              !strcmp(op_kind_name(OPK_COPY_2D), "copy_2d"),
          "op names");
}

/* ---- the recording run against the CPU backend's calls */

typedef struct {
    size_t n;
    op_kind *op;
    char **span;
} sequence;

static void take(sequence *s) {
    s->n = ops_record_count();
    s->op = malloc((s->n + 1) * sizeof *s->op);
    s->span = calloc(s->n + 1, sizeof *s->span);
    const ops_record_entry *e = ops_record_entries();
    for (size_t i = 0; i < s->n; i++) {
        s->op[i] = e[i].cost.op;
        s->span[i] = strdup(ops_record_span_name(e[i].span));
    }
    ops_record_clear();
}

static void drop(sequence *s) {
    for (size_t i = 0; i < s->n; i++) free(s->span[i]);
    free(s->op);
    free(s->span);
}

static void on_mark(void *user, int on) {
    (void)user;
    ops_record_set_active(on);
}

static int run(const char *const *keys, int nkeys, const tetra_ops *ops, int init, sequence *out) {
    const char *base[] = {"train",     "--model.flavor",
                          "tiny",      "--training.seq_len",
                          "32",        "--training.local_batch_size",
                          "2",         "--training.steps",
                          "10",        "--training.threads",
                          "1",         "--lr_scheduler.warmup_steps",
                          "1",         "--activation_checkpoint.mode",
                          "selective", "--activation_checkpoint.selective_ac_option",
                          "op"};
    char *argv[64];
    int argc = 0;
    for (size_t i = 0; i < sizeof base / sizeof *base; i++) argv[argc++] = (char *)base[i];
    for (int i = 0; i < nkeys; i++) argv[argc++] = (char *)keys[i];
    tetra_config cfg;
    cfg_init(&cfg);
    char err[2048] = "";
    int rc = cfg_parse_args(&cfg, argc, argv, stdout, err, sizeof err);
    if (!rc) rc = plan_ops_run(&cfg, ops, init, 0, on_mark, NULL, err, sizeof err);
    cfg_free(&cfg);
    if (rc) fprintf(stderr, "run: %s\n", err);
    else take(out);
    return rc;
}

static void compare(const char *what, const char *const *keys, int nkeys) {
    const op_cost_device d = op_cost_device_h100();
    sequence rec = {0}, cpu = {0};
    const tetra_ops *R = ops_record_table(&d, NULL);
    CHECK(R && !R->host_memory && !strcmp(R->name, "cuda"), "%s: the recording table", what);
    if (!R) return;
    int rc = run(keys, nkeys, R, 0, &rec);
    const tetra_ops *W = ops_record_table(&d, ops_cpu());
    rc |= run(keys, nkeys, W, 1, &cpu);
    CHECK(rc == 0, "%s: runs failed", what);
    size_t same = 0;
    while (same < rec.n && same < cpu.n && rec.op[same] == cpu.op[same] && !strcmp(rec.span[same], cpu.span[same]))
        same++;
    CHECK(rec.n > 50 && rec.n == cpu.n && same == rec.n,
          "%s: %zu recorded ops, %zu CPU calls, the same up to %zu%s%s%s%s", what, rec.n, cpu.n, same,
          same < rec.n ? ": recorded " : "", same < rec.n ? op_kind_name(rec.op[same]) : "",
          same < cpu.n ? " / cpu " : "", same < cpu.n ? op_kind_name(cpu.op[same]) : "");
    printf("%-28s %zu ops in the step, the same sequence and spans on the CPU: %s\n", what, rec.n,
           same == rec.n && rec.n == cpu.n ? "yes" : "NO");
    drop(&rec);
    drop(&cpu);
}

/* the recording table's memory faults on a host read */
static sigjmp_buf fault_jb;
static void on_fault(int sig) {
    (void)sig;
    siglongjmp(fault_jb, 1);
}

static void test_no_memory(void) {
    const op_cost_device d = op_cost_device_h100();
    const tetra_ops *R = ops_record_table(&d, NULL);
    float *p = R ? R->alloc(1 << 20) : NULL;
    CHECK(p && ((uintptr_t)p & 255) == 0, "recording alloc");
    if (!p) return;
    struct sigaction sa, old_segv, old_bus;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    volatile int faulted = 0;
    if (!sigsetjmp(fault_jb, 1)) {
        volatile float v = p[3];
        (void)v;
    } else {
        faulted = 1;
    }
    sigaction(SIGSEGV, &old_segv, NULL);
    sigaction(SIGBUS, &old_bus, NULL);
    CHECK(faulted, "a host read of recording memory must fault");
    float h[4] = {1, 2, 3, 4};
    R->copy_d2h(h, p, sizeof h);
    CHECK(h[0] == 0 && h[3] == 0, "copy_d2h of recording memory reads zeros");
}

static void finalize(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

int main(void) {
    int provided = 0;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    atexit(finalize);
    test_gemms();
    test_attention();
    test_layers();
    test_no_memory();
    const char *bf16[] = {"--training.mixed_precision_param", "bfloat16"};
    const char *fp32[] = {"--training.mixed_precision_param", "float32"};
    const char *f8[] = {"--training.mixed_precision_param", "bfloat16", "--model.converters", "float8"};
    const char *f8r[] = {"--training.mixed_precision_param",     "bfloat16", "--model.converters",           "float8",
                         "--quantize.linear.float8.recipe_name", "rowwise",  "--activation_checkpoint.mode", "none"};
    compare("tiny bf16, AC op", bf16, 2);
    compare("tiny fp32, AC op", fp32, 2);
    compare("tiny float8 tensorwise", f8, 4);
    compare("tiny float8 rowwise, AC none", f8r, 8);
    ops_record_release();
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
