#!/usr/bin/env bash
# scripts/gpu_check on a machine without a GPU, in seconds (it never runs --prepare here):
#   1. --help and --list name every section in priority order, the options, and the layout
#      matrix (1 rank, fsdp, hsdp, tp with loss parallel on and off and async, pp with 1F1B,
#      Interleaved1F1B, ZBV and DualPipeV, cp with both rotations, fsdp x tp with float8, the
#      4-D run on 16 ranks); bad options are refused with exit 2;
#   2. without a GPU it exits 0, says that no GPU is visible and what it would run, and writes
#      a summary with every section skipped for that reason (where a GPU is visible this part
#      is left out: the script would measure it);
#   3. the device path with the CPU standing in for the GPU (--fake-device, 1 rank and fsdp 2,
#      3 steps): preflight and layouts pass, the summary table holds them, logs.tar.xz holds
#      the runs; the comparison run again on those curves passes as they are and FAILs with one
#      curve moved by 1e-4 (the fsdp gate is 1e-5), as does a convergence curve moved past its
#      gate;
#   4. scripts/setup.sh --tests reconfigures a build folder made without the CUDA simulator
#      tests (TETRA_CUDA_SIM=ON), saying so, and ctest then lists gpu/test_ops_cuda_sim;
#   5. the glibc compatibility of the bundle (Debian 12's libevent needs glibc 2.36's
#      arc4random): a library that needs a "GLIBC_2.99" version of a libc stand-in that lacks
#      it fails to load; marked weak by gpu_check_tools.py glibc-needs --weaken-above 2.34 it
#      loads, and the symbol comes from a preloaded unversioned definition, as
#      compat/libtetra_glibc_compat.so supplies arc4random on the GPU machine; that library
#      builds and its arc4random_uniform stays in range.
#   6. gpu_check_tools.py profile-factors: the `tetra plan` profile's GEMM, fp8 GEMM,
#      attention and memory factors from a bench/gpu_ops table equal each group's rate over
#      the profile's datasheet rate (the fused-QKV comparison and float8's casts left out); a
#      table without a group exits 1 naming it.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BUILD="${TETRA_BUILD:-$ROOT/build}"
GC="$ROOT/scripts/gpu_check"
TOOLS="$ROOT/scripts/gpu_check_tools.py"
[ -x "$GC" ] || { echo "FAIL $GC is missing"; exit 1; }
[ -x "${TETRA_BIN:-$BUILD/bin}/tetra" ] || { echo "FAIL ${TETRA_BIN:-$BUILD/bin}/tetra is not built"; exit 1; }
export OMP_WAIT_POLICY=PASSIVE
unset OUT

# 1. --help, --list, refusals
"$GC" --help >"$T/help" 2>&1 || bad "--help exited with $?"
for w in preflight ops nccl trainer layouts bench convergence --prepare --quick --sections --layouts --budget \
         --fake-device --perturb --out --bundle; do
  grep -q -- "$w" "$T/help" || bad "--help does not mention $w"
done
"$GC" --list >"$T/list" 2>&1 || bad "--list exited with $?"
order="$(awk '/^sections/ {on = 1; next} on && NF == 0 {exit} on {print $1}' "$T/list" | paste -sd ' ')"
[ "$order" = "preflight ops nccl trainer layouts bench convergence" ] && ok "sections in priority order: $order" ||
  bad "--list sections: '$order'"
for l in single_fp32 single_bf16 fsdp2 hsdp2x2 tp2 tp2_no_loss_parallel tp2_async pp2_1F1B pp2_Interleaved1F1B \
         pp2_ZBVZeroBubble pp2_DualPipeV cp2_allgather cp2_alltoall fsdp2_tp2_f8 4d_pp2_fsdp2_cp2_tp2; do
  grep -q "^  $l " "$T/list" || bad "--list has no layout $l"
done
grep -q "^  4d_pp2_fsdp2_cp2_tp2 *16 " "$T/list" || bad "the 4-D layout does not run on 16 ranks"
nl="$(awk '/^layouts/ {on = 1; next} on && NF == 0 {exit} on && $1 != "name" {n++} END {print n}' "$T/list")"
[ $fail = 0 ] && ok "--help and --list: every section, option and layout ($nl layouts)"
for args in "--sections ops,bogus" "--budget -3" "--perturb fsdp2" "--frobnicate"; do
  # shellcheck disable=SC2086
  "$GC" $args --no-build >"$T/bad" 2>&1
  rc=$?
  [ $rc = 2 ] && ok "refused '$args': $(head -1 "$T/bad")" || bad "'$args' exited with $rc"
done

# 2. no GPU: exit 0, the message, the plan, a summary of skipped sections
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then gpu=1; fi
if [ $gpu = 1 ]; then
  ok "a GPU is visible here: the no-GPU path is not checked (scripts/gpu_check would measure the GPU)"
else
  s=$SECONDS
  "$GC" --no-build --quick --out "$T/nogpu" >"$T/nogpu.log" 2>&1
  rc=$?
  [ $rc = 0 ] || bad "without a GPU scripts/gpu_check exited with $rc: $(tail -3 "$T/nogpu.log")"
  grep -q "no GPU is visible on this machine" "$T/nogpu.log" && ok "says: $(grep -m1 'no GPU is visible' "$T/nogpu.log" | cut -c1-140)" ||
    bad "no 'no GPU is visible' message: $(head -3 "$T/nogpu.log")"
  grep -q "budget 285 s" "$T/nogpu.log" || bad "--quick does not give the 285 s budget"
  grep -q "bash scripts/gpu_check --quick --sections preflight,ops,nccl,trainer,layouts" "$T/nogpu.log" ||
    bad "the command for the GPU machine is not printed"
  n="$(grep -c '| SKIP (no GPU visible) |' "$T/nogpu/summary.md" 2>/dev/null)"
  [ "${n:-0}" = 7 ] && ok "summary.md: 7 sections skipped (no GPU visible), in $((SECONDS - s)) s" ||
    bad "summary.md has ${n:-no} skipped sections: $(cat "$T/nogpu/summary.md" 2>/dev/null | head -5)"
  "$GC" --no-build --sections layouts,ops --out "$T/nogpu2" >"$T/nogpu2.log" 2>&1 || bad "--sections layouts,ops exited with $?"
  plan="$(grep -E '^  (preflight|ops|nccl|trainer|layouts|bench|convergence) ' "$T/nogpu2.log" | awk '{print $1}' | paste -sd ' ')"
  [ "$plan" = "preflight ops layouts" ] && ok "--sections layouts,ops runs: $plan" || bad "--sections layouts,ops plans '$plan'"
fi

# 3. the device path on the CPU: 1 rank and fsdp 2, 3 steps, no CPU references
s=$SECONDS
GPU_CHECK_LAYOUT_STEPS=3 "$GC" --no-build --fake-device --layouts fsdp2 --bundle "$T/no_bundle" --out "$T/fake" \
  >"$T/fake.log" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q '^| preflight | PASS |' "$T/fake.log" && grep -q '^| layouts | PASS |' "$T/fake.log"; then
  ok "--fake-device: preflight and layouts PASS in $((SECONDS - s)) s: $(grep '^| layouts |' "$T/fake.log" | cut -c1-100)"
else
  bad "--fake-device exited with $rc:"; tail -30 "$T/fake.log"
fi
[ "$(tail -1 "$T/fake.log" | cut -c1-9)" = "| layouts" ] || bad "the summary table is not the last thing printed: $(tail -1 "$T/fake.log")"
for f in summary.md gpu_check.log logs.tar.xz results.json; do [ -s "$T/fake/$f" ] || bad "no $f in the results"; done
grep -q '^| fsdp2 | 2 | fp32 | PASS | single_fp32 | 3 |' "$T/fake/summary.md" ||
  bad "summary.md has no passing fsdp2 row: $(grep fsdp2 "$T/fake/summary.md")"
mkdir -p "$T/x" && tar -C "$T/x" -xJf "$T/fake/logs.tar.xz" 2>/dev/null
if [ -f "$T/x/layouts/fsdp2/metrics.jsonl" ]; then
  python3 "$TOOLS" layouts "$T/x/layouts" "$T/no_refs" --steps 3 >"$T/cmp0" 2>&1 && ok "the curves from logs.tar.xz compare as PASS again" ||
    bad "comparing the kept curves again failed: $(cat "$T/cmp0")"
  python3 "$TOOLS" layouts "$T/x/layouts" "$T/no_refs" --steps 3 --perturb fsdp2:1e-4 >"$T/cmp1" 2>&1
  rc=$?
  if [ $rc = 1 ] && grep -q '^| fsdp2 | 2 | fp32 | FAIL | single_fp32 |' "$T/cmp1"; then
    ok "fsdp2 moved by 1e-4 from step 2: FAIL ($(grep '^| fsdp2' "$T/cmp1" | awk -F'|' '{print $8 "vs gate" $10 "," $13}' | tr -s ' '))"
  else
    bad "a perturbed fsdp2 curve was not refused (exit $rc):"; cat "$T/cmp1"
  fi
  python3 "$TOOLS" layouts "$T/x/layouts" "$T/no_refs" --steps 3 --perturb fsdp2:2e-6 >"$T/cmp2" 2>&1 &&
    ok "fsdp2 moved by 2e-6 (inside the 1e-5 gate): PASS" || bad "a curve inside the gate failed: $(grep fsdp2 "$T/cmp2")"
else
  bad "logs.tar.xz holds no layouts/fsdp2/metrics.jsonl"
fi

# the convergence comparison: a GPU fp32 curve against a CPU golden, moved past its gate
mkdir -p "$T/conv/conv_fp32" "$T/conv_ref"
python3 - "$T/conv/conv_fp32/metrics.jsonl" "$T/conv_ref/conv_fp32.jsonl" <<'PY'
import json, math, sys
rows = [{"step": s, "loss": 8.0 * math.exp(-s / 40), "grad_norm": 1.0} for s in range(1, 11)]
rows += [{"step": s, "validation_loss": 7.0 - 0.1 * s} for s in (1, 5, 10)]
for p in sys.argv[1:]:
    with open(p, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
PY
printf 'conv_fp32\t1\tfp32\t-\tconv_fp32:fp32\t0\t3\t\t--a b\n' >"$T/conv/runs.tsv"
echo "--a b" >"$T/conv_ref/conv_fp32.args"
python3 "$TOOLS" convergence "$T/conv" "$T/conv_ref" --steps 10 >"$T/c0" 2>&1 && grep -q '| conv_fp32 | fp32 | PASS |' "$T/c0" ||
  bad "an identical convergence curve did not pass: $(cat "$T/c0")"
python3 "$TOOLS" convergence "$T/conv" "$T/conv_ref" --steps 10 --perturb conv_fp32:3e-4 >"$T/c1" 2>&1
[ $? = 1 ] && grep -q '| conv_fp32 | fp32 | FAIL |' "$T/c1" && ok "a convergence curve moved by 3e-4 (gate 1e-4): FAIL" ||
  bad "a moved convergence curve was not refused: $(cat "$T/c1")"
echo "--a c" >"$T/conv_ref/conv_fp32.args"
python3 "$TOOLS" convergence "$T/conv" "$T/conv_ref" --steps 10 >"$T/c2" 2>&1
[ $? = 1 ] && grep -q 'other arguments' "$T/c2" && ok "a golden made with other arguments is refused" ||
  bad "a golden made with other arguments was used: $(cat "$T/c2")"

# 4. setup.sh --tests and a build folder without the simulator tests
if command -v cmake >/dev/null; then
  B="$T/build_nosim"
  if cmake -S "$ROOT" -B "$B" -DTETRA_CUDA=OFF >"$T/cfg.log" 2>&1; then
    # a stand-in for the reference venv, so that setup.sh installs nothing
    mkdir -p "$B/venv/bin" && ln -s "$(command -v python3)" "$B/venv/bin/python" &&
      cp "$ROOT/tests/requirements.txt" "$B/venv/.tetra-requirements"
    BUILD_DIR="$B" "$ROOT/scripts/setup.sh" --tests --configure-only >"$T/setup.log" 2>&1 || bad "setup.sh --tests --configure-only exited with $?: $(tail -3 "$T/setup.log")"
    grep -q "reconfiguring .* with the CUDA simulator tests (TETRA_CUDA_SIM=ON)" "$T/setup.log" &&
      ok "setup.sh said: $(grep reconfiguring "$T/setup.log" | sed 's/\x1b\[[0-9;]*m//g')" || bad "setup.sh said nothing about the simulator tests: $(cat "$T/setup.log")"
    grep -q '^TETRA_CUDA_SIM:BOOL=ON$' "$B/CMakeCache.txt" && grep -q '^TETRA_CUDA:STRING=OFF$' "$B/CMakeCache.txt" &&
      ok "the cache has TETRA_CUDA_SIM=ON and keeps TETRA_CUDA=OFF" || bad "cache: $(grep -E '^TETRA_CUDA' "$B/CMakeCache.txt")"
    ctest --test-dir "$B" -N >"$T/ctest_n" 2>&1
    grep -q 'gpu/test_ops_cuda_sim$' "$T/ctest_n" &&
      ok "ctest -N lists $(grep -o 'gpu/test_ops_cuda_sim[a-z_]*' "$T/ctest_n" | paste -sd ' ')" ||
      bad "ctest -N lists no simulator test: $(grep -c 'Test *#' "$T/ctest_n") tests"
    BUILD_DIR="$B" "$ROOT/scripts/setup.sh" --tests --configure-only >"$T/setup2.log" 2>&1
    grep -q reconfiguring "$T/setup2.log" && bad "a second setup.sh --tests reconfigured again" || ok "a second setup.sh --tests leaves it as it is"
  else
    bad "cmake could not configure a build folder: $(tail -3 "$T/cfg.log")"
  fi
fi

# 5. a version reference marked weak, and a preloaded definition in place of the missing one
if command -v cc >/dev/null; then
  G="$T/glibc"
  mkdir -p "$G"
  printf 'GLIBC_2.2.5 { global: tetra_old; local: *; };\nGLIBC_2.99 { global: tetra_probe; } GLIBC_2.2.5;\n' >"$G/new.map"
  printf 'GLIBC_2.2.5 { global: tetra_old; local: *; };\n' >"$G/old.map"
  printf 'int tetra_old(void) { return 1; }\nint tetra_probe(void) { return 7; }\n' >"$G/new.c"
  printf 'int tetra_old(void) { return 1; }\n' >"$G/old.c"
  printf 'int tetra_probe(void);\nint user_call(void) { return tetra_probe(); }\n' >"$G/user.c"
  printf 'int user_call(void);\nint main(void) { return user_call() == 42 ? 0 : 3; }\n' >"$G/main.c"
  printf 'int tetra_probe(void) { return 42; }\n' >"$G/shim.c"
  mkdir -p "$G/new" "$G/old"
  if cc -shared -fPIC -o "$G/new/libfakec.so" -Wl,-soname,libfakec.so -Wl,--version-script="$G/new.map" "$G/new.c" &&
     cc -shared -fPIC -o "$G/old/libfakec.so" -Wl,-soname,libfakec.so -Wl,--version-script="$G/old.map" "$G/old.c" &&
     cc -shared -fPIC -o "$G/libuser.so" "$G/user.c" -L"$G/new" -lfakec &&
     cc -o "$G/main" "$G/main.c" -L"$G" -luser -L"$G/new" -lfakec -Wl,--allow-shlib-undefined &&
     cc -shared -fPIC -o "$G/libshim.so" "$G/shim.c"; then
    LD_LIBRARY_PATH="$G:$G/old" "$G/main" >"$G/r0" 2>&1 && bad "a library needing a missing version loaded" ||
      ok "needing GLIBC_2.99 of a libc without it: $(grep -o "version .GLIBC_2.99' not found" "$G/r0")"
    python3 "$TOOLS" glibc-needs "$G/libuser.so" --weaken-above 2.34 >"$G/w" 2>&1
    grep -q "GLIBC_2.99 (now weak) tetra_probe" "$G/w" && ok "glibc-needs: $(cat "$G/w" | sed "s|$G/||")" ||
      bad "glibc-needs did not weaken the reference: $(cat "$G/w")"
    LD_PRELOAD="$G/libshim.so" LD_LIBRARY_PATH="$G:$G/old" "$G/main" >"$G/r1" 2>&1 &&
      ok "weak reference + preloaded unversioned definition: loads and calls it" || bad "with the shim: $(cat "$G/r1")"
    LD_LIBRARY_PATH="$G:$G/new" "$G/main" >"$G/r2" 2>&1
    [ $? = 3 ] && ok "where the version exists, the weakened library still binds the real one" ||
      bad "with the new libc stand-in: $(cat "$G/r2")"
  else
    bad "could not build the stand-in libraries"
  fi
  if cc -O2 -Wall -Werror -shared -fPIC -o "$G/compat.so" "$ROOT/scripts/gpu_check_glibc_compat.c" &&
     printf '#include <stdint.h>\nuint32_t arc4random_uniform(uint32_t);\nint main(void) { for (int i = 0; i < 1000; i++) if (arc4random_uniform(7) >= 7) return 1; return 0; }\n' >"$G/u.c" &&
     cc -o "$G/u" "$G/u.c" "$G/compat.so" -Wl,-rpath,"$G" && "$G/u"; then
    ok "compat/libtetra_glibc_compat.so builds (-Werror); arc4random_uniform(7) < 7 over 1000 draws"
  else
    bad "scripts/gpu_check_glibc_compat.c"
  fi
fi

# 6. the plan profile's factors from bench/gpu_ops's table: each group's FLOPs (or bytes)
# over its time, against the profile's datasheet rates; what is not a block linear (the
# fused-QKV comparison) or not a GEMM of float8 (its casts) is left out
cat >"$T/ops.md" <<'OPS'
| group | op | ms | rate | MB |
|---|---|---|---|---|
| block GEMMs (bf16) | fwd wq [8192 x 4096 x 4096] | 0.400 | 687.2 TFLOP/s | - |
| block GEMMs (bf16) | dgrad w1 | 1.300 | 740.0 TFLOP/s | - |
| block GEMMs (bf16) | fwd fused qkv [8192 x 6144 x 4096] | 0.500 | 100.0 TFLOP/s | - |
| attention (bf16, causal) | forward b1 s8192 h32 kv8 d128 | 1.000 | 550.0 TFLOP/s | - |
| attention (bf16, causal) | backward (workspace 1.0 MiB) | 3.000 | 458.3 TFLOP/s | - |
| elementwise (bf16) | rmsnorm forward [8192 x 4096] | 0.050 | 2684.0 GB/s | 134 |
| float8 tensorwise | amax_bf16 [8192 x 4096] | 0.030 | 2237.0 GB/s | 67 |
| float8 tensorwise | fp8 gemm fwd w1 (K-major, fast accum) | 0.800 | 1202.5 TFLOP/s | - |
OPS
python3 "$TOOLS" profile-factors "$T/ops.md" "$ROOT/configs/hardware/h100-sxm.toml" "a test card" >"$T/pf" 2>&1
if python3 - "$T/pf" <<'EOF'
import re, sys
got = dict(re.findall(r"^(\w+) = ([0-9.]+)", open(sys.argv[1]).read(), re.M))
want = {"gemm_efficiency": (687.2 * 0.4 + 740.0 * 1.3) / 1.7 / 989, "fp8_gemm_efficiency": 1202.5 / 1979,
        "attention_efficiency": (550.0 + 458.3 * 3) / 4 / 989, "memory_efficiency": 134e6 / 0.05e-3 / 3.35e12}
assert set(got) == set(want), got
for k, v in want.items():
    assert abs(float(got[k]) - v) < 1e-3, (k, got[k], v)
EOF
then ok "profile factors from gpu_ops: $(grep -o '^[a-z0-9_]* = [0-9.]*' "$T/pf" | paste -sd ',')"
else bad "profile-factors: $(cat "$T/pf")"; fi
grep -v '^| attention' "$T/ops.md" >"$T/ops2.md"
python3 "$TOOLS" profile-factors "$T/ops2.md" "$ROOT/configs/hardware/h100-sxm.toml" >"$T/pf2" 2>&1 &&
  bad "a table without attention passed" ||
  { grep -q "^# attention_efficiency: no" "$T/pf2" && ok "a table without attention: exit 1, named" ||
    bad "a table without attention: $(cat "$T/pf2")"; }

if [ $fail != 0 ]; then echo "FAIL gpu_check"; exit 1; fi
echo "ok   gpu_check"
