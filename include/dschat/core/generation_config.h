#pragma once
// How to continue a prompt: lengths, stopping and sampling. Field names and defaults follow
// Hugging Face's GenerationConfig; parse_generation_config reads the same keys from JSON.

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace dschat {
namespace core {

struct GenerationConfig {
  int64_t max_new_tokens = 32;
  int64_t min_new_tokens = 0;          // EOS is suppressed until this many tokens exist
  bool do_sample = false;              // false: greedy
  double temperature = 1.0;            // > 0
  int64_t top_k = 0;                   // 0: off
  double top_p = 1.0;                  // (0, 1]; 1: off
  double repetition_penalty = 1.0;     // >= 1 divides positive / multiplies negative logits of seen tokens
  // OpenAI's penalties over the tokens generated so far (not the prompt), in [-2, 2]: a token's
  // logit loses frequency_penalty per time it was generated and presence_penalty once if it was.
  double frequency_penalty = 0.0;
  double presence_penalty = 0.0;
  std::map<int64_t, double> logit_bias;  // token id -> added to its logit, in [-100, 100] (OpenAI's)
  uint64_t seed = 42;                  // sampling is reproducible for a given seed
  int64_t num_return_sequences = 1;    // answers per prompt, adjacent rows; the prompt is prefilled
                                       // once and its KV cache shared by its n samples
  std::optional<int64_t> eos_token_id; // none: always generate max_new_tokens
  std::optional<int64_t> pad_token_id; // written after a row's EOS; defaults to EOS (or 0)
};

/// A logit_bias key as OpenAI writes it (the token id in decimal digits, at most 18) -> the id;
/// nullopt for anything else.
std::optional<int64_t> logit_bias_token_id(const std::string& key);

/// Parses a JSON object with the fields above; unknown keys are errors that suggest the nearest
/// key; values are range-checked. `where` (a file name) prefixes every message.
GenerationConfig parse_generation_config(const std::string& json_text, const std::string& where);

/// Throws core::ConfigError when a field is out of range (also used for CLI-built configs).
void validate_generation_config(const GenerationConfig& config, const std::string& where);

}  // namespace core
}  // namespace dschat
