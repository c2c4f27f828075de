#pragma once
// Private to src/inference: one sequence of the continuous engine (a sample of a request), shared
// by its sources (continuous_engine.cpp, continuous_prefill.cpp, continuous_generate.cpp).

#include <ATen/core/Generator.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "dschat/core/generation_config.h"
#include "dschat/inference/continuous_engine.h"

namespace dschat {
namespace inference {

struct ContinuousEngine::Sequence {
  int64_t request = 0, sample = 0;
  core::GenerationConfig config;
  std::vector<int64_t> tokens;  // prompt, then the generated ones; the last one is not cached yet
  int64_t prompt_length = 0;
  int64_t cached = 0;           // tokens whose keys/values are in `blocks`
  std::vector<int64_t> blocks;  // block table
  std::vector<at::Generator> generator;  // one (do_sample only): select_next_tokens' row generators
  int64_t admitted_at = -1;     // admission order: the latest admitted is preempted first
  int64_t preemptions = 0;
  int64_t logprobs = -1;        // SampleOptions::logprobs
  std::shared_ptr<const TokenConstraint> constraint;  // SampleOptions::constraint
  bool fresh = false;           // drew its token in this step's prefill: no decode this step
  bool parked = false;          // prefilled with its siblings, waiting for a decode row (holds
                                // only the shared prompt blocks)
  bool finished = false;
  bool ended_on_eos = false;
  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_length; }
};

}  // namespace inference
}  // namespace dschat
