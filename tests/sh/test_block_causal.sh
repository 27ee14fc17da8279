#!/usr/bin/env bash
# Document-masked attention (model.attn_mask_type = "block_causal") in the trainer, on CPU
# ranks, over a corpus of many short documents (Moby-Dick cut into 8-80 word pieces,
# prepared with `tetra data prepare`, so each 64-token sequence holds several):
#   1. the tiny model with block_causal: fsdp 2, tp 2, pp 2, cp 2 and cp 4 with both rotate
#      methods, and 4D (pp 2 x fsdp 2 x cp 2 x tp 2, 16 ranks) reproduce the 1-rank
#      block_causal loss curve within 1e-5 relative at each of 5 steps (the layout gate);
#   2. positions reset at document boundaries with the causal mask (RoPE is relative, so
#      under block_causal, where query and key share a document, the reset changes only
#      rounding), at lr 1e-2 for 8 steps so that positions matter: cp 2 (ring) reproduces
#      its 1-rank curve within 1e-6 (a tenth of the effect it has to show);
#   3. the mask and the positions matter: block_causal differs from causal, and reset
#      positions from causal at the same lr, by more than 1e-5 at some step (over 100x
#      the layouts' largest difference);
#   4. debugmodel_flex_attn on the one-document sample corpus equals debugmodel (a single
#      document is the causal mask), bit for bit;
#   5. mfu_computed (the attention the mask leaves) is below TorchTitan's mfu, more so under
#      block_causal than causal, and counts every data-parallel rank's documents (fsdp 2
#      reports the 1-rank run's ratio);
#   6. an unknown model.attn_mask_type is refused naming the key, and block_causal on a
#      corpus that marks no documents (no BOS, no EOS) is refused at start-up.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }
export OMP_WAIT_POLICY=PASSIVE
unset OMP_NUM_THREADS

# a corpus of short documents: word counts cycle through a fixed list
python3 - "$ROOT/tests/assets/moby_dick.txt" "$T/docs.jsonl" <<'P'
import json, sys
words = open(sys.argv[1], encoding="utf-8").read().split()[:30000]
lens = [8, 35, 12, 80, 20, 50, 9, 27, 64, 15]
with open(sys.argv[2], "w", encoding="utf-8") as f:
    i = k = 0
    while i < len(words):
        n = lens[k % len(lens)]
        f.write(json.dumps({"text": " ".join(words[i:i + n])}) + "\n")
        i, k = i + n, k + 1
P
"$TETRA" data prepare --tokenizer "$ROOT/tests/assets/tokenizer" --input "$T/docs.jsonl" --output "$T/corpus" \
  --val-fraction 0 --quiet || bad "data prepare"

STEPS=5
COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --model.flavor tiny --training.seq_len 64
        --training.global_batch_size 4 --training.steps $STEPS --training.seed 42 --lr_scheduler.warmup_steps 2
        --metrics.log_freq 1 --metrics.disable_color_printing --training.device cpu --training.threads 1
        --training.dataset_path "$T/corpus" --comm.init_timeout_seconds 300 --comm.train_timeout_seconds 300)
BC=(--model.attn_mask_type block_causal)
CP=(--parallelism.context_parallel_degree)
ROT=--parallelism.context_parallel_rotate_method
run() { # name ranks [args...]
  local name=$1 np=$2
  shift 2
  local s=$SECONDS
  mpirun -np "$np" --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --job.dump_folder "$T/$name" "$@" \
    >"$T/$name.log" 2>&1 || { bad "$name exited with $?"; grep -E "ERROR|error|abort" "$T/$name.log" | head -5; }
  echo "ran $name ($np ranks) in $((SECONDS - s)) s"
}
run causal 1 --training.local_batch_size 4
run single 1 --training.local_batch_size 4 "${BC[@]}"
run fsdp2 2 --training.local_batch_size 2 "${BC[@]}"
run tp2 2 --training.local_batch_size 4 "${BC[@]}" --parallelism.tensor_parallel_degree 2
run pp2 2 --training.local_batch_size 4 "${BC[@]}" --parallelism.pipeline_parallel_degree 2 \
  --parallelism.pipeline_parallel_schedule 1F1B
run cp2 2 --training.local_batch_size 4 "${BC[@]}" "${CP[@]}" 2
run cp2_ring 2 --training.local_batch_size 4 "${BC[@]}" "${CP[@]}" 2 $ROT alltoall
run cp4 4 --training.local_batch_size 4 "${BC[@]}" "${CP[@]}" 4
run cp4_ring 4 --training.local_batch_size 4 "${BC[@]}" "${CP[@]}" 4 $ROT alltoall
run 4d 16 --training.local_batch_size 2 "${BC[@]}" --parallelism.pipeline_parallel_degree 2 "${CP[@]}" 2 \
  --parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 2
RP=(--model.reset_positions_at_document_boundaries --optimizer.lr 1e-2 --training.steps 8)
run causal_hi 1 --training.local_batch_size 4 --optimizer.lr 1e-2 --training.steps 8
run reset 1 --training.local_batch_size 4 "${RP[@]}"
run reset_cp2_ring 2 --training.local_batch_size 4 "${RP[@]}" "${CP[@]}" 2 $ROT alltoall

# the one-document sample corpus: block_causal is the causal mask there
SAMPLE=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.seq_len 64 --training.local_batch_size 2
        --training.steps 2 --training.seed 42 --metrics.log_freq 1 --metrics.disable_color_printing
        --training.device cpu --training.threads 1)
"$TETRA" "${SAMPLE[@]}" --job.dump_folder "$T/sample_causal" >"$T/sample_causal.log" 2>&1 || bad "sample causal"
"$TETRA" "${SAMPLE[@]}" --model.flavor debugmodel_flex_attn --job.dump_folder "$T/sample_flex" \
  >"$T/sample_flex.log" 2>&1 || bad "sample debugmodel_flex_attn"

python3 - "$T" "$STEPS" <<'P' || fail=1
import json, sys
d, steps = sys.argv[1], int(sys.argv[2])
ok = True

def run(name):
    try:
        rows = [json.loads(l) for l in open(f"{d}/{name}/metrics.jsonl") if l.strip()]
    except OSError:
        return {}
    return {r["step"]: r["loss"] for r in rows if "loss" in r}

def close(name, ref, tol=1e-5, steps=steps):
    global ok
    cur = run(name)
    rel = [abs(cur[s] - ref[s]) / abs(ref[s]) for s in range(1, steps + 1) if s in cur and s in ref]
    good = len(rel) == steps and max(rel) <= tol
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} {name:<16} {len(rel)} steps, max rel loss diff "
          f"{max(rel) if rel else float('nan'):.2e} (gate {tol:g})")

def differs(a, b, what):
    global ok
    x, y = run(a), run(b)
    diff = max((abs(x[s] - y[s]) / abs(y[s]) for s in x if s in y), default=0.0)
    good = len(x) >= steps and diff > 1e-5
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} {what}: max rel loss diff {diff:.2e} (must exceed 1e-5)")

ref = run("single")
for n in ("fsdp2", "tp2", "pp2", "cp2", "cp2_ring", "cp4", "cp4_ring", "4d"):
    close(n, ref)
close("reset_cp2_ring", run("reset"), 1e-6, 8)
differs("single", "causal", "block_causal against causal")
differs("reset", "causal_hi", "reset positions against causal")
def ratio(name):  # mfu_computed / mfu: the FLOP counts' ratio, the same at every step of a run
    rows = [json.loads(l) for l in open(f"{d}/{name}/metrics.jsonl") if l.strip()]
    return [r["mfu_computed"] / r["mfu"] for r in rows if "mfu" in r]
rc, rb = ratio("causal"), ratio("single")
good = len(rc) == steps and len(rb) == steps and all(x < 1 for x in rc) and max(rb) < min(rc)
ok &= good
print(f"{'ok  ' if good else 'FAIL'} mfu_computed / mfu: causal {min(rc):.4f}, block_causal {min(rb):.4f}-{max(rb):.4f}")
# every data-parallel rank's documents count: fsdp 2 reads the single run's sequences, split
rf = ratio("fsdp2")
good = len(rf) == steps and all(abs(x - y) <= 1e-9 * y for x, y in zip(rf, rb))
ok &= good
print(f"{'ok  ' if good else 'FAIL'} mfu_computed / mfu under fsdp 2 equals the 1-rank run's at every step: "
      f"{[round(x, 6) for x in rf]} {[round(x, 6) for x in rb]}")
a, b = run("sample_flex"), run("sample_causal")
good = len(a) == 2 and a == b
ok &= good
print(f"{'ok  ' if good else 'FAIL'} debugmodel_flex_attn on the one-document sample corpus equals debugmodel: {a} {b}")
sys.exit(0 if ok else 1)
P

# refusal
out=$("$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --model.attn_mask_type sliding \
  --training.steps 1 --job.dump_folder "$T/bad" 2>&1) && bad "attn_mask_type sliding accepted"
echo "$out" | grep -q "model.attn_mask_type \"sliding\" is unknown" || bad "refusal message: $out"

cp -r "$T/corpus" "$T/nodocs"
python3 -c 'import json,sys; p=sys.argv[1]+"/index.json"; ix=json.load(open(p)); ix["bos_id"]=ix["eos_id"]=-1; json.dump(ix, open(p, "w"))' "$T/nodocs"
out=$("$TETRA" "${COMMON[@]}" --training.local_batch_size 4 "${BC[@]}" --training.dataset_path "$T/nodocs" \
  --job.dump_folder "$T/nodocs_run" 2>&1) && bad "block_causal on a corpus without documents accepted"
echo "$out" | grep -q 'model.attn_mask_type = "block_causal" needs each sequence.s document boundaries' ||
  bad "no-documents refusal: $out"

[ $fail = 0 ] && echo "test_block_causal: all passed" || echo "test_block_causal: FAILED"
[ "$fail" = 0 ]
