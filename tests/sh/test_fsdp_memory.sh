#!/usr/bin/env bash
# Memory under FSDP: a unit's full parameters and gradients exist only while it
# computes, so what a rank holds shrinks with the shard degree.
#   1. A model whose parameters dominate (small flavor, 64 blocks: 0.2 B parameters,
#      fp32, seq 64, batch 1 per rank, the debug config's activation checkpointing, one
#      step: every buffer is taken at start-up, so the first step reaches the peak):
#      peak resident memory per rank at fsdp 4 <= 0.35 x the 1-rank peak, at fsdp 2
#      <= 0.6 x; each rank's start-up plan (persistent + working + activations) is
#      within 10% of its measured peak; the working parameters are two slots plus the
#      resident head, not the model.
#   2. --dry-run plans the same bytes as the real run (identical memory lines) without
#      training, and Llama 3 8B at fsdp 8 on the CUDA backend plans 8.03 B x 16 bytes / 8
#      of fp32 master, gradient and AdamW state plus the bf16 copy per GPU.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }
export OMP_WAIT_POLICY=PASSIVE
unset OMP_NUM_THREADS

MODEL=(train --job.config_file "$ROOT/configs/debug_model.toml" --model.flavor small --model.n_layers 64
       --training.seq_len 64 --training.local_batch_size 1 --training.steps 1 --training.device cpu
       --metrics.disable_color_printing --comm.init_timeout_seconds 120)
for np in 1 2 4; do
  s=$SECONDS
  mpirun -np $np --oversubscribe --bind-to none "$TETRA" "${MODEL[@]}" --training.global_batch_size $np \
    --job.dump_folder "$T/run$np" >"$T/run$np.log" 2>&1 || { bad "fsdp $np exited with $?"; tail -5 "$T/run$np.log"; }
  mpirun -np $np --oversubscribe --bind-to none "$TETRA" "${MODEL[@]}" --training.global_batch_size $np --dry-run \
    --job.dump_folder "$T/dry$np" >"$T/dry$np.log" 2>&1 || bad "dry run at $np ranks exited with $?"
  echo "ran 0.2 B parameters on $np rank(s) in $((SECONDS - s)) s (and its dry run)"
done

python3 - "$T" <<'P' || fail=1
import os, re, sys
d = sys.argv[1]
# under AddressSanitizer the resident memory holds its shadow and redzones too: the plans
# are still compared with the dry runs, the peaks with nothing
SAN = bool(os.environ.get("TETRA_SANITIZED"))
if SAN:
    print("note: sanitizer build: resident peaks are not compared with the plans")
UNIT = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}

def gib(num, unit):
    return float(num) * UNIT[unit] / 2**30

def plans(log):
    """rank -> (memory line without the log prefix, planned total GiB, working parameter GiB)"""
    out = {}
    for line in open(log, errors="replace"):
        m = re.search(r"INFO - (memory rank (\d+) .*)$", line)
        if m:
            body = m.group(1)
            tot = re.search(r"total ([\d.]+) (MiB|GiB)", body)
            wp = re.search(r"gathered parameters ([\d.]+) (MiB|GiB)", body)
            out[int(m.group(2))] = (body, gib(*tot.groups()), gib(*wp.groups()) if wp else 0.0)
    return out

def peaks(log):
    """rank -> measured peak resident GiB"""
    out = {}
    for line in open(log, errors="replace"):
        m = re.search(r"\[tetra(?:\|rank (\d+))?\].*training done: .*peak resident memory ([\d.]+) (MiB|GiB)", line)
        if m:
            out[int(m.group(1) or 0)] = gib(m.group(2), m.group(3))
    return out

ok = True
res = {}
print(f"{'ranks':>5} {'planned (rank 0)':>17} {'peak RSS (max rank)':>20} {'ratio to 1 rank':>16}")
for np in (1, 2, 4):
    p, r, dry = plans(f"{d}/run{np}.log"), peaks(f"{d}/run{np}.log"), plans(f"{d}/dry{np}.log")
    if len(p) != np or len(r) != np or len(dry) != np:
        print(f"FAIL {np} ranks: {len(p)} memory lines, {len(r)} peaks, {len(dry)} dry-run lines")
        ok = False
        continue
    for rank in range(np):
        if dry[rank][0] != p[rank][0]:
            print(f"FAIL {np} ranks, rank {rank}: the dry run plans\n  {dry[rank][0]}\nbut the run\n  {p[rank][0]}")
            ok = False
        if not SAN and abs(p[rank][1] / r[rank] - 1) > 0.10:
            print(f"FAIL {np} ranks, rank {rank}: planned {p[rank][1]:.3f} GiB, measured peak {r[rank]:.3f} GiB")
            ok = False
    res[np] = max(r.values())
    print(f"{np:>5} {p[0][1]:>13.3f} GiB {res[np]:>16.3f} GiB {res[np] / res[1] if 1 in res else 0:>16.3f}")
    if np > 1 and p[0][2] > 0.05:
        print(f"FAIL {np} ranks: working parameters {p[0][2]:.3f} GiB: more than two blocks and the head")
        ok = False
if 1 in res and 2 in res and 4 in res and not SAN:
    for np, gate in ((2, 0.6), (4, 0.35)):
        if res[np] > gate * res[1]:
            print(f"FAIL fsdp {np}: peak {res[np]:.3f} GiB is more than {gate} x the 1-rank {res[1]:.3f} GiB")
            ok = False
sys.exit(0 if ok else 1)
P
if [ $fail = 0 ] && [ -n "${TETRA_SANITIZED:-}" ]; then
  echo "ok   the dry runs plan what the runs plan (peaks not compared under the sanitizer)"
elif [ $fail = 0 ]; then
  echo "ok   fsdp 2 and 4 keep at most 0.6x and 0.35x of the 1-rank peak; plans match the runs"
fi

# Llama 3 8B, fsdp 8, CUDA backend, planned on this machine (no GPU needed)
if "$TETRA" info 2>/dev/null | grep -q "libtetra_cuda.so loaded"; then
  mpirun -np 8 --oversubscribe --bind-to none "$TETRA" train --dry-run --job.config_file "$ROOT/configs/llama3_8b.toml" \
    --training.device cuda --metrics.disable_color_printing >"$T/dry8b.log" 2>&1 || bad "8B dry run exited with $?"
  python3 - "$T/dry8b.log" <<'P' || fail=1
import re, sys
lines = [l for l in open(sys.argv[1], errors="replace") if "INFO - memory rank" in l]
ok = len(lines) == 8
n = 8030261248  # Llama 3 8B parameters (TorchTitan's count)
fp32_state = 0.0
for l in lines:
    m = re.search(r"persistent: parameters ([\d.]+) GiB, gradients ([\d.]+) GiB, optimizer state ([\d.]+) GiB", l)
    if not m:
        print("FAIL 8B plan without persistent GiB figures:", l.strip())
        ok = False
        continue
    p, g, o = (float(x) * 2**30 for x in m.groups())
    fp32_state = g + g + o  # master (as large as the gradient shard) + gradients + 2 moments
    want = n * 16 / 8
    # 2-decimal GiB figures: 0.5% tolerance; the parameters carry their bf16 copy (half of the fp32 shard)
    if abs(fp32_state / want - 1) > 0.005 or abs(p / (1.5 * g) - 1) > 0.005 or abs(o / (2 * g) - 1) > 0.005:
        print("FAIL 8B plan:", l.strip())
        ok = False
if ok:
    print(f"ok   8B fsdp 8 (cuda): {fp32_state / 2**30:.2f} GiB of fp32 state per GPU "
          f"(8.03 B x 16 B / 8 = {n * 2 / 2**30:.2f} GiB) plus the bf16 copy, every rank planned")
    print("     " + re.sub(r".*INFO - ", "", lines[0]).strip())
sys.exit(0 if ok else 1)
P
else
  echo "note: this build has no loadable CUDA backend; the 8B CUDA dry run is not checked"
fi
if [ $fail != 0 ]; then echo "FAIL fsdp memory"; exit 1; fi
echo "ok   fsdp memory"
