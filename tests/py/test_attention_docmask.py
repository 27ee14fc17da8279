#!/usr/bin/env python3
"""The CPU attention op under a document mask (TorchTitan's block_causal) against a
float64 PyTorch reference with the mask written out explicitly.

torch 1.13 (Debian) has neither scaled_dot_product_attention nor flex attention, so the
reference is softmax(q k^T * scale + mask) v with mask[b, i, j] = causal(i, j) and
doc[b, i] == doc[b, j], GQA by repeat_interleave; gradients by float64 autograd.

Cases: documents from 1 token to the whole sequence, boundaries on the kernel's 64-row
tile edges and inside tiles, ids with gaps, GQA, several head dims, both backward
schedules (fused, split), ring-attention blocks at global offsets in context parallel's
load-balanced chunk order (blocks whose rows see nothing, merged by log-sum-exp), the
bf16 twins, and bit-equality with the plain causal op when the whole sequence is one
document. Gates: those of tests/py/test_ops_cpu.py (fp32: norm-relative 1e-5 forward,
1e-4 backward, max-abs 10x; bf16: one bf16 ulp against torch in fp32 rounded to bf16,
and bit-exact against the fp32 twin). Exits non-zero on any failure.
"""
import ctypes
import math
import os
import sys
import time


def _import_torch_quietly():
    """Debian's torch warns at length next to NumPy 2 (no NumPy bridge is used here)."""
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import torch as t
        t.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
        t.zeros(1).sum()
        return t
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


torch = _import_torch_quietly()

SEED = int(os.environ.get("TETRA_SEED", "20260204"))
print(f"seed {SEED} (set TETRA_SEED={SEED} to replay)")
torch.manual_seed(SEED)

build = os.environ.get("TETRA_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
lib = ctypes.CDLL(os.path.join(build, "lib", "libtetra.so"))
c_int, c_float, P = ctypes.c_int, ctypes.c_float, ctypes.c_void_p


class AttnShape(ctypes.Structure):
    _fields_ = [("b", c_int), ("sq", c_int), ("sk", c_int), ("h", c_int), ("kv", c_int), ("d", c_int),
                ("scale", c_float), ("causal", c_int), ("q_offset", c_int), ("k_offset", c_int),
                ("doc", P), ("doc_len", c_int)]


def sig(name, *args, ret=None):
    f = getattr(lib, name)
    f.argtypes = list(args)
    f.restype = ret
    return f


SP = ctypes.POINTER(AttnShape)
ws_size = sig("cpu_attention_workspace_size", SP, ret=ctypes.c_size_t)
attn_forward = sig("cpu_attention_forward", P, P, P, P, P, SP, P)
attn_backward = sig("cpu_attention_backward", P, P, P, P, P, P, P, P, P, SP, P)
attn_merge = sig("cpu_attention_merge", P, P, P, P, c_int, c_int, c_int, c_int)
set_backward_mode = sig("cpu_attention_set_backward_mode", c_int)
set_vector_width = sig("cpu_attention_set_vector_width", c_int, ret=c_int)
ws_size_bf16 = sig("cpu_attention_workspace_size_bf16", SP, ret=ctypes.c_size_t)
attn_forward_bf16 = sig("cpu_attention_forward_bf16", P, P, P, P, P, SP, P)
attn_backward_bf16 = sig("cpu_attention_backward_bf16", P, P, P, P, P, P, P, P, P, SP, P)
cast_f32_to_bf16 = sig("cpu_cast_f32_to_bf16", P, P, ctypes.c_size_t)


def ptr(t):
    assert t.is_contiguous()
    return t.data_ptr()


def f32(*shape):
    return torch.randn(*shape, dtype=torch.float64).float()


# ----------------------------------------------------------------------------
# result table

RESULTS = []  # (case, metric, value, tolerance, ok)


def record(op, metric, value, tol, ok=None):
    RESULTS.append((op, metric, float(value), tol, bool(value <= tol if ok is None else ok)))


def check(op, got, ref, rtol, maxtol=None):
    """norm-relative error, and the largest error relative to max |ref| (test_ops_cpu's)"""
    got, ref = got.double(), ref.double()
    assert got.shape == ref.shape, (op, got.shape, ref.shape)
    if not torch.isfinite(got).all():
        record(op, "rel", float("inf"), rtol, False)
        return
    diff = (got - ref).abs()
    nref, mref = ref.norm().item(), ref.abs().max().item()
    rel = diff.norm().item() / nref if nref > 0 else diff.norm().item()
    mx = diff.max().item() / mref if mref > 0 else diff.max().item()
    maxtol = maxtol if maxtol is not None else 10 * rtol
    ok = rel <= rtol and mx <= maxtol
    record(op, "rel", rel, rtol, ok)
    record(op, "maxabs/max|ref|", mx, maxtol, ok)


def check_bits(op, got, want):
    n = int((got.contiguous().view(torch.int16 if got.dtype == torch.bfloat16 else torch.int32)
             != want.contiguous().view(torch.int16 if want.dtype == torch.bfloat16 else torch.int32)).sum())
    record(op, "mismatched bits", n, 0)


# ----------------------------------------------------------------------------
# documents and the reference


def doc_ids(lengths_per_row, first_id=0, gap=1):
    """[B, S] int32 ids from each row's document lengths; ids rise by `gap` per document"""
    rows = []
    for lens in lengths_per_row:
        ids = []
        for n, ln in enumerate(lens):
            ids += [first_id + gap * n] * ln
        rows.append(ids)
    S = len(rows[0])
    assert all(len(r) == S for r in rows), [len(r) for r in rows]
    return torch.tensor(rows, dtype=torch.int32)


def block_causal_mask(doc, q_off, sq, k_off, sk):
    """[B, sq, sk] True where key j is visible to query i"""
    qi = q_off + torch.arange(sq)
    kj = k_off + torch.arange(sk)
    causal = kj[None, :] <= qi[:, None]
    same = doc[:, qi].long()[:, :, None] == doc[:, kj].long()[:, None, :]
    return causal[None] & same


def ref_attention(q, k, v, mask, scale):
    """softmax(q k^T scale, masked) v with mask [B, Sq, Sk]; out [B,Sq,H,D], lse [B,H,Sq]"""
    rep = q.shape[2] // k.shape[2]
    qh = q.permute(0, 2, 1, 3)
    kh = k.permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)
    vh = v.permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)
    s = ((qh @ kh.transpose(-1, -2)) * scale).masked_fill(~mask[:, None], float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows that see nothing: 0
    return (p @ vh).permute(0, 2, 1, 3), lse


def shape_of(B, sq, sk, H, KV, D, doc, q_off=0, k_off=0):
    return AttnShape(B, sq, sk, H, KV, D, 1.0 / math.sqrt(D), 1, q_off, k_off,
                     ptr(doc) if doc is not None else None, doc.shape[1] if doc is not None else 0)


def run_forward(q, k, v, shp, fwd=attn_forward, out_dtype=torch.float32):
    B, sq, H, D = q.shape
    out, lse = torch.empty(B, sq, H, D, dtype=out_dtype), torch.empty(B, H, sq)
    fwd(ptr(out), ptr(lse), ptr(q), ptr(k), ptr(v), ctypes.byref(shp), None)
    return out, lse


# ----------------------------------------------------------------------------
# fp32, one call per sequence


# (B, S, H, KV, D, lengths per row). 64 is the kernel's tile (CPU_ATTN_BQ/BK).
ONE_CALL = (
    (2, 300, 8, 2, 16, ([1, 1, 62, 64, 1, 100, 37, 34], [300])),  # tile edges, 1-token docs; one whole doc
    (1, 257, 4, 4, 32, ([1] * 257,)),                             # every token its own document
    (2, 130, 4, 1, 64, ([64, 64, 2], [63, 65, 2])),               # boundaries on and just off tile edges
    (1, 200, 6, 3, 24, ([17, 5, 90, 1, 44, 43],)),                # inside tiles, odd head dim
    (1, 129, 2, 2, 128, ([128, 1],)),                             # Llama 3 head dim, last token alone
)


def test_one_call():
    for B, S, H, KV, D, lens in ONE_CALL:
        doc = doc_ids(lens, first_id=7, gap=3)  # ids need only be nondecreasing, not 0, 1, 2, ...
        tag = f"B{B} S{S} H{H} KV{KV} D{D} docs {'/'.join(str(len(r)) for r in lens)}"
        q, k, v, dout = f32(B, S, H, D), f32(B, S, KV, D), f32(B, S, KV, D), f32(B, S, H, D)
        shp = shape_of(B, S, S, H, KV, D, doc)
        out, lse = run_forward(q, k, v, shp)
        qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
        od, lsed = ref_attention(qd, kd, vd, block_causal_mask(doc, 0, S, 0, S), 1.0 / math.sqrt(D))
        check(f"fwd out {tag}", out, od.detach(), 1e-5)
        check(f"fwd lse {tag}", lse, lsed.detach(), 1e-5)
        od.backward(dout.double())
        for mode, mname in ((1, "fused"), (2, "split")):
            set_backward_mode(mode)
            dq0, dk0, dv0 = f32(B, S, H, D), f32(B, S, KV, D), f32(B, S, KV, D)  # the op accumulates
            dq, dk, dv = dq0.clone(), dk0.clone(), dv0.clone()
            ws = torch.empty(ws_size(ctypes.byref(shp)) // 4 + 16)
            attn_backward(ptr(dq), ptr(dk), ptr(dv), ptr(dout), ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse),
                          ctypes.byref(shp), ptr(ws))
            for name, got, base, ref in (("dq", dq, dq0, qd.grad), ("dk", dk, dk0, kd.grad), ("dv", dv, dv0, vd.grad)):
                check(f"bwd {mname} {name} {tag}", got.double() - base.double(), ref, 1e-4)
        set_backward_mode(0)


def test_vector_widths():
    """the 8-wide tile kernel gives the 16-wide one's bits under the document mask too
    (where the CPU has AVX-512; elsewhere both runs take the 8-wide kernel)"""
    B, S, H, KV, D, lens = ONE_CALL[0]
    doc = doc_ids(lens)
    q, k, v, dout = f32(B, S, H, D), f32(B, S, KV, D), f32(B, S, KV, D), f32(B, S, H, D)
    shp = shape_of(B, S, S, H, KV, D, doc)
    res = []
    for w in (16, 8):
        got = set_vector_width(w)
        out, lse = run_forward(q, k, v, shp)
        grads = [torch.zeros(B, S, H, D), torch.zeros(B, S, KV, D), torch.zeros(B, S, KV, D)]
        attn_backward(*(ptr(g) for g in grads), ptr(dout), ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse),
                      ctypes.byref(shp), None)
        res.append([out, lse] + grads)
        print(f"  vector width {got}")
    set_vector_width(0)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), res[0], res[1]):
        check_bits(f"width 8 == width 16 {name}", b, a)


def test_one_document_is_causal():
    """a single document is the causal mask: the same bits as the op without one"""
    B, S, H, KV, D = 2, 190, 4, 2, 16
    doc = torch.zeros(B, S, dtype=torch.int32)
    q, k, v, dout = f32(B, S, H, D), f32(B, S, KV, D), f32(B, S, KV, D), f32(B, S, H, D)
    res = []
    for d in (None, doc):
        shp = shape_of(B, S, S, H, KV, D, d)
        out, lse = run_forward(q, k, v, shp)
        grads = [torch.zeros(B, S, H, D), torch.zeros(B, S, KV, D), torch.zeros(B, S, KV, D)]
        attn_backward(*(ptr(g) for g in grads), ptr(dout), ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse),
                      ctypes.byref(shp), None)
        res.append([out, lse] + grads)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), res[0], res[1]):
        check_bits(f"one document == causal {name}", b, a)


# ----------------------------------------------------------------------------
# ring attention: context parallel's calls


def test_ring_blocks():
    """cp = 2, load-balanced: 4 chunks of 64, rank r holds chunks r and 3 - r. Every
    (query chunk, key chunk) pair at or below the diagonal is one call with global
    offsets, merged by log-sum-exp; backward per block with the merged (out, lse)."""
    B, H, KV, D, ch = 2, 4, 2, 16, 64
    S = 4 * ch
    # row 0: a document spans chunks 0-2 (keys of chunk 0 seen from chunk 2), chunk 3 starts
    # mid-way through its own; row 1: short documents, so many blocks see nothing
    doc = doc_ids(([5, 150, 70, 31], [40, 20, 4, 60, 30, 62, 40]))
    q, k, v, dout = f32(B, S, H, D), f32(B, S, KV, D), f32(B, S, KV, D), f32(B, S, H, D)
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    od, lsed = ref_attention(qd, kd, vd, block_causal_mask(doc, 0, S, 0, S), 1.0 / math.sqrt(D))
    od.backward(dout.double())
    out_all, lse_all = torch.empty(B, S, H, D), torch.empty(B, H, S)
    dq_all, dk_all, dv_all = torch.zeros(B, S, H, D), torch.zeros(B, S, KV, D), torch.zeros(B, S, KV, D)
    empty_rows = 0
    for b in range(B):  # one call per sequence, as parallel/cp.c makes them
        drow = doc[b:b + 1].contiguous()
        for jq in (0, 3, 1, 2):  # rank 0's chunks, then rank 1's
            q0 = jq * ch
            qi, doi = q[b:b + 1, q0:q0 + ch].contiguous(), dout[b:b + 1, q0:q0 + ch].contiguous()
            acc_o, acc_l = torch.zeros(1, ch, H, D), torch.full((1, H, ch), float("-inf"))
            for jk in range(jq + 1):
                k0 = jk * ch
                shp = shape_of(1, ch, ch, H, KV, D, drow, q0, k0)
                kj, vj = k[b:b + 1, k0:k0 + ch].contiguous(), v[b:b + 1, k0:k0 + ch].contiguous()
                ob, lb = run_forward(qi, kj, vj, shp)
                empty_rows += int((lb == float("-inf")).sum())
                attn_merge(ptr(acc_o), ptr(acc_l), ptr(ob), ptr(lb), 1, ch, H, D)
            out_all[b, q0:q0 + ch], lse_all[b, :, q0:q0 + ch] = acc_o[0], acc_l[0]
            dqi = torch.zeros(1, ch, H, D)
            for jk in range(jq + 1):
                k0 = jk * ch
                dk_c, dv_c = torch.zeros(1, ch, KV, D), torch.zeros(1, ch, KV, D)
                shp = shape_of(1, ch, ch, H, KV, D, drow, q0, k0)
                kj, vj = k[b:b + 1, k0:k0 + ch].contiguous(), v[b:b + 1, k0:k0 + ch].contiguous()
                attn_backward(ptr(dqi), ptr(dk_c), ptr(dv_c), ptr(doi), ptr(qi), ptr(kj), ptr(vj), ptr(acc_o),
                              ptr(acc_l), ctypes.byref(shp), None)
                dk_all[b, k0:k0 + ch] += dk_c[0]
                dv_all[b, k0:k0 + ch] += dv_c[0]
            dq_all[b, q0:q0 + ch] = dqi[0]
    record("ring: block rows that see no key (must be > 0)", "count", empty_rows, 0, ok=empty_rows > 0)
    check("ring fwd out (merged)", out_all, od.detach(), 1e-5)
    check("ring fwd lse (merged)", lse_all, lsed.detach(), 1e-5)
    check("ring bwd dq", dq_all, qd.grad, 1e-4)
    check("ring bwd dk", dk_all, kd.grad, 1e-4)
    check("ring bwd dv", dv_all, vd.grad, 1e-4)


# ----------------------------------------------------------------------------
# bf16 twins


BF_RTOL, BF_MAXTOL = 8e-3, 1e-2  # one bf16 ulp (test_ops_cpu.py)


def round_bf16(x32):
    x32 = x32.float().contiguous()
    out = torch.empty(x32.shape, dtype=torch.bfloat16)
    cast_f32_to_bf16(ptr(out), ptr(x32), x32.numel())
    return out


def test_bf16():
    cases = ((2, 200, 8, 2, 32, ([3, 61, 64, 1, 71], [200]), 0, 0),
             (1, 96, 4, 2, 16, ([1, 50, 60, 81],), 96, 0))  # a ring block: keys before the queries
    for B, S, H, KV, D, lens, q_off, k_off in cases:
        doc = doc_ids(lens)
        sq = sk = S if not q_off else doc.shape[1] - q_off
        tag = f"B{B} Sq{sq} Sk{sk} H{H} KV{KV} D{D} q@{q_off}"
        q, dout = f32(B, sq, H, D).bfloat16(), f32(B, sq, H, D).bfloat16()
        k, v = f32(B, sk, KV, D).bfloat16(), f32(B, sk, KV, D).bfloat16()
        shp = shape_of(B, sq, sk, H, KV, D, doc, q_off, k_off)
        mask = block_causal_mask(doc, q_off, sq, k_off, sk)
        out, lse = run_forward(q, k, v, shp, attn_forward_bf16, torch.bfloat16)
        of = ref_attention(q.float(), k.float(), v.float(), mask, 1.0 / math.sqrt(D))[0]
        check(f"bf16 fwd out {tag}", out.float(), of.to(torch.bfloat16).float(), BF_RTOL, BF_MAXTOL)
        q32, k32, v32, out32, dout32 = q.float(), k.float(), v.float(), out.float(), dout.float()
        o32, l32 = run_forward(q32, k32, v32, shp)
        check_bits(f"bf16 fwd out == fp32 twin {tag}", out, round_bf16(o32))
        check_bits(f"bf16 fwd lse == fp32 twin {tag}", lse, l32)
        dq, dk, dv = (torch.full(t.shape, 3.0, dtype=torch.bfloat16) for t in (q, k, k))  # written over
        attn_backward_bf16(ptr(dq), ptr(dk), ptr(dv), ptr(dout), ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse),
                           ctypes.byref(shp), None)
        grads32 = [torch.zeros(B, sq, H, D), torch.zeros(B, sk, KV, D), torch.zeros(B, sk, KV, D)]
        attn_backward(*(ptr(g) for g in grads32), ptr(dout32), ptr(q32), ptr(k32), ptr(v32), ptr(out32), ptr(lse),
                      ctypes.byref(shp), None)
        qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
        ref_attention(qd, kd, vd, mask, 1.0 / math.sqrt(D))[0].backward(dout.double())
        for name, got, g32, ref in (("dq", dq, grads32[0], qd.grad), ("dk", dk, grads32[1], kd.grad),
                                    ("dv", dv, grads32[2], vd.grad)):
            check_bits(f"bf16 bwd {name} == fp32 twin {tag}", got, round_bf16(g32))
            # the f64 autograd runs through the exact, not the bf16-rounded, out (test_ops_cpu's gate)
            check(f"bf16 bwd {name} vs f64 {tag}", got.float(), ref, 2e-2, 5e-2)


def main():
    t0 = time.time()
    for t in (test_one_call, test_vector_widths, test_one_document_is_causal, test_ring_blocks, test_bf16):
        t1 = time.time()
        t()
        print(f"  {t.__name__:32s} {time.time() - t1:6.2f} s")
    w = max(len(r[0]) for r in RESULTS)
    nfail = 0
    for op, metric, val, tol, ok in RESULTS:
        nfail += not ok
        print(f"{op:{w}s}  {metric:18s} {val:11.3e} {tol:9.1e}  {'ok' if ok else 'FAIL'}")
    print(f"\n{len(RESULTS) - nfail}/{len(RESULTS)} checks passed in {time.time() - t0:.1f} s (seed {SEED})")
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
