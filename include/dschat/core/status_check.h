#pragma once
// Status-code checks for the C libraries under the GPU path. Each macro evaluates a call once and
// throws dschat::core::DeviceError naming the library, the call, the code, its description, and
// the file and line. The expansion site includes the library's own header (cuda_runtime.h,
// nccl.h, cublas_v2.h); this header needs none of them.

#include "dschat/core/error.h"

#define DSCHAT_STATUS_CHECK(library, expr, ok_value, describe)                                  \
  do {                                                                                          \
    const auto dschat_status_ = (expr);                                                         \
    if (dschat_status_ != (ok_value)) {                                                         \
      ::dschat::core::detail::throw_status(library, #expr, static_cast<long>(dschat_status_),   \
                                           describe(dschat_status_), __FILE__, __LINE__);       \
    }                                                                                           \
  } while (0)

#define DSCHAT_CUDA_CHECK(expr) DSCHAT_STATUS_CHECK("CUDA", expr, cudaSuccess, cudaGetErrorString)
#define DSCHAT_NCCL_CHECK(expr) DSCHAT_STATUS_CHECK("NCCL", expr, ncclSuccess, ncclGetErrorString)
#define DSCHAT_CUBLAS_CHECK(expr) \
  DSCHAT_STATUS_CHECK("cuBLAS", expr, CUBLAS_STATUS_SUCCESS, cublasGetStatusString)
