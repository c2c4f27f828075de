# Finds LibTorch inside the PyPI torch wheel (tools/setup.sh installs it into .venv) and decides
# whether the CUDA kernels are built.
#   in : DSCHAT_WITH_CUDA (AUTO|ON|OFF), optional DSCHAT_PYTHON / Torch_DIR
#   out: TORCH_LIBRARIES, DSCHAT_TORCH_LIB_DIR, DSCHAT_CUDA_ENABLED, DSCHAT_PYTHON,
#        DSCHAT_TORCH_INSTALL_INTERFACE
if(NOT DSCHAT_PYTHON)
  if(EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/.venv/bin/python")
    set(DSCHAT_PYTHON "${CMAKE_CURRENT_SOURCE_DIR}/.venv/bin/python")
  else()
    find_program(DSCHAT_PYTHON NAMES python3 REQUIRED)
  endif()
endif()
set(DSCHAT_PYTHON "${DSCHAT_PYTHON}" CACHE FILEPATH "Python whose torch wheel provides LibTorch")

execute_process(COMMAND "${DSCHAT_PYTHON}" -c "import torch, sys; sys.stdout.write(torch.utils.cmake_prefix_path + ';' + (torch.version.cuda or ''))"
                  OUTPUT_VARIABLE _torch_probe RESULT_VARIABLE _torch_rc ERROR_VARIABLE _torch_err)
  if(NOT _torch_rc EQUAL 0)
    message(FATAL_ERROR "dschat: cannot import torch with ${DSCHAT_PYTHON} (run tools/setup.sh): ${_torch_err}")
  endif()
  list(GET _torch_probe 0 _torch_prefix)
  list(LENGTH _torch_probe _n)
  set(DSCHAT_TORCH_CUDA_VERSION "")
  if(_n GREATER 1)
    list(GET _torch_probe 1 DSCHAT_TORCH_CUDA_VERSION)
  endif()
if(NOT Torch_DIR)
  list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
endif()

# CUDA: AUTO means "nvcc is here and the LibTorch was built with CUDA".
include(CheckLanguage)
set(DSCHAT_CUDA_ENABLED OFF)
if(DSCHAT_WITH_CUDA STREQUAL "AUTO" OR DSCHAT_WITH_CUDA)
  if(NOT DSCHAT_WITH_CUDA STREQUAL "AUTO" OR DSCHAT_TORCH_CUDA_VERSION)
    if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      set(DSCHAT_CUDA_ENABLED ON)
    elseif(NOT DSCHAT_WITH_CUDA STREQUAL "AUTO")
      message(FATAL_ERROR "dschat: DSCHAT_WITH_CUDA=ON but no nvcc was found")
    endif()
  endif()
endif()
if(DSCHAT_CUDA_ENABLED)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_ARCHITECTURES "80;90")
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
endif()

# LibTorch's own config finds CUDA for a CUDA wheel; silence its optional-component chatter.
set(CAFFE2_USE_CUDNN OFF)
# Name the architectures so that LibTorch does not try to detect a GPU at configure time.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "8.0;9.0")
endif()
find_package(Torch REQUIRED)
if(DSCHAT_CUDA_ENABLED)
  set(_dschat_torch_needed torch c10 c10_cuda)
  set(DSCHAT_TORCH_INSTALL_INTERFACE torch)
else()
  # CPU build: link only the CPU half of LibTorch, so that nothing needs CUDA: `torch` would drag
  # in torch_cuda, c10_cuda and cudart (libtorch.so itself needs libtorch_cuda.so in a CUDA wheel).
  # torch_cpu/c10 lack the C++ API's include dir (torch/torch.h) and TORCH_CXX_FLAGS, which
  # TorchConfig sets on `torch` only.
  add_library(dschat_torch_cpu INTERFACE IMPORTED)
  set_target_properties(dschat_torch_cpu PROPERTIES INTERFACE_LINK_LIBRARIES "torch_cpu;c10"
                        INTERFACE_INCLUDE_DIRECTORIES "${TORCH_INCLUDE_DIRS}")
  if(TORCH_CXX_FLAGS)
    separate_arguments(_dschat_torch_cxx_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
    set_target_properties(dschat_torch_cpu PROPERTIES INTERFACE_COMPILE_OPTIONS "${_dschat_torch_cxx_flags}")
  endif()
  set(TORCH_LIBRARIES dschat_torch_cpu)
  set(_dschat_torch_needed torch_cpu c10)
  set(DSCHAT_TORCH_INSTALL_INTERFACE torch_cpu c10)
endif()
# What the installed package's dschat::dschat links instead of TORCH_LIBRARIES (whose full paths
# point into this wheel): targets that the consumer's find_dependency(Torch) defines, plus the
# LibTorch libraries that libdschat needs, linked --no-as-needed. libdschat's RUNPATH names no
# LibTorch dir, and the loader looks a library's dependencies up in that library's own RUNPATH
# only, so each must already be loaded, as a direct dependency of the consumer's executable (found
# through its RUNPATH); `torch` alone leaves libc10_cuda out. The CPU package's include dir and
# ABI flag are taken from the consumer's `torch` at install (CMakeLists.txt, "install").
list(TRANSFORM _dschat_torch_needed REPLACE "^.+$" "$<TARGET_FILE:\\0>")
list(JOIN _dschat_torch_needed "," _dschat_torch_needed)
list(APPEND DSCHAT_TORCH_INSTALL_INTERFACE "-Wl,--push-state,--no-as-needed,${_dschat_torch_needed},--pop-state")
get_filename_component(DSCHAT_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)
message(STATUS "dschat: LibTorch ${Torch_VERSION} from ${DSCHAT_TORCH_LIB_DIR}; CUDA kernels: ${DSCHAT_CUDA_ENABLED}")
