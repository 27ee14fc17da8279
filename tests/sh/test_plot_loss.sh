#!/usr/bin/env bash
# tools/plot_loss: two runs (one with validation records, one given as a
# folder with a label) drawn to a PNG; clear errors without gnuplot or input.
set -uo pipefail
ROOT="${TETRA_ROOT:-$(pwd)}"
PLOT="$ROOT/tools/plot_loss"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok()  { pass=$((pass+1)); echo "ok   $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }

if ! command -v gnuplot >/dev/null; then
  echo "FAIL gnuplot is not installed (Debian: apt-get install gnuplot-nox; scripts/setup.sh installs it)"
  exit 1
fi
[ -x "$PLOT" ] && ok "tools/plot_loss is executable" || bad "tools/plot_loss is not executable"

# run A: a metrics.jsonl with training and validation records, a torn last line
mkdir -p "$T/run_a" "$T/run b"
for s in $(seq 1 40); do
  awk -v s="$s" 'BEGIN { printf "{\"step\":%d,\"loss\":%.17g,\"grad_norm\":1.0,\"lr\":0.0008,\"tps\":1000.0,\"tflops\":0.1,\"mfu\":0.5,\"tokens_seen\":%d}\n", s, 2 + 9 * exp(-s / 8.0), s * 2048 }'
  if [ $((s % 10)) -eq 0 ]; then
    awk -v s="$s" 'BEGIN { printf "{\"step\":%d,\"validation_loss\":%.17g}\n", s, 2.3 + 9 * exp(-s / 8.0) }'
  fi
done >"$T/run_a/metrics.jsonl"
printf '{"step":41,"lo' >>"$T/run_a/metrics.jsonl"
# run B: training only, with a NaN (null) loss, in a folder whose name has a space
for s in $(seq 1 40); do
  if [ "$s" -eq 5 ]; then echo '{"step":5,"loss":null}'; continue; fi
  awk -v s="$s" 'BEGIN { printf "{\"step\":%d,\"loss\":%.17g}\n", s, 2.5 + 8 * exp(-s / 12.0) }'
done >"$T/run b/metrics.jsonl"

"$PLOT" "$T/out.png" "$T/run_a/metrics.jsonl" "b: lr=8e-4=$T/run b" >"$T/log" 2>&1 \
  && ok "plot_loss exit 0: $(grep 'wrote' "$T/log" | sed "s#$T/##")" || { bad "plot_loss failed:"; cat "$T/log"; }
grep -q "not JSON" "$T/log" && ok "torn line reported" || bad "torn line not reported"
if [ -f "$T/out.png" ]; then
  sig=$(head -c 8 "$T/out.png" | od -An -tx1 | tr -d ' \n')
  [ "$sig" = "89504e470d0a1a0a" ] && ok "PNG signature" || bad "not a PNG (signature $sig)"
  size=$(stat -c %s "$T/out.png")
  [ "$size" -gt 5000 ] && ok "PNG is $size bytes" || bad "PNG is only $size bytes"
else
  bad "no PNG written"
fi

# a single run, options
"$PLOT" --title "one run" --logy --size 640x400 "$T/one.png" "$T/run_a" >"$T/log" 2>&1 \
  && [ -s "$T/one.png" ] && ok "single run with --logy --size" || { bad "single run:"; cat "$T/log"; }

# errors
"$PLOT" "$T/x.png" "$T/missing" >"$T/out" 2>"$T/err" && bad "missing run: exit 0" \
  || { grep -q "cannot read $T/missing" "$T/err" && ok "missing run named in the error" || { bad "missing run message:"; cat "$T/err"; }; }
: >"$T/empty.jsonl"
"$PLOT" "$T/x.png" "$T/empty.jsonl" >"$T/out" 2>"$T/err" && bad "empty run: exit 0" \
  || { grep -q "holds no loss records" "$T/err" && ok "empty run rejected" || { bad "empty run message:"; cat "$T/err"; }; }
"$PLOT" "$T/x.png" >"$T/out" 2>"$T/err"; [ $? -eq 2 ] && grep -q usage "$T/err" && ok "usage on too few arguments" || bad "usage"
PY="$(python3 -c 'import sys; print(sys.executable)')"  # the interpreter itself, not a shim
PATH="/nonexistent" "$PY" "$PLOT" "$T/x.png" "$T/run_a" >"$T/out" 2>"$T/err"; rc=$?
[ $rc -ne 0 ] && grep -q "gnuplot not found" "$T/err" && ok "clear error without gnuplot: $(cat "$T/err")" \
  || { bad "no-gnuplot error (rc $rc):"; cat "$T/err"; }

echo "test_plot_loss: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
