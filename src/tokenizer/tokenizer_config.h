#pragma once
// What transformers reads from tokenizer_config.json, special_tokens_map.json and
// added_tokens.json: the named special tokens with their flags, extra added tokens, and the
// add_bos_token / add_eos_token / add_prefix_space switches.

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/added_tokens.h"

namespace dschat {
namespace tokenizer {

struct TokenizerConfig {
  /// bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token as found, in
  /// that order (transformers' order, which decides the ids of tokens new to the vocabulary).
  /// A key present with null is kept with an empty content: it means "none".
  std::vector<std::pair<std::string, AddedToken>> named;
  std::vector<AddedToken> extra;                              // additional/extra_special_tokens
  std::vector<std::pair<int64_t, AddedToken>> added_tokens;  // added_tokens_decoder, by id
  std::optional<bool> add_bos_token, add_eos_token, add_prefix_space;

  /// The named token `key` ("bos_token"), if the files name one.
  const AddedToken* find(const std::string& key) const;
  bool mentions(const std::string& key) const;
};

/// Reads the optional config files of `dir`; absent files give an empty config.
TokenizerConfig read_tokenizer_config(const std::filesystem::path& dir);

}  // namespace tokenizer
}  // namespace dschat
