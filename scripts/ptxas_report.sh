#!/usr/bin/env bash
# ptxas_report.sh [REPORT] — compile every CUDA source for each architecture of
# the build with `-Xptxas -v` and save the register / stack / spill report
# (default: build/ptxas_report.txt). Exits 1 if any kernel spills registers.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPORT="${1:-$ROOT/build/ptxas_report.txt}"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
ARCHS="${TETRA_CUDA_ARCHS:-80;90a}"
if [ ! -x "$NVCC" ]; then echo "ptxas_report.sh: nvcc not found (set NVCC)" >&2; exit 2; fi
mkdir -p "$(dirname "$REPORT")"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
# device code only (-cubin, one architecture per call): ptxas reports the same kernels as
# a full compile, without compiling the host side
flags=(-std=c++17 -O3 -I"$ROOT" -I/usr/local/include --expt-relaxed-constexpr -Xptxas -v -cubin)
: >"$REPORT"
for src in "$ROOT"/kernels/cuda/*.cu "$ROOT"/parallel/*.cu; do
  [ -f "$src" ] || continue
  echo "== ${src#"$ROOT"/}" >>"$REPORT"
  : >"$tmp/log"
  for a in ${ARCHS//;/ }; do
    if ! "$NVCC" "${flags[@]}" -arch="sm_$a" "$src" -o "$tmp/out.cubin" >>"$tmp/log" 2>&1; then
      cat "$tmp/log" >&2; echo "ptxas_report.sh: $src failed to compile for sm_$a" >&2; exit 1
    fi
  done
  # ptxas prints "Compiling entry function 'X' for 'sm_Y'" then "Used N registers ..." per kernel
  { grep -E "Compiling entry|Used [0-9]+ registers|spill" "$tmp/log" || true; } | sed "s/^ptxas info *: *//" >>"$REPORT"
done
kernels=$(grep -c "Compiling entry" "$REPORT" || true)
spills=$(grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$REPORT" || true)
echo "ptxas report: $kernels kernel compilations for sm_{${ARCHS//;/,}} in $REPORT"
if [ -n "$spills" ]; then
  echo "kernels with register spills:"; grep -B2 -E "[1-9][0-9]* bytes spill" "$REPORT" | grep "Compiling entry"
  exit 1
fi
echo "no kernel spills registers"
