#!/usr/bin/env bash
# scripts/gpu_check_verify.sh BUNDLE [HIDE] — the check scripts/gpu_check --prepare runs on the
# bundle it made: unpack it into a fresh folder, source its env.sh, and run what the GPU
# machine will run with nothing of this machine's Open MPI to fall back on.
#
# With HIDE=1 (run inside `unshare -m`, as root) the system's copies are hidden first:
# tmpfs over Debian's Open MPI, PMIx, hwloc-plugin and OpenBLAS folders and Open MPI's
# configuration and help texts; an empty file bound over orterun, orted, ssh and every
# library the bundle carries in deps/ but libpcre2-8, which grep needs (and over libgfortran
# and libquadmath, so the carried fallback copies of base libraries are used too). Then:
#   1. ldd of every carried ELF file: nothing "not found", and every library other than
#      glibc's, the CUDA ones and the base ones resolves inside the bundle;
#   2. mpirun on PATH is the bundle's;
#   3. mpirun -np 2 test_comm_mpi (every collective on 2 ranks);
#   4. tetra train on one rank (an MPI singleton) and under mpirun -np 2 (fsdp 2), 2 CPU steps;
#   5. where the bundle carries compat/ (weakened glibc references): 3 again with the compat
#      library preloaded, as env.sh does on a machine whose glibc is older.
# Exit 0 when all pass.
set -uo pipefail
BUNDLE="${1:?usage: gpu_check_verify.sh BUNDLE [HIDE]}"
HIDE="${2:-0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
L=/usr/lib/x86_64-linux-gnu
fail=0
ok() { echo "  ok   $*"; }
bad() { echo "  FAIL $*"; fail=1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

if [ "$HIDE" = 1 ]; then
  mount --make-rprivate / 2>/dev/null
  : >"$TMP/empty"
  hidden=()
  for d in "$L/openmpi" "$L/pmix2" "$L/hwloc" "$L/openblas-pthread" /usr/share/openmpi /etc/openmpi; do
    [ -d "$d" ] && mount -t tmpfs none "$d" && hidden+=("$d/")
  done
  hide_file() { [ -e "$1" ] && mount --bind "$TMP/empty" "$(readlink -f "$1")" && hidden+=("$(readlink -f "$1")"); }
  for f in /usr/bin/orterun /usr/bin/orted /usr/bin/ssh /usr/bin/rsh; do hide_file "$f"; done
  tar -C "$TMP" -xJf "$BUNDLE/bundle.tar.xz" root/deps root/openmpi/lib root/pmix/lib 2>/dev/null
  for f in "$TMP"/root/deps/* "$TMP"/root/openmpi/lib/*.so.* "$TMP"/root/pmix/lib/*.so.*; do
    so="$(basename "$f")"
    # grep itself needs libpcre2-8 (step 1 checks that the carried one is the one used)
    case "$so" in libpcre2-8.so*) continue ;; esac
    hide_file "$L/$so"
  done
  hide_file "$L/libgfortran.so.5"
  hide_file "$L/libquadmath.so.0"
  rm -rf "$TMP/root"
  echo "hidden from the check (${#hidden[@]}): ${hidden[*]}"
fi

export GPU_CHECK_UNPACK="$TMP/unpacked"
unset LD_LIBRARY_PATH
# shellcheck disable=SC1091
source "$BUNDLE/env.sh" || { echo "FAIL: sourcing $BUNDLE/env.sh"; exit 1; }
echo "unpacked into $GPU_ROOT ($(du -sh "$GPU_ROOT" | cut -f1)); carried base libraries in use: $(ls "$GPU_ROOT/base-active" | paste -sd ' ')"

# 1. the libraries of every carried file
n=0
: >"$TMP/ldd.txt"
while IFS= read -r f; do
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  case "$f" in "$GPU_ROOT"/base/*) continue ;; esac
  n=$((n + 1))
  echo "== $f" >>"$TMP/ldd.txt"
  ldd "$f" >>"$TMP/ldd.txt" 2>&1
done < <(find "$GPU_ROOT" -type f)
missing="$(grep -c 'not found' "$TMP/ldd.txt")"
outside="$(awk '/^== / {f = $2; next} /=>/ {print $1, $3, f}' "$TMP/ldd.txt" |
  grep -Ev '^(libc|libm|libpthread|libdl|librt|libutil|libresolv|libanl|libmvec|libcrypt|ld-linux-x86-64|linux-vdso)\.so' |
  grep -Ev '^(libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvrtc|libnvJitLink)\.so' |
  while read -r so path f; do
    [ -e "$GPU_ROOT/base/$so" ] && continue
    case "$path" in "$GPU_ROOT"/*) ;; *) echo "$so => $path (needed by ${f#"$GPU_ROOT"/})" ;; esac
  done | sort -u)"
if [ "$missing" = 0 ] && [ -z "$outside" ]; then
  ok "ldd of $n carried ELF files: nothing missing, every non-system library from the bundle"
else
  bad "ldd: $missing missing, outside the bundle: ${outside:-none}"
  grep -B30 'not found' "$TMP/ldd.txt" | grep -E '^==|not found' | head -20
fi

# 2. the launcher on PATH
m="$(command -v mpirun)"
case "$m" in "$GPU_ROOT"/*) ok "mpirun is the bundle's ($m): $(mpirun --version 2>&1 | head -1)" ;; *) bad "mpirun on PATH is $m" ;; esac

# 3. two ranks of an MPI program
if timeout 120 mpirun -np 2 "$GPU_ROOT/tetra/tests/test_comm_mpi" >"$TMP/mpi.log" 2>&1 &&
   grep -q 'test_comm_mpi: 2 ranks, .* 0 failures' "$TMP/mpi.log"; then
  ok "mpirun -np 2 test_comm_mpi: $(grep 'test_comm_mpi:' "$TMP/mpi.log")"
else
  bad "mpirun -np 2 test_comm_mpi:"; tail -20 "$TMP/mpi.log"
fi

# 4. the trainer, one rank (an MPI singleton) and two
T=(train --job.config_file configs/debug_model.toml --training.seq_len 64 --training.local_batch_size 2
   --training.global_batch_size 4 --training.steps 2 --training.device cpu --training.threads 1
   --metrics.disable_color_printing)
if timeout 120 "$GPU_ROOT/tetra/bin/tetra" "${T[@]}" --job.dump_folder "$TMP/t1" >"$TMP/t1.log" 2>&1; then
  ok "tetra train, 1 rank: $(grep -o 'step: *2 *loss: *[0-9.]*' "$TMP/t1.log" | tr -s ' ')"
else
  bad "tetra train, 1 rank:"; tail -20 "$TMP/t1.log"
fi
if timeout 180 mpirun -np 2 "$GPU_ROOT/tetra/bin/tetra" "${T[@]}" --job.dump_folder "$TMP/t2" >"$TMP/t2.log" 2>&1; then
  ok "mpirun -np 2 tetra train (fsdp 2): $(grep -o 'step: *2 *loss: *[0-9.]*' "$TMP/t2.log" | head -1 | tr -s ' ')"
else
  bad "mpirun -np 2 tetra train:"; tail -20 "$TMP/t2.log"
fi
# 5. the glibc compat library preloaded
if [ -f "$GPU_ROOT/compat/glibc_weakened" ]; then
  if (export GPU_CHECK_FORCE_COMPAT=1 && unset LD_LIBRARY_PATH GPU_CHECK_SYSTEM_LD_LIBRARY_PATH &&
      source "$BUNDLE/env.sh" && [ -n "$GPU_CHECK_COMPAT" ] && echo "LD_PRELOAD=$LD_PRELOAD" &&
      timeout 120 mpirun -np 2 "$GPU_ROOT/tetra/tests/test_comm_mpi") >"$TMP/compat.log" 2>&1 &&
     grep -q 'test_comm_mpi: 2 ranks, .* 0 failures' "$TMP/compat.log"; then
    ok "with compat/libtetra_glibc_compat.so preloaded (as below glibc $(cat "$GPU_ROOT/compat/glibc_weakened")):" \
       "$(grep 'test_comm_mpi:' "$TMP/compat.log")"
  else
    bad "with the compat library preloaded:"; tail -20 "$TMP/compat.log"
  fi
fi
[ $fail = 0 ] && echo "the bundle works on its own" || echo "FAIL: the bundle does not work on its own"
exit $fail
