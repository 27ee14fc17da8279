#!/usr/bin/env bash
# Restart on failure: TETRA_MAX_RESTARTS=2 NGPU=2 ./run_train.sh (fsdp 2, a checkpoint every
# 3 steps). One rank is killed with SIGKILL mid-run: the launcher logs the failure and its
# cause, relaunches every rank, the run resumes from the newest complete checkpoint and
# finishes (exit 0); every step's loss (the last record of each) equals an uninterrupted
# run's bit for bit. Prints the seconds from the kill to the next logged step.
# Without restarts left the launcher exits with the run's code.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }
cd "$ROOT"

STEPS=24
ARGS=(--parallelism.data_parallel_shard_degree 2 --training.steps $STEPS --training.seq_len 64
      --training.local_batch_size 1 --metrics.log_freq 1 --metrics.disable_color_printing --training.threads 1
      --checkpoint.enable --checkpoint.interval 3 --training.device cpu)
export CONFIG_FILE=./configs/debug_model.toml LOG_DIR="$T/logs"
steps_logged() {
  local n
  n=$(grep -c '"grad_norm"' "$1/metrics.jsonl" 2>/dev/null)
  echo "${n:-0}"
}

NGPU=2 ./run_train.sh "${ARGS[@]}" --job.dump_folder "$T/full" >"$T/full.log" 2>&1 || bad "uninterrupted run failed"

TETRA_MAX_RESTARTS=2 NGPU=2 ./run_train.sh "${ARGS[@]}" --job.dump_folder "$T/rs" >"$T/rs.log" 2>&1 &
launcher=$!
for _ in $(seq 1 1200); do [ "$(steps_logged "$T/rs")" -ge 7 ] && break; sleep 0.05; done
victim=""
for p in $(pgrep -x tetra); do
  if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "--job.dump_folder $T/rs"; then victim=$p; fi
done
before=$(steps_logged "$T/rs")
t_kill=$(date +%s.%N)
if [ -n "$victim" ]; then kill -KILL "$victim"; else bad "no rank process to kill"; fi
# the first step logged after the restart
t_next=""
for _ in $(seq 1 2400); do
  if grep -q "restart 1 of 2" "$T/rs.log" && [ "$(steps_logged "$T/rs")" -gt "$before" ]; then
    t_next=$(date +%s.%N)
    break
  fi
  sleep 0.05
done
wait $launcher
rc=$?
if [ $rc = 0 ] && grep -q "the run failed (exit code .*); restart 1 of 2 from the newest complete checkpoint" "$T/rs.log" &&
   grep -q "checkpoint: loaded" "$T/rs.log"; then
  gap=$(python3 -c "print(f'{$t_next - $t_kill:.1f}')" 2>/dev/null)
  ok "SIGKILL of one rank after step $before: restarted, resumed from a checkpoint, finished (exit 0); ${gap:-?} s from the kill to the next logged step"
else
  bad "restart: exit $rc: $(grep -m2 -E 'run_train.sh|ERROR' "$T/rs.log")"
fi
python3 - "$T/full" "$T/rs" <<'P' && ok "after the restart every one of the $STEPS losses equals the uninterrupted run's" || bad "losses differ after the restart"
import json, sys
def losses(d):
    out = {}
    for l in open(d + "/metrics.jsonl"):
        if '"grad_norm"' in l:
            r = json.loads(l)
            out[r["step"]] = r["loss"]
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
sys.exit(0 if len(a) == 24 and a == b else 1)
P

# no restarts left: the run's exit code
TETRA_MAX_RESTARTS=1 NGPU=1 ./run_train.sh --training.steps 1 --optimizer.lr nan --job.dump_folder "$T/bad" \
  >"$T/bad.log" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "restart 1 of 1" "$T/bad.log" && grep -q "all 1 restarts are used" "$T/bad.log" &&
  ok "a run that keeps failing: one restart, then the launcher exits 1" || bad "no restarts left: exit $rc"

if [ $fail != 0 ]; then echo "FAIL restart"; exit 1; fi
echo "ok   restart"
