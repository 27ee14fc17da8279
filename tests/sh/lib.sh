# lib.sh — what every tests/sh script starts with; sourced right after `set -uo pipefail`:
#   ROOT   the source tree (TETRA_ROOT, else the working directory: ctest runs there)
#   BIN    the executables (TETRA_BIN, else $ROOT/build/bin); TETRA is $BIN/tetra
#   PY     the Python with the test references (TETRA_PYTHON, else python3)
#   T      a temporary folder, removed at exit (a script that sets its own EXIT trap
#          removes it there)
#   ok/bad count and print a passed or failed check; finish prints the tally and is the
#   script's last command (its status is the test's).
#   docs_corpus DIR  prepares a corpus of short documents into DIR (below).
# shellcheck shell=bash
ROOT="${TETRA_ROOT:-$(pwd)}"
BIN="${TETRA_BIN:-$ROOT/build/bin}"
TETRA="$BIN/tetra"
PY="${TETRA_PYTHON:-python3}"
[ -x "$PY" ] || PY=python3
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok()  { pass=$((pass+1)); echo "ok   $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" = 0 ]
}
# Open MPI as root (CI runs as root) and without the single-copy mechanism containers lack
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"

# docs_corpus DIR: the first 40,000 words of Moby-Dick cut into documents of 10 to 159
# words, prepared into DIR with the test tokenizer (every document BOS ... EOS, their
# lengths in index.json): what the document-mask plans are made on.
docs_corpus() {
  python3 - "$ROOT/tests/assets/moby_dick.txt" "$T/docs_corpus.jsonl" <<'EOF'
import json, sys
words = open(sys.argv[1], encoding="utf-8").read().split()[:40000]
with open(sys.argv[2], "w", encoding="utf-8") as f:
    i = k = 0
    while i < len(words):
        n = (37 * k) % 150 + 10
        f.write(json.dumps({"text": " ".join(words[i:i + n])}) + "\n")
        i, k = i + n, k + 1
EOF
  "$TETRA" data prepare --tokenizer "$ROOT/tests/assets/tokenizer" --input "$T/docs_corpus.jsonl" --output "$1" \
    --val-fraction 0 --quiet
}
