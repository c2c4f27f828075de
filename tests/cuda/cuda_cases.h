#pragma once
// Shared by the CUDA op tests: the per-dtype tolerance table and the comparison they all use.
// Tolerances (absolute, scaled by max(1, max |reference|)): fp32 1e-5, fp16 1e-2, bf16 4e-2.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "test_util.h"

namespace dschat {
namespace testing {

struct DtypeCase {
  torch::ScalarType dtype;
  double tolerance;
};

inline std::vector<DtypeCase> kernel_dtype_cases() {
  return {{torch::kFloat32, 1e-5}, {torch::kFloat16, 1e-2}, {torch::kBFloat16, 4e-2}};
}

inline std::string dtype_name(torch::ScalarType dtype) { return c10::toString(dtype); }

/// max |got - want| <= tolerance * max(1, max |want|), with the numbers in the failure message.
inline ::testing::AssertionResult close_to_reference(const torch::Tensor& got, const torch::Tensor& want,
                                                     double tolerance) {
  if (got.sizes() != want.sizes()) {
    return ::testing::AssertionFailure() << "shape " << got.sizes() << " != " << want.sizes();
  }
  if (got.scalar_type() != want.scalar_type()) {
    return ::testing::AssertionFailure() << "dtype " << got.scalar_type() << " != " << want.scalar_type();
  }
  if (want.numel() == 0) return ::testing::AssertionSuccess();
  if (got.isnan().any().item<bool>()) return ::testing::AssertionFailure() << "NaN in the kernel's output";
  const double scale = std::max(1.0, want.abs().max().item<double>());
  const double diff = max_abs_diff(got, want);
  if (diff <= tolerance * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |got - want| = " << diff << " > " << tolerance << " * " << scale;
}

}  // namespace testing
}  // namespace dschat

/// Skips the test when no CUDA device is visible.
#define DSCHAT_REQUIRE_CUDA()                                         \
  do {                                                                \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)
