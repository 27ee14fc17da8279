#!/usr/bin/env bash
# test_data_mixture.sh — training on a weighted mixture of corpora (training.dataset_mix).
#
# Three sources: two corpora prepared by `tetra data prepare` (with val splits) and a
# Megatron dataset, weights 0.5 / 0.3 / 0.2. Checked end to end: the start-up line prints
# each source's weight and the share the run will realise; metrics.jsonl records
# the realised shares at every logged step; a run that saves at step 3 and is resumed from
# that checkpoint, on 1 rank and on 2 data-parallel ranks (mpirun), continues with the
# uninterrupted run's losses (bit for bit on 1 rank, within 1e-5 on 2); validation reports
# each source's val split apart; refused: a malformed entry, a missing source, dataset_path
# beside dataset_mix, validation on a Megatron source (it has no held-out split).
# (tests/unit/test_mixture.c: shares over 10,000 samples, the exact sample order on resume
# under 1, 2 and 5 ranks.)
set -u

ROOT=${TETRA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN=${TETRA_BIN:-$ROOT/build/bin}
TETRA=$BIN/tetra
TOK=$ROOT/tests/assets/tokenizer
PY=$(command -v python3 || true)

if [ ! -x "$TETRA" ]; then echo "FAIL: $TETRA is not built"; exit 1; fi
if [ -z "$PY" ]; then echo "FAIL: python3 is needed"; exit 1; fi
command -v mpirun >/dev/null || { echo "FAIL: mpirun not found (install openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_WAIT_POLICY=PASSIVE
unset OMP_NUM_THREADS

T=$(mktemp -d "${TMPDIR:-/tmp}/tetra_mixture_XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

# three corpora from Moby Dick's paragraphs
"$PY" - "$ROOT/tests/assets/moby_dick.txt" "$T" <<'EOF'
import json, sys
paras = [p.strip() for p in open(sys.argv[1], encoding="utf-8").read().split("\n\n") if p.strip()]
for name, a, b in [("a", 0, 300), ("b", 300, 600), ("c", 600, 900)]:
    with open("%s/%s.jsonl" % (sys.argv[2], name), "w", encoding="utf-8") as f:
        for p in paras[a:b]:
            f.write(json.dumps({"text": p}) + "\n")
EOF
for s in a b c; do
    "$TETRA" data prepare --tokenizer "$TOK" --input "$T/$s.jsonl" --output "$T/$s" --val-fraction 0.1 --quiet ||
        bad "prepare $s"
done
"$PY" "$ROOT/tests/py/megatron_ref.py" write "$T/c_mg" "$T/c" uint16 >/dev/null || bad "the Megatron source"
MIX="$T/a:0.5,$T/b:0.3,$T/c_mg:0.2"

COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.seq_len 32 --training.global_batch_size 4
        --training.steps 6 --training.seed 11 --lr_scheduler.warmup_steps 2 --metrics.log_freq 1
        --metrics.disable_color_printing --training.device cpu --training.dataset_mix "$MIX"
        --checkpoint.interval 3 --checkpoint.keep_latest_k 0)
run() { # NAME NP ARGS...: a run in $T/NAME, log in $T/NAME.log
    local name=$1 np=$2
    shift 2
    if [ "$np" = 1 ]; then
        "$TETRA" "${COMMON[@]}" --job.dump_folder "$T/$name" "$@" >"$T/$name.log" 2>&1
    else
        mpirun -np "$np" --bind-to none "$TETRA" "${COMMON[@]}" --job.dump_folder "$T/$name" "$@" >"$T/$name.log" 2>&1
    fi
}
losses() { "$PY" -c '
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    if "loss" in r and r["step"] >= int(sys.argv[2]): print(r["step"], repr(r["loss"]))' "$T/$1/metrics.jsonl" "$2"; }

run full 1 --training.local_batch_size 4 --checkpoint.enable || bad "the mixture run: $(grep -m1 ERROR "$T/full.log")"
line=$(grep -m1 "data mixture over the run's 24 sequences" "$T/full.log")
case "$line" in
    *"$T/a: weight 0.5000, realised"*"$T/b: weight 0.3000"*"$T/c_mg: weight 0.2000"*) ok "start-up: ${line#*INFO - }" ;;
    *) bad "start-up line: $line" ;;
esac
"$PY" - "$T/full/metrics.jsonl" <<'EOF' && ok "metrics.jsonl data_mix: 6 steps, shares add up, samples = 4 per step" || bad "metrics.jsonl data_mix"
import json, sys
rows = [dict(json.loads(l)["data_mix"], step=json.loads(l)["step"]) for l in open(sys.argv[1]) if '"data_mix"' in l]
assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6], rows
for r in rows:
    src = r["sources"].values()
    assert r["samples"] == 4 * r["step"], r
    assert sum(s["samples"] for s in src) == r["samples"], r
    assert abs(sum(s["share"] for s in src) - 1) < 1e-9 and abs(sum(s["weight"] for s in src) - 1) < 1e-9, r
print(rows[-1])
EOF

# resume from the step-3 checkpoint: the same losses for steps 4-6
ref=$(losses full 4)
for np in 1 2; do
    mkdir -p "$T/resume$np/checkpoint" && cp -r "$T/full/checkpoint/step-3" "$T/resume$np/checkpoint/"
    if run resume$np $np --training.local_batch_size $((4 / np)) --checkpoint.enable; then
        got=$(losses resume$np 4)
        if [ $np = 1 ]; then
            [ -n "$ref" ] && [ "$got" = "$ref" ] && ok "resumed at step 3 on 1 rank: the same losses, bit for bit" ||
                bad "resumed on 1 rank: $got vs $ref"
        else
            "$PY" -c '
import sys
a = [l.split() for l in sys.argv[1].splitlines()]; b = [l.split() for l in sys.argv[2].splitlines()]
assert len(a) == 3 and [x[0] for x in a] == [x[0] for x in b], (a, b)
d = max(abs(float(x[1]) - float(y[1])) for x, y in zip(a, b))
assert d < 1e-5, d
print("%.2g" % d)' "$got" "$ref" >"$T/d" 2>&1 && ok "resumed at step 3 on 2 data-parallel ranks: losses within $(cat "$T/d") of the 1-rank run" ||
                bad "resumed on 2 ranks: $got vs $ref ($(cat "$T/d"))"
        fi
        grep -q "loaded .*step-3\|resumed\|checkpoint: loaded" "$T/resume$np.log" || bad "resume$np: no checkpoint was loaded"
    else
        bad "resume on $np: $(grep -m1 ERROR "$T/resume$np.log")"
    fi
done

# validation: each source's val split apart
if run val 1 --training.local_batch_size 4 --training.steps 1 --training.dataset_mix "$T/a:0.5,$T/b:0.5" \
       --validation.enable --validation.seq_len 32 --validation.local_batch_size 2 &&
   grep -q "source $T/a  loss" "$T/val.log" && grep -q "source $T/b  loss" "$T/val.log" && grep -q "validate step" "$T/val.log"; then
    ok "validation per source: $(grep "source $T/b  loss" "$T/val.log" | sed 's/.*INFO - //')"
else
    bad "validation per source: $(grep -m1 ERROR "$T/val.log")"
fi

# refused
refused() { # NAME SUBSTRING ARGS...
    local name=$1 want=$2
    shift 2
    if run "$name" 1 --training.local_batch_size 4 --training.steps 1 "$@"; then bad "$name: ran"
    elif grep -q -- "$want" "$T/$name.log"; then ok "$name: $(grep -m1 -- "$want" "$T/$name.log" | sed 's/.*ERROR - //')"
    else bad "$name: no '$want' in $(grep -m1 ERROR "$T/$name.log")"; fi
}
refused no_weight 'training.dataset_mix item 2: "'"$T"'/b": expected "PATH:WEIGHT"' --training.dataset_mix "$T/a:1,$T/b"
refused missing "mixture source 2 ($T/nothing)" --training.dataset_mix "$T/a:1,$T/nothing:1"
refused with_path "training.dataset_mix and training.dataset_path" --training.dataset_path "$T/a"
refused megatron_val "mixture source $T/c_mg is a Megatron dataset, which has no held-out split" --validation.enable \
    --validation.seq_len 32 --validation.local_batch_size 1

if [ $fail = 0 ]; then echo "test_data_mixture: all passed"; else echo "test_data_mixture: FAILED"; fi
exit $fail
