"""An independent Llama 3 / 3.1 in plain PyTorch (fp32), for numerics tests.

Written from the published model math, not from tetra's code. It works directly
in the Hugging Face layout, weights keyed by HF names: q_proj/k_proj rows are in
HF's rotate-half order, so RoPE rotates the pairs (x[i], x[i + hd/2]) here, while
tetra rotates interleaved pairs (x[2i], x[2i+1]) on un-permuted weights. Agreement
therefore also checks the q/k permutation of tetra's safetensors writer and reader.

    h   = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1))),  n1 = rms(x) * input_layernorm
    out = h + down_proj(silu(gate_proj(n2)) * up_proj(n2)),                    n2 = rms(h) * post_attention_layernorm
    logits = lm_head(rms(out_L) * norm);  loss = sum CE(logits, targets) / #valid targets (ignore index -100)

Attention is written out (scores, causal mask, softmax) because the Debian torch
predates scaled_dot_product_attention; GQA repeats each KV head n_heads/n_kv_heads
times. RoPE uses Llama 3.1 frequency scaling (Meta's apply_scaling).

Document masks (TorchTitan's block_causal): forward(tokens, docs) with docs [B, T] the
document id of every token masks, besides the future, every key of another document
(an explicit boolean mask, no flex attention in this torch); with reset_positions=True
RoPE takes each token's position within its document instead of within the sequence.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

IGNORE_INDEX = -100


@dataclass
class Config:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    ffn_hidden: int
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_pos: int = 8192

    @property
    def head_dim(self):
        return self.dim // self.n_heads


def hf_names(cfg):
    """Every parameter name of the HF checkpoint, in a fixed order."""
    names = ["model.embed_tokens.weight"]
    for l in range(cfg.n_layers):
        p = f"model.layers.{l}."
        names += [p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
                  p + "self_attn.o_proj.weight", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                  p + "mlp.down_proj.weight", p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    names += ["model.norm.weight", "lm_head.weight"]
    return names


def rope_inv_freq(cfg):
    """Per-pair frequencies, fp32, with Llama 3.1 scaling applied element by element."""
    hd = cfg.head_dim
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2)[: hd // 2].float() / hd))
    low_wavelen = cfg.rope_original_max_pos / cfg.rope_low_freq_factor
    high_wavelen = cfg.rope_original_max_pos / cfg.rope_high_freq_factor
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / cfg.rope_factor)
        else:
            smooth = (cfg.rope_original_max_pos / wavelen - cfg.rope_low_freq_factor) / (
                cfg.rope_high_freq_factor - cfg.rope_low_freq_factor)
            out.append((1 - smooth) * f / cfg.rope_factor + smooth * f)
    return torch.stack(out).float()


def rope_cos_sin(cfg, seq_len, positions=None):
    """cos, sin [T, hd] at positions 0..T-1, or [B, 1, T, hd] at positions [B, T] (per token)"""
    if positions is None:
        angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), rope_inv_freq(cfg))  # [T, hd/2]
    else:
        angles = positions.float()[:, None, :, None] * rope_inv_freq(cfg)                  # [B, 1, T, hd/2]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def positions_in_documents(docs):
    """[B, T] position of each token within its document (docs: ids, nondecreasing per row)"""
    b, t = docs.shape
    pos = torch.zeros(b, t, dtype=torch.long)
    for r in range(b):
        start = 0
        for i in range(t):
            if i > 0 and docs[r, i] != docs[r, i - 1]:
                start = i
            pos[r, i] = i - start
    return pos


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x, cos, sin):
    """x [B, heads, T, hd]; rotates (x[i], x[i + hd/2]) by angle i."""
    return x * cos + rotate_half(x) * sin


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def attention(q, k, v, docs=None):
    """q [B, H, T, hd], k/v [B, H, T, hd] (already repeated for GQA); causal, and with
    docs [B, T] also block_causal: no key of another document."""
    t = q.shape[2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)                        # True: masked
    if docs is not None:
        mask = mask[None] | (docs[:, :, None] != docs[:, None, :])           # [B, T, T]
        mask = mask[:, None]                                                 # over the heads
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


class Llama3:
    def __init__(self, cfg, weights):
        self.cfg = cfg
        missing = [n for n in hf_names(cfg) if n not in weights]
        if missing:
            raise KeyError(f"missing tensors: {missing[:3]}")
        self.params = {n: weights[n].detach().clone().float().requires_grad_(True) for n in hf_names(cfg)}

    @classmethod
    def from_safetensors(cls, cfg, path):
        return cls(cfg, load_file(path))

    def parameters(self):
        return [self.params[n] for n in hf_names(self.cfg)]

    def forward(self, tokens, docs=None, reset_positions=False, block_causal=True):
        """tokens [B, T] (int64) -> logits [B, T, V]; docs [B, T]: block_causal attention (unless
        block_causal=False: the causal mask, docs for the positions only)"""
        cfg, P = self.cfg, self.params
        b, t = tokens.shape
        hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        cos, sin = rope_cos_sin(cfg, t, positions_in_documents(docs) if reset_positions else None)
        x = P["model.embed_tokens.weight"][tokens]
        for l in range(cfg.n_layers):
            p = f"model.layers.{l}."
            n1 = rms_norm(x, P[p + "input_layernorm.weight"], cfg.norm_eps)
            q = (n1 @ P[p + "self_attn.q_proj.weight"].T).view(b, t, nh, hd).transpose(1, 2)
            k = (n1 @ P[p + "self_attn.k_proj.weight"].T).view(b, t, nkv, hd).transpose(1, 2)
            v = (n1 @ P[p + "self_attn.v_proj.weight"].T).view(b, t, nkv, hd).transpose(1, 2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            rep = nh // nkv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            a = attention(q, k, v, docs if block_causal else None).transpose(1, 2).reshape(b, t, nh * hd)
            x = x + a @ P[p + "self_attn.o_proj.weight"].T
            n2 = rms_norm(x, P[p + "post_attention_layernorm.weight"], cfg.norm_eps)
            ff = F.silu(n2 @ P[p + "mlp.gate_proj.weight"].T) * (n2 @ P[p + "mlp.up_proj.weight"].T)
            x = x + ff @ P[p + "mlp.down_proj.weight"].T
        x = rms_norm(x, P["model.norm.weight"], cfg.norm_eps)
        return x @ P["lm_head.weight"].T

    def loss(self, logits, targets):
        """Sum of token cross-entropies over the valid targets, divided by their count."""
        v = logits.shape[-1]
        n_valid = int((targets != IGNORE_INDEX).sum())
        ce = F.cross_entropy(logits.reshape(-1, v), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                             reduction="sum")
        return ce / n_valid


def lr_factor(c, total, warmup_steps, decay_ratio, decay_type, min_lr_factor):
    """TorchTitan's warmup-stable-decay multiplier for the 0-based scheduler count c."""
    warmup = min(warmup_steps, total)
    if decay_ratio is None:
        decay = total - warmup
    else:
        decay = min(round(total * decay_ratio), total - warmup)
    stable = total + 1 - warmup - decay
    if c < warmup:
        return (c + 1) / warmup
    if c < warmup + stable:
        return 1.0
    p = (c + 1 - warmup - stable) / decay
    if decay_type == "linear":
        g = 1 - p
    elif decay_type == "sqrt":
        g = 1 - math.sqrt(p)
    else:
        g = 0.5 * (1 + math.cos(math.pi * p))
    return min_lr_factor + (1 - min_lr_factor) * g
