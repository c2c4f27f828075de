// bias_activation and silu_and_mul on the CPU (their ATen references): bitwise equal to the
// models' unfused path (nn::apply_activation(x + bias), silu(gate) * up), against float64 formulas
// (fp32 tolerance 1e-6 absolute on |x| <~ 5), odd widths, the fused [gate | up] input, strided
// views (1e-6: ATen's vectorised and strided CPU loops round differently), named argument errors.
#include <gtest/gtest.h>

#include <cmath>

#include "dschat/nn/activation.h"
#include "dschat/ops/bias_activation.h"
#include "test_util.h"

namespace dschat {
namespace {

using testing::max_abs_diff;

torch::Tensor float64_activation(ops::Activation activation, const torch::Tensor& x) {
  torch::Tensor v = x.to(torch::kFloat64);
  switch (activation) {
    case ops::Activation::Relu: return v.clamp_min(0);
    case ops::Activation::Gelu: return 0.5 * v * (1 + torch::erf(v / std::sqrt(2.0)));
    case ops::Activation::GeluTanh: return 0.5 * v * (1 + torch::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v.pow(3))));
    case ops::Activation::Silu: return v / (1 + torch::exp(-v));
  }
  return v;
}

nn::Activation nn_activation(ops::Activation activation) {
  switch (activation) {
    case ops::Activation::Relu: return nn::Activation::Relu;
    case ops::Activation::Gelu: return nn::Activation::Gelu;
    case ops::Activation::GeluTanh: return nn::Activation::GeluTanh;
    case ops::Activation::Silu: return nn::Activation::Silu;
  }
  return nn::Activation::Relu;
}

class BiasActivationOpTest : public ::testing::TestWithParam<std::tuple<ops::Activation, int64_t>> {};

TEST_P(BiasActivationOpTest, MatchesTheModelsPathAndFloat64) {
  auto [activation, cols] = GetParam();
  torch::manual_seed(cols);
  torch::Tensor x = 2 * torch::randn({5, 3, cols}), bias = torch::randn({cols});  // [B, T, F], [F]
  torch::Tensor got = ops::bias_activation(x, bias, activation);
  EXPECT_TRUE(torch::equal(got, nn::apply_activation(nn_activation(activation), x + bias)));
  EXPECT_LT(max_abs_diff(got, float64_activation(activation, x + bias)), 1e-6);
  EXPECT_TRUE(torch::equal(ops::bias_activation(x, torch::Tensor(), activation),
                           nn::apply_activation(nn_activation(activation), x)));
  torch::Tensor xh = x.to(torch::kBFloat16), bh = bias.to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(ops::bias_activation(xh, bh, activation),
                           nn::apply_activation(nn_activation(activation), xh + bh)));
}

INSTANTIATE_TEST_SUITE_P(Activations, BiasActivationOpTest,
                         ::testing::Combine(::testing::Values(ops::Activation::Relu, ops::Activation::Gelu,
                                                              ops::Activation::GeluTanh, ops::Activation::Silu),
                                            ::testing::Values(1, 7, 64)));

TEST(SiluAndMulOpTest, SeparateAndFusedInputsMatchTheModelsPath) {
  torch::Tensor gate = torch::randn({5, 2, 37}), up = torch::randn({5, 2, 37});  // [B, T, F], odd F
  torch::Tensor want = torch::silu(gate) * up;
  EXPECT_TRUE(torch::equal(ops::silu_and_mul(gate, up), want));
  torch::Tensor gate_up = torch::cat({gate, up}, -1);  // [B, T, 2F]
  // Its halves are strided views, which ATen's CPU loops may round differently: 1e-6.
  EXPECT_LT(max_abs_diff(ops::silu_and_mul(gate_up), want), 1e-6);
  torch::Tensor v = gate.to(torch::kFloat64);
  EXPECT_LT(max_abs_diff(ops::silu_and_mul(gate, up), v / (1 + torch::exp(-v)) * up.to(torch::kFloat64)), 1e-6);
}

TEST(SiluAndMulOpTest, StridedViewsGiveTheContiguousResult) {
  torch::Tensor gate = torch::randn({24, 9}).t();               // [9, 24], transposed
  torch::Tensor up = torch::randn({9, 50}).narrow(1, 3, 24);    // [9, 24], row stride 50
  // ATen's vectorised and scalar CPU loops round silu/gelu differently: not bitwise, 1e-6.
  EXPECT_LT(max_abs_diff(ops::silu_and_mul(gate, up), ops::silu_and_mul(gate.contiguous(), up.contiguous())), 1e-6);
  torch::Tensor x = torch::randn({16, 6}).t();                  // [6, 16], transposed
  torch::Tensor bias = torch::randn({32}).narrow(0, 8, 16);
  EXPECT_LT(max_abs_diff(ops::bias_activation(x, bias, ops::Activation::Gelu),
                         ops::bias_activation(x.contiguous(), bias.contiguous(), ops::Activation::Gelu)),
            1e-6);
}

TEST(BiasActivationOpCpuTest, BadArgumentsAreNamed) {
  EXPECT_THROW_WITH(ops::bias_activation(torch::randn({2, 8}), torch::randn({7}), ops::Activation::Relu),
                    core::InvalidArgument, "bias_activation: expected bias of shape [8], got [7]");
  EXPECT_THROW_WITH(ops::bias_activation(torch::randn({2, 8}), torch::randn({8}, torch::kFloat16), ops::Activation::Relu),
                    core::InvalidArgument, "bias_activation: bias dtype Half differs from x dtype Float");
  EXPECT_THROW_WITH(ops::silu_and_mul(torch::randn({2, 7})), core::InvalidArgument,
                    "silu_and_mul: expected gate_up of shape [..., 2F], got [2, 7]");
  EXPECT_THROW_WITH(ops::silu_and_mul(torch::randn({2, 8}), torch::randn({2, 9})), core::InvalidArgument,
                    "silu_and_mul: up shape [2, 9] differs from gate shape [2, 8]");
  EXPECT_THROW_WITH(ops::silu_and_mul(torch::randn({2, 8}), torch::randn({2, 8}).to(torch::kMeta)),
                    core::InvalidArgument, "silu_and_mul: up is on meta, gate on cpu");
}

}  // namespace
}  // namespace dschat
