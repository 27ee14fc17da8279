#!/usr/bin/env bash
# One live run per dump folder, and the folder's files as documented (the tiny model, 1 rank):
#   1. A second run on the folder of a live run (caught in the middle of a save) is refused at
#      once, naming the holder's PID; the first run's save and metrics are untouched, and it
#      still stops cleanly on SIGTERM.
#   2. A step-N.tmp-PID folder of another live tetra process is never removed by a starting
#      run (one of a dead process is).
#   3. After a kill -9 the lock file left behind is taken over, naming the dead holder.
#   4. metrics.jsonl: a fresh run starts a new file (3 steps then 2 steps: 2 records); a
#      resumed run keeps the records before its first step and appends (one per step).
#   5. Every output folder is checked at start-up: an unwritable absolute checkpoint.folder (it
#      used to be found at the first save), metrics.save_tb_folder or comm.save_traces_folder is
#      refused before step 1, naming the key and the folder.
set -uo pipefail
ROOT="${TETRA_ROOT:-$(pwd)}"
TETRA="${TETRA_BIN:-$ROOT/build/bin}/tetra"
T="$(mktemp -d)"
# shellcheck disable=SC2317
cleanup() {
  pkill -KILL -f -- "--job.dump_folder $T/" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
export OMP_WAIT_POLICY=PASSIVE
unset OMP_NUM_THREADS
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

RUN=(train --job.config_file "$ROOT/configs/debug_model.toml" --model.flavor tiny --training.seq_len 64
     --training.local_batch_size 1 --training.threads 1 --metrics.log_freq 1 --metrics.disable_color_printing
     --training.device cpu)
records() { # DIR: training records in metrics.jsonl
  local n
  n=$(grep -c '"grad_norm"' "$1/metrics.jsonl" 2>/dev/null)
  echo "${n:-0}"
}

# ---- 1. a second run on a live folder -----------------------------------------------------------------
TETRA_TEST_CKPT_SLOW_WRITE_MS=3000 "$TETRA" "${RUN[@]}" --training.steps 3000 --checkpoint.enable \
  --checkpoint.interval 5 --job.dump_folder "$T/live" >"$T/live.log" 2>&1 &
A=$!
for _ in $(seq 1 600); do ls -d "$T/live/checkpoint/"step-*.tmp-* >/dev/null 2>&1 && break; sleep 0.05; done
tmp=$(ls -d "$T/live/checkpoint/"step-*.tmp-* 2>/dev/null | head -1)
before=$(records "$T/live")
"$TETRA" "${RUN[@]}" --training.steps 3 --checkpoint.enable --job.dump_folder "$T/live" >"$T/second.log" 2>&1
rc=$?
if [ -n "$tmp" ] && [ $rc = 1 ] && grep -q "job.dump_folder '$T/live' is in use by another run: process $A on host" "$T/second.log" &&
   [ -d "$tmp" ] && ! grep -q "removed .* incomplete save" "$T/second.log"; then
  ok "a second run on a live folder: refused, naming process $A; its save in progress ($(basename "$tmp")) untouched"
else
  bad "a second run on a live folder: exit $rc, save '${tmp}' $([ -d "$tmp" ] && echo kept || echo gone): $(grep -m1 -E 'ERROR|removed' "$T/second.log")"
fi

# ---- 2. the save folder of another live run is left alone -------------------------------------------------
mkdir -p "$T/other/checkpoint/step-7.tmp-$A" "$T/other/checkpoint/step-6.tmp-999999999"
"$TETRA" "${RUN[@]}" --training.steps 2 --checkpoint.enable --job.dump_folder "$T/other" >"$T/other.log" 2>&1 ||
  bad "the run beside another's save exited with $?"
if [ -d "$T/other/checkpoint/step-7.tmp-$A" ] && [ ! -e "$T/other/checkpoint/step-6.tmp-999999999" ] &&
   grep -q "left step-7.tmp-$A (process $A) in .* alone" "$T/other.log"; then
  ok "step-7.tmp-$A of a live tetra process kept (and named); step-6.tmp-999999999 of a dead one removed"
else
  bad "tmp folders of live processes: $(ls "$T/other/checkpoint" | tr '\n' ' '): $(grep -m1 -E 'left|removed' "$T/other.log")"
fi

# the first run was not disturbed: SIGTERM still ends it with a complete checkpoint
kill -TERM $A
wait $A
rc=$?
n=$(grep -o "stopped by SIGTERM after step [0-9]*" "$T/live.log" | grep -o '[0-9]*$')
after=$(records "$T/live")
[ $rc = 0 ] && [ -n "$n" ] && [ -f "$T/live/checkpoint/step-$n/metadata.json" ] && [ "$after" = "$n" ] && [ "$after" -ge "$before" ] &&
  ok "the live run went on undisturbed: stopped after step $n, checkpoint complete, $after records, one per step" ||
  bad "the live run: exit $rc, stopped after step '${n}', $after records: $(grep -m1 ERROR "$T/live.log")"

# ---- 3. a lock left by a killed run is taken over --------------------------------------------------------
"$TETRA" "${RUN[@]}" --training.steps 3000 --job.dump_folder "$T/stale" >"$T/stale1.log" 2>&1 &
K=$!
for _ in $(seq 1 600); do [ "$(records "$T/stale")" -ge 2 ] && break; sleep 0.05; done
kill -KILL $K
wait $K 2>/dev/null
"$TETRA" "${RUN[@]}" --training.steps 2 --job.dump_folder "$T/stale" >"$T/stale2.log" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "taking over $T/stale/.tetra.lock, left by process $K on host" "$T/stale2.log" &&
  [ ! -e "$T/stale/.tetra.lock" ] &&
  ok "a lock left by kill -9: taken over, naming process $K; removed when the run ends" ||
  bad "stale lock: exit $rc: $(grep -m1 -E 'WARN|ERROR' "$T/stale2.log")"

# ---- 4. metrics.jsonl: fresh runs start anew, resumed runs append -----------------------------------------
"$TETRA" "${RUN[@]}" --training.steps 3 --job.dump_folder "$T/fresh" >/dev/null 2>&1
"$TETRA" "${RUN[@]}" --training.steps 2 --job.dump_folder "$T/fresh" >"$T/fresh2.log" 2>&1
n=$(records "$T/fresh")
[ "$n" = 2 ] && ok "3 steps then a fresh run of 2 in the same folder: metrics.jsonl holds 2 records" ||
  bad "fresh runs: metrics.jsonl holds $n records (2 expected)"
"$TETRA" "${RUN[@]}" --training.steps 3 --checkpoint.enable --checkpoint.interval 1 --checkpoint.no_last_save_model_only \
  --job.dump_folder "$T/resumed" >/dev/null 2>&1
"$TETRA" "${RUN[@]}" --training.steps 5 --checkpoint.enable --checkpoint.interval 1 --job.dump_folder "$T/resumed" \
  >/dev/null 2>&1
steps=$(grep -o '"step":[0-9]*' "$T/resumed/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
[ "$steps" = "1 2 3 4 5 " ] && ok "a resumed run appends: steps $steps" || bad "resumed run: metrics.jsonl steps '$steps'"

# ---- 5. unwritable output folders are found at start-up ----------------------------------------------------
echo "a file, not a folder" >"$T/afile"
refused() { # NAME KEY FOLDER ARGS...
  local name=$1 key=$2 folder=$3
  shift 3
  "$TETRA" "${RUN[@]}" --training.steps 3 --job.dump_folder "$T/$name" "$@" >"$T/$name.log" 2>&1
  local rc=$?
  if [ $rc = 1 ] && grep -q "$key: cannot .* '$folder'" "$T/$name.log" && [ "$(records "$T/$name")" = 0 ]; then
    ok "unwritable $key: refused before step 1: $(grep -o "$key: cannot [^(]*" "$T/$name.log")"
  else
    bad "unwritable $key: exit $rc, $(records "$T/$name") steps: $(grep -m1 ERROR "$T/$name.log")"
  fi
}
# an existing folder this user cannot write (as root, a read-only one of the kernel's): a resume
# finds no checkpoint there, so only the save would have found it
RO="$T/readonly"
if [ "$(id -u)" = 0 ]; then RO=/proc/sys; else mkdir -p "$RO" && chmod a-w "$RO"; fi
refused ckpt checkpoint.folder "$RO" --checkpoint.enable --checkpoint.folder "$RO"
refused tb metrics.save_tb_folder "$T/afile/tb" --metrics.enable_tensorboard --metrics.save_tb_folder "$T/afile/tb"
refused comm comm.save_traces_folder "$T/afile/comm" --comm.save_traces_folder "$T/afile/comm"

if [ $fail != 0 ]; then echo "FAIL dump folder"; exit 1; fi
echo "ok   dump folder"
