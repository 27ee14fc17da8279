#!/usr/bin/env python3
"""CPU backend throughput beside PyTorch on the same shapes and thread count, one run.

Shapes are the debug model's (dim 256, 16 heads of 16, ffn 768, vocab 2048) at
TorchTitan's debug batch (8 x 2048 tokens), plus one 8B-like GQA attention head
layout (H 8, KV 2, D 128) to show the large-head-dim regime.

  GEMM        GFLOP/s of our cpu_gemm vs torch.mm, forward and weight-gradient layouts
  attention   causal forward and forward+backward; FLOPs counted causally (half the
              square), backward as 2.5x forward. torch 1.13 has no fused attention on the
              CPU, so its side is the textbook matmul-softmax-matmul with autograd, which
              materialises B*H*S*S scores (its memory is printed); ours never does.
  cross-entropy  loss + dlogits (fused, one call) vs F.cross_entropy forward+backward

usage: TETRA_BUILD=build OMP_NUM_THREADS=2 build/venv/bin/python bench/ops_cpu.py
"""
import ctypes
import importlib.util
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("ops_ref", os.path.join(HERE, "..", "tests", "py", "test_ops_cpu.py"))
T = importlib.util.module_from_spec(spec)
spec.loader.exec_module(T)  # ctypes signatures and helpers (runs no test)
torch, F = T.torch, T.F

threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
torch.set_num_threads(threads)
REPS = int(os.environ.get("BENCH_REPS", "3"))


def best(fn, reps=REPS):
    fn()  # warm-up
    t = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def row(name, ours, theirs, unit, note=""):
    ratio = ours / theirs if theirs > 0 else float("nan")
    print(f"{name:44s} {ours:9.1f} {theirs:9.1f} {unit:8s} {ratio:6.2f}x  {note}")


def bench_gemm():
    N = 8 * 2048
    print(f"\n{'GEMM (m x n x k)':44s} {'tetra':>9s} {'torch':>9s} {'unit':8s} {'ratio':>7s}")
    for (m, n, k, ta, tb, what) in ((N, 256, 256, 0, 1, "wq: x W^T"), (N, 768, 256, 0, 1, "w1: x W^T"),
                                    (N, 256, 768, 0, 1, "w2: h W^T"), (N, 2048, 256, 0, 1, "output: x W^T"),
                                    (N, 256, 768, 0, 0, "dx = dy W (w1)"), (768, 256, N, 1, 0, "dW = dy^T x (w1)")):
        a = T.f32(k, m) if ta else T.f32(m, k)
        b = T.f32(n, k) if tb else T.f32(k, n)
        c = torch.empty(m, n)
        ours = best(lambda: T.gemm_call(c, a, b, m, n, k, ta, tb))
        A = a.t() if ta else a
        B = b.t() if tb else b
        theirs = best(lambda: torch.mm(A, B, out=c))
        fl = 2.0 * m * n * k
        row(f"{what} {m}x{n}x{k}", fl / ours / 1e9, fl / theirs / 1e9, "GFLOP/s")


def bench_attention():
    print(f"\n{'attention (causal)':44s} {'tetra':>9s} {'torch':>9s} {'unit':8s} {'ratio':>7s}")
    for (B, S, H, KV, D) in ((1, 2048, 16, 16, 16), (1, 2048, 8, 2, 128)):
        q, k, v = T.f32(B, S, H, D), T.f32(B, S, KV, D), T.f32(B, S, KV, D)
        dout = T.f32(B, S, H, D)
        shp = T.attn_shape(B, S, S, H, KV, D, 1)
        ws = torch.empty(T.cpu_attention_workspace_size(ctypes.byref(shp)) // 4 + 16)
        out, lse = torch.empty(B, S, H, D), torch.empty(B, H, S)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        sp = ctypes.byref(shp)

        def fwd():
            T.cpu_attention_forward(T.ptr(out), T.ptr(lse), T.ptr(q), T.ptr(k), T.ptr(v), sp, T.ptr(ws))

        def fwd_bwd():
            fwd()
            T.cpu_attention_backward(T.ptr(dq), T.ptr(dk), T.ptr(dv), T.ptr(dout), T.ptr(q), T.ptr(k), T.ptr(v),
                                     T.ptr(out), T.ptr(lse), sp, T.ptr(ws))

        rep = H // KV
        mask = torch.ones(S, S, dtype=torch.bool).triu(1)

        def torch_fwd(qq, kk, vv):
            qh = qq.transpose(1, 2)
            kh = kk.transpose(1, 2).repeat_interleave(rep, 1)
            vh = vv.transpose(1, 2).repeat_interleave(rep, 1)
            s = (qh @ kh.transpose(-1, -2)) * (1.0 / math.sqrt(D))
            return (s.masked_fill(mask, float("-inf")).softmax(-1) @ vh).transpose(1, 2)

        def t_fwd():
            with torch.no_grad():
                torch_fwd(q, k, v)

        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

        def t_fwd_bwd():
            torch_fwd(qg, kg, vg).backward(dout)

        fl = 4.0 * B * H * S * S * D / 2
        tag = f"B{B} S{S} H{H} KV{KV} D{D}"
        mib = B * H * S * S * 4 / 2**20
        row(f"fwd {tag}", fl / best(fwd) / 1e9, fl / best(t_fwd) / 1e9, "GFLOP/s",
            f"torch holds {mib:.0f} MiB of scores")
        row(f"fwd+bwd {tag}", 3.5 * fl / best(fwd_bwd) / 1e9, 3.5 * fl / best(t_fwd_bwd) / 1e9, "GFLOP/s")
        print(f"{'':44s} tetra workspace {T.cpu_attention_workspace_size(sp) / 2**20:.2f} MiB")


def bench_cross_entropy():
    print(f"\n{'cross-entropy loss + dlogits':44s} {'tetra':>9s} {'torch':>9s} {'unit':8s} {'ratio':>7s}")
    N, V = 8 * 2048, 2048
    logits = T.f32(N, V, scale=2.0)
    targets = torch.randint(0, V, (N,), dtype=torch.int32)
    dl, losses = torch.empty(N, V), torch.empty(N)
    ours = best(lambda: T.cpu_cross_entropy(T.ptr(dl), T.ptr(losses), T.ptr(logits), T.ptr(targets), N, V, 1.0 / N))
    lg = logits.clone().requires_grad_()
    tl = targets.long()

    def t_ce():
        lg.grad = None
        F.cross_entropy(lg, tl, reduction="sum").backward()

    theirs = best(t_ce)
    row(f"N{N} V{V}", N / ours / 1e3, N / theirs / 1e3, "ktok/s")


if __name__ == "__main__":
    print(f"threads {threads} (OMP_NUM_THREADS; torch.set_num_threads the same), best of {REPS}; "
          f"torch {torch.__version__}")
    bench_gemm()
    bench_attention()
    bench_cross_entropy()
