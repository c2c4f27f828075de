#include "dschat/core/generation_config.h"

#include <cmath>

#include "core/json_object.h"

namespace dschat {
namespace core {
namespace {

// {"50256": -100, ...}: token ids as strings (OpenAI's form), biases as numbers.
std::map<int64_t, double> read_logit_bias(JsonObject& object) {
  std::map<int64_t, double> bias;
  for (const std::string& key : object.unread_keys()) {
    const std::optional<int64_t> id = logit_bias_token_id(key);
    DSCHAT_CHECK(id, ConfigError, object.where(), ": key '", key, "' must be a token id (up to 18 digits)");
    bias[*id] = object.require<double>(key);
  }
  return bias;
}

}  // namespace

std::optional<int64_t> logit_bias_token_id(const std::string& key) {
  if (key.empty() || key.size() > 18 || key.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(key);
}

void validate_generation_config(const GenerationConfig& c, const std::string& where) {
  auto fail = [&](const char* key, const std::string& rule, const std::string& value) {
    DSCHAT_THROW(ConfigError, where, ": key '", key, "' ", rule, ", got ", value);
  };
  if (c.max_new_tokens < 1 || c.max_new_tokens > (int64_t{1} << 20)) fail("max_new_tokens", "must be in [1, 1048576]", std::to_string(c.max_new_tokens));
  if (c.min_new_tokens < 0 || c.min_new_tokens > c.max_new_tokens) fail("min_new_tokens", "must be in [0, max_new_tokens]", std::to_string(c.min_new_tokens));
  if (!(c.temperature > 0.0)) fail("temperature", "must be > 0", std::to_string(c.temperature));
  if (c.top_k < 0) fail("top_k", "must be >= 0", std::to_string(c.top_k));
  if (!(c.top_p > 0.0 && c.top_p <= 1.0)) fail("top_p", "must be in (0, 1]", std::to_string(c.top_p));
  if (c.num_return_sequences < 1 || c.num_return_sequences > 65536) fail("num_return_sequences", "must be in [1, 65536]", std::to_string(c.num_return_sequences));
  if (!(c.repetition_penalty >= 1.0)) fail("repetition_penalty", "must be >= 1", std::to_string(c.repetition_penalty));
  for (const auto& [key, penalty] : {std::pair{"frequency_penalty", c.frequency_penalty},
                                     std::pair{"presence_penalty", c.presence_penalty}}) {
    if (!(std::fabs(penalty) <= 2.0)) fail(key, "must be in [-2, 2]", std::to_string(penalty));
  }
  for (const auto& [id, bias] : c.logit_bias) {
    const std::string key = "logit_bias." + std::to_string(id);
    if (id < 0) fail(key.c_str(), "must name a token id >= 0", std::to_string(id));
    if (!(std::fabs(bias) <= 100.0)) fail(key.c_str(), "must be in [-100, 100]", std::to_string(bias));
  }
}

GenerationConfig parse_generation_config(const std::string& json_text, const std::string& where) {
  nlohmann::json json = parse_json_text(json_text, where);
  JsonObject root(json, where);
  GenerationConfig c;
  c.max_new_tokens = root.get<int64_t>("max_new_tokens", c.max_new_tokens);
  c.min_new_tokens = root.get<int64_t>("min_new_tokens", c.min_new_tokens);
  c.do_sample = root.get<bool>("do_sample", c.do_sample);
  c.temperature = root.get<double>("temperature", c.temperature);
  c.top_k = root.get<int64_t>("top_k", c.top_k);
  c.top_p = root.get<double>("top_p", c.top_p);
  c.repetition_penalty = root.get<double>("repetition_penalty", c.repetition_penalty);
  c.frequency_penalty = root.get<double>("frequency_penalty", c.frequency_penalty);
  c.presence_penalty = root.get<double>("presence_penalty", c.presence_penalty);
  if (auto bias = root.object("logit_bias")) c.logit_bias = read_logit_bias(*bias);
  c.seed = root.get<uint64_t>("seed", c.seed);
  c.num_return_sequences = root.get<int64_t>("num_return_sequences", c.num_return_sequences);
  c.eos_token_id = root.get_optional<int64_t>("eos_token_id");
  c.pad_token_id = root.get_optional<int64_t>("pad_token_id");
  root.finish();
  validate_generation_config(c, where);
  return c;
}

}  // namespace core
}  // namespace dschat
