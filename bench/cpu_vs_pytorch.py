"""tetra's CPU backend vs PyTorch eager: same Llama 3 model, batch, weights and
thread count, fp32, measured one after the other in one process.

A step is forward + backward + gradient clipping + AdamW. tetra runs its trainer's
own step through the C API (libtetra.so: trainer_capi_*, the `tetra train` step fed
this batch); PyTorch runs tests/py/llama3_ref.py, a plain eager Llama 3, with
torch.optim.AdamW. Reported: median step time after warm-up, tokens/s,
TFLOP/s and MFU with TorchTitan's FLOPs-per-token count, against the best
fp32 GEMM rate measured here with the same threads (the peak this machine can
reach, since no vendor table applies to a CPU).

Each framework runs in a process of its own (this script re-invoked with
--worker), so neither inherits the other's thread pools or BLAS settings.
"""

import argparse
import ctypes
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES = {
    "a": dict(flavor="debugmodel", seq_len=512, batch=4),
    "b": dict(flavor="debugmodel", seq_len=2048, batch=8),
}

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--case", choices=sorted(CASES), action="append", help="case(s) to run (default: all)")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--steps", type=int, default=5, help="measured steps per framework")
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
ap.add_argument("--worker", choices=["peak", "tetra", "pytorch"], help=argparse.SUPPRESS)
ap.add_argument("--weights", help=argparse.SUPPRESS)
args = ap.parse_args()

# Thread counts must be fixed before either library starts its pools.
os.environ["OMP_NUM_THREADS"] = str(args.threads)
os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)

import torch  # noqa: E402
import torch.utils.checkpoint  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
import llama3_ref as ref  # noqa: E402

torch.set_num_threads(args.threads)
lib = ctypes.CDLL(os.path.join(os.environ.get("TETRA_BUILD", os.path.join(ROOT, "build")), "lib", "libtetra.so"))


def sig(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


c_void, c_size = ctypes.c_void_p, ctypes.c_size_t
trainer_create = sig("trainer_capi_create", c_void, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), ctypes.c_char_p,
                     c_size)
trainer_free = sig("trainer_capi_free", None, c_void)
trainer_step = sig("trainer_capi_step", ctypes.c_double, c_void, c_void, c_void, ctypes.POINTER(ctypes.c_double),
                   ctypes.POINTER(ctypes.c_double))
trainer_save = sig("trainer_capi_save_hf", ctypes.c_int, c_void, ctypes.c_char_p, ctypes.c_char_p, c_size)
lib.openblas_set_num_threads.argtypes = [ctypes.c_int]
lib.openblas_set_num_threads(args.threads)

LR, BETAS, EPS, WD, MAX_NORM = 8e-4, (0.9, 0.95), 1e-8, 0.1, 1.0
DEBUG = dict(dim=256, n_layers=6, n_heads=16, n_kv_heads=16, vocab_size=2048, ffn_hidden=768)


def flops_per_token(cfg, seq_len):
    """TorchTitan: 6 (N - N_embedding) + 6 L H (2 head_dim) T."""
    d, f, v = cfg.dim, cfg.ffn_hidden, cfg.vocab_size
    hd = cfg.head_dim
    block = d * cfg.n_heads * hd * 2 + 2 * d * cfg.n_kv_heads * hd + 3 * d * f + 2 * d
    n = v * d + cfg.n_layers * block + d + v * d
    return 6 * (n - v * d) + 6 * cfg.n_layers * cfg.n_heads * 2 * hd * seq_len


def measure_peak():
    """Best fp32 GEMM rate with these threads (torch.mm on Debian's BLAS, the one both sides use)."""
    n = 2048
    a, b = torch.rand(n, n), torch.rand(n, n)
    best = math.inf
    for _ in range(6):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def time_steps(step, warmup, steps):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


_plain_attention = ref.attention


def checkpointed_attention(q, k, v):
    """The reference attention with its S x S probabilities recomputed in backward
    (torch.utils.checkpoint), which is what flash attention does too."""
    return torch.utils.checkpoint.checkpoint(_plain_attention, q, k, v, use_reentrant=False)


def make_batch(cfg, b, t):
    gen = torch.Generator().manual_seed(1234)
    inputs = torch.randint(0, cfg.vocab_size, (b, t), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (b, t), generator=gen)
    return inputs, targets


def worker_tetra(spec, weights_out):
    """Times tetra's step; saves its initial weights for the PyTorch worker. Prints 'dt loss0'."""
    cfg = ref.Config(**DEBUG)
    b, t = spec["batch"], spec["seq_len"]
    inputs, targets = make_batch(cfg, b, t)
    err = ctypes.create_string_buffer(2048)
    # a constant learning rate (no warm-up or decay), as the PyTorch side
    argv = ["train", "--model.flavor", spec["flavor"], "--training.device", "cpu", "--training.seed", "42",
            "--training.seq_len", str(t), "--training.local_batch_size", str(b), "--training.global_batch_size",
            str(b), "--training.steps", "1000000", "--training.threads", str(args.threads),
            "--training.max_norm", str(MAX_NORM), "--optimizer.lr", str(LR), "--optimizer.beta1", str(BETAS[0]),
            "--optimizer.beta2", str(BETAS[1]), "--optimizer.eps", str(EPS), "--optimizer.weight_decay", str(WD),
            "--lr_scheduler.warmup_steps", "0", "--lr_scheduler.decay_ratio", "0",
            "--activation_checkpoint.mode", "none"]  # PyTorch keeps every activation too
    arr = (ctypes.c_char_p * len(argv))(*[a.encode() for a in argv])
    h = trainer_create(len(argv), arr, err, 2048)
    if not h:
        raise SystemExit(f"tetra: {err.value.decode()}")
    if trainer_save(h, weights_out.encode(), err, 2048) != 0:
        raise SystemExit(f"tetra: {err.value.decode()}")
    inp32, tgt32 = inputs.to(torch.int32).contiguous(), targets.to(torch.int32).contiguous()
    losses = []
    gn, lr = ctypes.c_double(), ctypes.c_double()

    def step():
        losses.append(trainer_step(h, inp32.data_ptr(), tgt32.data_ptr(), ctypes.byref(gn), ctypes.byref(lr)))

    dt = time_steps(step, args.warmup, args.steps)
    trainer_free(h)
    print(f"{dt!r} {losses[0]!r}")


def worker_pytorch(spec, weights):
    cfg = ref.Config(**DEBUG)
    b, t = spec["batch"], spec["seq_len"]
    inputs, targets = make_batch(cfg, b, t)
    model = ref.Llama3.from_safetensors(cfg, weights)
    # Eager attention keeps B*H*S*S probabilities per layer for backward: at S = 2048, B = 8
    # that is 2 GiB a layer. Recompute them in backward instead, as flash attention does.
    if b * cfg.n_heads * t * t * 4 * cfg.n_layers > 4 << 30:
        ref.attention = checkpointed_attention
    params = model.parameters()
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    losses = []

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model.loss(model.forward(inputs), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
        opt.step()
        losses.append(loss.item())

    dt = time_steps(step, args.warmup, args.steps)
    print(f"{dt!r} {losses[0]!r}")


def run_worker(kind, case, weights=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--threads", str(args.threads),
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if case:
        cmd += ["--case", case]
    if weights:
        cmd += ["--weights", weights]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout.split()
    return [float(x) for x in out[-2:]] if kind != "peak" else float(out[-1])


def run_case(name, spec, peak):
    cfg = ref.Config(**DEBUG)
    b, t = spec["batch"], spec["seq_len"]
    fpt = flops_per_token(cfg, t)
    with tempfile.TemporaryDirectory(prefix="tetra-bench-") as tmp:
        wpath = os.path.join(tmp, "model.safetensors")
        rows = [("tetra", *run_worker("tetra", name, wpath)), ("pytorch", *run_worker("pytorch", name, wpath))]
    note = ""
    if b * cfg.n_heads * t * t * 4 * cfg.n_layers > 4 << 30:
        note = "PyTorch attention probabilities recomputed in backward (torch.utils.checkpoint)"
    out = []
    for fw, dt, loss0 in rows:
        tps = b * t / dt
        out.append(dict(case=name, fw=fw, step=dt, tps=tps, tflops=tps * fpt / 1e12, mfu=100 * tps * fpt / peak,
                        loss0=loss0))
    if abs(rows[0][2] - rows[1][2]) > 1e-4 * abs(rows[1][2]):
        print(f"warning: first-step losses differ: tetra {rows[0][2]:.6f} vs pytorch {rows[1][2]:.6f}")
    return out, note


def main():
    if args.worker == "peak":
        print(repr(measure_peak()))
        return
    if args.worker:
        spec = CASES[args.case[0]]
        (worker_tetra if args.worker == "tetra" else worker_pytorch)(spec, args.weights)
        return
    peak = run_worker("peak", None)
    print(f"threads {args.threads}; fp32 GEMM peak (2048^3, best of 6): {peak / 1e9:.1f} GFLOP/s; "
          f"torch {torch.__version__}; median of {args.steps} steps after {args.warmup} warm-up; "
          f"each framework in its own process")
    results, notes = [], []
    for name in args.case or sorted(CASES):
        spec = CASES[name]
        r, note = run_case(name, spec, peak)
        results += r
        if note:
            notes.append(f"case {name}: {note}")
    hdr = ["case", "model", "seq x batch", "framework", "step (s)", "tokens/s", "TFLOP/s", "MFU", "tetra / torch"]
    lines = []
    for i in range(0, len(results), 2):
        te, to = results[i], results[i + 1]
        spec = CASES[te["case"]]
        for r in (te, to):
            ratio = f"{to['step'] / te['step']:.2f}x" if r is te else ""
            lines.append([r["case"], spec["flavor"], f"{spec['seq_len']} x {spec['batch']}", r["fw"],
                          f"{r['step']:.3f}", f"{r['tps']:,.0f}", f"{r['tflops']:.3f}", f"{r['mfu']:.1f}%", ratio])
    if args.markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
        for l in lines:
            print("| " + " | ".join(l) + " |")
    else:
        w = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(hdr)]
        print("  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)))
        for l in lines:
            print("  ".join(c.ljust(w[i]) for i, c in enumerate(l)))
    for n in notes:
        print(n)


main()
