#!/usr/bin/env bash
# Every C, CUDA and header file of the tree follows .clang-format (clang-format 14, as
# Debian 12 ships it; scripts/setup.sh --tests installs it). A file that does not is named
# with the first lines clang-format would change; `scripts/format.sh` rewrites them.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
command -v clang-format >/dev/null || { echo "FAIL clang-format not found (apt-get install clang-format)"; exit 1; }
cd "$ROOT"
mapfile -t files < <(scripts/format.sh --list)
[ "${#files[@]}" -gt 100 ] && ok "${#files[@]} files to check" || bad "only ${#files[@]} C/CUDA files found"
n_bad=0
for f in "${files[@]}"; do
  if ! clang-format --style=file --dry-run --Werror "$f" >"$T/out" 2>&1; then
    n_bad=$((n_bad + 1))
    [ "$n_bad" -le 5 ] && bad "$f is not formatted: $(grep -m2 -A1 'warning' "$T/out" | tr -s ' ' | head -c 300)"
  fi
done
[ "$n_bad" = 0 ] && ok "every file follows .clang-format ($(clang-format --version | grep -o 'version [0-9.]*'))" ||
  bad "$n_bad files are not formatted: scripts/format.sh rewrites them"
finish
