# Finds LibTorch inside the PyPI torch wheel (tools/setup.sh installs it into .venv) and decides
# whether the CUDA kernels are built.
#   in : DSCHAT_WITH_CUDA (AUTO|ON|OFF), optional DSCHAT_PYTHON / Torch_DIR
#   out: TORCH_LIBRARIES, DSCHAT_TORCH_LIB_DIR, DSCHAT_CUDA_ENABLED, DSCHAT_PYTHON
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
if(NOT DSCHAT_CUDA_ENABLED)
  # CPU build: link only the CPU half of LibTorch so nothing needs a GPU driver.
  set(TORCH_LIBRARIES torch torch_cpu c10)
endif()
get_filename_component(DSCHAT_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)
message(STATUS "dschat: LibTorch ${Torch_VERSION} from ${DSCHAT_TORCH_LIB_DIR}; CUDA kernels: ${DSCHAT_CUDA_ENABLED}")
