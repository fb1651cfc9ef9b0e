# CUDA support for gpu/ (CXLKV_WITH_CUDA = AUTO | ON | OFF).
#   AUTO  build the CUDA half of gpu/ when a CUDA toolkit (nvcc + cudart) is found, else skip
#         it with a status line; OFF never builds it; ON fails configuration without it.
# nvcc does not mix with the sanitizer and fuzz builds, so those skip it too (ON fails).
# Sets CXLKV_HAVE_CUDA (0/1) for cmake/config.h.in and enables the CUDA language.
cxlkv_feature(CUDA "CUDA support for gpu/")
# Narrow and explicit: each architecture is a full device compile (80 = A100, 90 = H100/H200).
set(CXLKV_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures for gpu/'s kernels")

set(CXLKV_HAVE_CUDA 0)
cxlkv_feature_enabled(CUDA _cuda)
if(NOT _cuda)
  # gpu/'s CUDA half is not built; its planning half is.
elseif(NOT CXLKV_SANITIZE STREQUAL "" OR CXLKV_BUILD_FUZZ)
  if(CXLKV_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CXLKV_WITH_CUDA=ON cannot be combined with CXLKV_SANITIZE or "
                        "CXLKV_BUILD_FUZZ (nvcc does not take the sanitizer flags); build CUDA "
                        "in the dev or release preset, or set -DCXLKV_WITH_CUDA=OFF")
  endif()
  message(STATUS "cxlkv: gpu/ CUDA part not built in sanitizer/fuzz builds "
                 "(CXLKV_WITH_CUDA=AUTO); the CUDA-free planning part and its tests are")
else()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND CUDAToolkit_NVCC_EXECUTABLE)
    if(NOT DEFINED CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
    endif()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "${CXLKV_CUDA_ARCHITECTURES}")
    endif()
    include(CheckLanguage)
    check_language(CUDA)
  endif()
  if(CUDAToolkit_FOUND AND CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(CXLKV_HAVE_CUDA 1)
    message(STATUS "cxlkv: gpu/ CUDA part built with CUDA ${CUDAToolkit_VERSION} "
                   "(${CMAKE_CUDA_COMPILER}), architectures ${CMAKE_CUDA_ARCHITECTURES}")
  else()
    cxlkv_feature_missing(CUDA
      "no usable CUDA toolkit was found (nvcc and libcudart): install the CUDA toolkit "
      "(https://developer.nvidia.com/cuda-downloads) or point CMake at it with "
      "-DCUDAToolkit_ROOT=/usr/local/cuda; gpu/'s CUDA part, its tests and benchmarks")
  endif()
endif()
