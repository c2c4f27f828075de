// The models' fused inference path (a KV cache, no grad: ops::decode_attention, rotary_embedding,
// bias_residual_*_norm, bias_activation, silu_and_mul) against their autograd path (the same
// cached forwards with grad enabled) on the tiny fixtures, prefill then single-token steps over a
// left-padded batch. On the CPU the ops run their references, so this checks the wiring: fp32
// logits within 1e-5 (measured: at most 4.8e-7); bf16 within 0.03, 4 bf16 ulps at the fixtures'
// logit magnitude < 2 (measured: at most 0.0156), since the fused path adds linear biases after
// rounding the GEMM and runs decode attention in fp32.
#include <gtest/gtest.h>

#include "dschat/inference/kv_cache.h"
#include "dschat/models/load_save.h"
#include "dschat/io/npy.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace dschat {
namespace {

// Logits [B, T, V] of a prefill of `split` tokens then one token per step, through a cache.
torch::Tensor cached_logits(models::CausalLM& model, const torch::Tensor& ids, const torch::Tensor& mask,
                            int64_t split, torch::ScalarType dtype) {
  const int64_t t = ids.size(1);
  inference::ContiguousKvCache cache(model->config(), ids.size(0), t, dtype, torch::kCPU);
  std::vector<torch::Tensor> pieces = {model->forward(ids.narrow(1, 0, split), mask.narrow(1, 0, split), &cache)};
  for (int64_t i = split; i < t; ++i) {
    pieces.push_back(model->forward(ids.narrow(1, i, 1), mask.narrow(1, 0, i + 1), &cache));
  }
  return torch::cat(pieces, 1).detach().to(torch::kFloat32);
}

class FusedInferencePathOpTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FusedInferencePathOpTest, MatchesTheAutogradPath) {
  auto dir = testing::fixture(GetParam());
  torch::Tensor ids = io::load_npy(dir / "expected" / "input_ids.npy");        // [B, T]
  torch::Tensor mask = io::load_npy(dir / "expected" / "attention_mask.npy");  // [B, T]
  torch::Tensor keep = mask.to(torch::kBool);
  for (auto [dtype, tolerance] : {std::pair{torch::kFloat32, 1e-5}, std::pair{torch::kBFloat16, 0.03}}) {
    models::LoadOptions options;
    options.dtype = dtype;
    auto model = models::load_causal_lm(dir.string(), options);
    torch::Tensor fused;
    {
      torch::NoGradGuard no_grad;
      fused = cached_logits(model, ids, mask, 4, dtype);
    }
    torch::Tensor autograd = cached_logits(model, ids, mask, 4, dtype);  // grad enabled: the unfused layers
    EXPECT_LT(testing::max_abs_diff(fused.index({keep}), autograd.index({keep})), tolerance) << dtype;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FusedInferencePathOpTest, ::testing::ValuesIn(testing::model_fixtures()), testing::FixtureName());

}  // namespace
}  // namespace dschat
