#!/usr/bin/env python3
"""Checkpoints <-> Hugging Face safetensors, checked from outside tetra.

A 2-rank FSDP run of the `tiny` flavor (GQA: 4 heads, 2 KV heads) saves a full
tetra checkpoint at step 2 and, as its last save (last_save_in_hf), HF
safetensors at step 4. Then:

1. the tetra checkpoint is read here independently (metadata.json, the rank
   files, a CRC-32C of every model chunk), assembling every parameter;
2. `tetra checkpoint export --hf` (sharded by a small --max-shard-size) opens
   with the `safetensors` library; the index covers every tensor; config.json
   has the LlamaForCausalLM fields; every tensor equals the checkpoint's after
   the q/k rotary permutation, bit for bit; a bfloat16 export holds the
   round-to-nearest-even values;
3. logits: tetra (ctypes, libtetra.so) with the checkpoint's weights vs the
   independent PyTorch Llama (tests/py/llama3_ref.py) built from the export's
   config.json and weights: max relative difference <= 1e-5;
4. the step-4 last_save_in_hf folder opens with `safetensors` and gives the
   same logits in tetra (loaded through its HF reader) and in the reference;
5. `tetra checkpoint import` of the export gives back the exact float32 values;
   `tetra checkpoint inspect` passes.
Exits non-zero on any failure.
"""
import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama3_ref as ref  # noqa: E402

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
T0 = time.time()
ROOT = os.environ.get("TETRA_ROOT", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.environ.get("TETRA_BUILD", os.path.join(ROOT, "build"))
TETRA = os.path.join(os.environ.get("TETRA_BIN", os.path.join(BUILD, "bin")), "tetra")
lib = ctypes.CDLL(os.path.join(BUILD, "lib", "libtetra.so"))

failures = []


def check(ok, msg):
    if not ok:
        failures.append(msg)
        print("FAIL", msg)
    return ok


def sig(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


c_int, c_double, c_size = ctypes.c_int, ctypes.c_double, ctypes.c_size_t
c_void, c_char_p = ctypes.c_void_p, ctypes.c_char_p
capi_create = sig("llama3_capi_create", c_void, c_char_p, c_int, c_char_p, c_size)
capi_free = sig("llama3_capi_free", None, c_void)
capi_n_params = sig("llama3_capi_n_params", c_int, c_void)
capi_param_name = sig("llama3_capi_param_name", c_char_p, c_void, c_int)
capi_set = sig("llama3_capi_set", c_int, c_void, c_char_p, c_void)
capi_fwd_bwd = sig("llama3_capi_forward_backward", c_double, c_void, c_int, c_int, c_void, c_void, c_void)
capi_load = sig("llama3_capi_load_hf", c_int, c_void, c_char_p, c_char_p, c_size)


# ---------------------------------------------------------------- reading a tetra checkpoint
def crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        t.append(c)
    return t


CRC_T = crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    t = CRC_T
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def read_checkpoint(step_dir, prefix="model/"):
    """{name: float32 tensor} of every tensor under prefix, assembled from the chunks."""
    meta = json.load(open(os.path.join(step_dir, "metadata.json")))
    check(meta["format"] == "tetra-checkpoint" and meta["version"] == 1, "metadata format/version")
    files = [f["name"] for f in meta["files"]]
    out = {}
    for name, t in meta["tensors"].items():
        if not name.startswith(prefix):
            continue
        check(t["dtype"] == "float32", f"{name}: dtype {t['dtype']}")
        shape = t["shape"]
        flat = torch.full((int(torch.tensor(shape).prod()),), float("nan"), dtype=torch.float32)
        for c in t["chunks"]:
            with open(os.path.join(step_dir, files[c["file"]]), "rb") as f:
                f.seek(c["offset"])
                raw = f.read(c["length"])
            check(len(raw) == c["length"], f"{name}: short chunk")
            check(crc32c(raw) == int(c["crc32c"], 16), f"{name}: chunk CRC-32C")
            check(c["box_start"] == [0] * len(shape) and c["box_shape"] == shape, f"{name}: FSDP chunk box")
            vals = torch.tensor(struct.unpack(f"<{c['count']}f", raw), dtype=torch.float32)
            flat[c["start"]:c["start"] + c["count"]] = vals
        check(not torch.isnan(flat).any(), f"{name}: every element held by a chunk")
        out[name[len(prefix):]] = flat.reshape(shape)
    return meta, out


HF_BLOCK = {"attention.wq.weight": "self_attn.q_proj.weight", "attention.wk.weight": "self_attn.k_proj.weight",
            "attention.wv.weight": "self_attn.v_proj.weight", "attention.wo.weight": "self_attn.o_proj.weight",
            "feed_forward.w1.weight": "mlp.gate_proj.weight", "feed_forward.w2.weight": "mlp.down_proj.weight",
            "feed_forward.w3.weight": "mlp.up_proj.weight", "attention_norm.weight": "input_layernorm.weight",
            "ffn_norm.weight": "post_attention_layernorm.weight"}


def hf_name(n):
    if n == "tok_embeddings.weight":
        return "model.embed_tokens.weight"
    if n == "norm.weight":
        return "model.norm.weight"
    if n == "output.weight":
        return "lm_head.weight"
    _, layer, rest = n.split(".", 2)
    return f"model.layers.{layer}.{HF_BLOCK[rest]}"


def to_rotate_half(w, heads):
    """interleaved pairs -> HF rotate-half rows: hf[h hd + t hd/2 + i] = w[h hd + 2i + t]"""
    rows, cols = w.shape
    hd = rows // heads
    return w.reshape(heads, hd // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def run(cmd, env=None, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
    return r


def tetra_logits(flavor, params, inputs, hf_path=None):
    err = ctypes.create_string_buffer(1024)
    h = capi_create(flavor.encode(), inputs.shape[1], err, 1024)
    assert h, err.value.decode()
    try:
        if hf_path:
            assert capi_load(h, hf_path.encode(), err, 1024) == 0, err.value.decode()
        else:
            names = [capi_param_name(h, i).decode() for i in range(capi_n_params(h))]
            check(sorted(names) == sorted(params), "the checkpoint holds exactly the model's parameters")
            for n in names:
                t = params[n].contiguous()
                assert capi_set(h, n.encode(), t.data_ptr()) == 0, n
        b, t = inputs.shape
        inp = inputs.to(torch.int32).contiguous()
        tgt = torch.roll(inp, -1, 1).contiguous()
        v = params["output.weight"].shape[0] if params else 2048
        logits = torch.empty((b, t, v), dtype=torch.float32)
        capi_fwd_bwd(h, b, t, inp.data_ptr(), tgt.data_ptr(), logits.data_ptr())
        return logits
    finally:
        capi_free(h)


def ref_config(cfg):
    rs = cfg["rope_scaling"]
    return ref.Config(dim=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"], n_heads=cfg["num_attention_heads"],
                      n_kv_heads=cfg["num_key_value_heads"], vocab_size=cfg["vocab_size"],
                      ffn_hidden=cfg["intermediate_size"], norm_eps=cfg["rms_norm_eps"], rope_theta=cfg["rope_theta"],
                      rope_factor=rs["factor"], rope_low_freq_factor=rs["low_freq_factor"],
                      rope_high_freq_factor=rs["high_freq_factor"],
                      rope_original_max_pos=rs["original_max_position_embeddings"])


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max()).item()


def load_hf_folder(d):
    """{name: tensor} of an HF folder (index or single file), opened with the safetensors library."""
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    out = {}
    for f in files:
        with safe_open(os.path.join(d, f), framework="pt") as sf:
            for k in sf.keys():
                check(k not in out, f"{k} in two shards")
                out[k] = sf.get_tensor(k)
    return out


def main():
    tmp = tempfile.mkdtemp(prefix="tetra_ckpt_hf_")
    try:
        env = dict(os.environ)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_btl_vader_single_copy_mechanism=env.get("OMPI_MCA_btl_vader_single_copy_mechanism", "none"))
        env.pop("OMP_NUM_THREADS", None)
        dump = os.path.join(tmp, "run")
        cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", TETRA, "train",
               "--job.config_file", os.path.join(ROOT, "configs", "debug_model.toml"), "--model.flavor", "tiny",
               "--training.seq_len", "64", "--training.local_batch_size", "2", "--training.steps", "4",
               "--metrics.peak_flops", "1e11", "--metrics.disable_color_printing", "--job.dump_folder", dump,
               "--checkpoint.enable", "--checkpoint.interval", "2", "--checkpoint.last_save_in_hf",
               "--checkpoint.export_dtype", "float32"]
        r = run(cmd, env=env)
        if not check(r.returncode == 0, "training run"):
            return
        ck = os.path.join(dump, "checkpoint")
        step2, step4 = os.path.join(ck, "step-2"), os.path.join(ck, "step-4")

        # 1. the tetra checkpoint, read independently
        meta, params = read_checkpoint(step2)
        check(meta["parallelism"]["dp_shard"] == 2 and len(meta["files"]) == 2, "saved by 2 FSDP ranks")
        check(meta["train_state"]["step"] == 2 and meta["optimizer"]["step"] == 2, "train state step 2")
        model = meta["model"]
        print(f"read step-2: {len(params)} parameters, {sum(p.numel() for p in params.values()):,} elements, "
              f"every chunk's CRC-32C checked [{time.time() - T0:.1f} s]")

        # 2. export, sharded
        out = os.path.join(tmp, "hf")
        r = run([TETRA, "checkpoint", "export", "--hf", out, "--max-shard-size", "200KB", step2])
        check(r.returncode == 0, "export")
        index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
        shards = sorted(set(index["weight_map"].values()))
        check(len(shards) > 1 and all(s.startswith("model-") and s.endswith(f"-of-{len(shards):05d}.safetensors")
                                      for s in shards), f"sharded into model-0000X-of-0000Y files: {shards}")
        hf = load_hf_folder(out)
        check(set(hf) == {hf_name(n) for n in params}, "the index and the shards hold exactly the HF names")
        check(index["metadata"]["total_size"] == sum(t.numel() * 4 for t in hf.values()), "index total_size")
        cfg = json.load(open(os.path.join(out, "config.json")))
        want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": model["dim"],
                "intermediate_size": model["ffn_hidden"], "num_attention_heads": 4, "num_key_value_heads": 2,
                "num_hidden_layers": model["n_layers"], "vocab_size": 2048, "tie_word_embeddings": False,
                "torch_dtype": "float32", "max_position_embeddings": 64}
        for k, v in want.items():
            check(cfg.get(k) == v, f"config.json {k} = {cfg.get(k)!r}, want {v!r}")
        check(cfg["rope_scaling"]["rope_type"] == "llama3" and cfg["rope_scaling"]["factor"] == 8.0, "rope_scaling")
        exact = True
        for n, w in params.items():
            heads = 4 if n.endswith("wq.weight") else 2 if n.endswith("wk.weight") else 0
            expect = to_rotate_half(w, heads) if heads else w
            exact &= hf[hf_name(n)].dtype == torch.float32 and torch.equal(hf[hf_name(n)], expect)
        check(exact, "every exported tensor equals the checkpoint's (q/k permuted) bit for bit")

        # 3. logits: tetra with the checkpoint weights vs the reference on the export
        gen = torch.Generator().manual_seed(0)
        inputs = torch.randint(0, 2048, (2, 48), generator=gen)
        lt = tetra_logits("tiny", params, inputs)
        rm = ref.Llama3(ref_config(cfg), hf)
        with torch.no_grad():
            lr_ = rm.forward(inputs.long())
        e = rel_err(lt, lr_)
        check(e <= 1e-5, f"logits: tetra (checkpoint) vs reference (HF export): {e:.2e}")
        print(f"export: {len(shards)} shards + index + config.json; logits rel diff {e:.2e} (<= 1e-5)")

        # bfloat16 export
        out16 = os.path.join(tmp, "hf_bf16")
        r = run([TETRA, "checkpoint", "export", "--hf", out16, "--dtype", "bfloat16", ck])  # newest complete: step-2
        check(r.returncode == 0, "bf16 export")
        h16 = load_file(os.path.join(out16, "model.safetensors"))
        ok = all(h16[hf_name(n)].dtype == torch.bfloat16 for n in params)
        q = params["layers.1.attention.wq.weight"]
        ok &= torch.equal(h16["model.layers.1.self_attn.q_proj.weight"], to_rotate_half(q, 4).to(torch.bfloat16))
        ok &= torch.equal(h16["lm_head.weight"], params["output.weight"].to(torch.bfloat16))
        check(ok, "bfloat16 export = round-to-nearest-even of the float32 values")
        check(json.load(open(os.path.join(out16, "config.json")))["torch_dtype"] == "bfloat16", "bf16 torch_dtype")

        # 4. the last_save_in_hf folder
        check(not os.path.exists(os.path.join(step4, "metadata.json")),
              "step-4 is an HF export, not a tetra checkpoint")
        h4 = load_hf_folder(step4)
        cfg4 = json.load(open(os.path.join(step4, "config.json")))
        check(set(h4) == set(hf), "step-4 holds every HF tensor")
        lt4 = tetra_logits("tiny", {}, inputs, hf_path=step4)
        with torch.no_grad():
            lr4 = ref.Llama3(ref_config(cfg4), h4).forward(inputs.long())
        e4 = rel_err(lt4, lr4)
        check(e4 <= 1e-5, f"last_save_in_hf logits: {e4:.2e}")
        check(not torch.equal(h4["lm_head.weight"], hf["lm_head.weight"]), "step-4 weights moved on from step-2")
        print(f"last_save_in_hf: step-4 opens with safetensors; logits rel diff {e4:.2e}")

        # 5. import and inspect
        imp = os.path.join(tmp, "imported")
        r = run([TETRA, "checkpoint", "import", "--hf", out, imp])
        check(r.returncode == 0, "import")
        _, back = read_checkpoint(os.path.join(imp, "step-0"))
        check(set(back) == set(params) and all(torch.equal(back[n], params[n]) for n in params),
              "import of the export gives back the checkpoint's exact values")
        r = run([TETRA, "checkpoint", "inspect", ck])
        check(r.returncode == 0 and "every CRC-32C matches" in r.stdout, "inspect passes")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\ntest_checkpoint_hf: {len(failures)} failures, {time.time() - T0:.1f} s")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
