#!/usr/bin/env python3
"""The Float8 linear's three GEMMs for every recipe against a numpy + ml_dtypes reference.

Loads $TETRA_BUILD/lib/libtetra.so and runs float8_capi_linear (float8/float8_capi.c):
one linear on the CPU backend, as the trainer runs it. The reference follows torchao's
recipes (parallelism reference §5): scale = fp8_max / max(amax, 1e-12) in float64 stored
fp32 (power of 2 for the rowwise recipes), q = ml_dtypes cast of clamp(x * scale), the
GEMM on q with the dequant factors 1/scale:

  tensorwise          y: x e4m3 . W e4m3        dx: dy e5m2 . W e4m3     dW: dy e5m2 . x e4m3
  rowwise             every operand e4m3, one scale per row of the non-contracted dim
  rowwise_with_gw_hp  y as rowwise; dx: dy per token . W tensorwise; dW in fp32

Both GEMM modes are checked: the fp8 GEMM (products of the decoded values, fp32
accumulation, scales on the sum) and emulate (operands dequantised to fp32 first).
Each output element must be within fp32 accumulation error of the reference; a wrong
format, scale, rounding or axis moves some element by a whole fp8 step (>= 1/16 of
a term), far outside that bound.
"""
import ctypes
import os
import sys

import numpy as np

try:
    import ml_dtypes
except Exception as e:  # the test's reference: required
    print(f"FAIL ml_dtypes is needed (pip install ml_dtypes; scripts/setup.sh --tests): {e}")
    sys.exit(1)

ROOT = os.environ.get("TETRA_ROOT", os.getcwd())
BUILD = os.environ.get("TETRA_BUILD", os.path.join(ROOT, "build"))
lib = ctypes.CDLL(os.path.join(BUILD, "lib", "libtetra.so"))
P = ctypes.c_void_p
fn = lib.float8_capi_linear
fn.restype = ctypes.c_int
fn.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, P, P, P, P, P, P,
               ctypes.c_char_p, ctypes.c_size_t]

E4, E5 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
MAX = {E4: 448.0, E5: 57344.0}
fails = 0
checks = 0


def ptr(a):
    return a.ctypes.data_as(P)


def scales(amax, fmt, pow2):
    """scale and dequant factor per entry of amax (float64 division, fp32 storage)."""
    s = (MAX[fmt] / np.maximum(np.asarray(amax, dtype=np.float64), 1e-12)).astype(np.float32)
    if pow2:
        s = np.exp2(np.floor(np.log2(s))).astype(np.float32)
    return s, (np.float32(1.0) / s).astype(np.float32)


def quant(x, s, fmt):
    """q = cast(clamp(x * s)) with x * s in fp32 (s broadcast per row when a column)."""
    y = (x.astype(np.float32) * s).astype(np.float32)
    y = np.clip(y, -MAX[fmt], MAX[fmt])
    return y.astype(fmt)


def tensorwise(x, fmt, pow2=False):
    s, inv = scales(np.abs(x).max(), fmt, pow2)
    return quant(x, s, fmt), inv


def rowwise(x, fmt=E4):
    """one power-of-2 scale per row; returns q [rows, cols], inv [rows, 1]"""
    s, inv = scales(np.abs(x).max(axis=1), fmt, True)
    return quant(x, s[:, None], fmt), inv[:, None]


def gemm(qa, ia, qb, ib, emulate):
    """op(A)[m, k] . op(B)^T where qb is stored [n, k]; ia [m, 1] or scalar, ib [n, 1] or scalar."""
    a = qa.astype(np.float64)
    b = qb.astype(np.float64)
    if emulate:  # dequantise in fp32, then multiply
        a = (qa.astype(np.float32) * np.asarray(ia, np.float32)).astype(np.float64)
        b = (qb.astype(np.float32) * np.asarray(ib, np.float32)).astype(np.float64)
        return a @ b.T, np.abs(a) @ np.abs(b).T
    sa = np.asarray(ia, np.float64).reshape(-1, 1) if np.ndim(ia) else np.float64(ia)
    sb = np.asarray(ib, np.float64).reshape(1, -1) if np.ndim(ib) else np.float64(ib)
    return (a @ b.T) * sa * sb, (np.abs(a) @ np.abs(b).T) * np.abs(sa) * np.abs(sb)


def reference(recipe, emulate, x, w, dy):
    if recipe == "tensorwise":
        qx, ix = tensorwise(x, E4)
        qw, iw = tensorwise(w, E4)
        qd5, id5 = tensorwise(dy, E5)
        y = gemm(qx, ix, qw, iw, emulate)
        dx = gemm(qd5, id5, qw.T.copy(), iw, emulate)
        dw = gemm(qd5.T.copy(), id5, qx.T.copy(), ix, emulate)
        return y, dx, dw
    qx, ix = rowwise(x)
    qw, iw = rowwise(w)
    y = gemm(qx, ix, qw, iw, emulate)
    qd, idy = rowwise(dy)
    if recipe == "rowwise":
        qwt, iwt = rowwise(w.T.copy())
        dx = gemm(qd, idy, qwt, iwt, emulate)
        qdt, idt = rowwise(dy.T.copy())
        qxt, ixt = rowwise(x.T.copy())
        dw = gemm(qdt, idt, qxt, ixt, emulate)
    else:  # rowwise_with_gw_hp
        qwt, iwt = tensorwise(w, E4, pow2=True)
        dx = gemm(qd, idy, qwt.T.copy(), iwt, emulate)
        d64, x64 = dy.astype(np.float64), x.astype(np.float64)
        dw = (d64.T @ x64, np.abs(d64).T @ np.abs(x64))
    return y, dx, dw


def check(name, got, ref_and_mag, k):
    global fails, checks
    ref, mag = ref_and_mag
    # fp32 accumulation of k terms plus the scaling: well inside one fp8 step of any term
    bound = 4.0 * (k + 2) * 2.0 ** -24 * mag + 1e-30
    err = np.abs(got.astype(np.float64) - ref)
    worst = float((err / bound).max())
    checks += 1
    ok = worst <= 1.0 and np.isfinite(got).all()
    if not ok:
        fails += 1
    print(f"{'ok  ' if ok else 'FAIL'} {name}: max err / bound {worst:.3g} (max abs err {err.max():.3g})")


def run(recipe, emulate, n, d_in, d_out, rng, outliers):
    x = rng.standard_normal((n, d_in)).astype(np.float32)
    w = (rng.standard_normal((d_out, d_in)) * 0.05).astype(np.float32)
    dy = (rng.standard_normal((n, d_out)) * 1e-3).astype(np.float32)
    if outliers:  # rows and channels of very different magnitude: per-row scales matter
        x[1] *= 300.0
        x[:, 3] *= 1e-3
        w[2] *= 40.0
        dy[0] *= 1e4
        dy[:, 1] *= 1e-4
    y = np.empty((n, d_out), np.float32)
    dx = np.empty((n, d_in), np.float32)
    dw = np.empty((d_out, d_in), np.float32)
    err = ctypes.create_string_buffer(512)
    rc = fn(recipe.encode(), emulate, n, d_in, d_out, ptr(x), ptr(w), ptr(dy), ptr(y), ptr(dx), ptr(dw), err, 512)
    tag = f"{recipe} {'emulate' if emulate else 'fp8 gemm'} n={n} in={d_in} out={d_out}{' outliers' if outliers else ''}"
    if rc != 0:
        global fails
        fails += 1
        print(f"FAIL {tag}: {err.value.decode()}")
        return
    ry, rdx, rdw = reference(recipe, emulate, x, w, dy)
    check(f"{tag} output", y, ry, d_in)
    check(f"{tag} grad_input", dx, rdx, d_out)
    check(f"{tag} grad_weight", dw, rdw, n)


def main():
    seed = int(os.environ.get("TETRA_SEED", "1234"))
    rng = np.random.default_rng(seed)
    print(f"seed {seed}")
    for recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
        for emulate in (0, 1):
            run(recipe, emulate, 48, 64, 32, rng, False)
            run(recipe, emulate, 40, 128, 96, rng, True)
    # a linear whose dims do not divide by 16 is left in high precision (not converted)
    err = ctypes.create_string_buffer(512)
    z = np.zeros(24 * 24, np.float32)
    rc = fn(b"tensorwise", 0, 8, 24, 24, ptr(z), ptr(z), ptr(z), None, None, None, err, 512)
    global fails, checks
    checks += 1
    if rc == 0 or b"divide by 16" not in err.value:
        fails += 1
        print(f"FAIL a 24 x 24 linear was converted ({err.value.decode()})")
    else:
        print(f"ok   24 x 24 stays high precision: {err.value.decode()}")
    print(f"test_float8: {checks - fails}/{checks} checks passed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
