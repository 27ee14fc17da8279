#!/usr/bin/env bash
# rank_exec.sh LOG_RANK LOG_DIR CMD... — run one MPI rank, showing its output
# only if it is among LOG_RANK ("all", or comma-separated ranks); otherwise the
# output goes to LOG_DIR/rank_N.log and only its errors reach the console. Used by
# run_train.sh under mpirun.
set -euo pipefail
show="$1"; dir="$2"; shift 2
rank="${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-0}}}"
case ",$show," in
  *",all,"*|*",$rank,"*) exec "$@" ;;
esac
# The console stays open as fd 3: tetra copies this rank's errors there, and shows rank 0
# whole when LOG_RANK names no rank of the run (engine/log.c).
exec 3>&2
LOG_RANK="$show" TETRA_LOG_CONSOLE_FD=3 exec "$@" >"$dir/rank_$rank.log" 2>&1
