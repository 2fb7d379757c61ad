# Detects the CUDA toolkit and sets LLM_WITH_CUDA. With it: the CUDA language for kernels/,
# CUDA::cudart, CUDA::cublas, CUDA::cublasLt and the imported target llm::nccl.
set(LLM_WITH_CUDA OFF)
if(NOT LLM_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(LLM_NVCC nvcc HINTS ENV CUDA_HOME PATH_SUFFIXES bin
                 PATHS /usr/local/cuda/bin NO_CACHE)
    if(LLM_NVCC)
      set(CMAKE_CUDA_COMPILER "${LLM_NVCC}")
    endif()
  endif()
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES "${LLM_CUDA_ARCHITECTURES}")
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # C++20: CUDA sources include kernels/tensor.h and kernels/ops.h (std::span). CMake 3.25
    # does not know nvcc's C++20 flag (nvcc has it since 12.0), so it is told here.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    # NCCL ships inside the CUDA toolkit's lib directory on our machines.
    find_path(LLM_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME
              PATH_SUFFIXES include)
    find_library(LLM_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME
                 PATH_SUFFIXES lib lib64)
    if(NOT LLM_NCCL_INCLUDE_DIR OR NOT LLM_NCCL_LIBRARY)
      message(FATAL_ERROR "CUDA found but NCCL not: set NCCL_HOME or LLM_CUDA=OFF")
    endif()
    add_library(llm_nccl INTERFACE)
    target_include_directories(llm_nccl INTERFACE "${LLM_NCCL_INCLUDE_DIR}")
    target_link_libraries(llm_nccl INTERFACE "${LLM_NCCL_LIBRARY}")
    add_library(llm::nccl ALIAS llm_nccl)
    set(LLM_WITH_CUDA ON)
    message(STATUS "CUDA ${CUDAToolkit_VERSION} for sm ${CMAKE_CUDA_ARCHITECTURES}; "
                   "NCCL ${LLM_NCCL_LIBRARY}")
  elseif(LLM_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LLM_CUDA=ON but no nvcc was found (PATH, CUDA_HOME, /usr/local/cuda)")
  else()
    message(STATUS "No nvcc found: building without the CUDA backend")
  endif()
endif()
