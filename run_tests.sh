#!/usr/bin/env bash
# run_tests.sh — install the test references, build, and run every test with ctest.
# Extra arguments go to ctest (e.g. -R toml, -L unit).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
./scripts/setup.sh --tests
exec ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${CTEST_JOBS:-2}" "$@"
