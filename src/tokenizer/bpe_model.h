#pragma once
// The BPE model of Hugging Face `tokenizers`: a word is split into characters (each looked up in
// the vocabulary, else byte-fallback tokens "<0xXX>", else the unknown token, else dropped), then
// the lowest-ranked adjacent pair is merged until no pair has a merge. The merge order, the
// handling of stale queue entries and the unknown-token fusing follow `tokenizers` exactly, since
// ids must equal the Python tokenizer's.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/word_cache.h"

namespace dschat {
namespace tokenizer {

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;  // "" when none
  std::string end_of_word_suffix;         // "" when none
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;  // a word that is itself in the vocabulary is one token
};

using Vocab = std::unordered_map<std::string, int32_t>;
using Merges = std::vector<std::pair<std::string, std::string>>;

struct BpeMerge {
  int32_t rank;
  int32_t new_id;
};
/// (left id << 32 | right id) -> merge.
using MergeMap = std::unordered_map<uint64_t, BpeMerge>;

class BpeModel {
 public:
  /// `where` names the source in errors ("tok/tokenizer.json: model").
  BpeModel(Vocab vocab, const Merges& merges, BpeOptions options, const std::string& where);

  /// Appends the ids of `word` to `out`.
  void tokenize(std::string_view word, std::vector<int64_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  /// The token of `id`, or nullptr when the vocabulary has no such id.
  const std::string* id_to_token(int64_t id) const;
  /// Largest id in the vocabulary, -1 when empty.
  int64_t max_id() const { return static_cast<int64_t>(tokens_.size()) - 1; }
  size_t size() const { return vocab_.size(); }
  const std::optional<std::string>& unk_token() const { return options_.unk_token; }

 private:
  std::optional<int32_t> lookup_piece(std::string_view piece, bool first, bool last) const;
  std::vector<int32_t> merge_word(std::string_view word) const;

  Vocab vocab_;
  std::vector<std::string> tokens_;         // by id; "" for ids without a token
  std::vector<bool> has_token_;
  std::vector<int32_t> bmp_ids_;            // id of each single-code-point token of the BMP, or -1
  MergeMap merges_;
  std::array<int32_t, 256> byte_ids_{};     // id of "<0xXX>", or -1
  BpeOptions options_;
  std::string where_;
  std::unique_ptr<WordCache> cache_;
};

}  // namespace tokenizer
}  // namespace dschat
