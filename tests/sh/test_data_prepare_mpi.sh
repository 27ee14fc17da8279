#!/usr/bin/env bash
# test_data_prepare_mpi.sh — `tetra data prepare` under mpirun: the input files divided
# among the ranks, shards written in parallel, one index.json at the end, and the output
# byte for byte the same as one rank's, whatever the number of ranks: the State of the
# Union folder (233 files, a val split of whole files, shards of 7,777 tokens so that
# shards straddle the ranks' parts) on 2 and 3 ranks, Moby Dick (one document, cut for
# the val split by the one rank that reads it) on 2. A bad file in the second rank's part
# stops every rank: that rank alone says why (naming the file and itself), the exit status
# is non-zero and nothing is left at --output; an existing output is refused once.
set -u

ROOT=${TETRA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN=${TETRA_BIN:-$ROOT/build/bin}
TETRA=$BIN/tetra
TOK=$ROOT/tests/assets/tokenizer

if [ ! -x "$TETRA" ]; then echo "FAIL: $TETRA is not built"; exit 1; fi
command -v mpirun >/dev/null || { echo "FAIL: mpirun not found (install openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

T=$(mktemp -d "${TMPDIR:-/tmp}/tetra_prepare_mpi_XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

tar -xJf "$ROOT/tests/assets/sotu.tar.xz" -C "$T" || { bad "unpacking sotu"; exit 1; }
prep() { # NP OUT ARGS...
    local np=$1 out=$2
    shift 2
    if [ "$np" = 1 ]; then "$TETRA" data prepare --tokenizer "$TOK" --output "$out" --threads 1 "$@"
    else mpirun -np "$np" --bind-to none "$TETRA" data prepare --tokenizer "$TOK" --output "$out" --threads 1 "$@"; fi
}

SOTU=(--input "$T/sotu" --val-fraction 0.02 --shard-tokens 7777)
prep 1 "$T/s1" "${SOTU[@]}" >"$T/s1.log" 2>&1 || bad "1 rank: $(cat "$T/s1.log")"
for np in 2 3; do
    if prep $np "$T/s$np" "${SOTU[@]}" >"$T/s$np.log" 2>&1; then
        if diff -r "$T/s1" "$T/s$np" >/dev/null; then
            ok "sotu on $np ranks: byte for byte the 1-rank output ($(ls "$T/s1/train" | wc -l) train shards, index.json); $(head -1 "$T/s$np.log")"
        else
            bad "sotu on $np ranks differs from 1 rank: $(diff -r "$T/s1" "$T/s$np" | head -3)"
        fi
        [ "$(grep -c '^prepared' "$T/s$np.log")" = 1 ] && ok "one summary from $np ranks" || bad "summaries: $(cat "$T/s$np.log")"
    else
        bad "$np ranks: $(cat "$T/s$np.log")"
    fi
done
MOBY=(--input "$ROOT/tests/assets/moby_dick.txt" --val-fraction 0.1 --shard-tokens 100000)
prep 1 "$T/m1" "${MOBY[@]}" --quiet && prep 2 "$T/m2" "${MOBY[@]}" --quiet && diff -r "$T/m1" "$T/m2" >/dev/null &&
    ok "Moby Dick (one document, its val cut) on 2 ranks: the same output" || bad "Moby Dick on 2 ranks"

# a bad file in the second half of the inputs: rank 1's
mkdir -p "$T/mixed" && cp "$T"/sotu/*.txt "$T/mixed/" && printf 'bad \377 byte\n' >"$T/mixed/2021_zz.txt"
if prep 2 "$T/bad" --input "$T/mixed" >"$T/bad.log" 2>&1; then
    bad "a bad file was accepted"
else
    n=$(grep -c "tetra data prepare: error" "$T/bad.log")
    if [ "$n" = 1 ] && grep -q "error (rank 1 of 2): $T/mixed/2021_zz.txt: invalid UTF-8 at byte offset 4" "$T/bad.log" &&
       [ ! -e "$T/bad" ] && ! ls -a "$T" | grep -q partial; then
        ok "a bad file on rank 1: $(grep "tetra data prepare: error" "$T/bad.log"); nothing left"
    else
        bad "bad file: $n errors, $(grep error "$T/bad.log"); $(ls -a "$T")"
    fi
fi
mkdir "$T/exists"
if prep 3 "$T/exists" --input "$T/sotu" >"$T/ex.log" 2>&1; then bad "an existing output was overwritten"
elif [ "$(grep -c "already exists" "$T/ex.log")" = 1 ]; then ok "an existing output: said once, by rank 0"
else bad "existing output: $(grep error "$T/ex.log")"; fi

if [ $fail = 0 ]; then echo "test_data_prepare_mpi: all passed"; else echo "test_data_prepare_mpi: FAILED"; fi
exit $fail
