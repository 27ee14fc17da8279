#!/usr/bin/env bash
# format.sh — every C, CUDA and header file of the tree through clang-format (.clang-format).
#
#   scripts/format.sh            rewrite the files in place
#   scripts/format.sh --list     print the files it formats
#
# sh/test_format checks the same files without changing them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
list() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -co --exclude-standard -- '*.c' '*.h' '*.cu' '*.cuh' '*.cpp'
  else
    find . -path ./build -prune -o -path './build-*' -prune -o \
      \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \) -print | sed 's|^\./||'
  fi
}
case "${1:-}" in
  --list) list ;;
  "") list | xargs -r clang-format -i --style=file ;;
  *) echo "format.sh: unknown option '$1' (--list, or nothing)" >&2; exit 2 ;;
esac
