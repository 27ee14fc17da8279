#!/usr/bin/env python3
"""megatron_ref.py — Megatron-LM indexed datasets for tests/sh/test_data_megatron.sh.

  megatron_ref.py write PREFIX CORPUS DTYPE    PREFIX.bin/.idx from the "train" split of a
                                               corpus prepared by `tetra data prepare`

A small writer from the published format (Megatron-LM, megatron/core/datasets/
indexed_dataset.py: the "MMIDIDX\\0\\0" header, version 1, a dtype code, the sequence and
document counts, int32 sequence lengths, int64 byte pointers, int64 document indices),
not Megatron's code. Each document of the corpus (BOS ... EOS) becomes one sequence and
one document, so the .bin holds exactly the corpus's token stream.
"""
import array
import json
import os
import struct
import sys

DTYPES = {"uint8": (1, "B"), "int8": (2, "b"), "int16": (3, "h"), "int32": (4, "i"), "int64": (5, "q"),
          "float64": (6, "d"), "float32": (7, "f"), "uint16": (8, "H")}


def corpus_tokens(corpus):
    ix = json.load(open(os.path.join(corpus, "index.json")))
    code = "H" if ix["token_bytes"] == 2 else "I"
    toks = array.array(code)
    for s in ix["splits"]["train"]["shards"]:
        b = open(os.path.join(corpus, s["file"]), "rb").read()
        toks.frombytes(b[64:])
    return toks, ix["bos_id"]


def documents(toks, bos):
    """Cut the stream before every BOS: one document each."""
    starts = [i for i, t in enumerate(toks) if t == bos] or [0]
    if starts[0] != 0:
        starts.insert(0, 0)
    return [(a, b) for a, b in zip(starts, starts[1:] + [len(toks)])]


def write(prefix, toks, docs, dtype):
    code, fmt = DTYPES[dtype]
    arr = array.array(fmt, toks)
    with open(prefix + ".bin", "wb") as f:
        f.write(arr.tobytes())
    lengths = [b - a for a, b in docs]
    pointers, at = [], 0
    for n in lengths:  # byte offsets: the sequences back to back
        pointers.append(at)
        at += n * arr.itemsize
    doc_index = list(range(len(docs) + 1))  # one sequence per document
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_index)))
        f.write(array.array("i", lengths).tobytes())
        f.write(array.array("q", pointers).tobytes())
        f.write(array.array("q", doc_index).tobytes())


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "write":
        toks, bos = corpus_tokens(sys.argv[3])
        docs = documents(toks, bos)
        write(sys.argv[2], toks, docs, sys.argv[4])
        print("%s: %d tokens in %d documents, %s" % (sys.argv[2], len(toks), len(docs), sys.argv[4]))
    else:
        sys.exit(__doc__)
