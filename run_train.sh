#!/usr/bin/env bash
# run_train.sh — build if needed, then train.
#
#   ./run_train.sh                                   debug model, CPU, sample corpus
#   CONFIG_FILE=./configs/llama3_8b.toml NGPU=8 ./run_train.sh
#   NGPU=4 ./run_train.sh --training.steps 20 --parallelism.data_parallel_shard_degree 4
#
# Variables (TorchTitan's):
#   CONFIG_FILE  TOML config (default ./configs/debug_model.toml; see the CPU quick
#                start below)
#   NGPU         ranks to launch on this host (default: visible GPUs if CUDA is
#                built and a GPU is present, else 1 CPU rank); >1 uses mpirun
#   LOG_RANK     rank(s) whose output is shown: 0 (default), "0,3" or "all";
#                the others write LOG_DIR/rank_N.log (default ./outputs/logs)
#   TETRA_MAX_RESTARTS  relaunch every rank up to N times when the run fails (a rank
#                killed, a node lost): each restart resumes from the newest complete
#                checkpoint (checkpoint.enable), as torchrun's --max-restarts (default 0)
# Extra arguments are passed to `tetra train` (--section.key value ...).
#
# Signals (Slurm's SIGTERM or --signal=B:USR1@N, Ctrl-C, kill): SIGTERM, SIGINT, SIGUSR1 and
# SIGHUP to this script, to its process group, or to every process of a Slurm job (scancel),
# reach every rank at once; each finishes the step in progress, the step is saved, and the exit
# status is 0. A second Ctrl-C abandons the
# save (exit 130). The output goes on to metrics.jsonl when stdout or stderr is closed
# (| head). Exit status: 0 when training finished or stopped with its checkpoint saved; 130
# when a second Ctrl-C abandoned the save; 128+N for a signal N before the run started (while
# building); otherwise the run's own (after the restarts).
set -euo pipefail
# A closed stdout or stderr (>&-) or a closed pipe (| head) never ends the run: the launcher
# writes to /dev/null instead, never dies of SIGPIPE, and its messages never fail.
[ -e /dev/fd/1 ] || exec 1>/dev/null
[ -e /dev/fd/2 ] || exec 2>/dev/null
trap '' PIPE
say() { printf 'run_train.sh: %s\n' "$*" >&2 2>/dev/null || true; }
# Until the run is started (building, probing the GPUs) a stop signal ends the launcher, saying so.
for s in TERM INT USR1 HUP; do
  # shellcheck disable=SC2064
  trap "say 'SIG$s before the run started: stopping (nothing was trained)'; exit $((128 + $(kill -l $s)))" "$s"
done

cd "$(dirname "${BASH_SOURCE[0]}")"
CONFIG_GIVEN="${CONFIG_FILE:+yes}"
CONFIG_FILE="${CONFIG_FILE:-./configs/debug_model.toml}"
LOG_RANK="${LOG_RANK:-0}"
LOG_DIR="${LOG_DIR:-./outputs/logs}"

./scripts/setup.sh
TETRA=./build/bin/tetra

GPUS="$("$TETRA" info --gpu-count 2>/dev/null || echo 0)"
if [ -z "${NGPU:-}" ]; then
  NGPU="$GPUS"
  [ "$NGPU" -ge 1 ] 2>/dev/null || NGPU=1
fi

# CPU quick start. TorchTitan's debug config trains 8 x 2048 tokens per step: on a
# 2-core machine its 10 steps take over a minute even at full GEMM speed. With no
# CONFIG_FILE given and no GPU, the same model and data run at seq_len 512 x 4
# sequences, so the first run is done in seconds. Arguments still override these,
# and an explicit CONFIG_FILE runs exactly as written.
QUICK=()
if [ -z "$CONFIG_GIVEN" ] && ! [ "$GPUS" -ge 1 ] 2>/dev/null; then
  QUICK=(--training.seq_len 512 --training.local_batch_size 4)
  export TETRA_QUICK_START="${QUICK[1]} ${QUICK[3]}" # tetra says so, with the values in effect
fi
if ! [ "$NGPU" -ge 1 ] 2>/dev/null; then
  say "NGPU must be a positive integer (got '$NGPU')"
  exit 2
fi

MAX_RESTARTS="${TETRA_MAX_RESTARTS:-0}"
if ! [ "$MAX_RESTARTS" -ge 0 ] 2>/dev/null; then
  say "TETRA_MAX_RESTARTS must be a non-negative integer (got '$MAX_RESTARTS')"
  exit 2
fi
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Containers often forbid the cross-memory-attach single-copy path; copy-in/out works everywhere.
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
# Colour follows this script's own stdout (and NO_COLOR): a rank's stdout under mpirun may be
# a pty even when the launcher's output goes to a file.
if [ -t 1 ] && [ -z "${NO_COLOR:-}" ]; then export TETRA_COLOR=1; else export TETRA_COLOR=0; fi
# ---- one rank, no restarts: the launcher becomes the run --------------------------------------
# tetra handles every signal itself (engine/run_guard.h) and ignores a closed pipe.
if [ "$NGPU" = 1 ] && [ "$MAX_RESTARTS" = 0 ]; then
  exec "$TETRA" train --job.config_file "$CONFIG_FILE" ${QUICK[@]+"${QUICK[@]}"} "$@"
fi

# ---- otherwise the launcher supervises the run ------------------------------------------------
# mpirun must not see a signal or a closed pipe itself: on SIGTERM or SIGINT it sends the ranks
# SIGTERM a second late and SIGKILL a second later (a save of more than a second is lost), and
# it aborts the job when its output pipe closes. So the run starts in a session of its own
# (setsid: no terminal or process-group signal reaches it), it dies with this script (setpriv
# --pdeathsig; rank_exec.sh does the same for each rank, so nothing is ever orphaned), its
# output reaches ours through relays that keep reading when ours is closed (tee -p, with
# /dev/null as a second output that never closes), and this script passes the first signal
# on as SIGUSR1 (to mpirun, which forwards it to every rank at once, or to the one rank).
# A session of its own is not enough under Slurm: at scancel, preemption or a time limit it
# signals every process of the job (proctrack/cgroup, linuxproc), mpirun included. So mpirun
# also starts with SIGTERM, SIGINT and SIGHUP blocked: they stay pending and it never acts on
# them. Its ranks take them as usual (Open MPI unblocks every signal in a rank before exec, and
# tetra unblocks its own), and Slurm's SIGKILL after KillWait still ends everything.
mkdir -p "$LOG_DIR"
exec {RUN_OUT}> >(trap '' INT TERM HUP USR1; exec tee -p /dev/null)
OUT_PID=$!
exec {RUN_ERR}> >(trap '' INT TERM HUP USR1; exec tee -p /dev/null >&2)
ERR_PID=$!
say() { printf 'run_train.sh: %s\n' "$*" >&"$RUN_ERR" 2>/dev/null || true; }
# The stop request also goes into a file the ranks read at each step's end (rank 0), so a
# signal lost on the way (mpirun still starting its job, a rank not yet running) still stops
# the run, and the ranks name the signal the launcher received.
TETRA_STOP_FILE="$(cd "$LOG_DIR" && pwd)/.stop-request-$$"
export TETRA_STOP_FILE
rm -f "$TETRA_STOP_FILE"
finish() { # exit code: wait until the relays have passed on the last of the run's output
  rm -f "$TETRA_STOP_FILE"
  exec {RUN_OUT}>&- {RUN_ERR}>&-
  wait "$OUT_PID" "$ERR_PID" 2>/dev/null || true
  exit "$1"
}

RUN_WRAP=() # what the run is started under: dies with this script, SIGUSR1 ignored until caught
if setpriv --pdeathsig KILL true 2>/dev/null; then RUN_WRAP=(setpriv --pdeathsig KILL); fi
# SIGUSR1 ignored until mpirun and tetra install their handlers: one that comes earlier is
# dropped (the stop-request file below still stops the run) instead of killing them
if env --ignore-signal=USR1 true 2>/dev/null; then RUN_WRAP=(env --ignore-signal=USR1 ${RUN_WRAP[@]+"${RUN_WRAP[@]}"}); fi
MPIRUN_WRAP=() # SIGTERM, SIGINT and SIGHUP blocked for mpirun (above: Slurm signals every process)
if env --block-signal=TERM true 2>/dev/null; then MPIRUN_WRAP=(env --block-signal=TERM --block-signal=INT --block-signal=HUP); fi
CHILD="" STOP_SIG="" ABANDONED=0 SIGNALS=0 RC=0
start_run() {
  if [ "$NGPU" = 1 ]; then
    setsid -w ${RUN_WRAP[@]+"${RUN_WRAP[@]}"} "$TETRA" train --job.config_file "$CONFIG_FILE" \
      ${QUICK[@]+"${QUICK[@]}"} "$@" </dev/null >&"$RUN_OUT" 2>&"$RUN_ERR" &
  else
    setsid -w ${RUN_WRAP[@]+"${RUN_WRAP[@]}"} ${MPIRUN_WRAP[@]+"${MPIRUN_WRAP[@]}"} \
      mpirun -np "$NGPU" --oversubscribe --bind-to none -x TETRA_COLOR -x TETRA_STOP_FILE \
      ./scripts/rank_exec.sh "$LOG_RANK" "$LOG_DIR" "$TETRA" train --job.config_file "$CONFIG_FILE" \
      ${QUICK[@]+"${QUICK[@]}"} "$@" </dev/null >&"$RUN_OUT" 2>&"$RUN_ERR" &
  fi
  CHILD=$!
}
pass_on() { # the first stop signal: SIGUSR1 to mpirun, which forwards it to every rank at once, or to
  # the single rank (the stop-request file names the signal received)
  kill -s USR1 "$CHILD" 2>/dev/null || true
}
on_signal() { # NAME
  SIGNALS=$((SIGNALS + 1))
  if [ -z "$CHILD" ]; then
    say "SIG$1 between attempts: nothing is running; stopping"
    finish $((128 + $(kill -l "$1")))
  fi
  if [ -z "$STOP_SIG" ]; then
    STOP_SIG=SIG$1
    printf 'SIG%s\n' "$1" >"$TETRA_STOP_FILE" 2>/dev/null || true
    say "SIG$1: every rank finishes the step in progress, saves it and stops (Ctrl-C again abandons the save)"
    pass_on
  elif [ "$1" = INT ]; then
    ABANDONED=1
    say "SIGINT again: abandoning the save and stopping every rank now; the newest complete checkpoint is unchanged"
    if [ "$NGPU" = 1 ]; then kill -s INT "$CHILD" 2>/dev/null || true; else kill -s KILL "$CHILD" 2>/dev/null || true; fi
  else
    say "SIG$1 again: already stopping after the step in progress (Ctrl-C abandons the save)"
  fi
}
for s in TERM INT USR1 HUP; do
  # shellcheck disable=SC2064
  trap "on_signal $s" "$s"
done
wait_run() { # until the run has exited: a signal interrupts `wait`, then it is waited for again
  local seen
  while :; do
    seen=$SIGNALS
    RC=0
    wait "$CHILD" 2>/dev/null || RC=$?
    [ "$seen" = "$SIGNALS" ] && break
  done
  CHILD=""
}

attempt=0
while :; do
  start_run "$@"
  wait_run
  [ "$ABANDONED" = 1 ] && finish 130
  if [ -n "$STOP_SIG" ]; then
    if [ "$RC" = 0 ]; then
      say "the run stopped cleanly on $STOP_SIG (exit code 0); run the same command again to resume"
    else
      say "stopped by $STOP_SIG, but the run failed while stopping (exit code $RC)"
    fi
    finish "$RC"
  fi
  [ "$RC" = 0 ] && finish 0
  if [ $attempt -ge "$MAX_RESTARTS" ]; then
    [ "$MAX_RESTARTS" = 0 ] || say "the run failed (exit code $RC) and all $MAX_RESTARTS restarts are used"
    finish "$RC"
  fi
  attempt=$((attempt + 1))
  cause="exit code $RC"
  [ "$RC" -gt 128 ] && cause="exit code $RC: signal $((RC - 128))"
  say "$(date '+%Y-%m-%d %H:%M:%S') the run failed ($cause); restart $attempt of $MAX_RESTARTS" \
      "from the newest complete checkpoint"
done
