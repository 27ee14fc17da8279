#!/usr/bin/env bash
# test_data_prepare.sh — `tetra data prepare` end to end, with the shipped tokenizer.
#
# Prepares Moby Dick, a small .jsonl and a folder into a temporary folder and
# checks index.json and the shards (header, BOS/EOS wrapping, val split); the
# output does not depend on --threads nor on the piece size long documents are
# cut into; an existing output is refused and left alone; bad inputs (empty
# file or folder, invalid UTF-8, a bad .jsonl line, an unsupported file, a vocab
# mismatch, a missing tokenizer) exit non-zero with an error naming the file
# (and byte offset or line) and leave no output folder behind.
set -u

ROOT=${TETRA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN=${TETRA_BIN:-$ROOT/build/bin}
TETRA=$BIN/tetra
TOK=$ROOT/tests/assets/tokenizer
MOBY=$ROOT/tests/assets/moby_dick.txt
PY=$(command -v python3 || true)

if [ ! -x "$TETRA" ]; then echo "FAIL: $TETRA is not built"; exit 1; fi
if [ ! -d "$TOK" ]; then echo "FAIL: $TOK is missing"; exit 1; fi
if [ -z "$PY" ]; then echo "FAIL: python3 is needed to read index.json"; exit 1; fi

T=$(mktemp -d "${TMPDIR:-/tmp}/tetra_prepare_XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

prepare() { "$TETRA" data prepare --tokenizer "$TOK" "$@"; }

# expect_fail NAME SUBSTRING OUTPUT -- ARGS...: non-zero exit, SUBSTRING in the
# error, no OUTPUT and no partial folder beside it.
expect_fail() {
    local name=$1 want=$2 out=$3
    shift 4
    local err rc
    err=$("$TETRA" data prepare "$@" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -eq 0 ]; then bad "$name: exit status 0"; return; fi
    case "$err" in
        *"$want"*) ;;
        *) bad "$name: error does not say '$want': $err"; return ;;
    esac
    if [ -e "$out" ]; then bad "$name: $out was left behind"; return; fi
    if ls -a "$(dirname "$out")" | grep -q '\.partial-'; then bad "$name: a partial folder was left behind"; return; fi
    ok "$name (exit $rc): $err"
}

# index_get DIR EXPR: evaluate a Python expression over the parsed index (ix).
index_get() {
    "$PY" -c 'import json,sys; ix=json.load(open(sys.argv[1]+"/index.json")); print(eval(sys.argv[2]))' "$1" "$2"
}

# check_shards DIR: every shard's size matches its header and the index; first token of each split is BOS.
check_shards() {
    "$PY" - "$1" <<'EOF'
import json, os, struct, sys
d = sys.argv[1]
ix = json.load(open(os.path.join(d, "index.json")))
w = ix["token_bytes"]
for name, sp in ix["splits"].items():
    total = 0
    for k, s in enumerate(sp["shards"]):
        p = os.path.join(d, s["file"])
        b = open(p, "rb").read()
        assert b[:8] == b"TTOKSHRD", p
        version, hsize, vocab, width, n, crc = struct.unpack_from("<IIIIQI", b, 8)
        assert (version, hsize, vocab, width) == (1, 64, ix["vocab_size"], w), (p, version, hsize, vocab, width)
        assert n == s["tokens"] and len(b) == 64 + n * w, (p, n, s["tokens"], len(b))
        assert crc == s["crc32c"], p
        fmt = "<%d%s" % (n, "H" if w == 2 else "I")
        ids = struct.unpack_from(fmt, b, 64)
        assert max(ids) < vocab, p
        if k == 0 and ix["bos_id"] >= 0:
            assert ids[0] == ix["bos_id"], (p, ids[:4])
        if k == len(sp["shards"]) - 1 and ix["eos_id"] >= 0:
            assert ids[-1] == ix["eos_id"], (p, ids[-4:])
        total += n
    assert total == sp["tokens"], name
print("shards ok")
EOF
}

# ---- help ---------------------------------------------------------------------
if "$TETRA" data prepare --help | grep -q -- '--val-fraction'; then ok "--help"; else bad "--help"; fi

# ---- Moby Dick: one document, val cut at a paragraph ----------------------------
out=$T/moby
if prepare --input "$MOBY" --output "$out" --val-fraction 0.1 --threads 2 >"$T/moby.log" 2>&1; then
    ok "prepare Moby Dick: $(tr '\n' ' ' <"$T/moby.log")"
else
    bad "prepare Moby Dick: $(cat "$T/moby.log")"
fi
if [ -f "$out/index.json" ] && [ -f "$out/train/shard_00000.bin" ] && [ -f "$out/val/shard_00000.bin" ]; then
    ok "layout: index.json, train/, val/"
else
    bad "layout: $(ls -R "$out" 2>&1)"
fi
r=$(check_shards "$out" 2>&1) && ok "Moby Dick shards: $r" || bad "Moby Dick shards: $r"
docs=$(index_get "$out" 'ix["splits"]["train"]["documents"], ix["splits"]["val"]["documents"], ix["vocab_size"], ix["token_bytes"]')
[ "$docs" = "(1, 1, 2048, 2)" ] && ok "Moby Dick: 1 train + 1 val document, vocab 2048, uint16" || bad "Moby Dick index: $docs"
frac=$(index_get "$out" 'round(ix["splits"]["val"]["tokens"] / (ix["splits"]["val"]["tokens"] + ix["splits"]["train"]["tokens"]), 2)')
"$PY" -c "import sys; sys.exit(0 if 0.07 <= $frac <= 0.13 else 1)" && ok "val fraction of tokens $frac" || bad "val fraction of tokens $frac"

# the same output for 1 thread, and without cutting the document into pieces
prepare --input "$MOBY" --output "$T/moby1" --val-fraction 0.1 --threads 1 --quiet || bad "threads 1"
prepare --input "$MOBY" --output "$T/mobyw" --val-fraction 0.1 --piece-bytes 100000000 --quiet || bad "one piece"
same=1
for f in index.json train/shard_00000.bin val/shard_00000.bin; do
    cmp -s "$out/$f" "$T/moby1/$f" || { same=0; bad "threads 1 vs 2 differ: $f"; }
    cmp -s "$out/$f" "$T/mobyw/$f" || { same=0; bad "pieces vs whole document differ: $f"; }
done
[ $same = 1 ] && ok "identical output for --threads 1/2 and for whole-document encoding"

# small shards: the same token stream, cut into files of 50000 tokens
prepare --input "$MOBY" --output "$T/mobys" --val-fraction 0.1 --shard-tokens 50000 --quiet || bad "shard-tokens"
r=$(check_shards "$T/mobys" 2>&1) && ok "multi-shard: $r ($(ls "$T/mobys/train" | wc -l) train shards)" || bad "multi-shard: $r"
a=$(cat "$out"/train/*.bin | tail -c +65 | md5sum)
b=$("$PY" -c '
import sys, glob, hashlib
h = hashlib.md5()
for p in sorted(glob.glob(sys.argv[1] + "/train/*.bin")): h.update(open(p, "rb").read()[64:])
print(h.hexdigest() + "  -")' "$T/mobys")
[ "$a" = "$b" ] && ok "multi-shard stream equals the single shard" || bad "multi-shard stream differs"

# ---- refuse to overwrite ------------------------------------------------------------
before=$(md5sum "$out/index.json")
if prepare --input "$MOBY" --output "$out" --quiet 2>"$T/ow.err"; then
    bad "overwrote an existing output"
elif grep -q "already exists" "$T/ow.err" && [ "$(md5sum "$out/index.json")" = "$before" ]; then
    ok "refuses to overwrite: $(cat "$T/ow.err")"
else
    bad "overwrite refusal: $(cat "$T/ow.err")"
fi

# ---- jsonl ----------------------------------------------------------------------------
mkdir -p "$T/in"
printf '%s\n' '{"text": "Call me Ishmael.", "id": 1}' '' '{"text": "Caf\u00e9 \u2014 the whale \ud83d\udc0b"}' \
    '{"text": ""}' '{"text": "It is the fourth."}' '{"text": "The last one is held out."}' >"$T/in/docs.jsonl"
if prepare --input "$T/in/docs.jsonl" --output "$T/j" --val-fraction 0.2 >"$T/j.log" 2>&1; then
    ok "prepare jsonl: $(tr '\n' ' ' <"$T/j.log")"
else
    bad "prepare jsonl: $(cat "$T/j.log")"
fi
docs=$(index_get "$T/j" 'ix["splits"]["train"]["documents"], ix["splits"]["val"]["documents"]' 2>&1)
[ "$docs" = "(3, 1)" ] && ok "jsonl: 5 documents, 1 empty skipped, the last held out" || bad "jsonl documents: $docs"
r=$(check_shards "$T/j" 2>&1) && ok "jsonl shards: $r" || bad "jsonl shards: $r"

# ---- compressed: C4's en/*.json.gz and .jsonl.zst give the same shards as the plain file ------------
gzip -c "$T/in/docs.jsonl" >"$T/in/docs.json.gz"
# a second gzip member (files concatenated with cat) is read too
head -c 0 /dev/null | gzip -c >"$T/in/empty_member.gz"
cat "$T/in/docs.json.gz" "$T/in/empty_member.gz" >"$T/in/docs2.json.gz"
zstd -q -c "$T/in/docs.jsonl" >"$T/in/docs.jsonl.zst"
for z in docs.json.gz docs2.json.gz docs.jsonl.zst; do
    out_z="$T/z_${z//./_}"
    if prepare --input "$T/in/$z" --output "$out_z" --val-fraction 0.2 >"$out_z.log" 2>&1; then
        same=1
        for f in "$T/j"/train/* "$T/j"/val/*; do
            cmp -s "$f" "$out_z/${f#"$T/j/"}" || same=0
        done
        [ $same = 1 ] && ok "$z: the same shards as the plain .jsonl" || bad "$z: shards differ from the plain .jsonl"
    else
        bad "prepare $z: $(cat "$out_z.log")"
    fi
done
head -c 60 "$T/in/docs.json.gz" >"$T/in/cut.json.gz"
expect_fail "truncated gzip" "cut.json.gz: truncated gzip data" "$T/oz1" -- \
    --tokenizer "$TOK" --input "$T/in/cut.json.gz" --output "$T/oz1"
head -c 40 "$T/in/docs.jsonl.zst" >"$T/in/cut.jsonl.zst"
expect_fail "truncated zstd" "cut.jsonl.zst: truncated zstd data" "$T/oz2" -- \
    --tokenizer "$TOK" --input "$T/in/cut.jsonl.zst" --output "$T/oz2"
printf 'not gzip at all' >"$T/in/fake.json.gz"
expect_fail "not gzip" "fake.json.gz: not gzip data" "$T/oz3" -- --tokenizer "$TOK" --input "$T/in/fake.json.gz" --output "$T/oz3"

# ---- folder: recursive, sorted, other files ignored ----------------------------------------
mkdir -p "$T/dir/sub"
printf 'A first text document.\n' >"$T/dir/a.txt"
printf '%s\n' '{"text": "jsonl one"}' '{"text": "jsonl two"}' >"$T/dir/sub/b.jsonl"
printf 'not a corpus file\n' >"$T/dir/notes.md"
printf 'hidden\n' >"$T/dir/.hidden.txt"
if prepare --input "$T/dir" --output "$T/d" --val-fraction 0 >"$T/d.log" 2>&1; then
    ok "prepare folder: $(tr '\n' ' ' <"$T/d.log")"
else
    bad "prepare folder: $(cat "$T/d.log")"
fi
docs=$(index_get "$T/d" 'ix["splits"]["train"]["documents"], "val" in ix["splits"]' 2>&1)
[ "$docs" = "(3, False)" ] && ok "folder: 3 documents, no val split" || bad "folder documents: $docs"
grep -q "ignored 1 file" "$T/d.log" && ok "folder: notes.md ignored and reported" || bad "folder: ignored file not reported"

# a nested output folder whose parents do not exist yet
prepare --input "$T/dir" --output "$T/deep/er/out" --quiet && [ -f "$T/deep/er/out/index.json" ] &&
    ok "creates missing parent folders" || bad "nested output"

# ---- bad inputs ---------------------------------------------------------------------------------
: >"$T/in/empty.txt"
expect_fail "empty file" "empty input" "$T/o1" -- --tokenizer "$TOK" --input "$T/in/empty.txt" --output "$T/o1"
mkdir -p "$T/emptydir"
expect_fail "empty folder" "empty input" "$T/o2" -- --tokenizer "$TOK" --input "$T/emptydir" --output "$T/o2"
printf 'hello\377world\n' >"$T/in/bad.txt"
expect_fail "invalid UTF-8" "bad.txt: invalid UTF-8 at byte offset 5" "$T/o3" -- \
    --tokenizer "$TOK" --input "$T/in/bad.txt" --output "$T/o3"
# deep inside a long document (tokenized in pieces): the offset is still the file's
"$PY" -c '
import sys
b = bytearray(open(sys.argv[1], "rb").read()); b[700001] = 0xC0
open(sys.argv[2], "wb").write(b)' "$MOBY" "$T/in/moby_bad.txt"
expect_fail "invalid UTF-8 deep in a file" "moby_bad.txt: invalid UTF-8 at byte offset 700001" "$T/o4" -- \
    --tokenizer "$TOK" --input "$T/in/moby_bad.txt" --output "$T/o4" --val-fraction 0
printf '%s\n' '{"text": "fine"}' '{"text": "also fine"}' '{"text": oops}' >"$T/in/badline.jsonl"
expect_fail "bad jsonl line" "badline.jsonl:3: invalid JSON" "$T/o5" -- \
    --tokenizer "$TOK" --input "$T/in/badline.jsonl" --output "$T/o5"
printf '%s\n' '{"text": "fine"}' '{"body": "no text field"}' >"$T/in/nofield.jsonl"
expect_fail "jsonl line without text" 'nofield.jsonl:2: expected a JSON object with a "text" string field' "$T/o6" -- \
    --tokenizer "$TOK" --input "$T/in/nofield.jsonl" --output "$T/o6"
printf '{"text": "bad \377 byte"}\n' >"$T/in/badutf.jsonl"
expect_fail "invalid UTF-8 in jsonl" "badutf.jsonl:1: invalid JSON at byte offset" "$T/o7" -- \
    --tokenizer "$TOK" --input "$T/in/badutf.jsonl" --output "$T/o7"
printf 'a,b\n' >"$T/in/table.csv"
expect_fail "unsupported file" "unsupported input" "$T/o8" -- --tokenizer "$TOK" --input "$T/in/table.csv" --output "$T/o8"
expect_fail "missing input" "nope.txt" "$T/o9" -- --tokenizer "$TOK" --input "$T/in/nope.txt" --output "$T/o9"
expect_fail "vocab mismatch" "vocab size is 2048 but the model's vocab_size is 128256" "$T/o10" -- \
    --tokenizer "$TOK" --input "$MOBY" --output "$T/o10" --vocab-size 128256
expect_fail "missing tokenizer" "$T/notok" "$T/o11" -- --tokenizer "$T/notok" --input "$MOBY" --output "$T/o11"
# a bad file in a folder stops the run, also after good files were written
mkdir -p "$T/mixed" && cp "$MOBY" "$T/mixed/a.txt" && printf 'x\377\n' >"$T/mixed/b.txt"
expect_fail "bad file after a good one" "b.txt: invalid UTF-8 at byte offset 1" "$T/o12" -- \
    --tokenizer "$TOK" --input "$T/mixed" --output "$T/o12"
expect_fail "bad --val-fraction" "--val-fraction" "$T/o13" -- --tokenizer "$TOK" --input "$MOBY" --output "$T/o13" \
    --val-fraction 1.5
expect_fail "unknown option" "unknown option" "$T/o14" -- --tokenizer "$TOK" --input "$MOBY" --output "$T/o14" --frobnicate

# ---- the dataset names of the shipped configs: "c4" is C4 prepared under $TETRA_DATA_DIR/c4 ----
mkdir -p "$T/c4src" "$T/datadir"
printf '%s\n' '{"text": "C4 one, a document about whales."}' '{"text": "C4 two, another one."}' \
    '{"text": "C4 three, the held-out one."}' | gzip -c >"$T/c4src/c4-train.00000-of-01024.json.gz"
prepare --input "$T/c4src" --output "$T/datadir/c4" --val-fraction 0.34 --quiet || bad "prepare c4"
TRAIN=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.dataset c4 --training.steps 1
       --training.seq_len 8 --training.local_batch_size 1 --validation.enable --validation.dataset c4_validation
       --validation.seq_len 8 --validation.local_batch_size 1 --metrics.disable_color_printing --training.device cpu)
if TETRA_DATA_DIR="$T/datadir" "$TETRA" "${TRAIN[@]}" --job.dump_folder "$T/c4run" >"$T/c4run.log" 2>&1 &&
   grep -q "dataset $T/datadir/c4 (" "$T/c4run.log" && grep -q "validate step" "$T/c4run.log"; then
    ok "dataset c4 (and c4_validation) resolve to \$TETRA_DATA_DIR/c4"
else
    bad "dataset c4: $(grep -m1 -E 'ERROR|dataset' "$T/c4run.log")"
fi
if [ ! -d "$(dirname "$BIN")/data/c4" ]; then
    if TETRA_DATA_DIR="$T/nowhere" "$TETRA" "${TRAIN[@]}" --job.dump_folder "$T/c4none" >"$T/c4none.log" 2>&1; then
        bad "dataset c4 without a prepared folder was accepted"
    elif grep -q 'dataset "c4" is not prepared' "$T/c4none.log" && grep -q "tetra data prepare" "$T/c4none.log"; then
        ok "dataset c4 not prepared: the error says how to make it"
    else
        bad "dataset c4 not prepared: $(grep -m1 ERROR "$T/c4none.log")"
    fi
fi

if [ $fail = 0 ]; then echo "test_data_prepare: all passed"; else echo "test_data_prepare: FAILED"; fi
exit $fail
