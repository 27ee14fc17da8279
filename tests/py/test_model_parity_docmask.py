#!/usr/bin/env python3
"""Document-masked Llama 3 (TorchTitan's block_causal flavors) against the independent
PyTorch Llama (tests/py/llama3_ref.py) with the mask written out explicitly.

The machinery is tests/py/test_model_parity.py's (imported); the batches carry document
ids as the loader's dl_next_docs makes them: several documents a sequence, one of a
single token, boundaries at the row start and mid-row, rows of one whole document.

1. debugmodel_flex_attn, one batch: logits, loss and every parameter's gradient within
   the model-parity gates (loss 1e-5, logits and gradients 1e-4 relative to the largest).
2. debugmodel (causal) with RoPE positions reset at document boundaries
   (model.reset_positions_at_document_boundaries), within the same gates. Under
   block_causal the reset changes only rounding (RoPE is relative and query and key share
   a document), so it is checked where it changes the model: with the causal mask, and
   with wq and wk scaled by 8 so that attention is sharp enough for positions to show
   (the reference's logits with and without the reset must differ by over 1e-2).
3. debugmodel_flex_attn, 6 training steps of the trainer itself (documents in every
   batch) against the reference with torch.optim.AdamW: every step's loss within 1e-5
   (the model-parity gate).
4. the mask matters: one batch's block_causal logits differ from its causal ones by more
   than 1e-2 of the largest, while one document a row gives the reference's causal
   logits within 1e-4.
Exits non-zero on any failure.
"""
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama3_ref as ref  # noqa: E402
import test_model_parity as mp  # noqa: E402  (loads libtetra; runs no test)


def make_docs(gen, b, t):
    """[b, t] document ids: row 0 random lengths (one of them a single token), the last
    row one document, the others random; ids rise by one per document."""
    docs = torch.zeros(b, t, dtype=torch.int64)
    for r in range(b - 1 if b > 1 else b):
        pos, d = 0, 0
        while pos < t:
            n = 1 if (r == 0 and d == 1) else int(torch.randint(1, max(2, t // 3), (1,), generator=gen))
            docs[r, pos:pos + n] = d
            pos, d = pos + n, d + 1
    return docs


capi_set = mp.sig("llama3_capi_set", mp.c_int, mp.c_void, mp.c_char_p, mp.c_void)


def reset_positions_case(cfg, tmp, seed):
    tm = mp.Tetra("debugmodel", 128)
    mp.capi_init(tm.h, seed)
    for n in tm.names:  # sharper attention: positions matter
        if n.endswith("attention.wq.weight") or n.endswith("attention.wk.weight"):
            w = tm.get(n) * 8.0
            assert capi_set(tm.h, n.encode(), w.data_ptr()) == 0
    mp.capi_reset_positions(tm.h, 1)
    model = mp.compare_one_batch("reset_positions", tm, cfg, tmp, b=2, t=128, seed=3, make_docs=make_docs,
                                 reset_positions=True, block_causal=False)
    gen = torch.Generator().manual_seed(3)  # the batch compare_one_batch drew
    inputs, _ = mp.make_batch(gen, 2, 128, cfg.vocab_size)
    docs = make_docs(gen, 2, 128)
    with torch.no_grad():
        e = mp.rel_err(model.forward(inputs, docs, True, False), model.forward(inputs))
    print(f"  reference logits with and without the reset: max rel {e:.2e}")
    mp.check(e > 1e-2, f"resetting the positions changes the reference's logits (max rel {e:.3e})")


def causal_effect(tm, cfg, tmp):
    """The same weights and batch with and without documents: the logits must differ by far
    more than the parity gate, and one document a row must be the causal model."""
    gen = torch.Generator().manual_seed(5)
    inputs, targets = mp.make_batch(gen, 2, 64, cfg.vocab_size)
    docs = make_docs(gen, 2, 64)
    one = torch.zeros_like(docs)  # a single document a row: the causal mask
    _, z_doc = tm.forward_backward(inputs, targets, want_logits=True, docs=docs)
    _, z_one = tm.forward_backward(inputs, targets, want_logits=True, docs=one)
    model = ref.Llama3.from_safetensors(cfg, os.path.join(tmp, "flex_model.safetensors"))
    z_causal = model.forward(inputs).detach()
    e_doc, e_one = mp.rel_err(z_doc, z_one), mp.rel_err(z_one, z_causal)
    print(f"\nlogits: block_causal vs one document a row max rel {e_doc:.2e}; one document a row vs the "
          f"reference's causal model {e_one:.2e}")
    mp.check(e_doc > 1e-2, f"the document mask changes the logits (max rel {e_doc:.3e})")
    mp.check(e_one <= 1e-4, f"one document a row is the causal model (max rel {e_one:.3e})")


def main():
    seed = 20240601
    with tempfile.TemporaryDirectory() as tmp:
        tm = mp.Tetra("debugmodel_flex_attn", 128)
        mp.capi_init(tm.h, seed)
        cfg = mp.make_config(tm, n_heads=16, n_kv_heads=16)

        t = time.time()
        mp.compare_one_batch("flex", tm, cfg, tmp, b=3, t=128, seed=1, make_docs=make_docs)
        print(f"[one batch {time.time() - t:.1f} s]")

        t = time.time()
        causal_effect(tm, cfg, tmp)
        print(f"[mask effect {time.time() - t:.1f} s]")

        t = time.time()
        reset_positions_case(cfg, tmp, seed)
        print(f"[reset positions {time.time() - t:.1f} s]")

        t = time.time()
        mp.compare_training(cfg, tmp, b=2, t=64, steps=6, flavor="debugmodel_flex_attn", make_docs=make_docs)
        print(f"[training {time.time() - t:.1f} s]")

    print(f"\ntest_model_parity_docmask: {len(mp.failures)} failures, {time.time() - mp.T0:.1f} s")
    sys.exit(1 if mp.failures else 0)


if __name__ == "__main__":
    main()
