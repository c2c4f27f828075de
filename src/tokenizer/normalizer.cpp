#include "tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <vector>

#include "dschat/core/error.h"
#include "tokenizer/lowercase.h"
#include "tokenizer/regex.h"
#include "tokenizer/split.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {
namespace {

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    for (const auto& part : parts_) part->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override { text = replace_all(text, pattern_, content_); }

 private:
  std::string pattern_, content_;
};

// Replace with a {"Regex": ...} pattern: every match (empty ones too) becomes `content`.
class ReplaceRegexNormalizer : public Normalizer {
 public:
  ReplaceRegexNormalizer(Regex regex, std::string content) : regex_(std::move(regex)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    thread_local std::vector<PatternPart> parts;
    parts.clear();
    regex_parts(regex_, text, parts);
    std::string out;
    out.reserve(text.size());
    for (const PatternPart& part : parts) {
      if (part.is_match) {
        out += content_;
      } else {
        out.append(text, part.begin, part.end - part.begin);
      }
    }
    text = std::move(out);
  }

 private:
  Regex regex_;
  std::string content_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void normalize(std::string& text) const override { lowercase_utf8(text); }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!(char_class(next_code_point(text, next)) & kSpace)) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while ((static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t pos = start;
        if (!(char_class(next_code_point(text, pos)) & kSpace)) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

// NFC/NFD/NFKC/NFKD. `tokenizers` normalizes with tables of Unicode 11.0, so a code point
// assigned later is, to it, an unassigned starter: never decomposed, composed or reordered, and a
// barrier to composition and reordering. ICU (Unicode 15.0) knows such code points, so the text
// is normalized in the runs between them and they are copied as they are.
class UnicodeNormalizer : public Normalizer {
 public:
  UnicodeNormalizer(const icu::Normalizer2* normalizer, std::string where)
      : normalizer_(normalizer), where_(std::move(where)) {}
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    size_t run_begin = 0, pos = 0;
    while (pos < text.size()) {
      if (static_cast<unsigned char>(text[pos]) < 0x80) {
        ++pos;
        continue;
      }
      size_t begin = pos;
      if (!(char_class(next_code_point(text, pos)) & kAfterUnicode11)) continue;
      append_normalized(std::string_view(text).substr(run_begin, begin - run_begin), out);
      out.append(text, begin, pos - begin);
      run_begin = pos;
    }
    append_normalized(std::string_view(text).substr(run_begin), out);
    text = std::move(out);
  }

 private:
  void append_normalized(std::string_view run, std::string& out) const {
    if (run.empty()) return;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(run.size()));
    UErrorCode status = U_ZERO_ERROR;
    normalizer_->normalizeUTF8(0, icu::StringPiece(run.data(), static_cast<int32_t>(run.size())), sink, nullptr,
                               status);
    DSCHAT_CHECK(U_SUCCESS(status), InvalidArgument, where_, ": ICU normalisation failed: ", u_errorName(status));
  }

  const icu::Normalizer2* normalizer_;
  std::string where_;
};

const icu::Normalizer2* icu_normalizer(const std::string& type, const std::string& where) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  if (type == "NFC") n = icu::Normalizer2::getNFCInstance(status);
  if (type == "NFD") n = icu::Normalizer2::getNFDInstance(status);
  if (type == "NFKC") n = icu::Normalizer2::getNFKCInstance(status);
  if (type == "NFKD") n = icu::Normalizer2::getNFKDInstance(status);
  DSCHAT_CHECK(n != nullptr && U_SUCCESS(status), IoError, where, ": cannot load ICU ", type,
               " data: ", u_errorName(status));
  return n;
}

}  // namespace

std::string replace_all(const std::string& text, const std::string& pattern, const std::string& content) {
  if (pattern.empty()) return text;
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t hit = text.find(pattern, pos);
    if (hit == std::string::npos) break;
    out.append(text, pos, hit - pos);
    out += content;
    pos = hit + pattern.size();
  }
  out.append(text, pos, std::string::npos);
  return out;
}

std::string replace_pattern(const JsonSpec& spec) {
  JsonSpec pattern(spec.object("pattern"), spec.where() + ".pattern");
  if (pattern.has("Regex")) pattern.unsupported("Regex pattern '" + pattern.string("Regex") + "'", "String patterns");
  std::string s = pattern.string("String");
  DSCHAT_CHECK(!s.empty(), FormatError, pattern.where(), ": empty String pattern");
  return s;
}

std::unique_ptr<Normalizer> make_normalizer(const JsonSpec& spec) {
  std::string type = spec.type();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const JsonSpec& child : spec.children("normalizers")) parts.push_back(make_normalizer(child));
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(spec.string("prepend"));
  if (type == "Replace") {
    JsonSpec pattern(spec.object("pattern"), spec.where() + ".pattern");
    if (pattern.has("Regex")) {
      return std::make_unique<ReplaceRegexNormalizer>(Regex(pattern.string("Regex"), pattern.where()),
                                                      spec.string("content"));
    }
    return std::make_unique<ReplaceNormalizer>(replace_pattern(spec), spec.string("content"));
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(spec.boolean_or("strip_left", false), spec.boolean_or("strip_right", false));
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    return std::make_unique<UnicodeNormalizer>(icu_normalizer(type, spec.where()), spec.where());
  }
  spec.unsupported("normalizer type '" + type + "'",
                   "Sequence, Prepend, Replace, Lowercase, Strip, NFC, NFD, NFKC, NFKD");
}

}  // namespace tokenizer
}  // namespace dschat
