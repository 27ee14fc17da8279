"""PyTorch reference for tetra's GPU training-throughput benchmark.

Trains a Llama 3 model (a TorchTitan flavor, optionally with fewer layers or a
smaller vocabulary) on random token ids on one CUDA GPU, the way TorchTitan's
best single-GPU setup does: bf16 autocast (the one-GPU equivalent of FSDP
mixed precision, bf16 params / fp32 reduce), each transformer block compiled
on its own with torch.compile (default mode, or mode="reduce-overhead": CUDA
graphs), or eager, optionally float8 linears through torchao (tensorwise or
rowwise; the output projection stays bf16), optionally each block
checkpointed whole (--ac full, as tetra's activation_checkpoint.mode = "full"),
optionally with document-masked attention (--doc-lengths: TorchTitan's
block_causal through FlexAttention, as its `8B_flex` flavor).

A step is forward + cross-entropy + backward + clip_grad_norm_(1.0) + fused
AdamW + zero_grad. After the warm-up, --repeats windows of --steps steps each
are timed with one CUDA synchronisation at each end of the window (nothing
reads the loss inside it, as tetra's steps between two log steps). Reported:
the median window's step time as tokens/s, TFLOP/s and MFU with TorchTitan's
FLOPs-per-token count (6*N + 12*L*H*D*T, N = parameters without the token
embedding), every window's tokens/s (the spread), peak allocated memory and
the last loss.

Exit status 2 when no CUDA device is present, 3 when --float8 is asked for and
torchao is not importable.
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

FLAVORS = {
    # dim, n_layers, n_heads, n_kv_heads, vocab, multiple_of, ffn_dim_multiplier
    "debugmodel": dict(dim=256, n_layers=6, n_heads=16, n_kv_heads=16, vocab=2048,
                       multiple_of=256, ffn_dim_multiplier=None),
    "8B": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab=128256,
               multiple_of=1024, ffn_dim_multiplier=1.3),
}
NORM_EPS = 1e-5
ROPE_THETA = 500000.0


def ffn_hidden(dim, multiple_of, multiplier):
    hidden = int(2 * 4 * dim / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=NORM_EPS, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x):
        if hasattr(F, "rms_norm"):
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def rope_tables(head_dim, seq_len, theta=ROPE_THETA, device=None):
    """cos/sin tables of shape (seq_len, head_dim // 2), fp32."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    ang = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x, cos, sin):
    """x: (B, T, H, D); rotates adjacent pairs (x[2i], x[2i+1]) as Llama does."""
    xf = x.float().reshape(*x.shape[:-1], -1, 2)
    x0, x1 = xf[..., 0], xf[..., 1]
    c = cos.view(1, cos.shape[0], 1, cos.shape[1])
    s = sin.view(1, sin.shape[0], 1, sin.shape[1])
    out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, device=None):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False, device=device)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False, device=device)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False, device=device)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False, device=device)

    def forward(self, x, cos, sin, doc=None):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.n_heads // self.n_kv_heads
        if rep > 1:
            # Repeat K/V heads for GQA (keeps SDPA on its flash/cuDNN kernels).
            k = k.unsqueeze(3).expand(b, t, self.n_kv_heads, rep, self.head_dim).reshape(b, t, self.n_heads, self.head_dim)
            v = v.unsqueeze(3).expand(b, t, self.n_kv_heads, rep, self.head_dim).reshape(b, t, self.n_heads, self.head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        o = sdpa_causal(q, k, v) if doc is None else doc.attention(q, k, v)
        return self.wo(o.transpose(1, 2).reshape(b, t, -1))


class DocMask:
    """Block-causal attention over packed documents: a query sees the keys of its own
    document up to itself. `lengths` (tokens) repeat to fill a sequence, the same for every
    row. FlexAttention with a block mask built once (fully masked tiles are skipped) where
    this PyTorch has it; else the mask spelled out (a CPU check of this script only)."""

    def __init__(self, lengths, seq_len, device):
        ids, d = [], 0
        while len(ids) < seq_len:
            ids.extend([d] * lengths[d % len(lengths)])
            d += 1
        self.doc = torch.tensor(ids[:seq_len], dtype=torch.int32, device=device)
        self.documents = d
        self.flex = None
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except ImportError:
            return
        doc = self.doc

        def block_causal(b, h, q, kv):
            return (q >= kv) & (doc[q] == doc[kv])

        self.block_mask = create_block_mask(block_causal, None, None, seq_len, seq_len, device=device)
        self.flex = torch.compile(flex_attention) if device.type == "cuda" else flex_attention

    def attention(self, q, k, v):
        if self.flex is not None:
            return self.flex(q, k, v, block_mask=self.block_mask)
        t = q.shape[-2]
        pos = torch.arange(t, device=q.device)
        visible = (pos[:, None] >= pos[None, :]) & (self.doc[:, None] == self.doc[None, :])
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        s = s.masked_fill(~visible, float("-inf"))
        return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def sdpa_causal(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # PyTorch before 2.0 (a CPU check of this script only): the same, spelled out
    t = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


class FeedForward(nn.Module):
    def __init__(self, dim, hidden, device=None):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False, device=device)
        self.w3 = nn.Linear(dim, hidden, bias=False, device=device)
        self.w2 = nn.Linear(hidden, dim, bias=False, device=device)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg, device=None):
        super().__init__()
        dim = cfg["dim"]
        self.attention_norm = RMSNorm(dim, device=device)
        self.attention = Attention(dim, cfg["n_heads"], cfg["n_kv_heads"], device=device)
        self.ffn_norm = RMSNorm(dim, device=device)
        self.feed_forward = FeedForward(
            dim, ffn_hidden(dim, cfg["multiple_of"], cfg["ffn_dim_multiplier"]), device=device)

    def forward(self, x, cos, sin, doc=None):
        h = x + self.attention(self.attention_norm(x), cos, sin, doc)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama3(nn.Module):
    def __init__(self, cfg, seq_len, device=None):
        super().__init__()
        self.cfg = cfg
        dim = cfg["dim"]
        self.tok_embeddings = nn.Embedding(cfg["vocab"], dim, device=device)
        self.layers = nn.ModuleList(Block(cfg, device=device) for _ in range(cfg["n_layers"]))
        self.norm = RMSNorm(dim, device=device)
        self.output = nn.Linear(dim, cfg["vocab"], bias=False, device=device)
        cos, sin = rope_tables(dim // cfg["n_heads"], seq_len, device=device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.doc = None  # a DocMask: document-masked attention
        with torch.no_grad():
            for name, p in self.named_parameters():
                if not name.endswith("norm.weight"):
                    p.normal_(0.0, 0.02)

    def forward(self, tokens):
        t = tokens.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin, self.doc)
        return self.output(self.norm(h))


def n_params_no_embedding(model):
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith("tok_embeddings."))


def flops_per_token(n_params, cfg, seq_len):
    head_dim = cfg["dim"] // cfg["n_heads"]
    return 6 * n_params + 12 * cfg["n_layers"] * cfg["n_heads"] * head_dim * seq_len


def loss_fn(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flavor", choices=sorted(FLAVORS), required=True)
    ap.add_argument("--n-layers", type=int, help="override the flavor's layer count")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, default=20, help="measured steps (after warm-up)")
    ap.add_argument("--warmup", type=int, default=5, help="unmeasured steps first (compilation happens here)")
    ap.add_argument("--mode", choices=["eager", "compile", "reduce-overhead"], default="compile",
                    help="eager, torch.compile per block, or torch.compile(mode='reduce-overhead') per block")
    ap.add_argument("--ac", choices=["none", "full"], default="none",
                    help="activation checkpointing: none, or every block recomputed in backward")
    ap.add_argument("--repeats", type=int, default=2, help="timed windows of --steps steps each")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only checks this script (eager, no timing claims)")
    ap.add_argument("--vocab", type=int, help="override the flavor's vocabulary size")
    ap.add_argument("--float8", choices=["none", "tensorwise", "rowwise"], default="none")
    ap.add_argument("--doc-lengths", help="comma-separated document lengths in tokens, repeated to fill each "
                    "sequence: block-causal attention (a token sees the earlier tokens of its own document)")
    ap.add_argument("--peak", type=float, default=989e12, help="peak FLOP/s for MFU (default: H100 SXM dense bf16)")
    ap.add_argument("--json-out", help="also write the results as a JSON object to this file")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.repeats < 1:
        ap.error("--steps and --repeats must be >= 1 and --warmup >= 0")
    if args.doc_lengths is not None:
        try:
            args.doc_lengths = [int(x) for x in args.doc_lengths.split(",")]
        except ValueError:
            ap.error(f"--doc-lengths {args.doc_lengths!r}: comma-separated whole numbers")
        if not args.doc_lengths or min(args.doc_lengths) < 1:
            ap.error("--doc-lengths: every document holds at least one token")
    return args


def main(argv=None):
    args = parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("gpu_pytorch: no CUDA device", file=sys.stderr)
        return 2
    if args.float8 != "none":
        try:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        except ImportError as e:
            print(f"gpu_pytorch: --float8 {args.float8} needs torchao, which is not importable ({e})",
                  file=sys.stderr)
            return 3

    cfg = dict(FLAVORS[args.flavor])
    if args.n_layers is not None:
        cfg["n_layers"] = args.n_layers
    if args.vocab is not None:
        cfg["vocab"] = args.vocab
    dev = torch.device(args.device)
    torch.manual_seed(0)

    model = Llama3(cfg, args.seq_len, device=dev)
    n_params = n_params_no_embedding(model)
    fpt = flops_per_token(n_params, cfg, args.seq_len)

    label = f"pytorch-{args.mode}" + ("-ac-full" if args.ac == "full" else "")
    if args.doc_lengths:
        model.doc = DocMask(args.doc_lengths, args.seq_len, dev)
        label += "-block-causal" + ("-flex" if model.doc.flex is not None else "-explicit")
        print(f"gpu_pytorch: block_causal over {model.doc.documents} documents a sequence "
              f"(FlexAttention: {'yes' if model.doc.flex is not None else 'no'})", file=sys.stderr)
    if args.float8 != "none":
        f8cfg = Float8LinearConfig() if args.float8 == "tensorwise" else Float8LinearConfig.from_recipe_name("rowwise")
        convert_to_float8_training(model, config=f8cfg, module_filter_fn=lambda mod, fqn: fqn != "output")
        label += f"-float8-{args.float8}"
    if args.mode != "eager":
        kw = dict(mode="reduce-overhead") if args.mode == "reduce-overhead" else {}
        for i, block in enumerate(model.layers):
            model.layers[i] = torch.compile(block, fullgraph=True, **kw)
    if args.ac == "full":
        from torch.utils.checkpoint import checkpoint

        blocks = list(model.layers)

        def forward_ac(tokens):
            t = tokens.shape[1]
            cos, sin = model.rope_cos[:t], model.rope_sin[:t]
            h = model.tok_embeddings(tokens)
            for blk in blocks:
                h = checkpoint(blk, h, cos, sin, model.doc, use_reentrant=False)
            return model.output(model.norm(h))

        model.forward = forward_ac

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=8e-4, weight_decay=0.1, **(dict(fused=True) if cuda else {}))
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)

    def batch():
        ids = torch.randint(0, cfg["vocab"], (args.batch, args.seq_len + 1), device=dev, generator=gen)
        return ids[:, :-1], ids[:, 1:]

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step(inputs, targets):
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(inputs)
            loss = loss_fn(logits, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    loss = None
    for _ in range(args.warmup):
        loss = step(*batch())
    # the batches of every window drawn before it, so the window times only the steps
    windows = []
    for _ in range(args.repeats):
        batches = [batch() for _ in range(args.steps)]
        sync()
        t0 = time.perf_counter()
        for inputs, targets in batches:
            loss = step(inputs, targets)
        sync()
        windows.append((time.perf_counter() - t0) / args.steps)
    last_loss = loss.item()

    step_s = statistics.median(windows)
    tokens_per_s = args.batch * args.seq_len / step_s
    window_tps = [args.batch * args.seq_len / w for w in windows]
    tflops = tokens_per_s * fpt / 1e12
    mfu = 100.0 * tflops * 1e12 / args.peak
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    spread = f"{min(window_tps):,.0f}-{max(window_tps):,.0f}"
    print(f"{label} | {args.repeats} x {args.steps} steps | tokens/s {tokens_per_s:.0f} (windows {spread}) | "
          f"TFLOP/s {tflops:.2f} | MFU {mfu:.2f}% | peak memory {peak_gib:.2f} GiB | last loss {last_loss:.4f}")
    if not math.isfinite(last_loss):
        print("gpu_pytorch: warning: loss is not finite", file=sys.stderr)

    if args.json_out:
        result = dict(
            label=label, mode=args.mode, ac=args.ac, float8=args.float8, flavor=args.flavor, repeats=args.repeats,
            dim=cfg["dim"], n_layers=cfg["n_layers"], n_heads=cfg["n_heads"], n_kv_heads=cfg["n_kv_heads"],
            vocab=cfg["vocab"], seq_len=args.seq_len, batch=args.batch, steps=args.steps, warmup=args.warmup,
            doc_lengths=args.doc_lengths, flex_attention=bool(model.doc is not None and model.doc.flex is not None),
            n_params_no_embedding=n_params, flops_per_token=fpt, step_time_median_s=step_s,
            window_step_s=windows, window_tokens_per_s=window_tps, tokens_per_s=tokens_per_s, tflops=tflops, mfu_percent=mfu, peak_flops=args.peak,
            peak_memory_gib=peak_gib, last_loss=last_loss, torch_version=torch.__version__,
            device=torch.cuda.get_device_name(dev) if cuda else "cpu",
        )
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
