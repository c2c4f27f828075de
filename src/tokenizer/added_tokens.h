#pragma once
// Added tokens (special tokens such as "<|endoftext|>", "<s>", and user-added words) as
// `tokenizers` handles them: found in the text before normalisation and pre-tokenisation by a
// leftmost-longest scan, first the tokens with normalized=false on the raw text, then those with
// normalized=true on each normalised piece; lstrip/rstrip absorb the whitespace beside a match and
// single_word rejects a match inside a word. Ids are assigned as `tokenizers` assigns them.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace dschat {
namespace tokenizer {

class Normalizer;

struct AddedToken {
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

struct Segment {
  size_t begin, end;  // byte range in the scanned text
  int64_t id;         // the added token's id, or -1 for ordinary text
};

class AddedVocabulary {
 public:
  /// Adds `token` as `tokenizers`' add_tokens does: the id of an existing added or model token of
  /// the same content, else the next free id after `model_size` (the number of model tokens).
  /// Returns the id.
  int64_t add(const AddedToken& token, size_t model_size, std::optional<int64_t> model_id);
  /// Recomputes the normalised forms and the matchers; call after the last add().
  void build(const Normalizer* normalizer);

  /// Splits `text` (valid UTF-8) by the tokens of one phase: normalized == `normalized_phase`.
  void split(std::string_view text, bool normalized_phase, std::vector<Segment>& out) const;

  bool empty() const { return by_id_.empty(); }
  std::optional<int64_t> id_of(std::string_view content) const;
  /// The token's text for decoding (its normalised form when normalized), or nullptr.
  const std::string* decode_text(int64_t id) const;
  bool is_special_text(const std::string& text) const { return special_.count(text) > 0; }
  const AddedToken* token(int64_t id) const;
  int64_t max_id() const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int64_t id = -1;
  };
  struct Matcher {
    std::vector<Node> nodes;
    bool first_byte[256] = {};
    bool empty() const { return nodes.size() <= 1; }
  };
  void insert(Matcher& matcher, const std::string& pattern, int64_t id);
  // Longest pattern starting at `pos`: (length, id), or (0, -1).
  std::pair<size_t, int64_t> longest_at(const Matcher& matcher, std::string_view text, size_t pos) const;

  std::unordered_map<std::string, int64_t> by_content_;
  std::unordered_map<int64_t, AddedToken> by_id_;
  std::unordered_map<int64_t, std::string> normalized_form_;
  std::unordered_set<std::string> special_;
  Matcher raw_matcher_;
  Matcher normalized_matcher_;
};

}  // namespace tokenizer
}  // namespace dschat
