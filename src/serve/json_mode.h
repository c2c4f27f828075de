#pragma once
// OpenAI's JSON mode (response_format {"type": "json_object"}): the reply is a JSON object. A
// byte-level machine accepts exactly the prefixes of RFC 8259 texts whose value is an object, and
// a TokenConstraint built on it lets through only the tokens whose text keeps the reply such a
// prefix, and an end token (eos, the template's end of turn) only once the object has closed.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dschat/inference/token_constraint.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace serve {

/// Reads a reply one byte at a time. Bytes of 0x80 and above are taken as they come inside
/// strings (UTF-8 is not checked: a byte-level token's text may hold part of a character).
/// Whitespace between tokens is limited to runs of
/// kMaxWhitespace (a model must not loop on blanks until max_tokens), nesting to kMaxDepth, and
/// nothing may follow the closed object (the reply ends there).
class JsonObjectMachine {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxWhitespace = 16;
  /// false: `c` cannot continue the text (the machine is then unusable: feed a copy to probe).
  bool feed(char c);
  bool feed(const std::string& text);
  /// The top-level object has closed.
  bool complete() const { return mode_ == Mode::kDone; }

 private:
  enum class Mode : uint8_t {
    kStart, kValue, kArrayFirst, kObjectFirst, kObjectKey, kColon, kAfterValue,
    kString, kEscape, kUnicode, kNumber, kLiteral, kDone
  };
  enum class Number : uint8_t { kMinus, kZero, kInt, kDot, kFraction, kE, kExponentSign, kExponent };
  bool begin_value(char c);
  bool end_number_then(char c);
  void value_done() { mode_ = depth_ == 0 ? Mode::kDone : Mode::kAfterValue; }

  Mode mode_ = Mode::kStart;
  Number number_ = Number::kMinus;
  bool key_ = false;             // the string being read is an object key
  uint8_t hex_left_ = 0;         // \uXXXX digits still to come
  uint8_t whitespace_run_ = 0;
  uint8_t depth_ = 0;
  const char* literal_ = nullptr;  // the rest of true / false / null
  std::array<char, kMaxDepth> open_{};  // '{' or '[' per level
};

/// Each token id's text as it reads inside a reply (decoded after an anchor token and with the
/// anchor's text removed, so a SentencePiece token keeps its leading space); empty for special
/// tokens, which never belong to JSON.
std::vector<std::string> token_texts(const tokenizer::Tokenizer& tokenizer);

class JsonObjectConstraint : public inference::TokenConstraint {
 public:
  /// `texts`: token_texts() of the model's tokenizer; `end_ids`: the ids that end a reply.
  JsonObjectConstraint(std::shared_ptr<const std::vector<std::string>> texts, std::vector<int64_t> end_ids);
  torch::Tensor allowed(const std::vector<int64_t>& generated, int64_t vocab) const override;

 private:
  std::shared_ptr<const std::vector<std::string>> texts_;
  std::vector<int64_t> end_ids_;
};

}  // namespace serve
}  // namespace dschat
