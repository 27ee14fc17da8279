# check_includes.cmake — the dependency rule between tetra's folders, as a build fact.
#
#   cmake -DROOT=<source tree> -P scripts/check_includes.cmake
#
# Every build runs it before compiling (CMakeLists.txt, target tetra_include_rule): an
# #include "folder/..." from a file in another folder must follow an arrow below, or
# the build stops naming the file, the include and the arrows its folder has.
#
#   cli        -> everything: the subcommands' front doors
#   plan       -> engine, config, telemetry, models, float8, checkpoint, data, parallel,
#                 kernels: `tetra plan` lays a config out with the trainer's own dry run
#   engine     -> config, telemetry, models, float8, checkpoint, data, parallel, kernels:
#                 the trainer (setup, step, loop, checkpoint state, converters, the job spec)
#   config     -> models, data, parallel: the TOML parser, the key schema and its rules
#                 (a flavor's sizes, a mixture's sources, a schedule's name); never the engine
#   telemetry  -> parallel, kernels: logs, metrics, TensorBoard, traces, memory snapshots,
#                 plots; never the trainer (it hands them plain numbers)
#   models     -> parallel, kernels, checkpoint: a model owns how it is parallelized
#                 and how its weights convert (Hugging Face); never the engine
#   float8     -> parallel, kernels, models (models/linear.h: a linear descriptor, not a
#                 family)
#   checkpoint -> parallel, kernels: never the model
#   parallel   -> kernels: never a model
#   data       -> util only
#   kernels    -> util only: kernels never know of ranks
#   tools      -> config (the TOML decoder of the toml-test suite)
#   util       -> nothing; every folder may include it (dtypes, crc32c, error messages)
# tests/ and bench/ may include anything.
#
# The trainer (engine/) reaches a model family only through models/model.h: an include
# of a family's folder (models/llama3/...) from engine/ fails, so a second family adds a
# folder and a line in models/registry.c, not an edit to the trainer; converters (Float8)
# reach a model's linears through models/linear.h.
#
# MPI (<mpi.h>) is named in parallel/ and in util/host.c, the host control plane every
# other folder uses for its whole-job exchanges; plan/calibrate.c measures MPI's own
# link rates, so it calls MPI too.
cmake_minimum_required(VERSION 3.20)
if(NOT ROOT)
  message(FATAL_ERROR "check_includes.cmake: pass -DROOT=<source tree>")
endif()

include(${CMAKE_CURRENT_LIST_DIR}/layering.cmake)

set(MPI_FILES util/host.c plan/calibrate.c)

set(violations 0)
foreach(mod IN LISTS MODULES)
  file(GLOB_RECURSE files RELATIVE ${ROOT} ${ROOT}/${mod}/*.c ${ROOT}/${mod}/*.h ${ROOT}/${mod}/*.cu
       ${ROOT}/${mod}/*.cuh)
  foreach(f IN LISTS files)
    if(NOT mod STREQUAL "parallel" AND NOT f IN_LIST MPI_FILES)
      file(STRINGS ${ROOT}/${f} mpi REGEX "^[ \t]*#[ \t]*include[ \t]*<mpi\\.h>")
      if(mpi)
        message(SEND_ERROR "${f}: #include <mpi.h>: outside parallel/, MPI goes through util/host.h "
                "(the rule is scripts/check_includes.cmake)")
        math(EXPR violations "${violations} + 1")
      endif()
    endif()
    file(STRINGS ${ROOT}/${f} incs REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"]+/")
    if(mod STREQUAL "engine")
      foreach(line IN LISTS incs)
        if(line MATCHES "\"models/[^\"/]+/")
          string(STRIP "${line}" shown)
          message(SEND_ERROR "${f}: ${shown}: the trainer reaches a model family only through models/model.h "
                  "(the rule is scripts/check_includes.cmake)")
          math(EXPR violations "${violations} + 1")
        endif()
      endforeach()
    endif()
    foreach(line IN LISTS incs)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"/]+)/.*" "\\1" target "${line}")
      if(target STREQUAL mod OR NOT target IN_LIST MODULES)
        continue()
      endif()
      if(NOT target IN_LIST ALLOWED_${mod})
        string(STRIP "${line}" shown)
        string(REPLACE ";" ", " arrows "${ALLOWED_${mod}}")
        if(NOT arrows)
          set(arrows "none")
        endif()
        message(SEND_ERROR "${f}: ${shown}: ${mod}/ may not include ${target}/ "
                "(${mod}/ may include: ${arrows}; the rule is scripts/check_includes.cmake)")
        math(EXPR violations "${violations} + 1")
      endif()
    endforeach()
  endforeach()
endforeach()
if(violations GREATER 0)
  message(FATAL_ERROR "${violations} include(s) against the dependency rule")
endif()
