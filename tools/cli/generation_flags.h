#pragma once
// The decoding flags `dschat generate` and `dschat chat` share (HF GenerationConfig names).

#include <CLI/CLI.hpp>

#include "dschat/core/generation_config.h"

namespace dschat {
namespace cli {

inline void add_generation_flags(CLI::App& cmd, core::GenerationConfig& g) {
  cmd.add_option("--max-new-tokens", g.max_new_tokens)->capture_default_str();
  cmd.add_option("--min-new-tokens", g.min_new_tokens)->capture_default_str();
  cmd.add_flag("--do-sample", g.do_sample, "Sample instead of greedy decoding");
  cmd.add_option("--temperature", g.temperature)->capture_default_str();
  cmd.add_option("--top-k", g.top_k)->capture_default_str();
  cmd.add_option("--top-p", g.top_p)->capture_default_str();
  cmd.add_option("--repetition-penalty", g.repetition_penalty)->capture_default_str();
  cmd.add_option("--frequency-penalty", g.frequency_penalty,
                 "OpenAI's, over the answer: per time a token was generated")
      ->capture_default_str();
  cmd.add_option("--presence-penalty", g.presence_penalty, "OpenAI's, over the answer: once if a token was generated")
      ->capture_default_str();
  cmd.add_option("--seed", g.seed)->capture_default_str();
}

}  // namespace cli
}  // namespace dschat
