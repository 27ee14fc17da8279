# gpu_training_tests.cmake — whole training runs on the GPU (tests/gpu/README.md): the
# mixed-precision checks of tests/sh/test_mixed_precision.sh with DEVICE=cuda, including
# the 2-rank NCCL FSDP parity run when two GPUs are visible. Without a GPU the script
# prints "SKIP: ..." and ctest reports the test skipped.
if(TARGET tetra_cuda)
  enable_testing()
  add_test(NAME gpu/test_training_cuda
    COMMAND bash ${CMAKE_SOURCE_DIR}/tests/sh/test_mixed_precision.sh
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(gpu/test_training_cuda PROPERTIES
    ENVIRONMENT "DEVICE=cuda;TETRA_BIN=${CMAKE_BINARY_DIR}/bin;OMP_WAIT_POLICY=PASSIVE"
    SKIP_REGULAR_EXPRESSION "SKIP: "
    TIMEOUT 900)
endif()
