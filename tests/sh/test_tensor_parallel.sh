#!/usr/bin/env bash
# Tensor parallel (with sequence and loss parallel) in the trainer, on CPU ranks:
#   0. tests/unit/test_tp on 2 and 4 ranks: the primitives and the split model;
#   1. tp 2, tp 4, fsdp 2 x tp 2 and hsdp 2 x 2 x tp 2 (8 ranks) reproduce the 1-rank
#      loss curve of the debug model within 1e-5 relative at every one of 8 steps (fp32);
#      so do loss parallel off (gathered logits) and gradient accumulation; async TP and
#      per-op activation checkpointing give the tp 2 run's losses and gradient norms bit
#      for bit; bf16 under tp 2 follows the 1-rank bf16 run within 1e-3.
#   2. Checkpoints: a tp 2 checkpoint of step 4 resumes under tp 2 (steps 5-8 bit for
#      bit), tp 1, tp 4 and fsdp 2 x tp 2 (within 1e-5 of the uninterrupted run).
#   3. The Hugging Face export of a tp 2 run is byte-identical to a 1-rank run's.
#   4. The start-up estimate of tensor-parallel traffic equals what the run sends.
#   5. Bad layouts are refused before any allocation, naming the key and the numbers.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }
export OMP_WAIT_POLICY=PASSIVE
unset OMP_NUM_THREADS

COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.seq_len 64
        --training.global_batch_size 8 --training.steps 8 --training.seed 42 --lr_scheduler.warmup_steps 2
        --metrics.log_freq 1 --metrics.peak_flops 1e11 --metrics.disable_color_printing --training.device cpu
        --comm.init_timeout_seconds 300 --comm.train_timeout_seconds 300)
run() { # name ranks [args...]
  local name=$1 np=$2
  shift 2
  local s=$SECONDS
  mpirun -np "$np" --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --job.dump_folder "$T/$name" "$@" \
    >"$T/$name.log" 2>&1 || { bad "$name exited with $?"; tail -5 "$T/$name.log"; }
  echo "ran $name ($np ranks) in $((SECONDS - s)) s"
}
# the primitives and the split model against the unsharded ops (tests/unit/test_tp.c)
BUILD="${TETRA_BUILD:-$ROOT/build}"
for np in 2 4; do
  mpirun -np $np --oversubscribe --bind-to none "$BUILD/tests/test_tp" >"$T/unit$np.log" 2>&1 ||
    { bad "test_tp on $np ranks"; grep FAIL "$T/unit$np.log" | head -5; }
  grep "test_tp:" "$T/unit$np.log"
done

TP=(--parallelism.tensor_parallel_degree)
run single 1 --training.local_batch_size 8
run tp2 2 --training.local_batch_size 8 "${TP[@]}" 2
run tp4 4 --training.local_batch_size 8 "${TP[@]}" 4
run fsdp2_tp2 4 --training.local_batch_size 4 "${TP[@]}" 2
run hsdp2x2_tp2 8 --training.local_batch_size 2 "${TP[@]}" 2 --parallelism.data_parallel_replicate_degree 2 \
  --parallelism.data_parallel_shard_degree 2
run tp2_gathered_logits 2 --training.local_batch_size 8 "${TP[@]}" 2 --parallelism.disable_loss_parallel
run tp2_accum2 2 --training.local_batch_size 4 "${TP[@]}" 2
run tp2_async 2 --training.local_batch_size 8 "${TP[@]}" 2 --parallelism.enable_async_tensor_parallel
run tp2_ac_op 2 --training.local_batch_size 8 "${TP[@]}" 2 --activation_checkpoint.selective_ac_option op
run single_bf16 1 --training.local_batch_size 8 --training.mixed_precision_param bfloat16
run tp2_bf16 2 --training.local_batch_size 8 "${TP[@]}" 2 --training.mixed_precision_param bfloat16

# checkpoints: tp 2 saves step 4 (and runs on to 8); resume the copy under other layouts
run ck_tp2 2 --training.local_batch_size 8 "${TP[@]}" 2 --checkpoint.enable --checkpoint.interval 4
for lay in "res_tp2 2 --training.local_batch_size 8 ${TP[*]} 2" "res_tp1 1 --training.local_batch_size 8" \
           "res_tp4 4 --training.local_batch_size 8 ${TP[*]} 4" \
           "res_fsdp2_tp2 4 --training.local_batch_size 4 ${TP[*]} 2"; do
  set -- $lay
  name=$1 np=$2
  shift 2
  mkdir -p "$T/$name/checkpoint" && cp -r "$T/ck_tp2/checkpoint/step-4" "$T/$name/checkpoint/"
  run "$name" "$np" "$@" --checkpoint.enable --checkpoint.interval 100
done

# Hugging Face export with the weights unchanged (lr 0): the same bytes from tp 2 as from 1 rank
for np in 1 2; do
  mpirun -np $np --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --training.steps 1 --training.local_batch_size 8 \
    "${TP[@]}" $np --optimizer.lr 0 --checkpoint.enable --checkpoint.last_save_in_hf --checkpoint.export_dtype float32 \
    --job.dump_folder "$T/hf$np" >"$T/hf$np.log" 2>&1 || bad "HF export at tp $np exited with $?"
done
if cmp -s "$T/hf1/checkpoint/step-1/model.safetensors" "$T/hf2/checkpoint/step-1/model.safetensors"; then
  echo "ok   the Hugging Face export of a tp 2 run is byte-identical to the 1-rank run's"
else
  bad "the tp 2 Hugging Face export differs from the 1-rank one"
fi

python3 - "$T" <<'P' || fail=1
import json, re, sys
d = sys.argv[1]
ok = True

def run(name):
    try:
        rows = [json.loads(l) for l in open(f"{d}/{name}/metrics.jsonl") if l.strip()]
    except OSError:
        return {}
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in rows if "loss" in r}

def close(name, ref, steps, tol):
    global ok
    cur = run(name)
    rel = [abs(cur[s][0] - ref[s][0]) / abs(ref[s][0]) for s in steps if s in cur and s in ref]
    good = len(rel) == len(steps) and max(rel) <= tol
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} {name:<22} {len(rel)} steps, max rel loss diff {max(rel) if rel else float('nan'):.2e} (gate {tol:g})")

def same(name, ref_name, steps):
    global ok
    a, b = run(name), run(ref_name)
    good = all(s in a and s in b and a[s] == b[s] for s in steps)
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} {name:<22} losses and grad norms bit-identical to {ref_name} at steps {steps[0]}-{steps[-1]}")

ref = run("single")
all8 = list(range(1, 9))
for n in ("tp2", "tp4", "fsdp2_tp2", "hsdp2x2_tp2", "tp2_gathered_logits", "tp2_accum2"):
    close(n, ref, all8, 1e-5)
same("tp2_async", "tp2", all8)
same("tp2_ac_op", "tp2", all8)
close("tp2_bf16", run("single_bf16"), all8, 1e-3)
ck = run("ck_tp2")
same("res_tp2", "ck_tp2", list(range(5, 9)))
for n in ("res_tp1", "res_tp4", "res_fsdp2_tp2"):
    close(n, ck, list(range(5, 9)), 1e-5)

# the start-up estimate of what rank 0 sends in the sequence-parallel collectives, and what it sent
log = open(f"{d}/tp2.log", errors="replace").read()
est = re.search(r"rank 0 sends: .*tensor parallel ([\d.]+) MiB", log)
got = re.search(r"\[tetra\|rank 0\].*tensor parallel: \d+ sequence-parallel collectives, ([\d.]+) MiB sent", log)
# the estimate is printed to 0.01 MiB (its rounding counts 8 times), the total to 0.1 MiB
good = bool(est and got) and abs(8 * float(est.group(1)) - float(got.group(1))) <= 8 * 0.005 + 0.05 + 1e-3 * float(got.group(1))
ok &= good
print(f"{'ok  ' if good else 'FAIL'} traffic: estimated {est.group(1) if est else '?'} MiB per step, sent "
      f"{got.group(1) if got else '?'} MiB in 8 steps")
sys.exit(0 if ok else 1)
P

# bad layouts: refused before any allocation, naming the key and the numbers
"$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --parallelism.tensor_parallel_degree 3 \
  --parallelism.data_parallel_shard_degree 1 --training.steps 1 >"$T/bad_world.log" 2>&1 && bad "tp 3 on 1 rank accepted"
mpirun -np 3 --oversubscribe "$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" \
  --parallelism.tensor_parallel_degree 3 --training.steps 1 >"$T/bad_heads.log" 2>&1 && bad "tp 3 of 16 heads accepted"
grep -q "tensor_parallel_degree 3 must divide .* n_heads (16)" "$T/bad_heads.log" ||
  bad "tp 3: $(grep -m1 ERROR "$T/bad_heads.log")"
mpirun -np 2 --oversubscribe "$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" \
  --parallelism.tensor_parallel_degree 2 --training.seq_len 127 --training.steps 1 >"$T/bad_seq.log" 2>&1 &&
  bad "seq_len 127 under tp 2 accepted"
grep -q "seq_len 127 must be divisible by tensor_parallel_degree 2" "$T/bad_seq.log" ||
  bad "seq_len 127: $(grep -m1 ERROR "$T/bad_seq.log")"
grep -q "world size" "$T/bad_world.log" || grep -q "= 3 ranks" "$T/bad_world.log" ||
  bad "tp 3 on 1 rank: $(grep -m1 ERROR "$T/bad_world.log")"
echo "     errors: $(grep -m1 -o 'tensor_parallel_degree 3 must.*' "$T/bad_heads.log" | head -c 160)"

if [ $fail != 0 ]; then echo "FAIL tensor parallel"; exit 1; fi
echo "ok   tensor parallel"
