#!/usr/bin/env bash
# sanitize.sh — the whole test suite on a build with AddressSanitizer and UBSan.
#
#   scripts/sanitize.sh [ctest arguments]      e.g. -R unit/ for the C unit tests only
#
# Builds the C code (library, tetra, tests) with -fsanitize=address,undefined into
# build-asan/ (TETRA_SANITIZE; the CUDA backend, when nvcc is found, is built for sm_90a
# only and without instrumentation, so that `tetra plan` and the GPU tests see the same
# build as the plain suite) and runs every test there with ctest. Any report ends the test that
# triggered it (halt_on_error, abort_on_error), so a clean run is a suite with no report.
# Leaks are not checked: MPI and OpenBLAS keep allocations until exit. The Python tests
# run with the venv of ./run_tests.sh (build/venv) and the ASan runtime preloaded.
# CI runs it after ./run_tests.sh; it takes about twice as long as the plain suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ASAN_DIR="${ASAN_BUILD_DIR:-$ROOT/build-asan}"
# the dependencies, the test references and the venv, as the plain suite has them
./scripts/setup.sh --tests
mkdir -p "$ASAN_DIR"
cmake -S . -B "$ASAN_DIR" -DCMAKE_BUILD_TYPE=Release -DTETRA_SANITIZE=ON -DTETRA_WERROR=ON -DTETRA_CUDA_ARCHS=90a \
  -DTETRA_PYTHON="$ROOT/build/venv/bin/python" >"$ASAN_DIR/configure.log" 2>&1 ||
  { cat "$ASAN_DIR/configure.log" >&2; exit 1; }
cmake --build "$ASAN_DIR" -j "${BUILD_JOBS:-2}" >"$ASAN_DIR/build.log" 2>&1 ||
  { tail -40 "$ASAN_DIR/build.log" >&2; exit 1; }
echo "[sanitize] built $ASAN_DIR with -fsanitize=address,undefined; running the suite"
# also for the tests registered outside tests/ (cmake/gpu*.cmake, cmake/nccl.cmake)
export TETRA_SANITIZED=1 ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:detect_odr_violation=0" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
exec ctest --test-dir "$ASAN_DIR" --output-on-failure -j "${CTEST_JOBS:-2}" "$@"
