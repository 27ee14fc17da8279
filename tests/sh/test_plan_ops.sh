#!/usr/bin/env bash
# tetra plan --ops: the per-op cost table of a step on the GPU, recorded from the
# trainer's own op sequence without a GPU (docs/plan.md, "The ops of a step").
#   1. The debug model: the text report names the middle block's three phases, the head,
#      the embedding, the optimizer and the step's totals.
#   2. --json: each phase's rows add up to its total, the phases to the step, the block's
#      three phases to the block total; every op has a path-independent name.
#   3. Llama 3 8B with float8 tensorwise, AC none: the float8 section compares with the
#      same step in bf16; 7 converted linears per block, each with more launches than
#      its 3 GEMMs but at most 6.5 (the weights' amaxes come from AdamW, the residual
#      gradients' from the norms' backward, w2's and wo's inputs' kept with them for the
#      weight gradients, each output gradient cast with its transpose once for both its
#      gradients), and more bytes, at most 2.45 GB a block (against the bf16 block
#      below, which float8 cannot fuse alike); the bf16 block runs its 7 linears' GEMMs
#      through cuBLASLt as 13 launches (wq, wk and wv as one linear in all three
#      passes, w1 with w3 as one batched GEMM in the forward and the weight gradient:
#      13 / 7 per linear) and its attention through cuDNN.
#   4. Refusals: a block outside the model, a CPU profile (exit 2 with the reason).
#   5. Host waits: a step of 4 microbatches (gradient accumulation) waits 3 times, as a step
#      of one (the loss read, the gradient-norm read, the synchronisation after AdamW): the
#      inputs go without a wait and the losses are read once per step.
#   6. The plan's step time prices these ops: on h100-sxm, Llama 3 8B on one GPU with AC
#      none, float8 rowwise (its fp32 epilogue passes) plans a longer compute than
#      tensorwise, which the same GEMM FLOPs at the same fp8 rate could not show, and both
#      a shorter one than bf16.
#   7. The float8 all-gather: on fsdp 8 the planned compute is shorter with it (the
#      weights arrive as their codes: no casts from bf16 at each use), on one rank the same.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }

DEBUG=(--job.config_file "$ROOT/configs/debug_model.toml")
B8=(--job.config_file "$ROOT/configs/llama3_8b.toml" --activation_checkpoint.mode none)

# 1. the text report
if "$TETRA" plan "${DEBUG[@]}" --ops >"$T/debug.txt" 2>"$T/debug.err"; then
  miss=""
  for want in "block 3 of 6: forward" "block 3 of 6: backward input" "block 3 of 6: backward weight" \
              "head forward" "embedding (forward and backward)" "optimizer (clip gradients and AdamW)" \
              "per step" "launches:" "not a measurement"; do
    grep -qF "$want" "$T/debug.txt" || miss="$miss '$want'"
  done
  [ -z "$miss" ] && ok "text report: every section" || bad "text report misses$miss"
else
  bad "tetra plan --ops exited $?: $(head -3 "$T/debug.err")"
fi

# 2. the JSON adds up
check_json() { # NAME FILE
  python3 - "$1" "$2" <<'EOF'
import json, sys
name, o = sys.argv[1], json.load(open(sys.argv[2]))
ph = o["phases"]
errs = []
def close(a, b): return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
for k, p in ph.items():
    if "ops" not in p: continue
    if sum(r["launches"] for r in p["ops"]) != p["launches"]: errs.append(k + " launches")
    if not close(sum(r["bytes_read"] + r["bytes_written"] for r in p["ops"]), p["bytes_read"] + p["bytes_written"]):
        errs.append(k + " bytes")
    if any(not r["op"] or not r["what"].startswith(r["op"]) for r in p["ops"]): errs.append(k + " names")
if sum(p["launches"] for p in ph.values()) != o["step"]["launches"]: errs.append("step launches")
if not close(sum(p["roofline_s"] for p in ph.values()), o["step"]["roofline_s"]): errs.append("step time")
blk = ["block_forward", "block_backward_input", "block_backward_weight"]
if sum(ph[k]["launches"] for k in blk) != o["block_total"]["launches"]: errs.append("block total")
if o["block"] != o["n_layers"] // 2: errs.append("middle block")
print(("FAIL " if errs else "ok   ") + "%s: phases add up to the step (%d launches, %.3g s)%s" % (
    name, o["step"]["launches"], o["step"]["roofline_s"], ": " + ", ".join(errs) if errs else ""))
sys.exit(1 if errs else 0)
EOF
}
if "$TETRA" plan "${DEBUG[@]}" --ops --json >"$T/debug.json" 2>"$T/debug.jerr"; then
  check_json "debug model" "$T/debug.json" && pass=$((pass+1)) || fail=$((fail+1))
else
  bad "tetra plan --ops --json exited $?: $(head -3 "$T/debug.jerr")"
fi

# 3. float8 against bf16 on the 8B block
if "$TETRA" plan "${B8[@]}" --model.converters float8 --ops --json >"$T/f8.json" 2>"$T/f8.err"; then
  check_json "8B float8" "$T/f8.json" && pass=$((pass+1)) || fail=$((fail+1))
  python3 - "$T/f8.json" <<'EOF' && pass=$((pass+1)) || fail=$((fail+1))
import json, sys
o = json.load(open(sys.argv[1]))
f = o.get("float8_vs_bf16")
fwd16 = f and f["block_bf16"]
ok = (f is not None and f["recipe"] == "tensorwise" and f["converted_linears_per_block"] == 7
      and 3 < f["launches_per_converted_linear"] <= 6.5 and 0 < f["block_extra_bytes"] <= 2.45e9
      and f["step_extra_launches"] > 0
      and o["block"] == 16 and o["n_layers"] == 32 and fwd16["cublaslt"] == 13 and fwd16["cudnn"] == 2
      and abs(f["gemm_launches_per_linear_bf16"] - 13 / 7) < 1e-9)
print(("ok   " if ok else "FAIL ") + "8B float8 tensorwise: %s converted linears, %.1f launches each, %+.2f GB a block"
      % (f and f["converted_linears_per_block"], f and f["launches_per_converted_linear"],
         f and f["block_extra_bytes"] / 1e9))
sys.exit(0 if ok else 1)
EOF
else
  bad "8B float8 --ops exited $?: $(head -3 "$T/f8.err")"
fi

# 4. refusals
"$TETRA" plan "${DEBUG[@]}" --ops --block 6 >"$T/b.out" 2>"$T/b.err"; rc=$?
[ $rc = 2 ] && grep -q "the model has 6 blocks" "$T/b.err" && ok "--block 6 of 6: exit 2, says why" \
  || bad "--block 6: exit $rc: $(head -2 "$T/b.err")"
"$TETRA" plan "${DEBUG[@]}" --ops --hardware cpu >"$T/c.out" 2>"$T/c.err"; rc=$?
[ $rc = 2 ] && grep -q "CPU profile" "$T/c.err" && ok "--hardware cpu: exit 2, says why" \
  || bad "--hardware cpu: exit $rc: $(head -2 "$T/c.err")"

# 5. no host wait in a step that neither logs nor saves (the loss sums, gradient norm,
#    clip coefficient and update decision stay on the device), whatever the microbatches
for acc in 1 4; do
  "$TETRA" plan "${DEBUG[@]}" --training.seq_len 256 --training.local_batch_size 2 \
    --training.global_batch_size $((2 * acc)) --ops >"$T/acc$acc.txt" 2>&1
done
w1=$(grep -o '[0-9]* host waits*' "$T/acc1.txt" | head -1); w4=$(grep -o '[0-9]* host waits*' "$T/acc4.txt" | head -1)
[ "$w1" = "0 host waits" ] && [ "$w4" = "0 host waits" ] && ok "host waits per step: 1 microbatch $w1, 4 microbatches $w4" ||
  bad "host waits per step: 1 microbatch '$w1', 4 microbatches '$w4' (want 0 each)"
# the trainer's spans reach their phases: the head's and the embedding's ops are theirs
for ph in "head forward (norm, output, loss)" "head backward input" "head backward weight" "embedding (forward and backward)"; do
  n=$(grep -F "  $ph " "$T/acc1.txt" | head -1 | awk '{for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+$/) {print $i; exit}}')
  [ "${n:-0}" -gt 0 ] 2>/dev/null && ok "phase '$ph': $n launches" || bad "phase '$ph' has no launches: $(grep -F "$ph" "$T/acc1.txt")"
done

# a document mask's attention at the pairs the corpus's documents leave (the plan's own
# estimate: the recorder cannot read the ids the step hands the op)
docs_corpus "$T/docs"
for m in causal block_causal; do
  "$TETRA" plan "${DEBUG[@]}" --training.seq_len 2048 --training.dataset_path "$T/docs" --model.attn_mask_type $m \
    --ops --json >"$T/ops_$m.json" 2>"$T/ops_$m.err" || bad "plan --ops with $m: $(head -2 "$T/ops_$m.err")"
done
if python3 - "$T/ops_causal.json" "$T/ops_block_causal.json" <<'EOF'
import json, sys
c, b = (json.load(open(p)) for p in sys.argv[1:])
attn = lambda r: sum(v for k, v in r["phases"]["block_forward"]["flops"].items() if k.startswith("attention"))
share = b["attention"]["doc_share"]
assert c["attention"]["doc_share"] == 1.0 and "causal mask" in c["attention"]["source"], c["attention"]
assert 0 < share < 0.2 and "block_causal on" in b["attention"]["source"], b["attention"]
# causal runs on cuDNN (4d per pair), block_causal on the built-in tensor-core kernels,
# whose P V takes two bf16 terms (6d per pair): kernels/op_costs.h
assert abs(attn(b) - 1.5 * share * attn(c)) <= 1e-6 * attn(c), (attn(b), share, attn(c))
print("block_causal: the block's attention %.3g GFLOP against causal %.3g (share %.3f: %s)" %
      (attn(b) / 1e9, attn(c) / 1e9, share, b["attention"]["source"]))
EOF
then ok "document-masked attention recorded at the corpus's share of the pairs"
else bad "document-masked attention in plan --ops"; fi

# 6. the plan's step time from the recorded ops
for v in bf16 tensorwise rowwise; do
  extra=(--model.converters float8 --quantize.linear.float8.recipe_name "$v")
  [ "$v" = bf16 ] && extra=()
  "$TETRA" plan "${B8[@]}" --ngpu 1 --hardware h100-sxm --training.local_batch_size 1 --json "${extra[@]}" \
    >"$T/step_$v.json" 2>"$T/step.err"
done
if python3 - "$T" <<'EOF'
import json, sys
c = {v: json.load(open("%s/step_%s.json" % (sys.argv[1], v)))["time"]["compute_s"] for v in ("bf16", "tensorwise", "rowwise")}
assert c["tensorwise"] < c["rowwise"] < c["bf16"], c
print("planned compute of one 8B sequence: bf16 %.1f ms, float8 tensorwise %.1f ms, rowwise %.1f ms" %
      tuple(1e3 * c[v] for v in ("bf16", "tensorwise", "rowwise")))
EOF
then ok "the plan's step time prices the recorded ops"
else bad "the plan's step time from the ops: $(cat "$T/step.err")"; fi

# 7. the float8 all-gather: under FSDP each converted weight arrives as its codes, so a
# microbatch takes W as it came and W^T by one byte transpose instead of two casts from
# bf16; with one rank nothing is gathered and nothing changes
AG=(--quantize.linear.float8.enable_fsdp_float8_all_gather --quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp)
for n in 1 8; do
  "$TETRA" plan "${B8[@]}" --ngpu $n --hardware h100-sxm --training.local_batch_size 1 --model.converters float8 \
    --json >"$T/ag0_$n.json" 2>"$T/ag.err"
  "$TETRA" plan "${B8[@]}" --ngpu $n --hardware h100-sxm --training.local_batch_size 1 --model.converters float8 \
    "${AG[@]}" --json >"$T/ag1_$n.json" 2>>"$T/ag.err"
done
if python3 - "$T" <<'EOF'
import json, sys
c = {(a, n): json.load(open("%s/ag%d_%d.json" % (sys.argv[1], a, n)))["time"]["compute_s"] for a in (0, 1) for n in (1, 8)}
assert c[(1, 1)] == c[(0, 1)], c
assert c[(1, 8)] < 0.995 * c[(0, 8)], c
print("planned compute of one 8B sequence on fsdp 8: %.1f ms with the float8 all-gather, %.1f ms without" %
      (1e3 * c[(1, 8)], 1e3 * c[(0, 8)]))
EOF
then ok "the float8 all-gather's codes skip the weights' casts under FSDP"
else bad "the float8 all-gather in the plan: $(cat "$T/ag.err")"; fi

finish
