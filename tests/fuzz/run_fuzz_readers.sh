#!/usr/bin/env bash
# Fuzz the file readers (tests/fuzz/readers_fuzz.c) with libFuzzer + ASan + UBSan.
#
#   tests/fuzz/run_fuzz_readers.sh TARGET [SECONDS]     TARGET: shard | meta | tok | st | parquet (default 60 s)
#
# Builds the reader's sources and the harness directly with clang, seeds the corpus from
# real files (a prepared shard header, a checkpoint's metadata.json, the shipped
# tokenizers, safetensors files of a tiny model, Parquet files written by pyarrow and by
# tests/py/parquet_ref.py, which needs the test venv: scripts/setup.sh --tests) and runs. The safetensors reader needs the
# model code: st links the project's library (build/libtetra_lib.a, not instrumented; only
# the reader, models/llama3/hf.c, and the harness are), so build the project first. Everything goes under $FUZZ_DIR (default /tmp/tetra-fuzz-TARGET).
set -euo pipefail
target=${1:?usage: run_fuzz_readers.sh shard|meta|tok|st|parquet [SECONDS]}
secs=${2:-60}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${FUZZ_DIR:-/tmp/tetra-fuzz-$target}
cc=${CC_FUZZ:-clang}
mkdir -p "$work/corpus" "$work/artifacts"
flags=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -g -O1 -std=c11
       -D_POSIX_C_SOURCE=200809L -I"$root")
case "$target" in
  shard) "$cc" "${flags[@]}" -DFUZZ_SHARD "$root/data/shard.c" "$root/data/crc32c.c" \
           "$root/tests/fuzz/readers_fuzz.c" -o "$work/fuzz" -ljansson -lpthread ;;
  meta)  "$cc" "${flags[@]}" -DFUZZ_META "$root/checkpoint/ckpt_format.c" "$root/data/crc32c.c" "$root/kernels/ops_dtype.c" \
           "$root/tests/fuzz/readers_fuzz.c" -o "$work/fuzz" -ljansson -lm ;;
  tok)   "$cc" "${flags[@]}" -DFUZZ_TOK $(pkg-config --cflags libpcre2-8) "$root"/data/tokenizer.c "$root"/data/bpe.c \
           "$root"/data/pretok.c "$root/tests/fuzz/readers_fuzz.c" -o "$work/fuzz" -ljansson \
           $(pkg-config --libs libpcre2-8) -lpthread -lm ;;
  st)    lib=${TETRA_LIB:-$root/build/libtetra_lib.a}
         [ -f "$lib" ] || { echo "$lib not found: build the project first (or set TETRA_LIB)" >&2; exit 2; }
         "$cc" "${flags[@]}" -fopenmp -DFUZZ_ST "$root/models/llama3/hf.c" "$root/tests/fuzz/readers_fuzz.c" "$lib" \
           -o "$work/fuzz" $(mpicc --showme:link) $(pkg-config --libs jansson libpcre2-8 openblas libpng zlib libzstd snappy) \
           -lpthread -ldl -lm ;;
  parquet) "$cc" "${flags[@]}" -DFUZZ_PARQUET "$root/data/parquet.c" "$root/data/parquet_chunk.c" "$root/data/thrift.c" \
           "$root/tests/fuzz/readers_fuzz.c" -o "$work/fuzz" $(pkg-config --libs snappy zlib libzstd) ;;
  *) echo "unknown target '$target' (shard | meta | tok | st | parquet)" >&2; exit 2 ;;
esac
# seeds
case "$target" in
  shard) for f in "$root"/build/data/sample/*/shard_*.bin; do [ -f "$f" ] && head -c 64 "$f" >"$work/corpus/$(basename "$f")"; done ;;
  meta) [ -n "${FUZZ_SEED_META:-}" ] && cp "$FUZZ_SEED_META" "$work/corpus/metadata.json" ;;
  st) "$work/fuzz" -write_seed "$work/corpus" ;;
  parquet) py=${TETRA_PYTHON:-$root/build/venv/bin/python}
           if [ -z "$(ls -A "$work/corpus")" ]; then
             "$py" "$root/tests/py/parquet_ref.py" seeds "$work/corpus" "$root/tests/assets/moby_dick.txt" ||
               { echo "no seeds: $py cannot write Parquet files (pyarrow; scripts/setup.sh --tests)" >&2; exit 2; }
           fi ;;
  tok) cp "$root/tests/assets/tokenizer/tokenizer.model" "$work/corpus/model" 2>/dev/null || true
       cp "$root/tests/assets/tokenizer/tokenizer.json" "$work/corpus/json" 2>/dev/null || true ;;
esac
echo "fuzzing $target for $secs s in $work"
"$work/fuzz" "$work/corpus" -max_total_time="$secs" -artifact_prefix="$work/artifacts/" -print_final_stats=1 \
  ${FUZZ_FLAGS:-} 2>&1 | tail -20
