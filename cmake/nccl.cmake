# nccl.cmake — the NCCL communication backend (parallel/comm_nccl.cu) when the
# CUDA part is built: find libnccl and nccl.h (CUDA toolkit folders first, then
# NCCL_ROOT / the system), link it into tetra_cuda and define TETRA_HAVE_NCCL
# for both the CUDA and the C sources. Without NCCL the CUDA build goes on and
# the MPI backend is the only one (comm_backend_available says so).

if(TARGET tetra_cuda)
  find_path(NCCL_INCLUDE_DIR nccl.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} $ENV{NCCL_ROOT}/include /usr/local/cuda/include)
  find_library(NCCL_LIBRARY nccl
    HINTS ${CUDAToolkit_LIBRARY_DIR} $ENV{NCCL_ROOT}/lib /usr/local/cuda/lib /usr/local/cuda/lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    target_include_directories(tetra_cuda PRIVATE ${NCCL_INCLUDE_DIR})
    target_link_libraries(tetra_cuda PUBLIC ${NCCL_LIBRARY})
    target_compile_definitions(tetra_cuda PRIVATE TETRA_HAVE_NCCL=1)
    target_compile_definitions(tetra_common INTERFACE TETRA_HAVE_NCCL=1)
    message(STATUS "tetra: NCCL backend ON (${NCCL_LIBRARY})")
  else()
    message(STATUS "tetra: NCCL not found (set NCCL_ROOT); the NCCL comm backend is not built")
  endif()
endif()

# The GPU test of the NCCL backend (tests/gpu/README.md). Where no GPU is visible it
# prints "SKIP: <why>" and exits 0, which ctest reports as skipped.
if(TARGET tetra_cuda AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY AND EXISTS ${CMAKE_SOURCE_DIR}/tests/gpu/test_comm_nccl.c)
  add_executable(test_comm_nccl ${CMAKE_SOURCE_DIR}/tests/gpu/test_comm_nccl.c)
  set_target_properties(test_comm_nccl PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_compile_options(test_comm_nccl PRIVATE ${TETRA_C_WARNINGS})
  target_link_libraries(test_comm_nccl PRIVATE tetra_lib tetra_cuda CUDA::cudart)
  enable_testing()
  add_test(NAME gpu/test_comm_nccl COMMAND test_comm_nccl WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(gpu/test_comm_nccl PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE"
    SKIP_REGULAR_EXPRESSION "SKIP: ")
endif()
