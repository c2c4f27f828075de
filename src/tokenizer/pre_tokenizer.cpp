#include "tokenizer/pre_tokenizer.h"

#include "dschat/core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenize_gpt2.h"
#include "tokenizer/split_pre_tokenizers.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {
namespace {

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& part : parts_) part->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}

  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 4);
    std::vector<Span> spans;
    for (Piece& piece : pieces) {
      if (add_prefix_space_ && piece.text.compare(0, 1, " ") != 0) piece.text.insert(0, " ");
      spans.clear();
      if (use_regex_) {
        split_gpt2(piece.text, spans);
      } else {
        spans.emplace_back(0, piece.text.size());
      }
      for (size_t i = 0; i < spans.size(); ++i) {
        auto [begin, end] = spans[i];
        if (begin == end) continue;
        Piece word{std::string(), piece.first && i == 0};
        word.text.reserve((end - begin) * 2);
        append_byte_level(std::string_view(piece.text).substr(begin, end - begin), word.text);
        out.push_back(std::move(word));
      }
    }
    pieces = std::move(out);
  }

 private:
  bool add_prefix_space_;
  bool use_regex_;
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split)
      : scheme_(scheme), split_(split) {
    append_utf8(replacement, replacement_);
  }

  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (Piece& piece : pieces) {
      std::string text;
      for (char c : piece.text) {
        if (c == ' ') {
          text += replacement_;
        } else {
          text.push_back(c);
        }
      }
      bool starts = text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && piece.first))) {
        text.insert(0, replacement_);
      }
      if (!split_) {
        if (!text.empty()) out.push_back(Piece{std::move(text), piece.first});
        continue;
      }
      // Split before every replacement character; each one starts the next piece.
      size_t begin = 0;
      bool first = piece.first;
      while (begin < text.size()) {
        size_t end = text.find(replacement_, begin + (text.compare(begin, replacement_.size(), replacement_) == 0
                                                          ? replacement_.size()
                                                          : 0));
        if (end == std::string::npos) end = text.size();
        out.push_back(Piece{text.substr(begin, end - begin), first});
        first = false;
        begin = end;
      }
    }
    pieces = std::move(out);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

}  // namespace

PrependScheme parse_prepend_scheme(const JsonSpec& spec) {
  std::string scheme = spec.string_or("prepend_scheme", "always");
  PrependScheme out = PrependScheme::kAlways;
  if (scheme == "first") {
    out = PrependScheme::kFirst;
  } else if (scheme == "never") {
    out = PrependScheme::kNever;
  } else if (scheme != "always") {
    DSCHAT_THROW(FormatError, spec.where(), ": key 'prepend_scheme' must be always, first or never, got '", scheme,
                 "'");
  }
  // Older files say add_prefix_space; `tokenizers` rejects a false one that contradicts the scheme.
  if (spec.has("add_prefix_space") && !spec.boolean_or("add_prefix_space", true)) {
    DSCHAT_CHECK(out == PrependScheme::kNever, FormatError, spec.where(),
                 ": add_prefix_space false contradicts prepend_scheme '", scheme, "'");
  }
  return out;
}

std::unique_ptr<PreTokenizer> make_byte_level_pre_tokenizer(bool add_prefix_space) {
  return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, true);
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonSpec& spec) {
  std::string type = spec.type();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const JsonSpec& child : spec.children("pretokenizers")) parts.push_back(make_pre_tokenizer(child));
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(spec.boolean_or("add_prefix_space", true),
                                                   spec.boolean_or("use_regex", true));
  }
  if (type == "Metaspace") {
    return std::make_unique<MetaspacePreTokenizer>(spec.character("replacement"), parse_prepend_scheme(spec),
                                                   spec.boolean_or("split", true));
  }
  if (type == "Split") return make_split_pre_tokenizer(spec);
  if (type == "Digits") return make_digits_pre_tokenizer(spec);
  if (type == "Punctuation") return make_punctuation_pre_tokenizer(spec);
  if (type == "Whitespace") return make_whitespace_pre_tokenizer();
  if (type == "WhitespaceSplit") return make_whitespace_split_pre_tokenizer();
  spec.unsupported("pre_tokenizer type '" + type + "'",
                   "ByteLevel, Metaspace, Split, Digits, Punctuation, Whitespace, WhitespaceSplit, Sequence");
}

}  // namespace tokenizer
}  // namespace dschat
