// rms_norm's CUDA kernel against the ATen reference, per dtype with its tolerance (fp32 1e-5,
// fp16 1e-2, bf16 4e-2, scaled by max(1, |ref|)), odd shapes, and gradients. Skips without a GPU.
#include <gtest/gtest.h>

#include "dschat/ops/rms_norm.h"
#include "test_util.h"

namespace dschat {
namespace {

struct DtypeCase {
  torch::ScalarType dtype;
  double tolerance;
};

std::string case_name(const ::testing::TestParamInfo<std::tuple<DtypeCase, int64_t, int64_t>>& info) {
  const DtypeCase& dc = std::get<0>(info.param);
  return std::string(c10::toString(dc.dtype)) + "_" + std::to_string(std::get<1>(info.param)) + "x" +
         std::to_string(std::get<2>(info.param));
}

class RmsNormCuda : public ::testing::TestWithParam<std::tuple<DtypeCase, int64_t, int64_t>> {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(RmsNormCuda, KernelMatchesReference) {
  auto [dc, rows, cols] = GetParam();
  torch::manual_seed(rows + cols);
  auto options = torch::dtype(dc.dtype).device(torch::kCUDA);
  torch::Tensor x = torch::randn({rows, cols}, options);  // [R, C]
  torch::Tensor w = torch::randn({cols}, options);        // [C]
  torch::Tensor got = ops::rms_norm(x, w, 1e-6);
  torch::Tensor want = ops::rms_norm_reference(x, w, 1e-6);
  double scale = std::max(1.0, want.abs().max().item<double>());
  EXPECT_LT(testing::max_abs_diff(got, want), dc.tolerance * scale);
}

TEST_P(RmsNormCuda, GradientsMatchReference) {
  auto [dc, rows, cols] = GetParam();
  auto options = torch::dtype(dc.dtype).device(torch::kCUDA);
  torch::Tensor x1 = torch::randn({rows, cols}, options).requires_grad_(true);
  torch::Tensor w1 = torch::randn({cols}, options).requires_grad_(true);
  torch::Tensor x2 = x1.detach().clone().requires_grad_(true);
  torch::Tensor w2 = w1.detach().clone().requires_grad_(true);
  ops::rms_norm(x1, w1, 1e-6).sum().backward();
  ops::rms_norm_reference(x2, w2, 1e-6).sum().backward();
  EXPECT_LT(testing::max_abs_diff(x1.grad(), x2.grad()), dc.tolerance * std::max(1.0, x2.grad().abs().max().item<double>()));
  EXPECT_LT(testing::max_abs_diff(w1.grad(), w2.grad()), dc.tolerance * std::max(1.0, w2.grad().abs().max().item<double>()));
}

INSTANTIATE_TEST_SUITE_P(
    CUDA, RmsNormCuda,
    ::testing::Combine(::testing::Values(DtypeCase{torch::kFloat32, 1e-5}, DtypeCase{torch::kFloat16, 1e-2},
                                         DtypeCase{torch::kBFloat16, 4e-2}),
                       ::testing::Values(1, 19, 111), ::testing::Values(1, 111, 4096)),
    case_name);

}  // namespace
}  // namespace dschat
