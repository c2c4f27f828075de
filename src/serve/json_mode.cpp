#include "serve/json_mode.h"

#include <algorithm>

namespace dschat {
namespace serve {
namespace {

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

bool JsonObjectMachine::begin_value(char c) {
  switch (c) {
    case '{':
    case '[':
      if (depth_ == kMaxDepth) return false;
      open_[depth_++] = c;
      mode_ = c == '{' ? Mode::kObjectFirst : Mode::kArrayFirst;
      return true;
    case '"':
      mode_ = Mode::kString;
      key_ = false;
      return true;
    case '-':
      mode_ = Mode::kNumber;
      number_ = Number::kMinus;
      return true;
    case 't':
      literal_ = "rue";
      break;
    case 'f':
      literal_ = "alse";
      break;
    case 'n':
      literal_ = "ull";
      break;
    default:
      if (!is_digit(c)) return false;
      mode_ = Mode::kNumber;
      number_ = c == '0' ? Number::kZero : Number::kInt;
      return true;
  }
  mode_ = Mode::kLiteral;
  return true;
}

// A number ends at the first byte that cannot continue it; that byte is then read after the value.
bool JsonObjectMachine::end_number_then(char c) {
  const bool whole = number_ == Number::kZero || number_ == Number::kInt || number_ == Number::kFraction ||
                     number_ == Number::kExponent;
  if (!whole) return false;
  value_done();
  return feed(c);
}

bool JsonObjectMachine::feed(char c) {
  switch (mode_) {
    case Mode::kString:
      if (c == '"') {
        if (key_) {
          mode_ = Mode::kColon;
        } else {
          value_done();
        }
      } else if (c == '\\') {
        mode_ = Mode::kEscape;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        return false;  // control characters must be escaped
      }
      return true;
    case Mode::kEscape:
      if (c == 'u') {
        mode_ = Mode::kUnicode;
        hex_left_ = 4;
        return true;
      }
      mode_ = Mode::kString;
      return c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't';
    case Mode::kUnicode:
      if (!is_hex(c)) return false;
      if (--hex_left_ == 0) mode_ = Mode::kString;
      return true;
    case Mode::kLiteral:
      if (c != *literal_) return false;
      if (*++literal_ == '\0') value_done();
      return true;
    case Mode::kNumber:
      switch (number_) {
        case Number::kMinus:
          if (!is_digit(c)) return false;
          number_ = c == '0' ? Number::kZero : Number::kInt;
          return true;
        case Number::kZero:
        case Number::kInt:
          if (number_ == Number::kInt && is_digit(c)) return true;
          if (c == '.') number_ = Number::kDot;
          else if (c == 'e' || c == 'E') number_ = Number::kE;
          else return end_number_then(c);
          return true;
        case Number::kDot:
          if (!is_digit(c)) return false;
          number_ = Number::kFraction;
          return true;
        case Number::kFraction:
          if (is_digit(c)) return true;
          if (c == 'e' || c == 'E') {
            number_ = Number::kE;
            return true;
          }
          return end_number_then(c);
        case Number::kE:
          if (c == '+' || c == '-') {
            number_ = Number::kExponentSign;
            return true;
          }
          [[fallthrough]];
        case Number::kExponentSign:
          if (!is_digit(c)) return false;
          number_ = Number::kExponent;
          return true;
        case Number::kExponent:
          if (is_digit(c)) return true;
          return end_number_then(c);
      }
      return false;
    case Mode::kDone:
      return false;  // the reply ends with its object
    default:
      break;
  }
  // Between tokens of the structure: blanks (a bounded run), then what the mode expects.
  if (is_blank(c)) {
    if (whitespace_run_ >= kMaxWhitespace) return false;
    ++whitespace_run_;
    return true;
  }
  whitespace_run_ = 0;
  switch (mode_) {
    case Mode::kStart:
      if (c != '{') return false;
      open_[depth_++] = c;
      mode_ = Mode::kObjectFirst;
      return true;
    case Mode::kValue:
      return begin_value(c);
    case Mode::kArrayFirst:
      if (c == ']') {
        --depth_;
        value_done();
        return true;
      }
      return begin_value(c);
    case Mode::kObjectFirst:
    case Mode::kObjectKey:
      if (c == '}' && mode_ == Mode::kObjectFirst) {
        --depth_;
        value_done();
        return true;
      }
      if (c != '"') return false;
      mode_ = Mode::kString;
      key_ = true;
      return true;
    case Mode::kColon:
      if (c != ':') return false;
      mode_ = Mode::kValue;
      return true;
    case Mode::kAfterValue: {
      const char open = open_[depth_ - 1];
      if (c == ',') {
        mode_ = open == '{' ? Mode::kObjectKey : Mode::kValue;
        return true;
      }
      if ((c == '}' && open == '{') || (c == ']' && open == '[')) {
        --depth_;
        value_done();
        return true;
      }
      return false;
    }
    default:
      return false;
  }
}

bool JsonObjectMachine::feed(const std::string& text) {
  for (char c : text) {
    if (!feed(c)) return false;
  }
  return true;
}

std::vector<std::string> token_texts(const tokenizer::Tokenizer& tokenizer) {
  const int64_t vocab = tokenizer.vocab_size();
  const std::vector<int64_t> anchor_ids = tokenizer.encode("a", /*add_special_tokens=*/false);
  const int64_t anchor = anchor_ids.empty() ? -1 : anchor_ids.front();
  const std::string anchor_text = anchor >= 0 ? tokenizer.decode({anchor}, /*skip_special_tokens=*/false) : "";
  std::vector<std::string> texts(static_cast<size_t>(vocab));
  for (int64_t id = 0; id < vocab; ++id) {
    if (tokenizer.is_special(id)) continue;
    if (anchor < 0) {
      texts[id] = tokenizer.decode({id}, false);
      continue;
    }
    const std::string both = tokenizer.decode({anchor, id}, /*skip_special_tokens=*/false);
    texts[id] = both.compare(0, anchor_text.size(), anchor_text) == 0 ? both.substr(anchor_text.size())
                                                                        : tokenizer.decode({id}, false);
  }
  return texts;
}

JsonObjectConstraint::JsonObjectConstraint(std::shared_ptr<const std::vector<std::string>> texts,
                                           std::vector<int64_t> end_ids)
    : texts_(std::move(texts)), end_ids_(std::move(end_ids)) {}

torch::Tensor JsonObjectConstraint::allowed(const std::vector<int64_t>& generated, int64_t vocab) const {
  const std::vector<std::string>& texts = *texts_;
  const auto text_of = [&](int64_t id) -> const std::string* {
    return id >= 0 && id < static_cast<int64_t>(texts.size()) ? &texts[static_cast<size_t>(id)] : nullptr;
  };
  JsonObjectMachine machine;
  bool valid = true;
  for (int64_t id : generated) {
    const std::string* text = text_of(id);
    valid = valid && text != nullptr && machine.feed(*text);
  }
  torch::Tensor allowed = torch::zeros({vocab}, torch::kBool);  // [V]
  bool* allow = allowed.data_ptr<bool>();
  bool any = false;
  if (valid && !machine.complete()) {
    for (int64_t id = 0; id < vocab; ++id) {
      const std::string* text = text_of(id);
      if (text == nullptr || text->empty()) continue;  // special or beyond the tokenizer: never JSON
      JsonObjectMachine probe = machine;
      allow[id] = probe.feed(*text);
      any = any || allow[id];
    }
  }
  // Closed (or, defensively, nothing can continue it): only an end token.
  for (int64_t id : end_ids_) {
    if (id >= 0 && id < vocab && (machine.complete() || !any || !valid)) allow[id] = true;
  }
  return allowed;
}

}  // namespace serve
}  // namespace dschat
