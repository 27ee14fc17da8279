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
set -euo pipefail

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
  echo "run_train.sh: NGPU must be a positive integer (got '$NGPU')" >&2
  exit 2
fi

MAX_RESTARTS="${TETRA_MAX_RESTARTS:-0}"
if ! [ "$MAX_RESTARTS" -ge 0 ] 2>/dev/null; then
  echo "run_train.sh: TETRA_MAX_RESTARTS must be a non-negative integer (got '$MAX_RESTARTS')" >&2
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
launch() {
  if [ "$NGPU" = 1 ]; then
    "$TETRA" train --job.config_file "$CONFIG_FILE" ${QUICK[@]+"${QUICK[@]}"} "$@"
  else
    mkdir -p "$LOG_DIR"
    mpirun -np "$NGPU" --oversubscribe --bind-to none -x TETRA_COLOR \
      ./scripts/rank_exec.sh "$LOG_RANK" "$LOG_DIR" "$TETRA" train --job.config_file "$CONFIG_FILE" \
      ${QUICK[@]+"${QUICK[@]}"} "$@"
  fi
}
if [ "$MAX_RESTARTS" = 0 ]; then # the launcher becomes the run: signals reach it directly
  if [ "$NGPU" = 1 ]; then exec "$TETRA" train --job.config_file "$CONFIG_FILE" ${QUICK[@]+"${QUICK[@]}"} "$@"; fi
  mkdir -p "$LOG_DIR"
  exec mpirun -np "$NGPU" --oversubscribe --bind-to none -x TETRA_COLOR \
    ./scripts/rank_exec.sh "$LOG_RANK" "$LOG_DIR" "$TETRA" train --job.config_file "$CONFIG_FILE" \
    ${QUICK[@]+"${QUICK[@]}"} "$@"
fi
attempt=0
while :; do
  set +e
  launch "$@"
  rc=$?
  set -e
  [ $rc = 0 ] && exit 0
  if [ $attempt -ge "$MAX_RESTARTS" ]; then
    echo "run_train.sh: the run failed (exit code $rc) and all $MAX_RESTARTS restarts are used" >&2
    exit $rc
  fi
  attempt=$((attempt + 1))
  cause="exit code $rc"
  [ $rc -gt 128 ] && cause="exit code $rc: signal $((rc - 128))"
  echo "run_train.sh: $(date '+%Y-%m-%d %H:%M:%S') the run failed ($cause); restart $attempt of $MAX_RESTARTS" \
       "from the newest complete checkpoint" >&2
done
