#pragma once
// Text in, text out: tokenize prompts (left-padded), generate, decode the new tokens.

#include <string>
#include <vector>

#include "dschat/core/generation_config.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/models/causal_lm.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace inference {

/// One completion per prompt (the new text only, special tokens dropped). EOS and pad default to
/// the tokenizer's when the config leaves them unset.
std::vector<std::string> generate_text(models::CausalLM& model, const tokenizer::Tokenizer& tokenizer,
                                       const std::vector<std::string>& prompts, core::GenerationConfig config);

/// The same through `engine` (its workspace, statistics and options: max_out_tokens, CUDA graphs).
std::vector<std::string> generate_text(InferenceEngine& engine, const tokenizer::Tokenizer& tokenizer,
                                       const std::vector<std::string>& prompts, core::GenerationConfig config);

}  // namespace inference
}  // namespace dschat
