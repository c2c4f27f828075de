// `dschat tokenize --tokenizer DIR [--text T] [--decode] [--add-special-tokens|--no-special-tokens]`:
// JSON Lines {"text": ...} on stdin -> {"ids": [...]} on stdout (or --text T for one string);
// with --decode, {"ids": [...]} -> {"text": ...}. A bad line stops with its line number.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "dschat/core/error.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string text;
  bool decode = false;
  bool special_tokens = true;
};

nlohmann::json parse_line(const std::string& line, size_t number, const char* key) {
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    DSCHAT_THROW(InvalidArgument, "tokenize: stdin line ", number, ": invalid JSON: ", e.what());
  }
  DSCHAT_CHECK(value.is_object() && value.contains(key), InvalidArgument, "tokenize: stdin line ", number,
               ": expected an object with key '", key, "', got ", value.dump());
  return value[key];
}

void run_tokenize(const TokenizeOptions& options, bool has_text) {
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(options.tokenizer);
  if (has_text) {
    std::cout << nlohmann::json{{"ids", tok.encode(options.text, options.special_tokens)}}.dump() << "\n";
    return;
  }
  std::string line;
  size_t number = 0;
  while (std::getline(std::cin, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (options.decode) {
      nlohmann::json ids = parse_line(line, number, "ids");
      DSCHAT_CHECK(ids.is_array() && std::all_of(ids.begin(), ids.end(), [](const auto& id) { return id.is_number_integer(); }),
                   InvalidArgument, "tokenize: stdin line ", number, ": 'ids' expects an array of integers, got ",
                   ids.dump());
      std::string text = tok.decode(ids.get<std::vector<int64_t>>(), !options.special_tokens);
      std::cout << nlohmann::json{{"text", text}}.dump() << "\n";
    } else {
      nlohmann::json text = parse_line(line, number, "text");
      DSCHAT_CHECK(text.is_string(), InvalidArgument, "tokenize: stdin line ", number,
                   ": 'text' expects a string, got ", text.dump());
      std::cout << nlohmann::json{{"ids", tok.encode(text.get<std::string>(), options.special_tokens)}}.dump() << "\n";
    }
  }
  std::cout.flush();
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand("tokenize", "Encode JSON Lines {\"text\": ...} from stdin to {\"ids\": [...]}");
  cmd->add_option("--tokenizer", options->tokenizer, "Tokenizer directory (tokenizer.json, or vocab.json + merges.txt)")
      ->required();
  auto* text = cmd->add_option("--text", options->text, "Encode this one string instead of reading stdin");
  cmd->add_flag("--decode", options->decode, "Read {\"ids\": [...]} lines and write {\"text\": ...}")->excludes(text);
  cmd->add_flag("--add-special-tokens,!--no-special-tokens", options->special_tokens,
                "Add bos/eos when encoding, keep special tokens when decoding (default: on)");
  cmd->callback([options, text] { run_tokenize(*options, text->count() > 0); });
}

}  // namespace cli
}  // namespace dschat
