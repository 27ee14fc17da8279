#!/usr/bin/env bash
# Signals and closed pipes through the launcher, as a cluster user meets them: run_train.sh
# with 1, 2 and 4 CPU ranks and with TETRA_MAX_RESTARTS, every save slowed to seconds
# (TETRA_TEST_CKPT_SLOW_WRITE_MS), the tiny model:
#   1. SIGTERM to a 1-rank run_train.sh: rank 0 says "saving step N" at once (before the save
#      is written), the checkpoint is complete, exit 0.
#   2. SIGTERM to a 2-rank run_train.sh (mpirun used to kill the ranks 2 s later, leaving
#      step-N.tmp-PID): exit 0, step-N complete, and the same command resumes from it (that
#      such resumes are bit-identical is tests/stress/kill_sweep.sh's and test_preemption's).
#      SIGTERM the moment mpirun starts (before it forwards signals) still stops the run cleanly.
#   3. Slurm's pattern under 4 ranks: SIGTERM to the launcher's process group, SIGKILL to it
#      after a grace (KillWait): the save completes within it, exit 0, nothing left running.
#   4. TETRA_MAX_RESTARTS=2, SIGTERM to the launcher: it passes it on, the run saves and the
#      launcher exits 0 without restarting; no rank is left training unsupervised.
#   5. Ctrl-C twice (SIGINT to the process group) under 1 and 2 ranks: the second says it
#      abandons the save, exit 130, nothing left running, no complete step-N.
#   6. `| head -2` under 2 ranks, and stdout and stderr closed: every step runs,
#      exit 0, metrics.jsonl holds every step and nothing else.
set -uo pipefail
ROOT="${TETRA_ROOT:-$(pwd)}"
T="$(mktemp -d)"
# shellcheck disable=SC2317
cleanup() {
  # a launcher that lost track of its ranks (the bug under test) must not outlive the test
  pkill -KILL -f -- "--job.dump_folder $T/" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }
[ -x "$ROOT/build/bin/tetra" ] || { echo "FAIL $ROOT/build/bin/tetra not built"; exit 1; }
cd "$ROOT"
export OMP_WAIT_POLICY=PASSIVE CONFIG_FILE=./configs/debug_model.toml LOG_DIR="$T/logs"
unset OMP_NUM_THREADS TETRA_MAX_RESTARTS
set -m # each background launcher in a process group of its own, as a shell or Slurm starts it
fail=0
ok() { echo "ok   $* (${SECONDS}s)"; }
bad() { echo "FAIL $*"; fail=1; }

ARGS=(--model.flavor tiny --training.seq_len 64 --training.local_batch_size 1 --training.threads 1
      --metrics.log_freq 1 --metrics.disable_color_printing --training.device cpu --checkpoint.enable
      --checkpoint.interval 100000)
steps_logged() {
  local n
  n=$(grep -c '"grad_norm"' "$1/metrics.jsonl" 2>/dev/null)
  echo "${n:-0}"
}
start() { # NAME NGPU SLOW_MS [env...]: a long run in $T/NAME, launcher pid in $LP
  local name=$1 n=$2 slow=$3
  shift 3
  env "$@" NGPU="$n" TETRA_TEST_CKPT_SLOW_WRITE_MS="$slow" ./run_train.sh "${ARGS[@]}" --training.steps 3000 \
    --job.dump_folder "$T/$name" >"$T/$name.log" 2>&1 &
  LP=$!
  for _ in $(seq 1 600); do [ "$(steps_logged "$T/$name")" -ge 2 ] && return 0; sleep 0.05; done
  bad "$name: the run did not start: $(grep -m2 -E 'ERROR|rror' "$T/$name.log")"
  return 1
}
finish() { # PID LIMIT_S: wait for the launcher, at most LIMIT_S seconds; its exit code in $RC
  local pid=$1 limit=$2
  for _ in $(seq 1 $((limit * 20))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  if kill -0 "$pid" 2>/dev/null; then kill -KILL -- -"$pid" 2>/dev/null; fi
  wait "$pid" 2>/dev/null
  RC=$?
}
left_running() { # NAME: processes of that run still alive a second after the launcher ended
  sleep 0.5
  pgrep -f -- "--job.dump_folder $T/$1\$" | tr '\n' ' '
}
saved_step() { # NAME: the step of the "stopped ... after step N" line
  grep -o "stopped by SIG[A-Z0-9]* after step [0-9]*" "$T/$1.log" | grep -o '[0-9]*$' | head -1
}
# "saving step N" came before the checkpoint's "saved step-N" line, and step-N is complete
said_at_once() { # NAME
  local said saved
  said=$(grep -n "received during step [0-9]*: saving step" "$T/$1.log" | head -1 | cut -d: -f1)
  saved=$(grep -n "checkpoint: saved step-" "$T/$1.log" | tail -1 | cut -d: -f1)
  [ -n "$said" ] && [ -n "$saved" ] && [ "$said" -lt "$saved" ]
}
complete() { # NAME STEP
  [ -f "$T/$1/checkpoint/step-$2/metadata.json" ] && ! ls -d "$T/$1/checkpoint/"*.tmp-* >/dev/null 2>&1
}

# ---- 1. one rank: the launcher is the run ------------------------------------------------------------
if start one 1 2000; then
  kill -TERM "$LP"
  finish "$LP" 30
  n=$(saved_step one)
  if [ "$RC" = 0 ] && [ -n "$n" ] && said_at_once one && complete one "$n"; then
    ok "1 rank, SIGTERM to run_train.sh: '$(grep -o 'SIGTERM received during step [0-9]*: saving step [0-9]*' "$T/one.log")' at once, step-$n complete, exit 0"
  else
    bad "1 rank, SIGTERM: exit $RC, step '${n}': $(grep -E 'WARN|ERROR' "$T/one.log" | head -3)"
  fi
fi

# ---- 2. two ranks: SIGTERM to the launcher, then the resume ---------------------------------------------
if start two 2 3000; then
  kill -TERM "$LP"
  finish "$LP" 40
  n=$(saved_step two)
  if [ "$RC" = 0 ] && [ -n "$n" ] && said_at_once two && complete two "$n" &&
     grep -q "run_train.sh: SIGTERM: every rank finishes the step in progress" "$T/two.log"; then
    ok "2 ranks, SIGTERM to run_train.sh with a 3 s save: rank 0 said 'saving step $n' at once, step-$n complete, exit 0"
    s=$((n + 3))
    NGPU=2 ./run_train.sh "${ARGS[@]}" --training.steps $s --job.dump_folder "$T/two" >"$T/two_resume.log" 2>&1
    rc=$?
    [ $rc = 0 ] && grep -q "checkpoint: loaded $T/two/checkpoint/step-$n" "$T/two_resume.log" &&
      [ "$(steps_logged "$T/two")" = $s ] && ok "2 ranks: the same command resumes from step-$n and finishes" ||
      bad "2 ranks: the resume exited with $rc: $(grep -m2 -E 'ERROR|loaded' "$T/two_resume.log")"
  else
    bad "2 ranks, SIGTERM: exit $RC, step '${n}', checkpoints: $(ls "$T/two/checkpoint" 2>/dev/null | tr '\n' ' ')"
  fi
fi

# SIGTERM the moment mpirun starts, before it can forward anything: the stop request the
# launcher leaves for the ranks still stops the run cleanly
NGPU=2 ./run_train.sh "${ARGS[@]}" --training.steps 3000 --job.dump_folder "$T/early" >"$T/early.log" 2>&1 &
LP=$!
for _ in $(seq 1 600); do pgrep -x mpirun -P "$LP" >/dev/null && break; sleep 0.01; done
kill -TERM "$LP"
finish "$LP" 40
left=$(left_running early)
if [ "$RC" = 0 ] && grep -q "stopped by SIGTERM" "$T/early.log" && [ -z "$left" ]; then
  ok "2 ranks, SIGTERM as mpirun starts: '$(grep -o "stopped by SIGTERM [a-z-]* [a-z0-9-]*" "$T/early.log")', exit 0"
else
  bad "2 ranks, SIGTERM as mpirun starts: exit $RC, still running: '${left}': $(grep -E 'stopped|ERROR' "$T/early.log" | tail -2)"
fi

# ---- 3. Slurm's pattern under four ranks: SIGTERM to the process group, SIGKILL after KillWait ----------
if start slurm 4 3000; then
  kill -TERM -- -"$LP"
  ( sleep 30; kill -KILL -- -"$LP" ) 2>/dev/null &
  killwait=$!
  disown $killwait
  finish "$LP" 35
  kill "$killwait" 2>/dev/null
  n=$(saved_step slurm)
  left=$(left_running slurm)
  if [ "$RC" = 0 ] && [ -n "$n" ] && said_at_once slurm && complete slurm "$n" && [ -z "$left" ]; then
    ok "4 ranks, SIGTERM to the launcher's process group (SIGKILL 30 s later): step-$n complete, exit 0, nothing left"
  else
    bad "4 ranks, Slurm's pattern: exit $RC, step '${n}', still running: '${left}', checkpoints: $(ls "$T/slurm/checkpoint" 2>/dev/null | tr '\n' ' ')"
  fi
fi

# ---- 4. the restart loop passes SIGTERM on ------------------------------------------------------------
if start restarts 2 3000 TETRA_MAX_RESTARTS=2; then
  kill -TERM "$LP"
  finish "$LP" 40
  n=$(saved_step restarts)
  left=$(left_running restarts)
  if [ "$RC" = 0 ] && [ -n "$n" ] && complete restarts "$n" && [ -z "$left" ] && ! grep -q "restart 1" "$T/restarts.log"; then
    ok "TETRA_MAX_RESTARTS=2, SIGTERM to run_train.sh: passed on, step-$n saved, no restart, exit 0, no orphan"
  else
    bad "restart loop, SIGTERM: exit $RC, step '${n}', still running: '${left}': $(grep -E 'run_train.sh' "$T/restarts.log" | tail -2)"
  fi
fi

# ---- 5. Ctrl-C twice abandons the save, saying so ------------------------------------------------------
for n in 1 2; do
  if start int$n "$n" 3000; then
    kill -INT -- -"$LP"
    for _ in $(seq 1 200); do grep -q "saving step" "$T/int$n.log" && break; sleep 0.05; done
    kill -INT -- -"$LP"
    finish "$LP" 20
    left=$(left_running "int$n")
    if [ "$RC" = 130 ] && grep -q "SIGINT again: abandoning the save" "$T/int$n.log" && [ -z "$left" ] &&
       [ -z "$(ls "$T/int$n/checkpoint/"*/metadata.json 2>/dev/null)" ]; then
      ok "$n rank(s), Ctrl-C twice: '$(grep -o "SIGINT again: abandoning the save[^;]*" "$T/int$n.log" | head -1)', exit 130, nothing left"
    else
      bad "$n rank(s), Ctrl-C twice: exit $RC, still running: '${left}': $(grep -E 'SIGINT|ERROR' "$T/int$n.log" | tail -2)"
    fi
  fi
done

# ---- 6. closed output ----------------------------------------------------------------------------------
NGPU=2 ./run_train.sh "${ARGS[@]}" --checkpoint.no_enable --training.steps 40 --job.dump_folder "$T/head" 2>&1 | head -2 >/dev/null
rc=${PIPESTATUS[0]}
n=$(steps_logged "$T/head")
[ "$rc" = 0 ] && [ "$n" = 40 ] && ok "2 ranks | head -2: all 40 steps ran, exit 0" || bad "2 ranks | head -2: exit $rc after $n of 40 steps"
# (no CONFIG_FILE: the launcher's own quick-start line meets the closed stderr first)
env -u CONFIG_FILE NGPU=2 ./run_train.sh "${ARGS[@]}" --checkpoint.no_enable --training.steps 20 --job.dump_folder "$T/closed" >&- 2>&-
rc=$?
n=$(steps_logged "$T/closed")
lines=$(wc -l <"$T/closed/metrics.jsonl" 2>/dev/null)
[ "$rc" = 0 ] && [ "$n" = 20 ] && [ "${lines:-0}" = 20 ] &&
  ok "2 ranks with stdout and stderr closed: 20 steps, exit 0, metrics.jsonl holds the 20 records only" ||
  bad "2 ranks with stdout and stderr closed: exit $rc, $n steps, ${lines:-0} lines in metrics.jsonl"

if [ $fail != 0 ]; then echo "FAIL launch signals"; exit 1; fi
echo "ok   launch signals"
