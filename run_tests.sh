#!/usr/bin/env bash
# run_tests.sh — install the test references, build, and run every test with ctest.
# The build folder always gets the CUDA simulator tests (scripts/setup.sh --tests
# reconfigures one that was configured without them, e.g. by ./run_train.sh).
# Extra arguments go to ctest (e.g. -R toml, -L unit).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
./scripts/setup.sh --tests
exec ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${CTEST_JOBS:-2}" "$@"
