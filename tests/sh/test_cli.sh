#!/usr/bin/env bash
# End-to-end checks of the tetra CLI: help, print_config, bad configs, launcher.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# expect_error NAME EXPECTED_SUBSTRING CMD... : non-zero exit and the substring on stderr
expect_error() {
  local name="$1" want="$2"; shift 2
  if "$@" >"$T/out" 2>"$T/err"; then bad "$name: exit 0 (expected failure)"; return; fi
  if grep -qF -- "$want" "$T/err"; then ok "$name: $(grep -F -- "$want" "$T/err" | head -1 | sed 's/.* - ERROR - //')"
  else bad "$name: stderr lacks '$want':"; cat "$T/err"; fi
}

# 1. --help lists every key of every section
"$TETRA" train --help >"$T/help" 2>&1 || bad "train --help exit code"
n_keys=$(grep -c '^  --' "$T/help")
for s in job profiling metrics model optimizer lr_scheduler training parallelism checkpoint \
         activation_checkpoint compile quantize.linear.float8 validation comm; do
  grep -q "^\[$s\]" "$T/help" || bad "help lacks section [$s]"
done
[ "$n_keys" -ge 100 ] && ok "train --help lists $n_keys keys" || bad "train --help lists only $n_keys keys"
grep -q -- "--training.seq_len  int  (default: 2048)" "$T/help" && ok "help shows type and default" || bad "help format"

# 2. print_config emits valid TOML that Python's tomllib reads, with CLI > TOML > default
# (a tiny model and batch keep the one training step this also runs short)
SMALL=(--model.flavor tiny --training.seq_len 32 --training.local_batch_size 2 --job.dump_folder "$T/dump")
"$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --job.print_config \
   --training.steps 1 --optimizer.lr=0.002 "${SMALL[@]}" >"$T/printed" 2>"$T/err" || bad "print_config run failed: $(cat "$T/err")"
"$PY" - "$T/printed" <<'P' && ok "print_config is valid TOML with merged values" || bad "print_config output"
import sys, tomllib
text = open(sys.argv[1]).read()
start = text.index("# tetra merged configuration")
end = text.find("\n[tetra", start)
doc = tomllib.loads(text[start:] if end < 0 else text[start:end])
assert doc["training"]["steps"] == 1, doc["training"]          # command line
assert doc["optimizer"]["lr"] == 0.002                         # command line (= form)
assert doc["training"]["seq_len"] == 32                        # command line over file
assert doc["model"]["flavor"] == "tiny"                        # command line over file
assert doc["lr_scheduler"]["decay_ratio"] == 0.8               # file
assert doc["lr_scheduler"]["warmup_steps"] == 2                # file over default
assert doc["optimizer"]["beta2"] == 0.95                       # default
assert doc["quantize"]["linear"]["float8"]["filter_fqns"] == ["output"]
assert doc["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
P

# 3. bad configs: unknown key, wrong type, impossible layout
cat >"$T/typo.toml" <<'C'
[training]
seq_len = 512
local_batch_sise = 4
C
expect_error "unknown key" "typo.toml:3: unknown key 'local_batch_sise' in [training] (did you mean training.local_batch_size?)" \
  "$TETRA" train --job.config_file "$T/typo.toml"
cat >"$T/type.toml" <<'C'
[optimizer]
lr = "3e-4"
C
expect_error "wrong type" "type.toml:2: optimizer.lr expects a number, got string \"3e-4\"" \
  "$TETRA" train --job.config_file "$T/type.toml"
cat >"$T/layout.toml" <<'C'
[parallelism]
tensor_parallel_degree = 2
data_parallel_shard_degree = 2
C
expect_error "layout vs world size" "but the world size is 1" "$TETRA" train --job.config_file "$T/layout.toml"
printf '[training]\nsteps = 10\n[training]\nseq_len = 1\n' >"$T/dup.toml"
expect_error "TOML redefinition" "dup.toml:3:" "$TETRA" train --job.config_file "$T/dup.toml"
expect_error "unknown CLI option" "did you mean --training.steps?" "$TETRA" train --training.step 3
expect_error "missing config file" "nope.toml" "$TETRA" train --job.config_file "$T/nope.toml"
expect_error "a folder as the config file" "config file '$T' is a folder; job.config_file names a TOML file" \
  "$TETRA" train --job.config_file "$T"
printf '[[training]]\nsteps = 3\n' >"$T/aot.toml"
expect_error "an array of tables" "aot.toml:1: [[training]] is an array of tables; a config section is one table: write [training]" \
  "$TETRA" train --job.config_file "$T/aot.toml"
expect_error "a file as the corpus folder" "$T/aot.toml is a file, not a corpus folder" \
  "$TETRA" train --training.dataset_path "$T/aot.toml" --training.steps 1 "${SMALL[@]}"
expect_error "unknown subcommand" "unknown command 'trian' (did you mean 'train'?)" "$TETRA" trian
expect_error "unknown plan option" "unknown option --ngpus (did you mean --ngpu?)" "$TETRA" plan --ngpus 8
for v in -V --version version; do
  if [ "$("$TETRA" $v 2>&1)" = "$("$TETRA" --version)" ] && "$TETRA" $v | grep -qE '^tetra [0-9]+\.[0-9]+'; then
    ok "tetra $v: $("$TETRA" $v)"
  else bad "tetra $v: $("$TETRA" $v 2>&1 | head -1)"; fi
done

# 4. save_config_file writes the merged config atomically
"$TETRA" train --job.save_config_file "$T/saved.toml" --training.steps 7 --training.steps 1 "${SMALL[@]}" >/dev/null 2>&1
if [ -f "$T/saved.toml" ] && grep -q '^steps = 1$' "$T/saved.toml" && ! ls "$T"/saved.toml.tmp.* >/dev/null 2>&1; then
  ok "save_config_file"
else bad "save_config_file"; fi

# 5. the same seed gives the same run, bit for bit; another seed another run
run_losses() { # SEED DIR
  "$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --training.steps 3 --training.seed "$1" \
    --model.flavor tiny --training.seq_len 32 --training.local_batch_size 2 --job.dump_folder "$2" >/dev/null 2>&1
  grep -o '"loss": *[^,]*' "$2/metrics.jsonl"
}
a="$(run_losses 7 "$T/seed_a")"; b="$(run_losses 7 "$T/seed_b")"; c="$(run_losses 8 "$T/seed_c")"
if [ -n "$a" ] && [ "$(printf '%s\n' "$a" | wc -l)" = 3 ] && [ "$a" = "$b" ] && [ "$a" != "$c" ]; then
  ok "same seed, identical losses: $(printf '%s' "$a" | tr '\n' ' ')"
else bad "determinism: seed 7 gave [$a] and [$b], seed 8 [$c]"; fi

# 6. run_train.sh with NGPU=2 launches two MPI ranks that agree on the layout
if command -v mpirun >/dev/null; then
  out="$(cd "$ROOT" && NGPU=2 LOG_RANK=all LOG_DIR="$T/logs" ./run_train.sh --job.print_config \
        --parallelism.data_parallel_shard_degree 2 --training.steps 1 "${SMALL[@]}" 2>&1)"
  if printf '%s' "$out" | grep -q "world 2 = pp 1 x dp_replicate 1 x dp_shard 2"; then ok "NGPU=2 launches 2 ranks"
  else bad "NGPU=2 launch:"; printf '%s\n' "$out" | tail -20; fi
  # LOG_RANK naming no rank of the run shows rank 0 and says so, and a hidden rank's errors
  # still reach the console: rank 1 alone fails (its relative dataset_path resolves elsewhere),
  # through the launcher's rank_exec.sh, with nothing of Open MPI's around tetra's lines
  if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
  export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
  mkdir -p "$T/lone" && ln -s "$BIN/../data/sample" "$T/lone/corpus"
  printf '#!/bin/sh\nif [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then cd /; fi\nexec "$@"\n' >"$T/lone.sh"
  chmod +x "$T/lone.sh"
  out="$(cd "$T/lone" && mpirun -np 2 --oversubscribe --bind-to none "$T/lone.sh" "$ROOT/scripts/rank_exec.sh" 5 \
        "$T/lone" "$TETRA" train --training.dataset_path corpus --parallelism.data_parallel_shard_degree 2 \
        --training.steps 1 "${SMALL[@]}" 2>&1)"
  rc=$?
  if [ $rc = 1 ] && grep -q "LOG_RANK=5 names no rank of this 2-rank run (ranks 0 to 1): showing rank 0" <<<"$out" &&
     grep -q "^\[tetra|rank 1\] .* - ERROR - training data: corpus: no such corpus folder" <<<"$out" &&
     grep -q "ERROR - training data: corpus" "$T/lone/rank_1.log" && ! grep -qv '\[tetra|rank [01]\] ' <<<"$out"; then
    ok "LOG_RANK=5 of 2 ranks: rank 0 shown with a warning, hidden rank 1's error on the console, only tetra's lines"
  else bad "LOG_RANK=5 of 2 ranks (exit $rc):"; printf '%s\n' "$out" | head -20; fi
else
  bad "mpirun not found (install openmpi-bin)"
fi

# 7. the CPU quick start: no CONFIG_FILE and no GPU -> debug config at 512 x 4; an explicit
#    CONFIG_FILE runs as written (TorchTitan's 2048 x 8); arguments override the quick start
if [ "$("$TETRA" info --gpu-count 2>/dev/null)" = 0 ]; then
  q="$(cd "$ROOT" && env -u CONFIG_FILE ./run_train.sh --job.print_config --training.steps 1 --model.flavor tiny 2>&1)"
  w="$(cd "$ROOT" && CONFIG_FILE=./configs/debug_model.toml ./run_train.sh --job.print_config --training.steps 1 --model.flavor tiny 2>&1)"
  o="$(cd "$ROOT" && env -u CONFIG_FILE ./run_train.sh --job.print_config --training.steps 1 --model.flavor tiny --training.seq_len 1024 2>&1)"
  # the line says what runs: an overridden value is named as the command line's, and with
  # both overridden there is no quick start left to announce
  b="$(cd "$ROOT" && env -u CONFIG_FILE ./run_train.sh --job.print_config --training.steps 1 --model.flavor tiny \
        --training.seq_len 128 --training.local_batch_size 2 2>&1)"
  if grep -q "CPU quick start, .* at seq_len 512 x local_batch_size 4 " <<<"$q" && grep -qx "seq_len = 512" <<<"$q" &&
     grep -qx "local_batch_size = 4" <<<"$q" &&
     ! grep -q "CPU quick start" <<<"$w" && grep -qx "seq_len = 2048" <<<"$w" && grep -qx "local_batch_size = 8" <<<"$w" &&
     grep -qx "seq_len = 1024" <<<"$o" &&
     grep -q "CPU quick start, .* at seq_len 1024 (command line) x local_batch_size 4 " <<<"$o" &&
     ! grep -q "quick start" <<<"$b" && grep -qx "seq_len = 128" <<<"$b" && grep -qx "local_batch_size = 2" <<<"$b"; then
    ok "run_train.sh CPU quick start: 512 x 4 by default, the config as written with CONFIG_FILE, arguments override (and the line says so)"
  else bad "run_train.sh quick start:"; printf '%s
' "$q" | head -5; printf '%s
' "$w" | grep -n "seq_len\|local_batch"; fi
else
  ok "run_train.sh CPU quick start not checked: a GPU is visible"
fi

# 8. booleans: --flag, --flag true|false, --flag=false, --section.no_flag and --section.no-flag
for form in "--checkpoint.enable" "--checkpoint.enable true" "--checkpoint.enable=true"; do
  v="$("$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --checkpoint.no_enable $form \
       --job.print_config --dry-run 2>/dev/null | sed -n '/^\[checkpoint\]/,/^\[/p' | grep -m1 '^enable = ')"
  [ "$v" = "enable = true" ] && ok "boolean form '$form' sets true" || bad "boolean form '$form' gave '$v'"
done
for form in "--checkpoint.enable false" "--checkpoint.enable=false" "--checkpoint.no_enable" "--checkpoint.no-enable"; do
  v="$("$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --checkpoint.enable $form \
       --job.print_config --dry-run 2>/dev/null | sed -n '/^\[checkpoint\]/,/^\[/p' | grep -m1 '^enable = ')"
  [ "$v" = "enable = false" ] && ok "boolean form '$form' sets false" || bad "boolean form '$form' gave '$v'"
done
expect_error "a boolean with another word" "unexpected argument 'maybe'" \
  "$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --checkpoint.enable maybe
expect_error "a refused key names itself" "optimizer.early_step_in_backward is not supported" \
  "$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --optimizer.early_step_in_backward
expect_error "CPU offload on the CPU backend is refused as meaningless" "enable_cpu_offload has no meaning" \
  "$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --training.device cpu --training.enable_cpu_offload

# 9. colour: NO_COLOR and TETRA_COLOR=0 turn it off, TETRA_COLOR=1 on (the launcher decides
#    from its own stdout, since a rank's stdout under mpirun can be a pty)
run1() { "$TETRA" train --job.config_file "$ROOT/configs/debug_model.toml" --training.steps 1 "${SMALL[@]}" \
           --job.dump_folder "$T/colour" 2>&1; }
esc=$'\033'
TETRA_COLOR=1 run1 >"$T/c1.log"
NO_COLOR=1 TETRA_COLOR=1 run1 >"$T/c2.log"
TETRA_COLOR=0 run1 >"$T/c3.log"
if grep -q "$esc" "$T/c1.log"; then ok "TETRA_COLOR=1 colours the log"; else bad "TETRA_COLOR=1 gave no colour"; fi
if grep -q "$esc" "$T/c2.log"; then bad "NO_COLOR left colour codes"; else ok "NO_COLOR wins"; fi
if grep -q "$esc" "$T/c3.log"; then bad "TETRA_COLOR=0 left colour codes"; else ok "TETRA_COLOR=0: plain"; fi
if command -v mpirun >/dev/null; then
  (cd "$ROOT" && NGPU=2 ./run_train.sh --parallelism.data_parallel_shard_degree 2 --training.steps 1 "${SMALL[@]}" \
     --job.dump_folder "$T/colour2" >"$T/launch.log" 2>&1)
  if grep -q "$esc" "$T/launch.log"; then bad "NGPU=2 ./run_train.sh > file wrote colour codes"
  else ok "NGPU=2 ./run_train.sh > file: no colour codes"; fi
fi

finish
