#!/usr/bin/env python3
"""tetra's tokenizer against the reference tokenizers.

Encodes Moby Dick, the State of the Union corpus and tests/assets/torture.txt
with `tetra data encode` and compares every id with

  * Python's tiktoken (an Encoding built from the shipped cl100k_base ranks,
    tests/assets/cl100k_base.tiktoken.xz, and
    from the tokenizer.model of tests/assets/tokenizer), and
  * Hugging Face tokenizers (a tokenizer.json converted here from the same
    cl100k_base ranks, and the tokenizer.json of tests/assets/tokenizer).

Without those packages the ids are checked against the counts and SHA-256
digests in tests/assets/tokenizer_fixtures/expected.json, which hold the
references' ids (regenerate with --update-fixtures; that needs both packages).

Also: Meta's test vector on a Llama-3-sized tiktoken file (cl100k's ranks padded
to 128,000 with unreachable tokens; set TETRA_LLAMA3_TOKENIZER to a real Llama 3
folder or tokenizer.model to check the real one), decoding of arbitrary id
sequences (invalid UTF-8 -> U+FFFD), the trained tokenizer's reproducibility,
and the command line's error paths.
"""
import array
import base64
import hashlib
import json
import lzma
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.environ.get("TETRA_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(os.environ.get("TETRA_BIN") or os.path.join(ROOT, "build", "bin"), "tetra")
SHARED = os.environ.get("TETRA_SHARED") or os.path.join(ROOT, "..", "shared")
ASSETS = os.path.join(ROOT, "tests", "assets")
FIXTURES = os.path.join(ASSETS, "tokenizer_fixtures", "expected.json")
UPDATE = "--update-fixtures" in sys.argv
FULL = UPDATE or os.environ.get("TETRA_TOKENIZER_FULL") == "1"

try:
    import tiktoken
except ImportError:
    tiktoken = None
try:
    import tokenizers
except ImportError:
    tokenizers = None

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
CL100K_SPECIALS = {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                   "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}

n_pass = 0
n_fail = 0
report = []


def check(cond, msg):
    global n_pass, n_fail
    if cond:
        n_pass += 1
    else:
        n_fail += 1
        print("FAIL:", msg, flush=True)
    return cond


def tetra(args, stdin=b""):
    return subprocess.run([BIN, "data"] + args, input=stdin, capture_output=True)


def encode(tok, path=None, text=None, special=False, bos=False, eos=False):
    args = ["encode", "--tokenizer", tok] + (["--input", path] if path else [])
    args += ["--special"] * special + ["--bos"] * bos + ["--eos"] * eos
    r = tetra(args, stdin=text if text is not None else b"")
    if r.returncode != 0:
        raise RuntimeError("tetra data encode failed: " + r.stderr.decode(errors="replace"))
    return [int(x) for x in r.stdout.split()]


def digest(ids):
    a = array.array("I", ids)
    assert a.itemsize == 4
    if sys.byteorder == "big":
        a.byteswap()
    return hashlib.sha256(a.tobytes()).hexdigest()


def compare(label, mine, ref):
    """Exact comparison; records tokens compared and mismatching positions."""
    mism = sum(1 for a, b in zip(mine, ref) if a != b) + abs(len(mine) - len(ref))
    first = next((i for i, (a, b) in enumerate(zip(mine, ref)) if a != b), None)
    if first is None and len(mine) != len(ref):
        first = min(len(mine), len(ref))
    report.append((label, len(ref), mism))
    extra = "" if first is None else f"; first at {first}: tetra {mine[first:first + 6]} ref {ref[first:first + 6]}"
    check(mism == 0, f"{label}: {mism} mismatches in {len(ref)} tokens{extra}")


# ---- fixtures -----------------------------------------------------------------------
fixtures = {}
if os.path.exists(FIXTURES) and not UPDATE:
    with open(FIXTURES) as f:
        fixtures = json.load(f)
new_fixtures = {}


def against_fixture(key, mine):
    if UPDATE:
        return
    fx = fixtures.get(key)
    if not check(fx is not None, f"no fixture {key} in {FIXTURES}"):
        return
    ok = fx["count"] == len(mine) and fx["sha256"] == digest(mine)
    check(ok, f"{key}: tetra's {len(mine)} ids (sha256 {digest(mine)[:16]}) differ from the fixture's "
              f"{fx['count']} ids ({fx['sha256'][:16]})")
    if not any(r[0] == key for r in report):
        report.append((key + " (fixture digest)", fx["count"], 0 if ok else "differs"))


def record(key, ref):
    new_fixtures[key] = {"count": len(ref), "sha256": digest(ref)}


# ---- corpora ------------------------------------------------------------------------
def read_bytes(p):
    with open(p, "rb") as f:
        return f.read()


tmp = tempfile.TemporaryDirectory(prefix="tetra-tok-")
TMP = tmp.name
corpora = {}  # name -> path of the UTF-8 file
moby = os.path.join(ASSETS, "moby_dick.txt")  # the sample corpus (= shared/data/moby_dick.txt)
if not os.path.exists(moby):
    moby = os.path.join(SHARED, "data", "moby_dick.txt")
if os.path.exists(moby):
    corpora["moby_dick"] = moby
# the State of the Union corpus ships as tests/assets/sotu.tar.xz (233 public-domain
# addresses): the addresses in file-name (= date) order, a blank line between them
with tarfile.open(os.path.join(ASSETS, "sotu.tar.xz")) as tf:
    sotu_members = sorted((m for m in tf.getmembers() if m.isfile() and m.name.endswith(".txt")),
                          key=lambda m: m.name)
    sotu_texts = [tf.extractfile(m).read() for m in sotu_members]
if len(sotu_texts) != 233:
    sys.exit(f"FAIL tests/assets/sotu.tar.xz holds {len(sotu_texts)} addresses, not 233")
corpora["sotu"] = os.path.join(TMP, "sotu.txt")
with open(corpora["sotu"], "wb") as f:
    f.write(b"\n\n".join(sotu_texts))
corpora["torture"] = os.path.join(ASSETS, "torture.txt")
if "moby_dick" not in corpora:
    sys.exit(f"FAIL {moby} is missing")


def text_of(name):
    return read_bytes(corpora[name]).decode("utf-8")


# ---- reference tokenizers -------------------------------------------------------------
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B2U = bytes_to_unicode()


def bl(b):
    return "".join(B2U[x] for x in b)


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def hf_json_from_ranks(ranks, specials, path):
    """tokenizer.json for tiktoken ranks, as transformers' TikTokenConverter
    writes it (every split of a token into two tokens is a merge, ordered by the
    token's rank). Hugging Face gives an added token that is not in model.vocab
    the id len(model.vocab) (then +1, ...), whatever id the file declares; so
    that cl100k's specials keep their ids, they are also entered in model.vocab,
    and unassigned ids get filler tokens that valid UTF-8 never forms."""
    vocab = {bl(t): r for t, r in ranks.items()}
    for c, i in specials.items():
        vocab[bl(c.encode())] = i
    used = set(vocab.values())
    for i in range(max(used)):
        if i not in used:
            vocab[bl(b"\xf8\xf9" + i.to_bytes(4, "big"))] = i
    merges = []
    for tok, r in sorted(ranks.items(), key=lambda kv: kv[1]):
        local = []
        for i in range(1, len(tok)):
            left, right = tok[:i], tok[i:]
            if left in ranks and right in ranks:
                local.append((ranks[left], ranks[right], left, right))
        local.sort()
        merges += [bl(a) + " " + bl(b) for _, _, a, b in local]
    j = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for c, i in sorted(specials.items(), key=lambda x: x[1])],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)


def tiktoken_encoding(name, ranks, specials):
    return tiktoken.Encoding(name=name, pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def run_encoding_checks(label, tok_path, ref_encode, specials_always, ref_skip=()):
    """Every corpus through tetra and, when present, the reference (except for
    the corpora in ref_skip, which are checked against the fixture only unless
    TETRA_TOKENIZER_FULL=1 or --update-fixtures)."""
    for name in corpora:
        t0 = time.time()
        mine = encode(tok_path, corpora[name], special=specials_always)
        dt_mine = time.time() - t0
        key = f"{label}/{name}"
        if ref_encode is not None and (name not in ref_skip or FULL):
            t0 = time.time()
            ref = ref_encode(text_of(name))
            print(f"  {key}: {len(ref)} tokens (tetra incl. start-up {dt_mine:.2f} s, reference {time.time() - t0:.2f} s)",
                  flush=True)
            compare(key, mine, ref)
            record(key, ref)
        against_fixture(key, mine)


# ---- 1. command line basics -------------------------------------------------------
def test_cli_help():
    r = tetra(["--help"])
    check(r.returncode == 0 and b"train-tokenizer" in r.stdout and b"prepare" in r.stdout, "tetra data --help")
    for sub in ("encode", "decode", "train-tokenizer"):
        r = tetra([sub, "--help"])
        check(r.returncode == 0 and b"usage: tetra data " + sub.encode() in r.stdout, f"tetra data {sub} --help")
    r = tetra(["frobnicate"])
    check(r.returncode == 2 and b"unknown command" in r.stderr, "unknown subcommand exits 2")


# ---- 2. cl100k_base through its tiktoken file ----------------------------------------
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


def cl100k_ranks_file():
    """The shipped ranks (tests/assets/cl100k_base.tiktoken.xz) unpacked into TMP, checked
    against the hash tiktoken expects of cl100k_base."""
    data = lzma.open(os.path.join(ASSETS, "cl100k_base.tiktoken.xz")).read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != CL100K_SHA256:
        sys.exit(f"FAIL tests/assets/cl100k_base.tiktoken.xz unpacks to sha256 {digest}, not {CL100K_SHA256}")
    path = os.path.join(TMP, "cl100k_base.tiktoken")
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_cl100k(cl100k):
    vectors = [("This is a test sentence.", [2028, 374, 264, 1296, 11914, 13]), ("Hello world!", [9906, 1917, 0]),
               ("\n\n", [271]), ("user", [882]), ("system", [9125]), ("assistant", [78191])]
    for text, want in vectors:
        got = encode(cl100k, text=text.encode())
        check(got == want, f"cl100k {text!r}: {got} != {want}")
    check(encode(cl100k, text=b"a", eos=True) == [64, 100257], "cl100k --eos appends <|endoftext|>")
    r = tetra(["encode", "--tokenizer", cl100k, "--bos"], b"a")
    check(r.returncode == 1 and b"no BOS" in r.stderr, "cl100k has no BOS: --bos is an error")
    check(encode(cl100k, text=b"<|endoftext|>", special=True) == [100257], "special token text with --special")
    check(len(encode(cl100k, text=b"<|endoftext|>")) > 1, "special token text is ordinary text by default")
    ranks = load_ranks(cl100k)
    enc = tiktoken_encoding("cl100k_local", ranks, CL100K_SPECIALS) if tiktoken else None
    run_encoding_checks("cl100k_tiktoken", cl100k, enc.encode_ordinary if enc else None, False)
    # the torture text with special tokens recognised
    mine = encode(cl100k, corpora["torture"], special=True)
    if enc:
        ref = enc.encode(text_of("torture"), allowed_special="all")
        compare("cl100k_tiktoken/torture+special", mine, ref)
        record("cl100k_tiktoken/torture+special", ref)
    against_fixture("cl100k_tiktoken/torture+special", mine)
    # decode(encode(x)) == x
    for name in ("torture", "moby_dick"):
        if name in corpora:
            ids = encode(cl100k, corpora[name])
            r = tetra(["decode", "--tokenizer", cl100k], " ".join(map(str, ids)).encode())
            check(r.returncode == 0 and r.stdout == read_bytes(corpora[name]), f"decode(encode({name})) is not {name}")
    test_decode_random(cl100k, ranks, CL100K_SPECIALS, enc, None)
    return ranks


def test_decode_random(tok, ranks, specials, enc, hf):
    """Arbitrary id sequences: the bytes of the tokens joined, invalid UTF-8
    replaced by U+FFFD per maximal ill-formed subsequence (Python's rule, also
    Hugging Face's and tiktoken's)."""
    by_id = {r: t for t, r in ranks.items()}
    for c, i in specials.items():
        by_id[i] = c.encode()
    ids_all = sorted(by_id)
    broken = [i for i in ids_all if not _valid_utf8(by_id[i])]
    rng = random.Random(1234)
    seq = []
    for _ in range(6000):
        seq.append(rng.choice(broken) if rng.random() < 0.5 and broken else rng.choice(ids_all))
    want = b"".join(by_id[i] for i in seq).decode("utf-8", errors="replace")
    r = tetra(["decode", "--tokenizer", tok], " ".join(map(str, seq)).encode())
    got = r.stdout.decode("utf-8")
    check(r.returncode == 0 and got == want, f"decode of {len(seq)} random ids ({tok}) differs from Python's")
    if enc is not None:
        check(got == enc.decode(seq, errors="replace"), f"decode of random ids differs from tiktoken ({tok})")
    if hf is not None:
        check(got == hf.decode(seq, skip_special_tokens=False), f"decode of random ids differs from HF ({tok})")


def _valid_utf8(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# ---- 3. cl100k_base as a Hugging Face tokenizer.json --------------------------------------
def test_cl100k_hf(ranks):
    d = os.path.join(TMP, "cl100k_hf")
    hf_json_from_ranks(ranks, CL100K_SPECIALS, d)
    hf = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json")) if tokenizers else None
    if hf is not None:
        check(hf.token_to_id("<|endofprompt|>") == 100276, "HF kept the declared special ids")
    # Hugging Face recognises added tokens in any text, so tetra runs with --special
    run_encoding_checks("cl100k_hf", d, (lambda s: hf.encode(s, add_special_tokens=False).ids) if hf else None, True)
    test_decode_random(d, ranks, CL100K_SPECIALS, None, hf)
    # merges written as ["a", "b"] pairs (newer files) load the same
    with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    j["model"]["merges"] = [m.split(" ") for m in j["model"]["merges"]]
    d2 = os.path.join(TMP, "cl100k_hf_pairs")
    os.makedirs(d2)
    with open(os.path.join(d2, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    check(encode(d2, corpora["torture"], special=True) == encode(d, corpora["torture"], special=True),
          "merges as pairs encode like merges as strings")


# ---- 4. a Llama-3-sized tiktoken file -------------------------------------------------------
def test_llama3_sized(ranks):
    d = os.path.join(TMP, "llama3_like")
    os.makedirs(d)
    with open(os.path.join(d, "tokenizer.model"), "w") as f:
        for t, r in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(t).decode()} {r}\n")
        for r in range(len(ranks), 128000):  # never formed from valid UTF-8
            filler = base64.b64encode(b"\xf8\xf9" + r.to_bytes(4, "big")).decode()
            f.write(f"{filler} {r}\n")
    got = encode(d, text=b"This is a test sentence.", bos=True, eos=True)
    check(got == [128000, 2028, 374, 264, 1296, 11914, 13, 128001], f"Meta's test vector: {got}")
    got = encode(d, text=b"Hello world!", bos=True, eos=True)
    check(got == [128000, 9906, 1917, 0, 128001], f"Hello world! with BOS and EOS: {got}")
    got = encode(d, text=b"<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", special=True)
    check(got == [128006, 882, 128007, 271, 6151, 128009], f"Llama 3 chat specials: {got}")
    r = tetra(["decode", "--tokenizer", d], b"128255 128010")
    check(r.returncode == 0 and r.stdout == b"<|reserved_special_token_247|><|python_tag|>", "Llama 3.1 special names")
    r = tetra(["decode", "--tokenizer", d], b"128256")
    check(r.returncode == 1 and b"128256" in r.stderr, "id 128256 is out of range")


def test_real_llama3():
    path = os.environ.get("TETRA_LLAMA3_TOKENIZER")
    if not path:
        print("note: Meta's own Llama 3 tokenizer file is checked only when TETRA_LLAMA3_TOKENIZER names it "
              "(it may not be redistributed); cl100k_base and the Llama-3-sized file above run the same code "
              "(docs/tokenizer.md)")
        return
    check(encode(path, text=b"This is a test sentence.", bos=True, eos=True) ==
          [128000, 2028, 374, 264, 1296, 11914, 13, 128001], "Meta's test vector on the real Llama 3 tokenizer")
    for text, want in [("\n\n", [271]), ("user", [882]), ("system", [9125]), ("assistant", [78191])]:
        check(encode(path, text=text.encode()) == want, f"Llama 3 {text!r}")
    if "moby_dick" in corpora:
        check(len(encode(path, corpora["moby_dick"])) == 298553, "Moby Dick is 298,553 Llama 3 tokens")


# ---- 5. the shipped tokenizer ---------------------------------------------------------------
def test_trained():
    d = os.path.join(ASSETS, "tokenizer")
    model = os.path.join(d, "tokenizer.model")
    with open(os.path.join(d, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    specials = {v["content"]: int(k) for k, v in cfg["added_tokens_decoder"].items()}
    ranks = load_ranks(model)
    check(len(ranks) + len(specials) == 2048, "tests/assets/tokenizer has 2048 ids")
    plain = encode(d, text=b"Call me Ishmael.")
    both = encode(d, text=b"Call me Ishmael.", bos=True, eos=True)
    check(both == [specials["<|begin_of_text|>"]] + plain + [specials["<|end_of_text|>"]], "trained BOS/EOS")
    hf = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json")) if tokenizers else None
    enc = tiktoken_encoding("trained", ranks, specials) if tiktoken else None
    if hf is not None:
        check(hf.get_vocab_size() == 2048, f"HF sees {hf.get_vocab_size()} ids in the trained tokenizer.json")
    # (Hugging Face needs ~10 s for SOTU; cl100k_hf/sotu already runs it on the same code path)
    run_encoding_checks("trained_hf", d, (lambda s: hf.encode(s, add_special_tokens=False).ids) if hf else None, True,
                        ref_skip=("sotu",))
    run_encoding_checks("trained_tiktoken", model, enc.encode_ordinary if enc else None, False)
    # a GPT-2 style tokenizer.json: ByteLevel with its own regex, merges applied
    # without the whole-piece shortcut (ignore_merges false)
    with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    j["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    j["model"]["ignore_merges"] = False
    g = os.path.join(TMP, "gpt2_style")
    os.makedirs(g)
    with open(os.path.join(g, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    hf2 = tokenizers.Tokenizer.from_file(os.path.join(g, "tokenizer.json")) if tokenizers else None
    run_encoding_checks("gpt2_style_hf", g, (lambda s: hf2.encode(s, add_special_tokens=False).ids) if hf2 else None,
                        True, ref_skip=("sotu",))
    # both files are the same tokenizer
    check(encode(d, corpora["torture"]) == encode(model, corpora["torture"]), "trained: tokenizer.json and "
          "tokenizer.model encode the torture text alike")
    test_decode_random(d, ranks, specials, enc, hf)
    # the README's command reproduces the files byte for byte
    out = os.path.join(TMP, "retrained")
    r = tetra(["train-tokenizer", "--input", moby, "--vocab-size", "2048", "--output", out, "--quiet"])
    check(r.returncode == 0, "train-tokenizer failed: " + r.stderr.decode(errors="replace"))
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        check(os.path.exists(os.path.join(out, name)) and
              read_bytes(os.path.join(out, name)) == read_bytes(os.path.join(d, name)),
              f"retraining does not reproduce tests/assets/tokenizer/{name}")
    m = [l for l in r.stderr.decode().splitlines() if "bytes/token" in l]
    if m:
        print("  " + m[-1].strip())


# ---- 6. bad input --------------------------------------------------------------------------
def test_errors(cl100k):
    d = os.path.join(ASSETS, "tokenizer")
    r = tetra(["encode", "--tokenizer", d], b"")
    check(r.returncode == 1 and b"empty input" in r.stderr, "encode of empty input is an error")
    r = tetra(["decode", "--tokenizer", d], b"  \n")
    check(r.returncode == 1 and b"empty input" in r.stderr, "decode of empty input is an error")
    r = tetra(["encode", "--tokenizer", d], b"abc\xff\xfedef")
    check(r.returncode == 1 and b"invalid UTF-8 at byte offset 3" in r.stderr, "invalid UTF-8 names its offset")
    r = tetra(["decode", "--tokenizer", d], b"1 2 99999")
    check(r.returncode == 1 and b"99999" in r.stderr, "decode of an unknown id is an error")
    r = tetra(["decode", "--tokenizer", d], b"1 two")
    check(r.returncode == 1 and b"expected a token id" in r.stderr, "decode of a non-number is an error")
    r = tetra(["encode", "--tokenizer", os.path.join(TMP, "missing")], b"x")
    check(r.returncode == 1 and b"missing" in r.stderr, "a missing tokenizer is an error")
    r = tetra(["encode"], b"x")
    check(r.returncode == 1 and b"--tokenizer" in r.stderr, "encode without --tokenizer")
    bad = os.path.join(TMP, "bad_model")
    os.makedirs(bad)
    with open(os.path.join(bad, "tokenizer.model"), "w") as f:
        f.write("IQ== 0\nIg== 1\n!!!! 2\n")
    r = tetra(["encode", "--tokenizer", bad], b"x")
    check(r.returncode == 1 and b"tokenizer.model:3:" in r.stderr, "a bad tokenizer.model line is named")
    with open(os.path.join(bad, "tokenizer.json"), "w") as f:
        f.write('{"model": {"type": "BPE",\n "vocab": {"a": 0,}}}')
    r = tetra(["encode", "--tokenizer", bad], b"x")
    check(r.returncode == 1 and b"tokenizer.json:2:" in r.stderr, "a bad tokenizer.json names its line")
    # train-tokenizer: refuse to overwrite; leave nothing behind on failure
    r = tetra(["train-tokenizer", "--input", corpora["torture"], "--vocab-size", "600", "--output", bad])
    check(r.returncode == 1 and b"refusing to overwrite" in r.stderr, "train-tokenizer refuses an existing folder")
    badtxt = os.path.join(TMP, "bad.txt")
    with open(badtxt, "wb") as f:
        f.write(b"fine text\n\xc3\x28 oops")
    empty = os.path.join(TMP, "empty.txt")
    open(empty, "wb").close()
    tiny = os.path.join(TMP, "tiny.txt")
    with open(tiny, "wb") as f:
        f.write(b"a tiny text")
    cases = [([badtxt], "1000", b"invalid UTF-8 at byte offset 10"), ([empty], "1000", b"empty"),
             ([tiny], "5000", b"supports only"), ([tiny], "100", b"too small"),
             ([os.path.join(TMP, "nope.txt")], "1000", b"nope.txt")]
    for inputs, vs, msg in cases:
        out = os.path.join(TMP, "out_" + vs)
        r = tetra(["train-tokenizer", "--input"] + inputs + ["--vocab-size", vs, "--output", out, "--quiet"])
        left = [p for p in os.listdir(TMP) if p.startswith("out_")]
        check(r.returncode == 1 and msg in r.stderr and not left,
              f"train-tokenizer {inputs[0]} {vs}: rc {r.returncode}, {r.stderr[-200:]!r}, left behind {left}")


def main():
    t_start = time.time()
    if not os.path.exists(BIN):
        print(f"FAIL: {BIN} not found (build tetra first)")
        return 1
    print(f"references: tiktoken {getattr(tiktoken, '__version__', 'absent')}, "
          f"tokenizers {getattr(tokenizers, '__version__', 'absent')}", flush=True)
    if UPDATE and not (tiktoken and tokenizers):
        print("FAIL: --update-fixtures needs both tiktoken and tokenizers")
        return 1
    test_cli_help()
    cl100k = cl100k_ranks_file()
    ranks = test_cl100k(cl100k)
    test_cl100k_hf(ranks)
    test_llama3_sized(ranks)
    test_real_llama3()
    test_trained()
    test_errors(cl100k)
    if UPDATE:
        os.makedirs(os.path.dirname(FIXTURES), exist_ok=True)
        with open(FIXTURES, "w") as f:
            json.dump(new_fixtures, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {len(new_fixtures)} fixtures to {FIXTURES}")
    print("parity (tokens compared, mismatches):")
    for label, n, m in report:
        print(f"  {label:48s} {n:9d} {m}")
    print(f"{n_pass} passed, {n_fail} failed ({time.time() - t_start:.1f} s)")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
