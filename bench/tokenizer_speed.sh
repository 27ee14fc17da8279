#!/usr/bin/env bash
# tokenizer_speed.sh — encode throughput of `tetra data encode` against Python's
# tiktoken (one thread, encode_ordinary), measured in the same run on the sample
# corpus (Moby Dick) and the State of the Union corpus.
#
# usage: bench/tokenizer_speed.sh [TOKENIZER]
#   TOKENIZER  a tiktoken ranks file or a folder with tokenizer.model (and
#              tokenizer_config.json); default ../shared/data/cl100k_base.tiktoken
# env: TETRA_BIN (folder of the tetra executable, default build/bin),
#      TETRA_SHARED (default ../shared), TETRA_PYTHON (python with tiktoken,
#      default build/venv/bin/python), REPS (best of, default 5)
#
# Both sides time the encoding only (tetra's --stats excludes loading the
# tokenizer, reading the input and printing ids); the best of REPS runs counts.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${TETRA_BIN:-$ROOT/build/bin}/tetra
SHARED=${TETRA_SHARED:-$ROOT/../shared}
PY=${TETRA_PYTHON:-$ROOT/build/venv/bin/python}
TOK=${1:-$SHARED/data/cl100k_base.tiktoken}
REPS=${REPS:-5}

[ -x "$BIN" ] || { echo "tokenizer_speed: $BIN not found (build first)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

corpora=()
if [ -f "$ROOT/tests/assets/moby_dick.txt" ]; then
    corpora+=("moby_dick:$ROOT/tests/assets/moby_dick.txt")
fi
if compgen -G "$SHARED/data/sotu/*.txt" >/dev/null; then
    # the addresses in file-name (= date) order, a blank line between them
    first=1
    while IFS= read -r f; do
        [ $first = 1 ] || printf '\n\n'
        cat "$f"
        first=0
    done < <(LC_ALL=C ls "$SHARED"/data/sotu/*.txt) > "$tmp/sotu.txt"
    corpora+=("sotu:$tmp/sotu.txt")
fi
[ ${#corpora[@]} -gt 0 ] || { echo "tokenizer_speed: no corpus found" >&2; exit 1; }

have_tiktoken=0
if [ -x "$PY" ] && "$PY" -c "import tiktoken" 2>/dev/null; then have_tiktoken=1; fi

tiktoken_mbs() { # file -> "MB/s tokens"
    "$PY" - "$TOK" "$1" "$REPS" <<'EOF'
import base64, json, os, sys, time
import tiktoken
tok, path, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
       r"\s*[\r\n]+|\s+(?!\S)|\s+")
model = os.path.join(tok, "tokenizer.model") if os.path.isdir(tok) else tok
ranks = {}
for line in open(model, "rb"):
    if line.strip():
        t, r = line.split()
        ranks[base64.b64decode(t)] = int(r)
enc = tiktoken.Encoding(name="bench", pat_str=pat, mergeable_ranks=ranks, special_tokens={})
text = open(path, encoding="utf-8", newline="").read()
n = len(text.encode())
best = None
for _ in range(reps):
    t0 = time.perf_counter()
    ids = enc.encode_ordinary(text)
    dt = time.perf_counter() - t0
    best = dt if best is None or dt < best else best
print(f"{n / best / 1e6:.1f} {len(ids)}")
EOF
}

echo "tokenizer: $TOK"
echo "encode throughput, best of $REPS, one thread each"
printf '%-10s %10s %9s %8s %11s %14s %8s\n' corpus bytes tokens B/token "tetra MB/s" "tiktoken MB/s" speedup
for c in "${corpora[@]}"; do
    name=${c%%:*}
    file=${c#*:}
    best=0
    line=""
    for _ in $(seq "$REPS"); do
        line=$("$BIN" data encode --tokenizer "$TOK" --input "$file" --output /dev/null --stats 2>&1 >/dev/null)
        mbs=$(sed -n 's/.* \([0-9.]*\) MB\/s$/\1/p' <<<"$line")
        best=$(awk -v a="$best" -v b="$mbs" 'BEGIN { print (b > a) ? b : a }')
    done
    bytes=$(sed -n 's/^encode: \([0-9]*\) bytes.*/\1/p' <<<"$line")
    tokens=$(sed -n 's/.*-> \([0-9]*\) tokens.*/\1/p' <<<"$line")
    bpt=$(awk -v b="$bytes" -v t="$tokens" 'BEGIN { printf "%.3f", b / t }')
    if [ $have_tiktoken = 1 ]; then
        read -r tk_mbs tk_tokens < <(tiktoken_mbs "$file")
        speedup=$(awk -v a="$best" -v b="$tk_mbs" 'BEGIN { printf "%.1fx", a / b }')
        [ "$tk_tokens" = "$tokens" ] || speedup="$speedup (token counts differ: $tk_tokens)"
    else
        tk_mbs="n/a"
        speedup="-"
    fi
    printf '%-10s %10s %9s %8s %11s %14s %8s\n' "$name" "$bytes" "$tokens" "$bpt" "$best" "$tk_mbs" "$speedup"
done
