"""tetra's CPU backend against the newest PyTorch 2.x from PyPI: same Llama 3 model,
batch, weights and thread count, measured one after the other in one run.

A step is forward + backward + gradient clipping + AdamW. tetra runs its trainer's own
step through the C API (libtetra.so: trainer_capi_*, the `tetra train` step fed this
batch). PyTorch runs tests/py/llama3_ref.py (a plain Llama 3 on the same safetensors
weights) with fused AdamW, in each of its modes:

  fp32   eager             the reference as written (matmul, masked softmax)
         eager+sdpa        attention through F.scaled_dot_product_attention
         compile           the forward and loss under torch.compile (inductor)
         compile+sdpa      both
  bf16   autocast+sdpa     torch.autocast("cpu", bfloat16), fp32 master weights
         autocast+compile+sdpa

tetra runs fp32, and bf16 mixed precision (training.mixed_precision_param = bfloat16:
bf16 compute copies and activations, fp32 master weights, gradients and AdamW), the
counterpart of autocast. Reported: the median step time after warm-up, tokens/s,
TFLOP/s and MFU against the GEMM peak measured here for that dtype with the same
threads (the faster of torch.mm and tetra's own GEMM at 2048^3; a CPU has no vendor
table), and tetra's ratio to the best PyTorch mode of its dtype.

Each framework and mode runs in a process of its own (this script re-invoked with
--worker), so none inherits another's thread pools, BLAS settings or compiled graphs.
The tetra worker never imports torch: PyPI's torch carries its own OpenMP runtime.

The processes of one dtype are alive side by side and take turns: each is set up and
warmed up on its own, then every measured step runs one step of each, the order rotating
from step to step, with a pause between them (so no process's idle OpenMP threads still
spin while the next one runs). A shared host's speed moves by tens of percent within
minutes, and steps taken next to each other see more nearly the same host than runs
minutes apart: so the bench also prints the ratio of each tetra step to the step of
PyTorch's best mode in the same turn (the paired ratios: median, quartiles, range).
"""

import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES = {
    "a": dict(flavor="debugmodel", seq_len=512, batch=4, turns=15),
    "b": dict(flavor="debugmodel", seq_len=2048, batch=8, turns=5),
}
MODES = {  # name: (dtype, sdpa, compile)
    "eager": ("fp32", False, False),
    "eager+sdpa": ("fp32", True, False),
    "compile": ("fp32", False, True),
    "compile+sdpa": ("fp32", True, True),
    "autocast+sdpa": ("bf16", True, False),
    "autocast+compile+sdpa": ("bf16", True, True),
}

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--case", choices=sorted(CASES), action="append", help="case(s) to run (default: all)")
ap.add_argument("--mode", choices=list(MODES), action="append", help="PyTorch mode(s) (default: all)")
ap.add_argument("--dtype", choices=["fp32", "bf16"], action="append",
                help="dtype(s) to run (default: fp32, and bf16 where the CPU has AVX512-BF16)")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--steps", type=int,
                help="measured steps per framework and mode, i.e. turns (default: 15 at case a, 5 at case b, "
                     "whose steps take seconds)")
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
ap.add_argument("--rounds", type=int, default=1,
                help="repeat each case this many times with fresh processes (steps of all rounds are pooled)")
ap.add_argument("--worker", choices=["peak", "peak-tetra", "tetra", "pytorch"], help=argparse.SUPPRESS)
ap.add_argument("--weights", help=argparse.SUPPRESS)
args = ap.parse_args()

# Thread counts must be fixed before any library starts its pools.
os.environ["OMP_NUM_THREADS"] = str(args.threads)
os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))

LR, BETAS, EPS, WD, MAX_NORM = 8e-4, (0.9, 0.95), 1e-8, 0.1, 1.0
DEBUG = dict(dim=256, n_layers=6, n_heads=16, n_kv_heads=16, vocab_size=2048, ffn_hidden=768)


def flops_per_token(seq_len, causal=False):
    """TorchTitan's count, 6 (N - N_embedding) + 6 L H (2 head_dim) T, which charges the
    whole S x S score matrix; causal=True counts only the half causal attention computes."""
    c = DEBUG
    d, f, v, hd = c["dim"], c["ffn_hidden"], c["vocab_size"], c["dim"] // c["n_heads"]
    block = d * c["n_heads"] * hd * 2 + 2 * d * c["n_kv_heads"] * hd + 3 * d * f + 2 * d
    n = v * d + c["n_layers"] * block + d + v * d
    attn = 6 * c["n_layers"] * c["n_heads"] * 2 * hd * seq_len
    return 6 * (n - v * d) + (attn / 2 if causal else attn)


def make_batch(b, t):
    """The same token ids for every worker (numpy, so the tetra worker needs no torch)."""
    rng = np.random.default_rng(1234)
    inputs = rng.integers(0, DEBUG["vocab_size"], (b, t), dtype=np.int32)
    targets = rng.integers(0, DEBUG["vocab_size"], (b, t), dtype=np.int32)
    return inputs, targets


def serve(step, info):
    """A worker's measured part: reports `info` (it is warmed up), then runs and times one
    step per "step" line on stdin until stdin closes."""
    print(json.dumps(dict(info, ready=True)), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        t0 = time.perf_counter()
        step()
        print(json.dumps(dict(t=time.perf_counter() - t0)), flush=True)


def worker_peak():
    """Best torch.mm rate per dtype with these threads at 2048^3: best of 8, or of what fits
    in 20 s (bf16 on a CPU without AVX512-BF16 runs about 100x slower than fp32)."""
    import torch

    torch.set_num_threads(args.threads)
    n, out = 2048, {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.rand(n, n).to(dt), torch.rand(n, n).to(dt)
        best, spent = math.inf, 0.0
        for _ in range(8):
            t0 = time.perf_counter()
            torch.mm(a, b)
            t = time.perf_counter() - t0
            best, spent = min(best, t), spent + t
            if spent > 20:
                break
        out[name] = 2 * n ** 3 / best
    out["torch"] = torch.__version__
    print(json.dumps(out))


def load_tetra():
    return ctypes.CDLL(os.path.join(os.environ.get("TETRA_BUILD", os.path.join(ROOT, "build")), "lib", "libtetra.so"))


def worker_peak_tetra():
    """Best rate of tetra's own GEMM (the backend's cpu_gemm, as the step calls it) per
    dtype at 2048^3, best of 8: bf16 runs oneDNN's AVX512-BF16/AMX kernels where the CPU
    has them, else the widened sgemm."""
    lib = load_tetra()
    c_int, c_float, c_void = ctypes.c_int, ctypes.c_float, ctypes.c_void_p

    class GemmDesc(ctypes.Structure):  # kernels/ops.h ops_gemm_desc
        _fields_ = [("a_type", c_int), ("b_type", c_int), ("c_type", c_int), ("trans_a", c_int),
                    ("trans_b", c_int), ("m", c_int), ("n", c_int), ("k", c_int), ("lda", c_int), ("ldb", c_int),
                    ("ldc", c_int), ("alpha", c_float), ("beta", c_float), ("a_scale", c_void),
                    ("b_scale", c_void), ("scale_rowwise", c_int), ("fast_accum", c_int), ("batch", c_int),
                    ("stride_a", ctypes.c_int64), ("stride_b", ctypes.c_int64), ("stride_c", ctypes.c_int64)]

    lib.cpu_gemm.argtypes = [c_void, c_void, c_void, ctypes.POINTER(GemmDesc)]
    lib.cpu_gemm_bf16_onednn.argtypes, lib.cpu_gemm_bf16_onednn.restype = [c_int], c_int
    lib.omp_set_num_threads.argtypes = [c_int]
    lib.omp_set_num_threads(args.threads)
    n, out = 2048, {}
    rng = np.random.default_rng(1)
    for name, code in (("fp32", 0), ("bf16", 1)):  # TETRA_F32, TETRA_BF16
        x = rng.random((n, n), dtype=np.float32)
        if code:  # bf16 bits: the upper halves of fp32
            x = (x.view(np.uint32) >> 16).astype(np.uint16)
        y = x.copy()
        c = np.zeros((n, n), dtype=np.float32)
        g = GemmDesc(code, code, 0, 0, 0, n, n, n, n, n, n, 1.0, 0.0, None, None, 0, 0, 0, 0, 0, 0)
        best = math.inf
        for _ in range(8):
            t0 = time.perf_counter()
            lib.cpu_gemm(c.ctypes.data, x.ctypes.data, y.ctypes.data, ctypes.byref(g))
            best = min(best, time.perf_counter() - t0)
        out[name] = 2 * n ** 3 / best
    out["bf16_route"] = "oneDNN" if lib.cpu_gemm_bf16_onednn(-1) else "widened to fp32"
    print(json.dumps(out))


def worker_tetra(spec, dtype, weights_out):
    """Times tetra's step; saves its initial weights for the PyTorch workers."""
    lib = load_tetra()

    def sig(name, restype, *argtypes):
        f = getattr(lib, name)
        f.restype, f.argtypes = restype, list(argtypes)
        return f

    c_void, c_size = ctypes.c_void_p, ctypes.c_size_t
    trainer_create = sig("trainer_capi_create", c_void, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p),
                         ctypes.c_char_p, c_size)
    trainer_free = sig("trainer_capi_free", None, c_void)
    trainer_step = sig("trainer_capi_step", ctypes.c_double, c_void, c_void, c_void,
                       ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_double))
    trainer_save = sig("trainer_capi_save_hf", ctypes.c_int, c_void, ctypes.c_char_p, ctypes.c_char_p, c_size)
    b, t = spec["batch"], spec["seq_len"]
    inputs, targets = make_batch(b, t)
    err = ctypes.create_string_buffer(2048)
    # a constant learning rate (no warm-up or decay), as the PyTorch side
    argv = ["train", "--model.flavor", spec["flavor"], "--training.device", "cpu", "--training.seed", "42",
            "--training.seq_len", str(t), "--training.local_batch_size", str(b), "--training.global_batch_size",
            str(b), "--training.steps", "1000000", "--training.threads", str(args.threads),
            "--training.mixed_precision_param", "bfloat16" if dtype == "bf16" else "float32",
            "--training.max_norm", str(MAX_NORM), "--optimizer.lr", str(LR), "--optimizer.beta1", str(BETAS[0]),
            "--optimizer.beta2", str(BETAS[1]), "--optimizer.eps", str(EPS), "--optimizer.weight_decay", str(WD),
            "--lr_scheduler.warmup_steps", "0", "--lr_scheduler.decay_ratio", "0",
            "--activation_checkpoint.mode", "none"]  # PyTorch keeps every activation too
    arr = (ctypes.c_char_p * len(argv))(*[a.encode() for a in argv])
    h = trainer_create(len(argv), arr, err, 2048)
    if not h:
        raise SystemExit(f"tetra: {err.value.decode()}")
    if weights_out and trainer_save(h, weights_out.encode(), err, 2048) != 0:
        raise SystemExit(f"tetra: {err.value.decode()}")
    losses = []
    gn, lr = ctypes.c_double(), ctypes.c_double()

    def step():
        losses.append(trainer_step(h, inputs.ctypes.data, targets.ctypes.data, ctypes.byref(gn), ctypes.byref(lr)))

    for _ in range(max(args.warmup, 1)):
        step()
    serve(step, dict(loss0=losses[0]))
    trainer_free(h)


def worker_pytorch(spec, mode, weights):
    import torch
    import torch.nn.functional as F

    import llama3_ref as ref

    torch.set_num_threads(args.threads)
    dtype, sdpa, compiled = MODES[mode]
    cfg = ref.Config(**DEBUG)
    b, t = spec["batch"], spec["seq_len"]
    inputs, targets = (torch.from_numpy(x).long() for x in make_batch(b, t))
    model = ref.Llama3.from_safetensors(cfg, weights)
    if sdpa:
        ref.attention = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif b * cfg.n_heads * t * t * 4 * cfg.n_layers > 4 << 30:
        # Eager attention keeps B*H*S*S probabilities per layer for backward: at S = 2048,
        # B = 8 that is 2 GiB a layer. Recompute them in backward, as flash attention does.
        import torch.utils.checkpoint

        plain = ref.attention
        ref.attention = lambda q, k, v: torch.utils.checkpoint.checkpoint(plain, q, k, v, use_reentrant=False)
    n_valid = int(targets.numel())

    def fwd_loss(x, y):
        logits = model.forward(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), reduction="sum") / n_valid

    if compiled:
        fwd_loss = torch.compile(fwd_loss)
    params = model.parameters()
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)
    losses = []

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = fwd_loss(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
        opt.step()
        losses.append(loss.item())

    t0 = time.perf_counter()
    step()  # the first step compiles; it is not a measured one
    first = time.perf_counter() - t0
    for _ in range(max(args.warmup - 1, 0)):
        step()
    serve(step, dict(loss0=losses[0], first=first, torch=torch.__version__))


def worker_cmd(kind, case=None, extra=()):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--threads", str(args.threads),
           "--warmup", str(args.warmup), *extra]
    return cmd + ["--case", case] if case else cmd


def run_worker(kind, case=None, extra=()):
    """A one-shot worker (the GEMM peaks): its last line of output."""
    out = subprocess.run(worker_cmd(kind, case, extra), check=True, stdout=subprocess.PIPE,
                         text=True).stdout.strip().splitlines()
    return json.loads(out[-1])


class Stepper:
    """A framework or mode in its own process, set up and warmed up, timing one step when
    asked (serve() on the other end)."""

    def __init__(self, name, kind, case, extra):
        self.name = name
        self.p = subprocess.Popen(worker_cmd(kind, case, extra), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        self.info = self.read()

    def read(self):
        for line in self.p.stdout:  # a library may print to stdout too: take the first JSON object
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    pass
        raise SystemExit(f"bench: the {self.name} worker exited with status {self.p.wait()}")

    def step(self):
        self.p.stdin.write("step\n")
        self.p.stdin.flush()
        return self.read()["t"]

    def close(self):
        self.p.stdin.close()
        if self.p.wait() != 0:
            raise SystemExit(f"bench: the {self.name} worker exited with status {self.p.returncode}")


def run_side_by_side(steppers, steps, times):
    """steps turns; each turn times one step of every stepper, the order rotated by one each
    turn. A pause before each step lets the previous process's OpenMP threads stop spinning
    (libgomp spins up to some tens of ms after a parallel region before it sleeps)."""
    for s in range(steps):
        k = s % len(steppers)
        for st in steppers[k:] + steppers[:k]:
            time.sleep(0.1)
            times.setdefault(st.name, []).append(st.step())


def quartiles(xs):
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return q[0], q[1], q[2]


def cpu_has_bf16():
    """AVX512-BF16 (or AMX-BF16): where both frameworks multiply bf16 natively."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def case_modes(name, modes, notes):
    """The modes a case runs. Left to the defaults, case b runs only the SDPA modes: without
    SDPA PyTorch materialises every layer's 8 x 16 x 2048^2 scores (2 GiB, recomputed under
    activation checkpointing to fit) and a step takes minutes, always slower than with it."""
    if args.mode or CASES[name]["seq_len"] < 2048:
        return modes
    skip = [m for m in modes if not MODES[m][1]]
    if skip:
        notes.append(f"case {name}: {', '.join(skip)} not run (minutes a step without SDPA; --mode runs them)")
    return [m for m in modes if MODES[m][1]]


def main():
    if args.worker == "peak":
        return worker_peak()
    if args.worker == "peak-tetra":
        return worker_peak_tetra()
    if args.worker:
        spec = CASES[args.case[0]]
        if args.worker == "tetra":
            return worker_tetra(spec, args.dtype[0], args.weights)
        return worker_pytorch(spec, args.mode[0], args.weights)
    pre = []
    dtypes = args.dtype or ["fp32"] + (["bf16"] if cpu_has_bf16() else [])
    if not args.dtype and "bf16" not in dtypes:
        pre.append("bf16 not run: this CPU has no AVX512-BF16, so PyTorch's bf16 matmul falls back to a "
                   "scalar loop (see the bf16 peak above) and an autocast step takes minutes; --dtype bf16 "
                   "runs it anyway")
    modes = [m for m in (args.mode or MODES) if MODES[m][0] in dtypes]
    pt, te_peak = run_worker("peak"), run_worker("peak-tetra")
    peak = {d: max(pt[d], te_peak[d]) for d in ("fp32", "bf16")}
    rounds = f"; {args.rounds} rounds of fresh processes" if args.rounds > 1 else ""
    turns = args.steps or "/".join(f"{CASES[c]['turns']} (case {c})" for c in args.case or sorted(CASES))
    print(f"threads {args.threads}; torch {pt['torch']} (PyPI); {turns} measured steps each after {args.warmup} "
          f"warm-up, each framework and mode in its own process, the processes of a dtype taking turns step by "
          f"step{rounds}; step times are medians")
    print(f"GEMM peak at 2048^3 (best of torch.mm and tetra's gemm, used for MFU): fp32 {peak['fp32'] / 1e9:.1f} "
          f"GFLOP/s (torch {pt['fp32'] / 1e9:.1f}, tetra {te_peak['fp32'] / 1e9:.1f}); bf16 {peak['bf16'] / 1e9:.1f} "
          f"GFLOP/s (torch {pt['bf16'] / 1e9:.1f}, tetra {te_peak['bf16'] / 1e9:.1f}, {te_peak['bf16_route']})")
    for p in pre:
        print(p)
    rows, notes = [], []
    for name in args.case or sorted(CASES):
        spec = CASES[name]
        b, t = spec["batch"], spec["seq_len"]
        fpt = flops_per_token(t)
        with tempfile.TemporaryDirectory(prefix="tetra-bench-") as tmp:
            wpath = os.path.join(tmp, "model.safetensors")
            times, infos = {}, {}  # (framework, dtype or mode) -> every step's time; its first worker's report
            run_modes = case_modes(name, modes, notes)
            for rnd in range(max(args.rounds, 1)):
                for i, dt in enumerate(dtypes):
                    # tetra starts first: its first worker writes the weights PyTorch loads
                    w = ["--weights", wpath] if i == 0 and rnd == 0 else []
                    group = [Stepper(("tetra", dt), "tetra", name, ["--dtype", dt] + w)]
                    group += [Stepper(("pytorch", m), "pytorch", name, ["--mode", m, "--weights", wpath])
                              for m in run_modes if MODES[m][0] == dt]
                    try:
                        run_side_by_side(group, args.steps or spec["turns"], times)
                    finally:
                        for st in group:
                            infos.setdefault(st.name, st.info)
                            st.close()
            res = {k: dict(infos[k], step=statistics.median(v), times=v) for k, v in times.items()}
        ran = [m for m in modes if ("pytorch", m) in res]
        for dt in dtypes:
            te = res[("tetra", dt)]
            best = min((res[("pytorch", m)]["step"], m) for m in ran if MODES[m][0] == dt) if any(
                MODES[m][0] == dt for m in ran) else None
            entries = [("tetra", dt, te)] + [(f"PyTorch {m}", dt, res[("pytorch", m)]) for m in ran
                                              if MODES[m][0] == dt]
            for fw, d, r in entries:
                tps = b * t / r["step"]
                ratio = f"{r['step'] / te['step']:.2f}x" if fw != "tetra" else ""
                if fw == "tetra" and best:
                    ratio = f"{best[0] / te['step']:.2f}x best"
                rows.append([name, f"{t} x {b}", d, fw, f"{r['step']:.3f}", f"{tps:,.0f}",
                             f"{tps * fpt / 1e12:.3f}", f"{100 * tps * fpt / peak[d]:.1f}%", ratio])
                tol = 1e-4 if d == "fp32" else 2e-2
                if fw != "tetra" and abs(r["loss0"] - te["loss0"]) > tol * abs(te["loss0"]):
                    notes.append(f"warning: case {name} {fw} {d}: first-step loss {r['loss0']:.6f} vs tetra "
                                 f"{te['loss0']:.6f}")
            if best:
                notes.append(f"case {name} {dt}: tetra is {best[0] / te['step']:.2f}x PyTorch's best {dt} mode "
                             f"({best[1]})")
                # each tetra step against the step of the best mode beside it (the same turn)
                tt, bt = te["times"], res[("pytorch", best[1])]["times"]
                rr = [b_ / t_ for b_, t_ in zip(bt, tt)]
                q1, q2, q3 = quartiles(rr)
                notes.append(f"case {name} {dt}: paired steps ({best[1]} over the tetra step beside it): median "
                             f"{q2:.2f}x, quartiles {q1:.2f}x-{q3:.2f}x, {min(rr):.2f}x-{max(rr):.2f}x over "
                             f"{len(rr)} pairs (tetra {min(tt):.3f}-{max(tt):.3f} s, {best[1]} "
                             f"{min(bt):.3f}-{max(bt):.3f} s)")
        comp = [f"{m} {res[('pytorch', m)]['first']:.0f} s" for m in ran if MODES[m][2]]
        if comp:
            notes.append(f"case {name}: first (compiling) PyTorch step: " + ", ".join(comp))
        notes.append(f"case {name}: FLOPs per token {flops_per_token(t):,.0f} (TorchTitan's count, used above); "
                     f"{flops_per_token(t, causal=True):,.0f} counting only the causal half of attention")
    hdr = ["case", "seq x batch", "dtype", "framework", "step (s)", "tokens/s", "TFLOP/s", "MFU", "tetra speed-up"]
    if args.markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(hdr)]
        print("  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)))
        for r in rows:
            print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
    for n in notes:
        print(n)


main()
