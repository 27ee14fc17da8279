#!/usr/bin/env bash
# Fuzz the TOML parser with libFuzzer + ASan + UBSan.
#
#   tests/fuzz/run_fuzz.sh [SECONDS]      (default 60)
#
# Builds config/toml.c and the harness directly with clang (no CMake), seeds
# the corpus from the toml-test cases, and runs for SECONDS. Everything it
# writes (binary, corpus, crash artefacts, dictionary) goes under
# $TOML_FUZZ_DIR, default /tmp/tetra-toml-fuzz, never into the repository.
# Extra libFuzzer flags can be passed in TOML_FUZZ_FLAGS.
set -euo pipefail

secs=${1:-60}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${TOML_FUZZ_DIR:-/tmp/tetra-toml-fuzz}
suite=${TOML_TEST_DIR:-/usr/share/gocode/src/github.com/BurntSushi/toml/internal/toml-test/tests}
cc=${CC_FUZZ:-clang}

mkdir -p "$work/corpus" "$work/artifacts"

echo "building $work/toml_fuzz"
"$cc" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -g -O1 \
    -std=c11 -D_POSIX_C_SOURCE=200809L -I"$root" \
    "$root/config/toml.c" "$root/tests/fuzz/toml_fuzz.c" -o "$work/toml_fuzz" -lm

# Seeds: every toml-test case (valid and invalid) plus the repository's configs.
seeded=0
if [[ -d $suite ]]; then
    while IFS= read -r -d '' f; do
        name=$(sha1sum "$f" | cut -c1-40)
        cp "$f" "$work/corpus/$name"
        seeded=$((seeded + 1))
    done < <(find "$suite" -name '*.toml' -print0)
else
    echo "warning: toml-test corpus not found at $suite (apt-get install golang-github-burntsushi-toml-dev); fuzzing from the configs only" >&2
fi
if [[ -d $root/configs ]]; then
    while IFS= read -r -d '' f; do
        cp "$f" "$work/corpus/$(sha1sum "$f" | cut -c1-40)"
        seeded=$((seeded + 1))
    done < <(find "$root/configs" -name '*.toml' -print0)
fi
echo "seeded $seeded files; corpus now $(find "$work/corpus" -type f | wc -l) files"

# Tokens that random mutation rarely builds by itself.
cat > "$work/toml.dict" <<'EOF'
"["
"]"
"[["
"]]"
"{"
"}"
"="
"."
","
"#"
"\""
"'"
"\"\"\""
"'''"
"\\"
"\\u"
"\\U"
"\\n"
"\x0d\x0a"
"\x0a"
"true"
"false"
"inf"
"-inf"
"+nan"
"0x"
"0o"
"0b"
"_"
"e+"
"1979-05-27"
"07:32:00"
"1979-05-27T07:32:00Z"
"1979-05-27 07:32:00.999999-07:00"
".123456789"
"9223372036854775807"
"-9223372036854775808"
"\xef\xbb\xbf"
"\xed\xa0\x80"
"\xc3\xa9"
EOF

# shellcheck disable=SC2086
"$work/toml_fuzz" "$work/corpus" \
    -dict="$work/toml.dict" \
    -max_total_time="$secs" \
    -max_len=8192 \
    -timeout=10 \
    -rss_limit_mb=2048 \
    -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" \
    ${TOML_FUZZ_FLAGS:-}
