// rotary_embedding: the CUDA kernel against the ATen reference on the same CUDA tensors, per
// dtype (tolerances in cuda_cases.h), GQA head counts, D = 80 / 96 / 128, the transposed
// projection views nn::Attention passes, a head dim strided input (copied). Skips without a GPU.
#include <gtest/gtest.h>

#include "cuda/cuda_cases.h"
#include "dschat/nn/rotary.h"
#include "dschat/ops/rotary.h"

namespace dschat {
namespace {

using testing::close_to_reference;
using testing::DtypeCase;

using RotaryShape = std::tuple<int64_t, int64_t, int64_t, int64_t>;  // B, T, H_kv, D

std::string shape_name(const RotaryShape& s) {
  return "B" + std::to_string(std::get<0>(s)) + "_T" + std::to_string(std::get<1>(s)) + "_Hkv" +
         std::to_string(std::get<2>(s)) + "_D" + std::to_string(std::get<3>(s));
}

class RotaryCuda : public ::testing::TestWithParam<std::tuple<DtypeCase, RotaryShape>> {
 protected:
  void SetUp() override { DSCHAT_REQUIRE_CUDA(); }
};

TEST_P(RotaryCuda, KernelMatchesReference) {
  auto [dc, shape] = GetParam();
  auto [batch, tokens, kv_heads, dim] = shape;
  auto options = torch::dtype(dc.dtype).device(torch::kCUDA);
  core::ModelConfig config = *core::model_preset("llama-2-7b");
  config.head_dim = dim;
  torch::Tensor positions = torch::randint(0, 4000, {batch, tokens}, torch::dtype(torch::kInt64).device(torch::kCUDA));
  auto [cos, sin] = nn::rotary_cos_sin(config, positions, dc.dtype);                     // [B, T, D] each
  torch::Tensor q = torch::randn({batch, tokens, 2 * kv_heads, dim}, options).transpose(1, 2);  // [B, H, T, D]
  torch::Tensor k = torch::randn({batch, tokens, kv_heads, dim}, options).transpose(1, 2);      // [B, H_kv, T, D]
  auto [q_rot, k_rot] = ops::rotary_embedding(q, k, cos, sin);
  EXPECT_TRUE(close_to_reference(q_rot, ops::rotary_embedding_reference(q, cos, sin), dc.tolerance));
  EXPECT_TRUE(close_to_reference(k_rot, ops::rotary_embedding_reference(k, cos, sin), dc.tolerance));
  torch::Tensor k_strided = torch::randn({batch, kv_heads, dim, tokens}, options).transpose(2, 3);  // D stride T
  auto [q2, k2] = ops::rotary_embedding(q, k_strided, cos, sin);
  EXPECT_TRUE(close_to_reference(k2, ops::rotary_embedding_reference(k_strided, cos, sin), dc.tolerance));
}

INSTANTIATE_TEST_SUITE_P(CUDA, RotaryCuda,
                         ::testing::Combine(::testing::ValuesIn(testing::kernel_dtype_cases()),
                                            ::testing::Values(std::make_tuple(1, 1, 1, 8), std::make_tuple(5, 3, 2, 80),
                                                              std::make_tuple(2, 7, 3, 96),
                                                              std::make_tuple(1, 130, 8, 128))),
                         [](const auto& info) {
                           return testing::dtype_name(std::get<0>(info.param).dtype) + "_" +
                                  shape_name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace dschat
