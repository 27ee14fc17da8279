#!/usr/bin/env bash
# tetra plan pp: every schedule at p = 4, m = 8 simulates; 1F1B's printed bubble is
# (p-1)/(m+p-1) = 3/11, ZB-H1's (InterleavedZeroBubble, 1 stage per rank) lower,
# ZBV's the lowest; a dumped CSV (compute-only and lowered) loads back through
# --schedule-csv with the same numbers; --png writes a PNG of the announced size;
# a hand-written CSV runs, and a deadlocking one is reported; bad input exits
# non-zero with a clear message.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }

# the number after a label in the summary ("bubble fraction   0.272727  (...)")
field() { awk -v k="$2" 'index($0, k) == 1 { sub(k, ""); print $1; exit }' "$1"; }

# expect_error NAME RC EXPECTED_SUBSTRING ARGS... : exit status RC and the substring on stderr
expect_error() {
  local name="$1" want_rc="$2" want="$3"; shift 3
  "$TETRA" plan "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ "$rc" -ne "$want_rc" ]; then bad "$name: exit $rc, want $want_rc ($(head -1 "$T/err"))"; return; fi
  if grep -qF -- "$want" "$T/err"; then ok "$name: $(grep -F -- "$want" "$T/err" | head -1)"
  else bad "$name: stderr lacks '$want':"; cat "$T/err"; fi
}

# 1. every schedule at p = 4, m = 8
declare -A BUBBLE
run() { # NAME ARGS...
  local name="$1"; shift
  if "$TETRA" plan pp --pp 4 --microbatches 8 "$@" >"$T/$name.out" 2>"$T/$name.err"; then
    BUBBLE[$name]=$(field "$T/$name.out" "bubble fraction")
    ok "$name: bubble fraction ${BUBBLE[$name]}, peak in flight $(field "$T/$name.out" "peak in flight") model microbatches"
  else
    bad "$name: exit $?: $(cat "$T/$name.err")"
    BUBBLE[$name]=1
  fi
}
run GPipe --schedule GPipe
run 1F1B --schedule 1F1B
run Interleaved1F1B --schedule Interleaved1F1B --stages-per-rank 2
run LoopedBFS --schedule LoopedBFS --stages-per-rank 2
run ZBH1 --schedule InterleavedZeroBubble --stages-per-rank 1
run InterleavedZeroBubble --schedule InterleavedZeroBubble --stages-per-rank 2
run ZBVZeroBubble --schedule ZBVZeroBubble --stages-per-rank 2
run DualPipeV --schedule DualPipeV --stages-per-rank 2

want=$(awk 'BEGIN { printf "%.6f", 3 / 11 }')
[ "${BUBBLE[1F1B]}" = "$want" ] && ok "1F1B bubble ${BUBBLE[1F1B]} = 3/11" || bad "1F1B bubble ${BUBBLE[1F1B]}, want $want"
[ "${BUBBLE[GPipe]}" = "$want" ] && ok "GPipe bubble ${BUBBLE[GPipe]} = 3/11" || bad "GPipe bubble ${BUBBLE[GPipe]}, want $want"
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }
lt "${BUBBLE[ZBH1]}" "${BUBBLE[1F1B]}" && ok "ZB-H1 ${BUBBLE[ZBH1]} < 1F1B ${BUBBLE[1F1B]}" \
  || bad "ZB-H1 ${BUBBLE[ZBH1]} not below 1F1B ${BUBBLE[1F1B]}"
lowest=1
for k in "${!BUBBLE[@]}"; do
  [ "$k" = ZBVZeroBubble ] && continue
  le "${BUBBLE[ZBVZeroBubble]}" "${BUBBLE[$k]}" || { lowest=0; bad "ZBV ${BUBBLE[ZBVZeroBubble]} above $k ${BUBBLE[$k]}"; }
done
[ "$lowest" = 1 ] && lt "${BUBBLE[ZBVZeroBubble]}" "${BUBBLE[ZBH1]}" && ok "ZBV ${BUBBLE[ZBVZeroBubble]} is the lowest"
grep -q "rank 0 |F0 F1 F2 F3 \.\.\." "$T/1F1B.out" && ok "1F1B chart starts with rank 0's four warm-up forwards" \
  || { bad "1F1B chart:"; cat "$T/1F1B.out"; }
grep -q "^0 .* 4 = 4$" "$T/1F1B.out" && grep -q "^3 .* 1 = 1$" "$T/1F1B.out" \
  && ok "1F1B peak in flight: rank 0 holds p = 4, rank 3 holds 1" || bad "1F1B peak in flight"
grep -q "no overlap credit" "$T/DualPipeV.out" && ok "DualPipeV states that OVERLAP_F_B gets no overlap credit" \
  || bad "DualPipeV output lacks the overlap note"

# 2. CSV round trips: compute-only and lowered give the same numbers
summary() { grep -E "^(makespan|bubble fraction|peak in flight)" "$1"; }
for k in 1F1B Interleaved1F1B ZBVZeroBubble DualPipeV; do
  v=2; case "$k" in 1F1B) v=1 ;; esac
  "$TETRA" plan pp --schedule "$k" --pp 4 --microbatches 8 --stages-per-rank $v --csv "$T/$k.csv" >"$T/gen.out" 2>&1 \
    || { bad "$k --csv: $(cat "$T/gen.out")"; continue; }
  "$TETRA" plan pp --schedule-csv "$T/$k.csv" --pp 4 --microbatches 8 >"$T/load.out" 2>&1 \
    || { bad "$k reload: $(cat "$T/load.out")"; continue; }
  if [ -n "$(summary "$T/gen.out")" ] && [ "$(summary "$T/gen.out")" = "$(summary "$T/load.out")" ]; then
    ok "$k: compute-only CSV reloads with the same makespan, bubble and peak"
  else bad "$k: reloaded CSV differs:"; diff <(summary "$T/gen.out") <(summary "$T/load.out"); fi
  "$TETRA" plan pp --schedule "$k" --pp 4 --microbatches 8 --stages-per-rank $v --with-comms --csv "$T/$k.comms.csv" \
    >/dev/null 2>&1 || { bad "$k --with-comms --csv failed"; continue; }
  grep -q "SEND_F" "$T/$k.comms.csv" && grep -q "UNSHARD" "$T/$k.comms.csv" || bad "$k: lowered CSV lacks SEND_F/UNSHARD"
  "$TETRA" plan pp --schedule-csv "$T/$k.comms.csv" --pp 4 --microbatches 8 >"$T/comms.out" 2>&1 \
    || { bad "$k lowered reload: $(cat "$T/comms.out")"; continue; }
  if grep -q "lowered schedule checked" "$T/comms.out" && [ "$(summary "$T/gen.out")" = "$(summary "$T/comms.out")" ]; then
    ok "$k: lowered CSV is checked by a dry run and simulates to the same numbers"
  else bad "$k: lowered CSV reload:"; cat "$T/comms.out"; fi
done

# 3. PNG: signature and IHDR size as announced
"$TETRA" plan pp --schedule ZBVZeroBubble --pp 4 --microbatches 8 --png "$T/zbv.png" >"$T/png.out" 2>&1 \
  || bad "--png: $(cat "$T/png.out")"
if [ -f "$T/zbv.png" ]; then
  sig=$(head -c 8 "$T/zbv.png" | od -An -tx1 | tr -d ' \n')
  [ "$sig" = "89504e470d0a1a0a" ] && ok "PNG signature" || bad "not a PNG (signature $sig)"
  ihdr=$(od -An -j12 -N4 -c "$T/zbv.png" | tr -d ' \n')
  w=$(od -An -j16 -N4 -tu1 "$T/zbv.png" | awk '{ print (($1 * 256 + $2) * 256 + $3) * 256 + $4 }')
  h=$(od -An -j20 -N4 -tu1 "$T/zbv.png" | awk '{ print (($1 * 256 + $2) * 256 + $3) * 256 + $4 }')
  said=$(sed -n 's/^wrote .*zbv.png (\([0-9]*\) x \([0-9]*\))$/\1 \2/p' "$T/png.out")
  [ "$ihdr" = IHDR ] && [ "$w $h" = "$said" ] && [ "$w" -gt 100 ] && ok "IHDR ${w} x ${h} as announced" \
    || bad "IHDR '$ihdr' ${w} x ${h}, announced '$said'"
else
  bad "no PNG written"
fi

# 4. a hand-written CSV (ZB-H1, p = 2, m = 2: idle cells, split backward) and a deadlocking one
printf '0F0,0F1,,0I0,0W0,0I1,0W1\n,1F0,1I0,1F1,1I1,1W0,1W1\n' >"$T/zb2.csv"
if "$TETRA" plan pp --schedule-csv "$T/zb2.csv" --pp 2 --microbatches 2 >"$T/zb2.out" 2>&1; then
  ms=$(field "$T/zb2.out" "makespan")
  [ "$ms" = 7 ] && ok "hand-written ZB-H1 CSV: makespan 7 (ideal 6 + (p-1)(tf+tb-tw) = 1)" || bad "zb2 makespan $ms, want 7"
else
  bad "hand-written CSV: $(cat "$T/zb2.out")"
fi
printf '0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n' >"$T/dead.csv"
expect_error "deadlocking CSV" 1 "deadlock" pp --schedule-csv "$T/dead.csv" --pp 2 --microbatches 2
grep -q "rank 1 at 1F1 (action 0) waits for 0F1 on rank 0" "$T/err" && ok "deadlock names rank 1's next action" \
  || { bad "deadlock report:"; cat "$T/err"; }

# 5. bad input
expect_error "unknown schedule" 2 "unknown schedule 'Zero' (known: GPipe, 1F1B" pp --schedule Zero --pp 4 --microbatches 8
expect_error "pp 0" 2 "--pp needs an integer >= 1, got '0'" pp --schedule 1F1B --pp 0 --microbatches 8
expect_error "microbatches 0" 2 "--microbatches needs an integer >= 1, got '0'" pp --schedule 1F1B --pp 4 --microbatches 0
expect_error "negative time" 2 "--tw needs a time >= 0, got '-0.5'" pp --schedule 1F1B --pp 4 --microbatches 8 --tw -0.5
expect_error "generator refusal" 2 "2 stages per rank" pp --schedule ZBVZeroBubble --pp 4 --microbatches 8 --stages-per-rank 3
expect_error "unreadable CSV" 1 "$T/missing.csv" pp --schedule-csv "$T/missing.csv" --pp 4 --microbatches 8
printf '0F0,0X1\n' >"$T/garbage.csv"
expect_error "malformed CSV" 1 "garbage.csv" pp --schedule-csv "$T/garbage.csv" --pp 1 --microbatches 1
expect_error "missing options" 2 "--microbatches is required" pp --schedule 1F1B --pp 4
expect_error "unknown option" 2 "unknown option '--bogus'" pp --schedule 1F1B --pp 4 --microbatches 8 --bogus
expect_error "plan without subcommand" 2 "pp    simulate a pipeline schedule" 
expect_error "unknown subcommand" 2 "unknown subcommand 'cp'" cp
"$TETRA" plan pp --help >"$T/help" 2>&1 && grep -q -- "--schedule-csv FILE" "$T/help" && ok "plan pp --help" || bad "plan pp --help"

echo "test_plan_pp: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
