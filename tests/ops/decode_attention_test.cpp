// decode_attention on the CPU (its ATen reference): against what nn::Attention computed for a
// single-token step before the op existed (SDPA over the repeat_interleaved cache with
// nn::causal_attention_bias) and against float64, with odd head dims, cache lengths that are not
// a multiple of the kernel's 128-key tile, GQA, left padding, fully masked rows, strided views,
// and named argument errors. fp32 tolerance 1e-5 absolute on outputs of magnitude <= ~3.
// Also the CPU loop paged_decode_attention runs (src/ops/cpu_decode_attention.h): the same bits
// from every instruction set's build of it and every split of a row into tasks.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "dschat/nn/attention.h"
#include "dschat/ops/decode_attention.h"
#include "ops/cpu_decode_attention.h"
#include "test_util.h"

namespace dschat {
namespace {

using testing::max_abs_diff;

struct Shape {
  int64_t batch, heads, kv_heads, dim, capacity, length;
};

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  const Shape& s = info.param;
  return "B" + std::to_string(s.batch) + "_H" + std::to_string(s.heads) + "_Hkv" + std::to_string(s.kv_heads) + "_D" +
         std::to_string(s.dim) + "_S" + std::to_string(s.length) + "of" + std::to_string(s.capacity);
}

// Left padding: row r has r * 3 % length leading zeros (row 0 none).
torch::Tensor left_padded_mask(int64_t batch, int64_t length) {
  torch::Tensor mask = torch::ones({batch, length}, torch::kInt64);  // [B, S]
  for (int64_t r = 0; r < batch; ++r) mask[r].narrow(0, 0, r * 3 % length).zero_();
  return mask;
}

// nn::Attention's path before the op: SDPA with the additive dtype-min bias of the last position.
torch::Tensor sdpa_path(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                        const torch::Tensor& mask, int64_t length, double scale) {
  const int64_t groups = q.size(1) / k_cache.size(1);
  torch::Tensor k = k_cache.narrow(2, 0, length).repeat_interleave(groups, 1);  // [B, H, S, D]
  torch::Tensor v = v_cache.narrow(2, 0, length).repeat_interleave(groups, 1);  // [B, H, S, D]
  torch::Tensor bias = nn::causal_attention_bias(mask, 1, q.scalar_type());    // [B, 1, 1, S]
  return at::scaled_dot_product_attention(q, k, v, bias, 0.0, false, scale);    // [B, H, 1, D]
}

// The formula in float64, masked keys at float32's lowest (fp32 inputs).
torch::Tensor float64_formula(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                              const torch::Tensor& mask, int64_t length, double scale) {
  const int64_t groups = q.size(1) / k_cache.size(1);
  torch::Tensor k = k_cache.narrow(2, 0, length).repeat_interleave(groups, 1).to(torch::kFloat64);
  torch::Tensor v = v_cache.narrow(2, 0, length).repeat_interleave(groups, 1).to(torch::kFloat64);
  torch::Tensor scores = torch::matmul(q.to(torch::kFloat64), k.transpose(2, 3)) * scale;  // [B, H, 1, S]
  scores = scores.masked_fill(mask.eq(0).view({mask.size(0), 1, 1, length}), std::numeric_limits<float>::lowest());
  return torch::matmul(scores.softmax(-1), v);  // [B, H, 1, D]
}

class DecodeAttentionOpTest : public ::testing::TestWithParam<Shape> {};

TEST_P(DecodeAttentionOpTest, MatchesTheSdpaPathAndFloat64) {
  const Shape s = GetParam();
  torch::manual_seed(s.dim * 7 + s.length);
  torch::Tensor q = torch::randn({s.batch, s.heads, 1, s.dim});                      // [B, H, 1, D]
  torch::Tensor k_cache = torch::randn({s.batch, s.kv_heads, s.capacity, s.dim});    // [B, H_kv, S_max, D]
  torch::Tensor v_cache = torch::randn({s.batch, s.kv_heads, s.capacity, s.dim});    // [B, H_kv, S_max, D]
  torch::Tensor mask = left_padded_mask(s.batch, s.length);                           // [B, S]
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.dim));
  torch::Tensor got = ops::decode_attention(q, k_cache, v_cache, mask, s.length, scale);
  ASSERT_EQ(got.sizes(), q.sizes());
  EXPECT_LT(max_abs_diff(got, sdpa_path(q, k_cache, v_cache, mask, s.length, scale)), 1e-5);
  EXPECT_LT(max_abs_diff(got, float64_formula(q, k_cache, v_cache, mask, s.length, scale)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, DecodeAttentionOpTest,
                         ::testing::Values(Shape{1, 4, 4, 64, 16, 9},      // MHA, short
                                           Shape{5, 8, 2, 80, 300, 257},   // GQA 4, D = 80, 2 tiles + 1
                                           Shape{5, 6, 3, 96, 40, 33},     // GQA 2, D = 96
                                           Shape{1, 2, 1, 8, 1, 1},        // one key
                                           Shape{3, 4, 1, 19, 150, 129}),  // MQA, odd D, tile + 1
                         shape_name);

TEST(DecodeAttentionOpCpuTest, FullyMaskedRowAveragesValuesUniformly) {
  torch::Tensor q = torch::randn({2, 4, 1, 16});
  torch::Tensor k_cache = torch::randn({2, 2, 12, 16});
  torch::Tensor v_cache = torch::randn({2, 2, 12, 16});
  torch::Tensor mask = torch::ones({2, 10}, torch::kInt64);
  mask[1].zero_();  // row 1: every key is padding
  torch::Tensor got = ops::decode_attention(q, k_cache, v_cache, mask, 10, 0.25);
  EXPECT_FALSE(got.isnan().any().item<bool>());
  torch::Tensor mean = v_cache[1].narrow(1, 0, 10).mean(1).repeat_interleave(2, 0);  // [H, D]
  EXPECT_LT(max_abs_diff(got[1].squeeze(1), mean), 1e-6);
  EXPECT_LT(max_abs_diff(got, sdpa_path(q, k_cache, v_cache, mask, 10, 0.25)), 1e-5);
}

TEST(DecodeAttentionOpCpuTest, UndefinedMaskMeansAllReal) {
  torch::Tensor q = torch::randn({3, 2, 1, 8}), k = torch::randn({3, 2, 7, 8}), v = torch::randn({3, 2, 7, 8});
  torch::Tensor all_real = torch::ones({3, 5}, torch::kBool);  // bool masks are taken too
  EXPECT_TRUE(torch::equal(ops::decode_attention(q, k, v, torch::Tensor(), 5, 0.5),
                           ops::decode_attention(q, k, v, all_real, 5, 0.5)));
}

TEST(DecodeAttentionOpCpuTest, StridedViewsGiveTheContiguousResult) {
  // q as nn::Attention makes it ([B, T, H, D] transposed), a cache stored [B, S, H_kv, D] and
  // viewed as [B, H_kv, S, D], a mask sliced out of a wider one.
  torch::Tensor q = torch::randn({5, 1, 6, 24}).transpose(1, 2);          // [5, 6, 1, 24]
  torch::Tensor k = torch::randn({5, 50, 2, 24}).transpose(1, 2);         // [5, 2, 50, 24]
  torch::Tensor v = torch::randn({5, 50, 2, 24}).transpose(1, 2);         // [5, 2, 50, 24]
  torch::Tensor mask = left_padded_mask(5, 60).narrow(1, 20, 37);         // [5, 37], row stride 60
  torch::Tensor got = ops::decode_attention(q, k, v, mask, 37, 0.2);
  torch::Tensor want = ops::decode_attention(q.contiguous(), k.contiguous(), v.contiguous(), mask.contiguous(), 37, 0.2);
  EXPECT_LT(max_abs_diff(got, want), 1e-6);
}

TEST(DecodeAttentionOpCpuTest, HalfPrecisionReferenceRoundsOnlyTheOutput) {
  // Scores, softmax and the sum run in fp32, so the result is the fp32 result over the same
  // (rounded) inputs, rounded once: half an ulp. Outputs stay below 4 in magnitude; the bound is
  // 6 ulps at 1 (bf16 2^-7, fp16 2^-10), at least 1.5 ulps of any output.
  torch::Tensor q = torch::randn({2, 4, 1, 32}), k = torch::randn({2, 2, 40, 32}), v = torch::randn({2, 2, 40, 32});
  torch::Tensor mask = left_padded_mask(2, 33);
  for (auto [dtype, ulp] : {std::pair{torch::kBFloat16, 1.0 / 128}, std::pair{torch::kFloat16, 1.0 / 1024}}) {
    torch::Tensor qh = q.to(dtype), kh = k.to(dtype), vh = v.to(dtype);
    torch::Tensor got = ops::decode_attention(qh, kh, vh, mask, 33, 0.3);
    EXPECT_EQ(got.scalar_type(), dtype);
    torch::Tensor exact = ops::decode_attention(qh.to(torch::kFloat32), kh.to(torch::kFloat32), vh.to(torch::kFloat32),
                                                mask, 33, 0.3);
    EXPECT_LT(max_abs_diff(got, exact), 6.0 * ulp) << dtype;
  }
}

TEST(DecodeAttentionOpCpuTest, ReferenceIsDifferentiable) {
  torch::Tensor q = torch::randn({1, 2, 1, 8}, torch::kFloat64).requires_grad_(true);
  torch::Tensor k = torch::randn({1, 1, 6, 8}, torch::kFloat64), v = torch::randn({1, 1, 6, 8}, torch::kFloat64);
  ops::decode_attention(q, k, v, torch::Tensor(), 6, 0.5).sum().backward();
  ASSERT_TRUE(q.grad().defined());
  EXPECT_FALSE(q.grad().isnan().any().item<bool>());
}

// The baseline, AVX and AVX-512 loops compute every element with the same operations, and a task
// over one, two or all three kv heads of a row (at 1 and 2 threads) does too: the same bits, a head
// dim with a tail (D = 40: two 16-float blocks and 8), rows of 37, 36 and 35 keys (more than the
// value pass's 16-key chunk, and not a multiple of it).
TEST(DecodeAttentionOpCpuTest, EveryInstructionSetAndTaskSplitGivesTheSameBits) {
  using ops::detail::SkinnyIsa;
  torch::manual_seed(23);
  const int64_t batch = 3, heads = 6, kv_heads = 3, dim = 40, length = 37;
  torch::Tensor q = torch::randn({batch, heads, 1, dim});      // [B, H, 1, D]
  torch::Tensor k = torch::randn({batch, kv_heads, length, dim});  // [B, H_kv, S, D]
  torch::Tensor v = torch::randn({batch, kv_heads, length, dim});  // [B, H_kv, S, D]
  auto run = [&](SkinnyIsa isa, int64_t kv_heads_per_task) {
    torch::Tensor out = torch::empty({batch, heads, 1, dim});  // [B, H, 1, D]
    ops::detail::CpuDecodeAttentionArgs args;
    args.q = q.data_ptr<float>();
    args.out = out.data_ptr<float>();
    args.batch = batch;
    args.heads = heads;
    args.kv_heads = kv_heads;
    args.dim = dim;
    args.k = k.data_ptr<float>();
    args.v = v.data_ptr<float>();
    args.k_head_stride = args.v_head_stride = k.stride(1);
    args.row_begin = {0};
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = b; t < length; ++t) args.key_offsets.push_back(b * k.stride(0) + t * k.stride(2));  // b masked
      args.row_begin.push_back(static_cast<int64_t>(args.key_offsets.size()));
    }
    args.value_offsets = args.key_offsets;
    args.scale = 0.15f;
    args.kv_heads_per_task = kv_heads_per_task;
    ops::detail::cpu_decode_attention(args, isa);
    return out;
  };
  const int threads = at::get_num_threads();
  const torch::Tensor baseline = run(SkinnyIsa::kBaseline, 1);
  EXPECT_FALSE(baseline.isnan().any().item<bool>());
  for (int thread_count : {1, 2}) {
    at::set_num_threads(thread_count);
    for (SkinnyIsa isa : {SkinnyIsa::kBaseline, SkinnyIsa::kAvx, SkinnyIsa::kAvx512}) {
      if (!ops::detail::skinny_isa_supported(isa)) continue;
      for (int64_t per_task : {0, 1, 2, 3}) {
        EXPECT_TRUE(torch::equal(run(isa, per_task), baseline))
            << "isa " << static_cast<int>(isa) << ", kv heads per task " << per_task << ", threads " << thread_count;
      }
    }
  }
  at::set_num_threads(threads);
}

TEST(DecodeAttentionOpCpuTest, BadArgumentsAreNamed) {
  torch::Tensor q = torch::randn({2, 4, 1, 8}), k = torch::randn({2, 2, 10, 8}), v = torch::randn({2, 2, 10, 8});
  torch::Tensor mask = torch::ones({2, 6}, torch::kInt64);
  EXPECT_THROW_WITH(ops::decode_attention(torch::randn({2, 4, 3, 8}), k, v, mask, 6, 1.0), core::InvalidArgument,
                    "decode_attention: expected q of shape [B, H, 1, D], got [2, 4, 3, 8]");
  EXPECT_THROW_WITH(ops::decode_attention(q, k, torch::randn({2, 2, 9, 8}), mask, 6, 1.0), core::InvalidArgument,
                    "expected k_cache and v_cache of one shape");
  EXPECT_THROW_WITH(ops::decode_attention(q, torch::randn({2, 3, 10, 8}), torch::randn({2, 3, 10, 8}), mask, 6, 1.0),
                    core::InvalidArgument, "q's heads (4) must be a multiple of the cache's kv heads (3)");
  EXPECT_THROW_WITH(ops::decode_attention(q, k, v, mask, 11, 1.0), core::InvalidArgument,
                    "length 11 outside [1, S_max = 10]");
  EXPECT_THROW_WITH(ops::decode_attention(q, k, v, mask, 7, 1.0), core::InvalidArgument,
                    "expected attention_mask of shape [2, 7] ([B, length]), got [2, 6]");
  EXPECT_THROW_WITH(ops::decode_attention(q, k.to(torch::kFloat16), v, mask, 6, 1.0), core::InvalidArgument,
                    "must have one dtype");
  EXPECT_THROW_WITH(ops::decode_attention(q, k.to(torch::kMeta), v, mask, 6, 1.0), core::InvalidArgument,
                    "must be on one device");
  EXPECT_THROW_WITH(ops::decode_attention_reference(q, k, v, mask.to(torch::kMeta), 6, 1.0), core::InvalidArgument,
                    "attention_mask is on meta");
}

}  // namespace
}  // namespace dschat
