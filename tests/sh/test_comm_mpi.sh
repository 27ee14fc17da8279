#!/usr/bin/env bash
# comm.h over MPI with several ranks: tests/unit/test_comm_mpi.c under mpirun
# (every collective of every group of fsdp 4, hsdp 2x2, ddp 4 and cp x tp
# meshes, and FSDP on top), 3 ranks (an odd shard degree), and a stuck
# collective: one rank never arrives, so the others must end the job within the
# 2-second timeout, naming the operation, the group and the rank.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BUILD="${TETRA_BUILD:-$ROOT/build}"
EXE="$BUILD/tests/test_comm_mpi"

command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }
[ -x "$EXE" ] || { echo "FAIL $EXE not built"; exit 1; }
export OMP_WAIT_POLICY=PASSIVE
MPI=(mpirun --oversubscribe --bind-to none)

for np in 4 3 2; do
  if timeout 300 "${MPI[@]}" -np $np "$EXE" >"$T/out$np" 2>&1; then ok "$(grep test_comm_mpi: "$T/out$np")"
  else bad "test_comm_mpi on $np ranks:"; tail -30 "$T/out$np"; fi
done

# a stuck collective ends the job with a message, within the timeout
s=$SECONDS
TETRA_COMM_TEST_STUCK=1 timeout 60 "${MPI[@]}" -np 2 "$EXE" >"$T/stuck" 2>&1
rc=$?
dt=$((SECONDS - s))
msg="comm: all_gather on group dp_shard_cp (2 ranks) timed out after 2 s on rank 0 (collective #2 on this group, 4 x float32, issued during step 7)"
if [ $rc = 0 ] || [ $rc = 124 ]; then bad "stuck collective: exit $rc after $dt s (expected an abort)"; cat "$T/stuck"
elif ! grep -qF "$msg" "$T/stuck"; then bad "stuck collective: message missing:"; cat "$T/stuck"
elif ! grep -F "$msg" "$T/stuck" | grep -qE '^\[tetra\|rank 0\] [0-9-]+ [0-9:]+,[0-9]{3} - ERROR - comm: '; then
  bad "stuck collective: the line lacks the log's [tetra|rank 0] ... - ERROR - prefix:"; grep -F "$msg" "$T/stuck"
elif [ $dt -gt 30 ]; then bad "stuck collective: took $dt s to abort"
else ok "stuck collective aborted in $dt s (exit $rc): $msg"; fi

echo "test_comm_mpi.sh: $pass passed, $fail failed"
[ $fail = 0 ]
