#pragma once
// Regular expressions for tokenizer.json patterns (Split pre-tokenizer, Replace normalizer), run
// by Oniguruma: the engine Hugging Face `tokenizers` itself uses (through the `onig` crate), so
// the dialect, the leftmost-first alternation, lookarounds and possessive/lazy quantifiers behave
// as in `tokenizers` without a translation layer. Patterns are compiled for UTF-8 with the
// Oniguruma syntax and no options, as `onig::Regex::new` compiles them.
//
// Debian 12's Oniguruma (6.9.8) has Unicode 14.0 tables while the copy inside `tokenizers` has
// Unicode 16.0; \p{L} and \p{N} (and their negations) are therefore widened with the letters and
// numbers Unicode 15.0-16.0 added (see newer_unicode_ranges) before compiling. Other properties
// (\w, \d, \p{Lu}, scripts, ...) use the 14.0 tables as they are.

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct re_pattern_buffer;  // Oniguruma's regex_t

namespace dschat {
namespace tokenizer {

class Regex {
 public:
  using Match = std::pair<size_t, size_t>;  // [begin, end) byte offsets

  /// Compiles `pattern`; Unsupported naming `where` and Oniguruma's message when it cannot.
  Regex(const std::string& pattern, std::string where);
  /// A regex matching `literal` exactly (a tokenizer.json {"String": ...} pattern).
  static Regex literal(const std::string& literal, std::string where);
  ~Regex();
  Regex(Regex&& other) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  Regex& operator=(Regex&&) = delete;

  /// Appends every match in valid UTF-8 `text`, as the `onig` crate's find_iter yields them:
  /// each search starts where the last match ended (lookbehind sees the text before it), an
  /// empty match advances by one code point, and an empty match right after a non-empty one
  /// is skipped. Safe to call from many threads at once.
  void find_all(std::string_view text, std::vector<Match>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::string where_;
  re_pattern_buffer* regex_ = nullptr;
};

/// `pattern` with each \p{L}, \p{N}, \P{L}, \P{N} (also \p{^L}, \p{Letter}, ...) replaced by a
/// nested character class that adds the newer letters or numbers. Exposed for tests.
std::string widen_unicode_properties(const std::string& pattern);

}  // namespace tokenizer
}  // namespace dschat
