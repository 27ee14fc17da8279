#!/usr/bin/env bash
# CPU offload (training.enable_cpu_offload) on the CUDA kernels, without a GPU: `tetra-sim`
# (the tetra executable on the CUDA-kernel simulator, tests/gpu/test_ops_sim) with the fp32
# master weights and AdamW's moments in page-locked host memory and AdamW run on the CPU
# backend, against the same run without offload. The tiny model, 16 tokens x 4 sequences,
# 2 steps, a checkpoint after the last:
#   - fp32 on one rank, bf16 with gradient accumulation 2 on one rank, bf16 on fsdp 2 (MPI
#     staged through host memory), float8 (bf16) on one rank: the loss and the gradient
#     norm of every step, and the checkpoint's bytes (the master weights and both moments
#     of every parameter), are the same bits with offload as without;
#   - each offloaded run's start-up names its host memory, and the CPU backend refuses the
#     key as meaningless.
# Built with -DTETRA_CUDA_SIM=ON (./run_tests.sh does).
set -uo pipefail
BUILD="${TETRA_BUILD:-${TETRA_ROOT:-$(pwd)}/build}"
export TETRA_BIN="${TETRA_BIN:-$BUILD/bin}"
source "$(dirname "${BASH_SOURCE[0]}")/../sh/lib.sh"
SIM="$BUILD/tests/tetra-sim"
export OMP_WAIT_POLICY=PASSIVE
[ -x "$SIM" ] || { echo "FAIL $SIM not built (configure with -DTETRA_CUDA_SIM=ON)"; exit 1; }
command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }

# metrics.peak_flops: the simulator would take minutes over the GEMM that measures it
COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --model.flavor tiny --training.seq_len 16
        --training.steps 2 --training.seed 42 --lr_scheduler.warmup_steps 2 --metrics.log_freq 1
        --metrics.disable_color_printing --metrics.peak_flops 1e12 --validation.no_enable --training.threads 1
        --training.device auto --checkpoint.enable --checkpoint.interval 100 --checkpoint.last_save_model_only false
        --comm.init_timeout_seconds 300 --comm.train_timeout_seconds 300)
run() { # name ranks [args...]
  local name=$1 np=$2
  shift 2
  mpirun -np "$np" --oversubscribe --bind-to none "$SIM" "${COMMON[@]}" --job.dump_folder "$T/$name" "$@" \
    >"$T/$name.log" 2>&1 || { bad "$name exited with $?"; grep -E "ERROR|error|abort" "$T/$name.log" | head -5; }
  grep -q "backend cuda" "$T/$name.log" || bad "$name did not compute on the simulated CUDA kernels"
}
# every step's loss and gradient norm, as logged
curve() {
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    o=json.loads(l); print(o["step"], repr(o["loss"]), repr(o["grad_norm"]))' "$1/metrics.jsonl" 2>/dev/null
}
same() { # name ranks [args...]: with and without offload
  local name=$1 np=$2
  shift 2
  run "$name" "$np" "$@"
  run "$name-offload" "$np" "$@" --training.enable_cpu_offload
  grep -qE "cpu offload rank 0: ([1-9][0-9.]*|0\.[0-9]*[1-9][0-9]*) (MiB|GiB) of page-locked host memory" \
    "$T/$name-offload.log" || bad "$name-offload: no start-up line names the (non-zero) host memory"
  local a b
  a="$(curve "$T/$name")"
  b="$(curve "$T/$name-offload")"
  if [ -z "$a" ] || [ "$(echo "$a" | wc -l)" -ne 2 ]; then bad "$name: no 2-step curve"; return; fi
  [ "$a" = "$b" ] && ok "$name: losses and gradient norms the same bits with offload" ||
    { bad "$name: the curves differ"; diff <(echo "$a") <(echo "$b") | head -6; }
  local files n=0
  files="$(cd "$T/$name/checkpoint/step-2" 2>/dev/null && ls)"
  [ -n "$files" ] || { bad "$name: no checkpoint at step 2"; return; }
  for f in $files; do
    cmp -s "$T/$name/checkpoint/step-2/$f" "$T/$name-offload/checkpoint/step-2/$f" || { bad "$name: $f differs"; n=1; }
  done
  [ $n = 0 ] && ok "$name: the checkpoint (master weights, exp_avg, exp_avg_sq) the same bytes ($(echo $files | wc -w) files)"
}

same fp32 1 --training.local_batch_size 4 --training.mixed_precision_param float32
same bf16-accum2 1 --training.local_batch_size 2 --training.global_batch_size 4 \
  --training.mixed_precision_param bfloat16
same fsdp2-bf16 2 --training.local_batch_size 2 --training.mixed_precision_param bfloat16
same float8 1 --training.local_batch_size 4 --training.mixed_precision_param bfloat16 --model.converters float8 \
  --quantize.linear.float8.filter_fqns output

if "$SIM" "${COMMON[@]}" --training.device cpu --training.enable_cpu_offload --job.dump_folder "$T/cpu" \
  >"$T/cpu.log" 2>&1; then
  bad "offload on training.device = cpu was accepted"
else
  grep -q "enable_cpu_offload has no meaning" "$T/cpu.log" && ok "the CPU backend refuses offload as meaningless" ||
    bad "the refusal on the CPU does not say why: $(head -c 300 "$T/cpu.log")"
fi
finish
