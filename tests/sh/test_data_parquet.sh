#!/usr/bin/env bash
# test_data_parquet.sh — `tetra data prepare` on Parquet files written by pyarrow.
#
# Every file pyarrow writes here (uncompressed, Snappy, gzip and zstd; dictionary and
# plain encodings; data pages v1 and v2; several row groups and pages; nulls and empty
# strings; a dictionary that falls back to plain pages; page CRCs; a non-null column;
# FineWeb's schema; the text after nested and list columns; one single document; a folder
# of files) prepares to the same token shards as the same documents given as .jsonl
# (tests/py/parquet_ref.py writes both). Unsupported features (LZ4, DELTA_BYTE_ARRAY, a
# column of another type, a nested column) and malformed files (wrong magic, truncated
# or cut footers, bad page sizes, value counts that do not add up, dictionary indices out
# of range, bad CRCs, invalid UTF-8, decompression bombs) are refused with an error that
# names the file and what is wrong, a non-zero exit and nothing left at --output.
set -u

ROOT=${TETRA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN=${TETRA_BIN:-$ROOT/build/bin}
TETRA=$BIN/tetra
TOK=$ROOT/tests/assets/tokenizer
PY=${TETRA_PYTHON:-$ROOT/build/venv/bin/python}

if [ ! -x "$TETRA" ]; then echo "FAIL: $TETRA is not built"; exit 1; fi
if ! "$PY" -c 'import pyarrow' 2>/dev/null; then
    echo "SKIP: pyarrow is not installed in $PY (scripts/setup.sh --tests installs tests/requirements.txt)"
    exit 0
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/tetra_parquet_XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
prepare() { "$TETRA" data prepare --tokenizer "$TOK" --quiet "$@"; }

"$PY" "$ROOT/tests/py/parquet_ref.py" valid "$T/v" "$ROOT/tests/assets/moby_dick.txt" >/dev/null || { bad "writing the files"; exit 1; }

# same_shards A B: the two prepared folders hold identical shard files and split counts
same_shards() {
    diff -r "$1/train" "$2/train" >/dev/null || return 1
    if [ -d "$1/val" ] || [ -d "$2/val" ]; then diff -r "$1/val" "$2/val" >/dev/null || return 1; fi
    "$PY" - "$1" "$2" <<'EOF'
import json, sys
a, b = (json.load(open(d + "/index.json")) for d in sys.argv[1:3])
for s in a["splits"]:
    assert (a["splits"][s]["documents"], a["splits"][s]["tokens"]) == (b["splits"][s]["documents"], b["splits"][s]["tokens"]), s
assert a["splits"].keys() == b["splits"].keys()
EOF
}

# compare NAME TWIN [OPTIONS...]: NAME.parquet and TWIN.jsonl give the same shards (the
# matrix of codecs and encodings holds the same rows in every file: one twin, prepared once)
compare() {
    local name=$1 twin=$2
    shift 2
    local opts=("$@")
    if ! prepare --input "$T/v/$name.parquet" --output "$T/o/$name.pq" "${opts[@]}" 2>"$T/err"; then
        bad "$name.parquet: $(cat "$T/err")"
        return
    fi
    # the .jsonl twin always holds its text in "text"
    local jl=() skip=0
    for a in "${opts[@]}"; do
        if [ $skip = 1 ]; then skip=0; continue; fi
        if [ "$a" = "--text-field" ]; then skip=1; continue; fi
        jl+=("$a")
    done
    if [ ! -d "$T/o/$twin.jl" ]; then
        prepare --input "$T/v/$twin.jsonl" --output "$T/o/$twin.jl" "${jl[@]}" 2>"$T/err" ||
            { bad "$twin.jsonl: $(cat "$T/err")"; return; }
    fi
    if same_shards "$T/o/$name.pq" "$T/o/$twin.jl"; then
        ok "$name.parquet = $twin.jsonl ($(ls "$T/o/$name.pq/train" | wc -l) train shards)"
    else
        bad "$name.parquet: shards differ from $twin.jsonl"
    fi
}

mkdir -p "$T/o"
for codec in none snappy gzip zstd; do
    for v in v1 v2; do
        for enc in dict plain; do
            compare "${codec}_${v}_${enc}" none_v1_dict --val-fraction 0.05 --shard-tokens 20000
        done
    done
done
compare dict_fallback dict_fallback --val-fraction 0.05
compare checksums checksums --val-fraction 0.05
compare required required --val-fraction 0.05
compare fineweb fineweb --val-fraction 0.02 --threads 1
compare nested nested --val-fraction 0.05 --text-field content --piece-bytes 4096
compare single single --val-fraction 0.1
# pieces of long documents and threads change nothing
prepare --input "$T/v/zstd_v2_dict.parquet" --output "$T/o/pieces" --val-fraction 0.05 --shard-tokens 20000 \
    --piece-bytes 1000 --threads 3 && same_shards "$T/o/pieces" "$T/o/none_v1_dict.jl" &&
    ok "--piece-bytes 1000 --threads 3: the same shards" || bad "pieces or threads change the shards"
# several files: a folder of Parquet files = the folder of their .jsonl twins
prepare --input "$T/v/multi_pq" --output "$T/o/multi.pq" --val-fraction 0.01 &&
    prepare --input "$T/v/multi_jl" --output "$T/o/multi.jl" --val-fraction 0.01 &&
    same_shards "$T/o/multi.pq" "$T/o/multi.jl" && ok "a folder of 3 Parquet files = their .jsonl twins" ||
    bad "folder of Parquet files"
# the summary counts the nulls and empty strings as documents without text
out=$("$TETRA" data prepare --tokenizer "$TOK" --input "$T/v/snappy_v1_dict.parquet" --output "$T/o/summary" \
      --val-fraction 0)
case "$out" in *"skipped 4 documents with empty (or null) text"*) ok "summary: 4 empty or null documents skipped" ;;
    *) bad "summary: $out" ;; esac

# ---- refused --------------------------------------------------------------------------------
# expect_fail NAME SUBSTRING INPUT [OPTIONS...]: non-zero exit, the input's name and
# SUBSTRING in the error, nothing at the output, no partial folder beside it
n_refused=0
expect_fail() {
    local name=$1 want=$2 input=$3
    shift 3
    local out="$T/r/$name" err rc
    mkdir -p "$T/r"
    err=$("$TETRA" data prepare --tokenizer "$TOK" --input "$input" --output "$out" --quiet "$@" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -eq 0 ]; then bad "$name: exit status 0"; return; fi
    case "$err" in *"$want"*) ;; *) bad "$name: the error does not say '$want': $err"; return ;; esac
    case "$err" in *"$(basename "$input")"*) ;; *) bad "$name: the error does not name the file: $err"; return ;; esac
    if [ -e "$out" ]; then bad "$name: $out was left behind"; return; fi
    if ls -a "$T/r" | grep -q '\.partial-'; then bad "$name: a partial folder was left behind"; return; fi
    n_refused=$((n_refused + 1))
    echo "ok   $name (exit $rc): $err"
}
expect_fail lz4 "row group 0, column 'text': unsupported: compression LZ4" "$T/v/lz4.parquet"
expect_fail delta "row group 0, column 'text': unsupported: value encoding DELTA_BYTE_ARRAY" "$T/v/delta.parquet"
expect_fail int_column "column 'token_count': unsupported: type INT64" "$T/v/fineweb.parquet" --text-field token_count
expect_fail struct_column "column 'meta': unsupported: a nested (group) column" "$T/v/nested.parquet" --text-field meta
expect_fail list_column "column 'tags': unsupported: a nested (group) column" "$T/v/nested.parquet" --text-field tags
expect_fail no_column "no column 'body' (the columns are 'text', 'id', 'dump'" "$T/v/fineweb.parquet" --text-field body
# a bad file after good ones in a folder: the whole run fails, nothing is left
mkdir -p "$T/mixed" && cp "$T/v/multi_pq/"*.parquet "$T/mixed/" && cp "$T/v/lz4.parquet" "$T/mixed/zz.parquet"
expect_fail bad_in_folder "zz.parquet: row group 0, column 'text': unsupported: compression LZ4" "$T/mixed"

# malformed files (tests/py/parquet_ref.py malformed: expect.tsv says what each must say)
"$PY" "$ROOT/tests/py/parquet_ref.py" malformed "$T/m" "$T/v/zstd_v2_dict.parquet" >/dev/null || bad "writing the malformed files"
while IFS=$'\t' read -r file col want; do
    if [ "$want" = OK ]; then # the test writer's well-formed files: as pyarrow read them
        prepare --input "$T/m/$file" --output "$T/o/m_$file" --val-fraction 0 &&
            prepare --input "$T/m/${file%.parquet}.jsonl" --output "$T/o/m_$file.jl" --val-fraction 0 &&
            same_shards "$T/o/m_$file" "$T/o/m_$file.jl" && ok "$file (as pyarrow reads it)" || bad "$file"
    else
        expect_fail "${file%.parquet}" "$want" "$T/m/$file" --text-field "$col" --val-fraction 0
    fi
done <"$T/m/expect.tsv"
echo "refused $n_refused files"

if [ $fail = 0 ]; then echo "test_data_parquet: all passed"; else echo "test_data_parquet: FAILED"; fi
exit $fail
