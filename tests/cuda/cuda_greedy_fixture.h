#pragma once
// Shared by the CUDA engine tests: a tiny fixture's prompts, transformers' greedy continuation of
// them (tools/make_fixtures.py) and the model, loaded onto the GPU.

#include <torch/torch.h>

#include <filesystem>

#include "dschat/io/npy.h"
#include "dschat/models/load_save.h"

namespace dschat {
namespace testing {

struct GreedyFixtureOnCuda {
  torch::Tensor ids;       // [B, T] left-padded, on the GPU
  torch::Tensor mask;      // [B, T] on the GPU
  torch::Tensor expected;  // [B, T + N] transformers' greedy ids, on the CPU
  models::CausalLM model{nullptr};
};

inline GreedyFixtureOnCuda load_greedy_fixture_on_cuda(const std::filesystem::path& dir) {
  GreedyFixtureOnCuda f;
  f.ids = io::load_npy(dir / "expected" / "input_ids.npy").to(torch::kCUDA);
  f.mask = io::load_npy(dir / "expected" / "attention_mask.npy").to(torch::kCUDA);
  f.expected = io::load_npy(dir / "expected" / "greedy.npy");
  models::LoadOptions load;
  load.device = torch::kCUDA;
  f.model = models::load_causal_lm(dir.string(), load);
  return f;
}

}  // namespace testing
}  // namespace dschat
