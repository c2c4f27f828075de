// bias_residual_layer_norm / bias_residual_rms_norm: the CUDA kernel against the ATen reference
// on the same CUDA tensors, per dtype (tolerances in cuda_cases.h), with and without bias, widths
// that are not a multiple of the 16-byte vector (scalar path), strided and misaligned inputs.
// Skips without a GPU.
#include <gtest/gtest.h>

#include "cuda/cuda_cases.h"
#include "dschat/ops/residual_norm.h"

namespace dschat {
namespace {

using testing::close_to_reference;
using testing::DtypeCase;

class ResidualNormCuda : public ::testing::TestWithParam<std::tuple<DtypeCase, int64_t, int64_t, bool>> {
 protected:
  void SetUp() override { DSCHAT_REQUIRE_CUDA(); }
};

TEST_P(ResidualNormCuda, KernelsMatchReferences) {
  auto [dc, rows, cols, with_bias] = GetParam();
  torch::manual_seed(rows * 31 + cols);
  auto options = torch::dtype(dc.dtype).device(torch::kCUDA);
  torch::Tensor x = torch::randn({rows, cols}, options), residual = torch::randn({rows, cols}, options);  // [N, H]
  torch::Tensor bias = with_bias ? torch::randn({cols}, options) : torch::Tensor();                      // [H]
  torch::Tensor w = torch::randn({cols}, options), b = torch::randn({cols}, options);                   // [H]
  auto ln = ops::bias_residual_layer_norm(x, bias, residual, w, b, 1e-5);
  auto ln_want = ops::bias_residual_layer_norm_reference(x, bias, residual, w, b, 1e-5);
  EXPECT_TRUE(close_to_reference(ln.residual, ln_want.residual, dc.tolerance));
  EXPECT_TRUE(close_to_reference(ln.output, ln_want.output, dc.tolerance));
  auto plain = ops::bias_residual_layer_norm(x, bias, residual, {}, {}, 1e-5);  // no elementwise affine
  EXPECT_TRUE(close_to_reference(plain.output, ops::bias_residual_layer_norm_reference(x, bias, residual, {}, {}, 1e-5).output,
                                 dc.tolerance));
  auto rms = ops::bias_residual_rms_norm(x, bias, residual, w, 1e-6);
  auto rms_want = ops::bias_residual_rms_norm_reference(x, bias, residual, w, 1e-6);
  EXPECT_TRUE(close_to_reference(rms.residual, rms_want.residual, dc.tolerance));
  EXPECT_TRUE(close_to_reference(rms.output, rms_want.output, dc.tolerance));
}

INSTANTIATE_TEST_SUITE_P(CUDA, ResidualNormCuda,
                         ::testing::Combine(::testing::ValuesIn(testing::kernel_dtype_cases()),
                                            ::testing::Values(1, 5, 19), ::testing::Values(1, 100, 111, 4096, 8192),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return testing::dtype_name(std::get<0>(info.param).dtype) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "x" +
                                  std::to_string(std::get<2>(info.param)) + (std::get<3>(info.param) ? "_bias" : "");
                         });

class ResidualNormCudaDtype : public ::testing::TestWithParam<DtypeCase> {
 protected:
  void SetUp() override { DSCHAT_REQUIRE_CUDA(); }
};

TEST_P(ResidualNormCudaDtype, StridedAndMisalignedInputs) {
  const DtypeCase dc = GetParam();
  auto options = torch::dtype(dc.dtype).device(torch::kCUDA);
  torch::Tensor x = torch::randn({64, 5}, options).t();                                  // [5, 64], transposed
  torch::Tensor residual = torch::randn({5 * 64 + 1}, options).narrow(0, 1, 5 * 64).view({5, 64});  // misaligned
  torch::Tensor w = torch::randn({64}, options), bias = torch::randn({64}, options);
  auto got = ops::bias_residual_rms_norm(x, bias, residual, w, 1e-6);
  auto want = ops::bias_residual_rms_norm_reference(x, bias, residual, w, 1e-6);
  EXPECT_TRUE(close_to_reference(got.output, want.output, dc.tolerance));
  EXPECT_TRUE(close_to_reference(got.residual, want.residual, dc.tolerance));
}

INSTANTIATE_TEST_SUITE_P(CUDA, ResidualNormCudaDtype, ::testing::ValuesIn(testing::kernel_dtype_cases()),
                         [](const auto& info) { return testing::dtype_name(info.param.dtype); });

}  // namespace
}  // namespace dschat
