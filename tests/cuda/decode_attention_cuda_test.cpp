// decode_attention's CUDA kernel against its ATen reference (run on the same CUDA tensors), per
// dtype (tolerances in cuda_cases.h), over odd head dims (the scalar path), D = 80 / 96 / 256,
// cache lengths that are not a multiple of the 128-key tile, GQA / MQA, the split-K path with
// padding spanning whole splits and fully masked rows, strided and misaligned views.
// Skips without a GPU.
#include <gtest/gtest.h>

#include "cuda/cuda_cases.h"
#include "dschat/ops/decode_attention.h"

namespace dschat {
namespace {

using testing::close_to_reference;
using testing::DtypeCase;

struct Shape {
  int64_t batch, heads, kv_heads, dim, capacity, length;
};

// Row r has r * 3 % length leading padding; the last row of a batch of 5 or more is all padding.
torch::Tensor padded_mask(int64_t batch, int64_t length, torch::Device device) {
  torch::Tensor mask = torch::ones({batch, length}, torch::kInt64);  // [B, S]
  for (int64_t r = 0; r < batch; ++r) mask[r].narrow(0, 0, r * 3 % length).zero_();
  if (batch >= 5) mask[batch - 1].zero_();
  return mask.to(device);
}

class DecodeAttentionCuda : public ::testing::TestWithParam<std::tuple<DtypeCase, Shape>> {
 protected:
  void SetUp() override { DSCHAT_REQUIRE_CUDA(); }
};

TEST_P(DecodeAttentionCuda, KernelMatchesReference) {
  auto [dc, s] = GetParam();
  torch::manual_seed(s.dim + s.length);
  auto options = torch::dtype(dc.dtype).device(torch::kCUDA);
  torch::Tensor q = torch::randn({s.batch, s.heads, 1, s.dim}, options);                    // [B, H, 1, D]
  torch::Tensor k_cache = torch::randn({s.batch, s.kv_heads, s.capacity, s.dim}, options);  // [B, H_kv, S_max, D]
  torch::Tensor v_cache = torch::randn({s.batch, s.kv_heads, s.capacity, s.dim}, options);
  torch::Tensor mask = padded_mask(s.batch, s.length, torch::kCUDA);  // [B, S]
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.dim));
  torch::Tensor want = ops::decode_attention_reference(q, k_cache, v_cache, mask, s.length, scale);
  EXPECT_TRUE(close_to_reference(ops::decode_attention(q, k_cache, v_cache, mask, s.length, scale), want, dc.tolerance));
  torch::Tensor unmasked = ops::decode_attention_reference(q, k_cache, v_cache, {}, s.length, scale);
  EXPECT_TRUE(close_to_reference(ops::decode_attention(q, k_cache, v_cache, {}, s.length, scale), unmasked,
                                 dc.tolerance));
}

INSTANTIATE_TEST_SUITE_P(
    CUDA, DecodeAttentionCuda,
    ::testing::Combine(::testing::ValuesIn(testing::kernel_dtype_cases()),
                       ::testing::Values(Shape{1, 4, 4, 64, 16, 9},         // MHA, one short tile
                                         Shape{5, 8, 2, 80, 300, 257},      // GQA 4, D = 80, tile + tile + 1
                                         Shape{5, 6, 3, 96, 40, 33},        // GQA 2, D = 96
                                         Shape{1, 2, 1, 8, 1, 1},           // one key
                                         Shape{3, 4, 1, 19, 150, 129},      // MQA, odd D: scalar loads
                                         Shape{1, 2, 2, 128, 4096, 3001},   // split-K (12 splits)
                                         Shape{2, 32, 8, 256, 600, 555})),  // the largest head dim
    [](const auto& info) {
      const Shape& s = std::get<1>(info.param);
      return testing::dtype_name(std::get<0>(info.param).dtype) + "_B" + std::to_string(s.batch) + "_H" +
             std::to_string(s.heads) + "_Hkv" + std::to_string(s.kv_heads) + "_D" + std::to_string(s.dim) + "_S" +
             std::to_string(s.length);
    });

class DecodeAttentionCudaDtype : public ::testing::TestWithParam<DtypeCase> {
 protected:
  void SetUp() override { DSCHAT_REQUIRE_CUDA(); }
};

TEST_P(DecodeAttentionCudaDtype, SplitsThatAreEntirelyPaddingAndFullyMaskedRows) {
  const DtypeCase dc = GetParam();
  auto options = torch::dtype(dc.dtype).device(torch::kCUDA);
  torch::Tensor q = torch::randn({3, 2, 1, 64}, options);
  torch::Tensor k = torch::randn({3, 1, 2000, 64}, options), v = torch::randn({3, 1, 2000, 64}, options);
  torch::Tensor mask = torch::ones({3, 1900}, torch::dtype(torch::kInt64).device(torch::kCUDA));
  mask[1].narrow(0, 0, 1000).zero_();  // row 1: the first ~4 of 8 splits see only padding
  mask[2].zero_();                     // row 2: uniform weights over all 1900 keys
  torch::Tensor got = ops::decode_attention(q, k, v, mask, 1900, 0.125);
  EXPECT_TRUE(close_to_reference(got, ops::decode_attention_reference(q, k, v, mask, 1900, 0.125), dc.tolerance));
  torch::Tensor mean = v[2].narrow(1, 0, 1900).to(torch::kFloat32).mean(1).expand({2, 64});  // [H, D]
  EXPECT_TRUE(close_to_reference(got[2].squeeze(1).to(torch::kFloat32), mean, dc.tolerance));
}

TEST_P(DecodeAttentionCudaDtype, StridedAndMisalignedViews) {
  const DtypeCase dc = GetParam();
  auto options = torch::dtype(dc.dtype).device(torch::kCUDA);
  torch::Tensor mask = padded_mask(5, 37, torch::kCUDA);
  // q as nn::Attention makes it; a cache stored [B, S, H_kv, D]; a cache with D strided (copied).
  torch::Tensor q = torch::randn({5, 1, 6, 24}, options).transpose(1, 2);     // [5, 6, 1, 24]
  torch::Tensor k = torch::randn({5, 50, 2, 24}, options).transpose(1, 2);    // [5, 2, 50, 24]
  torch::Tensor v = torch::randn({5, 2, 24, 50}, options).transpose(2, 3);    // [5, 2, 50, 24], D stride 50
  torch::Tensor want = ops::decode_attention_reference(q, k, v, mask, 37, 0.2);
  EXPECT_TRUE(close_to_reference(ops::decode_attention(q, k, v, mask, 37, 0.2), want, dc.tolerance));
  // One element past an aligned start: the kernel falls back to scalar loads.
  torch::Tensor k_odd = torch::randn({5 * 2 * 50 * 24 + 1}, options).narrow(0, 1, 5 * 2 * 50 * 24).view({5, 2, 50, 24});
  torch::Tensor want_odd = ops::decode_attention_reference(q, k_odd, v, mask, 37, 0.2);
  EXPECT_TRUE(close_to_reference(ops::decode_attention(q, k_odd, v, mask, 37, 0.2), want_odd, dc.tolerance));
}

TEST_P(DecodeAttentionCudaDtype, GradientRecordingCallsTakeTheReference) {
  const DtypeCase dc = GetParam();
  auto options = torch::dtype(dc.dtype).device(torch::kCUDA);
  torch::Tensor q = torch::randn({2, 4, 1, 16}, options).requires_grad_(true);
  torch::Tensor k = torch::randn({2, 2, 9, 16}, options), v = torch::randn({2, 2, 9, 16}, options);
  torch::Tensor out = ops::decode_attention(q, k, v, {}, 9, 0.25);
  EXPECT_TRUE(out.requires_grad());
  out.sum().backward();
  EXPECT_TRUE(q.grad().defined());
}

INSTANTIATE_TEST_SUITE_P(CUDA, DecodeAttentionCudaDtype, ::testing::ValuesIn(testing::kernel_dtype_cases()),
                         [](const auto& info) { return testing::dtype_name(info.param.dtype); });

}  // namespace
}  // namespace dschat
