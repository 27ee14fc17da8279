#!/usr/bin/env bash
# Loss-parity gate (TorchTitan gates its CI on loss parity too): with a fixed
# seed, the debug model trained for 10 steps under FSDP, HSDP and DDP on CPU
# ranks launched with mpirun must reproduce the single-rank losses: step 1
# within 1e-6 relative, every step within 1e-5. The global batch is the same
# in every layout (8 sequences of 64 tokens: local_batch_size x dp, or
# gradient accumulation), so the runs differ only in summation order.
# Also checks that the persistent per-rank parameter, gradient and optimizer
# memory shrinks N-fold under fsdp N.
#
#   PARITY_STEPS=50 tests/sh/test_loss_parity.sh     longer curve
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
STEPS="${PARITY_STEPS:-10}"

if ! command -v mpirun >/dev/null; then
  echo "FAIL mpirun not found (install openmpi-bin)"; exit 1
fi
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
export OMP_WAIT_POLICY=PASSIVE
unset OMP_NUM_THREADS  # threads per rank = cores / ranks (training.threads = 0)

COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.seq_len 64
        --training.global_batch_size 8 --training.steps "$STEPS" --training.seed 42
        --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 --metrics.peak_flops 1e11 --metrics.disable_color_printing
        --comm.init_timeout_seconds 120 --comm.train_timeout_seconds 120)

# name ranks local_batch_size dp_replicate dp_shard [extra args...]
LAYOUTS=(
  "single 1 8 1 -1"
  "fsdp2 2 4 1 -1"
  "fsdp4 4 2 1 -1"
  "hsdp2x2 4 2 2 2"
  "ddp2 2 4 2 1"
  "fsdp2_reshard_always 2 4 1 -1 --parallelism.fsdp_reshard_after_forward always"
  "fsdp4_accum2 4 1 1 -1"
)

t0=$SECONDS
for l in "${LAYOUTS[@]}"; do
  set -- $l
  name=$1 np=$2 lbs=$3 rep=$4 shard=$5
  shift 5
  out="$T/$name"
  args=("${COMMON[@]}" --training.local_batch_size "$lbs" --parallelism.data_parallel_replicate_degree "$rep"
        --parallelism.data_parallel_shard_degree "$shard" --job.dump_folder "$out" "$@")
  s=$SECONDS
  if [ "$np" = 1 ]; then
    "$TETRA" "${args[@]}" >"$T/$name.log" 2>&1
  else
    mpirun -np "$np" --oversubscribe --bind-to none "$TETRA" "${args[@]}" >"$T/$name.log" 2>&1
  fi
  rc=$?
  echo "ran $name ($np ranks) in $((SECONDS - s)) s, exit $rc"
  if [ $rc != 0 ]; then
    echo "FAIL $name exited with $rc:"; tail -20 "$T/$name.log"; fail=1
  fi
done

python3 - "$T" "$STEPS" <<'P' || fail=1
import json, re, sys
d, steps = sys.argv[1], int(sys.argv[2])
names = ["single", "fsdp2", "fsdp4", "hsdp2x2", "ddp2", "fsdp2_reshard_always", "fsdp4_accum2"]

def losses(name):
    try:
        rows = [json.loads(l) for l in open(f"{d}/{name}/metrics.jsonl") if l.strip()]
    except OSError:
        return {}
    return {r["step"]: r["loss"] for r in rows if "loss" in r}

def mem(name):
    """rank 0's persistent parameter / gradient / optimizer MiB from its start-up line"""
    for line in open(f"{d}/{name}.log", errors="replace"):
        m = re.search(r"memory rank 0 .*?parameters ([\d.]+) MiB, gradients ([\d.]+) MiB, optimizer state ([\d.]+) MiB", line)
        if m:
            return tuple(float(x) for x in m.groups())
    return None

ref = losses("single")
ok = len(ref) == steps
if not ok:
    print(f"FAIL single-rank reference logged {len(ref)} of {steps} steps")
print(f"{'layout':<22} {'steps':>5} {'max rel diff':>13} {'step-1 rel diff':>16}  {'params/grads/optim MiB (rank 0)':<34} result")
base = mem("single")
for n in names:
    cur = losses(n)
    m = mem(n)
    ms = "%.1f / %.1f / %.1f" % m if m else "?"
    if n == "single":
        print(f"{n:<22} {len(cur):>5} {'(reference)':>13} {'':>16}  {ms:<34} {'ok' if ok else 'FAIL'}")
        continue
    common = sorted(set(cur) & set(ref))
    rel = {s: abs(cur[s] - ref[s]) / abs(ref[s]) for s in common}
    mx = max(rel.values()) if rel else float("inf")
    s1 = rel.get(1, float("inf"))
    good = len(common) == steps and s1 <= 1e-6 and mx <= 1e-5
    # memory: fsdp N keeps 1/N of the parameters, gradients and optimizer state
    shard = {"fsdp2": 2, "fsdp4": 4, "hsdp2x2": 2, "ddp2": 1, "fsdp2_reshard_always": 2, "fsdp4_accum2": 4}[n]
    if m and base:
        for a, b in zip(m, base):
            if abs(a * shard / b - 1.0) > 0.05:
                good = False
                print(f"FAIL {n}: {a} MiB per rank is not 1/{shard} of {b} MiB")
    elif not m:
        good = False
    print(f"{n:<22} {len(common):>5} {mx:>13.3e} {s1:>16.3e}  {ms:<34} {'ok' if good else 'FAIL'}")
    ok = ok and good
sys.exit(0 if ok else 1)
P
echo "loss parity: $((SECONDS - t0)) s in all"
if [ $fail != 0 ]; then echo "FAIL loss parity"; exit 1; fi
echo "ok   loss parity: every layout reproduces the single-rank losses"
