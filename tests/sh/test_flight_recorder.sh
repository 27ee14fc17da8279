#!/usr/bin/env bash
# The collective flight recorder (comm.trace_buf_size, comm.save_traces_folder):
#   1. fsdp 4 with a ring of 16 entries; rank 2 is frozen (SIGSTOP) after step 3. The other
#      ranks time out (comm.train_timeout_seconds 4), each writes
#      <dump>/comm_traces/rank_<r>.json, and the error names rank 2 as the one holding the
#      collective up. Each dump is JSON holding the operation waited on, the count of
#      operations issued per group, and the last 16 operations (the ring has wrapped) in
#      order of issue, the one waited on among them and not completed.
#   2. SIGUSR2 to rank 1 of an fsdp 2 run writes its dump and the run goes on to the end.
#   3. A negative comm.trace_buf_size is refused.
set -uo pipefail
ROOT="${TETRA_ROOT:-$(pwd)}"
BIN="${TETRA_BIN:-$ROOT/build/bin}"
TETRA="$BIN/tetra"
T="$(mktemp -d)"
trap 'pkill -KILL -f "dump_folder $T/" 2>/dev/null; rm -rf "$T"' EXIT
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
export OMP_WAIT_POLICY=PASSIVE
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.seq_len 64 --training.threads 1
        --activation_checkpoint.mode none --validation.enable false --metrics.log_freq 1 --metrics.peak_flops 1e11
        --metrics.disable_color_printing --training.device cpu)

pid_of_rank() { # dump folder, rank
  local p r
  for p in $(pgrep -f "dump_folder $1\$"); do
    r=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ "$r" = "$2" ] && { echo "$p"; return; }
  done
}
wait_step() { # dump folder, step: until rank 0 logged it (60 s at most)
  local i
  for i in $(seq 1 300); do
    grep -q "\"step\":$2," "$1/metrics.jsonl" 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}

# 1. a frozen rank
D="$T/hang"
s=$SECONDS
mpirun -np 4 --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --training.steps 500 --training.local_batch_size 1 \
  --comm.train_timeout_seconds 4 --comm.trace_buf_size 16 --job.dump_folder "$D" >"$T/hang.log" 2>&1 &
mp=$!
wait_step "$D" 3 || bad "the 4-rank run did not reach step 3: $(grep -m2 ERROR "$T/hang.log")"
p2=$(pid_of_rank "$D" 2)
[ -n "$p2" ] && kill -STOP "$p2" || bad "rank 2's process not found"
for i in $(seq 1 120); do kill -0 $mp 2>/dev/null || break; sleep 0.25; done
kill -0 $mp 2>/dev/null && { bad "the job did not end 30 s after rank 2 froze"; kill -KILL "$p2" $mp 2>/dev/null; }
wait $mp
rc=$?
[ -n "$p2" ] && kill -KILL "$p2" 2>/dev/null
# the line carries the log's prefix, as every other line of the run; rank 0's, or that of
# another rank of the group whose timeout came first (the job's abort can stop rank 0
# before its own watchdog fires when the machine is loaded)
line=$(grep -m1 -E '^\[tetra\|rank 0\] [0-9-]+ [0-9:]+,[0-9]{3} - ERROR - comm: .* timed out after .* on rank 0' \
  "$T/hang.log" ||
  grep -m1 -E '^\[tetra\|rank ([013])\] [0-9-]+ [0-9:]+,[0-9]{3} - ERROR - comm: .* timed out after .* on rank \1' \
    "$T/hang.log")
line=${line#*- ERROR - }
# rank 2 left no dump, or (when the job's abort woke it before rank 0 stopped looking) dumped
# seconds late from inside the collective, or from an earlier one: each way it is named
[ $rc != 0 ] && echo "$line" | grep -q -E "flight recorder: (.*; )?rank 2 (left no dump|issued it but dumped|issued only #)" &&
  ok "hang: exit $rc in $((SECONDS - s)) s; ${line#comm: }" ||
  bad "hang: exit $rc, no rank said: '${line:-nothing}'; log: $(grep -m3 comm: "$T/hang.log")"
python3 - "$D/comm_traces" <<'P' || fail=1
import json, os, sys
d, ok = sys.argv[1], True
def bad(msg):
    global ok
    ok = False
    print("FAIL " + msg)
names = sorted(os.listdir(d)) if os.path.isdir(d) else []
for r in (0, 1, 3):
    try:
        t = json.load(open(f"{d}/rank_{r}.json"))
    except (OSError, ValueError) as e:
        bad(f"rank {r}: no readable dump ({e}); folder holds {names}")
        continue
    w, e = t["waiting"], t["entries"]
    ids = [x["id"] for x in e]
    checks = [
        (t["format"] == "tetra-comm-trace" and t["rank"] == r and t["world"] == 4 and t["reason"] == "timeout",
         "header"),
        (isinstance(w, dict) and w["group"] in t["issued"] and w["seq"] <= t["issued"][w["group"]] and
         w["waited_s"] >= 4, f"the operation waited on: {w}"),
        (len(e) == 16 and t["buffer"] == 16 and t["recorded"] > 16, f"{len(e)} entries of {t['recorded']}"),
        (ids == list(range(t["recorded"] - 15, t["recorded"] + 1)), f"entry ids {ids}"),
        (all(a["issued"] <= b["issued"] for a, b in zip(e, e[1:])) and
         all(x["completed"] is None or x["completed"] >= x["issued"] for x in e), "issue and completion times"),
        ([x["completed"] for x in e if x["group"] == w["group"] and x["seq"] == w["seq"]] == [None],
         "the operation waited on is recorded, not completed"),
        (sum(x["completed"] is None for x in e) <= 4, "at most a few operations in flight (FSDP prefetch)"),
        (all(x["bytes"] > 0 or x["op"] == "barrier" for x in e), "byte counts"),
    ]
    for good, what in checks:
        if not good:
            bad(f"rank {r}: {what}")
    if all(c[0] for c in checks):
        print(f"ok   rank {r}'s dump: waits in {w['op']} #{w['seq']} on {w['group']} after {w['waited_s']:.1f} s; "
              f"last {len(e)} of {t['recorded']} operations; issued {t['issued']}")
sys.exit(0 if ok else 1)
P

# 2. SIGUSR2: a dump on demand, the run goes on
D="$T/usr2"
mpirun -np 2 --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --training.steps 40 --training.local_batch_size 2 \
  --job.dump_folder "$D" >"$T/usr2.log" 2>&1 &
mp=$!
wait_step "$D" 5 || bad "the 2-rank run did not reach step 5"
p1=$(pid_of_rank "$D" 1)
[ -n "$p1" ] && kill -USR2 "$p1"
wait $mp
rc=$?
steps=$(grep -c '"grad_norm"' "$D/metrics.jsonl" 2>/dev/null)
reason=$(python3 -c "import json,sys; t=json.load(open(sys.argv[1])); print(t['reason'], len(t['entries']))" \
  "$D/comm_traces/rank_1.json" 2>&1)
[ $rc = 0 ] && [ "$steps" = 40 ] && [ "${reason%% *}" = SIGUSR2 ] && [ ! -e "$D/comm_traces/rank_0.json" ] &&
  grep -q "rank 1: flight recorder written to .*rank_1.json (SIGUSR2)" "$T/usr2.log" &&
  ok "SIGUSR2: rank 1 dumped ${reason#* } operations and the run finished its 40 steps" ||
  bad "SIGUSR2: exit $rc, $steps steps, dump: $reason"

# 3. bad values
"$TETRA" "${COMMON[@]}" --training.steps 1 --comm.trace_buf_size -1 --job.dump_folder "$T/neg" >"$T/neg.log" 2>&1 &&
  bad "trace_buf_size -1 accepted"
grep -q "comm.trace_buf_size must be 0 (no flight recorder) to 10000000 operations, got -1" "$T/neg.log" &&
  ok "comm.trace_buf_size -1 refused" || bad "trace_buf_size -1: $(grep -m1 ERROR "$T/neg.log")"

if [ $fail != 0 ]; then echo "FAIL flight recorder"; exit 1; fi
echo "ok   flight recorder"
