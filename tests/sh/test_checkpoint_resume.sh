#!/usr/bin/env bash
# Checkpoint resume, resharding and corruption, end to end on CPU ranks (mpirun).
# The debug model, seq_len 64, global batch 4, 20 steps, seed 42.
#
# (a) kill -9 and resume: a 2-rank FSDP run saves step 10; once step-10 is
#     complete every rank (and mpirun) is killed at a random moment during the
#     next step; the resumed run must log losses 11-20 bit-identical (the JSON
#     strings) to an uninterrupted run. The same with async_mode = "async", and
#     with a kill DURING the step-10 save (the test hook
#     TETRA_TEST_CKPT_SLOW_WRITE_MS makes each writer pause halfway through its
#     file): the half-written step-10.tmp-* folder is ignored and removed, the
#     run resumes from step 5, and losses 6-20 are again bit-identical. An
#     async write error (a file-size limit) stops the run at a later step with
#     the file named and publishes nothing. A seed
#     checkpoint (create_seed_checkpoint, 1 rank) loaded under fsdp 2 gives the
#     fresh run's losses exactly.
# (b) resharding: step 10 saved under fsdp 4 resumes under 1 rank and hsdp 2x2
#     (and fsdp 2 -> 1 rank): losses 11-20 match the saving layout's within 1e-5.
# (c) corruption of the newest checkpoint (a truncated shard, a flipped byte, a
#     missing metadata.json, bytes appended to a shard, a step-20 folder renamed
#     step-25, a negative lr_scheduler.count in a metadata.json without its
#     checksum): the resume refuses, naming the file (and the tensor or the
#     field), deletes nothing, `tetra checkpoint inspect` fails the same way,
#     and resuming with load_step = 10 and keep_latest_k = 2 works and keeps the
#     last good checkpoint.
set -uo pipefail
ROOT="${TETRA_ROOT:-$(pwd)}"
BIN="${TETRA_BIN:-$ROOT/build/bin}"
TETRA="$BIN/tetra"
T="$(mktemp -d)"
PIDS_TO_REAP=()
cleanup() {
  for p in "${PIDS_TO_REAP[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT

command -v mpirun >/dev/null || { echo "FAIL mpirun not found (install openmpi-bin)"; exit 1; }
[ -x "$TETRA" ] || { echo "FAIL $TETRA not built"; exit 1; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
export OMP_WAIT_POLICY=PASSIVE
unset OMP_NUM_THREADS TETRA_TEST_CKPT_SLOW_WRITE_MS

COMMON=(train --job.config_file "$ROOT/configs/debug_model.toml" --training.seq_len 64
        --training.global_batch_size 4 --training.steps 20 --training.seed 42
        --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 --metrics.disable_color_printing
        --metrics.peak_flops 1e11 --comm.init_timeout_seconds 120 --comm.train_timeout_seconds 120
        --checkpoint.enable --checkpoint.interval 10 --checkpoint.keep_latest_k 0)
FSDP2=(--training.local_batch_size 2)
FSDP4=(--training.local_batch_size 1)
HSDP22=(--training.local_batch_size 1 --parallelism.data_parallel_replicate_degree 2
        --parallelism.data_parallel_shard_degree 2)
SINGLE=(--training.local_batch_size 4)

fail=0
t0=$SECONDS
bad() { echo "FAIL $*"; fail=1; }

# run NAME NP DUMP ARGS... : foreground run, log in $T/NAME.log, returns the exit code
run() {
  local name=$1 np=$2 dump=$3
  shift 3
  if [ "$np" = 1 ]; then
    "$TETRA" "${COMMON[@]}" --job.dump_folder "$dump" "$@" >"$T/$name.log" 2>&1
  else
    mpirun -np "$np" --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --job.dump_folder "$dump" "$@" \
      >"$T/$name.log" 2>&1
  fi
}

# kill_when NAME NP DUMP WAIT_GLOB DELAY_S ARGS... : start a run, wait until WAIT_GLOB exists
# under DUMP, sleep DELAY_S, then kill -9 every rank and mpirun at once
kill_when() {
  local name=$1 np=$2 dump=$3 glob=$4 delay=$5
  shift 5
  mpirun -np "$np" --oversubscribe --bind-to none "$TETRA" "${COMMON[@]}" --job.dump_folder "$dump" "$@" \
    >"$T/$name.log" 2>&1 &
  local mp=$!
  PIDS_TO_REAP+=("$mp")
  local waited=0
  until compgen -G "$dump/$glob" >/dev/null; do
    if ! kill -0 "$mp" 2>/dev/null; then echo "  $name ended before $glob appeared"; return 1; fi
    sleep 0.01
    waited=$((waited + 1))
    [ $waited -gt 12000 ] && { echo "  $name: $glob never appeared"; return 1; }
  done
  sleep "$delay"
  local ranks
  ranks=$(pgrep -P "$mp" | tr '\n' ' ')
  kill -9 $ranks "$mp" 2>/dev/null
  wait "$mp" 2>/dev/null
  echo "  $name: killed ranks [$ranks] and mpirun $mp ${delay} s after $glob appeared"
  return 0
}

# losses DUMP: "step loss" lines, the loss as the exact JSON text
losses() {
  grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl" 2>/dev/null | sed 's/"step":\([0-9]*\),"loss":/\1 /'
}

# same_bits NAME REF DUMP FROM TO : JSON loss strings of steps FROM..TO identical
same_bits() {
  local name=$1 ref=$2 dump=$3 from=$4 to=$5
  local a b
  a=$(losses "$ref" | awk -v f="$from" -v t="$to" '$1 >= f && $1 <= t')
  b=$(losses "$dump" | awk -v f="$from" -v t="$to" '$1 >= f && $1 <= t')
  local n
  n=$(printf '%s\n' "$b" | grep -c .)
  if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$n" = $((to - from + 1)) ]; then
    echo "ok   $name: losses $from-$to bit-identical ($(printf '%s\n' "$b" | tail -1 | cut -d' ' -f2) at step $to)"
  else
    bad "$name: losses $from-$to differ from the uninterrupted run"
    diff <(printf '%s\n' "$a") <(printf '%s\n' "$b") | head -10
  fi
}

# close NAME REF DUMP FROM TO : relative difference <= 1e-5 at every step FROM..TO
close() {
  python3 - "$@" <<'P' || fail=1
import json, sys
name, ref, dump, lo, hi = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
def load(d):
    out = {}
    for l in open(f"{d}/metrics.jsonl"):
        r = json.loads(l)
        if "loss" in r:
            out[r["step"]] = r["loss"]
    return out
a, b = load(ref), load(dump)
steps = range(lo, hi + 1)
missing = [s for s in steps if s not in a or s not in b]
if missing:
    print(f"FAIL {name}: steps {missing} missing"); sys.exit(1)
rel = max(abs(a[s] - b[s]) / abs(a[s]) for s in steps)
ok = rel <= 1e-5
print(f"{'ok  ' if ok else 'FAIL'} {name}: losses {lo}-{hi} max rel diff {rel:.2e} (<= 1e-5)")
sys.exit(0 if ok else 1)
P
}

step_time() { # median step_time_s of a finished run
  python3 -c "
import json,sys
t=sorted(json.loads(l)['step_time_s'] for l in open('$1/metrics.jsonl') if '\"loss\"' in l)
print(t[len(t)//2])"
}

rand_frac() { python3 -c "import random; print(round(random.uniform(0.05, 0.95) * $1, 3))"; }

# ---------------------------------------------------------------- (a)
echo "== (a) kill -9 and resume"
REF="$T/ref"
run ref 2 "$REF" "${FSDP2[@]}" || bad "reference run exited with $?"
ST=$(step_time "$REF")
echo "  reference: 20 steps under fsdp 2, median step ${ST} s"

for mode in disabled async; do
  D="$T/kill_$mode"
  kill_when "kill_$mode" 2 "$D" "checkpoint/step-10/metadata.json" "$(rand_frac "$ST")" "${FSDP2[@]}" \
    --checkpoint.async_mode "$mode" || bad "kill_$mode: could not kill at the intended moment"
  [ -e "$D/checkpoint/step-20" ] && bad "kill_$mode: the run finished before the kill (nothing tested)"
  n=$(losses "$D" | grep -c .)
  echo "  kill_$mode: the killed run had logged $n steps"
  run "resume_$mode" 2 "$D" "${FSDP2[@]}" --checkpoint.async_mode "$mode" || bad "resume_$mode exited with $?"
  grep -q "loaded $D/checkpoint/step-10 " "$T/resume_$mode.log" || bad "resume_$mode did not load step-10"
  same_bits "kill -9 after the step-10 save, resume ($mode)" "$REF" "$D" 11 20
done

D="$T/kill_mid_save"
TETRA_TEST_CKPT_SLOW_WRITE_MS=4000 kill_when kill_mid_save 2 "$D" "checkpoint/step-10.tmp-*/rank_00001.bin" 0.5 \
  "${FSDP2[@]}" --checkpoint.interval 5 || bad "kill_mid_save: could not kill during the save"
[ -e "$D/checkpoint/step-10" ] && bad "kill_mid_save: step-10 was completed before the kill"
ls -d "$D"/checkpoint/step-10.tmp-* >/dev/null 2>&1 || bad "kill_mid_save: no half-written step-10.tmp-* folder"
run resume_mid_save 2 "$D" "${FSDP2[@]}" --checkpoint.interval 5 || bad "resume_mid_save exited with $?"
grep -q "loaded $D/checkpoint/step-5 " "$T/resume_mid_save.log" || bad "resume_mid_save did not load step-5"
grep -q "removed 1 incomplete save folder" "$T/resume_mid_save.log" || bad "the stale step-10.tmp-* was not removed"
same_bits "kill -9 during the step-10 save, resume from step 5" "$REF" "$D" 6 20

# an async write error surfaces at a following step boundary, naming the file: the shard file
# is cut at 40 MB (ulimit -f; SIGXFSZ ignored, so write() fails with EFBIG)
D="$T/write_error"
(trap '' XFSZ; ulimit -f 40000; exec "$TETRA" "${COMMON[@]}" "${SINGLE[@]}" --job.dump_folder "$D" \
  --training.steps 8 --checkpoint.interval 4 --checkpoint.async_mode async) >"$T/write_error.log" 2>&1 &&
  bad "async write error: the run did not fail"
msg=$(grep -m1 "ERROR" "$T/write_error.log" | sed 's/.* - ERROR - //')
echo "  async write error: $msg"
case "$msg" in
  *"checkpoint step 4: cannot write '$D/checkpoint/step-4.tmp-"*"/rank_00000.bin': File too large"*)
    echo "ok   an async write error stops the run at a later step, naming the file" ;;
  *) bad "async write error: unexpected message" ;;
esac
[ -e "$D/checkpoint/step-4" ] && bad "async write error: a step-4 checkpoint was published"

D="$T/seed"
"$TETRA" "${COMMON[@]}" "${SINGLE[@]}" --job.dump_folder "$D" --checkpoint.create_seed_checkpoint \
  >"$T/seed_create.log" 2>&1 || bad "create_seed_checkpoint exited with $?"
[ -f "$D/checkpoint/step-0/metadata.json" ] || bad "no seed checkpoint step-0"
run seed_fsdp2 2 "$D" "${FSDP2[@]}" || bad "training from the seed checkpoint exited with $?"
same_bits "seed checkpoint (1 rank) loaded under fsdp 2" "$REF" "$D" 1 20

# ---------------------------------------------------------------- (b)
echo "== (b) resharding"
SRC="$T/src_fsdp4"
run src_fsdp4 4 "$SRC" "${FSDP4[@]}" || bad "fsdp 4 run exited with $?"
reshard() { # name np src_dump ref_dump layout...
  local name=$1 np=$2 src=$3 ref=$4
  shift 4
  local D="$T/$name"
  mkdir -p "$D/checkpoint" && cp -r "$src/checkpoint/step-10" "$D/checkpoint/"
  run "$name" "$np" "$D" "$@" || bad "$name exited with $?"
  close "$name" "$ref" "$D" 11 20
}
reshard "fsdp4 -> 1 rank" 1 "$SRC" "$SRC" "${SINGLE[@]}"
reshard "fsdp4 -> hsdp 2x2" 4 "$SRC" "$SRC" "${HSDP22[@]}"
reshard "fsdp2 -> 1 rank" 1 "$REF" "$REF" "${SINGLE[@]}"

# ---------------------------------------------------------------- (c)
echo "== (c) corruption"
corrupt() { # mode dump
  local f="$2/checkpoint/step-20"
  case $1 in
    truncated) truncate -s 10000000 "$f/rank_00001.bin" ;;
    flipped) python3 -c "
f = open('$f/rank_00002.bin', 'r+b'); f.seek(12345678); b = f.read(1)
f.seek(12345678); f.write(bytes([b[0] ^ 0x40]))" ;;
    no_metadata) rm "$f/metadata.json" ;;
    appended) printf 'tail' >>"$f/rank_00001.bin" ;;
    renamed) mv "$f" "$2/checkpoint/step-25" ;;
    negative_count) python3 -c "
import json; p = '$f/metadata.json'; m = json.load(open(p))
m['lr_scheduler']['count'] = -5; del m['metadata_crc32c']; json.dump(m, open(p, 'w'))" ;;
  esac
}
for mode in truncated flipped no_metadata appended renamed negative_count; do
  D="$T/corrupt_$mode"
  mkdir -p "$D" && cp -r "$SRC/checkpoint" "$D/"
  corrupt "$mode" "$D"
  run "corrupt_$mode" 2 "$D" "${FSDP2[@]}" --training.steps 30 && bad "$mode: the resume did not refuse"
  case $mode in
    truncated) want="rank_00001.bin is truncated" ;;
    flipped) want="checksum mismatch in $D/checkpoint/step-20/rank_00002.bin, tensor '" ;;
    no_metadata) want="$D/checkpoint/step-20/metadata.json is missing" ;;
    appended) want="shard file $D/checkpoint/step-20/rank_00001.bin has" ;;
    renamed) want="step-25/metadata.json records \"step\": 20 but its folder is named step-25" ;;
    negative_count) want="step-20/metadata.json: lr_scheduler.count is -5" ;;
  esac
  # the error line that names the file (mpirun's own abort banner may come first)
  msg=$(grep "ERROR" "$T/corrupt_$mode.log" | grep -m1 -F -- "$want" | sed 's/.* - ERROR - //')
  [ -n "$msg" ] || msg=$(grep -m1 "ERROR" "$T/corrupt_$mode.log" | sed 's/.* - ERROR - //')
  echo "  $mode: $msg"
  case "$msg" in *"$want"*) ;; *) bad "$mode: the error does not name the file: $msg" ;; esac
  case $mode in truncated|flipped)
    case "$msg" in *"tensor '"*) ;; *) bad "$mode: the error does not name the tensor" ;; esac
  esac
  newest=step-20; [ "$mode" = renamed ] && newest=step-25
  [ -f "$D/checkpoint/step-10/metadata.json" ] && [ -d "$D/checkpoint/$newest" ] ||
    bad "$mode: a checkpoint was deleted"
  "$TETRA" checkpoint inspect "$D/checkpoint" >"$T/inspect_$mode.log" 2>&1 &&
    bad "$mode: inspect passed a damaged checkpoint"
  grep -F "FAIL" "$T/inspect_$mode.log" | grep -qF -- "$want" || bad "$mode: inspect did not report it"
  echo "ok   $mode: refused, named, nothing deleted; inspect exit 1"
done
D="$T/corrupt_flipped"
run corrupt_recover 2 "$D" "${FSDP2[@]}" --checkpoint.load_step 10 --checkpoint.keep_latest_k 2 ||
  bad "resume from load_step 10 exited with $?"
close "load_step 10 past a corrupt step-20" "$SRC" "$D" 11 20
[ -f "$D/checkpoint/step-10/metadata.json" ] || bad "keep_latest_k 2 deleted the last good checkpoint step-10"
"$TETRA" checkpoint inspect "$D/checkpoint" >"$T/inspect_recovered.log" 2>&1 ||
  bad "inspect of the recovered folder: $(grep FAIL "$T/inspect_recovered.log")"

echo "checkpoint tests: $((SECONDS - t0)) s"
if [ $fail != 0 ]; then
  echo "FAIL checkpoint resume / reshard / corruption"
  exit 1
fi
echo "ok   checkpoint resume, resharding and corruption"
