#!/usr/bin/env bash
# kill_sweep.sh — interrupt one fsdp 4 run with asynchronous checkpointing at N random
# moments, resuming after each, and check that the finished run's losses equal an
# uninterrupted run's bit for bit (the JSON text of every step's last record).
#
# The debug model, seq_len 64, global batch 4, 40 steps, a checkpoint every 4 steps
# (checkpoint.async_mode = "async": interruptions land before, during and after background
# writes). The run is launched the way users launch it, NGPU=4 ./run_train.sh, each time in a
# process group of its own, and each interruption is one of (drawn at random):
#   kill9-all       kill -9 of the launcher, mpirun and every rank at once
#   kill9-launcher  kill -9 of the launcher alone: mpirun and the ranks must die with it
#   term, usr1      SIGTERM / SIGUSR1 to the launcher: the ranks save the step and stop, exit 0
#   int             Ctrl-C (SIGINT to the process group): the same
#   int2            Ctrl-C twice, 0.3 s apart: the save is abandoned, exit 130 (or 0 if done)
#   slurm           SIGTERM to the process group, SIGKILL 1 s later (a KillWait too short)
# at a moment drawn uniformly in [0, S + 2 x T / N) after the launch, where S is the uninterrupted
# run's start-up (until its first step) and T its training time.
# After each, nothing of the run may be left running, and each resume must load the newest
# complete checkpoint (never a half-written one) and go on. Not part of ctest (a few
# minutes); the suite's test_checkpoint_resume and test_launch_signals cover chosen moments.
#
#   tests/stress/kill_sweep.sh [KILLS] [SEED] [KINDS]   default 10 kills, seed from the clock,
#                                                        every kind ("kill9-all,term", ...)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TETRA="${TETRA_BIN:-$ROOT/build/bin}/tetra"
KILLS="${1:-10}"
SEED="${2:-$(date +%s)}"
IFS=, read -r -a KINDS <<<"${3:-kill9-all,kill9-launcher,term,usr1,int,int2,slurm}"
T="$(mktemp -d)"
trap 'pkill -KILL -f "dump_folder $T/" 2>/dev/null; rm -rf "$T"' EXIT
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
export OMP_WAIT_POLICY=PASSIVE
RANDOM=$SEED
echo "kill_sweep: $KILLS interruptions, seed $SEED, kinds ${KINDS[*]}"

ARGS=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.steps 40 --training.seq_len 64
      --training.local_batch_size 1 --training.global_batch_size 4 --training.threads 1 --training.seed 42
      --metrics.log_freq 1 --metrics.disable_color_printing --validation.enable false --training.device cpu
      --checkpoint.enable --checkpoint.interval 4 --checkpoint.async_mode async)
launch_user() { # dump log: as a user does; replaces the (sub)shell it runs in, so $! is the launcher
  exec env CONFIG_FILE="$ROOT/configs/debug_model.toml" NGPU=4 LOG_DIR="$T/logs" \
    "$ROOT/run_train.sh" "${ARGS[@]:3}" --job.dump_folder "$1" >>"$2" 2>&1
}
interrupt() { # KIND PID
  case "$1" in
    kill9-all) kill -KILL "$2"; pkill -KILL -f -- "--job.dump_folder $D\$" ;;
    kill9-launcher) kill -KILL "$2" ;;
    term) kill -TERM "$2" ;;
    usr1) kill -USR1 "$2" ;;
    int) kill -INT -- -"$2" ;;
    int2) kill -INT -- -"$2"; sleep 0.3; kill -INT -- -"$2" ;;
    slurm) kill -TERM -- -"$2"; sleep 1; kill -KILL -- -"$2" 2>/dev/null ;;
  esac
}
expected() { # KIND EXIT_CODE: what the launcher may answer
  case "$1:$2" in
    kill9-*:137 | term:0 | usr1:0 | int:0 | int2:130 | int2:0 | slurm:0 | slurm:137) return 0 ;;
  esac
  return 1
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

t0=$(date +%s%N)
( launch_user "$T/ref" "$T/ref.log" ) &
ref=$!
START=""
while kill -0 $ref 2>/dev/null; do # the start-up: until the first step is logged
  if [ -z "$START" ] && [ -s "$T/ref/metrics.jsonl" ]; then START=$((($(date +%s%N) - t0) / 1000000)); fi
  sleep 0.05
done
wait $ref || { echo "FAIL the uninterrupted run failed"; tail -5 "$T/ref.log"; exit 1; }
FULL=$((($(date +%s%N) - t0) / 1000000))
START=${START:-0}
echo "uninterrupted run (run_train.sh): 40 steps in $FULL ms, the first after $START ms"

D="$T/victim"
fail=0
kills=0
set -m
for k in $(seq 1 "$KILLS"); do
  kind=${KINDS[RANDOM % ${#KINDS[@]}]}
  launch_user "$D" "$T/victim_$k.log" &
  lp=$!
  # a moment in [0, start-up + 2 x training time / KILLS): start-up, steps and saves
  ms=$(( (RANDOM * 32768 + RANDOM) % (START + 2 * (FULL - START) / KILLS + 1) ))
  sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
  if ! kill -0 $lp 2>/dev/null; then
    wait $lp
    echo "interruption $k: the run finished before it (at ${ms} ms); no more"
    break
  fi
  kills=$k
  interrupt "$kind" $lp
  for _ in $(seq 1 1200); do kill -0 $lp 2>/dev/null || break; sleep 0.05; done
  if kill -0 $lp 2>/dev/null; then
    echo "FAIL interruption $k ($kind): the launcher still runs 60 s later"
    fail=1
    kill -KILL -- -$lp 2>/dev/null
  fi
  wait $lp 2>/dev/null
  rc=$?
  left=""
  for _ in $(seq 1 100); do
    left=$(pgrep -f -- "--job.dump_folder $D\$" | tr '\n' ' ')
    [ -z "$left" ] && break
    sleep 0.1
  done
  if [ -n "$left" ]; then
    echo "FAIL interruption $k ($kind): processes left running 10 s after the launcher ended: $left"
    fail=1
    pkill -KILL -f -- "--job.dump_folder $D\$"
  fi
  steps=$(last_losses "$D/metrics.jsonl" 2>/dev/null | tail -1 | cut -d' ' -f1)
  ckpts=$(ls "$D/checkpoint" 2>/dev/null | tr '\n' ' ')
  from=$(grep -o "loaded $D/checkpoint/step-[0-9]*" "$T/victim_$k.log" | sed 's#.*/##')
  said=$(grep -o "stopped by SIG[A-Z0-9]* after step [0-9]*\|stopped by SIG[A-Z0-9]* during start-up\|abandoning the save" "$T/victim_$k.log" | tail -1)
  note=""
  if ! expected "$kind" "$rc"; then
    # before the run starts the launcher stops with 128 + the signal, saying so; a signal in the
    # first tens of ms of a rank, before its handlers exist, ends it: either way nothing was trained
    if grep -q "before the run started: stopping" "$T/victim_$k.log"; then
      note=" (stopped before the run started)"
    elif ! grep -q "step: " "$T/victim_$k.log"; then
      note=" (exit $rc: the signal came before the ranks could catch it; nothing had been trained)"
    else
      echo "FAIL interruption $k ($kind): the launcher exited $rc"
      fail=1
    fi
  fi
  echo "interruption $k: $kind at ${ms} ms, exit $rc${note}: started from ${from:-scratch or not yet loaded}," \
    "logged up to step ${steps:-0}${said:+; \"$said\"}; checkpoint folder: ${ckpts:-empty}"
done
set +m
( launch_user "$D" "$T/victim_final.log" ) || { echo "FAIL the final resume failed"; grep -m3 ERROR "$T/victim_final.log"; fail=1; }
from=$(grep -o "loaded $D/checkpoint/step-[0-9]*" "$T/victim_final.log" | sed 's#.*/##')
echo "final run: started from ${from:-scratch}"
cat "$T"/victim_*.log | grep -h "incomplete save" | sed 's/.* - //' | sort | uniq -c
if [ "$(last_losses "$T/ref/metrics.jsonl")" = "$(last_losses "$D/metrics.jsonl")" ] &&
   [ "$(last_losses "$D/metrics.jsonl" | wc -l)" = 40 ]; then
  echo "ok   all 40 losses bit-identical to the uninterrupted run after $kills interruptions ($(last_losses "$D/metrics.jsonl" | tail -1))"
else
  echo "FAIL losses differ from the uninterrupted run:"
  diff <(last_losses "$T/ref/metrics.jsonl") <(last_losses "$D/metrics.jsonl") | head -10
  fail=1
fi
exit $fail
