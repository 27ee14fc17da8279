# gpu_tests.cmake — tests/gpu/test_ops_*.c: the CUDA backend against the CPU backend, op
# by op and for full training steps (docs/cuda.md).
#
# - With the CUDA backend built: gpu/test_ops_cuda on the GPU. Without a device it prints
#   "SKIP: no CUDA device ..." and exits 0, and ctest reports it skipped, so CI without
#   a GPU still builds it with -Werror and runs its device-less checks.
# - -DTETRA_CUDA_SIM=ON (any build, no GPU or CUDA toolkit needed; needs a C++ compiler
#   and Python 3): gpu/test_ops_cuda_sim, the same test with kernels/cuda/*.cu run on a
#   CPU simulator (tests/gpu/test_ops_sim): every kernel's indexing, barriers, masking
#   and reductions checked against the CPU backend, cuBLASLt and CUB replaced by
#   reference stand-ins, streams as tokens, no cuDNN (the bf16 attention ops take their
#   built-in path). About a minute on two cores.
option(TETRA_CUDA_SIM "Build gpu/test_ops_cuda_sim: the CUDA kernels on a CPU simulator" OFF)

if(TARGET tetra_cuda)
  enable_testing()
  file(GLOB TETRA_GPU_OPS_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/gpu/test_ops_*.c)
  foreach(src ${TETRA_GPU_OPS_TESTS})
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src})
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
    target_compile_options(${name} PRIVATE ${TETRA_C_WARNINGS})
    # the test calls into the CUDA library directly, besides loading it as the backend
    target_link_libraries(${name} PRIVATE tetra_lib tetra_cuda)
    add_test(NAME gpu/${name} COMMAND ${name} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(gpu/${name} PROPERTIES
      ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=PASSIVE;${TETRA_MPI_TEST_ENV}"
      SKIP_REGULAR_EXPRESSION "SKIP: no CUDA device"
      TIMEOUT 900)
  endforeach()
endif()

if(TETRA_CUDA_SIM)
  enable_language(CXX)
  enable_testing()
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  set(TETRA_SIM_DIR ${CMAKE_SOURCE_DIR}/tests/gpu/test_ops_sim)
  set(TETRA_SIM_GEN_DIR ${CMAKE_BINARY_DIR}/cuda_sim)
  file(GLOB TETRA_SIM_CU CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu)
  file(GLOB_RECURSE TETRA_SIM_HEADERS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cuh
    ${CMAKE_SOURCE_DIR}/kernels/cuda/*.h ${TETRA_SIM_DIR}/include/*)
  set(TETRA_SIM_SOURCES)
  foreach(cu ${TETRA_SIM_CU})
    get_filename_component(base ${cu} NAME_WE)
    set(out ${TETRA_SIM_GEN_DIR}/${base}.cpp)
    add_custom_command(OUTPUT ${out}
      COMMAND ${Python3_EXECUTABLE} ${TETRA_SIM_DIR}/transform.py ${TETRA_SIM_GEN_DIR} ${cu}
      DEPENDS ${cu} ${TETRA_SIM_DIR}/transform.py
      COMMENT "CUDA simulator: ${base}.cu"
      VERBATIM)
    list(APPEND TETRA_SIM_SOURCES ${out})
  endforeach()
  # The simulated backend as objects: its own ops.c (built with TETRA_HAVE_CUDA) and the
  # simulated kernels come before tetra_lib on each link line, so the library's ops.c
  # and any real CUDA objects are never pulled in.
  add_library(tetra_sim_backend OBJECT ${CMAKE_SOURCE_DIR}/kernels/ops.c ${TETRA_SIM_DIR}/sim.cpp
    ${TETRA_SIM_SOURCES})
  set_target_properties(tetra_sim_backend PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
  set_source_files_properties(${TETRA_SIM_SOURCES} ${TETRA_SIM_DIR}/sim.cpp PROPERTIES OBJECT_DEPENDS "${TETRA_SIM_HEADERS}")
  target_include_directories(tetra_sim_backend BEFORE PRIVATE ${TETRA_SIM_DIR}/include)
  target_include_directories(tetra_sim_backend PRIVATE ${CMAKE_SOURCE_DIR})
  # the simulated kernels are linked in: ops.c takes their table from the symbols
  target_compile_definitions(tetra_sim_backend PRIVATE TETRA_HAVE_CUDA=1 TETRA_CUDA_LINKED=1)
  # C: the project's warnings; C++ (generated): the simulator header first, no FMA
  # contraction (the device's explicit __fmul_rn/__fadd_rn become plain operations),
  # and no cuDNN (its headers would bring the real CUDA runtime's)
  target_compile_options(tetra_sim_backend PRIVATE
    "$<$<COMPILE_LANGUAGE:C>:${TETRA_C_WARNINGS}>"
    "$<$<COMPILE_LANGUAGE:CXX>:-include;${TETRA_SIM_DIR}/include/sim.h;-ffp-contract=off;-w;-UTETRA_HAVE_CUDNN>")
  target_link_libraries(tetra_sim_backend PRIVATE MPI::MPI_C)

  add_executable(test_ops_cuda_sim ${CMAKE_SOURCE_DIR}/tests/gpu/test_ops_cuda.c $<TARGET_OBJECTS:tetra_sim_backend>)
  set_target_properties(test_ops_cuda_sim PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests
    LINKER_LANGUAGE CXX)
  target_include_directories(test_ops_cuda_sim BEFORE PRIVATE ${TETRA_SIM_DIR}/include)
  target_compile_definitions(test_ops_cuda_sim PRIVATE TETRA_HAVE_CUDA=1 TETRA_CUDA_LINKED=1)
  target_compile_options(test_ops_cuda_sim PRIVATE ${TETRA_C_WARNINGS})
  target_link_libraries(test_ops_cuda_sim PRIVATE tetra_lib)

  # `tetra` itself on the simulated kernels: the trainer's whole command line, data
  # loader and layouts on "device" memory (tests/sh/test_sim_layouts.sh)
  add_executable(tetra-sim ${CMAKE_SOURCE_DIR}/cli/main.c $<TARGET_OBJECTS:tetra_sim_backend>)
  set_target_properties(tetra-sim PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests LINKER_LANGUAGE CXX)
  target_compile_options(tetra-sim PRIVATE ${TETRA_C_WARNINGS})
  target_link_libraries(tetra-sim PRIVATE tetra_lib)
  add_test(NAME gpu/test_ops_cuda_sim COMMAND test_ops_cuda_sim WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(gpu/test_ops_cuda_sim PROPERTIES
    ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=PASSIVE;${TETRA_MPI_TEST_ENV}" TIMEOUT 1800)
  # the trainer on the simulated kernels over two MPI ranks against the CPU trainer, in
  # bf16, pipeline then context parallel: the layouts gpu/test_sim_layouts runs in fp32
  # only (`--trainer` runs all eight cases: FSDP, TP, PP, CP in fp32 and bf16)
  add_test(NAME gpu/test_ops_cuda_sim_fsdp
    COMMAND ${MPIEXEC_EXECUTABLE} -np 2 --oversubscribe --bind-to none $<TARGET_FILE:test_ops_cuda_sim> --trainer-bf16
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  # the layout matrix through `tetra train` on the simulated kernels, every multi-rank
  # layout through MPI staged in host memory (tests/gpu/sim_layouts.sh)
  add_test(NAME gpu/test_sim_layouts COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/sim_layouts.sh
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(gpu/test_sim_layouts PROPERTIES
    ENVIRONMENT "TETRA_ROOT=${CMAKE_SOURCE_DIR};TETRA_BUILD=${CMAKE_BINARY_DIR};TETRA_BIN=${CMAKE_BINARY_DIR}/bin;OMP_WAIT_POLICY=PASSIVE;${TETRA_MPI_TEST_ENV}"
    TIMEOUT 1800)
  # CPU offload against no offload on the simulated kernels, bit for bit (tests/gpu/sim_offload.sh)
  add_test(NAME gpu/test_sim_offload COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/sim_offload.sh
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(gpu/test_sim_offload PROPERTIES
    ENVIRONMENT "TETRA_ROOT=${CMAKE_SOURCE_DIR};TETRA_BUILD=${CMAKE_BINARY_DIR};OMP_WAIT_POLICY=PASSIVE;${TETRA_MPI_TEST_ENV}" TIMEOUT 1800)
  # host waits per step: 0 on one rank when a step neither logs nor saves (tests/gpu/sim_host_waits.sh)
  add_test(NAME gpu/test_sim_host_waits COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/sim_host_waits.sh
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(gpu/test_sim_host_waits PROPERTIES
    ENVIRONMENT "TETRA_ROOT=${CMAKE_SOURCE_DIR};TETRA_BUILD=${CMAKE_BINARY_DIR};OMP_WAIT_POLICY=PASSIVE;${TETRA_MPI_TEST_ENV}" TIMEOUT 1800)
  # training.cuda_graph: steps captured and launched as graphs give the same bits (tests/gpu/sim_cuda_graph.sh)
  add_test(NAME gpu/test_sim_cuda_graph COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/sim_cuda_graph.sh
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(gpu/test_sim_cuda_graph PROPERTIES
    ENVIRONMENT "TETRA_ROOT=${CMAKE_SOURCE_DIR};TETRA_BUILD=${CMAKE_BINARY_DIR};OMP_WAIT_POLICY=PASSIVE;${TETRA_MPI_TEST_ENV}" TIMEOUT 1800)
  # the longest of the suite start first (tests/CMakeLists.txt says why)
  set_tests_properties(gpu/test_sim_layouts PROPERTIES COST 200)
  set_tests_properties(gpu/test_sim_offload gpu/test_ops_cuda_sim PROPERTIES COST 100)
  set_tests_properties(gpu/test_ops_cuda_sim_fsdp PROPERTIES
    ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_btl_vader_single_copy_mechanism=none;${TETRA_MPI_TEST_ENV}"
    TIMEOUT 1800)
endif()
