#!/usr/bin/env bash
# The dependency rule between folders (scripts/check_includes.cmake), which every build
# runs before compiling: the tree follows it, and an include against it fails, naming the
# file, the include and the arrows its folder has.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CHECK="$ROOT/scripts/check_includes.cmake"

cmake -DROOT="$ROOT" -P "$CHECK" >"$T/tree.log" 2>&1 && ok "the source tree follows the rule" ||
  bad "the source tree breaks the rule: $(cat "$T/tree.log")"

# a tree of one file per case: FOLDER/FILE includes TARGET
case_tree() { # dir folder target
  rm -rf "$1"; mkdir -p "$1/$2"
  printf '#include <stdio.h>\n#include "%s/x.h"\n' "$3" >"$1/$2/probe.c"
}
for c in kernels:parallel kernels:engine parallel:models checkpoint:models checkpoint:data models:engine data:kernels engine:cli util:kernels \
  telemetry:engine config:engine config:telemetry engine:plan plan:cli; do
  from=${c%:*}; to=${c#*:}
  case_tree "$T/$from-$to" "$from" "$to"
  # cmake wraps its messages: read them as one line
  if cmake -DROOT="$T/$from-$to" -P "$CHECK" 2>&1 | tr '\n' ' ' | tr -s ' ' >"$T/c.log"; [ "${PIPESTATUS[0]}" = 0 ]; then
    bad "$from/ including $to/ passed the rule"
  elif grep -q "$from/probe.c: #include \"$to/x.h\": $from/ may not include $to/" "$T/c.log"; then
    ok "$from/ including $to/ is refused: $(grep -o "may not include.*" "$T/c.log" | head -1 | tr -s ' ')"
  else
    bad "$from/ including $to/: the message does not name the file and the arrow: $(cat "$T/c.log")"
  fi
done
for c in engine:models models:parallel parallel:kernels cli:checkpoint checkpoint:util kernels:util kernels:kernels \
  plan:engine engine:config engine:telemetry config:models telemetry:parallel; do
  from=${c%:*}; to=${c#*:}
  case_tree "$T/$from-$to" "$from" "$to"
  cmake -DROOT="$T/$from-$to" -P "$CHECK" >"$T/c.log" 2>&1 && ok "$from/ may include $to/" ||
    bad "$from/ including $to/ was refused: $(cat "$T/c.log")"
done
# the trainer reaches a model family only through models/model.h
mkdir -p "$T/fam/engine"
printf '#include "models/model.h"\n' >"$T/fam/engine/probe.c"
cmake -DROOT="$T/fam" -P "$CHECK" >"$T/f.log" 2>&1 && ok "engine/ may include models/model.h" ||
  bad "engine/ including models/model.h was refused: $(cat "$T/f.log")"
printf '#include "models/llama3/model.h"\n' >"$T/fam/engine/probe.c"
cmake -DROOT="$T/fam" -P "$CHECK" 2>&1 | tr '\n' ' ' | tr -s ' ' >"$T/f.log"
grep -q 'engine/probe.c: #include "models/llama3/model.h": the trainer reaches a model family only through models/model.h' \
  "$T/f.log" && ok "engine/ including a family's folder is refused" ||
  bad "engine/ including models/llama3/: $(cat "$T/f.log")"
# MPI outside parallel/ and the host control plane
mkdir -p "$T/mpi/engine" "$T/mpi/parallel" "$T/mpi/util"
printf '#include <mpi.h>\n' >"$T/mpi/engine/probe.c"
cmake -DROOT="$T/mpi" -P "$CHECK" 2>&1 | tr '\n' ' ' | tr -s ' ' >"$T/m.log"
grep -q 'engine/probe.c: #include <mpi.h>: outside parallel/, MPI goes through util/host.h' "$T/m.log" &&
  ok "engine/ including <mpi.h> is refused" || bad "engine/ including <mpi.h>: $(cat "$T/m.log")"
rm "$T/mpi/engine/probe.c"
printf '#include <mpi.h>\n' >"$T/mpi/parallel/probe.c"
printf '#include <mpi.h>\n' >"$T/mpi/util/host.c"
cmake -DROOT="$T/mpi" -P "$CHECK" >"$T/m2.log" 2>&1 && ok "parallel/ and util/host.c may include <mpi.h>" ||
  bad "parallel/ or util/host.c including <mpi.h> was refused: $(cat "$T/m2.log")"
finish
