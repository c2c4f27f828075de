// ops::linear's skinny kernel (the decode step's few rows on the CPU) against a float64 oracle,
// and the properties its header claims: the same bits at any thread count, for a row whatever
// else is batched with it, and from every instruction set's loop; at::linear elsewhere.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include "dschat/core/error.h"
#include "dschat/ops/skinny_linear.h"
#include "ops/skinny_linear_kernel.h"

namespace dschat {
namespace {

torch::Tensor random(std::vector<int64_t> shape, int64_t seed) {
  torch::manual_seed(seed);
  return torch::randn(shape, torch::kFloat32);
}

// |y - y64| <= 1e-6 * sum_k |x w| + 1e-6 elementwise: fp32 accumulation error grows with the sum
// of the magnitudes, not with the (possibly cancelled) result; the floor covers results near 0.
void expect_matches_float64(const torch::Tensor& y, const torch::Tensor& x, const torch::Tensor& w,
                            const torch::Tensor& b, const std::string& what) {
  torch::Tensor x64 = x.to(torch::kFloat64), w64 = w.to(torch::kFloat64);  // [R, K], [N, K]
  torch::Tensor expected = at::linear(x64, w64, b.defined() ? b.to(torch::kFloat64) : torch::Tensor());  // [R, N]
  torch::Tensor scale = at::linear(x64.abs(), w64.abs(), torch::Tensor()) + 1.0;  // [R, N]
  const double worst = ((y.to(torch::kFloat64) - expected).abs() / scale).max().item<double>();
  EXPECT_LE(worst, 1e-6) << what;
}

TEST(SkinnyLinear, MatchesAFloat64ProductForEveryRowCountAndTail) {
  for (int64_t k : {1, 7, 15, 16, 17, 33, 768}) {
    for (int64_t rows : {1, 2, 3, 4, 5, 8, 9, 16, 27, 32}) {
      for (bool with_bias : {false, true}) {
        const torch::Tensor x = random({rows, k}, k * 100 + rows);  // [R, K]
        const torch::Tensor w = random({70, k}, k);                 // [N, K]
        const torch::Tensor b = with_bias ? random({70}, 5) : torch::Tensor();  // [N]
        torch::NoGradGuard no_grad;
        ASSERT_EQ(ops::skinny_linear_applies(x, w, b), rows <= ops::skinny_linear_auto_rows());
        const torch::Tensor y = ops::skinny_linear(x, w, b);  // [R, N]
        ASSERT_EQ(y.sizes(), (std::vector<int64_t>{rows, 70}));
        expect_matches_float64(y, x, w, b, "k " + std::to_string(k) + " rows " + std::to_string(rows));
      }
    }
  }
}

TEST(SkinnyLinear, KeepsTheLeadingShapeAndTakesNonContiguousInput) {
  const torch::Tensor x = random({2, 1, 40}, 1);  // [B, 1, K]
  const torch::Tensor w = random({24, 40}, 2);    // [N, K]
  const torch::Tensor b = random({24}, 3);        // [N]
  const torch::Tensor strided = random({40, 2}, 4).t();  // [2, 40], not contiguous
  torch::NoGradGuard no_grad;
  const torch::Tensor y = ops::linear(x, w, b);  // [B, 1, N]
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 1, 24}));
  EXPECT_TRUE(torch::equal(y.reshape({2, 24}), ops::skinny_linear(x.reshape({2, 40}), w, b)));
  expect_matches_float64(ops::linear(strided, w, b), strided, w, b, "strided x");
}

TEST(SkinnyLinear, GivesTheSameBitsAtAnyThreadCount) {
  const torch::Tensor x = random({4, 300}, 1);      // [R, K]
  const torch::Tensor w = random({5000, 300}, 2);   // [N, K]: enough outputs to split
  const torch::Tensor b = random({5000}, 3);        // [N]
  torch::NoGradGuard no_grad;
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const torch::Tensor one = ops::skinny_linear(x, w, b);
  at::set_num_threads(std::max(3, threads));
  const torch::Tensor many = ops::skinny_linear(x, w, b);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, many));
}

TEST(SkinnyLinear, ARowsResultDoesNotDependOnTheOtherRowsInTheBatch) {
  const int64_t batch = ops::kSkinnyLinearMaxRows;
  const torch::Tensor x = random({batch, 129}, 1);  // [R, K]
  const torch::Tensor w = random({90, 129}, 2);     // [N, K]
  torch::NoGradGuard no_grad;
  const torch::Tensor batched = ops::skinny_linear(x, w, torch::Tensor());  // [R, N]
  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t rows : {1, 3, 8, 9, 17}) {  // one pass and several (8 rows per AVX-512 pass, 4 otherwise)
      if (r + rows > batch) continue;
      const torch::Tensor alone = ops::skinny_linear(x.narrow(0, r, rows), w, torch::Tensor());
      EXPECT_TRUE(torch::equal(alone, batched.narrow(0, r, rows))) << "rows " << r << "+" << rows;
    }
  }
}

TEST(SkinnyLinear, LinearTakesItUpToThisMachinesRowCountThenAtLinear) {
  const int64_t auto_rows = ops::skinny_linear_auto_rows();
  ASSERT_TRUE(auto_rows == 8 || auto_rows == ops::kSkinnyLinearMaxRows) << auto_rows;
  EXPECT_EQ(auto_rows == ops::kSkinnyLinearMaxRows,
            ops::detail::cpu_is_amd() && ops::detail::skinny_isa_supported(ops::detail::SkinnyIsa::kAvx512));
  const torch::Tensor x = random({auto_rows + 1, 40}, 1);  // [R, K]
  const torch::Tensor w = random({30, 40}, 2);             // [N, K]
  torch::NoGradGuard no_grad;
  const torch::Tensor within = x.narrow(0, 0, auto_rows);  // [auto_rows, K]
  EXPECT_TRUE(torch::equal(ops::linear(within, w, {}), ops::skinny_linear(within, w, {})));
  EXPECT_FALSE(ops::skinny_linear_applies(x, w, {}));
  EXPECT_TRUE(torch::equal(ops::linear(x, w, {}), at::linear(x, w, {})));
}

TEST(SkinnyLinear, EveryInstructionSetsLoopGivesTheSameBits) {
  // 1-32 rows: the AVX-512 loop takes up to 8 rows per pass, the others 4 (more passes beyond).
  using ops::detail::SkinnyIsa;
  const torch::Tensor x = random({ops::kSkinnyLinearMaxRows, 771}, 1);  // [R, K]: a k % 16 tail
  const torch::Tensor w = random({33, 771}, 2);  // [N, K]
  const torch::Tensor b = random({33}, 3);       // [N]
  int compared = 0;
  for (int64_t rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 21, 32}) {
    const auto run = [&](SkinnyIsa isa) {
      torch::Tensor y = torch::empty({rows, 33});  // [R, N]
      ops::detail::skinny_linear_range(isa, x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(),
                                       y.data_ptr<float>(), rows, 771, 33, 0, 33);
      return y;
    };
    const torch::Tensor baseline = run(SkinnyIsa::kBaseline);  // [R, N]
    expect_matches_float64(baseline, x.narrow(0, 0, rows), w, b, "baseline loop");
    for (SkinnyIsa isa : {SkinnyIsa::kAvx, SkinnyIsa::kAvx512}) {
      if (!ops::detail::skinny_isa_supported(isa)) continue;
      EXPECT_TRUE(torch::equal(run(isa), baseline)) << "isa " << static_cast<int>(isa) << ", " << rows << " rows";
      ++compared;
    }
  }
  if (compared == 0) GTEST_SKIP() << "this CPU has neither AVX nor AVX-512: only the baseline loop runs";
}

TEST(SkinnyLinear, LeavesEverythingElseToAtLinear) {
  const torch::Tensor w = random({8, 12}, 2);  // [N, K]
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(ops::skinny_linear_applies(random({ops::skinny_linear_auto_rows() + 1, 12}, 1), w, {}));
  EXPECT_FALSE(ops::skinny_linear_applies(random({2, 12}, 1).to(torch::kBFloat16), w.to(torch::kBFloat16), {}));
  EXPECT_FALSE(ops::skinny_linear_applies(random({2, 12}, 1), random({12, 8}, 3).t(), {}));  // strided weight
  EXPECT_FALSE(ops::skinny_linear_applies(random({2, 12}, 1), w, random({9}, 4)));  // bias of the wrong size
  EXPECT_FALSE(ops::skinny_linear_applies(random({0, 12}, 1), w, {}));
  {
    torch::AutoGradMode grad(true);
    torch::Tensor trained = w.clone().requires_grad_(true);  // [N, K]
    EXPECT_FALSE(ops::skinny_linear_applies(random({2, 12}, 1), trained, {}));
    torch::Tensor y = ops::linear(random({2, 12}, 1), trained, {});  // [2, N]: at::linear, differentiable
    y.sum().backward();
    EXPECT_TRUE(trained.grad().defined());
  }
  const torch::Tensor many = random({ops::kSkinnyLinearMaxRows + 8, 12}, 5);  // [R, K]
  EXPECT_TRUE(torch::equal(ops::linear(many, w, {}), at::linear(many, w, {})));
  try {
    ops::skinny_linear(many, w, {});
    FAIL() << "more than kSkinnyLinearMaxRows rows were taken";
  } catch (const core::InvalidArgument& e) {
    const std::string range = "1.." + std::to_string(ops::kSkinnyLinearMaxRows) + " rows";
    EXPECT_NE(std::string(e.what()).find(range), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dschat
