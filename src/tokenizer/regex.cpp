#include "tokenizer/regex.h"

#include <oniguruma.h>

#include <cctype>
#include <cstdio>
#include <memory>

#include "dschat/core/error.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {
namespace {

// onig_initialize is not thread-safe; a function-local static runs it exactly once.
void initialize_oniguruma() {
  static const int status = [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    return onig_initialize(encodings, 1);
  }();
  DSCHAT_CHECK(status == ONIG_NORMAL, Unsupported, "Oniguruma failed to initialise (status ", status, ")");
}

std::string onig_message(int code, OnigErrorInfo* info) {
  UChar buffer[ONIG_MAX_ERROR_MESSAGE_LEN];
  int length = info ? onig_error_code_to_str(buffer, code, info) : onig_error_code_to_str(buffer, code);
  return std::string(reinterpret_cast<const char*>(buffer), length > 0 ? static_cast<size_t>(length) : 0);
}

// One region per thread: onig_search writes match positions into it, so sharing one regex
// between threads needs nothing else (the compiled regex is only read during a search).
struct RegionDeleter {
  void operator()(OnigRegion* region) const { onig_region_free(region, 1); }
};

OnigRegion* thread_region() {
  thread_local std::unique_ptr<OnigRegion, RegionDeleter> region(onig_region_new());
  return region.get();
}

std::string hex_escape(char32_t cp) {
  char buffer[16];
  std::snprintf(buffer, sizeof(buffer), "\\x{%X}", static_cast<unsigned>(cp));
  return buffer;
}

// The newer code points of a class as character-class ranges, "\x{..}-\x{..}...", computed once.
std::string range_text(CharClass which) {
  std::string out;
  for (auto [first, last] : newer_unicode_ranges(which)) {
    out += hex_escape(first);
    if (last != first) out += "-" + hex_escape(last);
  }
  return out;
}

// The class that replaces a \p{L}/\p{N} property: the property plus the newer code points.
std::string widened_class(CharClass which, bool negated) {
  static const std::string letters = range_text(kLetter);
  static const std::string numbers = range_text(kNumber);
  std::string out = negated ? "[^" : "[";
  out += which == kLetter ? "\\p{L}" + letters : "\\p{N}" + numbers;
  return out + "]";
}

// Oniguruma ignores case, spaces, '-' and '_' in property names.
std::string property_key(const std::string& name) {
  std::string key;
  for (char c : name) {
    if (c != ' ' && c != '-' && c != '_') key.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return key;
}

}  // namespace

std::string widen_unicode_properties(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size());
  size_t i = 0;
  while (i < pattern.size()) {
    char c = pattern[i];
    if (c != '\\' || i + 1 >= pattern.size()) {
      out.push_back(c);
      ++i;
      continue;
    }
    char escape = pattern[i + 1];
    size_t close = std::string::npos;
    if ((escape == 'p' || escape == 'P') && i + 2 < pattern.size() && pattern[i + 2] == '{') {
      close = pattern.find('}', i + 3);
    }
    if (close == std::string::npos) {
      out.append(pattern, i, 2);  // any other escape, \\ included, is kept as written
      i += 2;
      continue;
    }
    std::string name = pattern.substr(i + 3, close - (i + 3));
    bool negated = escape == 'P';
    if (!name.empty() && name[0] == '^') {
      negated = !negated;
      name.erase(0, 1);
    }
    std::string key = property_key(name);
    if (key == "l" || key == "letter") {
      out += widened_class(kLetter, negated);
    } else if (key == "n" || key == "number") {
      out += widened_class(kNumber, negated);
    } else {
      out.append(pattern, i, close + 1 - i);
    }
    i = close + 1;
  }
  return out;
}

Regex::Regex(const std::string& pattern, std::string where) : pattern_(pattern), where_(std::move(where)) {
  initialize_oniguruma();
  DSCHAT_CHECK(find_invalid_utf8(pattern) == std::string::npos, FormatError, where_, ": regex is not valid UTF-8");
  std::string compiled = widen_unicode_properties(pattern);
  OnigErrorInfo info;
  const auto* begin = reinterpret_cast<const UChar*>(compiled.data());
  int status = onig_new(&regex_, begin, begin + compiled.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                        ONIG_SYNTAX_DEFAULT, &info);
  if (status != ONIG_NORMAL) {
    regex_ = nullptr;
    DSCHAT_THROW(Unsupported, where_, ": Oniguruma cannot compile regex '", pattern, "': ",
                 onig_message(status, &info));
  }
}

Regex Regex::literal(const std::string& literal, std::string where) {
  // Every ASCII character other than letters and digits is written as \x{..}, so no character of
  // the literal can act as an operator (what regex::escape achieves in `tokenizers`).
  std::string pattern;
  for (unsigned char c : literal) {
    if (c < 0x80 && !std::isalnum(c)) {
      pattern += hex_escape(c);
    } else {
      pattern.push_back(static_cast<char>(c));
    }
  }
  return Regex(pattern, std::move(where));
}

Regex::~Regex() {
  if (regex_ != nullptr) onig_free(regex_);
}

Regex::Regex(Regex&& other) noexcept
    : pattern_(std::move(other.pattern_)), where_(std::move(other.where_)), regex_(other.regex_) {
  other.regex_ = nullptr;
}

void Regex::find_all(std::string_view text, std::vector<Match>& out) const {
  static const char kEmpty[] = "";
  const auto* start = reinterpret_cast<const UChar*>(text.empty() ? kEmpty : text.data());
  const UChar* end = start + text.size();
  OnigRegion* region = thread_region();
  size_t last_end = 0;
  bool skip_next_empty = false;
  while (last_end <= text.size()) {
    onig_region_clear(region);
    int found = onig_search(regex_, start, end, start + last_end, end, region, ONIG_OPTION_NONE);
    if (found == ONIG_MISMATCH) break;
    DSCHAT_CHECK(found >= 0, InvalidArgument, where_, ": regex search failed on a ", text.size(),
                 "-byte piece: ", onig_message(found, nullptr));
    auto begin = static_cast<size_t>(region->beg[0]);
    auto stop = static_cast<size_t>(region->end[0]);
    last_end = stop;
    if (begin == stop) {
      last_end += stop < text.size() ? utf8_length(static_cast<unsigned char>(text[stop])) : 1;
      if (skip_next_empty) {
        skip_next_empty = false;
        continue;
      }
    } else {
      skip_next_empty = true;
    }
    out.emplace_back(begin, stop);
  }
}

}  // namespace tokenizer
}  // namespace dschat
