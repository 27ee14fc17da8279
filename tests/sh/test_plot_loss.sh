#!/usr/bin/env bash
# tools/plot_loss: two runs (one with validation records, one given as a
# folder with a label) drawn to a PNG; clear errors without gnuplot or input.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PLOT="$ROOT/tools/plot_loss"

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
# Decode the PNG (zlib + the five row filters; 8-bit gray, RGB, palette or RGBA) and look at
# the drawing: the size asked for, and each run's colour (tools/plot_loss: run 1 #1f77b4, run
# 2 #d62728) drawn as a falling curve: in the leftmost and rightmost columns that hold the
# colour, the lowest such pixel (the training curve; the legend's sample sits above it) must
# be higher on the left. A blank or one-colour image, or a curve drawn upside down, fails.
check_png() { # file width height colours...
  python3 - "$@" <<'PY'
import struct, sys, zlib
path, w_want, h_want, colours = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
data = open(path, "rb").read()
if data[:8] != b"\x89PNG\r\n\x1a\n":
    sys.exit(f"not a PNG (signature {data[:8].hex()})")
pos, idat, plte = 8, b"", None
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
    elif kind == b"PLTE":
        plte = [tuple(body[i:i + 3]) for i in range(0, len(body), 3)]
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
if (w, h) != (w_want, h_want):
    sys.exit(f"image is {w}x{h}, asked for {w_want}x{h_want}")
if depth != 8 or interlace or ctype not in (0, 2, 3, 4, 6):
    sys.exit(f"unexpected PNG format: depth {depth}, colour type {ctype}, interlace {interlace}")
bpp = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ctype]
raw, stride, prev, rows = zlib.decompress(idat), w * bpp, bytearray(w * bpp), []
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        p = a + b - c
        pred = [0, a, b, (a + b) // 2, a if abs(p - a) <= abs(p - b) and abs(p - a) <= abs(p - c) else b if abs(p - b) <= abs(p - c) else c][f]
        line[i] = (line[i] + pred) & 255
    rows.append(line)
    prev = line
def rgb(x, y):
    px = rows[y][x * bpp:(x + 1) * bpp]
    if ctype == 3: return plte[px[0]]
    if ctype in (0, 4): return (px[0],) * 3
    return tuple(px[:3])
for col in colours:
    want = tuple(int(col[i:i + 2], 16) for i in (0, 2, 4))
    lowest = {}
    for y in range(h):
        for x in range(w):
            if sum(abs(p - q) for p, q in zip(rgb(x, y), want)) <= 24:
                lowest[x] = y
    if len(lowest) < w // 4:
        sys.exit(f"colour #{col} is drawn in only {len(lowest)} columns of {w}")
    xs = sorted(lowest)
    k = max(3, len(xs) // 20)
    left, right = sum(lowest[x] for x in xs[:k]) / k, sum(lowest[x] for x in xs[-k:]) / k
    if not left < right - h / 20:
        sys.exit(f"colour #{col}: the curve does not fall (lowest pixel row {left:.0f} on the left, {right:.0f} on the right)")
    print(f"#{col}: {len(lowest)} columns, falls from row {left:.0f} to {right:.0f}", end="; ")
print(f"{w}x{h}")
PY
}
if [ -f "$T/out.png" ]; then
  r=$(check_png "$T/out.png" 1200 700 1f77b4 d62728 2>&1) && ok "two runs drawn: $r" || bad "two runs: $r"
else
  bad "no PNG written"
fi

# a single run, options
"$PLOT" --title "one run" --logy --size 640x400 "$T/one.png" "$T/run_a" >"$T/log" 2>&1 \
  && ok "single run with --logy --size" || { bad "single run:"; cat "$T/log"; }
r=$(check_png "$T/one.png" 640 400 1f77b4 2>&1) && ok "one run, log scale, 640x400: $r" || bad "one run: $r"

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
