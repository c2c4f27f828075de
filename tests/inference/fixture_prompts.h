#pragma once
// The tiny fixtures' left-padded prompts (tools/make_fixtures.py writes them beside the expected
// outputs), shared by the inference suites.

#include <torch/torch.h>

#include <string>

#include "dschat/io/npy.h"
#include "test_util.h"

namespace dschat {
namespace testing {

struct FixturePrompts {
  torch::Tensor ids;   // [B, T] left-padded
  torch::Tensor mask;  // [B, T]
};

inline FixturePrompts fixture_prompts(const std::string& name) {
  auto dir = fixture(name) / "expected";
  return {io::load_npy(dir / "input_ids.npy"), io::load_npy(dir / "attention_mask.npy").to(torch::kInt64)};
}

}  // namespace testing
}  // namespace dschat
