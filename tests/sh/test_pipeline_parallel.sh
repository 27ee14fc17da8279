#!/usr/bin/env bash
# Pipeline parallel in the trainer, on CPU ranks (debug model, 6 blocks, seq 64,
# global batch 8, microbatches of 1 sequence):
#   1. every schedule (GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble,
#      ZBVZeroBubble, DualPipeV) at pp 2 and pp 4 reproduces the 1-rank loss curve
#      within 1e-5 relative at each of 4 steps (fp32); so do ZB-H1 at pp 4
#      (InterleavedZeroBubble, one stage per rank), pp 2 x fsdp 2 (also Interleaved1F1B
#      with 2 microbatches, whose two stages per rank take turns in one unsharded
#      gradient buffer),
#      pp 2 x tp 2 x fsdp 2 (8 ranks), gradient accumulation under pp 2 and the
#      validation loss; bf16 under pp 2 follows the 1-rank bf16 run within 1e-3.
#   2. A schedule dumped to CSV by `tetra plan pp` (compute-only and lowered) and
#      loaded with pipeline_parallel_schedule_csv gives the generated run bit for bit.
#   3. Checkpoints: a pp 2 checkpoint of step 3 resumes under pp 2 (bit for bit), 1 rank,
#      pp 4 (ZBV) and pp 2 x fsdp 2 (within 1e-5 of the uninterrupted run); the Hugging
#      Face export of a pp 2 run is byte-identical to a 1-rank run's.
#   4. Bad layouts and schedules are refused before training, naming key and numbers.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }
export OMP_WAIT_POLICY=PASSIVE
unset OMP_NUM_THREADS

STEPS=4
COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.seq_len 64
        --training.global_batch_size 8 --training.steps $STEPS --training.seed 42 --lr_scheduler.warmup_steps 2
        --metrics.log_freq 1 --metrics.peak_flops 1e11 --metrics.disable_color_printing --training.device cpu --training.threads 1
        --comm.init_timeout_seconds 300 --comm.train_timeout_seconds 300)
PP=(--parallelism.pipeline_parallel_degree)
SCHED=--parallelism.pipeline_parallel_schedule
run() { # name ranks [args...]
  local name=$1 np=$2
  shift 2
  local s=$SECONDS
  mpirun -np "$np" --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --job.dump_folder "$T/$name" "$@" \
    >"$T/$name.log" 2>&1 || { bad "$name exited with $?"; grep -E "ERROR|error|abort" "$T/$name.log" | head -5; }
  echo "ran $name ($np ranks) in $((SECONDS - s)) s"
}

run single 1 --training.local_batch_size 8
for s in GPipe 1F1B Interleaved1F1B LoopedBFS InterleavedZeroBubble ZBVZeroBubble DualPipeV; do
  run "pp2_$s" 2 --training.local_batch_size 8 "${PP[@]}" 2 $SCHED $s
  run "pp4_$s" 4 --training.local_batch_size 8 "${PP[@]}" 4 $SCHED $s
done
# ZB-H1: InterleavedZeroBubble with one stage per rank (8 effective layers / 2 per stage = 4 stages)
run pp4_ZB-H1 4 --training.local_batch_size 8 "${PP[@]}" 4 $SCHED InterleavedZeroBubble \
  --parallelism.pipeline_parallel_layers_per_stage 2
run pp2_fsdp2 4 --training.local_batch_size 4 "${PP[@]}" 2 $SCHED InterleavedZeroBubble
# 2 microbatches over 2 stages per rank: each rank's later stage finishes its backwards (and
# reductions) before the earlier one starts, so their unsharded gradients share one buffer
run pp2_fsdp2_turns 4 --training.local_batch_size 4 "${PP[@]}" 2 $SCHED Interleaved1F1B \
  --parallelism.pipeline_parallel_microbatch_size 2
grep -q "unsharded gradients [0-9.]* [KMG]iB (2 stages taking turns in 1)" "$T/pp2_fsdp2_turns.log" ||
  bad "pp2_fsdp2_turns: the stages' unsharded gradients do not share a buffer"
run pp2_tp2_fsdp2 8 --training.local_batch_size 4 "${PP[@]}" 2 $SCHED ZBVZeroBubble \
  --parallelism.tensor_parallel_degree 2
run pp2_accum2 2 --training.local_batch_size 4 "${PP[@]}" 2 $SCHED 1F1B
run single_val 1 --training.local_batch_size 8 --validation.enable --validation.freq 3 --validation.steps 2 \
  --validation.local_batch_size 4 --validation.seq_len 64
run pp2_val 2 --training.local_batch_size 8 "${PP[@]}" 2 $SCHED ZBVZeroBubble --validation.enable \
  --validation.freq 3 --validation.steps 2 --validation.local_batch_size 4 --validation.seq_len 64
run single_bf16 1 --training.local_batch_size 8 --training.mixed_precision_param bfloat16
run pp2_bf16 2 --training.local_batch_size 8 "${PP[@]}" 2 $SCHED InterleavedZeroBubble \
  --training.mixed_precision_param bfloat16

# schedules as data: the generator's CSV, compute-only and lowered, runs the same steps
"$TETRA" plan pp --schedule ZBVZeroBubble --pp 2 --microbatches 8 --stages-per-rank 2 --csv "$T/zbv.csv" \
  >"$T/plan.log" 2>&1 || bad "tetra plan pp --csv exited with $?"
"$TETRA" plan pp --schedule ZBVZeroBubble --pp 2 --microbatches 8 --stages-per-rank 2 --with-comms \
  --csv "$T/zbv_comms.csv" >>"$T/plan.log" 2>&1 || bad "tetra plan pp --with-comms exited with $?"
run pp2_csv 2 --training.local_batch_size 8 "${PP[@]}" 2 $SCHED ZBVZeroBubble \
  --parallelism.pipeline_parallel_schedule_csv "$T/zbv.csv"
run pp2_csv_comms 2 --training.local_batch_size 8 "${PP[@]}" 2 $SCHED ZBVZeroBubble \
  --parallelism.pipeline_parallel_schedule_csv "$T/zbv_comms.csv"

# checkpoints: pp 2 saves step 3 (and runs on); resume the copy under other layouts
run ck_pp2 2 --training.local_batch_size 8 "${PP[@]}" 2 $SCHED 1F1B --checkpoint.enable --checkpoint.interval 3
for lay in "res_pp2 2 --training.local_batch_size 8 ${PP[*]} 2 $SCHED 1F1B" "res_pp1 1 --training.local_batch_size 8" \
           "res_pp4_zbv 4 --training.local_batch_size 8 ${PP[*]} 4 $SCHED ZBVZeroBubble" \
           "res_pp2_fsdp2 4 --training.local_batch_size 4 ${PP[*]} 2 $SCHED GPipe"; do
  set -- $lay
  name=$1 np=$2
  shift 2
  mkdir -p "$T/$name/checkpoint" && cp -r "$T/ck_pp2/checkpoint/step-3" "$T/$name/checkpoint/"
  run "$name" "$np" "$@" --checkpoint.enable --checkpoint.interval 100
done

# Hugging Face export with the weights unchanged (lr 0): the same bytes from pp 2 as from 1 rank
for np in 1 2; do
  mpirun -np $np --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --training.steps 1 --training.local_batch_size 8 \
    "${PP[@]}" $np --optimizer.lr 0 --checkpoint.enable --checkpoint.last_save_in_hf --checkpoint.export_dtype float32 \
    --job.dump_folder "$T/hf$np" >"$T/hf$np.log" 2>&1 || bad "HF export at pp $np exited with $?"
done
if cmp -s "$T/hf1/checkpoint/step-1/model.safetensors" "$T/hf2/checkpoint/step-1/model.safetensors"; then
  echo "ok   the Hugging Face export of a pp 2 run is byte-identical to the 1-rank run's"
else
  bad "the pp 2 Hugging Face export differs from the 1-rank one"
fi

python3 - "$T" "$STEPS" <<'P' || fail=1
import json, sys
d, steps = sys.argv[1], int(sys.argv[2])
ok = True

def rows(name):
    try:
        return [json.loads(l) for l in open(f"{d}/{name}/metrics.jsonl") if l.strip()]
    except OSError:
        return []

def run(name):
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in rows(name) if "loss" in r}

def close(name, ref, want, tol):
    global ok
    cur = run(name)
    rel = [abs(cur[s][0] - ref[s][0]) / abs(ref[s][0]) for s in want if s in cur and s in ref]
    good = len(rel) == len(want) and max(rel) <= tol
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} {name:<28} {len(rel)} steps, max rel loss diff "
          f"{max(rel) if rel else float('nan'):.2e} (gate {tol:g})")

def same(name, ref_name, want):
    global ok
    a, b = run(name), run(ref_name)
    good = all(s in a and s in b and a[s] == b[s] for s in want)
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} {name:<28} losses and grad norms bit-identical to {ref_name} "
          f"at steps {want[0]}-{want[-1]}")

ref = run("single")
every = list(range(1, steps + 1))
for s in ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"):
    close(f"pp2_{s}", ref, every, 1e-5)
    close(f"pp4_{s}", ref, every, 1e-5)
for n in ("pp4_ZB-H1", "pp2_fsdp2", "pp2_fsdp2_turns", "pp2_tp2_fsdp2", "pp2_accum2"):
    close(n, ref, every, 1e-5)
close("pp2_bf16", run("single_bf16"), every, 1e-3)
same("pp2_csv", "pp2_ZBVZeroBubble", every)
same("pp2_csv_comms", "pp2_ZBVZeroBubble", every)
close("pp2_val", ref, every, 1e-5)
def vals(name):
    return {r["step"]: r["validation_loss"] for r in rows(name) if "validation_loss" in r}
vs, vp = vals("single_val"), vals("pp2_val")
good = len(vs) >= 2 and set(vs) == set(vp) and all(abs(vp[s] - vs[s]) / abs(vs[s]) <= 1e-5 for s in vs)
ok &= good
print(f"{'ok  ' if good else 'FAIL'} validation loss under pp 2 matches 1 rank at steps {sorted(vs)}: "
      f"{[round(vp.get(s, float('nan')), 6) for s in sorted(vs)]} vs {[round(vs[s], 6) for s in sorted(vs)]}")
same("res_pp2", "ck_pp2", list(range(4, steps + 1)))
full = run("ck_pp2")
for n in ("res_pp1", "res_pp4_zbv", "res_pp2_fsdp2"):
    close(n, full, list(range(4, steps + 1)), 1e-5)
sys.exit(0 if ok else 1)
P

# the per-rank idle report the docs quote
grep -q "pipeline rank 1 (stages 1, 2): computing" "$T/pp2_ZBVZeroBubble.log" ||
  bad "no per-rank pipeline report in the ZBV log"

# bad input: refused before training, naming what is wrong
refuse() { # name expected-substring ranks args...
  local name=$1 want=$2 np=$3
  shift 3
  if mpirun -np "$np" --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --job.dump_folder "$T/$name" "$@" \
      >"$T/$name.log" 2>&1; then
    bad "$name was accepted"
  elif grep -q -- "$want" "$T/$name.log"; then
    echo "ok   $name refused: $(grep -m1 -o -- "$want.*" "$T/$name.log" | cut -c1-150)"
  else
    bad "$name: expected '$want' in: $(grep -m1 -E 'ERROR|error' "$T/$name.log")"
  fi
}
refuse bad_split "effective layers" 4 --training.local_batch_size 8 "${PP[@]}" 4 $SCHED Interleaved1F1B \
  --model.n_layers 2
refuse bad_mbs "must be divisible by" 2 --training.local_batch_size 8 "${PP[@]}" 2 \
  --parallelism.pipeline_parallel_microbatch_size 3
refuse bad_sched "pipeline_parallel_schedule" 2 --training.local_batch_size 8 "${PP[@]}" 2 $SCHED ZB-H3
refuse bad_v "exactly 2 stages per rank" 2 --training.local_batch_size 8 "${PP[@]}" 2 $SCHED ZBVZeroBubble \
  --parallelism.pipeline_parallel_layers_per_stage 1
refuse bad_dualpipe "microbatches" 2 --training.local_batch_size 2 "${PP[@]}" 2 $SCHED DualPipeV
printf '0F0,0F1\n' >"$T/broken.csv"
refuse bad_csv "broken.csv" 2 --training.local_batch_size 8 "${PP[@]}" 2 \
  --parallelism.pipeline_parallel_schedule_csv "$T/broken.csv"
refuse bad_csv_pp1 "pipeline_parallel_degree is 1" 1 --training.local_batch_size 8 \
  --parallelism.pipeline_parallel_schedule_csv "$T/zbv.csv"

[ $fail = 0 ] && echo "pipeline parallel: all checks passed"
finish
