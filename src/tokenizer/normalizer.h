#pragma once
// tokenizer.json normalizers: Sequence, Prepend, Replace (string or regex pattern), Lowercase,
// Strip, NFC, NFD, NFKC, NFKD. They run on each piece of text left between added tokens, as in `tokenizers`.

#include <memory>
#include <string>

#include "tokenizer/json_spec.h"

namespace dschat {
namespace tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

/// Builds the normalizer described by `spec`; Unsupported naming the location and type otherwise.
std::unique_ptr<Normalizer> make_normalizer(const JsonSpec& spec);

/// Replaces every non-overlapping occurrence of `pattern`, scanning left to right.
std::string replace_all(const std::string& text, const std::string& pattern, const std::string& content);

/// The string pattern of a Replace normalizer or decoder ({"String": "..."}); Regex patterns are
/// Unsupported here (the normalizer handles them itself; the decoder refuses them).
std::string replace_pattern(const JsonSpec& spec);

}  // namespace tokenizer
}  // namespace dschat
