#!/usr/bin/env bash
# Conformance: run the toml-test corpus through tetra-toml-decode.
#
# The corpus comes from Debian's golang-github-burntsushi-toml-dev package
# (100 valid + 234 invalid TOML 1.0 cases). A missing corpus is a failure, not
# a skip, so that CI cannot silently stop checking conformance.
# Env: TETRA_BIN (directory with tetra-toml-decode), TETRA_ROOT (repository
# root); TOML_TEST_DIR overrides the corpus location.
set -euo pipefail

root=${TETRA_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
bin=${TETRA_BIN:-$root/build/bin}
suite=${TOML_TEST_DIR:-/usr/share/gocode/src/github.com/BurntSushi/toml/internal/toml-test/tests}
decoder=$bin/tetra-toml-decode
runner=$root/tests/toml/toml_test_runner.py

if [[ ! -d $suite/valid || ! -d $suite/invalid ]]; then
    echo "FAIL: toml-test corpus not found at $suite" >&2
    echo "      install it with: apt-get install golang-github-burntsushi-toml-dev" >&2
    exit 1
fi
if [[ ! -x $decoder ]]; then
    echo "FAIL: decoder $decoder not found; build the tetra-toml-decode target first" >&2
    exit 1
fi
python=$(command -v python3 || true)
if [[ -z $python ]]; then
    echo "FAIL: python3 is needed to run $runner" >&2
    exit 1
fi

# The package ships 100 valid and 234 invalid cases; fewer means the corpus
# changed and the expectations here need a look.
exec "$python" "$runner" --decoder "$decoder" --tests "$suite" \
    --min-valid 100 --min-invalid 234 --require-position "$@"
