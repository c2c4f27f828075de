// Rotary frequencies for the scaling types the fixtures do not cover end to end (linear and
// dynamic NTK), against transformers' formulas written out here; llama3 is covered by the
// llama-rope-llama3-tied parity fixture. The per-device cache (RotaryFrequencies) gives bitwise
// the tables of rotary_cos_sin for every scaling type, dynamic NTK past max positions included.
#include <gtest/gtest.h>

#include <cmath>

#include "dschat/nn/rotary.h"
#include "test_util.h"

namespace dschat {
namespace {

core::ModelConfig llama_config(const std::string& rope_type, double factor) {
  core::ModelConfig c = *core::model_preset("llama-2-7b");
  c.head_dim = 8;
  c.max_position_embeddings = 100;
  c.rope_scaling.type = rope_type;
  c.rope_scaling.factor = factor;
  return c;
}

torch::Tensor frequencies(double base, int64_t dim) {  // 1 / base^(2i/dim), i < dim/2
  torch::Tensor i = torch::arange(0, dim, 2, torch::kFloat64) / static_cast<double>(dim);
  return 1.0 / torch::pow(base, i);
}

TEST(RotaryTest, LinearDividesDefaultFrequenciesByFactor) {
  torch::Tensor got = nn::rotary_inverse_frequencies(llama_config("linear", 4.0), 10);
  EXPECT_LT(testing::max_abs_diff(got, frequencies(10000.0, 8) / 4.0), 1e-7);
}

TEST(RotaryTest, DynamicNtkGrowsTheBaseOnlyPastMaxPositions) {
  auto config = llama_config("dynamic", 2.0);
  EXPECT_LT(testing::max_abs_diff(nn::rotary_inverse_frequencies(config, 100), frequencies(10000.0, 8)), 1e-7);
  double base = 10000.0 * std::pow(2.0 * 300 / 100 - 1.0, 8.0 / 6.0);
  EXPECT_LT(testing::max_abs_diff(nn::rotary_inverse_frequencies(config, 300), frequencies(base, 8)), 1e-6);
}

TEST(RotaryTest, RotationKeepsNormsAndIsIdentityAtPositionZero) {
  auto config = llama_config("default", 1.0);
  torch::Tensor positions = torch::tensor({{0, 5, 17}}, torch::kInt64);  // [1, 3]
  auto [cos, sin] = nn::rotary_cos_sin(config, positions, torch::kFloat32);  // [1, 3, 8]
  torch::Tensor x = torch::randn({1, 2, 3, 8});                            // [B, H, T, D]
  torch::Tensor y = nn::apply_rotary(x, cos, sin);
  EXPECT_LT(testing::max_abs_diff(y.select(2, 0), x.select(2, 0)), 1e-6);
  EXPECT_LT(testing::max_abs_diff(y.norm(2, -1), x.norm(2, -1)), 1e-5);
}

TEST(RotaryTest, CachedFrequenciesGiveTheTablesOfRotaryCosSinBitwise) {
  for (const std::string type : {"default", "linear", "dynamic", "llama3"}) {
    core::ModelConfig config = llama_config(type, 2.0);
    nn::RotaryFrequencies cache(config);
    // Within max_position_embeddings (100), then past it (dynamic NTK grows its base there).
    for (const int64_t last : {40, 250}) {
      torch::Tensor positions = torch::tensor(std::vector<int64_t>{0, 5, last, 1, 2, 3}).view({2, 3});  // [2, 3]
      auto [cos, sin] = cache.cos_sin(positions, torch::kFloat32);                        // [2, 3, 8] each
      auto [want_cos, want_sin] = nn::rotary_cos_sin(config, positions, torch::kFloat32);
      EXPECT_TRUE(torch::equal(cos, want_cos)) << type << " " << last;
      EXPECT_TRUE(torch::equal(sin, want_sin)) << type << " " << last;
    }
  }
}

TEST(RotaryTest, FrequenciesAreBuiltOncePerDevice) {
  nn::RotaryFrequencies cache(llama_config("linear", 4.0));
  torch::Tensor first = cache.on_device(torch::kCPU);  // [4]
  EXPECT_TRUE(first.is_same(cache.on_device(torch::kCPU)));
  EXPECT_TRUE(torch::equal(first, nn::rotary_inverse_frequencies(llama_config("linear", 4.0), 0)));
}

}  // namespace
}  // namespace dschat
