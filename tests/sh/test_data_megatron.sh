#!/usr/bin/env bash
# test_data_megatron.sh — Megatron-LM indexed datasets (.bin + .idx) as training corpora.
#
# A corpus prepared by `tetra data prepare` is written again as a Megatron dataset by the
# test's own writer (tests/py/megatron_ref.py, from the published format), as uint16 and
# as int32 ids. Training reads each in place and gives the same losses and gradient
# norms, step for step, as the token shards; a Megatron dataset also serves as the
# validation corpus. Refused: validation on the Megatron training corpus itself (no
# held-out split), a dtype that cannot hold the model's vocabulary (uint16 ids for a
# vocab_size of 70000), and an id outside the vocabulary, named by file, token and
# sequence at the step that reads it. (tests/unit/test_megatron.c: malformed indices.)
set -u

ROOT=${TETRA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN=${TETRA_BIN:-$ROOT/build/bin}
TETRA=$BIN/tetra
TOK=$ROOT/tests/assets/tokenizer
PY=$(command -v python3 || true)

if [ ! -x "$TETRA" ]; then echo "FAIL: $TETRA is not built"; exit 1; fi
if [ -z "$PY" ]; then echo "FAIL: python3 is needed"; exit 1; fi

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
T=$(mktemp -d "${TMPDIR:-/tmp}/tetra_megatron_XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

# a corpus of documents: Moby Dick's first 600 paragraphs
"$PY" - "$ROOT/tests/assets/moby_dick.txt" "$T/docs.jsonl" <<'EOF'
import json, sys
paras = [p.strip() for p in open(sys.argv[1], encoding="utf-8").read().split("\n\n") if p.strip()][:600]
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for p in paras:
        f.write(json.dumps({"text": p}) + "\n")
EOF
"$TETRA" data prepare --tokenizer "$TOK" --input "$T/docs.jsonl" --output "$T/shards" --val-fraction 0 --quiet ||
    { bad "prepare"; exit 1; }
for dt in uint16 int32; do
    "$PY" "$ROOT/tests/py/megatron_ref.py" write "$T/mg_$dt" "$T/shards" $dt >/dev/null || bad "writing mg_$dt"
done
cmp -s <(tail -c +65 "$T/shards/train/shard_00000.bin") "$T/mg_uint16.bin" &&
    ok "the uint16 .bin holds the shards' token stream" || bad "mg_uint16.bin differs from the shard's tokens"

TRAIN=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.steps 4 --training.seq_len 64
       --training.local_batch_size 2 --metrics.disable_color_printing --training.device cpu)
run() { # NAME DATASET [more options]
    local name=$1 data=$2
    shift 2
    "$TETRA" "${TRAIN[@]}" --training.dataset_path "$data" --job.dump_folder "$T/$name" "$@" >"$T/$name.log" 2>&1
}
losses() { "$PY" -c 'import json,sys; print(" ".join("%r/%r" % (r["loss"], r["grad_norm"]) for r in map(json.loads, open(sys.argv[1])) if "loss" in r))' "$T/$1/metrics.jsonl"; }

run shards "$T/shards" || bad "training on the shards: $(grep -m1 ERROR "$T/shards.log")"
ref=$(losses shards)
# the dataset named by its prefix, its .idx or its .bin; the first also validates on another
# Megatron dataset (validation does not change the training losses)
VAL=(--validation.enable --validation.dataset_path "$T/mg_int32.idx" --validation.seq_len 64
     --validation.local_batch_size 2 --validation.freq 2 --validation.steps 2)
for path in mg_uint16 mg_uint16.idx mg_int32.bin; do
    name=${path//./_}
    extra=()
    [ "$path" = mg_uint16 ] && extra=("${VAL[@]}")
    if run "$name" "$T/$path" "${extra[@]}"; then
        got=$(losses "$name")
        if [ -n "$ref" ] && [ "$got" = "$ref" ]; then ok "$path: the same 4 losses and grad norms as the shards ($ref)"
        else bad "$path: losses $got, the shards' $ref"; fi
    else
        bad "training on $path: $(grep -m1 ERROR "$T/$name.log")"
    fi
done
grep -q "dataset $T/mg_uint16 (" "$T/mg_uint16.log" && ok "start-up names the dataset" || bad "start-up line"

# validation: another Megatron dataset, yes; the training corpus itself, no
[ "$(grep -c "validate step" "$T/mg_uint16.log")" -ge 2 ] && ok "validation on a Megatron dataset: $(grep -m1 "validate step" "$T/mg_uint16.log" | sed 's/.*INFO - //')" ||
    bad "validation on a Megatron dataset: $(grep -m1 ERROR "$T/mg_uint16.log")"
expect_error() { # NAME SUBSTRING: the run failed and its log says so
    if grep -q -- "$2" "$T/$1.log"; then ok "$1: $(grep -m1 -- "$2" "$T/$1.log" | sed 's/.*ERROR - //')"
    else bad "$1: no '$2' in: $(grep -m1 ERROR "$T/$1.log")"; fi
}
if run mgselfval "$T/mg_uint16" --validation.enable; then bad "validation on the training Megatron dataset ran"
else expect_error mgselfval "is a Megatron dataset, which has no held-out split"; fi
# the dtype against the vocabulary at start-up
if run mgvocab "$T/mg_uint16" --model.vocab_size 70000; then bad "uint16 ids for a vocab of 70000 were accepted"
else expect_error mgvocab "its ids are uint16, at most 65535, but the model's vocab_size is 70000"; fi
# an id outside the vocabulary in the third step's windows
cp "$T/mg_uint16.idx" "$T/mg_bad.idx"
"$PY" - "$T/mg_uint16.bin" "$T/mg_bad.bin" <<'EOF'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[2 * 300:2 * 300 + 2] = (4000).to_bytes(2, "little")  # token 300: step 3 reads tokens 260..389
open(sys.argv[2], "wb").write(b)
EOF
if run mgbad "$T/mg_bad"; then bad "an id of 4000 with a vocabulary of 2048 was trained on"
else expect_error mgbad "step 3: .*mg_bad.bin: token 300 (sequence [0-9]*) holds id 4000, outside the model's vocabulary of 2048"; fi

if [ $fail = 0 ]; then echo "test_data_megatron: all passed"; else echo "test_data_megatron: FAILED"; fi
exit $fail
