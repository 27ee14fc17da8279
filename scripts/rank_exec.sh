#!/usr/bin/env bash
# rank_exec.sh LOG_RANK LOG_DIR CMD... — run one MPI rank, showing its output
# only if it is among LOG_RANK ("all", or comma-separated ranks); otherwise the
# output goes to LOG_DIR/rank_N.log and only its errors reach the console. Used by
# run_train.sh under mpirun.
# The rank dies with its launcher (mpirun, srun's step daemon): never an orphan that
# trains on unsupervised when the launcher is killed.
# SIGUSR1 (the launcher's stop request, forwarded by mpirun) is ignored until tetra installs
# its handler: one that comes earlier is dropped, and run_train.sh's stop-request file still
# stops the run, instead of killing the rank.
trap '' USR1
set -euo pipefail
show="$1"; dir="$2"; shift 2
rank="${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-0}}}"
if setpriv --pdeathsig KILL true 2>/dev/null; then set -- setpriv --pdeathsig KILL "$@"; fi
case ",$show," in
  *",all,"*|*",$rank,"*) exec "$@" ;;
esac
# The console stays open as fd 3: tetra copies this rank's errors there, and shows rank 0
# whole when LOG_RANK names no rank of the run (telemetry/log.c).
exec 3>&2
LOG_RANK="$show" TETRA_LOG_CONSOLE_FD=3 exec "$@" >"$dir/rank_$rank.log" 2>&1
