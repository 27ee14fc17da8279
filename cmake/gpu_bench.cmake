# gpu_bench.cmake — bench/gpu_ops.c, per-op timings of the op table at Llama 3 8B shapes
# (build/bench/gpu_ops; bench/gpu's `ops` case and scripts/gpu_check's bench section run
# it). Built with the CUDA backend, which it loads as `tetra` does (lib/libtetra_cuda.so
# beside the executable's folder); without a device it says so and exits 2, and
# `--device cpu --small` times the CPU table at debug-model shapes.
if(TARGET tetra_cuda)
  add_executable(tetra_gpu_ops ${CMAKE_SOURCE_DIR}/bench/gpu_ops.c)
  set_target_properties(tetra_gpu_ops PROPERTIES OUTPUT_NAME gpu_ops RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
  target_compile_options(tetra_gpu_ops PRIVATE ${TETRA_C_WARNINGS})
  target_link_libraries(tetra_gpu_ops PRIVATE tetra_lib)
  add_dependencies(tetra_gpu_ops tetra_cuda)
endif()
