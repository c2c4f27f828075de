// rms_norm on the CPU: the ATen reference against a float64 evaluation of the formula, odd
// shapes, non-contiguous input, gradients by finite differences, named argument errors.
#include <gtest/gtest.h>

#include "dschat/ops/rms_norm.h"
#include "test_util.h"

namespace dschat {
namespace {

torch::Tensor rms_norm_float64(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  torch::Tensor x64 = x.to(torch::kFloat64);  // [..., H]
  return w.to(torch::kFloat64) * x64 / torch::sqrt(x64.pow(2).mean(-1, true) + eps);
}

class RmsNormCpu : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(RmsNormCpu, MatchesFormulaInFloat64) {
  auto [rows, cols] = GetParam();
  torch::manual_seed(rows * 1000 + cols);
  torch::Tensor x = torch::randn({rows, cols});  // [R, C]
  torch::Tensor w = torch::randn({cols});        // [C]
  EXPECT_LT(testing::max_abs_diff(ops::rms_norm(x, w, 1e-6), rms_norm_float64(x, w, 1e-6)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormCpu,
                         ::testing::Values(std::make_tuple(1, 1), std::make_tuple(19, 111), std::make_tuple(7, 4096),
                                           std::make_tuple(0, 8)));

TEST(RmsNormCpuTest, NonContiguousInputAndThreeDims) {
  torch::Tensor x = torch::randn({5, 32, 3}).transpose(1, 2);  // [5, 3, 32], non-contiguous
  torch::Tensor w = torch::randn({32});
  EXPECT_LT(testing::max_abs_diff(ops::rms_norm(x, w, 1e-5), rms_norm_float64(x, w, 1e-5)), 1e-5);
}

TEST(RmsNormCpuTest, GradientsMatchFiniteDifferences) {
  torch::Tensor x = torch::randn({3, 11}, torch::kFloat64).requires_grad_(true);
  torch::Tensor w = torch::randn({11}, torch::kFloat64).requires_grad_(true);
  ops::rms_norm(x, w, 1e-6).pow(2).sum().backward();
  const double h = 1e-6;
  for (int64_t i = 0; i < 11; ++i) {  // d loss / d w[i] by central differences
    torch::NoGradGuard no_grad;
    torch::Tensor wp = w.detach().clone(), wm = w.detach().clone();
    wp[i] += h;
    wm[i] -= h;
    double numeric = (ops::rms_norm(x.detach(), wp, 1e-6).pow(2).sum() - ops::rms_norm(x.detach(), wm, 1e-6).pow(2).sum())
                         .item<double>() / (2 * h);
    EXPECT_NEAR(w.grad()[i].item<double>(), numeric, 1e-5);
  }
  EXPECT_TRUE(x.grad().defined());
}

TEST(RmsNormCpuTest, BadArgumentsAreNamed) {
  EXPECT_THROW_WITH(ops::rms_norm(torch::randn({2, 8}), torch::randn({7}), 1e-6), core::InvalidArgument,
                    "rms_norm: expected weight of shape [8], got [7]");
  EXPECT_THROW_WITH(ops::rms_norm(torch::randn({2, 8}), torch::randn({8}, torch::kFloat64), 1e-6),
                    core::InvalidArgument, "differs from weight dtype");
}

}  // namespace
}  // namespace dschat
