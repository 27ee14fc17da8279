#!/usr/bin/env bash
# Mixed precision (training.mixed_precision_param = "bfloat16": bf16 parameter copies
# and activations, fp32 master weights, gradients, reductions and AdamW state), on the
# device given by DEVICE (cpu by default; tests/gpu runs this script with DEVICE=cuda):
#   1. the bf16 run follows the fp32 run of the same seed: every step's loss within 0.5%
#      relative (bf16 keeps 8 bits of mantissa; the gap is rounding, not a bug), the
#      loss falls, and the two runs really differ (bf16 is in effect);
#   2. the bf16 run is deterministic: run again, bit-identical losses;
#   3. FSDP over 2 ranks in bf16 (the all-gather moves bf16, gradients reduce-scatter in
#      fp32) reproduces the 1-rank bf16 losses within 1e-3 relative (the ranks sum
#      gradients in another order, and bf16 rounding of the updated weights can
#      amplify a last-bit fp32 difference);
#   4. the memory line reports the bf16 compute copy, and no backend memory is
#      allocated during training.
#   5. mixed_precision_reduce = bfloat16 is refused with a message naming the key.
# With DEVICE=cuda and fewer GPUs than ranks, step 3 is skipped with a message.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DEVICE="${DEVICE:-cpu}"
STEPS="${MP_STEPS:-12}"
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
if [ "$DEVICE" = cuda ]; then
  gpus="$("$TETRA" info --gpu-count 2>/dev/null || echo 0)"
  if ! [ "$gpus" -ge 1 ] 2>/dev/null; then echo "SKIP: no CUDA device visible to this build"; exit 0; fi
else
  gpus=0
fi
export OMP_WAIT_POLICY=PASSIVE
unset OMP_NUM_THREADS

COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.device "$DEVICE"
        --training.seq_len 128 --training.global_batch_size 8 --training.steps "$STEPS" --training.seed 7
        --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 --metrics.peak_flops 1e11 --metrics.disable_color_printing
        --comm.init_timeout_seconds 120 --comm.train_timeout_seconds 120)
run() {  # name ranks [args...]
  local name=$1 np=$2
  shift 2
  local s=$SECONDS
  if [ "$np" = 1 ]; then
    "$TETRA" "${COMMON[@]}" --job.dump_folder "$T/$name" "$@" >"$T/$name.log" 2>&1
  else
    mpirun -np "$np" --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --job.dump_folder "$T/$name" "$@" \
      >"$T/$name.log" 2>&1
  fi
  local rc=$?
  echo "ran $name ($np rank(s), $DEVICE) in $((SECONDS - s)) s, exit $rc"
  if [ $rc != 0 ]; then echo "FAIL $name exited with $rc:"; tail -20 "$T/$name.log"; fail=1; fi
}

run fp32 1 --training.local_batch_size 8 --training.mixed_precision_param float32
run bf16 1 --training.local_batch_size 8 --training.mixed_precision_param bfloat16 --training.deterministic
run bf16_again 1 --training.local_batch_size 8 --training.mixed_precision_param bfloat16 --training.deterministic
FSDP=1
if [ "$DEVICE" = cuda ] && [ "$gpus" -lt 2 ]; then
  echo "skip fsdp2: NCCL puts one rank per GPU and $gpus GPU(s) are visible"
  FSDP=0
else
  run bf16_fsdp2 2 --training.local_batch_size 4 --training.mixed_precision_param bfloat16 \
    --parallelism.data_parallel_shard_degree 2
fi

python3 - "$T" "$STEPS" "$FSDP" <<'P' || fail=1
import json, re, sys
d, steps, fsdp = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
def losses(name):
    try:
        rows = [json.loads(l) for l in open(f"{d}/{name}/metrics.jsonl") if l.strip()]
    except OSError:
        return {}
    return {r["step"]: r["loss"] for r in rows if "loss" in r}
def log(name):
    try:
        return open(f"{d}/{name}.log", errors="replace").read()
    except OSError:
        return ""
ok = True
def check(cond, what):
    global ok
    print(("ok   " if cond else "FAIL ") + what)
    ok = ok and cond
f32, b16, again = losses("fp32"), losses("bf16"), losses("bf16_again")
check(len(f32) == steps and len(b16) == steps, f"fp32 and bf16 runs logged {len(f32)} and {len(b16)} of {steps} steps")
if f32 and b16:
    rel = max(abs(b16[s] - f32[s]) / abs(f32[s]) for s in f32 if s in b16)
    check(rel <= 5e-3, f"bf16 follows fp32: max relative loss difference {rel:.3e} (gate 5e-3)")
    check(any(b16[s] != f32[s] for s in f32 if s in b16), "bf16 differs from fp32 (mixed precision is in effect)")
    check(b16[steps] < b16[1] - 0.5, f"bf16 loss falls: {b16[1]:.4f} -> {b16[steps]:.4f}")
    print("step  fp32 loss           bf16 loss           rel diff")
    for s in sorted(f32):
        if s in b16:
            print(f"{s:>4}  {f32[s]:.15f}  {b16[s]:.15f}  {abs(b16[s] - f32[s]) / abs(f32[s]):.2e}")
check(again == b16 and len(again) == steps, "bf16 rerun with the same seed: bit-identical losses")
if fsdp:
    fs = losses("bf16_fsdp2")
    common = sorted(set(fs) & set(b16))
    rel = max((abs(fs[s] - b16[s]) / abs(b16[s]) for s in common), default=float("inf"))
    check(len(common) == steps and rel <= 1e-3, f"fsdp 2 bf16 vs 1 rank bf16: max relative difference {rel:.3e} (gate 1e-3)")
    m = re.search(r"memory rank 0 \(shard \d of 2, bf16 compute", log("bf16_fsdp2"))
    check(m is not None, "fsdp 2 memory line names the bf16 compute copy")
check("memory rank 0 (bf16 compute" in log("bf16"), "memory line names the bf16 compute copy")
check("memory rank 0 (fp32)" in log("fp32"), "float32 run computes in fp32")
for n in ["fp32", "bf16"]:
    m = re.search(r"(\d+) backend allocations during training", log(n))
    check(m is not None and m.group(1) == "0", f"{n}: no backend allocation during training ({m.group(0) if m else 'no line'})")
sys.exit(0 if ok else 1)
P

out="$("$TETRA" "${COMMON[@]}" --job.dump_folder "$T/bad" --training.mixed_precision_reduce bfloat16 2>&1)"
rc=$?
if [ $rc != 0 ] && grep -q "training.mixed_precision_reduce" <<<"$out"; then
  echo "ok   mixed_precision_reduce = bfloat16 refused: $(grep -o 'training.mixed_precision_reduce.*' <<<"$out" | head -c 120)"
else
  echo "FAIL mixed_precision_reduce = bfloat16 not refused (exit $rc): $out"; fail=1
fi
if [ $fail != 0 ]; then echo "FAIL mixed precision"; exit 1; fi
echo "ok   mixed precision ($DEVICE)"
