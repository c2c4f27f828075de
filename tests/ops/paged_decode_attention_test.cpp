// ops::paged_decode_attention's CPU kernel (keys and values read in place through each row's
// slots) against its reference (gather, then decode_attention_reference under the key mask) and a
// float64 oracle, with grouped-query heads, rows of different lengths and scattered slots; its
// argument checks name the bad argument.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include "dschat/core/error.h"
#include "dschat/ops/paged_decode_attention.h"
#include "test_util.h"

namespace dschat {
namespace {

struct Case {
  torch::Tensor q;            // [B, H, 1, D]
  torch::Tensor keys, values;  // [N, H_kv * D]
  torch::Tensor slots;        // [B, S]
  std::vector<int64_t> lengths;
};

// Rows of `lengths` tokens in a pool of 64 slots, each row's slots a random permutation's prefix.
Case make_case(int64_t heads, int64_t kv_heads, int64_t dim, std::vector<int64_t> lengths, int64_t seed) {
  torch::manual_seed(seed);
  const int64_t batch = static_cast<int64_t>(lengths.size());
  const int64_t width = *std::max_element(lengths.begin(), lengths.end());
  Case c;
  c.q = torch::randn({batch, heads, 1, dim});
  c.keys = torch::randn({64, kv_heads * dim});
  c.values = torch::randn({64, kv_heads * dim});
  c.slots = torch::zeros({batch, width}, torch::kInt64);  // padding columns read slot 0 and are masked
  for (int64_t b = 0; b < batch; ++b) {
    c.slots[b].narrow(0, width - lengths[b], lengths[b]).copy_(torch::randperm(64, torch::kInt64).narrow(0, 0, lengths[b]));
  }
  c.lengths = std::move(lengths);
  return c;
}

// softmax(q k^T * scale) v in float64, row by row over its own slots.
torch::Tensor oracle(const Case& c, double scale) {
  const int64_t batch = c.q.size(0), heads = c.q.size(1), dim = c.q.size(3);
  const int64_t kv_heads = c.keys.size(1) / dim, width = c.slots.size(1);
  torch::Tensor out = torch::zeros({batch, heads, 1, dim}, torch::kFloat64);  // [B, H, 1, D]
  for (int64_t b = 0; b < batch; ++b) {
    torch::Tensor rows = c.slots[b].narrow(0, width - c.lengths[b], c.lengths[b]);                      // [L]
    torch::Tensor k = c.keys.index_select(0, rows).view({-1, kv_heads, dim}).to(torch::kFloat64);    // [L, H_kv, D]
    torch::Tensor v = c.values.index_select(0, rows).view({-1, kv_heads, dim}).to(torch::kFloat64);  // [L, H_kv, D]
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t j = h / (heads / kv_heads);
      torch::Tensor p = (k.select(1, j).matmul(c.q[b][h][0].to(torch::kFloat64)) * scale).softmax(0);  // [L]
      out[b][h][0] = p.matmul(v.select(1, j));
    }
  }
  return out;
}

TEST(PagedDecodeAttention, CpuKernelMatchesTheReferenceAndAFloat64Oracle) {
  for (const auto& [heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 2}, {6, 1}}) {
    for (int64_t dim : {16, 24, 64}) {
      const Case c = make_case(heads, kv_heads, dim, {5, 1, 17, 9}, heads * 100 + dim);
      const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
      torch::Tensor kernel = ops::paged_decode_attention(c.q, c.keys, c.values, c.slots, c.lengths, scale);  // [B, H, 1, D]
      torch::Tensor reference = ops::paged_decode_attention_reference(c.q, c.keys, c.values, c.slots, c.lengths, scale);
      // Outputs are convex combinations of N(0, 1) values: 1e-5 absolute is fp32 noise for them.
      EXPECT_LT(testing::max_abs_diff(kernel, reference), 1e-5) << heads << "/" << kv_heads << " heads, D " << dim;
      EXPECT_LT(testing::max_abs_diff(kernel.to(torch::kFloat64), oracle(c, scale)), 1e-5);
    }
  }
}

TEST(PagedDecodeAttention, TheSameBitsAtAnyThreadCount) {
  const Case c = make_case(8, 2, 64, {33, 7, 60, 1, 12}, 5);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  torch::Tensor one = ops::paged_decode_attention(c.q, c.keys, c.values, c.slots, c.lengths, 0.125);
  at::set_num_threads(std::max(2, threads));
  torch::Tensor many = ops::paged_decode_attention(c.q, c.keys, c.values, c.slots, c.lengths, 0.125);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, many));
}

TEST(PagedDecodeAttention, BadArgumentsAreNamed) {
  const Case c = make_case(4, 4, 16, {3, 2}, 1);
  EXPECT_THROW_WITH(ops::paged_decode_attention(c.q.squeeze(2), c.keys, c.values, c.slots, c.lengths, 1.0),
                    core::InvalidArgument, "expected q of shape [B, H, 1, D]");
  EXPECT_THROW_WITH(ops::paged_decode_attention(c.q, c.keys, c.values, c.slots, {3}, 1.0), core::InvalidArgument,
                    "1 lengths for 2 rows");
  EXPECT_THROW_WITH(ops::paged_decode_attention(c.q, c.keys, c.values, c.slots, {3, 4}, 1.0), core::InvalidArgument,
                    "length 4 outside [1, S = 3]");
  EXPECT_THROW_WITH(ops::paged_decode_attention(c.q, c.keys.narrow(1, 0, 48), c.values.narrow(1, 0, 48), c.slots,
                                                c.lengths, 1.0),
                    core::InvalidArgument, "q's heads (4) must be a multiple of the pool's kv heads");
  EXPECT_THROW_WITH(ops::paged_decode_attention(c.q, c.keys, c.values, c.slots.to(torch::kInt32), c.lengths, 1.0),
                    core::InvalidArgument, "expected int64 slots");
  EXPECT_THROW_WITH(ops::paged_decode_attention(c.q, c.keys, c.values, c.slots, c.lengths, 1.0,
                                                torch::ones({2, 4}, torch::kInt64)),
                    core::InvalidArgument, "expected an int64 key_mask of the slots' shape [2, 3]");
}

}  // namespace
}  // namespace dschat
