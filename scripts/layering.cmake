# layering.cmake — the folders and the arrows between them, said once: the include check
# (scripts/check_includes.cmake) holds every #include to them, and CMakeLists.txt builds
# one library per folder that links exactly the folders it may use. The arrows in words
# are in scripts/check_includes.cmake and docs/architecture.md.
set(MODULES cli plan engine config telemetry models float8 checkpoint parallel data kernels tools util)
set(ALLOWED_cli plan engine config telemetry models float8 checkpoint parallel data kernels util)
set(ALLOWED_plan engine config telemetry models float8 checkpoint data parallel kernels util)
set(ALLOWED_engine config telemetry models float8 checkpoint data parallel kernels util)
set(ALLOWED_config models data parallel util)
set(ALLOWED_telemetry parallel kernels util)
set(ALLOWED_models parallel kernels checkpoint util)
set(ALLOWED_float8 parallel kernels models util)
set(ALLOWED_checkpoint parallel kernels util)
set(ALLOWED_parallel kernels util)
set(ALLOWED_data util)
set(ALLOWED_kernels util)
set(ALLOWED_tools config util)
set(ALLOWED_util)

