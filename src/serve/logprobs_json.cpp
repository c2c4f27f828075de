#include "serve/logprobs_json.h"

#include <cmath>

namespace dschat {
namespace serve {
namespace {

using nlohmann::json;

// NaN (the first echoed token: no log-prob) -> null.
json number_or_null(float logprob) { return std::isnan(logprob) ? json(nullptr) : json(logprob); }

int64_t code_points(const std::string& text) {
  int64_t count = 0;
  for (unsigned char c : text) count += (c & 0xC0) != 0x80;  // every byte but continuation bytes
  return count;
}

json bytes_of(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

ChoiceLogprobs::ChoiceLogprobs(const tokenizer::Tokenizer& tokenizer, Endpoint endpoint)
    : tokenizer_(&tokenizer), endpoint_(endpoint) {}

std::string ChoiceLogprobs::text_of(int64_t id) const { return tokenizer_->decode({id}, /*skip_special_tokens=*/false); }

json ChoiceLogprobs::next(const std::vector<inference::ScoredToken>& tokens) {
  return endpoint_ == Endpoint::kChat ? chat(tokens) : completions(tokens);
}

json ChoiceLogprobs::completions(const std::vector<inference::ScoredToken>& tokens) {
  json texts = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
  for (const inference::ScoredToken& scored : tokens) {
    texts.push_back(text_of(scored.token));
    logprobs.push_back(number_or_null(scored.logprob));
    offsets.push_back(code_points(tokenizer_->decode(ids_, /*skip_special_tokens=*/true)));
    ids_.push_back(scored.token);
    if (std::isnan(scored.logprob)) {
      tops.push_back(nullptr);
      continue;
    }
    // Two ids with one text (rare: both decode to U+FFFD) share a key: it keeps the larger.
    json top = json::object();
    const auto add = [&](int64_t id, float logprob) {
      const std::string key = text_of(id);
      if (!top.contains(key) || top[key].get<float>() < logprob) top[key] = logprob;
    };
    for (const inference::TokenLogprob& alternative : scored.top) add(alternative.token, alternative.logprob);
    add(scored.token, scored.logprob);
    tops.push_back(std::move(top));
  }
  return json{{"tokens", texts}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json ChoiceLogprobs::chat(const std::vector<inference::ScoredToken>& tokens) const {
  json content = json::array();
  for (const inference::ScoredToken& scored : tokens) {
    const std::string text = text_of(scored.token);
    json top = json::array();
    for (const inference::TokenLogprob& alternative : scored.top) {
      const std::string alternative_text = text_of(alternative.token);
      top.push_back({{"token", alternative_text}, {"logprob", alternative.logprob}, {"bytes", bytes_of(alternative_text)}});
    }
    content.push_back({{"token", text}, {"logprob", number_or_null(scored.logprob)}, {"bytes", bytes_of(text)},
                       {"top_logprobs", top}});
  }
  return json{{"content", content}};
}

}  // namespace serve
}  // namespace dschat
