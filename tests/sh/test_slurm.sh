#!/usr/bin/env bash
# Preemption under a real Slurm: a private one-node cluster (Debian's slurmctld and slurmd
# 22.05, started from a slurm.conf in a temp folder, its own ports, proctrack/linuxproc so
# that, as with proctrack/cgroup, Slurm signals every process of a step, KillWait 10 s) runs
# 2-rank CPU jobs of the tiny model, preempted as Slurm does it:
#   a1. `sbatch` of a script that execs ./run_train.sh (mpirun inside), `scancel`: SIGCONT and
#       SIGTERM to every process of the job (launcher, mpirun, ranks), SIGKILL after KillWait.
#       The save is slowed to 3 s: mpirun, were it to act on its SIGTERM, would kill the ranks
#       after about 2 s. Rank 0 says "saving step N" at once, both ranks stop after step N,
#       step-N is complete, the job's exit code is 0, nothing is left running.
#   a2. the same script again resumes from step-N; `scancel --batch --signal=USR1` (what
#       `#SBATCH --signal=B:USR1@<s>` does at a time limit: the batch shell, the launcher, alone)
#       stops it with a complete checkpoint, exit 0. Without --batch (no B:) nothing reaches
#       the run: Slurm signals the srun steps only, and this job has none.
#   b1. the ranks launched by `srun --mpi=pmix -n 2` in the batch script, `scancel`: each rank
#       gets SIGTERM from Slurm itself; same checks, and srun's exit code is 0.
#   b2. the same resumes; `scancel --signal=USR1` (every task of the steps, as
#       `--signal=USR1@<s>` does) stops it with a complete checkpoint, exit 0.
# Prints the seconds from the scancel to rank 0's "saving step N" and to the job's end.
# Skips (says why) where Slurm's programs are missing.
set -euo pipefail
ROOT="${TETRA_ROOT:-$(pwd)}"
BIN="${TETRA_BIN:-$ROOT/build/bin}"
KILLWAIT=10
# slurmctld and slurmd live in /usr/sbin, which a user's PATH may lack
PATH="$PATH:/usr/sbin:/sbin"

for c in slurmctld slurmd sbatch srun scancel squeue scontrol sinfo; do
  if ! command -v "$c" >/dev/null; then
    echo "SKIP: $c not found (Debian: apt-get install slurmctld slurmd slurm-client; scripts/setup.sh --tests does)"
    exit 0
  fi
done
command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }
command -v python3 >/dev/null || { echo "FAIL python3 not found (it picks free ports)"; exit 1; }
[ -x "$ROOT/build/bin/tetra" ] || { echo "FAIL $ROOT/build/bin/tetra not built (run_train.sh runs it)"; exit 1; }
[ -x "$BIN/tetra" ] || { echo "FAIL $BIN/tetra not built"; exit 1; }

T="$(mktemp -d)"
# Slurm's commands find this cluster by SLURM_CONF alone; the variables of a job this test
# may itself run in would point them at that job
while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep '^SLURM_' || true)
export SLURM_CONF="$T/slurm.conf"
alive() { # PID: running (a daemon that exited may stay a zombie a while)
  local s
  s=$(ps -o stat= -p "$1" 2>/dev/null)
  [ -n "$s" ] && [ "${s#Z}" = "$s" ]
}
# shellcheck disable=SC2317
cleanup() {
  set +e
  if [ -f "$T/slurmctld.pid" ]; then
    # a job left by a failed check: cancelled, and its processes killed with it
    scancel --quiet --full --signal=KILL --partition=test >/dev/null 2>&1
    scancel --quiet --partition=test >/dev/null 2>&1
    for _ in $(seq 1 50); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
    scontrol shutdown >/dev/null 2>&1
  fi
  local f p
  for f in slurmd slurmctld; do
    p=$(cat "$T/$f.pid" 2>/dev/null)
    [ -n "$p" ] || continue
    for _ in $(seq 1 30); do alive "$p" || break; sleep 0.1; done
    alive "$p" && kill -TERM "$p"
    for _ in $(seq 1 20); do alive "$p" || break; sleep 0.1; done
    alive "$p" && kill -KILL "$p"
  done
  pkill -KILL -f -- "--job.dump_folder $T/" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
fail=0
ok() { echo "ok   $* (${SECONDS}s)"; }
bad() { echo "FAIL $*"; fail=1; }

# ---- the cluster --------------------------------------------------------------------------------------
mkdir -p "$T/state" "$T/spool"
read -r CTLD_PORT SLURMD_PORT < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
NODE="$(hostname -s)"
CPUS="$(nproc)"
[ "$CPUS" -ge 2 ] || CPUS=2 # two tasks of one CPU each; config_overrides lets a 1-CPU machine claim 2
cat >"$T/slurm.conf" <<EOF
ClusterName=tetratest
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
# the daemons run as whoever runs the test, and so do the jobs: no root needed
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
# one machine, one user: no munge daemon needed
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
# every descendant of a step's slurmstepd is the step's (setsid does not leave it), as with
# proctrack/cgroup, which needs a cgroup hierarchy of its own
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
KillWait=$KILLWAIT
MpiDefault=none
ReturnToService=2
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
slurm_logs() { tail -n 5 "$T/slurmctld.log" "$T/slurmd.log" 2>/dev/null; }
if ! slurmctld -i -f "$SLURM_CONF" >"$T/slurmctld.out" 2>&1 || ! slurmd -N "$NODE" -f "$SLURM_CONF" >"$T/slurmd.out" 2>&1; then
  echo "FAIL Slurm did not start: $(cat "$T"/*.out) $(slurm_logs)"
  exit 1
fi
state=""
for _ in $(seq 1 200); do
  state=$(sinfo -h -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 0.1
done
if [ "$state" != idle ]; then
  echo "FAIL the Slurm node is '$state', not idle: $(slurm_logs)"
  exit 1
fi
ok "one-node Slurm $(sinfo -V | cut -d' ' -f2) up: ports $CTLD_PORT and $SLURMD_PORT, $CPUS CPUs, KillWait $KILLWAIT s"

# ---- helpers ------------------------------------------------------------------------------------------
cd "$ROOT"
export OMP_WAIT_POLICY=PASSIVE OMPI_MCA_btl_vader_single_copy_mechanism=none
unset OMP_NUM_THREADS TETRA_MAX_RESTARTS
ARGS="--model.flavor tiny --training.seq_len 64 --training.local_batch_size 1 --training.threads 1 \
--metrics.log_freq 1 --metrics.disable_color_printing --training.device cpu --checkpoint.enable \
--checkpoint.interval 100000 --training.steps 3000"
steps_logged() {
  local n
  n=$(grep -c '"grad_norm"' "$1/metrics.jsonl" 2>/dev/null || true)
  echo "${n:-0}"
}
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; } # FROM TO
# the time of the first log line matching PATTERN, seconds since the epoch (tetra logs
# "YYYY-MM-DD HH:MM:SS,mmm" in local time)
logged_at() { # FILE PATTERN
  local ts
  ts=$(grep -m1 -- "$2" "$1" | grep -o '[0-9]\{4\}-[0-9-]* [0-9:]*,[0-9]*' | head -1)
  [ -n "$ts" ] && date -d "${ts/,/.}" +%s.%N
}
submit() { # NAME SCRIPT SBATCH_ARGS...: the job's id in $J, its output in $T/NAME.out
  local name=$1 script=$2
  shift 2
  J=$(sbatch --parsable --job-name "$name" --chdir "$ROOT" -o "$T/$name.out" "$@" "$script") || J=""
  [ -n "$J" ] || bad "$name: sbatch failed"
  [ -n "$J" ]
}
wait_steps() { # NAME RUN_DIR MIN_STEPS: until the run has logged that many steps (30 s)
  for _ in $(seq 1 300); do
    [ "$(steps_logged "$2")" -ge "$3" ] && return 0
    [ -z "$(squeue -h -j "$J" 2>/dev/null)" ] && break # the job ended (failed) first
    sleep 0.1
  done
  bad "$1: the run did not reach step $3: $(grep -m3 -E 'ERROR|rror' "$T/$1.out" 2>/dev/null) $(scontrol show job "$J" | grep -o 'JobState=[A-Z]*')"
  return 1
}
wait_gone() { # LIMIT_S: until job $J has left the queue (every process of it ended); the time in $GONE
  for _ in $(seq 1 $((${1} * 10))); do
    if [ -z "$(squeue -h -j "$J" 2>/dev/null)" ]; then
      GONE=$(now)
      return 0
    fi
    sleep 0.1
  done
  GONE=$(now)
  return 1
}
job_field() { scontrol show job -o "$J" 2>/dev/null | grep -o "$1=[^ ]*" | cut -d= -f2 || true; } # NAME
complete() { # RUN_DIR STEP: the checkpoint of that step is published, no partial one left
  [ -f "$1/checkpoint/step-$2/metadata.json" ] && ! ls -d "$1/checkpoint/"*.tmp-* >/dev/null 2>&1
}
saved_step() { # LOG SIGNAL: N of "stopped by SIGNAL after step N"
  grep -o "stopped by $2 after step [0-9]*" "$1" | grep -o '[0-9]*$' | head -1 || true
}
left_running() { pgrep -f -- "--job.dump_folder $1( |\$)" | tr '\n' ' ' || true; } # RUN_DIR
# Rank 0 said "saving step N" the moment the signal came (before the save's "saved step-N"),
# within 3 s of the scancel (sets $SAID), and the job ended ($ENDED) within KillWait of it.
prompt() { # LOG SIGNAL STEP T_SIGNAL
  local said saved at
  said=$(grep -n "\[tetra|rank 0\].*$2 .*received during step $3: saving step $3" "$1" | head -1 | cut -d: -f1)
  saved=$(grep -n "\[tetra|rank 0\].*checkpoint: saved step-$3:" "$1" | head -1 | cut -d: -f1)
  at=$(logged_at "$1" "\[tetra|rank 0\].*$2 .*received during step $3: saving step") || at=""
  SAID=$([ -n "$at" ] && secs "$4" "$at" || echo "?")
  [ -n "$said" ] && [ -n "$saved" ] && [ "$said" -lt "$saved" ] &&
    awk -v s="$SAID" -v e="$ENDED" -v k="$KILLWAIT" 'BEGIN { exit !(s < 3 && e < k) }'
}

# ---- a. run_train.sh as the batch shell, mpirun inside ------------------------------------------------
A="$T/a_run"
# the documented pattern: the batch shell *is* the launcher (exec), so `--signal=B:...` and the
# job's exit code are the launcher's
write_launcher_job() { # SCRIPT SLOW_MS
  cat >"$1" <<EOF
#!/bin/bash
exec env CONFIG_FILE=./configs/debug_model.toml NGPU=2 LOG_DIR=$T/a_logs TETRA_TEST_CKPT_SLOW_WRITE_MS=$2 \\
  ./run_train.sh $ARGS --job.dump_folder $A
EOF
}
write_launcher_job "$T/a1.sh" 3000
write_launcher_job "$T/a2.sh" 0
if submit a1 "$T/a1.sh" -N1 -n1 -c2 && wait_steps a1 "$A" 2; then
  t0=$(now)
  scancel "$J"
  wait_gone 30 || bad "a1: the job was still running 30 s after scancel"
  SAID="?" ENDED=$(secs "$t0" "$GONE")
  n=$(saved_step "$T/a1.out" SIGTERM)
  st=$(job_field JobState) ec=$(job_field ExitCode) left=$(left_running "$A")
  if [ -n "$n" ] && prompt "$T/a1.out" SIGTERM "$n" "$t0" && complete "$A" "$n" && [ "$ec" = 0:0 ] &&
     grep -q "training stopped at step $n of" "$T/a_logs/rank_1.log" && [ -z "$left" ]; then
    ok "a1 sbatch run_train.sh (mpirun, 2 ranks), scancel: rank 0 'saving step $n' ${SAID} s after it, both ranks stopped after step $n, step-$n complete (3 s save), job ended after ${ENDED} s, $st, exit code $ec"
    A_N=$n
  else
    bad "a1 scancel: job $st exit code '$ec', step '${n}', saving after ${SAID} s, ended after ${ENDED} s, still running '${left}', checkpoints: $(ls "$A/checkpoint" 2>/dev/null | tr '\n' ' ')$(grep -E 'run_train.sh|WARN|ERROR|rror' "$T/a1.out" | tail -4)"
  fi
fi

if [ -n "${A_N:-}" ] && submit a2 "$T/a2.sh" -N1 -n1 -c2 && wait_steps a2 "$A" $((A_N + 2)); then
  # without --batch (`--signal=USR1@<s>` without B:) Slurm signals the job's srun steps only,
  # and this job has none: nothing reaches the run, as docs/getting_started.md says
  scancel --signal=USR1 "$J"
  sleep 1.5
  if grep -q "received during step" "$T/a2.out" || [ -z "$(squeue -h -j "$J" 2>/dev/null)" ]; then
    bad "a2: scancel --signal=USR1 without --batch reached the run: $(grep -m1 'received during' "$T/a2.out")"
  else
    ok "a2 scancel --signal=USR1 without --batch: nothing reaches a job without srun steps"
  fi
  t0=$(now)
  scancel --batch --signal=USR1 "$J"
  wait_gone 30 || bad "a2: the job was still running 30 s after scancel --batch --signal=USR1"
  SAID="?" ENDED=$(secs "$t0" "$GONE")
  n=$(saved_step "$T/a2.out" SIGUSR1)
  st=$(job_field JobState) ec=$(job_field ExitCode)
  if grep -q "checkpoint: loaded $A/checkpoint/step-$A_N" "$T/a2.out" && [ -n "$n" ] && [ "$n" -gt "$A_N" ] &&
     prompt "$T/a2.out" SIGUSR1 "$n" "$t0" && complete "$A" "$n" && [ "$st" = COMPLETED ] && [ "$ec" = 0:0 ]; then
    ok "a2 the same job resumed from step-$A_N; scancel --batch --signal=USR1 (the launcher alone): 'saving step $n' after ${SAID} s, step-$n complete, ended after ${ENDED} s, $st, exit code $ec"
  else
    bad "a2 resume + B:USR1: job $st exit code '$ec', step '${n}': $(grep -E 'loaded|run_train.sh|WARN|ERROR|rror' "$T/a2.out" | tail -4)"
  fi
fi

# ---- b. ranks launched by srun ---------------------------------------------------------------------
B="$T/b_run"
# the batch shell waits for srun (a trap, not the default death, on Slurm's SIGTERM to it) and
# records srun's exit code
write_srun_job() { # SCRIPT SLOW_MS
  cat >"$1" <<EOF
#!/bin/bash
trap 'echo "batch shell: SIGTERM" >&2' TERM
TETRA_TEST_CKPT_SLOW_WRITE_MS=$2 srun --mpi=pmix -n 2 $BIN/tetra train --job.config_file ./configs/debug_model.toml \\
  $ARGS --job.dump_folder $B
rc=\$?
echo \$rc >$1.rc
exit \$rc
EOF
}
write_srun_job "$T/b1.sh" 3000
write_srun_job "$T/b2.sh" 0
if submit b1 "$T/b1.sh" -N1 -n2 && wait_steps b1 "$B" 2; then
  t0=$(now)
  scancel "$J"
  wait_gone 30 || bad "b1: the job was still running 30 s after scancel"
  SAID="?" ENDED=$(secs "$t0" "$GONE")
  n=$(saved_step "$T/b1.out" SIGTERM)
  st=$(job_field JobState) ec=$(job_field ExitCode) left=$(left_running "$B")
  src=$(cat "$T/b1.sh.rc" 2>/dev/null || echo none)
  if [ -n "$n" ] && prompt "$T/b1.out" SIGTERM "$n" "$t0" && complete "$B" "$n" && [ "$src" = 0 ] && [ "$ec" = 0:0 ] &&
     [ "$(grep -c "training stopped at step $n of" "$T/b1.out")" = 2 ] && [ -z "$left" ]; then
    ok "b1 srun --mpi=pmix -n 2, scancel: rank 0 'saving step $n' ${SAID} s after it, both ranks stopped after step $n, step-$n complete (3 s save), job ended after ${ENDED} s, srun exit code $src, $st, exit code $ec"
    B_N=$n
  else
    bad "b1 scancel: srun exit code '$src', job $st exit code '$ec', step '${n}', saving after ${SAID} s, ended after ${ENDED} s, still running '${left}': $(grep -E 'srun|WARN|ERROR|rror' "$T/b1.out" | tail -4)"
  fi
fi

if [ -n "${B_N:-}" ] && submit b2 "$T/b2.sh" -N1 -n2 && wait_steps b2 "$B" $((B_N + 2)); then
  t0=$(now)
  scancel --signal=USR1 "$J"
  wait_gone 30 || bad "b2: the job was still running 30 s after scancel --signal=USR1"
  SAID="?" ENDED=$(secs "$t0" "$GONE")
  n=$(saved_step "$T/b2.out" SIGUSR1)
  st=$(job_field JobState) ec=$(job_field ExitCode)
  src=$(cat "$T/b2.sh.rc" 2>/dev/null || echo none)
  if grep -q "checkpoint: loaded $B/checkpoint/step-$B_N" "$T/b2.out" && [ -n "$n" ] && [ "$n" -gt "$B_N" ] &&
     prompt "$T/b2.out" SIGUSR1 "$n" "$t0" && complete "$B" "$n" && [ "$src" = 0 ] && [ "$st" = COMPLETED ] && [ "$ec" = 0:0 ]; then
    ok "b2 the same job resumed from step-$B_N; scancel --signal=USR1 (every task): 'saving step $n' after ${SAID} s, step-$n complete, ended after ${ENDED} s, srun exit code $src, $st, exit code $ec"
  else
    bad "b2 resume + USR1: srun exit code '$src', job $st exit code '$ec', step '${n}': $(grep -E 'loaded|srun|WARN|ERROR|rror' "$T/b2.out" | tail -4)"
  fi
fi

if [ $fail != 0 ]; then echo "FAIL slurm"; exit 1; fi
echo "ok   slurm"
