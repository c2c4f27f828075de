// Structured output's token mask (serve/json_mode.h) per drawn token: JsonConstraint::allowed over
// a real vocabulary, on JSON mode's schema after replies that stop at different places of an object
// (its first token, in a key, in a long string value, in a number, after a nested value) and on a
// json_schema with declared keys, an enum and an anyOf (in a declared key, in an enum value, in a
// string value, where the anyOf's branches are still open) and one with string and integer keywords
// (in a pattern's string, a maxLength string, a date-time, a bounded integer: every token probed);
// and the one-time reading of the vocabulary's token texts. Prints one JSON line.
//   dschat_json_mode_bench [--tokenizer assets/gpt2-bpe] [--iters 50] [--threads 2]
#include <CLI/CLI.hpp>

#include <chrono>
#include <tuple>
#include <iostream>

#include "dschat/tokenizer/tokenizer.h"
#include "serve/json_mode.h"

int main(int argc, char** argv) {
  CLI::App app{"JSON mode: the token mask's cost per drawn token"};
  std::string tokenizer_dir = std::string(DSCHAT_SOURCE_DIR) + "/assets/gpt2-bpe";
  int64_t iters = 50, threads = 0;
  app.add_option("--tokenizer", tokenizer_dir, "Tokenizer directory");
  app.add_option("--iters", iters);
  app.add_option("--threads", threads, "intra-op threads (0: torch's default)");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) torch::set_num_threads(static_cast<int>(threads));
  using Clock = std::chrono::steady_clock;
  const auto tokenizer = dschat::tokenizer::Tokenizer::load(tokenizer_dir);
  const auto texts_start = Clock::now();
  auto texts = std::make_shared<const std::vector<std::string>>(dschat::serve::token_texts(tokenizer));
  const double texts_ms = std::chrono::duration<double, std::milli>(Clock::now() - texts_start).count();
  const std::vector<int64_t> end_ids = {tokenizer.eos_token_id().value_or(0)};
  const dschat::serve::JsonConstraint json_mode(dschat::serve::json_object_schema(), texts, end_ids);
  const auto schema = dschat::serve::compile_json_schema(nlohmann::ordered_json::parse(R"({"type": "object",
      "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit", "kelvin"]},
        "when": {"anyOf": [{"type": "object", "properties": {"day": {"type": "integer"}}, "required": ["day"]},
                           {"type": "object", "properties": {"date": {"type": "string"}}, "required": ["date"]}]}},
      "required": ["city", "unit", "when"], "additionalProperties": false})"), "schema");
  const dschat::serve::JsonConstraint with_schema(schema, texts, end_ids);
  const auto keyword_schema = dschat::serve::compile_json_schema(nlohmann::ordered_json::parse(R"({"type": "object",
      "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "note": {"type": "string", "maxLength": 200},
        "when": {"type": "string", "format": "date-time"}, "n": {"type": "integer", "minimum": 10, "maximum": 999}},
      "required": ["zip", "note", "when", "n"]})"), "schema");
  const dschat::serve::JsonConstraint with_keywords(keyword_schema, texts, end_ids);
  const std::string keyword_reply = "{\"zip\": \"12345\", \"note\": \"A long note that goes on and on";
  const int64_t vocab = tokenizer.vocab_size();
  const std::tuple<const char*, const dschat::serve::JsonConstraint*, std::string> replies[] = {
      {"start", &json_mode, ""},
      {"key", &json_mode, "{\"temperat"},
      {"string", &json_mode, "{\"summary\": \"A long answer that goes on and on about the weather in Paris"},
      {"number", &json_mode, "{\"city\": \"Paris\", \"temp\": 21.5"},
      {"nested", &json_mode, "{\"a\": {\"b\": [1, 2, {\"c\": null}]}"},
      {"schema_key", &with_schema, "{\"ci"},
      {"schema_enum", &with_schema, "{\"city\": \"Paris\", \"unit\": \"ce"},
      {"schema_string", &with_schema, "{\"city\": \"A long city name that goes on and on"},
      {"schema_any_of", &with_schema, "{\"city\": \"Paris\", \"unit\": \"kelvin\", \"when\": {\""},
      {"keyword_pattern", &with_keywords, "{\"zip\": \"12"},
      {"keyword_length", &with_keywords, keyword_reply},
      {"keyword_format", &with_keywords, keyword_reply + "\", \"when\": \"2024-0"},
      {"keyword_integer", &with_keywords, keyword_reply + "\", \"when\": \"2024-01-01T00:00:00Z\", \"n\": 1"},
  };
  std::cout << "{\"vocab\": " << vocab << ", \"threads\": " << torch::get_num_threads()
            << ", \"token_texts_ms\": " << texts_ms;
  for (const auto& [name, constraint, text] : replies) {
    const std::vector<int64_t> generated = tokenizer.encode(text, /*add_special_tokens=*/false);
    int64_t allowed = constraint->allowed(generated, vocab).sum().item<int64_t>();
    const auto start = Clock::now();
    for (int64_t i = 0; i < iters; ++i) allowed = constraint->allowed(generated, vocab).sum().item<int64_t>();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count() / iters;
    std::cout << ", \"" << name << "_ms\": " << ms << ", \"" << name << "_allowed\": " << allowed;
  }
  std::cout << "}" << std::endl;
  return 0;
}
