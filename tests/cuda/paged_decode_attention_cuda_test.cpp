// paged_decode_attention's CUDA path (decode_attention's kernel reading key columns through pool
// slots) against paged_decode_attention_reference (gather, then the ATen reference) on the same
// CUDA tensors, per dtype (tolerances in cuda_cases.h): random block tables (rows sharing some
// blocks, as a prompt's n samples do), rows of different lengths in the left-padded frame (padding
// columns read the row's first slot and are masked, as inference::PagedKvCache builds them), GQA
// and MQA, an odd head dim (scalar loads), the split-K path, with and without the caller's key
// mask. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "cuda/cuda_cases.h"
#include "dschat/ops/paged_decode_attention.h"

namespace dschat {
namespace {

using testing::close_to_reference;
using testing::DtypeCase;

struct PagedShape {
  int64_t batch, heads, kv_heads, dim, block_size, pool_blocks, longest;
};

struct Frame {
  torch::Tensor slots;           // [B, S] int64 on the GPU
  torch::Tensor mask;            // [B, S] int64 on the GPU
  std::vector<int64_t> lengths;  // [B]
};

// Row 0 holds `longest` tokens, the others 1 + (37 r) % longest; each row's blocks are drawn from
// the pool at random, row r > 0 sharing row 0's first block (a common prompt prefix).
Frame paged_frame(const PagedShape& s, uint32_t seed) {
  std::mt19937 draw(seed);
  std::vector<int64_t> all(s.pool_blocks);
  std::iota(all.begin(), all.end(), 0);
  Frame frame;
  std::vector<int64_t> slots, mask;
  int64_t first_block = -1;
  for (int64_t r = 0; r < s.batch; ++r) {
    const int64_t length = r == 0 ? s.longest : 1 + (37 * r) % s.longest;
    frame.lengths.push_back(length);
    std::shuffle(all.begin(), all.end(), draw);
    std::vector<int64_t> table(all.begin(), all.begin() + (length + s.block_size - 1) / s.block_size);
    if (r == 0) first_block = table[0];
    if (r > 0 && length > s.block_size) table[0] = first_block;
    auto slot = [&](int64_t t) { return table[t / s.block_size] * s.block_size + t % s.block_size; };
    for (int64_t column = 0; column < s.longest; ++column) {
      const int64_t t = column - (s.longest - length);
      slots.push_back(slot(std::max<int64_t>(t, 0)));
      mask.push_back(t >= 0 ? 1 : 0);
    }
  }
  auto on_gpu = [&](std::vector<int64_t>& host) {
    return torch::tensor(host, torch::kInt64).view({s.batch, s.longest}).to(torch::kCUDA);
  };
  frame.slots = on_gpu(slots);
  frame.mask = on_gpu(mask);
  return frame;
}

class PagedDecodeAttentionCuda : public ::testing::TestWithParam<std::tuple<DtypeCase, PagedShape>> {
 protected:
  void SetUp() override { DSCHAT_REQUIRE_CUDA(); }
};

TEST_P(PagedDecodeAttentionCuda, KernelThroughTheSlotsMatchesTheGatheringReference) {
  auto [dc, s] = GetParam();
  torch::manual_seed(s.dim + s.longest);
  auto options = torch::dtype(dc.dtype).device(torch::kCUDA);
  const int64_t slots_in_pool = s.pool_blocks * s.block_size;
  torch::Tensor q = torch::randn({s.batch, s.heads, 1, s.dim}, options);                 // [B, H, 1, D]
  torch::Tensor keys = torch::randn({slots_in_pool, s.kv_heads * s.dim}, options);       // [N, H_kv * D]
  torch::Tensor values = torch::randn({slots_in_pool, s.kv_heads * s.dim}, options);     // [N, H_kv * D]
  const Frame frame = paged_frame(s, static_cast<uint32_t>(s.dim));
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.dim));
  torch::Tensor want = ops::paged_decode_attention_reference(q, keys, values, frame.slots, frame.lengths, scale);
  EXPECT_TRUE(close_to_reference(ops::paged_decode_attention(q, keys, values, frame.slots, frame.lengths, scale),
                                 want, dc.tolerance));
  EXPECT_TRUE(close_to_reference(
      ops::paged_decode_attention(q, keys, values, frame.slots, frame.lengths, scale, frame.mask), want, dc.tolerance));
}

INSTANTIATE_TEST_SUITE_P(
    CUDA, PagedDecodeAttentionCuda,
    ::testing::Combine(::testing::ValuesIn(testing::kernel_dtype_cases()),
                       ::testing::Values(PagedShape{3, 8, 2, 64, 16, 40, 200},      // GQA 4, three lengths
                                         PagedShape{5, 6, 1, 80, 8, 64, 97},        // MQA, D = 80
                                         PagedShape{2, 4, 2, 19, 4, 30, 45},        // odd D: scalar loads
                                         PagedShape{1, 2, 2, 128, 16, 300, 3001},   // split-K
                                         PagedShape{2, 2, 2, 64, 16, 200, 2500},    // split-K, a 38-key row
                                         PagedShape{4, 32, 8, 128, 16, 64, 300})),  // LLaMA-3-like heads
    [](const auto& info) {
      const PagedShape& s = std::get<1>(info.param);
      return testing::dtype_name(std::get<0>(info.param).dtype) + "_B" + std::to_string(s.batch) + "_H" +
             std::to_string(s.heads) + "_Hkv" + std::to_string(s.kv_heads) + "_D" + std::to_string(s.dim) + "_S" +
             std::to_string(s.longest);
    });

}  // namespace
}  // namespace dschat
