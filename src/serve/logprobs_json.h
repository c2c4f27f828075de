#pragma once
// The "logprobs" objects of OpenAI's answers, built from scored tokens (inference/token_logprobs.h).
// Private to src/serve.
//
//   completions: {"tokens": ["Hello", ...], "token_logprobs": [null, -2.1, ...],
//                 "top_logprobs": [null, {" world": -0.7, ...}, ...], "text_offset": [0, 5, ...]}
//     top_logprobs holds the N most likely tokens and the drawn one (so up to N + 1 entries, as
//     OpenAI's legacy API); the echoed prompt's first token has null entries (nothing precedes it).
//   chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
//                 "bytes"}, ...]}, ...]} with exactly the N most likely in top_logprobs.
// A token's text is its id decoded alone (special tokens kept); "bytes" are that text's UTF-8
// bytes, so a byte-level token holding part of a character shows U+FFFD. text_offset counts
// characters (code points) of the text decoded from the tokens before it.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#include "dschat/inference/token_logprobs.h"
#include "dschat/tokenizer/tokenizer.h"
#include "serve/openai_protocol.h"

namespace dschat {
namespace serve {

/// One choice's log-probs, piece by piece: each call continues where the last one ended (a
/// stream's chunks; a whole answer is one call).
class ChoiceLogprobs {
 public:
  ChoiceLogprobs(const tokenizer::Tokenizer& tokenizer, Endpoint endpoint);
  nlohmann::json next(const std::vector<inference::ScoredToken>& tokens);

 private:
  nlohmann::json completions(const std::vector<inference::ScoredToken>& tokens);
  nlohmann::json chat(const std::vector<inference::ScoredToken>& tokens) const;
  std::string text_of(int64_t id) const;

  const tokenizer::Tokenizer* tokenizer_;
  Endpoint endpoint_;
  std::vector<int64_t> ids_;  // the tokens of earlier calls (text_offset)
};

}  // namespace serve
}  // namespace dschat
