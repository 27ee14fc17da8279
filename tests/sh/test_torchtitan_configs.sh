#!/usr/bin/env bash
# TorchTitan configs of every era (docs/configs.md, "Configs from other TorchTitan versions"):
#   - every key of v0.2.2's job_config.py (tests/toml/torchtitan_v0.2.2_keys.tsv) is in
#     tetra's schema, and a config holding all of them at v0.2.2's defaults dry-runs;
#   - v0.2.2's llama3 configs (tests/toml/torchtitan/v0.2.2_*.toml: their sections, keys
#     and values) dry-run or plan unchanged; its llama3_ft debug config is refused for
#     fault_tolerance.enable = true alone, with the reason;
#   - a mid-2024 8B config reports all twelve of its old keys in one run, each with its
#     file, line and new home;
#   - moved keys (debug.seed), 2026 names (tokens per microbatch), tyro's dashed flags,
#     the start-up notice of a key without effect, and memory_estimation.enable.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
F="$ROOT/tests/toml/torchtitan"
DRY=(train --dry-run --job.dump_folder "$T/dump")

# 1. the v0.2.2 key list: every key in the schema (train --help), all of them at once accepted
"$TETRA" train --help >"$T/help" 2>&1
"$PY" - "$ROOT/tests/toml/torchtitan_v0.2.2_keys.tsv" "$T/help" "$T/all.toml" >"$T/keys.log" 2>&1 <<'P'
import ast, json, re, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if not l.startswith("#")]
help_keys = set(re.findall(r"^  --(\S+)", open(sys.argv[2]).read(), re.M))
missing = [k for k, _, _ in rows if k not in help_keys]
print("keys:", len(rows), "missing:", " ".join(missing) or "none")
# the defaults as TOML (None has no TOML form: such keys stay unset; job.config_file is the CLI's)
def toml(v):
    if isinstance(v, bool): return "true" if v else "false"
    if isinstance(v, (int, float, str)): return json.dumps(v)
    if isinstance(v, list): return "[" + ", ".join(toml(x) for x in v) + "]"
    raise ValueError(v)
sections = {}
for key, _, default in rows:
    if key == "job.config_file": continue
    d = default[:-2] + "" if default.endswith("()") else default
    try: v = [] if d == "list" else ast.literal_eval(d)
    except ValueError: v = None
    if v is None: continue
    sec, name = key.rsplit(".", 1)
    sections.setdefault(sec, []).append(f"{name} = {toml(v)}")
with open(sys.argv[3], "w") as f:
    for sec, lines in sections.items():
        f.write(f"[{sec}]\n" + "\n".join(lines) + "\n\n")
print("written:", sum(len(v) for v in sections.values()))
sys.exit(1 if missing else 0)
P
[ $? = 0 ] && ok "v0.2.2's $(grep -o 'keys: [0-9]*' "$T/keys.log") keys are all in tetra's schema" ||
  bad "v0.2.2 keys tetra does not know: $(cat "$T/keys.log")"
# v0.2.2's defaults train on its own 2048-token sequences of batch 8 over 10,000 steps: a dry run only plans
"$TETRA" "${DRY[@]}" --job.config_file "$T/all.toml" >"$T/all.log" 2>&1 &&
  ok "a config with all $(grep -o 'written: [0-9]*' "$T/keys.log" | cut -d' ' -f2) v0.2.2 keys set (those not None) at v0.2.2's defaults dry-runs" ||
  bad "v0.2.2's defaults refused: $(grep -E 'ERROR|^  ' "$T/all.log" | head -5)"
grep -q "note:" "$T/all.log" && bad "v0.2.2's defaults gave notices: $(grep note: "$T/all.log" | head -3)" ||
  ok "no notice for keys at their defaults"

# 2. v0.2.2's llama3 configs as they are
"$TETRA" "${DRY[@]}" --job.config_file "$F/v0.2.2_debug_model.toml" >"$T/dbg.log" 2>&1 &&
  grep -q "dry run:" "$T/dbg.log" && ok "v0.2.2 debug_model dry-runs" ||
  bad "v0.2.2 debug_model: $(grep ERROR "$T/dbg.log" | head -3)"
for c in llama3_8b:8 llama3_70b:64 llama3_405b:256; do
  f=${c%:*}; n=${c#*:}
  "$TETRA" plan --job.config_file "$F/v0.2.2_$f.toml" --ngpu "$n" >"$T/$f.log" 2>&1 &&
    ok "v0.2.2 $f plans on $n GPUs: $(grep -E '^  (peak|tokens/s/GPU)' "$T/$f.log" | tr -s ' ' | paste -sd';')" ||
    bad "v0.2.2 $f on $n GPUs: $(grep -iE 'error|cannot|does not fit' "$T/$f.log" | head -3)"
done
"$TETRA" "${DRY[@]}" --job.config_file "$F/v0.2.2_llama3_ft_debug_model.toml" >"$T/ft.log" 2>&1
rc=$?
n_err=$(grep -c "not supported\|not taken\|unknown" "$T/ft.log")
[ $rc = 1 ] && [ "$n_err" = 1 ] && grep -q "v0.2.2_llama3_ft_debug_model.toml:[0-9]*: fault_tolerance.enable is not supported: TorchFT" "$T/ft.log" &&
  ok "v0.2.2 llama3_ft is refused for fault_tolerance.enable alone: $(grep -o 'fault_tolerance.enable is not supported.*' "$T/ft.log" | cut -c1-90)..." ||
  bad "llama3_ft (exit $rc, $n_err errors): $(grep ERROR "$T/ft.log" | head -3)"
"$TETRA" "${DRY[@]}" --job.config_file "$F/v0.2.2_llama3_ft_debug_model.toml" --fault_tolerance.no-enable >"$T/ft2.log" 2>&1 &&
  grep -q "note: fault_tolerance.sync_steps = 10 (.*) has no effect in tetra" "$T/ft2.log" &&
  ok "with fault_tolerance.enable = false it dry-runs, and names the TorchFT keys it does not use ($(grep -c 'note:' "$T/ft2.log") notices)" ||
  bad "llama3_ft without TorchFT: $(grep -E 'ERROR|note' "$T/ft2.log" | head -3)"

# 3. a mid-2024 config: every old key in one run, each with its file, line and new home
"$TETRA" "${DRY[@]}" --job.config_file "$F/2024-07_llama3_8b.toml" >"$T/old.log" 2>&1
rc=$?
grep -q "12 keys are not taken" "$T/old.log" || bad "the 2024 config did not report its 12 old keys at once: $(grep -A3 ERROR "$T/old.log")"
for want in "norm_type is an older TorchTitan key, removed" "model.tokenizer_path is not supported" \
            "training.batch_size is an older TorchTitan key, renamed training.local_batch_size" \
            "training.warmup_steps is an older TorchTitan key, moved to lr_scheduler.warmup_steps" \
            "training.data_parallel_degree is an older TorchTitan key, renamed parallelism.data_parallel_shard_degree" \
            "training.tensor_parallel_degree is an older TorchTitan key, moved to parallelism.tensor_parallel_degree" \
            "training.fp8_linear is an older TorchTitan key, replaced by model.converters" \
            "training.compile is an older TorchTitan key, moved to compile.enable" \
            "experimental.pipeline_parallel_degree is an older TorchTitan key, moved to parallelism.pipeline_parallel_degree" \
            "checkpoint.enable_checkpoint is an older TorchTitan key, renamed checkpoint.enable" \
            "checkpoint.interval_type is an older TorchTitan key, removed" \
            "checkpoint.model_weights_only is an older TorchTitan key, renamed checkpoint.last_save_model_only"; do
  grep -q "2024-07_llama3_8b.toml:[0-9]*: .*$want" "$T/old.log" || bad "the 2024 report lacks '$want'"
done
[ $rc = 1 ] && [ "$fail" = 0 ] && ok "the 2024 8B config: exit 1, all 12 old keys in one message with file:line and new home"

# 4. command-line spellings and conversions
pc() { "$TETRA" "${DRY[@]}" --job.config_file "$F/v0.2.2_debug_model.toml" --job.print_config "$@" 2>&1; }
pc --metrics.enable-tensorboard >"$T/t1" && grep -q "^enable_tensorboard = true" "$T/t1" &&
  pc --metrics.no-enable-tensorboard --profiling.enable-profiling >"$T/t2" && grep -q "^enable_tensorboard = false" "$T/t2" &&
  grep -q "^enable_profiling = true" "$T/t2" && ok "tyro's --metrics.enable-tensorboard and --metrics.no-enable-tensorboard" ||
  bad "dashed flags: $(grep -E 'ERROR|enable_tensorboard' "$T/t1" "$T/t2" | head -3)"
pc --debug.seed 7 >"$T/s1" && [ "$(grep -c '^seed = 7$' "$T/s1")" = 2 ] && ok "debug.seed = 7 is training.seed" ||
  bad "debug.seed: $(grep -E 'ERROR|^seed' "$T/s1")"
pc --debug.seed 7 --training.seed 8 >"$T/s2"
pc --training.max_context_length 1024 >"$T/s3"
grep -q "v0.2.2_debug_model.toml:[0-9]*: training.seq_len = 2048 and command line: training.max_context_length gives 1024" "$T/s3" &&
  ok "max_context_length against the file's seq_len: refused, naming both" || bad "max_context_length: $(grep ERROR "$T/s3")"
grep -q "training.seed = 8 and command line: debug.seed gives 7" "$T/s2" && ok "debug.seed and training.seed set apart: refused" ||
  bad "debug.seed against training.seed: $(grep ERROR "$T/s2")"
"$TETRA" "${DRY[@]}" --job.print_config --training.num_tokens_per_microbatch_per_dp_rank 4096 \
   --training.max_context_length 1024 --training.num_tokens_per_train_step 8192 >"$T/b1" 2>&1 &&
  grep -q "^local_batch_size = 4$" "$T/b1" && grep -q "^seq_len = 1024$" "$T/b1" && grep -q "^global_batch_size = 8$" "$T/b1" &&
  ok "2026 names: 4096 tokens per microbatch at context 1024 = local_batch_size 4, 8192 per step = global_batch_size 8" ||
  bad "2026 names: $(grep -E 'ERROR|^(local_batch_size|seq_len|global_batch_size)' "$T/b1")"
pc --training.num_tokens_per_microbatch_per_dp_rank 3000 >"$T/b2"
grep -q "num_tokens_per_microbatch_per_dp_rank = 3000 is not a whole number of sequences" "$T/b2" &&
  ok "3000 tokens per microbatch at seq_len 2048: refused" || bad "an inexact 2026 name: $(grep ERROR "$T/b2")"
pc --training.dataloader.num_workers 4 --compile.enable >"$T/n1" &&
  grep -q "note: training.dataloader.num_workers = 4 (command line) has no effect in tetra" "$T/n1" &&
  grep -q "note: compile.enable = true (command line) has no effect in tetra" "$T/n1" &&
  ok "keys without effect are named at start-up: $(grep -c 'note:' "$T/n1") notices" || bad "notices: $(grep -E 'ERROR|note' "$T/n1")"
"$TETRA" train --job.config_file "$F/v0.2.2_debug_model.toml" --memory_estimation.enable --job.dump_folder "$T/est" \
  >"$T/m1" 2>&1 && grep -q "dry run:" "$T/m1" && grep -q "memory rank 0" "$T/m1" && ! grep -q "step:" "$T/m1" &&
  [ ! -e "$T/est/metrics.jsonl" ] && ok "memory_estimation.enable prints the dry run's estimate and trains nothing" ||
  bad "memory_estimation.enable: $(tail -3 "$T/m1")"

finish
