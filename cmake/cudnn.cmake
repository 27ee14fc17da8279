# cudnn.cmake — cuDNN for the CUDA backend (optional).
#
# When found: tetra_cuda links it and defines TETRA_HAVE_CUDNN (kernels/cuda/cuda_cudnn.cu
# reports the version the process runs with). The attention ops of this version take
# fp32 activations, which cuDNN's fused SDPA (fp16/bf16/fp8 only) cannot run, so
# attention always uses the built-in CUDA kernels (kernels/cuda/cuda_attention.cu);
# cuDNN becomes the fast path of the bf16 attention ops (docs/cuda.md).
if(TARGET tetra_cuda)
  set(TETRA_CUDNN_HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT} /usr/local/cuda /usr/local)
  find_path(TETRA_CUDNN_INCLUDE_DIR cudnn.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include /usr/local/include /usr/include
    PATH_SUFFIXES include)
  find_library(TETRA_CUDNN_LIBRARY cudnn
    HINTS ${TETRA_CUDNN_HINTS}
    PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu)
  if(TETRA_CUDNN_INCLUDE_DIR AND TETRA_CUDNN_LIBRARY)
    set(TETRA_CUDNN_VERSION "")
    if(EXISTS ${TETRA_CUDNN_INCLUDE_DIR}/cudnn_version.h)
      file(STRINGS ${TETRA_CUDNN_INCLUDE_DIR}/cudnn_version.h TETRA_CUDNN_VERSION_LINES
        REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
      foreach(line ${TETRA_CUDNN_VERSION_LINES})
        string(REGEX REPLACE "^#define CUDNN_[A-Z]+ +([0-9]+).*" "\\1" part "${line}")
        if(TETRA_CUDNN_VERSION STREQUAL "")
          set(TETRA_CUDNN_VERSION "${part}")
        else()
          set(TETRA_CUDNN_VERSION "${TETRA_CUDNN_VERSION}.${part}")
        endif()
      endforeach()
    endif()
    target_include_directories(tetra_cuda PUBLIC ${TETRA_CUDNN_INCLUDE_DIR})
    target_link_libraries(tetra_cuda PUBLIC ${TETRA_CUDNN_LIBRARY})
    target_compile_definitions(tetra_cuda PUBLIC TETRA_HAVE_CUDNN=1)
    message(STATUS "tetra: cuDNN ${TETRA_CUDNN_VERSION} found (${TETRA_CUDNN_LIBRARY}); fp32 attention uses the built-in CUDA kernels")
  else()
    message(STATUS "tetra: cuDNN not found: building the CUDA backend without it (attention uses the built-in CUDA kernels)")
  endif()
endif()
