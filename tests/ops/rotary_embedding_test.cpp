// rotary_embedding on the CPU (its ATen reference, which nn::apply_rotary now calls): against
// the pairwise rotation written out in float64 (fp32 tolerance 1e-5 at |x| <~ 4), bitwise against
// HF's rotate_half composition in bf16, GQA head counts, D = 80 / 96, strided views as the
// attention layer makes them, and named argument errors.
#include <gtest/gtest.h>

#include "dschat/nn/rotary.h"
#include "dschat/ops/rotary.h"
#include "test_util.h"

namespace dschat {
namespace {

using testing::max_abs_diff;

// Pair (i, i + D/2) rotated by the angle whose cos/sin the table holds at i (float64).
torch::Tensor rotate_pairs_float64(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  torch::Tensor v = x.to(torch::kFloat64);                                // [B, H, T, D]
  torch::Tensor c = cos.to(torch::kFloat64).unsqueeze(1), s = sin.to(torch::kFloat64).unsqueeze(1);  // [B, 1, T, D]
  torch::Tensor x1 = v.narrow(-1, 0, half), x2 = v.narrow(-1, half, half);
  torch::Tensor first = x1 * c.narrow(-1, 0, half) - x2 * s.narrow(-1, 0, half);
  torch::Tensor second = x2 * c.narrow(-1, half, half) + x1 * s.narrow(-1, half, half);
  return torch::cat({first, second}, -1);
}

std::pair<torch::Tensor, torch::Tensor> cos_sin(int64_t batch, int64_t tokens, int64_t dim, torch::ScalarType dtype) {
  core::ModelConfig config = *core::model_preset("llama-2-7b");
  config.head_dim = dim;
  torch::Tensor positions = torch::randint(0, 500, {batch, tokens}, torch::kInt64);  // [B, T]
  return nn::rotary_cos_sin(config, positions, dtype);                                // [B, T, D] each
}

class RotaryEmbeddingOpTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, int64_t>> {};

TEST_P(RotaryEmbeddingOpTest, MatchesThePairwiseRotationInFloat64) {
  auto [batch, tokens, kv_heads, dim] = GetParam();
  torch::manual_seed(dim + tokens);
  const int64_t heads = 2 * kv_heads;
  // As nn::Attention makes them: [B, T, H, D] projections viewed as [B, H, T, D].
  torch::Tensor q = torch::randn({batch, tokens, heads, dim}).transpose(1, 2);     // [B, H, T, D]
  torch::Tensor k = torch::randn({batch, tokens, kv_heads, dim}).transpose(1, 2);  // [B, H_kv, T, D]
  auto [cos, sin] = cos_sin(batch, tokens, dim, torch::kFloat32);
  auto [q_rot, k_rot] = ops::rotary_embedding(q, k, cos, sin);
  ASSERT_EQ(q_rot.sizes(), q.sizes());
  ASSERT_EQ(k_rot.sizes(), k.sizes());
  EXPECT_LT(max_abs_diff(q_rot, rotate_pairs_float64(q, cos, sin)), 1e-5);
  EXPECT_LT(max_abs_diff(k_rot, rotate_pairs_float64(k, cos, sin)), 1e-5);
  EXPECT_TRUE(torch::equal(q_rot, nn::apply_rotary(q, cos, sin)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, RotaryEmbeddingOpTest,
                         ::testing::Values(std::make_tuple(1, 1, 1, 8), std::make_tuple(5, 3, 2, 80),
                                           std::make_tuple(2, 7, 3, 96), std::make_tuple(1, 4, 4, 128)));

TEST(RotaryEmbeddingOpCpuTest, Bf16IsHfRotateHalfInBf16) {
  torch::Tensor q = torch::randn({2, 4, 3, 16}).to(torch::kBFloat16), k = torch::randn({2, 2, 3, 16}).to(torch::kBFloat16);
  auto [cos, sin] = cos_sin(2, 3, 16, torch::kBFloat16);
  auto rotate_half = [](const torch::Tensor& x) {
    return torch::cat({-x.narrow(-1, 8, 8), x.narrow(-1, 0, 8)}, -1);
  };
  auto [q_rot, k_rot] = ops::rotary_embedding(q, k, cos, sin);
  EXPECT_TRUE(torch::equal(q_rot, q * cos.unsqueeze(1) + rotate_half(q) * sin.unsqueeze(1)));
  EXPECT_TRUE(torch::equal(k_rot, k * cos.unsqueeze(1) + rotate_half(k) * sin.unsqueeze(1)));
}

TEST(RotaryEmbeddingOpCpuTest, BadArgumentsAreNamed) {
  torch::Tensor q = torch::randn({2, 4, 3, 8}), k = torch::randn({2, 2, 3, 8});
  auto [cos, sin] = cos_sin(2, 3, 8, torch::kFloat32);
  EXPECT_THROW_WITH(ops::rotary_embedding(torch::randn({2, 4, 3, 7}), torch::randn({2, 2, 3, 7}), cos, sin),
                    core::InvalidArgument, "rotary_embedding: head_dim must be even, got 7");
  EXPECT_THROW_WITH(ops::rotary_embedding(q, torch::randn({2, 2, 4, 8}), cos, sin), core::InvalidArgument,
                    "rotary_embedding: expected k of shape [2, H_kv, 3, 8], got [2, 2, 4, 8]");
  EXPECT_THROW_WITH(ops::rotary_embedding(q, k, cos.narrow(1, 0, 2), sin), core::InvalidArgument,
                    "expected cos and sin of shape [2, 3, 8], got cos [2, 2, 8] and sin [2, 3, 8]");
  EXPECT_THROW_WITH(ops::rotary_embedding(q, k, cos.to(torch::kBFloat16), sin), core::InvalidArgument,
                    "rotary_embedding: cos dtype BFloat16 differs from q dtype Float");
}

}  // namespace
}  // namespace dschat
