#!/usr/bin/env python3
"""The Llama 3 model against an independent PyTorch Llama (tests/py/llama3_ref.py).

tetra runs through ctypes on $TETRA_BUILD/lib/libtetra.so (the llama3_capi_* entry
points); weights and gradients pass between the two as Hugging Face safetensors, so
the q/k rotary permutation of tetra's writer and reader is part of what is checked
(the reference rotates in HF's rotate-half layout, tetra in interleaved pairs).

1. init: tetra's counter-based init equals an independent Philox4x32-10 + inverse-CDF
   evaluation at (seed, name, index); same seed -> same bytes; TorchTitan's stds.
2. debugmodel, one batch: logits, loss and every parameter's gradient
   (rel error <= 1e-5 loss, <= 1e-4 logits and gradients; rel = max|a-b| / max|b|).
3. debugmodel, 10 training steps of the trainer itself (trainer_capi_*: the schedule,
   FSDP hooks, clipping, AdamW and LR schedule of `tetra train`, fed the test's
   batches) against torch.optim.AdamW (betas 0.9/0.95, eps 1e-8, wd 0.1) with warmup,
   cosine decay and clipping at max_norm 1: the loss of every step within 1e-5.
4. tiny flavor (GQA, 2 KV heads): logits, loss and gradients as in 2.
5. loading HF checkpoints written by PyTorch: sharded with an index, BF16 and F16.
Exits non-zero on any failure.
"""
import ctypes
import json
import math
import os
import sys
import tempfile
import time

# Two libraries (libtetra and torch) share two cores in this process: OpenMP workers
# that spin while waiting would steal the cores from each other. Set before either
# OpenMP runtime starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import struct

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama3_ref as ref  # noqa: E402

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
T0 = time.time()
build = os.environ.get("TETRA_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
lib = ctypes.CDLL(os.path.join(build, "lib", "libtetra.so"))

c_int, c_double, c_float, c_size, c_void, c_char_p = (ctypes.c_int, ctypes.c_double, ctypes.c_float,
                                                       ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p)
c_u64, c_i64 = ctypes.c_uint64, ctypes.c_int64


def sig(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


capi_create = sig("llama3_capi_create", c_void, c_char_p, c_int, c_char_p, c_size)
capi_free = sig("llama3_capi_free", None, c_void)
capi_init = sig("llama3_capi_init_weights", None, c_void, c_u64)
capi_n_params = sig("llama3_capi_n_params", c_int, c_void)
capi_param_name = sig("llama3_capi_param_name", c_char_p, c_void, c_int)
capi_param_shape = sig("llama3_capi_param_shape", c_int, c_void, c_int, ctypes.POINTER(c_i64))
capi_get = sig("llama3_capi_get", c_int, c_void, c_char_p, c_int, c_void)
capi_fwd_bwd = sig("llama3_capi_forward_backward", c_double, c_void, c_int, c_int, c_void, c_void, c_void)
capi_fwd_bwd_docs = sig("llama3_capi_forward_backward_docs", c_double, c_void, c_int, c_int, c_void, c_void, c_void,
                        c_void)
capi_reset_positions = sig("llama3_capi_set_reset_positions", c_int, c_void, c_int)
trainer_create = sig("trainer_capi_create", c_void, c_int, ctypes.POINTER(c_char_p), c_char_p, c_size)
trainer_free = sig("trainer_capi_free", None, c_void)
trainer_tokens = sig("trainer_capi_batch_tokens", c_int, c_void)
trainer_step = sig("trainer_capi_step", c_double, c_void, c_void, c_void, ctypes.POINTER(c_double),
                   ctypes.POINTER(c_double))
trainer_step_docs = sig("trainer_capi_step_docs", c_double, c_void, c_void, c_void, c_void, ctypes.POINTER(c_double),
                        ctypes.POINTER(c_double))
trainer_save = sig("trainer_capi_save_hf", c_int, c_void, c_char_p, c_char_p, c_size)
capi_save = sig("llama3_capi_save_hf", c_int, c_void, c_char_p, c_char_p, c_int, c_char_p, c_size)
capi_load = sig("llama3_capi_load_hf", c_int, c_void, c_char_p, c_char_p, c_size)
capi_acts_bytes = sig("llama3_capi_acts_bytes", c_size, c_void, c_int, c_int)
rng_trunc_normal = sig("llama3_rng_trunc_normal", c_float, c_u64, c_char_p, c_u64, c_double, c_double, c_double)


class LrSchedule(ctypes.Structure):
    _fields_ = [("warmup", c_i64), ("stable", c_i64), ("decay", c_i64), ("type", c_int), ("min_lr_factor", c_double)]


lr_schedule_init = sig("lr_schedule_init", c_int, ctypes.POINTER(LrSchedule), c_i64, c_i64, c_double, c_char_p,
                       c_double)
lr_factor_c = sig("lr_factor", c_double, ctypes.POINTER(LrSchedule), c_i64)

failures = []


def check(ok, msg):
    if not ok:
        failures.append(msg)
        print("FAIL", msg)


class Tetra:
    """A tetra model on the CPU backend, through the C API."""

    def __init__(self, flavor, max_seq_len):
        err = ctypes.create_string_buffer(1024)
        self.h = capi_create(flavor.encode(), max_seq_len, err, 1024)
        if not self.h:
            raise RuntimeError(err.value.decode())
        self.names = [capi_param_name(self.h, i).decode() for i in range(capi_n_params(self.h))]
        self.shapes = {}
        for i, n in enumerate(self.names):
            s = (c_i64 * 2)()
            nd = capi_param_shape(self.h, i, s)
            self.shapes[n] = tuple(s[:nd])

    def __del__(self):
        if getattr(self, "h", None):
            capi_free(self.h)

    def get(self, name, grad=False):
        out = torch.empty(self.shapes[name], dtype=torch.float32)
        assert capi_get(self.h, name.encode(), int(grad), out.data_ptr()) == 0
        return out

    def save(self, path, dtype="float32", grad=False):
        err = ctypes.create_string_buffer(1024)
        if capi_save(self.h, path.encode(), dtype.encode(), int(grad), err, 1024) != 0:
            raise RuntimeError(err.value.decode())

    def load(self, path):
        err = ctypes.create_string_buffer(1024)
        if capi_load(self.h, path.encode(), err, 1024) != 0:
            raise RuntimeError(err.value.decode())

    def forward_backward(self, inputs, targets, want_logits=False, docs=None):
        """inputs, targets: [b, t] integer tensors; docs: [b, t] document ids (block_causal
        flavors, reset positions) or None; returns (mean loss, logits [b, t, V] or None)."""
        b, t = inputs.shape
        inp = inputs.to(torch.int32).contiguous()
        tgt = targets.to(torch.int32).contiguous()
        dc = docs.to(torch.int32).contiguous() if docs is not None else None
        logits = torch.empty((b, t, self.vocab), dtype=torch.float32) if want_logits else None
        loss = capi_fwd_bwd_docs(self.h, b, t, inp.data_ptr(), tgt.data_ptr(), dc.data_ptr() if dc is not None else None,
                                 logits.data_ptr() if want_logits else None)
        return loss, logits

    @property
    def vocab(self):
        return self.shapes["output.weight"][0]


def make_config(tm, n_heads, n_kv_heads):
    """The reference config from tetra's parameter shapes and the flavor's head counts."""
    s = tm.shapes
    n_layers = sum(1 for n in tm.names if n.endswith("attention.wq.weight"))
    return ref.Config(dim=s["norm.weight"][0], n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                      vocab_size=s["output.weight"][0], ffn_hidden=s["layers.0.feed_forward.w1.weight"][0])


def rel_err(a, b):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    scale = b.abs().max().item()
    d = (a - b).abs().max().item()
    return d / scale if scale > 0 else d


def make_batch(gen, b, t, vocab, ignore_frac=0.05):
    inputs = torch.randint(0, vocab, (b, t), generator=gen)
    targets = torch.randint(0, vocab, (b, t), generator=gen)
    targets[torch.rand(b, t, generator=gen) < ignore_frac] = ref.IGNORE_INDEX
    return inputs, targets


# --------------------------------------------------------------------------- 1. init

MASK32 = 0xFFFFFFFF


def philox4x32_10(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & MASK32, (k1 + 0xBB67AE85) & MASK32
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & MASK32, p1 & MASK32, ((p0 >> 32) ^ c3 ^ k1) & MASK32, p0 & MASK32
    return c0, c1, c2, c3


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for byte in s.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def init_value(seed, name, index, std, lo, hi):
    """tetra's documented init (models/llama3/init.h), evaluated independently in float64."""
    h = fnv1a64(name)
    x = philox4x32_10((index & MASK32, index >> 32, h & MASK32, h >> 32), (seed & MASK32, seed >> 32))
    bits = ((x[0] << 32) | x[1]) >> 11
    u = (bits + 0.5) / 2.0**53
    cdf = lambda z: 0.5 * math.erfc(-z / math.sqrt(2.0))  # noqa: E731
    plo, phi = cdf(lo / std), cdf(hi / std)
    p = plo + (phi - plo) * u
    z = math.sqrt(2.0) * torch.special.erfinv(torch.tensor(2.0 * p - 1.0, dtype=torch.float64)).item()
    return to_f32(min(max(std * z, lo), hi))


def to_f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def ulp_f32(x):
    return 2.0 ** (math.frexp(abs(x))[1] - 24) if x != 0 else 2.0**-149


def init_spec(name, dim):
    """TorchTitan's init: (std, lo, hi) or None for ones."""
    if name.endswith("norm.weight"):
        return None
    if name == "tok_embeddings.weight":
        return 1.0, -math.inf, math.inf
    if name == "output.weight":
        s = dim**-0.5
        return s, -3 * s, 3 * s
    layer = int(name.split(".")[1])
    if any(k in name for k in ("wo.", "w2.", "w3.")):
        return 0.02 / math.sqrt(2 * (layer + 1)), -2.0, 2.0
    return 0.02, -2.0, 2.0


def test_init(tm, seed, tmp):
    dim = tm.shapes["norm.weight"][0]
    gen = torch.Generator().manual_seed(5)
    worst = 0.0
    for name in tm.names:
        w = tm.get(name).reshape(-1)
        spec = init_spec(name, dim)
        if spec is None:
            check(bool(torch.all(w == 1.0)), f"init {name}: norm weights must be 1")
            continue
        for idx in torch.randint(0, w.numel(), (6,), generator=gen).tolist() + [0, w.numel() - 1]:
            want = init_value(seed, name, idx, *spec)
            got = float(w[idx])
            ulp = ulp_f32(want)
            worst = max(worst, abs(got - want) / ulp)
            check(abs(got - want) <= ulp, f"init {name}[{idx}] = {got!r}, independent RNG gives {want!r}")
            check(float(rng_trunc_normal(seed, name.encode(), idx, *spec)) == got, f"C scalar RNG {name}[{idx}]")
    print(f"init: every sampled element within {worst:.0f} ulp of the independent Philox + inverse-CDF value")

    # statistics
    L = sum(1 for n in tm.names if n.endswith("wq.weight"))
    stats = [("tok_embeddings.weight", 1.0), ("layers.0.attention.wq.weight", 0.02),
             ("output.weight", 0.986582 * dim**-0.5)]
    for l in range(L):
        stats.append((f"layers.{l}.attention.wo.weight", 0.02 / math.sqrt(2 * (l + 1))))
        stats.append((f"layers.{l}.feed_forward.w2.weight", 0.02 / math.sqrt(2 * (l + 1))))
    for name, want in stats:
        w = tm.get(name).double()
        sd = w.std(unbiased=False).item()
        tol = 4.0 / math.sqrt(2 * w.numel())
        check(abs(sd / want - 1) < tol, f"init std {name}: {sd:.5g}, want {want:.5g}")
    out = tm.get("output.weight")
    check(out.abs().max().item() <= 3 * dim**-0.5, "output cut at 3 sigma")
    print(f"init: std wq {tm.get('layers.0.attention.wq.weight').std():.5f} (0.02), "
          f"output {out.std():.5f} ({0.986582 * dim**-0.5:.5f}), "
          f"wo[0] {tm.get('layers.0.attention.wo.weight').std():.5f} ({0.02 / math.sqrt(2):.5f}), "
          f"wo[{L - 1}] {tm.get(f'layers.{L - 1}.attention.wo.weight').std():.5f} ({0.02 / math.sqrt(2 * L):.5f})")

    # determinism: same seed -> same file bytes; another seed -> other weights
    a, b = os.path.join(tmp, "seed_a.safetensors"), os.path.join(tmp, "seed_b.safetensors")
    tm.save(a)
    t2 = Tetra("debugmodel", 64)
    capi_init(t2.h, seed)
    t2.save(b)
    check(open(a, "rb").read() == open(b, "rb").read(), "same seed gives identical checkpoints")
    capi_init(t2.h, seed + 1)
    check(not torch.equal(t2.get("layers.2.feed_forward.w3.weight"), tm.get("layers.2.feed_forward.w3.weight")),
          "another seed gives other weights")


# --------------------------------------------------------------------------- 2./4. one batch

def compare_one_batch(label, tm, cfg, tmp, b, t, seed, make_docs=None, reset_positions=False, block_causal=True):
    """make_docs(gen, b, t) -> [b, t] document ids, for a block_causal flavor and/or reset positions"""
    wpath = os.path.join(tmp, f"{label}_model.safetensors")
    gpath = os.path.join(tmp, f"{label}_grads.safetensors")
    tm.save(wpath)
    model = ref.Llama3.from_safetensors(cfg, wpath)
    gen = torch.Generator().manual_seed(seed)
    inputs, targets = make_batch(gen, b, t, cfg.vocab_size)
    docs = make_docs(gen, b, t) if make_docs else None

    loss_c, logits_c = tm.forward_backward(inputs, targets, want_logits=True, docs=docs)
    tm.save(gpath, grad=True)
    grads_c = load_file(gpath)

    logits = model.forward(inputs, docs, reset_positions, block_causal)
    loss = model.loss(logits, targets)
    loss.backward()

    e_loss = abs(loss_c - loss.item()) / abs(loss.item())
    e_logits = rel_err(logits_c, logits.detach())
    print(f"\n{label} ({cfg.n_heads} heads, {cfg.n_kv_heads} kv heads): batch {b} x {t}, loss tetra {loss_c:.9f} torch {loss.item():.9f} rel {e_loss:.2e}; "
          f"logits max rel {e_logits:.2e}")
    check(e_loss <= 1e-5, f"{label} loss rel error {e_loss:.3e}")
    check(e_logits <= 1e-4, f"{label} logits rel error {e_logits:.3e}")
    print(f"  {'tensor (HF name)':<48} {'max rel err':>11}")
    worst = 0.0
    for name in ref.hf_names(cfg):
        e = rel_err(grads_c[name], model.params[name].grad)
        worst = max(worst, e)
        print(f"  {name:<48} {e:11.2e}")
        check(e <= 1e-4, f"{label} grad {name} rel error {e:.3e}")
    print(f"  worst gradient rel error {worst:.2e}")
    return model


# --------------------------------------------------------------------------- 3. AdamW steps

class Trainer:
    """`tetra train`'s own trainer (one rank, CPU) driven step by step with given batches."""

    def __init__(self, *argv):
        args = ["train", *argv]
        arr = (c_char_p * len(args))(*[a.encode() for a in args])
        err = ctypes.create_string_buffer(2048)
        self.h = trainer_create(len(args), arr, err, 2048)
        if not self.h:
            raise RuntimeError(err.value.decode())

    def __del__(self):
        if getattr(self, "h", None):
            trainer_free(self.h)

    def step(self, inputs, targets, docs=None):
        inp = inputs.to(torch.int32).contiguous()
        tgt = targets.to(torch.int32).contiguous()
        dc = docs.to(torch.int32).contiguous() if docs is not None else None
        assert inp.numel() == trainer_tokens(self.h)
        gn, lr = c_double(), c_double()
        loss = trainer_step_docs(self.h, inp.data_ptr(), tgt.data_ptr(), dc.data_ptr() if dc is not None else None,
                                 ctypes.byref(gn), ctypes.byref(lr))
        return loss, gn.value, lr.value

    def save(self, path):
        err = ctypes.create_string_buffer(1024)
        if trainer_save(self.h, path.encode(), err, 1024) != 0:
            raise RuntimeError(err.value.decode())


def compare_training(cfg, tmp, b, t, steps=10, flavor="debugmodel", make_docs=None):
    """make_docs(gen, b, t): each step's document ids (a block_causal flavor)"""
    lr, betas, eps, wd, max_norm = 1e-3, (0.9, 0.95), 1e-8, 0.1, 1.0
    warmup, decay_ratio, decay_type, min_lr = 3, 0.5, "cosine", 0.1
    tr = Trainer("--model.flavor", flavor, "--training.device", "cpu", "--training.seed", "20240601",
                 "--training.seq_len", str(t), "--training.local_batch_size", str(b),
                 "--training.global_batch_size", str(b), "--training.steps", str(steps),
                 "--training.max_norm", str(max_norm), "--training.threads", os.environ.get("OMP_NUM_THREADS", "2"),
                 "--optimizer.lr", str(lr), "--optimizer.beta1", str(betas[0]), "--optimizer.beta2", str(betas[1]),
                 "--optimizer.eps", str(eps), "--optimizer.weight_decay", str(wd),
                 "--lr_scheduler.warmup_steps", str(warmup), "--lr_scheduler.decay_ratio", str(decay_ratio),
                 "--lr_scheduler.decay_type", decay_type, "--lr_scheduler.min_lr_factor", str(min_lr))
    wpath = os.path.join(tmp, "train_model.safetensors")
    tr.save(wpath)
    model = ref.Llama3.from_safetensors(cfg, wpath)
    params = model.parameters()
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=wd, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda c: ref.lr_factor(c, steps, warmup, decay_ratio, decay_type, min_lr))
    cs = LrSchedule()
    assert lr_schedule_init(ctypes.byref(cs), steps, warmup, decay_ratio, decay_type.encode(), min_lr) == 0

    gen = torch.Generator().manual_seed(77)
    print(f"\n{steps} steps of the trainer (lr {lr}, warmup {warmup}, {decay_type} decay ratio {decay_ratio}, "
          f"min_lr_factor {min_lr}, max_norm {max_norm}, wd {wd}):")
    # torch's clip_grad_norm_ reduces in fp32 (about 1e-4 off on this model); the gradient
    # norm check uses the torch gradients summed in float64 instead.
    print(f"  {'step':>4} {'lr':>10} {'tetra loss':>13} {'torch loss':>13} {'rel err':>9} {'tetra |g|':>10} "
          f"{'torch |g|':>10} {'f64 |g|':>10}")
    worst = 0.0
    for s in range(steps):
        inputs, targets = make_batch(gen, b, t, cfg.vocab_size)
        docs = make_docs(gen, b, t) if make_docs else None
        f_c = lr_factor_c(ctypes.byref(cs), s)
        f_py = ref.lr_factor(s, steps, warmup, decay_ratio, decay_type, min_lr)
        check(abs(f_c - f_py) <= 1e-12, f"lr factor step {s}: C {f_c} vs python {f_py}")
        loss_c, gn_c, lr_c = tr.step(inputs, targets, docs)

        opt.zero_grad()
        loss = model.loss(model.forward(inputs, docs), targets)
        loss.backward()
        gn64 = math.sqrt(sum(p.grad.double().pow(2).sum().item() for p in params))
        gn = torch.nn.utils.clip_grad_norm_(params, max_norm).item()
        cur_lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()

        e = abs(loss_c - loss.item()) / abs(loss.item())
        worst = max(worst, e)
        print(f"  {s + 1:4d} {cur_lr:10.3e} {loss_c:13.8f} {loss.item():13.8f} {e:9.2e} {gn_c:10.6f} {gn:10.6f} "
              f"{gn64:10.6f}")
        check(e <= 1e-5, f"step {s + 1}: loss rel error {e:.3e}")
        check(abs(gn_c - gn64) <= 1e-5 * gn64, f"step {s + 1}: grad norm {gn_c} vs {gn64}")
        check(abs(cur_lr - lr_c) <= 1e-15 and abs(lr_c - lr * f_c) <= 1e-15, f"step {s + 1}: lr {cur_lr} vs {lr_c}")
    # where the weights ended up
    after = os.path.join(tmp, "train_after.safetensors")
    tr.save(after)
    final = load_file(after)
    pe = max(rel_err(final[n], model.params[n].detach()) for n in ref.hf_names(cfg))
    print(f"  worst loss rel error {worst:.2e}; parameters after {steps} steps: worst max rel error {pe:.2e}")
    # AdamW divides by sqrt(v): parameters whose gradient is tiny move by lr whatever its
    # rounding, so the weights agree less tightly than the losses
    check(pe <= 1e-3, f"parameters after {steps} steps: max rel error {pe:.3e}")
    del tr
    return model


# --------------------------------------------------------------------------- 5. HF checkpoints from PyTorch

def test_load_torch_checkpoints(tm, model, tmp):
    cfg = model.cfg
    names = ref.hf_names(cfg)
    weights = {n: model.params[n].detach().contiguous() for n in names}
    half = len(names) // 2
    folder = os.path.join(tmp, "sharded")
    os.makedirs(folder)
    shards = {"model-00001-of-00002.safetensors": (names[:half], torch.bfloat16),
              "model-00002-of-00002.safetensors": (names[half:], torch.float16)}
    weight_map, want = {}, {}
    for fname, (ns, dt) in shards.items():
        save_file({n: weights[n].to(dt) for n in ns}, os.path.join(folder, fname), metadata={"format": "pt"})
        for n in ns:
            weight_map[n] = fname
            want[n] = weights[n].to(dt).float()
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    tm.load(folder)
    out = os.path.join(tmp, "reloaded.safetensors")
    tm.save(out)
    got = load_file(out)
    bad = [n for n in names if not torch.equal(got[n], want[n])]
    check(not bad, f"sharded BF16/F16 load differs in {bad[:3]}")
    print(f"\nloaded a PyTorch-written sharded checkpoint (BF16 + F16, index.json): "
          f"{'bit exact' if not bad else 'MISMATCH'} after re-export")

    # a float32 single file, and clear errors
    single = os.path.join(tmp, "torch_f32.safetensors")
    save_file(weights, single)
    tm.load(single)
    check(torch.equal(tm.get("layers.0.attention.wv.weight"), weights["model.layers.0.self_attn.v_proj.weight"]),
          "float32 file loads exactly")
    broken = dict(weights)
    broken.pop("model.layers.2.mlp.up_proj.weight")
    bpath = os.path.join(tmp, "broken.safetensors")
    save_file(broken, bpath)
    try:
        tm.load(bpath)
        check(False, "a checkpoint without up_proj must not load")
    except RuntimeError as e:
        check("model.layers.2.mlp.up_proj.weight" in str(e) and "broken.safetensors" in str(e), f"message: {e}")
        print(f"missing tensor -> {e}")


def main():
    seed = 20240601
    with tempfile.TemporaryDirectory() as tmp:
        tm = Tetra("debugmodel", 128)
        capi_init(tm.h, seed)
        cfg = make_config(tm, n_heads=16, n_kv_heads=16)
        print(f"debugmodel: {sum(math.prod(s) for s in tm.shapes.values()):,} parameters; activations at 8 x 2048: "
              f"{capi_acts_bytes(tm.h, 8, 2048) / 2**30:.2f} GiB")
        t = time.time()
        test_init(tm, seed, tmp)
        print(f"[init {time.time() - t:.1f} s]")

        t = time.time()
        compare_one_batch("debugmodel", tm, cfg, tmp, b=2, t=128, seed=1)
        print(f"[one batch {time.time() - t:.1f} s]")

        t = time.time()
        model = compare_training(cfg, tmp, b=2, t=64)
        print(f"[training {time.time() - t:.1f} s]")

        t = time.time()
        tiny = Tetra("tiny", 64)
        capi_init(tiny.h, 3)
        compare_one_batch("tiny", tiny, make_config(tiny, n_heads=4, n_kv_heads=2), tmp,
                          b=3, t=40, seed=2)
        print(f"[tiny {time.time() - t:.1f} s]")

        test_load_torch_checkpoints(tm, model, tmp)

    print(f"\ntest_model_parity: {len(failures)} failures, {time.time() - T0:.1f} s")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
