#!/usr/bin/env bash
# setup.sh — install what tetra needs (Debian/Ubuntu), then configure and build.
#
#   scripts/setup.sh            build dependencies + build (what run_train.sh needs)
#   scripts/setup.sh --tests    also the test references: PyTorch, toml-test cases,
#                               a one-node Slurm's programs, and a Python venv with
#                               tiktoken, tokenizers, ...; and the CUDA simulator tests
#                               (TETRA_CUDA_SIM=ON): a build folder configured without
#                               them is reconfigured
#   scripts/setup.sh --configure-only   everything but the build itself
#
# As root, missing packages are installed with apt-get; otherwise the exact
# command is printed and the script stops. A second run with nothing changed
# does no work beyond a quick check.
# Environment: BUILD_DIR (default build), TETRA_CMAKE_ARGS (extra cmake flags),
# TETRA_CUDA (AUTO, ON or OFF; a new folder gets AUTO, an existing one keeps its
# setting unless this is set), CI=true turns warnings into errors.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
WITH_TESTS=0
BUILD=1
for a in "$@"; do
  case "$a" in
    --tests) WITH_TESTS=1 ;;
    --configure-only) BUILD=0 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$a'" >&2; exit 2 ;;
  esac
done

say() { [ -t 1 ] && printf '\033[1m[setup]\033[0m %s\n' "$*" || printf '[setup] %s\n' "$*"; }

PKGS=(build-essential cmake pkg-config libopenblas-dev libdnnl-dev libopenmpi-dev openmpi-bin
      libpcre2-dev libjansson-dev libpng-dev zlib1g-dev libzstd-dev libsnappy-dev)
if [ "$WITH_TESTS" = 1 ]; then
  PKGS+=(python3 python3-venv python3-pip python3-torch python3-numpy
         golang-github-burntsushi-toml-dev gnuplot-nox zstd)
  # tests/sh/test_slurm.sh starts a private one-node Slurm from a slurm.conf of its own; the
  # system's services stay unconfigured (they start only with an /etc/slurm/slurm.conf)
  PKGS+=(slurmctld slurmd slurm-client)
  # sh/test_format checks every C, CUDA and header file against .clang-format
  PKGS+=(clang-format)
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    say "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "tetra needs these Debian packages. Run:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
fi

if [ "$WITH_TESTS" = 1 ]; then
  # The reference packages live in a venv that also sees Debian's python3-torch.
  REQ="$ROOT/tests/requirements.txt"
  VENV="$BUILD_DIR/venv"
  STAMP="$VENV/.tetra-requirements"
  if [ ! -x "$VENV/bin/python" ] || ! cmp -s "$REQ" "$STAMP"; then
    say "python reference packages (tests/requirements.txt) into $VENV"
    mkdir -p "$BUILD_DIR"
    [ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
    cp "$REQ" "$STAMP"
  fi
fi

# TETRA_CUDA is passed only when set: a reconfigured folder keeps its own choice
# (CMakeLists.txt's default is AUTO).
CMAKE_ARGS=()
if [ -n "${TETRA_CUDA:-}" ]; then CMAKE_ARGS+=(-DTETRA_CUDA="$TETRA_CUDA"); fi
if [ "${CI:-}" = true ]; then CMAKE_ARGS+=(-DTETRA_WERROR=ON); fi
# The test suite runs every CUDA kernel on the CPU simulator too (cmake/gpu_tests.cmake).
if [ "$WITH_TESTS" = 1 ]; then CMAKE_ARGS+=(-DTETRA_CUDA_SIM=ON); fi
# shellcheck disable=SC2206
CMAKE_ARGS+=(${TETRA_CMAKE_ARGS:-})
# A build folder configured without the simulator tests (./run_train.sh makes one) would
# silently leave gpu/test_ops_cuda_sim* out of the suite: the tests reconfigure it.
SIM_MISSING=0
if [ "$WITH_TESTS" = 1 ] && [ -f "$BUILD_DIR/CMakeCache.txt" ] &&
   ! grep -Eiq '^TETRA_CUDA_SIM:BOOL=(ON|TRUE|YES|Y|1)$' "$BUILD_DIR/CMakeCache.txt"; then
  SIM_MISSING=1
fi
shown="$BUILD_DIR"
case "$shown" in "$ROOT"/*) shown="${shown#"$ROOT"/}" ;; esac
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  say "configuring $BUILD_DIR"
  cmake -S "$ROOT" -B "$BUILD_DIR" "${CMAKE_ARGS[@]}" >/dev/null
elif [ "${CI:-}" = true ] || [ -n "${TETRA_CMAKE_ARGS:-}" ]; then
  if [ "$SIM_MISSING" = 1 ]; then say "reconfiguring ${shown%/}/ with the CUDA simulator tests (TETRA_CUDA_SIM=ON)"; fi
  cmake -S "$ROOT" -B "$BUILD_DIR" "${CMAKE_ARGS[@]}" >/dev/null
elif [ "$SIM_MISSING" = 1 ]; then
  # only this option changes: the folder's other settings (TETRA_CUDA, ...) stay as they are
  say "reconfiguring ${shown%/}/ with the CUDA simulator tests (TETRA_CUDA_SIM=ON)"
  cmake -S "$ROOT" -B "$BUILD_DIR" -DTETRA_CUDA_SIM=ON >/dev/null
fi
if [ "$BUILD" = 0 ]; then exit 0; fi
JOBS="$(nproc 2>/dev/null || echo 2)"
if ! out="$(cmake --build "$BUILD_DIR" -j "$JOBS" 2>&1)"; then
  printf '%s\n' "$out" >&2
  echo "setup.sh: build failed" >&2
  exit 1
fi
if printf '%s' "$out" | grep -q "Building\|Linking"; then say "built $BUILD_DIR/bin/tetra"; fi
