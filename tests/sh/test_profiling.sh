#!/usr/bin/env bash
# Profiling traces ([profiling] enable_profiling): Chrome-trace JSON per rank.
#   1. fsdp 2 x tp 2 (4 ranks), 4 steps, profile_freq 2: rank<r>_trace.json under iteration_2
#      and iteration_4 for every rank, nothing for steps 1 and 3; profiler_active 2 with
#      profile_freq 4 records steps 3 and 4 in one file.
#   2. Each file is valid JSON; the training thread's spans nest (no partial overlaps), all
#      lie inside a step span, and the step's direct children cover >= 80% of it; it names
#      each block's forward, input and weight gradient, FSDP gathers, the schedule's actions
#      and the optimizer; the comm threads hold the tensor-parallel and FSDP collectives with
#      their bytes, and under pp 2 the pipeline's sends and receives.
#   3. Profiling changes no number: the losses equal the unprofiled run's bit for bit.
#   4. Op spans, 1 rank with AC off: every GEMM is a span nested in a block's span, and
#      their FLOPs (args) add up to exactly 6 x the linear weights x the step's tokens; each
#      block's attention forward and backward is a span per microbatch.
#   5. profile_freq 0 is refused naming the key.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }
export OMP_WAIT_POLICY=PASSIVE
unset OMP_NUM_THREADS

COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.seq_len 64 --training.steps 4
        --training.global_batch_size 4 --training.local_batch_size 2 --training.seed 7 --metrics.log_freq 1 --metrics.peak_flops 1e11
        --metrics.disable_color_printing --training.device cpu --training.threads 1)
PROF=(--profiling.enable_profiling --profiling.save_traces_folder traces)
run() { # name ranks [args...]
  local name=$1 np=$2
  shift 2
  mpirun -np "$np" --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --job.dump_folder "$T/$name" "$@" \
    >"$T/$name.log" 2>&1 || { bad "$name exited with $?"; tail -5 "$T/$name.log"; }
}
TP2=(--parallelism.tensor_parallel_degree 2)
run plain 4 "${TP2[@]}"
run prof 4 "${TP2[@]}" "${PROF[@]}" --profiling.profile_freq 2
run prof_active2 4 "${TP2[@]}" "${PROF[@]}" --profiling.profile_freq 4 --profiling.profiler_active 2
run prof_ops 1 "${PROF[@]}" --profiling.profile_freq 2 --activation_checkpoint.mode none
run prof_pp2 2 "${PROF[@]}" --profiling.profile_freq 4 --parallelism.pipeline_parallel_degree 2 \
  --training.global_batch_size 2 --parallelism.pipeline_parallel_schedule Interleaved1F1B \
  --parallelism.pipeline_parallel_layers_per_stage 2

python3 - "$T" <<'P' || fail=1
import json, os, sys
d = sys.argv[1]
ok = True

def say(good, msg):
    global ok
    ok &= bool(good)
    print(f"{'ok  ' if good else 'FAIL'} {msg}")
    return good

def files(run):
    root = f"{d}/{run}/traces"
    out = {}
    for it in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        for f in sorted(os.listdir(f"{root}/{it}")):
            out.setdefault(it, []).append(f"{root}/{it}/{f}")
    return out

f = files("prof")
say(sorted(f) == ["iteration_2", "iteration_4"] and all(len(v) == 4 for v in f.values()),
    f"profile_freq 2 over 4 steps: {', '.join(f'{k} ({len(v)} ranks)' for k, v in sorted(f.items()))}")
fa = files("prof_active2")
steps = []
if fa.get("iteration_4"):
    ev = json.load(open(fa["iteration_4"][0]))["traceEvents"]
    steps = sorted(e["name"] for e in ev if e.get("cat") == "step")
say(sorted(fa) == ["iteration_4"] and steps == ["step 3", "step 4"], f"profiler_active 2: iteration_4 holds {steps}")

def check_file(path, need_names, need_groups):
    doc = json.load(open(path))
    ev = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    main = sorted((e for e in ev if e["tid"] == 0), key=lambda e: (e["ts"], -e["dur"]))
    eps = 1e-3  # microseconds: rounding of the written times
    stack, nested, children, step_cover = [], True, {}, []
    for e in main:
        s, t = e["ts"], e["ts"] + e["dur"]
        while stack and s >= stack[-1][1] - eps:
            stack.pop()
        if stack and t > stack[-1][1] + eps:
            nested = False
        if e["cat"] == "step":
            if stack:
                nested = False
            step_cover.append([e, 0.0])
        elif not stack:
            nested = False  # outside every step
        elif len(stack) == 1:
            step_cover[-1][1] += e["dur"]
        stack.append((s, t))
    cover = min((c / max(st["dur"], 1e-9) for st, c in step_cover), default=0.0)
    names = {e["name"] for e in main}
    comm = [e for e in ev if e["tid"] > 0]
    groups = {e["args"]["group"] for e in comm if e["args"]["bytes"] > 0}
    missing = [n for n in need_names if n not in names]
    name = "/".join(path.split("/")[-3:])
    say(nested and step_cover, f"{name}: {len(main)} training-thread spans nest inside {len(step_cover)} step span(s)")
    say(cover >= 0.8, f"{name}: the step's direct children cover {100 * cover:.0f}% of it")
    say(not missing, f"{name}: names {len(need_names)} expected spans" + (f"; missing {missing}" if missing else ""))
    say(need_groups <= groups, f"{name}: {len(comm)} collectives on {len({e['tid'] for e in comm})} comm lanes, "
        f"groups {sorted(groups)} (need {sorted(need_groups)})")

for path in f.get("iteration_2", [])[:2]:
    check_file(path, ["forward layers.0", "backward input layers.0", "backward weight layers.0", "unshard layers.1",
                      "F stage 0 microbatch 0", "forward norm+output", "clip gradients and AdamW",
                      "load batch"], {"tp", "dp_shard_cp"})
pp = files("prof_pp2").get("iteration_4", [])
say(len(pp) == 2, f"pp 2: {len(pp)} rank traces")
for path in pp:
    check_file(path, ["clip gradients and AdamW"], {"pp"})

# op spans: debug model (dim 256, 6 blocks, 16 heads = kv heads, FFN 768, vocab 2048), 4 x 64
# tokens per step (2 microbatches of 2 under gradient accumulation), AC off: no recompute
ops = files("prof_ops").get("iteration_2", [])
if say(len(ops) == 1, f"op spans: {len(ops)} trace"):
    ev = [e for e in json.load(open(ops[0]))["traceEvents"] if e["ph"] == "X" and e["tid"] == 0]
    gemm = [e for e in ev if e["cat"] == "gemm"]
    attn = [e for e in ev if e["cat"] == "attention"]
    blocks = [e for e in ev if e["cat"] == "compute"]
    dim, ffn, layers, vocab, tokens = 256, 768, 6, 2048, 4 * 64
    linear = layers * (4 * dim * dim + 3 * dim * ffn) + vocab * dim
    flops = sum(e["args"]["flops"] for e in gemm)
    inside = all(any(b["ts"] <= g["ts"] and g["ts"] + g["dur"] <= b["ts"] + b["dur"] + 1e-3 for b in blocks)
                 for g in gemm)
    say(flops == 6 * linear * tokens, f"op spans: {len(gemm)} GEMMs, {flops:,.0f} FLOPs = 6 x {linear:,} linear "
        f"weights x {tokens} tokens ({6 * linear * tokens:,})")
    say(inside and gemm, f"op spans: every GEMM lies inside a block span ({len(blocks)} of them)")
    fwd = sum(e["name"].startswith("attention forward") for e in attn)
    bwd = sum(e["name"].startswith("attention backward") for e in attn)
    say(fwd == bwd == 2 * layers, f"op spans: attention forward {fwd}, backward {bwd} (2 microbatches x {layers} blocks)")

def losses(run):
    return [json.loads(l)["loss"] for l in open(f"{d}/{run}/metrics.jsonl") if '"grad_norm"' in l]
a, b = losses("plain"), losses("prof")
say(len(a) == 4 and a == b, f"profiling changes no loss: {a == b} over {len(a)} steps")
sys.exit(0 if ok else 1)
P

"$TETRA" "${COMMON[@]}" --profiling.enable_profiling --profiling.profile_freq 0 --job.dump_folder "$T/bad" \
  >"$T/bad.log" 2>&1 && bad "profile_freq 0 accepted"
grep -q "profiling.profile_freq and profiling.profiler_active must be >= 1" "$T/bad.log" ||
  bad "profile_freq 0: $(grep -m1 ERROR "$T/bad.log")"

if [ $fail != 0 ]; then echo "FAIL profiling"; exit 1; fi
echo "ok   profiling"
