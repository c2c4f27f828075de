// Loading a tokenizer directory into Tokenizer::State: tokenizer.json, or vocab.json + merges.txt,
// plus the transformers config files.
#include <cstdint>
#include <fstream>
#include <sstream>

#include "core/json_object.h"
#include "core/log.h"
#include "dschat/core/error.h"
#include "tokenizer/json_spec.h"
#include "tokenizer/tokenizer_config.h"
#include "tokenizer/tokenizer_state.h"

namespace dschat {
namespace tokenizer {
namespace {

namespace fs = std::filesystem;

struct FileToken {
  int64_t id;
  AddedToken token;
};

struct LoadedFiles {
  std::vector<FileToken> tokens;  // tokenizer.json added_tokens
  bool has_post_processor = false;
};

Vocab read_vocab(const nlohmann::json& json, const std::string& where) {
  DSCHAT_CHECK(json.is_object(), FormatError, where, ": vocab expects an object {token: id}, got ", json.type_name());
  Vocab vocab;
  vocab.reserve(json.size());
  for (const auto& [token, id] : json.items()) {
    DSCHAT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX, FormatError,
                 where, ": vocab token '", token, "' expects an id in [0, 2^31), got ", id.dump());
    vocab[token] = static_cast<int32_t>(id.get<int64_t>());
  }
  return vocab;
}

std::pair<std::string, std::string> split_merge(const std::string& line, size_t index, const std::string& where) {
  size_t space = line.find(' ');
  DSCHAT_CHECK(space != std::string::npos && line.find(' ', space + 1) == std::string::npos, FormatError, where,
               ": merge ", index, " expects two tokens separated by one space, got '", line, "'");
  return {line.substr(0, space), line.substr(space + 1)};
}

Merges read_json_merges(const nlohmann::json& json, const std::string& where) {
  DSCHAT_CHECK(json.is_array(), FormatError, where, ": merges expects an array, got ", json.type_name());
  Merges merges;
  merges.reserve(json.size());
  for (size_t i = 0; i < json.size(); ++i) {
    const auto& item = json[i];
    if (item.is_string()) {
      merges.push_back(split_merge(item.get<std::string>(), i, where));
    } else {
      DSCHAT_CHECK(item.is_array() && item.size() == 2 && item[0].is_string() && item[1].is_string(), FormatError,
                   where, ": merge ", i, " expects \"a b\" or [\"a\", \"b\"], got ", item.dump());
      merges.emplace_back(item[0].get<std::string>(), item[1].get<std::string>());
    }
  }
  return merges;
}

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  DSCHAT_CHECK(in.good(), IoError, path.string(), ": cannot open file for reading");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

Merges read_merges_txt(const fs::path& path) {
  std::istringstream in(read_text_file(path));
  Merges merges;
  std::string line;
  size_t index = 0;
  while (std::getline(in, line)) {
    ++index;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    merges.push_back(split_merge(line, index, path.string() + ": line " + std::to_string(index)));
  }
  return merges;
}

std::unique_ptr<BpeModel> make_model(const JsonSpec& spec) {
  std::string type = spec.string_or("type", spec.has("merges") ? "BPE" : "");
  if (type != "BPE") spec.unsupported("model type '" + type + "'", "BPE");
  double dropout = spec.number_or("dropout", 0.0);
  if (dropout != 0.0) spec.unsupported("BPE dropout " + std::to_string(dropout), "dropout null or 0");
  BpeOptions options;
  if (spec.has("unk_token")) options.unk_token = spec.string("unk_token");
  options.continuing_subword_prefix = spec.string_or("continuing_subword_prefix", "");
  options.end_of_word_suffix = spec.string_or("end_of_word_suffix", "");
  options.fuse_unk = spec.boolean_or("fuse_unk", false);
  options.byte_fallback = spec.boolean_or("byte_fallback", false);
  options.ignore_merges = spec.boolean_or("ignore_merges", false);
  Vocab vocab = read_vocab(spec.object("vocab"), spec.where() + ".vocab");
  Merges merges = read_json_merges(spec.array("merges"), spec.where() + ".merges");
  return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(options), spec.where());
}

LoadedFiles read_tokenizer_json(const fs::path& path, Tokenizer::State& state) {
  std::string file = path.string();
  nlohmann::json json = core::read_json_file(file);
  JsonSpec root(json, file);
  LoadedFiles loaded;
  state.model = make_model(JsonSpec(root.object("model"), file + ": model"));
  if (root.has("normalizer")) state.normalizer = make_normalizer(JsonSpec(json["normalizer"], file + ": normalizer"));
  if (root.has("pre_tokenizer")) {
    state.pre_tokenizer = make_pre_tokenizer(JsonSpec(json["pre_tokenizer"], file + ": pre_tokenizer"));
  }
  if (root.has("decoder")) state.decoder = make_decoder(JsonSpec(json["decoder"], file + ": decoder"));
  if (root.has("post_processor")) {
    loaded.has_post_processor = true;
    state.special_template = make_special_template(JsonSpec(json["post_processor"], file + ": post_processor"));
  }
  for (const char* key : {"truncation", "padding"}) {
    if (root.has(key)) {
      core::log_warn("{}: '{}' is ignored; BatchOptions sets truncation and padding", file, key);
    }
  }
  if (root.has("added_tokens")) {
    const nlohmann::json& items = root.array("added_tokens");
    for (size_t i = 0; i < items.size(); ++i) {
      JsonSpec item(items[i], file + ": added_tokens[" + std::to_string(i) + "]");
      AddedToken token;
      token.content = item.string("content");
      token.single_word = item.boolean_or("single_word", false);
      token.lstrip = item.boolean_or("lstrip", false);
      token.rstrip = item.boolean_or("rstrip", false);
      token.special = item.boolean_or("special", false);
      token.normalized = item.boolean_or("normalized", !token.special);
      loaded.tokens.push_back(FileToken{item.integer("id"), token});
    }
  }
  return loaded;
}

void read_vocab_and_merges(const fs::path& dir, const TokenizerConfig& config, Tokenizer::State& state) {
  fs::path vocab_path = dir / "vocab.json";
  Vocab vocab = read_vocab(core::read_json_file(vocab_path.string()), vocab_path.string());
  Merges merges = read_merges_txt(dir / "merges.txt");
  state.model = std::make_unique<BpeModel>(std::move(vocab), merges, BpeOptions{}, vocab_path.string());
  state.pre_tokenizer = make_byte_level_pre_tokenizer(config.add_prefix_space.value_or(false));
  state.decoder = make_byte_level_decoder();
}

int64_t add_token(Tokenizer::State& state, const AddedToken& token) {
  auto model_id = state.model->token_to_id(token.content);
  return state.added.add(token, state.model->size(),
                         model_id ? std::optional<int64_t>(*model_id) : std::optional<int64_t>());
}

}  // namespace

std::shared_ptr<Tokenizer::State> load_state(const fs::path& dir) {
  DSCHAT_CHECK(fs::is_directory(dir), NotFound, "tokenizer directory '", dir.string(), "' does not exist");
  auto state = std::make_shared<Tokenizer::State>();
  state->directory = dir;
  TokenizerConfig config = read_tokenizer_config(dir);

  LoadedFiles loaded;
  bool from_vocab_files = false;
  if (fs::exists(dir / "tokenizer.json")) {
    loaded = read_tokenizer_json(dir / "tokenizer.json", *state);
  } else if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) {
    read_vocab_and_merges(dir, config, *state);
    from_vocab_files = true;
  } else {
    DSCHAT_THROW(NotFound, dir.string(), ": no tokenizer files (expected tokenizer.json, or vocab.json and merges.txt)");
  }

  for (const FileToken& file_token : loaded.tokens) {
    int64_t id = add_token(*state, file_token.token);
    if (id != file_token.id) {
      core::log_warn("{}/tokenizer.json: added token '{}' declared with id {} gets id {} (as in tokenizers)",
                     dir.string(), file_token.token.content, file_token.id, id);
    }
  }
  for (const auto& [id, token] : config.added_tokens) add_token(*state, token);

  // transformers' GPT2Tokenizer defaults, used when vocab.json + merges.txt come without config.
  TokenizerConfig named = config;
  if (from_vocab_files) {
    for (const char* key : {"bos_token", "eos_token", "unk_token"}) {
      if (!named.mentions(key)) {
        AddedToken token;
        token.content = "<|endoftext|>";
        token.special = true;
        token.normalized = false;
        named.named.emplace_back(key, token);
      }
    }
  }
  for (const auto& [key, token] : named.named) {
    if (!token.content.empty()) add_token(*state, token);
  }
  for (const AddedToken& token : named.extra) add_token(*state, token);
  state->added.build(state->normalizer.get());

  auto id_of = [&](const char* key) -> std::optional<int64_t> {
    const AddedToken* token = named.find(key);
    if (token == nullptr) return std::nullopt;
    if (auto id = state->added.id_of(token->content)) return id;
    if (auto id = state->model->token_to_id(token->content)) return *id;
    return std::nullopt;
  };
  state->bos_id = id_of("bos_token");
  state->eos_id = id_of("eos_token");
  state->pad_id = id_of("pad_token");
  state->unk_id = id_of("unk_token");
  if (!state->unk_id && state->model->unk_token()) {
    if (auto id = state->model->token_to_id(*state->model->unk_token())) state->unk_id = *id;
  }

  // transformers rebuilds the template from add_bos_token/add_eos_token when the config sets
  // either or when tokenizer.json has no post_processor; otherwise tokenizer.json's one stands.
  if (config.add_bos_token || config.add_eos_token || !loaded.has_post_processor) {
    SpecialTemplate special;
    if (config.add_bos_token.value_or(false) && state->bos_id) special.prefix.push_back(*state->bos_id);
    if (config.add_eos_token.value_or(false) && state->eos_id) special.suffix.push_back(*state->eos_id);
    state->special_template = special;
  }
  return state;
}

}  // namespace tokenizer
}  // namespace dschat
