// The models' fused inference path on the GPU, end to end on the tiny fixtures (left-padded
// batches): greedy generation in fp32 gives transformers' ids, and cached decoding through the
// kernels matches the same cached forwards with grad enabled (the unfused autograd path: cuBLAS
// with bias epilogues, SDPA, ATen norms). Logit tolerances: fp32 1e-4; fp16 1e-2; bf16 0.06
// (8 bf16 ulps at logits < 2: SDPA's bf16 kernels round the probabilities before P.V, the decode
// kernel keeps them in fp32, and the fused path adds linear biases after rounding the GEMM).
// Skips without a GPU.
#include <gtest/gtest.h>

#include "cuda/cuda_cases.h"
#include "dschat/inference/generate.h"
#include "dschat/inference/kv_cache.h"
#include "dschat/models/load_save.h"
#include "dschat/io/npy.h"
#include "model_fixtures.h"

namespace dschat {
namespace {

// Logits [B, T, V] (fp32, CPU) of a prefill of `split` tokens then one token per step.
torch::Tensor cached_logits(models::CausalLM& model, const torch::Tensor& ids, const torch::Tensor& mask,
                            int64_t split, torch::ScalarType dtype) {
  const int64_t t = ids.size(1);
  inference::ContiguousKvCache cache(model->config(), ids.size(0), t, dtype, ids.device());
  std::vector<torch::Tensor> pieces = {model->forward(ids.narrow(1, 0, split), mask.narrow(1, 0, split), &cache)};
  for (int64_t i = split; i < t; ++i) {
    pieces.push_back(model->forward(ids.narrow(1, i, 1), mask.narrow(1, 0, i + 1), &cache));
  }
  return torch::cat(pieces, 1).detach().to(torch::kCPU, torch::kFloat32);
}

class InferencePathCuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { DSCHAT_REQUIRE_CUDA(); }
  std::filesystem::path dir() const { return testing::fixture(GetParam()); }
};

TEST_P(InferencePathCuda, GreedyIdsMatchTransformers) {
  torch::Tensor ids = io::load_npy(dir() / "expected" / "input_ids.npy").to(torch::kCUDA);        // [B, T]
  torch::Tensor mask = io::load_npy(dir() / "expected" / "attention_mask.npy").to(torch::kCUDA);  // [B, T]
  torch::Tensor expected = io::load_npy(dir() / "expected" / "greedy.npy");                       // [B, T + N]
  models::LoadOptions options;
  options.device = torch::kCUDA;
  auto model = models::load_causal_lm(dir().string(), options);
  core::GenerationConfig config;
  config.max_new_tokens = expected.size(1) - ids.size(1);
  auto result = inference::generate(model, ids, mask, config);
  EXPECT_TRUE(torch::equal(result.sequences.cpu(), expected)) << result.sequences << "\nexpected\n" << expected;
}

TEST_P(InferencePathCuda, FusedKernelsMatchTheAutogradPath) {
  torch::Tensor ids = io::load_npy(dir() / "expected" / "input_ids.npy").to(torch::kCUDA);
  torch::Tensor mask = io::load_npy(dir() / "expected" / "attention_mask.npy").to(torch::kCUDA);
  torch::Tensor keep = mask.cpu().to(torch::kBool);
  for (auto [dtype, tolerance] :
       {std::pair{torch::kFloat32, 1e-4}, std::pair{torch::kFloat16, 1e-2}, std::pair{torch::kBFloat16, 0.06}}) {
    models::LoadOptions options;
    options.dtype = dtype;
    options.device = torch::kCUDA;
    auto model = models::load_causal_lm(dir().string(), options);
    torch::Tensor fused;
    {
      torch::NoGradGuard no_grad;
      fused = cached_logits(model, ids, mask, 4, dtype);
    }
    torch::Tensor autograd = cached_logits(model, ids, mask, 4, dtype);
    EXPECT_LT(testing::max_abs_diff(fused.index({keep}), autograd.index({keep})), tolerance) << dtype;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, InferencePathCuda, ::testing::ValuesIn(testing::model_fixtures()), testing::FixtureName());

}  // namespace
}  // namespace dschat
