#!/usr/bin/env bash
# Host waits per training step on the CUDA kernels, without a GPU: `tetra-sim` (the tetra
# executable on the CUDA-kernel simulator) counts every blocking copy and stream or device
# synchronisation its backend makes (ops.h host_waits), and metrics.jsonl reports them per
# step over each log window, leaving out the log step's own read:
#   - one rank, 4 steps, a log every 2nd: 0 host waits per step in fp32, in bf16 with
#     float8 (tensorwise), and with block_causal document masks (the document ids and
#     positions go to the device through the backend's page-locked staging);
#   - the same runs give the losses and gradient norms of a log-every-step run bit for bit
#     (the norm, clip coefficient, skip decision and AdamW's step count stay on the
#     device between reads and give what a read every step gives);
#   - fsdp 2 through MPI staged in host memory reports its staging copies (> 0 per step):
#     the count is not a constant;
#   - a profiled step's trace names every host wait where it happens: none in the one-rank
#     step, and under fsdp 2 each staging copy as a "host wait: ..." span inside the span
#     that asked for it (the FSDP or communication step it serves).
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
        --training.global_batch_size 4 --training.steps 4 --training.seed 42 --lr_scheduler.warmup_steps 2
        --metrics.disable_color_printing --metrics.peak_flops 1e12 --validation.no_enable --training.threads 1
        --training.device auto --training.mixed_precision_param float32)
run() { # name ranks log_freq [args...]
  local name=$1 np=$2 lf=$3
  shift 3
  mpirun -np "$np" --oversubscribe --bind-to none "$SIM" "${COMMON[@]}" --metrics.log_freq "$lf" \
    --job.dump_folder "$T/$name" "$@" >"$T/$name.log" 2>&1 ||
    { bad "$name exited with $?"; grep -E "ERROR|error|abort" "$T/$name.log" | head -5; }
  grep -q "backend cuda" "$T/$name.log" || bad "$name did not compute on the simulated CUDA kernels"
}

F8=(--training.mixed_precision_param bfloat16 --model.converters float8)
BC=(--model.attn_mask_type block_causal)
run fp32 1 2 --training.local_batch_size 4
run fp32_every 1 1 --training.local_batch_size 4
run f8 1 2 --training.local_batch_size 4 "${F8[@]}"
run f8_every 1 1 --training.local_batch_size 4 "${F8[@]}"
run bc 1 2 --training.local_batch_size 4 "${BC[@]}"
run bc_every 1 1 --training.local_batch_size 4 "${BC[@]}"
run fsdp2 2 2 --training.local_batch_size 2
PROF=(--profiling.enable_profiling --profiling.profile_freq 4 --profiling.profiler_active 2
      --profiling.save_traces_folder traces)
run fp32_prof 1 2 --training.local_batch_size 4 "${PROF[@]}"
run fsdp2_prof 2 2 --training.local_batch_size 2 "${PROF[@]}"

if python3 - "$T" <<'P'
import json, sys
d = sys.argv[1]

def rows(name):
    try:
        return {r["step"]: r for r in map(json.loads, open(f"{d}/{name}/metrics.jsonl")) if "loss" in r}
    except OSError:
        return {}

ok = True
for name in ("fp32", "f8", "bc"):
    cur, every = rows(name), rows(name + "_every")
    waits = {s: r.get("host_waits") for s, r in cur.items()}
    good = sorted(waits) == [1, 2, 4] and all(w == 0 for w in waits.values())
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} {name:<5} host waits per step at the log steps {waits}")
    same = bool(cur) and all(s in every and (cur[s]["loss"], cur[s]["grad_norm"]) ==
                             (every[s]["loss"], every[s]["grad_norm"]) for s in cur)
    ok &= same
    print(f"{'ok  ' if same else 'FAIL'} {name:<5} losses and gradient norms at steps {sorted(cur)} the same bits "
          f"as a read every step")
fs = rows("fsdp2")
w = [r.get("host_waits", 0) for r in fs.values()]
good = len(w) == 3 and all(x > 0 for x in w)
ok &= good
print(f"{'ok  ' if good else 'FAIL'} fsdp2 through staged MPI: {w} host waits per step (its staging copies)")

def waits_in_trace(name):
    """the host-wait spans of steps 3-4's trace, each with the innermost span around it"""
    try:
        ev = [e for e in json.load(open(f"{d}/{name}/traces/iteration_4/rank0_trace.json"))["traceEvents"]
              if e.get("ph") == "X" and e.get("tid") == 0]
    except (OSError, ValueError, KeyError):
        return None
    out = []
    for e in ev:
        if e.get("cat") != "host_wait":
            continue
        around = [p for p in ev if p is not e and p.get("cat") != "host_wait" and p["ts"] <= e["ts"] and
                  p["ts"] + p["dur"] >= e["ts"] + e["dur"]]
        inner = min(around, key=lambda p: p["dur"])["name"] if around else None
        out.append((e["name"], inner))
    return out

one, two = waits_in_trace("fp32_prof"), waits_in_trace("fsdp2_prof")
good = one == []
ok &= good
print(f"{'ok  ' if good else 'FAIL'} one rank, profiled steps 3-4: {one if one is None else len(one)} host-wait spans")
good = bool(two) and all(w.startswith("host wait: ") and inner and not inner.startswith("step ") for w, inner in two)
ok &= good
kinds = sorted({(w.split(" ")[2], inner.split(" ")[0] if inner else None) for w, inner in two or []})
print(f"{'ok  ' if good else 'FAIL'} fsdp2, profiled steps 3-4: {len(two or [])} host-wait spans, each inside the "
      f"span that asked for it: {kinds}")
sys.exit(0 if ok else 1)
P
then ok "host waits, bits and traces as above"
else bad "the runs' host waits, bits or traces (above)"; fi
finish
