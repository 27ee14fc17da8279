#!/usr/bin/env bash
# Every CUDA kernel compiles for sm_80 and sm_90a without register spills
# (scripts/ptxas_report.sh). Needs only nvcc, not a GPU.
set -uo pipefail
ROOT="${TETRA_ROOT:-$(pwd)}"
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
if [ ! -x "$NVCC" ]; then echo "SKIP: nvcc not found; the CUDA backend is not built here"; exit 0; fi
out="${TETRA_BUILD:-$ROOT/build}/ptxas_report.txt"
NVCC="$NVCC" "$ROOT/scripts/ptxas_report.sh" "$out"
