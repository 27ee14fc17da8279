#!/usr/bin/env bash
# kill_sweep.sh — kill -9 at N random moments of one fsdp 4 run with asynchronous
# checkpointing, resuming after each, and check that the finished run's losses equal an
# uninterrupted run's bit for bit (the JSON text of every step's last record).
#
# The debug model, seq_len 64, global batch 4, 40 steps, a checkpoint every 4 steps
# (checkpoint.async_mode = "async": kills land before, during and after background
# writes). Each kill takes every rank and mpirun at once, at a moment drawn uniformly in
# [0, 2 x the uninterrupted run's time / N) after the launch; each resume must load the newest complete checkpoint
# (never a half-written one) and go on. Not part of ctest (a few minutes); the suite's
# test_checkpoint_resume kills three chosen moments.
#
#   tests/stress/kill_sweep.sh [KILLS] [SEED]      default 10 kills, seed from the clock
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TETRA="${TETRA_BIN:-$ROOT/build/bin}/tetra"
KILLS="${1:-10}"
SEED="${2:-$(date +%s)}"
T="$(mktemp -d)"
trap 'pkill -KILL -f "dump_folder $T/" 2>/dev/null; rm -rf "$T"' EXIT
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
export OMP_WAIT_POLICY=PASSIVE
RANDOM=$SEED
echo "kill_sweep: $KILLS kills, seed $SEED"

ARGS=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.steps 40 --training.seq_len 64
      --training.local_batch_size 1 --training.global_batch_size 4 --training.threads 1 --training.seed 42
      --metrics.log_freq 1 --metrics.disable_color_printing --validation.enable false --training.device cpu
      --checkpoint.enable --checkpoint.interval 4 --checkpoint.async_mode async)
launch() { # dump log
  mpirun -np 4 --oversubscribe --bind-to none "$TETRA" "${ARGS[@]}" --job.dump_folder "$1" >>"$2" 2>&1
}
last_losses() { # the last record of each step, as JSON text
  python3 - "$1" <<'P'
import json, re, sys
last = {}
for line in open(sys.argv[1]):
    m = re.search(r'"step":(\d+),"loss":([^,]*)', line)
    if m and '"grad_norm"' in line:
        last[int(m.group(1))] = m.group(2)
print("\n".join(f"{s} {last[s]}" for s in sorted(last)))
P
}

s=$SECONDS
launch "$T/ref" "$T/ref.log" || { echo "FAIL the uninterrupted run failed"; tail -5 "$T/ref.log"; exit 1; }
FULL=$((SECONDS - s))
echo "uninterrupted run: 40 steps in $FULL s"

D="$T/victim"
fail=0
kills=0
for k in $(seq 1 "$KILLS"); do
  launch "$D" "$T/victim_$k.log" 2>/dev/null &
  mp=$!
  # a moment in [0, 2 x full run / KILLS): the kills spread over start-up, steps and saves
  ms=$(( (RANDOM * 32768 + RANDOM) % (2 * FULL * 1000 / KILLS + 1) ))
  sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
  if ! kill -0 $mp 2>/dev/null; then
    wait $mp
    echo "kill $k: the run finished before the kill (at ${ms} ms); no more kills"
    break
  fi
  kills=$k
  # mpirun and every rank at once (the ranks are mpirun's children, not this shell's)
  pkill -KILL -f -- "--job.dump_folder $D\$"
  wait $mp 2>/dev/null
  while pgrep -f -- "--job.dump_folder $D\$" >/dev/null; do sleep 0.05; done
  steps=$(last_losses "$D/metrics.jsonl" 2>/dev/null | tail -1 | cut -d' ' -f1)
  ckpts=$(ls "$D/checkpoint" 2>/dev/null | tr '\n' ' ')
  from=$(grep -o "loaded $D/checkpoint/step-[0-9]*" "$T/victim_$k.log" | sed 's#.*/##')
  echo "kill $k at ${ms} ms: started from ${from:-scratch or not yet loaded}, logged up to step ${steps:-0};" \
    "checkpoint folder: ${ckpts:-empty}"
done
launch "$D" "$T/victim_final.log" || { echo "FAIL the final resume failed"; grep -m3 ERROR "$T/victim_final.log"; fail=1; }
from=$(grep -o "loaded $D/checkpoint/step-[0-9]*" "$T/victim_final.log" | sed 's#.*/##')
echo "final run: started from ${from:-scratch}"
cat "$T"/victim_*.log | grep -h "incomplete save" | sed 's/.* - //' | sort | uniq -c
if [ "$(last_losses "$T/ref/metrics.jsonl")" = "$(last_losses "$D/metrics.jsonl")" ] &&
   [ "$(last_losses "$D/metrics.jsonl" | wc -l)" = 40 ]; then
  echo "ok   all 40 losses bit-identical to the uninterrupted run after $kills kill -9s ($(last_losses "$D/metrics.jsonl" | tail -1))"
else
  echo "FAIL losses differ from the uninterrupted run:"
  diff <(last_losses "$T/ref/metrics.jsonl") <(last_losses "$D/metrics.jsonl") | head -10
  fail=1
fi
exit $fail
