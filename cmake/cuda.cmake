# The trainer's CUDA engine is built when a CUDA compiler, the toolkit (cuBLAS) and NCCL are all
# found; -DDLRUN_CUDA=OFF builds for the CPU only. Sets DLRUN_WITH_CUDA and the NCCL::nccl target.
option(DLRUN_CUDA "Build the trainer's CUDA engine when CUDA is found" ON)
set(DLRUN_WITH_CUDA OFF)
if(DLRUN_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    find_package(CUDAToolkit)
  endif()
  if(CUDAToolkit_FOUND)
    # NCCL ships no CMake package: it sits next to the toolkit.
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  endif()
  if(CUDAToolkit_FOUND AND TARGET CUDA::cublas AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no C++20 flag for nvcc; the kernels need 17
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    # One CUDA runtime in the process: the kernels' objects and the host code share libcudart.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    if(CCACHE_PROGRAM)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
    endif()
    add_library(NCCL::nccl UNKNOWN IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
                          INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
    set(DLRUN_WITH_CUDA ON)
    message(STATUS "CUDA ${CUDAToolkit_VERSION} with NCCL ${NCCL_LIBRARY}: building the CUDA engine")
  else()
    message(STATUS "CUDA, cuBLAS or NCCL not found: dlrun-train is built for the CPU only")
  endif()
endif()
