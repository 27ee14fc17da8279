#!/usr/bin/env bash
# Guards around a run: non-finite steps, absurd values, another model shape, skewed ranks:
#   1. lr 1e30 makes step 2's gradients NaN. training.on_nonfinite = "stop" (the default)
#      names the first non-finite gradient and its rank, exits 1 before the update, and
#      leaves the step-1 checkpoint as the newest (no checkpoint holds the NaN step).
#      With a log every 4th step the update count, skip and norm stay on the device: the
#      run stops at step 4 naming step 2 as the first non-finite one, no checkpoint of 4.
#   2. "skip" under fsdp 2: every such step is logged as skipped, the run ends (exit 0);
#      under dp_replicate 2 an infinite loss on one replica (finite gradients) is skipped
#      by both, whichever replica it was on;
#      on one rank over 8 steps the 5th non-finite step in a row (steps 2-6; the default
#      training.max_consecutive_nonfinite_steps) stops the run with exit 1 naming the key.
#   3. NaN or infinite float keys, more threads than cores, a model vocabulary that is not the
#      corpus' (the advice names model.vocab_size) and a validation split shorter than one
#      batch are refused with the numbers.
#   4. A resume with fewer blocks than the checkpoint is refused naming a tensor it lacks; a
#      hand-edited metadata.json is refused by its checksum.
#   5. Ranks launched with different options are refused, naming the rank and the key. A
#      failure tetra explained ends the job with exit 1 and nothing of Open MPI's around the
#      error (no MPI_ABORT banner, no "exited with non-zero status" box): every rank failing
#      alike (no corpus), a config error under mpirun, and a rank failing alone (its relative
#      dataset_path resolves elsewhere), which still ends the job within seconds.
#   6. Export into a non-empty folder and import over an existing step need --force (the
#      files stay untouched); data prepare removes the staging folder a killed run left.
#   7. A 20 MB config file and a tokenizer rank of 999,999,999 are refused, not allocated.
#   8. model.hf_assets_path must hold the tokenizer the shards were prepared with: another
#      vocabulary is refused by the fingerprint in index.json (or, in an index without one, by
#      vocab size and BOS/EOS); the same tokenizer as tokenizer.json alone trains; a missing
#      folder is a warning.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }
export OMP_WAIT_POLICY=PASSIVE

COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.steps 5 --training.seq_len 64
        --training.global_batch_size 2 --metrics.log_freq 1 --metrics.peak_flops 1e11 --metrics.disable_color_printing --training.device cpu
        --training.threads 1 --optimizer.lr 1e30 --lr_scheduler.warmup_steps 1)

"$TETRA" "${COMMON[@]}" --training.local_batch_size 2 --checkpoint.enable --checkpoint.interval 1 \
  --job.dump_folder "$T/stop" >"$T/stop.log" 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "first non-finite gradient: .*weight on rank 0" "$T/stop.log" &&
   grep -q "step 2: .*stopping before the update" "$T/stop.log" && [ -d "$T/stop/checkpoint/step-1" ] &&
   [ "$(ls "$T/stop/checkpoint")" = "step-1" ]; then
  ok "stop: exit 1 at step 2 naming $(grep -o 'first non-finite gradient: [^;]*' "$T/stop.log"); newest checkpoint step-1"
else
  bad "stop: exit $rc, checkpoints '$(ls "$T/stop/checkpoint" 2>/dev/null | tr '\n' ' ')': $(grep -m2 -E 'WARN|ERROR' "$T/stop.log")"
fi

# a log every 4th step: the device skips the updates from step 2 on, and the run learns
# it (and stops) at step 4, its next read, without a checkpoint of step 4
"$TETRA" "${COMMON[@]}" --training.local_batch_size 2 --training.steps 8 --metrics.log_freq 4 --checkpoint.enable \
  --checkpoint.interval 4 --job.dump_folder "$T/stop_late" >"$T/stop_late.log" 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "step 4: the loss or gradient norm of step 2 was not finite (3 non-finite steps since the last read); no update was applied from it on" "$T/stop_late.log" &&
   [ "$(grep -c '"grad_norm"' "$T/stop_late/metrics.jsonl")" = 1 ] && [ ! -e "$T/stop_late/checkpoint/step-4" ]; then
  ok "stop with a log every 4th step: exit 1 at step 4 naming step 2, no checkpoint of step 4"
else
  bad "stop_late: exit $rc: $(grep -m2 -E 'WARN|ERROR' "$T/stop_late.log")"
fi

mpirun -np 2 --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --training.local_batch_size 1 \
  --parallelism.data_parallel_shard_degree 2 --training.on_nonfinite skip --job.dump_folder "$T/skip" \
  >"$T/skip.log" 2>&1
rc=$?
n=$(grep -c "update skipped" "$T/skip.log")
steps=$(grep -c '"grad_norm"' "$T/skip/metrics.jsonl" 2>/dev/null)
[ $rc = 0 ] && [ "$n" -ge 1 ] && [ "${steps:-0}" = 5 ] && ok "skip under fsdp 2: $n steps skipped, 5 steps run, exit 0" ||
  bad "skip: exit $rc, $n skipped, ${steps:-0} steps"
# HSDP: a loss that is infinite on one replica while the gradients are finite (the
# test hook TETRA_TEST_INF_LOSS) is skipped by every replica: poisoned on rank 1 or on
# rank 0, the two runs log step 3 as skipped and the same losses after it
REP=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.steps 4 --training.seq_len 64
     --training.local_batch_size 1 --metrics.log_freq 1 --metrics.disable_color_printing --training.device cpu
     --training.threads 1 --parallelism.data_parallel_replicate_degree 2 --training.on_nonfinite skip)
for r in 0 1; do
  TETRA_TEST_INF_LOSS="$r:3" mpirun -np 2 --oversubscribe --bind-to none -x TETRA_TEST_INF_LOSS "$TETRA" "${REP[@]}" \
    --job.dump_folder "$T/rep$r" >"$T/rep$r.log" 2>&1 || echo "replica run $r exited $?" >>"$T/rep$r.log"
done
after() { python3 -c 'import json,sys
print([(o["step"], o["loss"]) for o in map(json.loads, open(sys.argv[1])) if o["step"] > 3])' "$1"; }
if grep -q "step 3: .*update skipped" "$T/rep0.log" && grep -q "step 3: .*update skipped" "$T/rep1.log" &&
   [ "$(after "$T/rep0/metrics.jsonl")" = "$(after "$T/rep1/metrics.jsonl")" ] &&
   [ -n "$(after "$T/rep1/metrics.jsonl" | grep '(4, ')" ] && ! grep -q "exited" "$T/rep1.log"; then
  ok "dp_replicate 2: an infinite loss on either replica skips step 3 on both, the same losses after it"
else
  bad "dp_replicate 2 infinite loss: $(grep -m1 -E 'skipped|ERROR|exited' "$T/rep1.log"); after: $(after "$T/rep0/metrics.jsonl" 2>&1) vs $(after "$T/rep1/metrics.jsonl" 2>&1)"
fi
"$TETRA" "${COMMON[@]}" --training.local_batch_size 2 --training.steps 8 --training.on_nonfinite skip \
  --job.dump_folder "$T/skip_limit" >"$T/skip_limit.log" 2>&1
rc=$?
n=$(grep -c "update skipped" "$T/skip_limit.log")
if [ $rc = 1 ] && [ "$n" = 5 ] &&
   grep -q "step 6: 5 non-finite steps in a row were skipped (training.max_consecutive_nonfinite_steps = 5)" \
     "$T/skip_limit.log" && ! grep -q '"step": *7' "$T/skip_limit/metrics.jsonl"; then
  ok "skip stops after 5 non-finite steps in a row: $(grep -o 'step 6: .*stopping' "$T/skip_limit.log")"
else
  bad "skip limit: exit $rc, $n skipped: $(grep -m1 ERROR "$T/skip_limit.log")"
fi

expect_error() { # name pattern args...
  local name=$1 pat=$2
  shift 2
  "$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --training.steps 1 "$@" \
    --job.dump_folder "$T/$name" >"$T/$name.log" 2>&1 && bad "$name accepted"
  grep -q -- "$pat" "$T/$name.log" && ok "$name: $(grep -m1 -o 'ERROR - .*' "$T/$name.log" | head -c 140)" ||
    bad "$name: $(grep -m1 ERROR "$T/$name.log")"
}
expect_error lr_nan "optimizer.lr must be a finite number, got nan" --optimizer.lr nan
expect_error eps_inf "optimizer.eps must be a finite number, got inf" --optimizer.eps inf
expect_error peak_neg "metrics.peak_flops must be a positive finite number" --metrics.peak_flops -1
expect_error threads "training.threads = 100000: this host has" --training.threads 100000
expect_error huge_seq "training.seq_len 100000000: the train split of .* holds 350809 tokens, fewer than one sequence" \
  --training.seq_len 100000000 --training.local_batch_size 1
expect_error vocab "tokenized with a vocabulary of 2048 tokens but the model's vocab_size is 4096; .* set model.vocab_size = 2048" \
  --model.vocab_size 4096
expect_error short_val 'the "val" split of .* holds 18 sequences of 2048 tokens, fewer than one validation batch of 64' \
  --validation.enable --validation.local_batch_size 64 --validation.seq_len 2048 --training.seq_len 64 \
  --training.local_batch_size 1

# 4. resuming with another model shape is refused, naming a tensor; the checkpoint is untouched
"$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --training.steps 2 --training.seq_len 64 \
  --training.local_batch_size 2 --training.threads 1 --checkpoint.enable --checkpoint.interval 1 \
  --job.dump_folder "$T/shape" >"$T/shape.log" 2>&1 || bad "6-layer run exited with $?"
before=$(cd "$T/shape/checkpoint" && find . -type f -exec md5sum {} + | sort)
"$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --training.steps 4 --training.seq_len 64 \
  --training.local_batch_size 2 --training.threads 1 --checkpoint.enable --checkpoint.interval 1 --model.n_layers 3 \
  --job.dump_folder "$T/shape" >"$T/shape3.log" 2>&1 && bad "a 3-layer resume from a 6-layer checkpoint was accepted"
after=$(cd "$T/shape/checkpoint" && find . -type f -exec md5sum {} + | sort)
if grep -q "has 'model/layers.3.* and this model has 3 blocks" "$T/shape3.log" && [ "$before" = "$after" ]; then
  ok "another model shape: refused naming $(grep -o "it has '[^']*'" "$T/shape3.log" | head -1); checkpoint untouched"
else
  bad "another model shape: $(grep -m1 ERROR "$T/shape3.log")"
fi

# a hand-edited metadata.json (a negative step) is refused by its checksum
cp -r "$T/shape/checkpoint/step-2" "$T/edited"
sed -i '0,/"step": 2,/s//"step": -5,/' "$T/edited/metadata.json"
"$TETRA" checkpoint inspect "$T/edited" >"$T/edited.log" 2>&1 && bad "an edited metadata.json was accepted"
grep -q "metadata checksum does not match" "$T/edited.log" && ok "edited metadata.json: refused by its checksum" ||
  bad "edited metadata.json: $(tail -1 "$T/edited.log")"

# 5. ranks launched with different options are refused, naming the rank and the line
printf '#!/bin/sh\nif [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$@" --training.local_batch_size 4; fi\nexec "$@"\n' \
  >"$T/skew.sh"
chmod +x "$T/skew.sh"
mpirun -np 2 --oversubscribe --bind-to none "$T/skew.sh" "$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" \
  --training.steps 1 --training.seq_len 64 --job.dump_folder "$T/skew" >"$T/skew.log" 2>&1 &&
  bad "ranks with different configurations were accepted"
grep -q "rank 1's configuration differs from rank 0's: \[training\] rank 0 has 'local_batch_size = 8', rank 1 has 'local_batch_size = 4'" \
  "$T/skew.log" && ok "different configurations per rank: refused, naming rank 1 and local_batch_size" ||
  bad "different configurations: $(grep -m1 ERROR "$T/skew.log")"

mpirun -np 2 --oversubscribe --bind-to none "$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" \
  --training.steps 1 --training.seq_len 64 --parallelism.data_parallel_shard_degree 2 \
  --training.dataset_path "$T/no_corpus" --job.dump_folder "$T/alike" >"$T/alike.log" 2>&1
rc=$?
# every line is tetra's: Open MPI adds nothing to an error tetra explained
only_tetra() { ! grep -qv '\[tetra|rank [0-9]*\] ' "$1"; }
if [ $rc = 1 ] && grep -q "ERROR - training data: $T/no_corpus: no such corpus folder" "$T/alike.log" &&
   only_tetra "$T/alike.log"; then
  ok "every rank fails alike: exit 1, tetra's error and nothing of Open MPI's"
else bad "every rank fails alike: exit $rc, the output ends: $(tail -3 "$T/alike.log")"; fi
mpirun -np 2 --oversubscribe --bind-to none "$TETRA" train --training.stepz 3 >"$T/cfg2.log" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "unknown option --training.stepz" "$T/cfg2.log" && only_tetra "$T/cfg2.log" &&
  ok "a config error under mpirun: exit 1, tetra's error and nothing of Open MPI's" ||
  bad "a config error under mpirun: exit $rc: $(tail -3 "$T/cfg2.log")"
mkdir -p "$T/lone" && ln -s "$BIN/../data/sample" "$T/lone/corpus"
printf '#!/bin/sh\nif [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then cd /; fi\nexec "$@"\n' >"$T/lone.sh"
chmod +x "$T/lone.sh"
s=$SECONDS
(cd "$T/lone" && timeout 120 mpirun -np 2 --oversubscribe --bind-to none "$T/lone.sh" "$TETRA" train \
  --job.config_file "$ROOT/configs/debug_model.toml" --training.steps 1 --training.seq_len 64 \
  --parallelism.data_parallel_shard_degree 2 --training.dataset_path corpus --job.dump_folder "$T/lone/out" \
  >"$T/lone.log" 2>&1)
rc=$?
if [ $rc = 1 ] && [ $((SECONDS - s)) -lt 60 ] && only_tetra "$T/lone.log" &&
   grep -q "^\[tetra|rank 1\] .* - ERROR - training data: corpus: no such corpus folder" "$T/lone.log"; then
  ok "a rank failing alone ends the job in $((SECONDS - s)) s (exit $rc), its error named"
else bad "a rank failing alone: exit $rc after $((SECONDS - s)) s: $(grep -m2 ERROR "$T/lone.log")"; fi

# 6. nothing on disk is replaced without --force; a killed data prepare leaves nothing behind
mkdir -p "$T/export" && echo mine >"$T/export/notes.txt"
"$TETRA" checkpoint export --hf "$T/export" "$T/shape/checkpoint" >"$T/exp.log" 2>&1 &&
  bad "export into a non-empty folder was accepted"
grep -q "is not empty; pass --force" "$T/exp.log" && [ "$(cat "$T/export/notes.txt")" = mine ] &&
  [ ! -e "$T/export/model.safetensors" ] && ok "export into a non-empty folder: refused, the folder untouched" ||
  bad "export guard: $(cat "$T/exp.log")"
"$TETRA" checkpoint export --hf "$T/export" --force "$T/shape/checkpoint" >"$T/exp2.log" 2>&1 &&
  [ -s "$T/export/model.safetensors" ] && ok "export --force writes into it" || bad "export --force: $(cat "$T/exp2.log")"
before=$(cd "$T/shape/checkpoint" && find . -type f -exec md5sum {} + | sort)
"$TETRA" checkpoint import --hf "$T/export" "$T/shape/checkpoint" --step 2 >"$T/imp.log" 2>&1 &&
  bad "import over an existing step was accepted"
after=$(cd "$T/shape/checkpoint" && find . -type f -exec md5sum {} + | sort)
grep -q "step-2 already exists and would be replaced; pass --force" "$T/imp.log" && [ "$before" = "$after" ] &&
  ok "import over an existing checkpoint step: refused, the checkpoint untouched" || bad "import guard: $(cat "$T/imp.log")"
mkdir -p "$T/prep/.out.partial-999999" && echo junk >"$T/prep/.out.partial-999999/shard_00000.bin"
"$TETRA" data prepare --tokenizer "$ROOT/tests/assets/tokenizer" --input "$ROOT/tests/assets/moby_dick.txt" \
  --output "$T/prep/out" >"$T/prep.log" 2>&1 || bad "data prepare after a killed run: $(cat "$T/prep.log")"
[ ! -e "$T/prep/.out.partial-999999" ] && grep -q "left by an interrupted run (process 999999)" "$T/prep.log" &&
  ok "data prepare removes the staging folder a killed run left" || bad "stale .partial folder: $(ls -a "$T/prep")"

# 7. readers refuse absurd sizes with a message instead of allocating
head -c 20000000 /dev/zero | tr '\0' '#' >"$T/big.toml"
"$TETRA" train --job.config_file "$T/big.toml" >"$T/big.log" 2>&1 && bad "a 20 MB config was accepted"
grep -q "is larger than 16 MiB; not a TOML config" "$T/big.log" && ok "a 20 MB config file: refused" ||
  bad "big config: $(grep -m1 ERROR "$T/big.log")"
mkdir -p "$T/badtok" && printf 'YQ== 0\nYg== 999999999\n' >"$T/badtok/tokenizer.model"
"$TETRA" data prepare --tokenizer "$T/badtok" --input "$ROOT/tests/assets/moby_dick.txt" --output "$T/badtok/out" \
  >"$T/badtok.log" 2>&1 && bad "a tokenizer rank of 999999999 was accepted"
grep -q "tokenizer.model:2: rank is not a number below 16777216" "$T/badtok.log" &&
  ok "a tokenizer rank of 999,999,999: refused with file and line" || bad "tokenizer rank: $(head -2 "$T/badtok.log")"

# 8. the tokenizer of model.hf_assets_path against the shards' index.json
mkdir -p "$T/tok256" "$T/tokjson"
python3 -c "
import base64
with open('$T/tok256/tokenizer.model', 'w') as f:
    for i in range(256): f.write(base64.b64encode(bytes([i])).decode() + f' {i}\\n')"
cp "$ROOT/tests/assets/tokenizer/tokenizer.json" "$ROOT/tests/assets/tokenizer/tokenizer_config.json" "$T/tokjson/"
TOK1=(--training.seq_len 64 --training.local_batch_size 1 --training.global_batch_size 1 --training.threads 1
      --activation_checkpoint.mode none)
expect_error tok_other "the tokenizer in $T/tok256 (vocab 256, .* fingerprint [0-9a-f]\\{16\\}) is not the one the token shards in .* were prepared with (.*vocab 2048, BOS 2037, EOS 2038, fingerprint [0-9a-f]\\{16\\})" \
  "${TOK1[@]}" --model.hf_assets_path "$T/tok256"
cp -r "$BIN/../data/sample" "$T/oldidx" && python3 - "$T/oldidx/index.json" <<'P2'
import json, sys
d = json.load(open(sys.argv[1]))
assert d.pop("tokenizer_fingerprint", None), "the sample corpus' index.json has no tokenizer_fingerprint"
json.dump(d, open(sys.argv[1], "w"), indent=2)
P2
expect_error tok_old_index "vocab 2048, BOS 2037, EOS 2038, fingerprint not recorded)" "${TOK1[@]}" \
  --training.dataset_path "$T/oldidx" --model.hf_assets_path "$T/tok256"
"$TETRA" "${COMMON[@]:0:3}" --training.steps 1 "${TOK1[@]}" --optimizer.lr 1e-3 --model.hf_assets_path "$T/tokjson" \
  --job.dump_folder "$T/tok_json" >"$T/tok_json.log" 2>&1
rc=$?
[ $rc = 0 ] && ! grep -q hf_assets_path "$T/tok_json.log" &&
  ok "the shipped tokenizer as tokenizer.json alone agrees with shards prepared from its folder" ||
  bad "tokenizer.json alone: exit $rc: $(grep -m1 -E 'WARN|ERROR' "$T/tok_json.log")"
"$TETRA" "${COMMON[@]:0:3}" --training.steps 1 "${TOK1[@]}" --optimizer.lr 1e-3 --model.hf_assets_path "$T/none" \
  --job.dump_folder "$T/tok_none" >"$T/tok_none.log" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "WARNING - model.hf_assets_path: $T/none does not exist; the token shards' tokenizer is not checked" \
  "$T/tok_none.log" && ok "a missing model.hf_assets_path: a warning, the run goes on" ||
  bad "missing hf_assets_path: exit $rc: $(grep -m1 -E 'WARN|ERROR' "$T/tok_none.log")"

if [ $fail != 0 ]; then echo "FAIL run guards"; exit 1; fi
echo "ok   run guards"
