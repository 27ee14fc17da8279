#!/usr/bin/env bash
# tetra plan: the memory it predicts is the memory training takes.
#   1. For 1 rank, FSDP 2, TP 2, PP 2 (ZB-H1, 1F1B, and Interleaved1F1B x FSDP 2 whose
#      stages share a gradient buffer), CP 2, HSDP 2x2, each AC mode, float8 and a
#      larger flavour, `tetra plan --json` (cpu profile) predicts the backend
#      bytes every rank allocates at start-up; a real `tetra train` under mpirun
#      reports them ("backend memory: ... (N bytes)"): the largest rank must agree
#      within 1 % (the issue asks 10 %; the plan is the trainer's own layout).
#   2. The JSON has the documented keys; the text report names a config that does
#      not fit and the knobs that would make it fit (exit 1); a layout the trainer
#      refuses, an unknown profile and bad options exit non-zero with the reason.
#      CPU offload: Llama 3 8B on one 80 GB H100 fits with training.enable_cpu_offload
#      and not without; its master weights and moments are counted on the host.
#   3. --recommend on the debug model at 4 ranks lists layouts that fit, and the
#      first one's overrides run in tetra train; over a config that sets tp 2, the
#      printed overrides of tp 1, async TP and larger pipeline microbatch layouts lay
#      out too.
#   4. --calibrate under 2 MPI ranks writes a profile that --hardware reads back.
#   5. NCCL's device memory (a model) on a GPU profile: a line of the peak, zero for one
#      rank, growing with the communicators, none on the CPU profile, no NVLS buffers
#      without NVSwitch.
#   6. block_causal: the attention pairs planned from the document lengths `tetra data
#      prepare` recorded equal an independent evaluation of the same histogram (rounded
#      to an integer), the step is shorter than causal's, and a corpus without recorded
#      lengths is planned as causal and says so.
#   7. Every row of TorchTitan's published H100 table (bench/plan/torchtitan_h100.py,
#      h100-96gb, the step time from the recorded op sequence) is within 18 % in
#      tokens/s/GPU and 15 % in memory without NCCL's line, and Megatron-Bridge's 8B FP8
#      run plans at 13,500 tokens/s/GPU or more on h100-sxm (issue 38's gate; 14,451
#      published).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_WAIT_POLICY=PASSIVE
export TETRA_DATA_DIR="${TETRA_DATA_DIR:-$ROOT/build/data}"

BASE=(--job.config_file "$ROOT/configs/debug_model.toml" --training.seq_len 64 --training.device cpu
      --training.threads 1 --metrics.disable_color_printing)

# 1. predicted vs allocated
check_memory() { # NAME RANKS ARGS...
  local name=$1 np=$2
  shift 2
  if ! "$TETRA" plan "${BASE[@]}" --hardware cpu --ngpu "$np" --json "$@" >"$T/$name.json" 2>"$T/$name.perr"; then
    bad "$name: tetra plan exited $?: $(head -2 "$T/$name.perr")"; return
  fi
  if ! mpirun -np "$np" --oversubscribe --bind-to none "$TETRA" train "${BASE[@]}" --training.steps 1 \
      --job.dump_folder "$T/run_$name" "$@" >"$T/$name.log" 2>&1; then
    bad "$name: tetra train exited non-zero: $(grep -m2 ERROR "$T/$name.log")"; return
  fi
  python3 - "$T/$name.json" "$T/$name.log" "$name" <<'EOF'
import json, re, sys
plan = json.load(open(sys.argv[1]))
want = plan["memory"]["training_buffers_bytes"]
got = [int(m.group(1)) for m in re.finditer(r"backend memory: .*?\((\d+) bytes\)", open(sys.argv[2]).read())]
if not got:
    print("FAIL %s: no backend memory line in the training log" % sys.argv[3]); sys.exit(1)
g = max(got)
r = want / g
line = "%s: plan %.3f MiB, allocated %.3f MiB (largest of %d ranks), ratio %.4f" % (
    sys.argv[3], want / 2**20, g / 2**20, len(got), r)
print(("ok   " if abs(r - 1) <= 0.01 else "FAIL ") + line)
sys.exit(0 if abs(r - 1) <= 0.01 else 1)
EOF
  if [ $? -eq 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); fi
}
check_memory single 1 --training.local_batch_size 4
check_memory fsdp2 2 --training.local_batch_size 2
check_memory hsdp2x2 4 --training.local_batch_size 1 --parallelism.data_parallel_replicate_degree 2
check_memory tp2 2 --training.local_batch_size 4 --parallelism.tensor_parallel_degree 2
check_memory pp2_zbh1 2 --training.local_batch_size 4 --parallelism.pipeline_parallel_degree 2 \
  --parallelism.pipeline_parallel_schedule InterleavedZeroBubble --parallelism.pipeline_parallel_layers_per_stage 3 \
  --parallelism.pipeline_parallel_first_stage_less_layers 0 --parallelism.pipeline_parallel_last_stage_less_layers 0
check_memory pp2_1f1b 2 --training.local_batch_size 4 --parallelism.pipeline_parallel_degree 2 \
  --parallelism.pipeline_parallel_schedule 1F1B
# two stages per rank taking turns in one unsharded gradient buffer
check_memory pp2_fsdp2_turns 4 --training.local_batch_size 4 --parallelism.pipeline_parallel_degree 2 \
  --parallelism.pipeline_parallel_schedule Interleaved1F1B --parallelism.pipeline_parallel_microbatch_size 2
check_memory cp2 2 --training.local_batch_size 2 --parallelism.context_parallel_degree 2
check_memory ac_none 1 --training.local_batch_size 4 --activation_checkpoint.mode none
check_memory ac_op 1 --training.local_batch_size 4 --activation_checkpoint.mode selective \
  --activation_checkpoint.selective_ac_option op
check_memory ac_every2 1 --training.local_batch_size 4 --activation_checkpoint.mode selective \
  --activation_checkpoint.selective_ac_option 2
check_memory ac_full 1 --training.local_batch_size 4 --activation_checkpoint.mode full
check_memory float8 1 --training.local_batch_size 4 --model.converters float8 --quantize.linear.float8.emulate true
check_memory small_fsdp2 2 --model.flavor small --training.local_batch_size 2

# 2. JSON keys, not fitting, refusals
if "$TETRA" plan --job.config_file "$ROOT/configs/llama3_8b.toml" --ngpu 8 --json >"$T/8b.json" 2>"$T/8b.err" &&
   python3 - "$T/8b.json" <<'EOF'
import json, sys
o = json.load(open(sys.argv[1]))
need = ["peak_memory_gib", "tokens_per_s_per_gpu", "mfu", "step_time_s", "bubble_fraction", "fits", "memory",
        "communication", "time"]
miss = [k for k in need if k not in o]
assert not miss, "missing keys %s" % miss
assert o["fits"] is True and 10 < o["peak_memory_gib"] < 80, o["peak_memory_gib"]
assert 0 < o["mfu"] < 1 and o["tokens_per_s_per_gpu"] > 0 and o["step_time_s"] > 0
assert o["communication"]["fsdp"]["group_size"] == 8 and o["communication"]["fsdp"]["link"] == "intra_node"
print("8B on 8 GPUs: %.1f GiB, %.0f tokens/s/GPU, MFU %.1f%%" % (o["peak_memory_gib"], o["tokens_per_s_per_gpu"],
                                                                100 * o["mfu"]))
EOF
then ok "json keys"; else bad "json keys: $(cat "$T/8b.err")"; fi

"$TETRA" plan --job.config_file "$ROOT/configs/llama3_8b.toml" --ngpu 1 >"$T/nofit.out" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "does not fit by" "$T/nofit.out" && grep -q "activation_checkpoint.mode = full" "$T/nofit.out"
then ok "8B on one GPU: $(grep -m1 'does not fit' "$T/nofit.out" | sed 's/^ *//')"
else bad "8B on one GPU: exit $rc"; cat "$T/nofit.out"; fi

expect_error() { # NAME RC SUBSTRING ARGS...
  local name=$1 want_rc=$2 want=$3
  shift 3
  "$TETRA" plan "$@" >"$T/e.out" 2>"$T/e.err"; local rc=$?
  if [ $rc -eq "$want_rc" ] && grep -qF -- "$want" "$T/e.err"; then ok "$name: $(grep -m1 -F -- "$want" "$T/e.err")"
  else bad "$name: exit $rc (want $want_rc), stderr: $(head -3 "$T/e.err")"; fi
}
expect_error "tp does not divide" 1 "tensor_parallel_degree" --job.config_file "$ROOT/configs/llama3_8b.toml" \
  --ngpu 6 --parallelism.tensor_parallel_degree 4
expect_error "unknown profile" 2 "h100-sxm" --job.config_file "$ROOT/configs/llama3_8b.toml" --ngpu 8 --hardware tpu9
expect_error "bad ngpu" 2 "--ngpu" --job.config_file "$ROOT/configs/llama3_8b.toml" --ngpu zero
expect_error "unknown key" 2 "no_such_key" --job.config_file "$ROOT/configs/llama3_8b.toml" --ngpu 8 \
  --training.no_such_key 3

# 3. recommend
if "$TETRA" plan "${BASE[@]}" --hardware cpu --ngpu 4 --recommend --top 3 --training.global_batch_size 8 \
    --training.local_batch_size 2 >"$T/rec.out" 2>"$T/rec.err"; then
  first=$(sed -n 2,3p "$T/rec.out" | tail -1 | sed 's/^ *//')
  if [ -n "$first" ] && eval "mpirun -np 4 --oversubscribe --bind-to none \"\$TETRA\" train \"\${BASE[@]}\" \
      --dry-run $first" >"$T/rec_dry.log" 2>&1; then
    ok "recommend: $(head -1 "$T/rec.out"); the first runs: $first"
  else bad "recommend: the first layout does not lay out: $first"; tail -3 "$T/rec_dry.log"; fi
else bad "recommend exited non-zero: $(head -3 "$T/rec.err")"; fi
# a config that sets tp 2: every layout printed must still say its own degrees (its tp 1
# too); of the top 60, the first, the first async TP one, the first three at tp 1 and the
# first with pipeline microbatches of more than one sequence are laid out as printed
if "$TETRA" plan "${BASE[@]}" --parallelism.tensor_parallel_degree 2 --hardware cpu --ngpu 4 --recommend --top 60 \
    --training.global_batch_size 8 --training.local_batch_size 2 >"$T/rec2.out" 2>"$T/rec2.err"; then
  nl=0; ntp1=0; nasync=0; nmbs=0; nbad=0; tp=""; as=0
  while read -r line; do
    case "$line" in
      [0-9]*.*) tp=$(sed -n 's/.* tp \([0-9]*\).*/\1/p' <<<"$line"); as=0; [[ "$line" == *async ]] && as=1; continue ;;
      --*) ;;
      *) continue ;;
    esac
    mb=0; [[ "$line" == *pipeline_parallel_microbatch_size* ]] && mb=1
    [ "$nl" -eq 0 ] || { [ "$tp" = 1 ] && [ "$ntp1" -lt 3 ]; } || { [ "$as" = 1 ] && [ "$nasync" -eq 0 ]; } ||
      { [ "$mb" = 1 ] && [ "$nmbs" -eq 0 ]; } || continue
    nl=$((nl+1)); [ "$tp" = 1 ] && ntp1=$((ntp1+1)); [ "$as" = 1 ] && nasync=$((nasync+1)); [ "$mb" = 1 ] && nmbs=$((nmbs+1))
    eval "mpirun -np 4 --oversubscribe --bind-to none \"\$TETRA\" train \"\${BASE[@]}\" \
        --parallelism.tensor_parallel_degree 2 --dry-run $line" </dev/null >"$T/rec2_dry.log" 2>&1 ||
      { nbad=$((nbad+1)); echo "  does not lay out: $line"; tail -2 "$T/rec2_dry.log"; }
  done <"$T/rec2.out"
  if [ "$ntp1" -ge 1 ] && [ "$nasync" -ge 1 ] && [ "$nmbs" -ge 1 ] && [ "$nbad" -eq 0 ]; then
    ok "recommend over a tp 2 config: $nl layouts ($ntp1 at tp 1, $nasync with async TP, $nmbs with microbatches of 2+) lay out as printed"
  else bad "recommend over a tp 2 config: $nbad of $nl layouts ($ntp1 at tp 1, $nasync with async TP, $nmbs with microbatches of 2+) do not lay out as printed"; fi
else bad "recommend (tp 2 config) exited non-zero: $(head -3 "$T/rec2.err")"; fi

# 4. calibrate
if mpirun -np 2 --oversubscribe --bind-to none "$TETRA" plan --calibrate --out "$T/hw/cpu.toml" >"$T/cal.out" 2>&1 &&
   "$TETRA" plan "${BASE[@]}" --hardware "$T/hw/cpu.toml" --ngpu 2 --json >"$T/cal.json" 2>"$T/cal.err"; then
  ok "calibrate: $(grep -c . "$T/cal.out") lines; $(grep -m1 -i gemm "$T/cal.out" | sed 's/^ *//')"
else bad "calibrate"; cat "$T/cal.out" "$T/cal.err" 2>/dev/null | tail -5; fi

# CPU offload: Llama 3 8B (32 blocks, seq 8192) on one 80 GB H100 does not fit without it
# and fits with it; the master weights and the moments are counted on the host
"$TETRA" plan --job.config_file "$ROOT/configs/llama3_8b.toml" --ngpu 1 --hardware h100-sxm --json \
  >"$T/off0.json" 2>"$T/off0.err"
"$TETRA" plan --job.config_file "$ROOT/configs/llama3_8b.toml" --ngpu 1 --hardware h100-sxm --json \
  --training.enable_cpu_offload >"$T/off1.json" 2>"$T/off1.err"
if python3 - "$T/off0.json" "$T/off1.json" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ma, mb = a["memory"], b["memory"]
assert not a["fits"] and b["fits"], (a["fits"], b["fits"], a["peak_memory_gib"], b["peak_memory_gib"])
assert not ma["cpu_offload"] and mb["cpu_offload"] and ma["host_gib"] == 0
# the device keeps the bf16 copy only (a third of fp32 master + bf16), no optimizer state
assert mb["optimizer_state_gib"] == 0 and abs(mb["parameters_gib"] * 3 - ma["parameters_gib"]) < 0.05
# the host holds 12 bytes per parameter (fp32 master, m, v) and two units' staging
n = 8030261248
assert 12 * n / 2**30 < mb["host_gib"] < 12 * n / 2**30 + 8, mb["host_gib"]
print("  8B on one H100: %.1f GiB without offload, %.1f GiB with (host %.1f GiB)"
      % (a["peak_memory_gib"], b["peak_memory_gib"], mb["host_gib"]))
EOF
then ok "cpu offload: 8B fits one 80 GB GPU with it and not without"; else bad "cpu offload plan: $(cat "$T/off1.err")"; fi

# 5. NCCL's own memory (a model): on a GPU profile it is a line of the peak, zero for one
# rank, more with more communicators; none on the CPU profile (MPI); no NVLS buffers on
# a profile without NVSwitch (a profile without the key has none)
sed 's/^nvswitch = true.*/nvswitch = false/' "$ROOT/configs/hardware/h100-sxm.toml" >"$T/nonvs.toml"
grep -v '^nvswitch' "$ROOT/configs/hardware/h100-sxm.toml" >"$T/nokey.toml"
nccl_plan() { # NAME ARGS...
  local name=$1; shift
  "$TETRA" plan "${BASE[@]}" --training.device cuda --json "$@" >"$T/nccl_$name.json" 2>"$T/nccl_$name.err"
  [ -s "$T/nccl_$name.json" ] || echo "  $name: $(head -2 "$T/nccl_$name.err")"
}
nccl_plan one --hardware h100-sxm --ngpu 1 --training.local_batch_size 4
nccl_plan fsdp4 --hardware h100-sxm --ngpu 4 --training.local_batch_size 1
nccl_plan hsdp2x2 --hardware h100-sxm --ngpu 4 --training.local_batch_size 1 --parallelism.data_parallel_replicate_degree 2
nccl_plan tp2 --hardware h100-sxm --ngpu 4 --training.local_batch_size 1 --parallelism.tensor_parallel_degree 2
nccl_plan cpu4 --hardware cpu --ngpu 4 --training.local_batch_size 1 --training.device cpu
nccl_plan nonvs --hardware "$T/nonvs.toml" --ngpu 4 --training.local_batch_size 1
nccl_plan nokey --hardware "$T/nokey.toml" --ngpu 4 --training.local_batch_size 1
"$TETRA" plan "${BASE[@]}" --training.device cuda --hardware h100-sxm --ngpu 4 --training.local_batch_size 1 \
  >"$T/nccl_text.out" 2>&1
if python3 - "$T" <<'EOF'
import json, sys
d = sys.argv[1]
o = {n: json.load(open("%s/nccl_%s.json" % (d, n))) for n in
     ("one", "fsdp4", "hsdp2x2", "tp2", "cpu4", "nonvs", "nokey")}
m = {n: v["memory"] for n, v in o.items()}
gib = lambda n: m[n]["nccl_gib"]
comms = lambda n: m[n]["nccl"]["communicators"]
assert gib("one") == 0 and comms("one") == 0, m["one"]
assert gib("fsdp4") > 0.1, m["fsdp4"]
# the peak holds it: buffers + reserved + NCCL
for n in ("one", "fsdp4", "tp2"):
    want = m[n]["training_buffers_bytes"] / 2**30 + m[n]["reserved_gib"] + gib(n)
    assert abs(o[n]["peak_memory_gib"] - want) < 1e-3, (n, o[n]["peak_memory_gib"], want)
# more communicators, more memory: fsdp 4 (dp_shard, fsdp, batch, loss and the world hold
# the same ranks: one) < hsdp 2x2 (world, dp_replicate, dp_shard); tp 2 x fsdp 2 (world,
# dp_shard, tp) adds its all-to-all buffers
assert comms("fsdp4") == 1 and comms("hsdp2x2") == 3 and comms("tp2") == 3, (comms("fsdp4"), comms("hsdp2x2"))
assert gib("one") < gib("fsdp4") < gib("hsdp2x2") and gib("hsdp2x2") < gib("tp2"), [gib(n) for n in o]
assert m["tp2"]["nccl"]["p2p_gib"] > 0 and m["fsdp4"]["nccl"]["p2p_gib"] == 0
assert gib("cpu4") == 0 and comms("cpu4") == 0, m["cpu4"]
assert m["fsdp4"]["nccl"]["nvls_gib"] > 0 and m["nonvs"]["nccl"]["nvls_gib"] == 0 and gib("nonvs") < gib("fsdp4")
assert m["nokey"]["nccl"] == m["nonvs"]["nccl"], (m["nokey"]["nccl"], m["nonvs"]["nccl"])
print("NCCL per rank: 1 rank 0, fsdp 4 %.2f GiB (%d communicators), hsdp 2x2 %.2f (%d), tp 2 %.2f (%d), "
      "cpu 0, no NVSwitch %.2f" % (gib("fsdp4"), comms("fsdp4"), gib("hsdp2x2"), comms("hsdp2x2"), gib("tp2"),
                                   comms("tp2"), gib("nonvs")))
EOF
then
  if grep -q "^  NCCL .*(1 communicator:" "$T/nccl_text.out"; then ok "NCCL line in the report: $(grep -m1 '^  NCCL' "$T/nccl_text.out" | sed 's/^ *//')"
  else bad "no NCCL line in the text report"; cat "$T/nccl_text.out"; fi
  ok "NCCL memory model"
else bad "NCCL memory model"; fi

# 6. document-masked attention planned from the corpus's document lengths
docs_corpus "$T/docs"
cp -r "$T/docs" "$T/docs_old"
python3 -c 'import json,sys; p=sys.argv[1]+"/index.json"; ix=json.load(open(p)); del ix["splits"]["train"]["document_lengths"]; json.dump(ix, open(p, "w"))' "$T/docs_old"
DOC=(--job.config_file "$ROOT/configs/debug_model.toml" --training.seq_len 2048 --ngpu 1 --json)
"$TETRA" plan "${DOC[@]}" --training.dataset_path "$T/docs" >"$T/dm_causal.json" 2>"$T/dm.err" &&
"$TETRA" plan "${DOC[@]}" --training.dataset_path "$T/docs" --model.attn_mask_type block_causal >"$T/dm_block.json" \
  2>>"$T/dm.err" &&
"$TETRA" plan "${DOC[@]}" --training.dataset_path "$T/docs_old" --model.flavor debugmodel_flex_attn \
  >"$T/dm_old.json" 2>>"$T/dm.err"
if python3 - "$T" <<'EOF'
import json, sys
d = sys.argv[1]
c, b, o = (json.load(open(f"{d}/dm_{n}.json")) for n in ("causal", "block", "old"))
T = 2048
causal = T * (T + 1) / 2
# the expected pairs, evaluated here from the histogram: a token i places into a sequence sees
# min(A, i) + 1 keys, A its offset in its document; P(A >= k) = sum_docs max(n - k, 0) / tokens
buckets = json.load(open(f"{d}/docs/index.json"))["splits"]["train"]["document_lengths"]
tokens = sum(t for _, _, t in buckets)
def tail(k):
    return sum(cnt * max(t / cnt - k, 0.0) for _, cnt, t in buckets) / tokens
want = T + sum((T - k) * tail(k) for k in range(1, T))
got = b["attention"]["pairs_per_sequence"]
assert abs(got - want) <= 0.5, (got, want)  # the JSON holds the count rounded
assert c["attention"]["mask"] == "causal" and c["attention"]["pairs_per_sequence"] == causal
assert b["attention"]["mask"] == "block_causal" and got < 0.2 * causal, got
assert b["step_time_s"] < c["step_time_s"] and b["mfu_computed"] < b["mfu"], (b["step_time_s"], c["step_time_s"])
src = o["attention"]["source"]
assert o["attention"]["pairs_per_sequence"] == causal and "planned as causal" in src, o["attention"]
assert "records no document lengths" in src, src
print("block_causal plan: %.0f pairs a sequence (%.1f%% of causal), step %.2f ms against causal %.2f ms" %
      (got, 100 * got / causal, 1e3 * b["step_time_s"], 1e3 * c["step_time_s"]))
EOF
then ok "block_causal planned from the corpus's document lengths"
else bad "block_causal plan: $(cat "$T/dm.err")"; fi

# 7. TorchTitan's published H100 rows: within 18 % in speed, 15 % in memory (without NCCL)
if (cd "$ROOT" && python3 bench/plan/torchtitan_h100.py --tetra "$TETRA" --max-speed 0.18 --max-memory 0.15 \
  --min-megatron 13500) \
  >"$T/tt.out" 2>&1 && grep -q "^Megatron-Bridge 8B FP8 .* plan [0-9]* on h100-sxm" "$T/tt.out"; then
  ok "TorchTitan's H100 table: $(grep '^largest deviation' "$T/tt.out"); Megatron-Bridge's 8B FP8 config: $(grep -o 'plan [0-9]* on h100-sxm' "$T/tt.out")"
else bad "TorchTitan's H100 table"; cat "$T/tt.out"; fi

echo "test_plan: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
