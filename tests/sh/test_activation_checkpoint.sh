#!/usr/bin/env bash
# Activation checkpointing in the trainer (activation_checkpoint.mode / selective_ac_option):
# blocks that keep less recompute what they dropped in their backward's I pass with the
# same kernels in the same order, so every mode trains exactly as mode none:
#   - mode full, selective "2" (every 2nd block) and selective "op" (attention output and
#     every other matmul output kept) give losses and gradient norms bit-identical to
#     mode none, on 1 rank (fp32 and bf16), under fsdp 2 (units gathered again for the recompute), under
#     fsdp 2 x tp 2 (the recompute repeats the sequence-parallel collectives) and
#     under pp 2 with InterleavedZeroBubble (recompute in the I pass of each microbatch,
#     W passes deferred past other microbatches' work);
#   - the activation memory per microbatch the start-up line reports falls: full < op
#     and selective 2 < none;
#   - a bad option is refused naming the key.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
export OMP_WAIT_POLICY=PASSIVE
unset OMP_NUM_THREADS

COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.seq_len 128
        --training.global_batch_size 4 --training.steps 4 --training.seed 11 --lr_scheduler.warmup_steps 1
        --metrics.log_freq 1 --metrics.peak_flops 1e11 --metrics.disable_color_printing --training.device cpu)
MODES=("none none 2" "full full 2" "sel2 selective 2" "op selective op")
for layout in 1 bf16 2 fsdp2tp2 pp2; do
  for m in "${MODES[@]}"; do
    set -- $m
    name=$1 mode=$2 opt=$3
    lbs=4
    [ $layout = 2 ] && lbs=2
    [ $layout = fsdp2tp2 ] && lbs=2
    args=("${COMMON[@]}" --training.local_batch_size $lbs --activation_checkpoint.mode "$mode"
          --activation_checkpoint.selective_ac_option "$opt" --job.dump_folder "$T/${name}_$layout")
    if [ $layout = 1 ]; then
      "$TETRA" "${args[@]}" >"$T/${name}_$layout.log" 2>&1 || bad "$name on 1 rank exited with $?"
    elif [ $layout = bf16 ]; then
      "$TETRA" "${args[@]}" --training.mixed_precision_param bfloat16 >"$T/${name}_$layout.log" 2>&1 ||
        bad "$name in bf16 exited with $?"
    elif [ $layout = 2 ]; then
      mpirun -np 2 --oversubscribe --bind-to none "$TETRA" "${args[@]}" >"$T/${name}_$layout.log" 2>&1 ||
        bad "$name under fsdp 2 exited with $?"
    elif [ $layout = fsdp2tp2 ]; then
      mpirun -np 4 --oversubscribe --bind-to none "$TETRA" "${args[@]}" --parallelism.tensor_parallel_degree 2 \
        >"$T/${name}_$layout.log" 2>&1 || bad "$name under fsdp 2 x tp 2 exited with $?"
    else
      mpirun -np 2 --oversubscribe --bind-to none "$TETRA" "${args[@]}" --parallelism.pipeline_parallel_degree 2 \
        --parallelism.pipeline_parallel_schedule InterleavedZeroBubble >"$T/${name}_$layout.log" 2>&1 ||
        bad "$name under pp 2 exited with $?"
    fi
  done
done

python3 - "$T" <<'P' || fail=1
import json, re, sys
d = sys.argv[1]
ok = True

def run(name):
    rows = [json.loads(l) for l in open(f"{d}/{name}/metrics.jsonl") if l.strip()]
    return [(r["step"], r["loss"], r["grad_norm"]) for r in rows if "loss" in r]

def acts(name):
    for line in open(f"{d}/{name}.log", errors="replace"):
        m = re.search(r"memory rank 0 .*activations [\d.]+ \w+ \(1 microbatch x ([\d.]+) (MiB|GiB)", line)
        if m:
            return float(m.group(1)) * (1024 if m.group(2) == "GiB" else 1)
    return None

for layout in (1, "bf16", 2, "fsdp2tp2", "pp2"):
    ref = run(f"none_{layout}")
    if len(ref) != 4:
        print(f"FAIL mode none, {layout} rank(s): {len(ref)} steps logged")
        ok = False
    for name in ("full", "sel2", "op"):
        cur = run(f"{name}_{layout}")
        same = cur == ref
        ok &= same
        print(f"{'ok  ' if same else 'FAIL'} {name} on {layout} rank(s): losses and grad norms "
              f"{'bit-identical to' if same else 'differ from'} mode none "
              f"(step 4 loss {cur[-1][1] if cur else None!r})")
    if layout in ("bf16", "pp2", "fsdp2tp2"):
        continue  # the memory lines of these layouts have their own shape
    b = {n: acts(f"{n}_{layout}") for n in ("none", "full", "sel2", "op")}
    order = all(v is not None for v in b.values()) and b["full"] < b["op"] < b["none"] and b["full"] < b["sel2"] < b["none"]
    ok &= order
    print(f"{'ok  ' if order else 'FAIL'} activations per microbatch ({layout} rank(s), MiB): " +
          ", ".join(f"{k} {v}" for k, v in b.items()))
sys.exit(0 if ok else 1)
P

"$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --activation_checkpoint.selective_ac_option x2 \
  --training.steps 1 >"$T/badopt.log" 2>&1 && bad "selective_ac_option x2 was accepted"
grep -q "selective_ac_option" "$T/badopt.log" || bad "the error does not name the key: $(tail -1 "$T/badopt.log")"

if [ $fail != 0 ]; then echo "FAIL activation checkpointing"; exit 1; fi
echo "ok   activation checkpointing: every mode trains bit-identically to mode none (1 rank fp32 and bf16, fsdp 2, fsdp 2 x tp 2, pp 2)"
