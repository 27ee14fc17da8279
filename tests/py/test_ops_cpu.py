#!/usr/bin/env python3
"""Every op of the CPU backend (kernels/cpu) against an independent PyTorch reference.

Loads $TETRA_BUILD/lib/libtetra.so with ctypes and calls the cpu_* functions one by one
on random inputs of a fixed seed (printed; TETRA_SEED=N explores others). The
references are written here from the definitions, in float64 unless the point is to
reproduce an fp32 torch computation bit for bit (AdamW, the RoPE table, casts).

Tolerances (fp32 ops against float64 references; the bf16 twins: see test_bf16_* below):
  losses      norm-relative error <= 1e-5
  values and gradients  norm-relative error ||a-b||/||b|| <= 1e-4, and
              max |a-b| <= 1e-3 * max |b|  (no single element far off)
  casts  bf16 bit-exact against torch; fp8 e4m3fn/e5m2 bit-exact against a nearest-value
         search over the format's code table, and against ml_dtypes when it imports
  AdamW, 5 steps vs torch.optim.AdamW(foreach=False) in fp32: <= 1e-6 relative
  RoPE table vs TorchTitan's precompute_freqs_cis in fp32: max abs <= 2e-7

torch 1.13 (Debian) has no scaled_dot_product_attention, so the attention reference is
the textbook softmax(q k^T * scale + mask) v, with GQA by repeat_interleave of K/V heads.
Exits non-zero on any failure.
"""
import ctypes
import math
import os
import sys
import time

import numpy as np


def _import_torch_quietly():
    """Debian's torch is built against NumPy 1.x; next to NumPy 2 it prints a long warning
    while probing NumPy (harmless here: no torch<->NumPy bridge is used). Keep it out of
    the test log; real import errors still raise."""
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
import torch.nn.functional as F  # noqa: E402

try:
    import ml_dtypes
except Exception:  # missing, or built for another NumPy: the own fp8 reference still runs
    ml_dtypes = None

SEED = int(os.environ.get("TETRA_SEED", "20261125"))  # fixed: every run checks the same inputs
print(f"seed {SEED} (set TETRA_SEED={SEED} to replay)")
torch.manual_seed(SEED)
rng = np.random.default_rng(SEED)

build = os.environ.get("TETRA_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
lib = ctypes.CDLL(os.path.join(build, "lib", "libtetra.so"))

c_int, c_float, c_double, c_size, c_void = ctypes.c_int, ctypes.c_float, ctypes.c_double, ctypes.c_size_t, ctypes.c_void_p
P = c_void  # every buffer goes in as a raw pointer

F32, BF16, F16, E4M3, E5M2 = 0, 1, 2, 3, 4


class AttnShape(ctypes.Structure):
    _fields_ = [("b", c_int), ("sq", c_int), ("sk", c_int), ("h", c_int), ("kv", c_int), ("d", c_int),
                ("scale", c_float), ("causal", c_int), ("q_offset", c_int), ("k_offset", c_int),
                ("doc", c_void), ("doc_len", c_int)]


class GemmDesc(ctypes.Structure):
    _fields_ = [("a_type", c_int), ("b_type", c_int), ("c_type", c_int), ("trans_a", c_int), ("trans_b", c_int),
                ("m", c_int), ("n", c_int), ("k", c_int), ("lda", c_int), ("ldb", c_int), ("ldc", c_int),
                ("alpha", c_float), ("beta", c_float), ("a_scale", c_void), ("b_scale", c_void),
                ("scale_rowwise", c_int), ("fast_accum", c_int), ("batch", c_int),
                ("stride_a", ctypes.c_int64), ("stride_b", ctypes.c_int64), ("stride_c", ctypes.c_int64),
                ("c_in", c_void)]


def sig(name, *args, ret=None):
    f = getattr(lib, name)
    f.argtypes = list(args)
    f.restype = ret
    return f


cpu_fill = sig("cpu_fill", P, c_float, c_size)
cpu_scale = sig("cpu_scale", P, c_float, c_size)
cpu_axpy = sig("cpu_axpy", P, P, c_float, c_size)
cpu_add = sig("cpu_add", P, P, P, c_size)
cpu_sum_squares = sig("cpu_sum_squares", P, P, c_size)
cpu_sum = sig("cpu_sum", P, P, c_size)
cpu_amax = sig("cpu_amax", P, P, c_size)
cpu_amax_rows = sig("cpu_amax_rows", P, P, c_int, c_int)
cpu_transpose = sig("cpu_transpose", P, P, c_int, c_int)
cpu_cast_f32_to_bf16 = sig("cpu_cast_f32_to_bf16", P, P, c_size)
cpu_cast_bf16_to_f32 = sig("cpu_cast_bf16_to_f32", P, P, c_size)
cpu_cast_f32_to_fp8 = sig("cpu_cast_f32_to_fp8", P, P, P, c_int, c_int, c_int, c_int)
cpu_cast_fp8_to_f32 = sig("cpu_cast_fp8_to_f32", P, P, P, c_int, c_int, c_int, c_int)
cpu_fp8_scale_from_amax = sig("cpu_fp8_scale_from_amax", P, P, P, c_int, c_int, c_float, c_int)
cpu_adamw_step = sig("cpu_adamw_step", P, P, P, P, c_size, c_double, c_double, c_double, c_double, c_double,
                     c_int, c_float, P)
cpu_gemm = sig("cpu_gemm", P, P, P, ctypes.POINTER(GemmDesc))
cpu_gemm_bf16_onednn = sig("cpu_gemm_bf16_onednn", ctypes.c_int, ret=ctypes.c_int)
cpu_gemm_f32_onednn = sig("cpu_gemm_f32_onednn", ctypes.c_int, ret=ctypes.c_int)
cpu_embedding_forward = sig("cpu_embedding_forward", P, P, P, c_int, c_int, c_int, c_int)
cpu_embedding_backward = sig("cpu_embedding_backward", P, P, P, c_int, c_int, c_int, c_int)
cpu_rmsnorm_forward = sig("cpu_rmsnorm_forward", P, P, P, P, c_int, c_int, c_float)
cpu_rmsnorm_backward_input = sig("cpu_rmsnorm_backward_input", P, P, P, P, P, c_int, c_int, P)
cpu_rmsnorm_backward_weight = sig("cpu_rmsnorm_backward_weight", P, P, P, P, c_int, c_int, c_int)
cpu_rope_forward = sig("cpu_rope_forward", P, P, P, P, c_int, c_int, c_int, c_int, c_int, c_int, c_int)
cpu_rope_backward = sig("cpu_rope_backward", P, P, P, P, c_int, c_int, c_int, c_int, c_int, c_int, c_int)
cpu_swiglu_forward = sig("cpu_swiglu_forward", P, P, P, c_size)
cpu_swiglu_backward = sig("cpu_swiglu_backward", P, P, P, P, P, c_size)
cpu_cross_entropy = sig("cpu_cross_entropy", P, P, P, P, c_int, c_int, c_float)
cpu_ce_shard_max = sig("cpu_ce_shard_max", P, P, c_int, c_int)
cpu_ce_shard_sums = sig("cpu_ce_shard_sums", P, P, P, P, P, c_int, c_int, c_int)
cpu_ce_shard_finish = sig("cpu_ce_shard_finish", P, P, P, P, P, P, P, c_int, c_int, c_int, c_float)
cpu_attention_workspace_size = sig("cpu_attention_workspace_size", ctypes.POINTER(AttnShape), ret=c_size)
cpu_attention_forward = sig("cpu_attention_forward", P, P, P, P, P, ctypes.POINTER(AttnShape), P)
cpu_attention_backward = sig("cpu_attention_backward", P, P, P, P, P, P, P, P, P, ctypes.POINTER(AttnShape), P)
cpu_attention_merge = sig("cpu_attention_merge", P, P, P, P, c_int, c_int, c_int, c_int)
cpu_attention_set_backward_mode = sig("cpu_attention_set_backward_mode", c_int)
cpu_embedding_forward_bf16 = sig("cpu_embedding_forward_bf16", P, P, P, c_int, c_int, c_int, c_int)
cpu_embedding_backward_bf16 = sig("cpu_embedding_backward_bf16", P, P, P, c_int, c_int, c_int, c_int)
cpu_rmsnorm_forward_bf16 = sig("cpu_rmsnorm_forward_bf16", P, P, P, P, P, c_int, c_int, c_float)
cpu_rmsnorm_backward_input_bf16 = sig("cpu_rmsnorm_backward_input_bf16", P, P, P, P, P, P, c_int, c_int, P)
cpu_rmsnorm_backward_weight_bf16 = sig("cpu_rmsnorm_backward_weight_bf16", P, P, P, P, c_int, c_int, c_int)
cpu_rope_forward_bf16 = sig("cpu_rope_forward_bf16", P, P, P, P, c_int, c_int, c_int, c_int, c_int, c_int, c_int)
cpu_rope_backward_bf16 = sig("cpu_rope_backward_bf16", P, P, P, P, P, c_int, c_int, c_int, c_int, c_int, c_int,
                             c_int)
cpu_swiglu_forward_bf16 = sig("cpu_swiglu_forward_bf16", P, P, P, P, c_size)
cpu_swiglu_backward_bf16 = sig("cpu_swiglu_backward_bf16", P, P, P, P, P, P, P, c_size)
cpu_attention_workspace_size_bf16 = sig("cpu_attention_workspace_size_bf16", ctypes.POINTER(AttnShape), ret=c_size)
cpu_attention_forward_bf16 = sig("cpu_attention_forward_bf16", P, P, P, P, P, ctypes.POINTER(AttnShape), P)
cpu_attention_backward_bf16 = sig("cpu_attention_backward_bf16", P, P, P, P, P, P, P, P, P,
                                  ctypes.POINTER(AttnShape), P)
ops_get = sig("ops_get", ctypes.c_char_p, ctypes.c_char_p, c_size, ret=c_void)
ops_rope_table = sig("ops_rope_table", P, c_int, c_int, c_float, c_int, c_float, c_float, c_float, c_int)


# Debian's torch is built against NumPy 1.x and the venv has NumPy 2, so torch's own
# NumPy bridge (from_numpy, .numpy()) is unavailable: move data through raw bytes.
_NP2T = {np.float32: torch.float32, np.float64: torch.float64, np.int16: torch.int16, np.int32: torch.int32,
         np.uint8: torch.uint8}


def np2t(a):
    a = np.ascontiguousarray(a)
    return torch.frombuffer(bytearray(a.tobytes()), dtype=_NP2T[a.dtype.type]).reshape(a.shape)


def t2np(t, dtype):
    t = t.contiguous()
    return np.frombuffer(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()), dtype=dtype).reshape(t.shape).copy()


def ptr(t):
    if t is None:
        return None
    if isinstance(t, np.ndarray):
        assert t.flags["C_CONTIGUOUS"]
        return t.ctypes.data
    assert t.is_contiguous()
    return t.data_ptr()


def ptr_at(t, elems):
    """the address of element `elems` of a contiguous tensor (a column block of its rows)"""
    return ptr(t) + elems * t.element_size()


def f32(*shape, scale=1.0):
    return (torch.randn(*shape, dtype=torch.float64) * scale).float()


# ----------------------------------------------------------------------------
# result table

RESULTS = []  # (op, metric, value, tolerance, ok)


def record(op, metric, value, tol, ok=None):
    if ok is None:
        ok = value <= tol
    RESULTS.append((op, metric, float(value), tol, bool(ok)))


def check(op, got, ref, rtol=1e-4, maxtol=None):
    """norm-relative error and max-abs error relative to max |ref|."""
    got = got.double() if torch.is_tensor(got) else torch.as_tensor(got, dtype=torch.float64)
    ref = ref.double() if torch.is_tensor(ref) else torch.as_tensor(ref, dtype=torch.float64)
    assert got.shape == ref.shape, (op, got.shape, ref.shape)
    if not torch.isfinite(got).all():
        record(op, "rel", float("inf"), rtol, False)
        return
    diff = (got - ref).abs()
    nref = ref.norm().item()
    rel = diff.norm().item() / nref if nref > 0 else diff.norm().item()
    mref = ref.abs().max().item() if ref.numel() else 0.0
    mx = diff.max().item() / mref if mref > 0 else (diff.max().item() if diff.numel() else 0.0)
    maxtol = maxtol if maxtol is not None else 10 * rtol
    RESULTS.append((op, "rel", rel, rtol, rel <= rtol and mx <= maxtol))
    RESULTS.append((op, "maxabs/max|ref|", mx, maxtol, rel <= rtol and mx <= maxtol))


def check_loss(op, got, ref, tol=1e-5):
    """A summed loss: fp32 log-sum-exp is exact to a few ulps of its own O(1..10) size, so a
    tiny loss (the target a clear argmax) is judged against max(|ref|, 1), not |ref|."""
    got, ref = float(got), float(ref)
    err = abs(got - ref) / max(abs(ref), 1.0) if math.isfinite(got) else float("inf")
    record(op, "abs/max(|ref|,1)", err, tol)


def check_bits(op, got_bits, ref_bits, nan_mask=None):
    got_bits = np.asarray(got_bits)
    ref_bits = np.asarray(ref_bits)
    bad = got_bits != ref_bits
    if nan_mask is not None:
        bad &= ~nan_mask
    n = int(bad.sum())
    RESULTS.append((op, "mismatched codes", n, 0, n == 0))
    if n:
        idx = np.nonzero(bad)[0][:5]
        print(f"  {op}: first mismatches at {idx}: got {got_bits[idx]} want {ref_bits[idx]}")


# ----------------------------------------------------------------------------
# elementwise and reductions


def test_elementwise():
    n = 100003
    x, y = f32(n), f32(n)
    z = y.clone()
    cpu_axpy(ptr(z), ptr(x), 0.37, n)
    check("axpy", z, y.double() + float(np.float32(0.37)) * x.double(), 1e-6)
    z = torch.empty(n)
    cpu_add(ptr(z), ptr(x), ptr(y), n)
    check("add", z, x.double() + y.double(), 1e-6)
    z = x.clone()
    cpu_scale(ptr(z), -1.5, n)
    check("scale", z, x.double() * -1.5, 1e-7)
    cpu_fill(ptr(z), 2.5, n)
    record("fill", "wrong elements", int((z != 2.5).sum()), 0)
    out = torch.tensor([1.25], dtype=torch.float32)
    cpu_sum_squares(ptr(out), ptr(x), n)  # accumulates into out
    check("sum_squares", out, torch.tensor([1.25 + (x.double() ** 2).sum().item()]), 1e-6)
    cpu_sum(ptr(out), ptr(x), n)
    check("sum", out, torch.tensor([x.double().sum().item()]), 1e-5)
    cpu_amax(ptr(out), ptr(x), n)
    record("amax", "abs diff", abs(out.item() - x.abs().max().item()), 0)
    xn = x.clone()
    xn[777] = float("nan")
    cpu_amax(ptr(out), ptr(xn), n)
    record("amax", "NaN propagates", 0 if math.isnan(out.item()) else 1, 0)
    rows, cols = 37, 301
    xr = f32(rows, cols)
    am = torch.empty(rows)
    cpu_amax_rows(ptr(am), ptr(xr), rows, cols)
    record("amax_rows", "abs diff", (am - xr.abs().amax(1)).abs().max().item(), 0)

    # transpose (exact): edge tiles, a single row or column, several 32-tiles, empty shapes;
    # one guard element past the end of out must stay untouched
    for rows, cols in ((1, 77), (77, 1), (1, 1), (37, 135), (32, 64), (300, 517), (0, 5), (5, 0)):
        xt = rng.standard_normal((rows, cols)).astype(np.float32)
        out = np.full(rows * cols + 1, -7.0, dtype=np.float32)
        cpu_transpose(ptr(out), ptr(xt), rows, cols)
        check_bits(f"transpose {rows}x{cols}", out[:-1].view(np.uint32),
                   np.ascontiguousarray(xt.T).ravel().view(np.uint32))
        record(f"transpose {rows}x{cols}", "guard overwritten", 0 if out[-1] == -7.0 else 1, 0)


# ----------------------------------------------------------------------------
# casts (bit-exact)


def special_f32():
    v = [0.0, -0.0, 1.0, -1.0, 448.0, 449.0, 463.99, 464.0, 465.0, 480.0, 1e6, -1e6, 57344.0, 61439.0, 61440.0,
         65536.0, 1e30, float("inf"), float("-inf"), float("nan"), 1e-45, -1e-45, 1e-40, 2.0**-6, 2.0**-7,
         2.0**-9, 2.0**-10, 3 * 2.0**-10, 2.0**-14, 2.0**-16, 2.0**-17, 3 * 2.0**-17, 3.4e38, -3.4e38]
    return np.array(v, dtype=np.float32)


# fp8 reference, independent of the C bit tricks: decode tables from the format
# definitions, and encoding by searching the nearest representable value (ties to the
# even code, i.e. the even mantissa), after torchao's clamp to +-max.
FP8 = {E4M3: dict(name="e4m3", ebits=4, mbits=3, bias=7, max=448.0),
       E5M2: dict(name="e5m2", ebits=5, mbits=2, bias=15, max=57344.0)}


def fp8_table(fmt):
    """float64 value of each of the 256 codes (NaN codes NaN, e5m2 inf codes inf)."""
    f = FP8[fmt]
    vals = np.empty(256)
    for c in range(256):
        sign = -1.0 if c & 0x80 else 1.0
        e, m = (c & 0x7F) >> f["mbits"], c & ((1 << f["mbits"]) - 1)
        emax = (1 << f["ebits"]) - 1
        if fmt == E4M3 and e == emax and m == (1 << f["mbits"]) - 1:
            v = np.nan
        elif fmt == E5M2 and e == emax:
            v = np.inf if m == 0 else np.nan
        elif e == 0:
            v = m * 2.0 ** (1 - f["bias"] - f["mbits"])
        else:
            v = (1 + m / (1 << f["mbits"])) * 2.0 ** (e - f["bias"])
        vals[c] = sign * v
    return vals


def fp8_encode_ref(x32, fmt):
    f = FP8[fmt]
    table = fp8_table(fmt)
    pos = table[:128]
    nfin = int(np.sum(np.isfinite(pos)))  # codes 0..nfin-1 are the finite positives, increasing
    vals = pos[:nfin]
    x = x32.astype(np.float64)
    ax = np.minimum(np.abs(x), f["max"])
    hi = np.clip(np.searchsorted(vals, ax, side="left"), 0, nfin - 1)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = ax - vals[lo], vals[hi] - ax
    code = np.where(dlo < dhi, lo, hi)
    code = np.where((dlo == dhi) & (lo != hi), np.where(lo % 2 == 0, lo, hi), code)
    code = np.where(vals[hi] == ax, hi, code)
    sign = np.signbit(x32).astype(np.int64) << 7
    nan_code = 0x7F if fmt == E4M3 else 0x7E
    return np.where(np.isnan(x32), sign | nan_code, sign | code).astype(np.uint8)


def fp8_midpoints(fmt):
    """all finite values and the midpoints between neighbours (tie cases), +-1 ulp around them."""
    t = fp8_table(fmt)
    finite = np.unique(np.abs(t[np.isfinite(t)]))
    mids32 = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)
    return np.concatenate([mids32, np.nextafter(mids32, np.float32(np.inf)), np.nextafter(mids32, np.float32(-np.inf)),
                           finite.astype(np.float32)])


def test_casts():
    # bf16 vs torch
    x = np.concatenate([special_f32(), rng.standard_normal(50000).astype(np.float32) *
                        (2.0 ** rng.integers(-30, 30, 50000)).astype(np.float32)])
    # exact ties in bf16 (low 16 bits = 0x8000) both ways
    ties = (rng.integers(0, 2**31, 2000).astype(np.uint32) & 0xFFFF0000) | 0x8000
    x = np.concatenate([x, ties.view(np.float32)])
    out = np.empty(len(x), dtype=np.uint16)
    cpu_cast_f32_to_bf16(ptr(out), ptr(x), len(x))
    ref = t2np(np2t(x).to(torch.bfloat16).view(torch.int16), np.uint16)
    # NaN: torch's own paths disagree (scalar c10::BFloat16 gives 0x7fc0, the vectorised cast
    # 0xffff), so NaN inputs only have to come out as some NaN
    got_nan = (out & 0x7F80) == 0x7F80
    got_nan &= (out & 0x7F) != 0
    check_bits("cast f32->bf16", out, ref, nan_mask=np.isnan(x) & got_nan)
    codes = np.arange(65536, dtype=np.uint16)
    back = np.empty(65536, dtype=np.float32)
    cpu_cast_bf16_to_f32(ptr(back), ptr(codes), 65536)
    refb = t2np(np2t(codes.view(np.int16)).view(torch.bfloat16).float(), np.float32)
    check_bits("cast bf16->f32", back.view(np.uint32), refb.view(np.uint32), nan_mask=np.isnan(refb) & np.isnan(back))

    if ml_dtypes is None:
        print("  (ml_dtypes not importable: fp8 casts checked against the built-in reference only)")
    for fmt in (E4M3, E5M2):
        name, fmax = FP8[fmt]["name"], FP8[fmt]["max"]
        dt = None if ml_dtypes is None else (ml_dtypes.float8_e4m3fn if fmt == E4M3 else ml_dtypes.float8_e5m2)
        x = np.concatenate([special_f32(), fp8_midpoints(fmt), -fp8_midpoints(fmt),
                            rng.standard_normal(40000).astype(np.float32) *
                            (2.0 ** rng.integers(-24, 20, 40000)).astype(np.float32)])
        for scale in (1.0, 0.37, 2.0**5):
            s = np.array([scale], dtype=np.float32)
            out = np.empty(len(x), dtype=np.uint8)
            cpu_cast_f32_to_fp8(ptr(out), ptr(x), ptr(s), 0, 1, len(x), fmt)
            with np.errstate(invalid="ignore", over="ignore"):
                xs = x * s[0]  # fp32 product, as the op computes it
                check_bits(f"cast f32->{name} (scale {scale:g})", out, fp8_encode_ref(xs, fmt))
                if dt is not None:  # torchao: clamp, then cast
                    check_bits(f"cast f32->{name} (scale {scale:g}) ml_dtypes", out,
                               np.clip(xs, -fmax, fmax).astype(dt).view(np.uint8))
        # rowwise scales
        rows, cols = 7, 501
        xr = rng.standard_normal((rows, cols)).astype(np.float32) * 10
        sc = (fmax / np.abs(xr).max(1)).astype(np.float32)
        out = np.empty((rows, cols), dtype=np.uint8)
        cpu_cast_f32_to_fp8(ptr(out), ptr(xr), ptr(sc), 1, rows, cols, fmt)
        check_bits(f"cast f32->{name} rowwise", out.ravel(), fp8_encode_ref(xr * sc[:, None], fmt).ravel())
        # decode all 256 codes (dequant scale 1)
        codes = np.arange(256, dtype=np.uint8)
        back = np.empty(256, dtype=np.float32)
        cpu_cast_fp8_to_f32(ptr(back), ptr(codes), None, 0, 1, 256, fmt)
        refd = fp8_table(fmt).astype(np.float32)
        check_bits(f"cast {name}->f32", back.view(np.uint32), refd.view(np.uint32),
                   nan_mask=np.isnan(refd) & np.isnan(back))
        if dt is not None:
            refm = codes.view(dt).astype(np.float32)
            check_bits(f"cast {name}->f32 ml_dtypes", back.view(np.uint32), refm.view(np.uint32),
                       nan_mask=np.isnan(refm) & np.isnan(back))
    # scale from amax (torchao: fp8_max / clamp(amax, 1e-12) in float64, stored fp32)
    # inv_scale: the dequant factor, one fp32 division 1/scale (numpy float32 division is IEEE)
    am = np.array([0.0, 1e-20, 3.7, 448.0, 1e5, 0.001234, 3e-7, 5e30], dtype=np.float32)

    def scale_ref(a, pow2):
        ref = (448.0 / np.maximum(a.astype(np.float64), 1e-12)).astype(np.float32)
        if pow2:
            ref = np.exp2(np.floor(np.log2(ref))).astype(np.float32)
        return ref

    for pow2 in (0, 1):
        name = f"fp8 scale from amax{' pow2' if pow2 else ''}"
        ref = scale_ref(am, pow2)
        sc = np.empty_like(am)
        cpu_fp8_scale_from_amax(ptr(sc), None, ptr(am), len(am), 0, 448.0, pow2)
        check_bits(name, sc.view(np.uint32), ref.view(np.uint32))
        sc = np.empty_like(am)
        inv = np.full_like(am, np.nan)
        cpu_fp8_scale_from_amax(ptr(sc), ptr(inv), ptr(am), len(am), 0, 448.0, pow2)
        check_bits(f"{name} (+inv)", sc.view(np.uint32), ref.view(np.uint32))
        check_bits(f"{name} inv", inv.view(np.uint32), (np.float32(1) / ref).view(np.uint32))
        # broadcast: n scales from amax[0] (a one-element array, so nothing past it is read)
        for k in (0, 2, 5):
            one = am[k:k + 1].copy()
            n = 7
            sc = np.empty(n, dtype=np.float32)
            inv = np.empty(n, dtype=np.float32)
            cpu_fp8_scale_from_amax(ptr(sc), ptr(inv), ptr(one), n, 1, 448.0, pow2)
            refb = np.full(n, scale_ref(one, pow2)[0], dtype=np.float32)
            check_bits(f"{name} broadcast amax={one[0]:g}", sc.view(np.uint32), refb.view(np.uint32))
            check_bits(f"{name} broadcast amax={one[0]:g} inv", inv.view(np.uint32),
                       (np.float32(1) / refb).view(np.uint32))


# ----------------------------------------------------------------------------
# gemm


def gemm_call(c, a, b, m, n, k, ta=0, tb=0, lda=None, ldb=None, ldc=None, alpha=1.0, beta=0.0,
              at=F32, bt=F32, ct=F32, a_scale=None, b_scale=None, rowwise=0, batch=0, sa=0, sb=0, sc=0, c_in=None):
    g = GemmDesc(at, bt, ct, ta, tb, m, n, k,
                 lda if lda else (m if ta else k), ldb if ldb else (k if tb else n), ldc if ldc else n,
                 alpha, beta, ptr(a_scale), ptr(b_scale), rowwise, 0, batch, sa, sb, sc, ptr(c_in))
    cpu_gemm(ptr(c), ptr(a), ptr(b), ctypes.byref(g))


def test_gemm():
    # fp32 on both routes: oneDNN's matmul and OpenBLAS's sgemm (threaded over panels);
    # the default is per CPU (cpu_gemm.c), the other one is what a user forcing it gets
    default = cpu_gemm_f32_onednn(-1)
    for on, route in ((1, "onednn"), (0, "openblas")):
        cpu_gemm_f32_onednn(on)
        record(f"gemm f32 route {route}", "route in effect", float(cpu_gemm_f32_onednn(-1) != on), 0)
        for (m, n, k, ta, tb, alpha, beta) in ((1, 1, 1, 0, 0, 1.0, 0.0), (17, 33, 65, 0, 1, 1.0, 0.0),
                                               (300, 257, 129, 0, 1, 0.5, 1.0), (129, 513, 300, 1, 0, 1.0, 1.0),
                                               (64, 700, 256, 1, 1, -2.0, 0.25), (1000, 96, 80, 0, 0, 1.0, 0.0)):
            a = f32(k, m) if ta else f32(m, k)
            b = f32(n, k) if tb else f32(k, n)
            c0 = f32(m, n)
            c = c0.clone()
            gemm_call(c, a, b, m, n, k, ta, tb, alpha=alpha, beta=beta)
            A = a.double().t() if ta else a.double()
            B = b.double().t() if tb else b.double()
            ref = alpha * A @ B + beta * c0.double()
            check(f"gemm f32 {m}x{n}x{k} t{ta}{tb} ({route})", c, ref, 1e-5)
            if beta != 0.0:  # beta's C from another buffer (c_in): the output over NaN, C untouched
                d = torch.full((m, n), float("nan"))
                cin = c0.clone()
                gemm_call(d, a, b, m, n, k, ta, tb, alpha=alpha, beta=beta, c_in=cin)
                check(f"gemm f32 c_in {m}x{n}x{k} t{ta}{tb} ({route})", d, ref, 1e-5)
                record(f"gemm f32 c_in {m}x{n}x{k} t{ta}{tb} ({route})", "C changed", float(not torch.equal(cin, c0)), 0)
        # beta = 0 must not read C (NaN garbage stays out), on the threaded and the bf16 paths
        for (m, n, k) in ((300, 257, 129), (20, 30, 40)):
            a, b = f32(m, k), f32(k, n)
            c = torch.full((m, n), float("nan"))
            gemm_call(c, a, b, m, n, k)
            record(f"gemm f32 beta=0 over NaN {m}x{n}x{k} ({route})", "non-finite outputs",
                   float((~torch.isfinite(c)).sum()), 0)
        # leading dims larger than the rows (sub-matrix views)
        m, n, k = 50, 40, 30
        a = f32(m, k + 7)
        b = f32(k, n + 3)
        c = torch.zeros(m, n + 5)
        gemm_call(c, a, b, m, n, k, lda=k + 7, ldb=n + 3, ldc=n + 5)
        check(f"gemm f32 strided ld ({route})", c[:, :n], a[:, :k].double() @ b[:, :n].double(), 1e-5)
        record(f"gemm f32 strided ld ({route})", "pad touched", float(c[:, n:].abs().sum()), 0)
        # batched
        bs, m, n, k = 3, 20, 24, 18
        a, b, c = f32(bs, m, k), f32(bs, k, n), torch.zeros(bs, m, n)
        gemm_call(c, a, b, m, n, k, batch=bs, sa=m * k, sb=k * n, sc=m * n)
        check(f"gemm f32 batched ({route})", c, a.double() @ b.double(), 1e-5)
    cpu_gemm_f32_onednn(default)
    # bf16 operands, bf16 and f32 output, on both routes: oneDNN's matmul (AVX512-BF16/AMX,
    # where the CPU has it) and the widened fp32 sgemm. Products of bf16 are exact in fp32,
    # so an fp32 C is the exact product up to summation order; a bf16 C is rounded once.
    routes = [(1, "onednn"), (0, "widened")] if cpu_gemm_bf16_onednn(-1) else [(0, "widened")]
    if len(routes) == 1:
        print("  (this CPU has no AVX512-BF16: bf16 GEMMs run widened only)")
    for on, route in routes:
        cpu_gemm_bf16_onednn(on)
        record(f"gemm bf16 route {route}", "route in effect", float(cpu_gemm_bf16_onednn(-1) != on), 0)
        for (m, n, k, ta, tb, alpha, beta) in ((70, 90, 110, 0, 1, 1.0, 0.0), (300, 257, 129, 0, 0, 1.0, 1.0),
                                               (129, 513, 300, 1, 0, 1.0, 1.0), (64, 70, 256, 1, 1, -2.0, 0.25),
                                               (1, 1, 1, 0, 0, 1.0, 0.0)):
            a = (f32(k, m) if ta else f32(m, k)).bfloat16()
            b = (f32(n, k) if tb else f32(k, n)).bfloat16()
            A = a.double().t() if ta else a.double()
            B = b.double().t() if tb else b.double()
            c0 = f32(m, n)
            c = c0.clone()
            gemm_call(c, a.view(torch.int16), b.view(torch.int16), m, n, k, ta, tb, alpha=alpha, beta=beta,
                      at=BF16, bt=BF16)
            check(f"gemm bf16 in, f32 out {m}x{n}x{k} t{ta}{tb} ({route})", c, alpha * A @ B + beta * c0.double(), 1e-5)
            cb0 = c0.bfloat16()
            cb = cb0.clone()
            gemm_call(cb.view(torch.int16), a.view(torch.int16), b.view(torch.int16), m, n, k, ta, tb, alpha=alpha,
                      beta=beta, at=BF16, bt=BF16, ct=BF16)
            # one bf16 rounding of the output
            check(f"gemm bf16 in, bf16 out {m}x{n}x{k} t{ta}{tb} ({route})", cb.float(),
                  alpha * A @ B + beta * cb0.double(), 4e-3, 8e-3)
        # beta = 0 does not read C; strided operands and C leave their padding alone
        m, n, k = 50, 40, 30
        a, b = f32(m, k + 7).bfloat16(), f32(k, n + 3).bfloat16()
        c = torch.full((m, n + 5), float("nan"))
        c[:, n:] = 0
        gemm_call(c, a.view(torch.int16), b.view(torch.int16), m, n, k, lda=k + 7, ldb=n + 3, ldc=n + 5,
                  at=BF16, bt=BF16)
        check(f"gemm bf16 strided ld over NaN ({route})", c[:, :n], a[:, :k].double() @ b[:, :n].double(), 1e-5)
        record(f"gemm bf16 strided ld ({route})", "pad touched", float(c[:, n:].abs().sum()), 0)
        # batched, bf16 C
        bs, m, n, k = 3, 20, 24, 18
        a, b = f32(bs, m, k).bfloat16(), f32(bs, k, n).bfloat16()
        cb = torch.zeros(bs, m, n, dtype=torch.bfloat16)
        gemm_call(cb.view(torch.int16), a.view(torch.int16), b.view(torch.int16), m, n, k, at=BF16, bt=BF16,
                  ct=BF16, batch=bs, sa=m * k, sb=k * n, sc=m * n)
        check(f"gemm bf16 batched ({route})", cb.float(), a.double() @ b.double(), 4e-3, 8e-3)
    cpu_gemm_bf16_onednn(1)
    # fp8, emulated exactly: quantise with our cast, then compare with the dequantised product
    for fa, fb, rowwise in ((E4M3, E4M3, 0), (E5M2, E4M3, 0), (E4M3, E4M3, 1)):
        m, n, k = 48, 80, 96  # x W^T: a = x [m,k], b = W [n,k]
        x = rng.standard_normal((m, k)).astype(np.float32) * 3
        w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
        fmax_a = 448.0 if fa == E4M3 else 57344.0
        if rowwise:
            sa = (448.0 / np.abs(x).max(1)).astype(np.float32)
            sb = (448.0 / np.abs(w).max(1)).astype(np.float32)
        else:
            sa = np.array([fmax_a / np.abs(x).max()], dtype=np.float32)
            sb = np.array([448.0 / np.abs(w).max()], dtype=np.float32)
        qa = np.empty((m, k), dtype=np.uint8)
        qb = np.empty((n, k), dtype=np.uint8)
        cpu_cast_f32_to_fp8(ptr(qa), ptr(x), ptr(sa), rowwise, m, k, fa)
        cpu_cast_f32_to_fp8(ptr(qb), ptr(w), ptr(sb), rowwise, n, k, fb)
        ia, ib = (1.0 / sa).astype(np.float32), (1.0 / sb).astype(np.float32)
        c = torch.zeros(m, n)
        gemm_call(c, qa, qb, m, n, k, tb=1, at=fa, bt=fb, a_scale=ia, b_scale=ib, rowwise=rowwise)
        A = np2t(fp8_table(fa)[qa]) * np2t(ia.astype(np.float64)).reshape(-1, 1)
        B = np2t(fp8_table(fb)[qb]) * np2t(ib.astype(np.float64)).reshape(-1, 1)
        ref = A @ B.t()
        name = f"gemm fp8 {'e4m3' if fa == E4M3 else 'e5m2'}x e4m3 {'rowwise' if rowwise else 'tensorwise'}"
        check(name, c, ref, 1e-5)
        # and the fp8 product is close to the fp32 one (quantisation error only)
        exact = np2t(x.astype(np.float64)) @ np2t(w.astype(np.float64)).t()
        e = ((c.double() - exact).norm() / exact.norm()).item()
        record(name, "vs unquantised (sanity)", e, 0.1)


# ----------------------------------------------------------------------------
# embedding, rmsnorm, rope, swiglu


def test_embedding():
    V, C, N = 103, 48, 301
    wte = f32(V, C)
    tok = torch.randint(0, V, (N,), dtype=torch.int32)
    tok[:20] = 5  # repeated tokens must accumulate
    out = torch.empty(N, C)
    cpu_embedding_forward(ptr(out), ptr(tok), ptr(wte), N, C, 0, V)
    check("embedding fwd", out, F.embedding(tok.long(), wte.double()), 1e-7)
    dout = f32(N, C)
    d0 = f32(V, C)
    dw = d0.clone()
    cpu_embedding_backward(ptr(dw), ptr(dout), ptr(tok), N, C, 0, V)
    ref = d0.double().index_add(0, tok.long(), dout.double())
    check("embedding bwd (accumulate)", dw, ref, 1e-6)
    # two vocab shards: forward rows sum to the full embedding, backward splits
    v0 = 47
    o1, o2 = torch.empty(N, C), torch.empty(N, C)
    cpu_embedding_forward(ptr(o1), ptr(tok), ptr(wte[:v0].contiguous()), N, C, 0, v0)
    cpu_embedding_forward(ptr(o2), ptr(tok), ptr(wte[v0:].contiguous()), N, C, v0, V - v0)
    check("embedding fwd vocab-sharded", o1 + o2, F.embedding(tok.long(), wte.double()), 1e-7)
    g1, g2 = torch.zeros(v0, C), torch.zeros(V - v0, C)
    cpu_embedding_backward(ptr(g1), ptr(dout), ptr(tok), N, C, 0, v0)
    cpu_embedding_backward(ptr(g2), ptr(dout), ptr(tok), N, C, v0, V - v0)
    check("embedding bwd vocab-sharded", torch.cat([g1, g2]),
          torch.zeros(V, C, dtype=torch.float64).index_add(0, tok.long(), dout.double()), 1e-6)


def test_rmsnorm():
    for N, C in ((1, 7), (67, 256), (300, 1000)):
        x = f32(N, C, scale=3.0)
        w = f32(C) * 0.2 + 1
        eps = 1e-5
        out, rstd = torch.empty(N, C), torch.empty(N)
        cpu_rmsnorm_forward(ptr(out), ptr(rstd), ptr(x), ptr(w), N, C, eps)
        xd = x.double().requires_grad_()
        wd = w.double().requires_grad_()
        yd = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * wd
        check(f"rmsnorm fwd {N}x{C}", out, yd.detach(), 1e-5)
        check(f"rmsnorm rstd {N}x{C}", rstd, torch.rsqrt(x.double().pow(2).mean(-1) + eps), 1e-5)
        dout = f32(N, C)
        yd.backward(dout.double())
        dx0 = f32(N, C)
        dx = dx0.clone()
        cpu_rmsnorm_backward_input(ptr(dx), ptr(dout), ptr(x), ptr(w), ptr(rstd), N, C, None)
        check(f"rmsnorm bwd dx {N}x{C}", dx - dx0, xd.grad, 1e-4)
        dw0 = f32(C)
        dw = dw0.clone()
        cpu_rmsnorm_backward_weight(ptr(dw), ptr(dout), ptr(x), ptr(rstd), N, C, 1)
        check(f"rmsnorm bwd dw {N}x{C}", dw.double(), dw0.double() + wd.grad, 1e-4)


def torchtitan_freqs_cis(dim, end, theta, scaled=True):
    """TorchTitan's precompute_freqs_cis (Llama 3.1 scaling), verbatim in fp32 torch."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    if scaled:
        scaling_factor, low_freq_factor, high_freq_factor, orig = 8.0, 1.0, 4.0, 8192
        wavelen = 2 * math.pi / freqs
        high_freq_wavelen = orig / high_freq_factor
        low_freq_wavelen = orig / low_freq_factor
        freqs = torch.where(wavelen > low_freq_wavelen, freqs / scaling_factor, freqs)
        smooth_factor = (orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed_freqs = (1 - smooth_factor) * freqs / scaling_factor + smooth_factor * freqs
        is_medium_freqs = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        freqs = torch.where(is_medium_freqs, smoothed_freqs, freqs)
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64 [end, dim/2]


def test_rope():
    for D, maxpos, scaled in ((16, 4096, 1), (128, 20000, 1), (64, 300, 0)):
        table = torch.empty(maxpos, D // 2, 2)
        ops_rope_table(ptr(table), D, maxpos, 500000.0, scaled, 8.0, 1.0, 4.0, 8192)
        ref = torch.view_as_real(torchtitan_freqs_cis(D, maxpos, 500000.0, bool(scaled)))
        diff = (table - ref).abs().max().item()
        record(f"rope table D={D} pos<{maxpos}{' scaled' if scaled else ''}", "max abs vs TorchTitan", diff, 2e-7)
    # apply, with explicit positions (context parallel chunks) and with an offset
    D, maxpos = 32, 512
    table = torch.empty(maxpos, D // 2, 2)
    ops_rope_table(ptr(table), D, maxpos, 500000.0, 1, 8.0, 1.0, 4.0, 8192)
    fc = torch.view_as_complex(table.double())
    for B, S, NH, pos, off in ((2, 17, 8, None, 0), (3, 40, 2, None, 100),
                               (2, 33, 4, torch.cat([torch.arange(0, 16), torch.arange(300, 317)]).int(), 0)):
        x = f32(B, S, NH, D)
        positions = pos.long() if pos is not None else torch.arange(off, off + S)
        f = fc[positions].reshape(1, S, 1, D // 2)
        xd = x.double().requires_grad_()
        yd = torch.view_as_real(torch.view_as_complex(xd.reshape(B, S, NH, D // 2, 2)) * f).reshape(B, S, NH, D)
        out = torch.empty_like(x)
        cpu_rope_forward(ptr(out), ptr(x), ptr(table), ptr(pos), off, B, S, NH, D, NH * D, NH * D)
        tag = f"B{B} S{S} nh{NH}{' positions' if pos is not None else f' offset {off}'}"
        check(f"rope fwd {tag}", out, yd.detach(), 1e-5)
        dout = f32(B, S, NH, D)
        yd.backward(dout.double())
        dx = dout.clone()  # in place
        cpu_rope_backward(ptr(dx), ptr(dx), ptr(table), ptr(pos), off, B, S, NH, D, NH * D, NH * D)
        check(f"rope bwd in-place {tag}", dx, xd.grad, 1e-5)
        # the q columns of a fused projection's rows: read from and written to rows wider
        # than NH * D, the other columns untouched; the same bits as the tensor of its own
        W = NH * D + 3 * D
        wide, wout = f32(B, S, W), f32(B, S, W)
        wide[:, :, D:D + NH * D] = x.reshape(B, S, NH * D)
        keep = wout.clone()
        cpu_rope_forward(ptr_at(wout, 2 * D), ptr_at(wide, D), ptr(table), ptr(pos), off, B, S, NH, D, W, W)
        same = torch.equal(wout[:, :, 2 * D:2 * D + NH * D], out.reshape(B, S, NH * D))
        outside = torch.equal(wout[:, :, :2 * D], keep[:, :, :2 * D]) and torch.equal(
            wout[:, :, 2 * D + NH * D:], keep[:, :, 2 * D + NH * D:])
        record(f"rope fwd rows of {W} {tag}", "bits equal to rows of its own, others untouched",
               0.0 if same and outside else 1.0, 0)
        dxw = torch.empty(B, S, NH * D)
        wide[:, :, D:D + NH * D] = dout.reshape(B, S, NH * D)
        cpu_rope_backward(ptr(dxw), ptr_at(wide, D), ptr(table), ptr(pos), off, B, S, NH, D, NH * D, W)
        record(f"rope bwd from rows of {W} {tag}", "bits equal to rows of its own",
               0.0 if torch.equal(dxw.reshape(B, S, NH, D), dx) else 1.0, 0)


def test_swiglu():
    n = 3 * 5 * 777 + 11
    a, g = f32(n, scale=4.0), f32(n)
    a[:4] = torch.tensor([-100.0, 100.0, 0.0, -88.5])
    out = torch.empty(n)
    cpu_swiglu_forward(ptr(out), ptr(a), ptr(g), n)
    ad, gd = a.double().requires_grad_(), g.double().requires_grad_()
    yd = F.silu(ad) * gd
    check("swiglu fwd", out, yd.detach(), 1e-5)
    dout = f32(n)
    yd.backward(dout.double())
    da, dg = torch.empty(n), torch.empty(n)
    cpu_swiglu_backward(ptr(da), ptr(dg), ptr(dout), ptr(a), ptr(g), n)
    check("swiglu bwd da", da, ad.grad, 1e-4)
    check("swiglu bwd dg", dg, gd.grad, 1e-4)
    a2, g2 = a.clone(), g.clone()
    cpu_swiglu_backward(ptr(a2), ptr(g2), ptr(dout), ptr(a2), ptr(g2), n)
    record("swiglu bwd in-place", "differs from out-of-place", float((a2 != da).sum() + (g2 != dg).sum()), 0)


# ----------------------------------------------------------------------------
# attention


def ref_attention(q, k, v, causal, q_off=0, k_off=0, scale=None):
    """float64 reference: softmax(q k^T * scale + mask) v; returns out [B,Sq,H,D], lse [B,H,Sq]."""
    B, Sq, H, D = q.shape
    Sk, KV = k.shape[1], k.shape[2]
    rep = H // KV
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    qh = q.permute(0, 2, 1, 3)
    kh = k.permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)
    vh = v.permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)
    s = (qh @ kh.transpose(-1, -2)) * scale
    if causal:
        mask = (k_off + torch.arange(Sk))[None, :] > (q_off + torch.arange(Sq))[:, None]
        s = s.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (p @ vh).permute(0, 2, 1, 3), lse


def attn_shape(B, Sq, Sk, H, KV, D, causal, qo=0, ko=0, scale=None):
    return AttnShape(B, Sq, Sk, H, KV, D, scale if scale is not None else 1.0 / math.sqrt(D), causal, qo, ko)


def attn_fwd(q, k, v, shp):
    B, Sq, H, D = q.shape
    out = torch.empty(B, Sq, H, D)
    lse = torch.empty(B, H, Sq)
    ws = torch.empty(cpu_attention_workspace_size(ctypes.byref(shp)) // 4 + 16)
    cpu_attention_forward(ptr(out), ptr(lse), ptr(q), ptr(k), ptr(v), ctypes.byref(shp), ptr(ws))
    return out, lse


def attn_bwd(dq, dk, dv, dout, q, k, v, out, lse, shp, workspace=True):
    ws = torch.empty(cpu_attention_workspace_size(ctypes.byref(shp)) // 4 + 16) if workspace else None
    cpu_attention_backward(ptr(dq), ptr(dk), ptr(dv), ptr(dout), ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse),
                           ctypes.byref(shp), ptr(ws))


def test_attention():
    for (B, S, H, KV, D, causal) in ((1, 1, 8, 2, 16, 1), (2, 17, 8, 2, 16, 1), (2, 256, 8, 2, 32, 1),
                                     (1, 200, 4, 4, 64, 1), (1, 300, 6, 3, 24, 1), (2, 130, 4, 1, 16, 0),
                                     (1, 129, 2, 2, 128, 1)):
        q, k, v = f32(B, S, H, D), f32(B, S, KV, D), f32(B, S, KV, D)
        shp = attn_shape(B, S, S, H, KV, D, causal)
        out, lse = attn_fwd(q, k, v, shp)
        qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
        od, lsed = ref_attention(qd, kd, vd, causal)
        tag = f"B{B} S{S} H{H} KV{KV} D{D}{' causal' if causal else ' full'}"
        check(f"attention fwd {tag}", out, od.detach(), 1e-5)
        check(f"attention lse {tag}", lse, lsed.detach(), 1e-5)
        dout = f32(B, S, H, D)
        od.backward(dout.double())
        # both backward schedules: fused per (batch, kv head) and split dQ / dK,dV passes
        for mode, mname in ((1, "fused"), (2, "split")):
            cpu_attention_set_backward_mode(mode)
            dq0, dk0, dv0 = f32(B, S, H, D), f32(B, S, KV, D), f32(B, S, KV, D)  # backward accumulates
            dq, dk, dv = dq0.clone(), dk0.clone(), dv0.clone()
            attn_bwd(dq, dk, dv, dout, q, k, v, out, lse, shp, workspace=(S != 17))
            check(f"attention bwd {mname} dq {tag}", dq.double() - dq0.double(), qd.grad, 1e-4)
            check(f"attention bwd {mname} dk {tag}", dk.double() - dk0.double(), kd.grad, 1e-4)
            check(f"attention bwd {mname} dv {tag}", dv.double() - dv0.double(), vd.grad, 1e-4)
        cpu_attention_set_backward_mode(0)
    # cross attention shapes: Sq != Sk, non-causal, with a scale that is not 1/sqrt(D)
    B, Sq, Sk, H, KV, D = 2, 45, 190, 4, 2, 16
    q, k, v = f32(B, Sq, H, D), f32(B, Sk, KV, D), f32(B, Sk, KV, D)
    shp = attn_shape(B, Sq, Sk, H, KV, D, 0, scale=0.3)
    out, lse = attn_fwd(q, k, v, shp)
    od, lsed = ref_attention(q.double(), k.double(), v.double(), 0, scale=0.3)
    check("attention fwd Sq45 Sk190 full scale0.3", out, od, 1e-5)
    check("attention lse Sq45 Sk190 full scale0.3", lse, lsed, 1e-5)


def test_ring_attention():
    """Context parallel: the sequence in irregular chunks; every (query chunk, key chunk)
    pair is one call with global offsets; partials are merged; backward per block with
    the merged (out, lse) accumulates dq/dk/dv. Must equal the one-call result."""
    B, H, KV, D = 2, 8, 2, 16
    bounds = [0, 90, 220, 300, 301]  # chunk sizes 90, 130, 80, 1
    S = bounds[-1]
    q, k, v = f32(B, S, H, D), f32(B, S, KV, D), f32(B, S, KV, D)
    dout = f32(B, S, H, D)
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    od, lsed = ref_attention(qd, kd, vd, 1)
    od.backward(dout.double())
    nck = len(bounds) - 1
    out_full, lse_full = torch.empty(B, S, H, D), torch.empty(B, H, S)
    dq, dk, dv = torch.zeros(B, S, H, D), torch.zeros(B, S, KV, D), torch.zeros(B, S, KV, D)
    dk_c = [torch.zeros(B, bounds[j + 1] - bounds[j], KV, D) for j in range(nck)]
    dv_c = [torch.zeros(B, bounds[j + 1] - bounds[j], KV, D) for j in range(nck)]
    for i in range(nck):
        q0, q1 = bounds[i], bounds[i + 1]
        qi = q[:, q0:q1].contiguous()
        acc_o = torch.zeros(B, q1 - q0, H, D)
        acc_l = torch.full((B, H, q1 - q0), float("-inf"))
        for j in (list(range(nck))[::-1]):  # any order: the merge is exact
            k0, k1 = bounds[j], bounds[j + 1]
            shp = attn_shape(B, q1 - q0, k1 - k0, H, KV, D, 1, q0, k0)
            ob, lb = attn_fwd(qi, k[:, k0:k1].contiguous(), v[:, k0:k1].contiguous(), shp)
            cpu_attention_merge(ptr(acc_o), ptr(acc_l), ptr(ob), ptr(lb), B, q1 - q0, H, D)
        out_full[:, q0:q1] = acc_o
        lse_full[:, :, q0:q1] = acc_l
        dqi = torch.zeros(B, q1 - q0, H, D)
        doi = dout[:, q0:q1].contiguous()
        for j in range(nck):
            k0, k1 = bounds[j], bounds[j + 1]
            shp = attn_shape(B, q1 - q0, k1 - k0, H, KV, D, 1, q0, k0)
            attn_bwd(dqi, dk_c[j], dv_c[j], doi, qi, k[:, k0:k1].contiguous(), v[:, k0:k1].contiguous(), acc_o, acc_l, shp)
        dq[:, q0:q1] = dqi
    for j in range(nck):
        dk[:, bounds[j]:bounds[j + 1]] = dk_c[j]
        dv[:, bounds[j]:bounds[j + 1]] = dv_c[j]
    check("ring attention fwd (4 chunks, merged)", out_full, od.detach(), 1e-5)
    check("ring attention lse", lse_full, lsed.detach(), 1e-5)
    check("ring attention bwd dq", dq, qd.grad, 1e-4)
    check("ring attention bwd dk", dk, kd.grad, 1e-4)
    check("ring attention bwd dv", dv, vd.grad, 1e-4)


# ----------------------------------------------------------------------------
# cross-entropy


def ce_reference(logits, targets, scale):
    ld = logits.double().requires_grad_()
    loss = F.cross_entropy(ld, targets.long(), reduction="sum", ignore_index=-100)
    (loss * scale).backward()
    return loss.detach(), ld.grad


def test_cross_entropy():
    for N, V in ((1, 5), (37, 1000), (64, 2048), (9, 50000)):
        logits = f32(N, V, scale=3.0)
        targets = torch.randint(0, V, (N,), dtype=torch.int32)
        if N > 3:
            targets[::4] = -100  # ignored tokens
        valid = int((targets != -100).sum())
        scale = 1.0 / max(valid, 1)
        loss_ref, grad_ref = ce_reference(logits, targets, float(np.float32(scale)))
        losses = torch.empty(N)
        dl = torch.empty(N, V)
        cpu_cross_entropy(ptr(dl), ptr(losses), ptr(logits), ptr(targets), N, V, scale)
        check_loss(f"cross_entropy loss N{N} V{V}", losses.double().sum(), loss_ref)
        check(f"cross_entropy dlogits N{N} V{V}", dl, grad_ref, 1e-4)
        inplace = logits.clone()
        cpu_cross_entropy(ptr(inplace), ptr(losses), ptr(inplace), ptr(targets), N, V, scale)
        record(f"cross_entropy in-place N{N} V{V}", "differs from out-of-place", float((inplace != dl).sum()), 0)
        l2 = torch.empty(N)
        cpu_cross_entropy(None, ptr(l2), ptr(logits), ptr(targets), N, V, scale)
        check_loss(f"cross_entropy loss-only N{N} V{V}", l2.double().sum(), loss_ref)


def test_cross_entropy_sharded():
    """loss parallel: V split in 2 uneven shards; the all-reduces are done here in numpy."""
    N, V = 50, 3001
    cut = 1234
    logits = f32(N, V, scale=4.0)
    targets = torch.randint(0, V, (N,), dtype=torch.int32)
    targets[3] = -100
    targets[4] = 0
    targets[5] = V - 1
    targets[6] = cut
    targets[7] = cut - 1
    valid = int((targets != -100).sum())
    scale = 1.0 / valid
    loss_ref, grad_ref = ce_reference(logits, targets, float(np.float32(scale)))
    shards = [(0, cut), (cut, V - cut)]
    zs = [logits[:, s:s + n].contiguous() for s, n in shards]
    mx = [torch.empty(N) for _ in shards]
    for z, m, (s, n) in zip(zs, mx, shards):
        cpu_ce_shard_max(ptr(m), ptr(z), N, n)
    gmax = torch.maximum(mx[0], mx[1])  # all-reduce MAX
    sums = [torch.empty(2, N) for _ in shards]  # [sum_exp; target_logit]: one buffer, one all-reduce
    for z, sm, (s, n) in zip(zs, sums, shards):
        cpu_ce_shard_sums(ptr(sm[0]), ptr(sm[1]), ptr(z), ptr(gmax), ptr(targets), N, n, s)
    tot = (sums[0] + sums[1]).contiguous()  # all-reduce SUM
    dls, losses = [], []
    for z, (s, n) in zip(zs, shards):
        dl, ls = torch.empty(N, n), torch.empty(N)
        cpu_ce_shard_finish(ptr(dl), ptr(ls), ptr(z), ptr(gmax), ptr(tot[0]), ptr(tot[1]), ptr(targets), N, n, s, scale)
        dls.append(dl)
        losses.append(ls)
    check("cross_entropy 2 vocab shards loss", losses[0].double().sum().reshape(1), loss_ref.reshape(1), 1e-5)
    record("cross_entropy 2 vocab shards", "shard losses differ", float((losses[0] != losses[1]).sum()), 0)
    check("cross_entropy 2 vocab shards dlogits", torch.cat(dls, 1), grad_ref, 1e-4)
    # one shard covering everything = the fused op
    full_l, full_d = torch.empty(N), torch.empty(N, V)
    cpu_cross_entropy(ptr(full_d), ptr(full_l), ptr(logits), ptr(targets), N, V, scale)
    check("cross_entropy sharded vs fused", torch.cat(dls, 1), full_d, 1e-6)


# ----------------------------------------------------------------------------
# AdamW


def test_adamw():
    n = 10007
    for (lr, b1, b2, eps, wd, gs) in ((1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0), (3e-4, 0.9, 0.999, 1e-6, 0.0, 0.5)):
        p0 = f32(n)
        pt = torch.nn.Parameter(p0.clone())
        opt = torch.optim.AdamW([pt], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, foreach=False)
        p, m, v = p0.clone(), torch.zeros(n), torch.zeros(n)
        worst = 0.0
        for step in range(1, 6):
            g = f32(n, scale=10.0 ** -step)
            pt.grad = g.clone()
            if gs != 1.0:
                pt.grad.mul_(gs)  # what clip_grad_norm_ does
            opt.step()
            cpu_adamw_step(ptr(p), ptr(m), ptr(v), ptr(g), n, lr, b1, b2, eps, wd, step, gs, None)
            st = opt.state[pt]
            for got, ref in ((p, pt.detach()), (m, st["exp_avg"]), (v, st["exp_avg_sq"])):
                worst = max(worst, ((got.double() - ref.double()).norm() / ref.double().norm()).item())
            upd_ref = pt.detach().double() - p0.double()
            upd = p.double() - p0.double()
        tag = f"adamw 5 steps lr{lr:g} b2 {b2:g} wd{wd:g}{' gscale' if gs != 1 else ''}"
        record(tag, "max rel (p, m, v)", worst, 1e-6)
        check(tag + " update", upd, upd_ref, 1e-5)
        ulps = (p.view(torch.int32).long() - pt.detach().view(torch.int32).long()).abs().max().item()
        record(tag, "max ulp diff of p (info)", ulps, float("inf"))


# ----------------------------------------------------------------------------
# bf16 twins (mixed precision). Inputs are random values rounded to bf16; each op is
# checked three ways:
#   1. against torch computing in fp32 from the same (exact) bf16 values, its outputs then
#      rounded to bf16 with .to(torch.bfloat16): bf16 outputs within one bf16 ulp, i.e.
#      norm-relative <= 8e-3 and max |diff| <= 1e-2 * max |ref| (one ulp is at most 2^-7
#      = 7.8e-3 of a value; two fp32 computations that differ by a few fp32 ulps round to
#      the same or to neighbouring bf16 values). fp32 outputs (parameter gradients,
#      rstd, lse) are held to the fp32 ops' tolerances against float64: their inputs are
#      exact, so the bf16 storage adds no error there.
#   2. bit for bit against the fp32 twin run on the widened inputs and rounded once
#      (the contract: same per-element math, one rounding per output).
#   3. the accumulate/write semantics (rmsnorm dx accumulates in bf16; attention dq/dk/dv
#      are written over garbage) and in-place use where the fp32 op allows it.

BF_RTOL, BF_MAXTOL = 8e-3, 1e-2


def bf(*shape, scale=1.0):
    """random bf16 tensor (the values every reference starts from are these exact ones)"""
    return f32(*shape, scale=scale).bfloat16()


def bf_empty(*shape):
    return torch.empty(*shape, dtype=torch.bfloat16)


def round_bf16(x32):
    """fp32 tensor -> bf16 with the C rounding (the fp32 twin's output, rounded once)"""
    x32 = x32.float().contiguous()
    out = bf_empty(*x32.shape)
    cpu_cast_f32_to_bf16(ptr(out), ptr(x32), x32.numel())
    return out


def check_bf(op, got, ref32):
    """bf16 output vs torch's fp32 result rounded to bf16 (.to(torch.bfloat16))"""
    check(op, got.float(), ref32.float().to(torch.bfloat16).float(), BF_RTOL, BF_MAXTOL)


def check_twin(op, got, twin):
    """bit-exact against the fp32 twin's result (bf16 rounded once, or fp32 as is)"""
    g, t = got.contiguous(), twin.contiguous()
    dt = np.uint16 if g.dtype == torch.bfloat16 else np.uint32
    check_bits(op + " == fp32 twin", t2np(g, dt).ravel(), t2np(t, dt).ravel())


def test_bf16_embedding():
    V, C, N = 103, 80, 301
    wte = bf(V, C)
    tok = torch.randint(0, V, (N,), dtype=torch.int32)
    tok[:20] = 5  # repeated tokens accumulate
    for v0, vl in ((0, V), (47, V - 47)):  # whole table, and the second of two vocab shards
        tag = "" if v0 == 0 else " vocab shard"
        w = wte[v0:v0 + vl].contiguous()
        out = bf_empty(N, C)
        cpu_embedding_forward_bf16(ptr(out), ptr(tok), ptr(w), N, C, v0, vl)
        own = (tok >= v0) & (tok < v0 + vl)
        ref = torch.where(own[:, None], F.embedding((tok.long() - v0) * own.long(), w.float()), torch.zeros(1))
        check_bits(f"bf16 embedding fwd{tag} (a copy)", t2np(out, np.uint16).ravel(),
                   t2np(ref.bfloat16(), np.uint16).ravel())
        dout = bf(N, C)
        d0 = f32(vl, C)
        dw = d0.clone()
        cpu_embedding_backward_bf16(ptr(dw), ptr(dout), ptr(tok), N, C, v0, vl)
        idx = tok.long() - v0
        keep = (idx >= 0) & (idx < vl)
        refd = d0.double().index_add(0, idx[keep], dout.double()[keep])
        check(f"bf16 embedding bwd{tag} (fp32 dwte, accumulate)", dw, refd, 1e-6)
        twin, dout32 = d0.clone(), dout.float()  # (named: a temporary would be freed before the call)
        cpu_embedding_backward(ptr(twin), ptr(dout32), ptr(tok), N, C, v0, vl)
        check_twin(f"bf16 embedding bwd{tag}", dw, twin)


def test_bf16_rmsnorm():
    eps = 1e-5
    for N, C in ((1, 7), (67, 256), (300, 1000)):
        x = bf(N, C, scale=3.0)
        w = (f32(C) * 0.2 + 1).bfloat16()
        out, rstd = bf_empty(N, C), torch.empty(N)
        am = torch.empty(1)  # the amax the op writes as it writes out: max |out|, exactly
        cpu_rmsnorm_forward_bf16(ptr(out), ptr(rstd), ptr(am), ptr(x), ptr(w), N, C, eps)
        record(f"bf16 rmsnorm fwd amax {N}x{C}", "abs diff vs max|out|", float((am[0] - out.float().abs().max()).abs()), 0)
        xf = x.float().requires_grad_()
        wf = w.float().requires_grad_()
        yf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * wf  # torch in fp32
        tag = f"{N}x{C}"
        check_bf(f"bf16 rmsnorm fwd {tag}", out, yf.detach())
        check(f"bf16 rmsnorm rstd {tag}", rstd, torch.rsqrt(x.double().pow(2).mean(-1) + eps), 1e-5)
        o32, r32, x32, w32 = torch.empty(N, C), torch.empty(N), x.float(), w.float()
        cpu_rmsnorm_forward(ptr(o32), ptr(r32), ptr(x32), ptr(w32), N, C, eps)
        check_twin(f"bf16 rmsnorm fwd {tag}", out, round_bf16(o32))
        check_twin(f"bf16 rmsnorm rstd {tag}", rstd, r32)

        dout = bf(N, C)
        yf.backward(dout.float())
        dx0 = bf(N, C)  # the residual gradient so far: the op adds to it in fp32, rounds once
        dx = dx0.clone()
        cpu_rmsnorm_backward_input_bf16(ptr(dx), None, ptr(dout), ptr(x), ptr(w), ptr(rstd), N, C, None)
        check_bf(f"bf16 rmsnorm bwd dx (accumulate) {tag}", dx, dx0.float() + xf.grad)
        d32, dout32 = dx0.float(), dout.float()
        cpu_rmsnorm_backward_input(ptr(d32), ptr(dout32), ptr(x32), ptr(w32), ptr(rstd), N, C, None)
        check_twin(f"bf16 rmsnorm bwd dx {tag}", dx, round_bf16(d32))

        dw0 = f32(C)
        dw = dw0.clone()
        cpu_rmsnorm_backward_weight_bf16(ptr(dw), ptr(dout), ptr(x), ptr(rstd), N, C, 1)
        refw = dw0.double() + (dout.double() * x.double() * rstd.double()[:, None]).sum(0)
        check(f"bf16 rmsnorm bwd dw (fp32, accumulate) {tag}", dw, refw, 1e-5)
        check(f"bf16 rmsnorm bwd dw vs torch fp32 autograd {tag}", dw.double() - dw0.double(), wf.grad.double(), 1e-4)
        t32 = dw0.clone()
        cpu_rmsnorm_backward_weight(ptr(t32), ptr(dout32), ptr(x32), ptr(rstd), N, C, 1)
        check_twin(f"bf16 rmsnorm bwd dw {tag}", dw, t32)


def test_bf16_rope():
    D, maxpos = 32, 512
    table = torch.empty(maxpos, D // 2, 2)
    ops_rope_table(ptr(table), D, maxpos, 500000.0, 1, 8.0, 1.0, 4.0, 8192)
    fc = torch.view_as_complex(table)  # complex64: torch rotates in fp32
    for B, S, NH, pos, off in ((2, 17, 8, None, 0), (3, 40, 2, None, 100),
                               (2, 33, 4, torch.cat([torch.arange(0, 16), torch.arange(300, 317)]).int(), 0)):
        x = bf(B, S, NH, D)
        positions = pos.long() if pos is not None else torch.arange(off, off + S)
        f = fc[positions].reshape(1, S, 1, D // 2)
        tag = f"B{B} S{S} nh{NH}{' positions' if pos is not None else f' offset {off}'}"
        out = bf_empty(B, S, NH, D)
        cpu_rope_forward_bf16(ptr(out), ptr(x), ptr(table), ptr(pos), off, B, S, NH, D, NH * D, NH * D)
        ref = torch.view_as_real(torch.view_as_complex(x.float().reshape(B, S, NH, D // 2, 2)) * f)
        check_bf(f"bf16 rope fwd {tag}", out, ref.reshape(B, S, NH, D))
        t32, x32 = torch.empty(B, S, NH, D), x.float()
        cpu_rope_forward(ptr(t32), ptr(x32), ptr(table), ptr(pos), off, B, S, NH, D, NH * D, NH * D)
        check_twin(f"bf16 rope fwd {tag}", out, round_bf16(t32))
        dout = bf(B, S, NH, D)
        dx = dout.clone()  # in place
        am = torch.empty(1)
        cpu_rope_backward_bf16(ptr(dx), ptr(am), ptr(dx), ptr(table), ptr(pos), off, B, S, NH, D, NH * D, NH * D)
        record(f"bf16 rope bwd amax {tag}", "abs diff vs max|dx|", float((am[0] - dx.float().abs().max()).abs()), 0)
        refb = torch.view_as_real(torch.view_as_complex(dout.float().reshape(B, S, NH, D // 2, 2)) * f.conj())
        check_bf(f"bf16 rope bwd in-place {tag}", dx, refb.reshape(B, S, NH, D))
        dout32 = dout.float()
        cpu_rope_backward(ptr(t32), ptr(dout32), ptr(table), ptr(pos), off, B, S, NH, D, NH * D, NH * D)
        check_twin(f"bf16 rope bwd {tag}", dx, round_bf16(t32))
        # rows of a wider tensor (a fused projection's q or k columns), both directions
        W = NH * D + 2 * D
        wide = bf(B, S, W)
        wide[:, :, D:D + NH * D] = x.reshape(B, S, NH * D)
        keep = wide.clone()
        outw = bf_empty(B, S, NH * D)
        cpu_rope_forward_bf16(ptr(outw), ptr_at(wide, D), ptr(table), ptr(pos), off, B, S, NH, D, NH * D, W)
        record(f"bf16 rope fwd from rows of {W} {tag}", "bits equal to rows of its own",
               0.0 if torch.equal(outw.reshape(B, S, NH, D), out) else 1.0, 0)
        cpu_rope_backward_bf16(ptr_at(wide, D), None, ptr(dout), ptr(table), ptr(pos), off, B, S, NH, D, W, NH * D)
        same = torch.equal(wide[:, :, D:D + NH * D].reshape(B, S, NH, D), dx)
        outside = torch.equal(wide[:, :, :D], keep[:, :, :D]) and torch.equal(wide[:, :, D + NH * D:],
                                                                                keep[:, :, D + NH * D:])
        record(f"bf16 rope bwd into rows of {W} {tag}", "bits equal to rows of its own, others untouched",
               0.0 if same and outside else 1.0, 0)


def test_bf16_swiglu():
    n = 3 * 5 * 7770 + 11  # several CPU_CHUNK pieces and a ragged tail
    a, g = bf(n, scale=4.0), bf(n)
    a[:4] = torch.tensor([-100.0, 100.0, 0.0, -88.5])
    out = bf_empty(n)
    am = torch.empty(2)
    cpu_swiglu_forward_bf16(ptr(out), ptr(am), ptr(a), ptr(g), n)
    record("bf16 swiglu fwd amax", "abs diff vs max|out|", float((am[0] - out.float().abs().max()).abs()), 0)
    af, gf = a.float().requires_grad_(), g.float().requires_grad_()
    yf = F.silu(af) * gf
    check_bf("bf16 swiglu fwd", out, yf.detach())
    t32, a32, g32 = torch.empty(n), a.float(), g.float()
    cpu_swiglu_forward(ptr(t32), ptr(a32), ptr(g32), n)
    check_twin("bf16 swiglu fwd", out, round_bf16(t32))
    dout = bf(n)
    yf.backward(dout.float())
    da, dg = bf_empty(n), bf_empty(n)
    cpu_swiglu_backward_bf16(ptr(da), ptr(dg), ptr(am), ptr(am[1:]), ptr(dout), ptr(a), ptr(g), n)
    record("bf16 swiglu bwd amax", "abs diff vs max|da|, max|dg|",
           float((am[0] - da.float().abs().max()).abs() + (am[1] - dg.float().abs().max()).abs()), 0)
    check_bf("bf16 swiglu bwd da", da, af.grad)
    check_bf("bf16 swiglu bwd dg", dg, gf.grad)
    ta, tg, dout32 = torch.empty(n), torch.empty(n), dout.float()
    cpu_swiglu_backward(ptr(ta), ptr(tg), ptr(dout32), ptr(a32), ptr(g32), n)
    check_twin("bf16 swiglu bwd da", da, round_bf16(ta))
    check_twin("bf16 swiglu bwd dg", dg, round_bf16(tg))
    a2, g2 = a.clone(), g.clone()
    cpu_swiglu_backward_bf16(ptr(a2), ptr(g2), None, None, ptr(dout), ptr(a2), ptr(g2), n)
    bits = lambda t: t.view(torch.int16)  # noqa: E731
    record("bf16 swiglu bwd in-place", "differs from out-of-place",
           float((bits(a2) != bits(da)).sum() + (bits(g2) != bits(dg)).sum()), 0)


def ref_attention_bwd(q, k, v, out, lse, dout, causal, q_off=0, k_off=0, scale=None):
    """The backward as the op defines it, from the GIVEN out and lse (the bf16 forward's
    results), in the dtype of the inputs: P = exp(S - lse) (masked), dS = P (dO V^T -
    rowsum(dO * out)); dq = scale dS K, dk = scale dS^T Q, dv = P^T dO, GQA heads summed."""
    B, Sq, H, D = q.shape
    Sk, KV = k.shape[1], k.shape[2]
    rep = H // KV
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    qh, oh, doh = (t.permute(0, 2, 1, 3) for t in (q, out, dout))
    kh = k.permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)
    vh = v.permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)
    s = (qh @ kh.transpose(-1, -2)) * scale
    p = torch.exp(s - lse[..., None])
    if causal:
        mask = (k_off + torch.arange(Sk))[None, :] > (q_off + torch.arange(Sq))[:, None]
        p = p.masked_fill(mask, 0.0)
    p = p.nan_to_num(0.0)  # rows that see no key (lse = -inf)
    dvr = (doh * oh).sum(-1, keepdim=True)
    ds = p * (doh @ vh.transpose(-1, -2) - dvr)
    dq = (ds @ kh) * scale
    dk = ((ds.transpose(-1, -2) @ qh) * scale).reshape(B, KV, rep, Sk, D).sum(2)
    dv = (p.transpose(-1, -2) @ doh).reshape(B, KV, rep, Sk, D).sum(2)
    return dq.permute(0, 2, 1, 3), dk.permute(0, 2, 1, 3), dv.permute(0, 2, 1, 3)


def test_bf16_attention():
    # (B, Sq, Sk, H, KV, D, causal, q_offset, k_offset): one-call shapes with GQA, causal
    # and full, and ring-attention blocks: partly visible (some query rows see no key),
    # fully visible, and fully masked
    cases = ((2, 130, 130, 8, 2, 32, 1, 0, 0), (1, 200, 200, 4, 4, 64, 1, 0, 0), (2, 70, 70, 4, 1, 16, 0, 0, 0),
             (1, 1, 1, 8, 2, 16, 1, 0, 0), (2, 50, 80, 8, 2, 16, 1, 40, 60), (1, 90, 130, 4, 2, 32, 1, 130, 0),
             (2, 45, 190, 4, 2, 16, 0, 0, 0), (1, 30, 40, 4, 2, 16, 1, 0, 100))
    for (B, Sq, Sk, H, KV, D, causal, qo, ko) in cases:
        q, k, v = bf(B, Sq, H, D), bf(B, Sk, KV, D), bf(B, Sk, KV, D)
        shp = attn_shape(B, Sq, Sk, H, KV, D, causal, qo, ko)
        tag = f"B{B} Sq{Sq} Sk{Sk} H{H} KV{KV} D{D}{' causal' if causal else ' full'}" + \
            (f" off {qo}/{ko}" if qo or ko else "")
        masked = causal and qo + Sq - 1 < ko
        use_ws = (Sq + Sk) % 3 != 0  # some calls let the op allocate its own workspace
        ws = torch.empty(cpu_attention_workspace_size_bf16(ctypes.byref(shp)) // 4 + 16) if use_ws else None
        out, lse = bf_empty(B, Sq, H, D), torch.empty(B, H, Sq)
        cpu_attention_forward_bf16(ptr(out), ptr(lse), ptr(q), ptr(k), ptr(v), ctypes.byref(shp), ptr(ws))
        of, lref = ref_attention(q.float(), k.float(), v.float(), causal, qo, ko)  # torch in fp32
        check_bf(f"bf16 attention fwd {tag}", out, of)
        lsed = ref_attention(q.double(), k.double(), v.double(), causal, qo, ko)[1]
        seen = torch.isfinite(lsed)  # rows that see no key have lse = -inf
        record(f"bf16 attention lse {tag}", "-inf rows differ", float(((lse == float("-inf")) != ~seen).sum()), 0)
        if seen.any():
            check(f"bf16 attention lse {tag}", lse[seen], lsed[seen], 1e-5)
        o32, l32 = attn_fwd(q.float(), k.float(), v.float(), shp)
        check_twin(f"bf16 attention fwd {tag}", out, round_bf16(o32))
        check_twin(f"bf16 attention lse {tag}", lse, l32)

        dout = bf(B, Sq, H, D)
        dq, dk, dv = bf(B, Sq, H, D), bf(B, Sk, KV, D), bf(B, Sk, KV, D)  # garbage: the op WRITES
        cpu_attention_backward_bf16(ptr(dq), ptr(dk), ptr(dv), ptr(dout), ptr(q), ptr(k), ptr(v), ptr(out),
                                    ptr(lse), ctypes.byref(shp), ptr(ws))
        rq, rk, rv = ref_attention_bwd(q.float(), k.float(), v.float(), out.float(), lse, dout.float(), causal, qo, ko)
        for name, got, ref in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
            if masked:
                record(f"bf16 attention bwd {name} {tag}", "nonzero (fully masked)", float((got.float() != 0).sum()), 0)
            elif Sk == 1 and name != "dv":  # softmax over one key is constant: dq = dk = 0 up to rounding noise
                record(f"bf16 attention bwd {name} {tag}", "max abs (exact: 0)", got.float().abs().max().item(), 1e-5)
            else:
                check_bf(f"bf16 attention bwd {name} {tag}", got, ref)
        tq, tk, tv = torch.zeros(B, Sq, H, D), torch.zeros(B, Sk, KV, D), torch.zeros(B, Sk, KV, D)
        attn_bwd(tq, tk, tv, dout.float(), q.float(), k.float(), v.float(), out.float(), lse, shp)
        check_twin(f"bf16 attention bwd dq {tag}", dq, round_bf16(tq))
        check_twin(f"bf16 attention bwd dk {tag}", dk, round_bf16(tk))
        check_twin(f"bf16 attention bwd dv {tag}", dv, round_bf16(tv))
        if not masked:
            # sanity: the same gradients by float64 autograd through the reference forward
            # (which uses the exact, not the bf16-rounded, out): a few bf16 ulps apart
            qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
            ref_attention(qd, kd, vd, causal, qo, ko)[0].backward(dout.double())
            for name, got, ref in (("dq", dq, qd.grad), ("dk", dk, kd.grad), ("dv", dv, vd.grad)):
                if Sk > 1 or name == "dv":
                    check(f"bf16 attention bwd {name} {tag} vs f64 autograd", got.float(), ref, 2e-2, 5e-2)
    # the workspace stays linear in the sequence
    w1 = cpu_attention_workspace_size_bf16(ctypes.byref(attn_shape(1, 4096, 4096, 32, 8, 128, 1)))
    w2 = cpu_attention_workspace_size_bf16(ctypes.byref(attn_shape(1, 8192, 8192, 32, 8, 128, 1)))
    record("bf16 attention workspace S 4096 -> 8192", "growth factor", w2 / w1, 2.01)


def test_bf16_gemm():
    """bf16 A, B with an fp32 or a bf16 C, beta != 0: fp32 accumulation, then (bf16 C)
    alpha AB + beta C rounded once. References in float64 from the exact bf16 values."""
    I16 = torch.int16
    for (m, n, k, ta, tb, alpha, beta) in ((70, 90, 110, 0, 1, 1.0, 0.0), (300, 257, 129, 0, 1, 0.5, 1.0),
                                           (129, 513, 300, 1, 0, 1.0, 1.0), (64, 700, 256, 1, 1, -2.0, 0.25),
                                           (1000, 96, 80, 0, 0, 1.0, 0.5)):
        a = bf(k, m) if ta else bf(m, k)
        b = bf(n, k) if tb else bf(k, n)
        A = a.double().t() if ta else a.double()
        B = b.double().t() if tb else b.double()
        tag = f"{m}x{n}x{k} t{ta}{tb} alpha{alpha:g} beta{beta:g}"
        c0 = f32(m, n)
        c = c0.clone()
        gemm_call(c, a.view(I16), b.view(I16), m, n, k, ta, tb, alpha=alpha, beta=beta, at=BF16, bt=BF16)
        check(f"gemm bf16 in, f32 out {tag}", c, alpha * A @ B + beta * c0.double(), 1e-5)
        cb0 = bf(m, n)
        cb = cb0.clone()
        gemm_call(cb.view(I16), a.view(I16), b.view(I16), m, n, k, ta, tb, alpha=alpha, beta=beta, at=BF16, bt=BF16,
                  ct=BF16)
        check_bf(f"gemm bf16 in, bf16 out {tag}", cb, alpha * A @ B + beta * cb0.double())
    # bf16 C with ldc > n (the padding is not touched) and beta = 0 over NaN (C not read)
    m, n, k = 50, 40, 30
    a, b = bf(m, k), bf(k, n)
    cb = torch.full((m, n + 6), float("nan")).bfloat16()
    gemm_call(cb.view(I16), a.view(I16), b.view(I16), m, n, k, ldc=n + 6, at=BF16, bt=BF16, ct=BF16)
    check_bf("gemm bf16 out, ldc > n, beta=0 over NaN", cb[:, :n].contiguous(), a.double() @ b.double())
    record("gemm bf16 out, ldc > n", "pad touched", float((~torch.isnan(cb[:, n:].float())).sum()), 0)
    # batched
    bs, m, n, k = 3, 20, 24, 18
    a, b, cb0 = bf(bs, m, k), bf(bs, k, n), bf(bs, m, n)
    cb = cb0.clone()
    gemm_call(cb.view(I16), a.view(I16), b.view(I16), m, n, k, beta=1.0, at=BF16, bt=BF16, ct=BF16, batch=bs,
              sa=m * k, sb=k * n, sc=m * n)
    check_bf("gemm bf16 out batched, beta=1", cb, a.double() @ b.double() + cb0.double())
    # fp8 rowwise scales into a bf16 C with beta (the per-row/column epilogue)
    m, n, k = 48, 80, 96
    x = rng.standard_normal((m, k)).astype(np.float32) * 3
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    sa = (448.0 / np.abs(x).max(1)).astype(np.float32)
    sb = (448.0 / np.abs(w).max(1)).astype(np.float32)
    qa, qb = np.empty((m, k), dtype=np.uint8), np.empty((n, k), dtype=np.uint8)
    cpu_cast_f32_to_fp8(ptr(qa), ptr(x), ptr(sa), 1, m, k, E4M3)
    cpu_cast_f32_to_fp8(ptr(qb), ptr(w), ptr(sb), 1, n, k, E4M3)
    ia, ib = (1.0 / sa).astype(np.float32), (1.0 / sb).astype(np.float32)
    cb0 = bf(m, n)
    cb = cb0.clone()
    gemm_call(cb.view(I16), qa, qb, m, n, k, tb=1, beta=0.5, at=E4M3, bt=E4M3, ct=BF16, a_scale=ia, b_scale=ib,
              rowwise=1)
    Aq = np2t(fp8_table(E4M3)[qa]) * np2t(ia.astype(np.float64)).reshape(-1, 1)
    Bq = np2t(fp8_table(E4M3)[qb]) * np2t(ib.astype(np.float64)).reshape(-1, 1)
    check_bf("gemm fp8 e4m3 rowwise, bf16 out, beta=0.5", cb, Aq @ Bq.t() + 0.5 * cb0.double())


# ----------------------------------------------------------------------------


def test_select():
    err = ctypes.create_string_buffer(256)
    record("ops_get cpu", "NULL", 0 if ops_get(b"cpu", err, 256) else 1, 0)
    record("ops_get auto", "NULL", 0 if ops_get(b"auto", err, 256) else 1, 0)
    record("ops_get bogus", "accepted", 1 if ops_get(b"tpu", err, 256) else 0, 0)
    record("ops_get bogus", "no message", 0 if err.value else 1, 0)


def main():
    t0 = time.time()
    tests = [test_select, test_elementwise, test_casts, test_gemm, test_embedding, test_rmsnorm, test_rope,
             test_swiglu, test_attention, test_ring_attention, test_cross_entropy, test_cross_entropy_sharded,
             test_adamw, test_bf16_embedding, test_bf16_rmsnorm, test_bf16_rope, test_bf16_swiglu,
             test_bf16_attention, test_bf16_gemm]
    for t in tests:
        t1 = time.time()
        t()
        print(f"  {t.__name__:32s} {time.time() - t1:6.2f} s")
    w = max(len(r[0]) for r in RESULTS)
    print(f"\n{'op':{w}s}  {'metric':26s} {'value':>11s} {'tol':>9s}")
    nfail = 0
    for op, metric, val, tol, ok in RESULTS:
        nfail += not ok
        print(f"{op:{w}s}  {metric:26s} {val:11.3e} {tol:9.1e}  {'ok' if ok else 'FAIL'}")
    print(f"\n{len(RESULTS) - nfail}/{len(RESULTS)} checks passed in {time.time() - t0:.1f} s (seed {SEED})")
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
