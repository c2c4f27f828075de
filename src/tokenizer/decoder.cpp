#include "tokenizer/decoder.h"

#include "dschat/core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {
namespace {

const char kReplacementChar[] = "\xEF\xBF\xBD";

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& part : parts_) part->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) append_byte_level_decoded(token, bytes);
    tokens.assign(1, to_valid_utf8(bytes));
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, PrependScheme scheme) : scheme_(scheme) {
    append_utf8(replacement, replacement_);
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      // Every replacement character of the first token is dropped, not only a leading one.
      bool drop = i == 0 && scheme_ != PrependScheme::kNever;
      tokens[i] = replace_all(tokens[i], replacement_, drop ? "" : " ");
    }
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) token = replace_all(token, pattern_, content_);
  }

 private:
  std::string pattern_, content_;
};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "<0xE4>" -> 0xE4; -1 for other tokens. Parsed like Rust's u8::from_str_radix, which also takes
// a '+' sign ("<0x+A>").
int byte_token_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  if (token[3] == '+') return hex_value(token[4]);
  int hi = hex_value(token[3]), lo = hex_value(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (find_invalid_utf8(pending) == std::string::npos) {
        out.push_back(pending);
      } else {
        // One replacement character per byte, unlike the lossy UTF-8 conversion elsewhere.
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back(kReplacementChar);
      }
      pending.clear();
    };
    for (std::string& token : tokens) {
      int value = byte_token_value(token);
      if (value >= 0) {
        pending.push_back(static_cast<char>(value));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    tokens.assign(1, std::move(joined));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, code point)
      for (size_t pos = 0; pos < token.size();) {
        size_t at = pos;
        chars.emplace_back(at, next_code_point(token, pos));
      }
      size_t start_cut = 0;
      for (size_t i = 0; i < start_ && i < chars.size() && chars[i].second == content_; ++i) start_cut = i + 1;
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size() && chars[chars.size() - 1 - i].second == content_; ++i) {
        stop_cut = chars.size() - 1 - i;
      }
      if (stop_cut <= start_cut) {
        token.clear();
        continue;
      }
      size_t begin = start_cut < chars.size() ? chars[start_cut].first : token.size();
      size_t end = stop_cut < chars.size() ? chars[stop_cut].first : token.size();
      token = token.substr(begin, end - begin);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

}  // namespace

std::unique_ptr<Decoder> make_byte_level_decoder() { return std::make_unique<ByteLevelDecoder>(); }

std::unique_ptr<Decoder> make_decoder(const JsonSpec& spec) {
  std::string type = spec.type();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const JsonSpec& child : spec.children("decoders")) parts.push_back(make_decoder(child));
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return make_byte_level_decoder();
  if (type == "Metaspace") {
    return std::make_unique<MetaspaceDecoder>(spec.character("replacement"), parse_prepend_scheme(spec));
  }
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(replace_pattern(spec), spec.string("content"));
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    int64_t start = spec.integer("start"), stop = spec.integer("stop");
    DSCHAT_CHECK(start >= 0 && stop >= 0, FormatError, spec.where(), ": start and stop must be >= 0, got ", start,
                 " and ", stop);
    return std::make_unique<StripDecoder>(spec.character("content"), static_cast<size_t>(start),
                                          static_cast<size_t>(stop));
  }
  spec.unsupported("decoder type '" + type + "'", "ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence");
}

}  // namespace tokenizer
}  // namespace dschat
