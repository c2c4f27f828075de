#include "tokenizer/tokenizer_config.h"

#include <algorithm>
#include <map>

#include "core/json_object.h"
#include "dschat/core/error.h"

namespace dschat {
namespace tokenizer {
namespace {

const char* const kNamedKeys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                  "pad_token", "cls_token", "mask_token"};

bool flag(const nlohmann::json& object, const char* key, bool fallback, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  DSCHAT_CHECK(it->is_boolean(), FormatError, where, ": key '", key, "' expects a boolean, got ", it->dump());
  return it->get<bool>();
}

// A token written as "<s>" or as {"content": "<s>", "lstrip": false, ...}.
AddedToken parse_token(const nlohmann::json& value, bool special, const std::string& where) {
  AddedToken token;
  token.special = special;
  token.normalized = !special;
  if (value.is_string()) {
    token.content = value.get<std::string>();
    return token;
  }
  DSCHAT_CHECK(value.is_object() && value.contains("content") && value["content"].is_string(), FormatError, where,
               ": expected a token string or an object with a string 'content', got ", value.dump());
  token.content = value["content"].get<std::string>();
  token.special = flag(value, "special", special, where);
  token.lstrip = flag(value, "lstrip", false, where);
  token.rstrip = flag(value, "rstrip", false, where);
  token.single_word = flag(value, "single_word", false, where);
  token.normalized = flag(value, "normalized", !token.special, where);
  return token;
}

std::optional<bool> optional_flag(const nlohmann::json& object, const char* key, const std::string& where) {
  if (!object.contains(key) || object[key].is_null()) return std::nullopt;
  return flag(object, key, false, where);
}

void set_named(TokenizerConfig& config, const std::string& key, const nlohmann::json& value,
               const std::string& where) {
  AddedToken token;
  if (!value.is_null()) token = parse_token(value, true, where + ": " + key);
  token.special = true;
  auto it = std::find_if(config.named.begin(), config.named.end(), [&](const auto& e) { return e.first == key; });
  if (it != config.named.end()) {
    it->second = token;
  } else {
    config.named.emplace_back(key, token);
  }
}

void read_extra(TokenizerConfig& config, const nlohmann::json& object, const std::string& where) {
  for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
    auto it = object.find(key);
    if (it == object.end() || !it->is_array()) continue;  // a dict form names model-specific tokens
    for (const auto& item : *it) config.extra.push_back(parse_token(item, true, where + ": " + key));
  }
}

void sort_named(TokenizerConfig& config) {
  auto rank = [](const std::string& key) {
    return std::find(std::begin(kNamedKeys), std::end(kNamedKeys), key) - std::begin(kNamedKeys);
  };
  std::stable_sort(config.named.begin(), config.named.end(),
                   [&](const auto& a, const auto& b) { return rank(a.first) < rank(b.first); });
}

}  // namespace

const AddedToken* TokenizerConfig::find(const std::string& key) const {
  for (const auto& [name, token] : named) {
    if (name == key) return token.content.empty() ? nullptr : &token;
  }
  return nullptr;
}

bool TokenizerConfig::mentions(const std::string& key) const {
  return std::any_of(named.begin(), named.end(), [&](const auto& e) { return e.first == key; });
}

TokenizerConfig read_tokenizer_config(const std::filesystem::path& dir) {
  TokenizerConfig config;
  bool has_decoder = false;
  std::filesystem::path config_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    std::string where = config_path.string();
    nlohmann::json json = core::read_json_file(where);
    DSCHAT_CHECK(json.is_object(), FormatError, where, ": expected a JSON object, got ", json.type_name());
    for (const char* key : kNamedKeys) {
      if (json.contains(key)) set_named(config, key, json[key], where);
    }
    read_extra(config, json, where);
    config.add_bos_token = optional_flag(json, "add_bos_token", where);
    config.add_eos_token = optional_flag(json, "add_eos_token", where);
    config.add_prefix_space = optional_flag(json, "add_prefix_space", where);
    if (json.contains("added_tokens_decoder") && json["added_tokens_decoder"].is_object()) {
      has_decoder = true;
      std::map<int64_t, AddedToken> by_id;
      for (const auto& [index, value] : json["added_tokens_decoder"].items()) {
        std::string at = where + ": added_tokens_decoder." + index;
        int64_t id = 0;
        try {
          id = std::stoll(index);
        } catch (const std::exception&) {
          DSCHAT_THROW(FormatError, at, ": expected an integer id");
        }
        by_id[id] = parse_token(value, false, at);
      }
      config.added_tokens.assign(by_id.begin(), by_id.end());
    }
  }
  // transformers reads the legacy files only when tokenizer_config.json has no added_tokens_decoder.
  std::filesystem::path map_path = dir / "special_tokens_map.json";
  if (!has_decoder && std::filesystem::exists(map_path)) {
    std::string where = map_path.string();
    nlohmann::json json = core::read_json_file(where);
    DSCHAT_CHECK(json.is_object(), FormatError, where, ": expected a JSON object, got ", json.type_name());
    for (const char* key : kNamedKeys) {
      if (json.contains(key)) set_named(config, key, json[key], where);
    }
    read_extra(config, json, where);
  }
  std::filesystem::path added_path = dir / "added_tokens.json";
  if (!has_decoder && std::filesystem::exists(added_path)) {
    std::string where = added_path.string();
    nlohmann::json json = core::read_json_file(where);
    DSCHAT_CHECK(json.is_object(), FormatError, where, ": expected a JSON object, got ", json.type_name());
    std::map<int64_t, AddedToken> by_id;
    for (const auto& [content, index] : json.items()) {
      DSCHAT_CHECK(index.is_number_integer(), FormatError, where, ": token '", content, "' expects an integer id");
      bool special = std::any_of(config.named.begin(), config.named.end(),
                                 [&](const auto& e) { return e.second.content == content; });
      AddedToken token;
      token.content = content;
      token.special = special;
      token.normalized = !special;
      by_id[index.get<int64_t>()] = token;
    }
    config.added_tokens.assign(by_id.begin(), by_id.end());
  }
  sort_named(config);
  // Named tokens take their flags from added_tokens_decoder when it lists them.
  for (auto& [key, token] : config.named) {
    for (const auto& [id, added] : config.added_tokens) {
      if (!token.content.empty() && added.content == token.content) {
        token = added;
        token.special = true;
      }
    }
  }
  return config;
}

}  // namespace tokenizer
}  // namespace dschat
