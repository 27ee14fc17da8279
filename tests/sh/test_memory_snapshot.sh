#!/usr/bin/env bash
# Memory snapshots (profiling.enable_memory_snapshot):
#   1. fsdp 2, 4 steps, profile_freq 2: each rank writes iteration_0, _2 and _4; the
#      categories add up to planned_bytes, which is within 0.1 % of the bytes the backend
#      holds (and those equal the start-up log line's exact count); the sharded categories
#      are half a 1-rank run's.
#   2. Out of memory at start-up (activations of 32 x 2048 tokens under a 3 GB address-space
#      limit): exit 1 and iteration_0_exit/rank0_memory_snapshot.json with the reason, the
#      activations planned and far less allocated.
#   3. tools/plot_memory draws the snapshots of both runs to a PNG of the size asked for;
#      a file that is not a snapshot is refused with its name.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }
command -v gnuplot >/dev/null || { echo "FAIL gnuplot is not installed (apt-get install gnuplot-nox)"; exit 1; }
export OMP_WAIT_POLICY=PASSIVE

COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.seq_len 64 --training.threads 1
        --activation_checkpoint.mode none --validation.enable false --metrics.disable_color_printing
        --training.device cpu --profiling.enable_memory_snapshot)

"$TETRA" "${COMMON[@]}" --training.steps 1 --training.local_batch_size 2 --job.dump_folder "$T/one" >"$T/one.log" 2>&1 ||
  bad "1-rank run exited with $?"
mpirun -np 2 --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --training.steps 4 --training.local_batch_size 1 \
  --profiling.profile_freq 2 --job.dump_folder "$T/fsdp2" >"$T/fsdp2.log" 2>&1 || bad "fsdp 2 run exited with $?"
logged=$(grep -o "backend memory: .* (\([0-9]*\) bytes)" "$T/fsdp2.log" | head -1 | sed 's/.*(\([0-9]*\) bytes)/\1/')
python3 - "$T" "${logged:-0}" <<'P' || fail=1
import json, os, sys
t, logged = sys.argv[1], int(sys.argv[2])
ok = True
def check(cond, msg):
    global ok
    if not cond:
        ok = False
        print("FAIL " + msg)
    return cond
def load(p):
    return json.load(open(p))
one = load(f"{t}/one/memory_snapshot/iteration_0/rank0_memory_snapshot.json")
for step in (0, 2, 4):
    for r in (0, 1):
        p = f"{t}/fsdp2/memory_snapshot/iteration_{step}/rank{r}_memory_snapshot.json"
        if not check(os.path.exists(p), f"missing {p}"):
            continue
        s = load(p)
        cats = {c["name"]: c["bytes"] for c in s["categories"]}
        check(s["format"] == "tetra-memory-snapshot" and s["rank"] == r and s["step"] == step and
              s["reason"] == ("start-up" if step == 0 else "step") and s["backend"] == "cpu", f"{p}: header {s}")
        check(sum(cats.values()) == s["planned_bytes"], f"{p}: categories add up to {sum(cats.values())}, "
              f"planned_bytes {s['planned_bytes']}")
        check(abs(s["allocated_bytes"] - s["planned_bytes"]) <= 1e-3 * s["planned_bytes"],
              f"{p}: allocated {s['allocated_bytes']} vs planned {s['planned_bytes']}")
        if r == 0:
            check(s["allocated_bytes"] == logged, f"{p}: allocated {s['allocated_bytes']}, the log said {logged}")
        check(s["peak_rss_bytes"] > s["allocated_bytes"] and s["host_memory_bytes"] > s["peak_rss_bytes"],
              f"{p}: peak RSS {s['peak_rss_bytes']}")
        one_c = {c["name"]: c["bytes"] for c in one["categories"]}
        for k in ("gradients", "optimizer_state"):
            check(abs(cats[k] - one_c[k] / 2) <= 0.01 * one_c[k], f"{p}: {k} {cats[k]}, 1 rank {one_c[k]}")
s = load(f"{t}/fsdp2/memory_snapshot/iteration_2/rank0_memory_snapshot.json")
if ok:
    print(f"ok   fsdp 2: 6 snapshots; rank 0 at step 2 plans {s['planned_bytes']:,} bytes in "
          f"{sum(1 for c in s['categories'] if c['bytes'])} categories, holds {s['allocated_bytes']:,} in "
          f"{s['allocations']} allocations, peak RSS {s['peak_rss_bytes'] / 2**20:.0f} MiB")
sys.exit(0 if ok else 1)
P

# Out of memory: a 3 GB address-space limit; under AddressSanitizer (which reserves
# terabytes of address space for its shadow) its allocator refuses blocks over 3000 MB
if [ -n "${TETRA_SANITIZED:-}" ]; then
  ASAN_OPTIONS="${ASAN_OPTIONS:-}:allocator_may_return_null=1:max_allocation_size_mb=3000" "$TETRA" "${COMMON[@]}" \
    --training.steps 1 --training.seq_len 2048 --training.local_batch_size 32 --job.dump_folder "$T/oom" \
    >"$T/oom.log" 2>&1
else
  (ulimit -v 3000000; exec "$TETRA" "${COMMON[@]}" --training.steps 1 --training.seq_len 2048 \
    --training.local_batch_size 32 --job.dump_folder "$T/oom") >"$T/oom.log" 2>&1
fi
rc=$?
S="$T/oom/memory_snapshot/iteration_0_exit/rank0_memory_snapshot.json"
r=$(python3 -c "
import json, sys
s = json.load(open(sys.argv[1]))
a = {c['name']: c['bytes'] for c in s['categories']}['activations']
assert s['reason'] == 'start-up failed', s['reason']
assert a > 2**30 and s['allocated_bytes'] < a / 4, (a, s['allocated_bytes'])
print(f'activations {a / 2**30:.2f} GiB planned, {s[\"allocated_bytes\"] / 2**20:.0f} MiB allocated')" "$S" 2>&1)
[ $rc = 1 ] && grep -q "out of memory allocating activations" "$T/oom.log" && [ -f "$S" ] &&
  echo "$r" | grep -q "GiB planned" && ok "out of memory at start-up: exit 1, $r" ||
  bad "OOM snapshot: exit $rc, $(grep -m1 ERROR "$T/oom.log"); $r"

"$ROOT/tools/plot_memory" --size 800x500 "$T/mem.png" "$T/fsdp2/memory_snapshot" "$T/oom/memory_snapshot" \
  >"$T/plot.log" 2>&1 || bad "plot_memory: $(cat "$T/plot.log")"
dims=$(python3 -c "
import struct, sys
d = open(sys.argv[1], 'rb').read(24)
assert d[:8] == b'\x89PNG\r\n\x1a\n'
print('%dx%d' % struct.unpack('>II', d[16:24]))" "$T/mem.png" 2>&1)
[ "$dims" = 800x500 ] && grep -q "wrote .*mem.png (7 snapshots)" "$T/plot.log" &&
  ok "plot_memory: 7 snapshots drawn, $dims PNG" || bad "plot_memory PNG: $dims; $(cat "$T/plot.log")"
echo '{"format": "other"}' >"$T/x.json"
"$ROOT/tools/plot_memory" "$T/y.png" "$T/x.json" >/dev/null 2>"$T/err" && bad "a foreign JSON was plotted"
grep -q "x.json is not a tetra memory snapshot" "$T/err" && ok "a foreign JSON is refused with its name" ||
  bad "foreign JSON: $(cat "$T/err")"

if [ $fail != 0 ]; then echo "FAIL memory snapshot"; exit 1; fi
echo "ok   memory snapshot"
