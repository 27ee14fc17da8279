#!/usr/bin/env python3
"""CPU backend throughput beside PyTorch on the same shapes and thread count, one run.

Shapes are the debug model's (dim 256, 16 heads of 16, ffn 768, vocab 2048) at
TorchTitan's debug batch (8 x 2048 tokens), plus one 8B-like GQA attention head
layout (H 8, KV 2, D 128) to show the large-head-dim regime.

  GEMM        GFLOP/s of our cpu_gemm vs torch.mm, forward and weight-gradient layouts
  attention   causal forward and forward+backward against F.scaled_dot_product_attention,
              the debug model's heads (cases a and b of bench/cpu_vs_pytorch) and a GQA
              layout (H 16, KV 4, D 64) at seq 512, 2048 and 8192; FLOPs counted causally
              (half the square), backward as 2.5x forward; tetra's workspace is printed
              (it grows linearly with S: no S x S buffer).
  cross-entropy  loss + dlogits (fused, one call) vs F.cross_entropy forward+backward
  docmask     the attention op alone at seq 8192 on packed documents of 256-1,024 tokens
              (mean ~600, fixed seed): block_causal (the document mask) against causal on
              the same inputs, forward and forward+backward, in one run; the speed-up and
              the ratio of score pairs each computes

usage: TETRA_BUILD=build OMP_NUM_THREADS=2 build/bench-venv/bin/python bench/ops_cpu.py [gemm|attention|ce|docmask ...]
(the bench venv holds PyPI's newest torch; bench/cpu_vs_pytorch creates it; docmask needs no
PyTorch beyond Debian's: build/venv/bin/python runs it)
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
    """Causal attention alone, forward and forward+backward, against PyTorch's SDPA on the
    same inputs (GQA through enable_gqa where the version has it)."""
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    print(f"\n{'attention (causal)':44s} {'tetra':>9s} {'torch':>9s} {'unit':8s} {'ratio':>7s}")
    if sdpa is None:
        print(f"torch {torch.__version__} has no scaled_dot_product_attention: run under the bench venv "
              f"(bench/cpu_vs_pytorch installs it)")
        return
    gqa_kw = "enable_gqa" in (sdpa.__doc__ or "")
    shapes = [(4, 512, 16, 16, 16), (8, 2048, 16, 16, 16)]  # the debug model in cases a and b
    shapes += [(1, s, 16, 4, 64) for s in (512, 2048, 8192)]  # GQA at three lengths
    for (B, S, H, KV, D) in shapes:
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
        # SDPA's layout is [B, H, S, D]: the transposes are views, as in a model
        qt, kt, vt, dt = (x.transpose(1, 2) for x in (q, k, v, dout))

        def torch_fwd(qq, kk, vv):
            if rep > 1 and not gqa_kw:
                kk, vv = kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1)
            kw = {"enable_gqa": True} if rep > 1 and gqa_kw else {}
            return sdpa(qq, kk, vv, is_causal=True, **kw)

        def t_fwd():
            with torch.no_grad():
                torch_fwd(qt, kt, vt)

        qg, kg, vg = (x.clone().requires_grad_() for x in (qt, kt, vt))

        def t_fwd_bwd():
            torch_fwd(qg, kg, vg).backward(dt)

        fl = 4.0 * B * H * S * S * D / 2
        tag = f"B{B} S{S} H{H} KV{KV} D{D}"
        row(f"fwd {tag}", fl / best(fwd) / 1e9, fl / best(t_fwd) / 1e9, "GFLOP/s")
        row(f"fwd+bwd {tag}", 3.5 * fl / best(fwd_bwd) / 1e9, 3.5 * fl / best(t_fwd_bwd) / 1e9, "GFLOP/s",
            f"tetra workspace {T.cpu_attention_workspace_size(sp) / 2**20:.2f} MiB")


def doc_lengths(S, seed=2026, lo=256, hi=1024, mean=600.0, sd=200.0):
    """Document lengths packing S tokens: normal(mean, sd) clipped to [lo, hi], fixed seed;
    the last document is cut where the sequence ends (as the loader's windows cut them)."""
    g = torch.Generator().manual_seed(seed)
    lens = []
    while sum(lens) < S:
        n = int(round(min(max(torch.normal(mean, sd, (1,), generator=g).item(), lo), hi)))
        lens.append(min(n, S - sum(lens)))
    return lens


def bench_docmask():
    """The document mask's saving, measured: the same op on the same inputs with and without
    the mask (ops_attn_shape.doc), forward and forward+backward, best of REPS."""
    S = 8192
    lens = doc_lengths(S)
    ids = torch.tensor([i for i, n in enumerate(lens) for _ in range(n)], dtype=torch.int32)[None]
    full = lens[:-1]  # the last one is cut by the sequence end
    pairs_doc = sum(n * (n + 1) // 2 for n in lens)
    pairs_causal = S * (S + 1) // 2
    print(f"\ndocuments: {len(lens)} packed into {S} tokens; uncut lengths {min(full)}-{max(full)}, "
          f"mean {sum(full) / len(full):.0f}; score pairs causal {pairs_causal}, block_causal {pairs_doc} "
          f"({pairs_causal / pairs_doc:.1f}x fewer)")
    print(f"{'attention op, seq 8192':44s} {'causal':>9s} {'docmask':>9s} {'unit':8s} {'speed-up':>9s}")
    for (B, H, KV, D) in ((1, 16, 16, 16), (1, 16, 4, 64)):
        q, k, v = T.f32(B, S, H, D), T.f32(B, S, KV, D), T.f32(B, S, KV, D)
        dout = T.f32(B, S, H, D)
        out, lse = torch.empty(B, S, H, D), torch.empty(B, H, S)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        times = {}
        for name, doc in (("causal", None), ("docmask", ids)):
            shp = T.AttnShape(B, S, S, H, KV, D, 1.0 / math.sqrt(D), 1, 0, 0,
                              doc.data_ptr() if doc is not None else None, S if doc is not None else 0)
            ws = torch.empty(T.cpu_attention_workspace_size(ctypes.byref(shp)) // 4 + 16)
            sp = ctypes.byref(shp)

            def fwd():
                T.cpu_attention_forward(T.ptr(out), T.ptr(lse), T.ptr(q), T.ptr(k), T.ptr(v), sp, T.ptr(ws))

            def fwd_bwd():
                fwd()
                T.cpu_attention_backward(T.ptr(dq), T.ptr(dk), T.ptr(dv), T.ptr(dout), T.ptr(q), T.ptr(k),
                                         T.ptr(v), T.ptr(out), T.ptr(lse), sp, T.ptr(ws))

            times[name] = (best(fwd), best(fwd_bwd))
        tag = f"B{B} H{H} KV{KV} D{D}"
        for i, what in enumerate(("fwd", "fwd+bwd")):
            c, d = times["causal"][i] * 1e3, times["docmask"][i] * 1e3
            print(f"{what + ' ' + tag:44s} {c:9.1f} {d:9.1f} {'ms':8s} {c / d:8.2f}x")


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
    parts = {"gemm": bench_gemm, "attention": bench_attention, "ce": bench_cross_entropy, "docmask": bench_docmask}
    for name in sys.argv[1:] or parts:
        parts[name]()
