#!/usr/bin/env bash
# bench/gpu's like-for-like rules, without a GPU: a stand-in tetra (it answers the GPU count
# and writes metrics.jsonl as a run logging every LOG_FREQ-th step would) shows that
#   - both sides get the same activation checkpointing, tetra logs every LOG_FREQ-th step
#     and runs REPEATS times; the row is the median of the log windows wholly after the
#     warm-up (never a window holding warm-up steps) with the runs' spread;
#   - bad settings are refused;
# and bench/gpu_pytorch.py itself runs on the CPU (eager, the debug model, two timed
# windows) with and without full activation checkpointing, to the same loss, and with
# document masks (--doc-lengths: one document over the whole sequence is the causal loss,
# several are not; a zero-token document is refused).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

mkdir -p "$T/bin"
cat >"$T/bin/tetra" <<'EOF'
#!/usr/bin/env bash
if [ "$1" = info ]; then echo 1; exit 0; fi
if [ "$1" = data ]; then exit 0; fi # the 8B cases' corpus: not read by this stand-in
echo "$*" >>"$(dirname "$0")/calls"
dump= steps= freq=
while [ $# -gt 0 ]; do
  case "$1" in --job.dump_folder) dump=$2 ;; --training.steps) steps=$2 ;; --metrics.log_freq) freq=$2 ;; esac
  shift
done
mkdir -p "$dump"
run=${dump##*run}
# tokens/s: 100 in the warm-up's windows, then 1000 + 10 x the window's last step + the run
for s in $(seq 1 "$steps"); do
  if [ "$s" = 1 ] || [ $((s % freq)) = 0 ]; then
    tps=$((s <= 10 ? 100 : 1000 + 10 * s + run))
    echo "{\"step\": $s, \"loss\": 7.5, \"tps\": $tps, \"tflops\": 1.0, \"mfu\": 10.0}"
  fi
done >"$dump/metrics.jsonl"
EOF
chmod +x "$T/bin/tetra"

TETRA_BIN="$T/bin" BENCH_OUT="$T/out" PYTORCH=none CASES=debug AC=full bash "$ROOT/bench/gpu" >"$T/table" 2>"$T/err"
rc=$?
row=$(grep '^| debug |' "$T/table" | tail -1)
# windows after the 10-step warm-up end at steps 20, 30, 40: medians 1301 (run 1) and 1302 (run 2)
if [ $rc = 0 ] && [ "$row" = "| debug | 2 x 30 | 1,302 | 1.0 | 10.0% | 7.500 | 1,301-1,302 |" ]; then
  ok "the row is the median of the post-warm-up log windows of 2 runs: $row"
else
  bad "bench/gpu exited $rc, row '$row': $(tail -3 "$T/err")"
fi
n=$(grep -c -- '--activation_checkpoint.mode full' "$T/bin/calls")
f=$(grep -c -- '--metrics.log_freq 10 ' "$T/bin/calls")
[ "$n" = 2 ] && [ "$f" = 2 ] && ok "tetra ran twice with AC full and logging every 10th step" ||
  bad "tetra's calls: $n with AC full, $f logging every 10th step: $(cat "$T/bin/calls")"
grep -q '^| case (AC full) |' "$T/table" && ok "the table names the AC both sides ran" || bad "header: $(head -1 "$T/table")"

# bench_case CASE ROW PATTERN WHAT: the case exits 0, runs tetra twice with arguments
# matching PATTERN (grep), and prints its own row
bench_case() {
  rm -f "$T/bin/calls"
  TETRA_BIN="$T/bin" BENCH_OUT="$T/out_$1" PYTORCH=none CASES="$1" bash "$ROOT/bench/gpu" >"$T/table_$1" 2>"$T/err_$1"
  local rc=$? n
  n=$(grep -c -- "$3" "$T/bin/calls" 2>/dev/null)
  [ $rc = 0 ] && [ "$n" = 2 ] && grep -q "^| $2 |" "$T/table_$1" && ok "$1 runs $4, twice, as row $2" ||
    bad "$1: exit $rc, $n matching runs: $(tail -3 "$T/err_$1") $(grep '^|' "$T/table_$1" | tail -1)"
}

# the 8-block float8 case: 8 blocks, the converter, its own row
bench_case 8b8_float8_rowwise 8b_8layers_float8_rowwise \
  '--model.n_layers 8 .*--model.converters float8 --quantize.linear.float8.recipe_name rowwise' \
  "8 blocks of 8B with rowwise float8"

for bad_env in "AC=selective" "PYTORCH=fastest" "STEPS=15" "REPEATS=0"; do
  env "$bad_env" TETRA_BIN="$T/bin" BENCH_OUT="$T/out2" CASES=debug bash "$ROOT/bench/gpu" >/dev/null 2>"$T/e2"
  rc=$?
  [ $rc = 2 ] && [ -s "$T/e2" ] && ok "$bad_env is refused: $(head -1 "$T/e2")" || bad "$bad_env: exit $rc"
done

# the document-mask case: the 8B slice with block_causal on the documents corpus, its own row
bench_case 8b_docmask 8b_4layers_docmask \
  '--model.n_layers 4 .*--training.dataset_path [^ ]*llama3_sized_docs --model.attn_mask_type block_causal' \
  "the 4-block 8B slice with block_causal on the documents corpus"

# the PyTorch side's script, on the CPU
if "$PY" -c "import torch" 2>/dev/null; then
  for ac in none full; do
    "$PY" "$ROOT/bench/gpu_pytorch.py" --flavor debugmodel --n-layers 2 --seq-len 32 --batch 2 --steps 2 --warmup 1 \
      --repeats 2 --mode eager --device cpu --ac $ac --json-out "$T/pt_$ac.json" >"$T/pt_$ac.log" 2>&1 ||
      bad "gpu_pytorch.py --ac $ac on the CPU: $(tail -2 "$T/pt_$ac.log")"
  done
  "$PY" - "$T/pt_none.json" "$T/pt_full.json" <<'EOF' && ok "gpu_pytorch.py: 2 timed windows, the same loss with and without full AC" ||
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert len(a["window_tokens_per_s"]) == 2 and a["repeats"] == 2, a
assert b["ac"] == "full" and abs(a["last_loss"] - b["last_loss"]) < 1e-4, (a["last_loss"], b["last_loss"])
EOF
    bad "gpu_pytorch.py's results: $(cat "$T/pt_none.json" "$T/pt_full.json" 2>/dev/null | tr -s ' \n' ' ' | cut -c1-300)"
  # block_causal: one document as long as the sequence is the causal mask; several are not
  for dl in 32 5,11,2; do
    "$PY" "$ROOT/bench/gpu_pytorch.py" --flavor debugmodel --n-layers 2 --seq-len 32 --batch 2 --steps 2 --warmup 1 \
      --repeats 2 --mode eager --device cpu --doc-lengths $dl --json-out "$T/pt_doc$dl.json" >"$T/pt_doc$dl.log" 2>&1 ||
      bad "gpu_pytorch.py --doc-lengths $dl on the CPU: $(tail -2 "$T/pt_doc$dl.log")"
  done
  "$PY" - "$T/pt_none.json" "$T/pt_doc32.json" "$T/pt_doc5,11,2.json" <<'EOF' &&
import json, sys
c, one, many = (json.load(open(p)) for p in sys.argv[1:])
assert one["doc_lengths"] == [32] and many["doc_lengths"] == [5, 11, 2], (one["doc_lengths"], many["doc_lengths"])
assert abs(one["last_loss"] - c["last_loss"]) < 1e-5, (one["last_loss"], c["last_loss"])
assert abs(many["last_loss"] - c["last_loss"]) > 1e-4, (many["last_loss"], c["last_loss"])
EOF
    ok "gpu_pytorch.py --doc-lengths: one 32-token document gives the causal loss, documents of 5, 11, 2 another" ||
    bad "gpu_pytorch.py --doc-lengths: $(cat "$T/pt_doc32.json" "$T/pt_doc5,11,2.json" 2>/dev/null | tr -s ' \n' ' ' | cut -c1-300)"
  "$PY" "$ROOT/bench/gpu_pytorch.py" --flavor debugmodel --seq-len 32 --batch 2 --device cpu --doc-lengths 4,0 \
    >"$T/pt_bad.log" 2>&1
  [ $? = 2 ] && grep -q "at least one token" "$T/pt_bad.log" && ok "--doc-lengths 4,0 is refused" ||
    bad "--doc-lengths 4,0: $(tail -1 "$T/pt_bad.log")"
else
  echo "skip gpu_pytorch.py on the CPU: $PY has no torch"
fi
finish
