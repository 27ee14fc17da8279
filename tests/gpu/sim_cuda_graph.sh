#!/usr/bin/env bash
# training.cuda_graph on the CUDA kernels, without a GPU: `tetra-sim` runs the backend on
# the simulator, whose stream capture records the work (the kernels' arguments taken at the
# launch, cuBLASLt's descriptors and scalars, copies that read their host source when the
# graph runs) and fails on what a capture forbids (waits, synchronous copies, allocations).
#   - one rank, 4 steps, a log every 2nd: fp32; bf16 with float8 (tensorwise) and two
#     microbatches a step; block_causal document masks with full activation checkpointing:
#     steps 2-4 are launched as graphs (one built, then updated in place each step), with
#     the losses and gradient norms of the same run without graphs bit for bit and 0 host
#     waits per step;
#   - each fp32 graph (no cuDNN, whose attention the simulator does not have) holds as many
#     nodes as `tetra plan --ops` counts launches in the step (kernels/op_costs.h): every
#     launch of the step is in the graph;
#   - a profiled run: the step the profiler times runs without a graph, the others with
#     one;
#   - refused with a message naming the key: on the CPU backend, with 2 ranks (fsdp),
#     with enable_cpu_offload.
# Built with -DTETRA_CUDA_SIM=ON (./run_tests.sh does).
set -uo pipefail
BUILD="${TETRA_BUILD:-${TETRA_ROOT:-$(pwd)}/build}"
export TETRA_BIN="${TETRA_BIN:-$BUILD/bin}"
source "$(dirname "${BASH_SOURCE[0]}")/../sh/lib.sh"
SIM="$BUILD/tests/tetra-sim"
export OMP_WAIT_POLICY=PASSIVE

[ -x "$SIM" ] || { echo "FAIL $SIM not built (configure with -DTETRA_CUDA_SIM=ON)"; exit 1; }
command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }

COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --model.flavor tiny --training.seq_len 16
        --training.local_batch_size 4 --training.steps 4 --training.seed 42 --lr_scheduler.warmup_steps 2
        --metrics.disable_color_printing --metrics.peak_flops 1e12 --validation.no_enable --training.threads 1
        --metrics.log_freq 2)
run() { # name graph(true|false) [args...]
  local name=$1 g=$2
  shift 2
  "$SIM" "${COMMON[@]}" --training.device auto --training.cuda_graph "$g" --job.dump_folder "$T/$name" "$@" \
    >"$T/$name.log" 2>&1 </dev/null || { bad "$name exited with $?"; grep -E "ERROR|error|abort" "$T/$name.log" | head -5; }
  grep -q "backend cuda" "$T/$name.log" || bad "$name did not compute on the simulated CUDA kernels"
}
graphs() { # name expected-launches: the run's summary line
  local line
  line=$(grep -o "cuda graph: .*" "$T/$1.log")
  if [[ "$line" == "cuda graph: $2 steps launched as one graph each (1 built, $(($2 - 1)) updated in place)"* ]]; then
    ok "$1: $line"
  else
    bad "$1: expected $2 graph launches (1 built), the log says: ${line:-nothing}"
  fi
}

# the graph's nodes against the launches `tetra plan --ops` records for the step
nodes_match() { # name [args...]
  local name=$1 nodes launches
  shift
  nodes=$(grep -o "[0-9]* nodes in the last" "$T/$name.log" | awk '{print $1}')
  launches=$("$TETRA" plan "${COMMON[@]:1}" "$@" --ops 2>/dev/null | awk '$1 == "the" && $2 == "step" {print $3}')
  if [ -n "$nodes" ] && [ "$nodes" = "$launches" ]; then
    ok "$name: the graph's $nodes nodes are the $launches launches tetra plan --ops counts in the step"
  else
    bad "$name: ${nodes:-no} graph nodes, tetra plan --ops counts ${launches:-no} launches"
  fi
}

FP32=(--training.mixed_precision_param float32 --training.global_batch_size 4)
F8=(--training.mixed_precision_param bfloat16 --model.converters float8 --training.global_batch_size 8)
BC=(--training.mixed_precision_param float32 --training.global_batch_size 4 --model.attn_mask_type block_causal
    --activation_checkpoint.mode full)
for cfg in FP32 F8 BC; do
  declare -n args=$cfg
  run "${cfg,,}_eager" false "${args[@]}"
  run "${cfg,,}_graph" true "${args[@]}"
  graphs "${cfg,,}_graph" 3
  [ "$cfg" = F8 ] || nodes_match "${cfg,,}_graph" "${args[@]}"
done
PROF=(--profiling.enable_profiling --profiling.profile_freq 3 --profiling.profiler_active 1
      --profiling.save_traces_folder traces)
run prof_graph true "${FP32[@]}" "${PROF[@]}"
graphs prof_graph 2

python3 - "$T" <<'P'
import json, sys
d = sys.argv[1]

def rows(name):
    try:
        return {r["step"]: r for r in map(json.loads, open(f"{d}/{name}/metrics.jsonl")) if "loss" in r}
    except OSError:
        return {}

ok = True
for name in ("fp32", "f8", "bc"):
    eager, graph = rows(name + "_eager"), rows(name + "_graph")
    same = sorted(graph) == [1, 2, 4] and all(
        s in eager and (graph[s]["loss"], graph[s]["grad_norm"]) == (eager[s]["loss"], eager[s]["grad_norm"])
        for s in graph)
    waits = {s: r.get("host_waits") for s, r in graph.items()}
    good = same and all(w == 0 for w in waits.values())
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} {name:<4} graphs: losses and gradient norms at steps {sorted(graph)} the "
          f"bits of the run without graphs: {same}; host waits per step {waits}")
prof, eager = rows("prof_graph"), rows("fp32_eager")
same = bool(prof) and all((prof[s]["loss"], prof[s]["grad_norm"]) == (eager[s]["loss"], eager[s]["grad_norm"])
                          for s in prof if s in eager)
ok &= same
print(f"{'ok  ' if same else 'FAIL'} profiled step 3 without a graph, 2 and 4 with one: the same bits")
sys.exit(0 if ok else 1)
P
[ $? = 0 ] && ok "the runs with graphs give the bits of the runs without" || bad "the runs with graphs differ"

refused() { # name expected-text command...
  local name=$1 want=$2
  shift 2
  "$@" >"$T/$name.log" 2>&1 </dev/null
  local rc=$?
  if [ $rc -ne 0 ] && grep -q "training.cuda_graph $want" "$T/$name.log"; then
    ok "refused ($name): $(grep -o "training.cuda_graph $want[^(]*" "$T/$name.log" | head -1)"
  else
    bad "$name: exit $rc, expected a refusal 'training.cuda_graph $want'"
  fi
}
refused cpu "needs the CUDA backend" "$TETRA" "${COMMON[@]}" --training.device cpu --training.cuda_graph true \
  --job.dump_folder "$T/cpu"
refused fsdp2 "runs on one rank only" mpirun -np 2 --oversubscribe --bind-to none "$SIM" "${COMMON[@]}" \
  --training.device auto --training.cuda_graph true --job.dump_folder "$T/fsdp2"
refused offload "does not run with training.enable_cpu_offload" "$SIM" "${COMMON[@]}" --training.device auto \
  --training.cuda_graph true --training.enable_cpu_offload --job.dump_folder "$T/offload"

finish
