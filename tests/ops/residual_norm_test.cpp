// bias_residual_layer_norm / bias_residual_rms_norm on the CPU (their ATen references): against
// the unfused composition the models ran before (x + bias + residual, then torch::nn::LayerNorm or
// ops::rms_norm; bitwise on the CPU, bf16 included), against float64 (fp32 tolerance 1e-5), odd
// widths, no bias / no affine, strided views, and named argument errors.
#include <gtest/gtest.h>

#include "dschat/ops/residual_norm.h"
#include "dschat/ops/rms_norm.h"
#include "test_util.h"

namespace dschat {
namespace {

using testing::max_abs_diff;

torch::Tensor layer_norm_float64(const torch::Tensor& s, const torch::Tensor& w, const torch::Tensor& b, double eps) {
  torch::Tensor x = s.to(torch::kFloat64);  // [..., H]
  torch::Tensor mean = x.mean(-1, true), var = (x - mean).pow(2).mean(-1, true);
  torch::Tensor y = (x - mean) / torch::sqrt(var + eps);
  if (w.defined()) y = y * w.to(torch::kFloat64);
  if (b.defined()) y = y + b.to(torch::kFloat64);
  return y;
}

torch::Tensor rms_norm_float64(const torch::Tensor& s, const torch::Tensor& w, double eps) {
  torch::Tensor x = s.to(torch::kFloat64);  // [..., H]
  return w.to(torch::kFloat64) * x / torch::sqrt(x.pow(2).mean(-1, true) + eps);
}

class ResidualNormOpTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, bool>> {};

TEST_P(ResidualNormOpTest, LayerNormMatchesModuleCompositionAndFloat64) {
  auto [rows, cols, with_bias] = GetParam();
  torch::manual_seed(rows * 100 + cols);
  torch::Tensor x = torch::randn({rows, cols}), residual = torch::randn({rows, cols});  // [N, H]
  torch::Tensor bias = with_bias ? torch::randn({cols}) : torch::Tensor();              // [H]
  torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({cols}).eps(1e-5));
  torch::NoGradGuard no_grad;
  norm->weight.normal_();
  norm->bias.normal_();
  auto [out, sum] = ops::bias_residual_layer_norm(x, bias, residual, norm->weight, norm->bias, 1e-5);
  torch::Tensor want_sum = residual + (with_bias ? x + bias : x);  // the models' unfused order
  EXPECT_TRUE(torch::equal(sum, want_sum));
  EXPECT_TRUE(torch::equal(out, norm(want_sum)));
  EXPECT_LT(max_abs_diff(out, layer_norm_float64(want_sum, norm->weight, norm->bias, 1e-5)), 1e-5);
}

TEST_P(ResidualNormOpTest, RmsNormMatchesRmsNormOfTheSumAndFloat64) {
  auto [rows, cols, with_bias] = GetParam();
  torch::manual_seed(rows * 100 + cols + 1);
  torch::Tensor x = torch::randn({rows, cols}), residual = torch::randn({rows, cols});  // [N, H]
  torch::Tensor bias = with_bias ? torch::randn({cols}) : torch::Tensor();              // [H]
  torch::Tensor weight = torch::randn({cols});                                          // [H]
  auto [out, sum] = ops::bias_residual_rms_norm(x, bias, residual, weight, 1e-6);
  torch::Tensor want_sum = with_bias ? (x + bias) + residual : x + residual;
  EXPECT_TRUE(torch::equal(sum, want_sum));
  EXPECT_TRUE(torch::equal(out, ops::rms_norm(want_sum, weight, 1e-6)));
  EXPECT_LT(max_abs_diff(out, rms_norm_float64(want_sum, weight, 1e-6)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ResidualNormOpTest,
                         ::testing::Values(std::make_tuple(1, 1, true), std::make_tuple(5, 100, true),
                                           std::make_tuple(3, 777, false), std::make_tuple(19, 64, true),
                                           std::make_tuple(0, 16, true)));

TEST(ResidualNormOpCpuTest, LayerNormWithoutAffineAndThreeDims) {
  torch::Tensor x = torch::randn({2, 3, 40}), residual = torch::randn({2, 3, 40});  // [B, T, H]
  auto [out, sum] = ops::bias_residual_layer_norm(x, torch::Tensor(), residual, torch::Tensor(), torch::Tensor(), 1e-5);
  EXPECT_EQ(out.sizes(), x.sizes());
  EXPECT_LT(max_abs_diff(out, layer_norm_float64(x + residual, {}, {}, 1e-5)), 1e-5);
}

TEST(ResidualNormOpCpuTest, Bf16IsTheModulesBf16Arithmetic) {
  torch::Tensor x = torch::randn({4, 72}).to(torch::kBFloat16), residual = torch::randn({4, 72}).to(torch::kBFloat16);
  torch::Tensor bias = torch::randn({72}).to(torch::kBFloat16), w = torch::randn({72}).to(torch::kBFloat16);
  torch::Tensor b = torch::randn({72}).to(torch::kBFloat16);
  auto ln = ops::bias_residual_layer_norm(x, bias, residual, w, b, 1e-5);
  torch::Tensor sum = residual + (x + bias);
  EXPECT_TRUE(torch::equal(ln.residual, sum));
  EXPECT_TRUE(torch::equal(ln.output, torch::layer_norm(sum, {72}, w, b, 1e-5)));
  auto rms = ops::bias_residual_rms_norm(x, bias, residual, w, 1e-6);
  EXPECT_TRUE(torch::equal(rms.output, ops::rms_norm(sum, w, 1e-6)));
}

TEST(ResidualNormOpCpuTest, StridedViewsGiveTheContiguousResult) {
  torch::Tensor x = torch::randn({48, 5}).t();                      // [5, 48], transposed
  torch::Tensor residual = torch::randn({5, 96}).narrow(1, 10, 48);  // [5, 48], row stride 96
  torch::Tensor w = torch::randn({96}).narrow(0, 0, 48), b = torch::randn({48});
  auto got = ops::bias_residual_rms_norm(x, b, residual, w, 1e-6);
  auto want = ops::bias_residual_rms_norm(x.contiguous(), b, residual.contiguous(), w.contiguous(), 1e-6);
  EXPECT_LT(max_abs_diff(got.output, want.output), 1e-6);
  EXPECT_LT(max_abs_diff(got.residual, want.residual), 1e-6);
}

TEST(ResidualNormOpCpuTest, BadArgumentsAreNamed) {
  torch::Tensor x = torch::randn({2, 8}), r = torch::randn({2, 8}), w = torch::randn({8});
  EXPECT_THROW_WITH(ops::bias_residual_layer_norm(x, {}, torch::randn({2, 7}), w, {}, 1e-5), core::InvalidArgument,
                    "bias_residual_layer_norm: residual shape [2, 7] differs from x shape [2, 8]");
  EXPECT_THROW_WITH(ops::bias_residual_layer_norm(x, torch::randn({7}), r, w, {}, 1e-5), core::InvalidArgument,
                    "bias_residual_layer_norm: expected bias of shape [8], got [7]");
  EXPECT_THROW_WITH(ops::bias_residual_layer_norm(x, {}, r, w, torch::randn({8}, torch::kFloat64), 1e-5),
                    core::InvalidArgument, "beta dtype Double differs from x dtype Float");
  EXPECT_THROW_WITH(ops::bias_residual_rms_norm(x, {}, r, torch::Tensor(), 1e-6), core::InvalidArgument,
                    "bias_residual_rms_norm: weight is required");
  EXPECT_THROW_WITH(ops::bias_residual_rms_norm(x, {}, r.to(torch::kMeta), w, 1e-6), core::InvalidArgument,
                    "bias_residual_rms_norm: residual is on meta, x on cpu");
  EXPECT_THROW_WITH(ops::bias_residual_rms_norm(x.to(torch::kInt64), {}, r.to(torch::kInt64), w, 1e-6),
                    core::InvalidArgument, "x must be floating point, got Long");
}

}  // namespace
}  // namespace dschat
