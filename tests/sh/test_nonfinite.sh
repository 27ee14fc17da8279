#!/usr/bin/env bash
# Non-finite steps and absurd values:
#   1. lr 1e30 makes step 2's gradients NaN. training.on_nonfinite = "stop" (the default)
#      names the first non-finite gradient and its rank, exits 1 before the update, and
#      leaves the step-1 checkpoint as the newest (no checkpoint holds the NaN step).
#   2. "skip" under fsdp 2: every such step is logged as skipped, the run ends (exit 0).
#   3. NaN or infinite float keys and more threads than cores are refused by name.
set -uo pipefail
ROOT="${TETRA_ROOT:-$(pwd)}"
BIN="${TETRA_BIN:-$ROOT/build/bin}"
TETRA="$BIN/tetra"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
export OMP_WAIT_POLICY=PASSIVE
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.steps 5 --training.seq_len 64
        --training.global_batch_size 2 --metrics.log_freq 1 --metrics.disable_color_printing --training.device cpu
        --training.threads 1 --optimizer.lr 1e30 --lr_scheduler.warmup_steps 1)

"$TETRA" "${COMMON[@]}" --training.local_batch_size 2 --checkpoint.enable --checkpoint.interval 1 \
  --job.dump_folder "$T/stop" >"$T/stop.log" 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "first non-finite gradient: .*weight on rank 0" "$T/stop.log" &&
   grep -q "step 2: .*stopping before the update" "$T/stop.log" && [ -d "$T/stop/checkpoint/step-1" ] &&
   [ "$(ls "$T/stop/checkpoint")" = "step-1" ]; then
  ok "stop: exit 1 at step 2 naming $(grep -o 'first non-finite gradient: [^;]*' "$T/stop.log"); newest checkpoint step-1"
else
  bad "stop: exit $rc, checkpoints '$(ls "$T/stop/checkpoint" 2>/dev/null | tr '\n' ' ')': $(grep -m2 -E 'WARN|ERROR' "$T/stop.log")"
fi

mpirun -np 2 --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --training.local_batch_size 1 \
  --parallelism.data_parallel_shard_degree 2 --training.on_nonfinite skip --job.dump_folder "$T/skip" \
  >"$T/skip.log" 2>&1
rc=$?
n=$(grep -c "update skipped" "$T/skip.log")
steps=$(grep -c '"grad_norm"' "$T/skip/metrics.jsonl" 2>/dev/null)
[ $rc = 0 ] && [ "$n" -ge 1 ] && [ "${steps:-0}" = 5 ] && ok "skip under fsdp 2: $n steps skipped, 5 steps run, exit 0" ||
  bad "skip: exit $rc, $n skipped, ${steps:-0} steps"

expect_error() { # name pattern args...
  local name=$1 pat=$2
  shift 2
  "$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --training.steps 1 "$@" \
    --job.dump_folder "$T/$name" >"$T/$name.log" 2>&1 && bad "$name accepted"
  grep -q -- "$pat" "$T/$name.log" && ok "$name: $(grep -m1 -o 'ERROR - .*' "$T/$name.log" | head -c 140)" ||
    bad "$name: $(grep -m1 ERROR "$T/$name.log")"
}
expect_error lr_nan "optimizer.lr must be a finite number, got nan" --optimizer.lr nan
expect_error eps_inf "optimizer.eps must be a finite number, got inf" --optimizer.eps inf
expect_error peak_neg "metrics.peak_flops must be a positive finite number" --metrics.peak_flops -1
expect_error threads "training.threads = 100000: this host has" --training.threads 100000

if [ $fail != 0 ]; then echo "FAIL nonfinite"; exit 1; fi
echo "ok   nonfinite"
