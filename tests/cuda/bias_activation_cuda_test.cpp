// bias_activation and silu_and_mul: the CUDA kernels against the ATen references on the same
// CUDA tensors, per dtype (tolerances in cuda_cases.h), every activation, widths that are not a
// multiple of the 16-byte vector, the fused [gate | up] input, strided views. Skips without a GPU.
#include <gtest/gtest.h>

#include "cuda/cuda_cases.h"
#include "dschat/ops/bias_activation.h"

namespace dschat {
namespace {

using testing::close_to_reference;
using testing::DtypeCase;

std::string activation_name(ops::Activation activation) {
  switch (activation) {
    case ops::Activation::Relu: return "relu";
    case ops::Activation::Gelu: return "gelu";
    case ops::Activation::GeluTanh: return "gelu_tanh";
    case ops::Activation::Silu: return "silu";
  }
  return "unknown";
}

class BiasActivationCuda : public ::testing::TestWithParam<std::tuple<DtypeCase, ops::Activation, int64_t>> {
 protected:
  void SetUp() override { DSCHAT_REQUIRE_CUDA(); }
};

TEST_P(BiasActivationCuda, KernelMatchesReference) {
  auto [dc, activation, cols] = GetParam();
  torch::manual_seed(cols);
  auto options = torch::dtype(dc.dtype).device(torch::kCUDA);
  torch::Tensor x = 3 * torch::randn({5, cols}, options), bias = torch::randn({cols}, options);  // [N, F], [F]
  EXPECT_TRUE(close_to_reference(ops::bias_activation(x, bias, activation),
                                 ops::bias_activation_reference(x, bias, activation), dc.tolerance));
  EXPECT_TRUE(close_to_reference(ops::bias_activation(x, {}, activation),
                                 ops::bias_activation_reference(x, {}, activation), dc.tolerance));
}

INSTANTIATE_TEST_SUITE_P(CUDA, BiasActivationCuda,
                         ::testing::Combine(::testing::ValuesIn(testing::kernel_dtype_cases()),
                                            ::testing::Values(ops::Activation::Relu, ops::Activation::Gelu,
                                                              ops::Activation::GeluTanh, ops::Activation::Silu),
                                            ::testing::Values(1, 7, 64, 4099)),
                         [](const auto& info) {
                           return testing::dtype_name(std::get<0>(info.param).dtype) + "_" +
                                  activation_name(std::get<1>(info.param)) + "_" +
                                  std::to_string(std::get<2>(info.param));
                         });

class SiluAndMulCuda : public ::testing::TestWithParam<std::tuple<DtypeCase, int64_t>> {
 protected:
  void SetUp() override { DSCHAT_REQUIRE_CUDA(); }
};

TEST_P(SiluAndMulCuda, SeparateFusedAndStridedInputsMatchReference) {
  auto [dc, cols] = GetParam();
  auto options = torch::dtype(dc.dtype).device(torch::kCUDA);
  torch::Tensor gate = 3 * torch::randn({5, 2, cols}, options), up = torch::randn({5, 2, cols}, options);  // [B, T, F]
  torch::Tensor want = ops::silu_and_mul_reference(gate, up);
  EXPECT_TRUE(close_to_reference(ops::silu_and_mul(gate, up), want, dc.tolerance));
  EXPECT_TRUE(close_to_reference(ops::silu_and_mul(torch::cat({gate, up}, -1)), want, dc.tolerance));  // [B, T, 2F]
  torch::Tensor gate_t = torch::randn({cols, 9}, options).t();  // [9, F], transposed
  torch::Tensor up_t = torch::randn({9, cols + 3}, options).narrow(1, 3, cols);  // row stride F + 3, misaligned
  EXPECT_TRUE(close_to_reference(ops::silu_and_mul(gate_t, up_t), ops::silu_and_mul_reference(gate_t, up_t),
                                 dc.tolerance));
}

INSTANTIATE_TEST_SUITE_P(CUDA, SiluAndMulCuda,
                         ::testing::Combine(::testing::ValuesIn(testing::kernel_dtype_cases()),
                                            ::testing::Values(1, 37, 64, 1000)),
                         [](const auto& info) {
                           return testing::dtype_name(std::get<0>(info.param).dtype) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace dschat
