#pragma once
// tokenizer.json pre-tokenizers: ByteLevel (GPT-2 regex + byte alphabet), Metaspace, Sequence, and
// (split_pre_tokenizers.h) Split, Digits, Punctuation, Whitespace, WhitespaceSplit.
// A pre-tokenizer turns the pieces of text between added tokens into the words the model sees.

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_spec.h"

namespace dschat {
namespace tokenizer {

struct Piece {
  std::string text;
  bool first;  // starts at byte 0 of the caller's text (Metaspace's prepend_scheme "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  /// Replaces `pieces` by their splits; empty pieces are dropped.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonSpec& spec);

/// GPT-2's pre-tokenizer (ByteLevel with add_prefix_space false), as built from vocab.json +
/// merges.txt.
std::unique_ptr<PreTokenizer> make_byte_level_pre_tokenizer(bool add_prefix_space);

enum class PrependScheme { kAlways, kFirst, kNever };

/// Metaspace's "prepend_scheme" (or the older "add_prefix_space") of a pre-tokenizer or decoder.
PrependScheme parse_prepend_scheme(const JsonSpec& spec);

}  // namespace tokenizer
}  // namespace dschat
