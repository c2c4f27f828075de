#include "serve/json_machine.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

namespace dschat {
namespace serve {
namespace {

using Kind = JsonSchemaNode::Kind;

bool json_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool json_digit(char c) { return c >= '0' && c <= '9'; }
bool json_hex(char c) { return json_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

JsonMachine::JsonMachine(const JsonSchema& schema) : schema_(&schema), count_(1) {
  paths_[0] = Path{};
  paths_[0].value_node = schema.root;
}

// Copies only what is in use (a probe copies the machine once per token of the vocabulary): the
// live paths, and of each its open frames.
JsonMachine& JsonMachine::operator=(const JsonMachine& other) {
  schema_ = other.schema_;
  count_ = other.count_;
  for (uint8_t i = 0; i < count_; ++i) {
    const Path& from = other.paths_[i];
    std::memcpy(static_cast<void*>(&paths_[i]), &from, offsetof(Path, frames) + from.depth * sizeof(Frame));
  }
  return *this;
}

bool JsonMachine::feed(char c) {
  const uint8_t before = count_;
  uint8_t kept = 0;
  std::vector<Path> spawned;  // paths an anyOf split into at this byte
  for (uint8_t i = 0; i < before; ++i) {
    Path& path = paths_[i];
    const Step outcome = step(path, c);
    if (outcome == Step::kTaken) {
      if (kept != i) paths_[kept] = path;
      ++kept;
    } else if (outcome == Step::kSplit) {  // a value of an anyOf begins: each branch reads c its own way
      for (int32_t branch : at(path.value_node).branches) {
        Path copy = path;
        if (begin_value(copy, branch, c) == Step::kTaken) spawned.push_back(copy);
      }
    }
  }
  if (kept + spawned.size() > static_cast<size_t>(kMaxPaths)) return false;
  for (const Path& path : spawned) paths_[kept++] = path;
  count_ = kept;
  return count_ > 0;
}

bool JsonMachine::feed(const std::string& text) {
  const size_t size = text.size();
  for (size_t i = 0; i < size;) {
    // Inside a string most bytes change nothing: skip them without a step (a token's text is
    // mostly such bytes while the model writes a string value).
    if (count_ == 1 && plain_string(paths_[0])) {
      while (i < size && text[i] != '"' && text[i] != '\\' && static_cast<unsigned char>(text[i]) >= 0x20) ++i;
      if (i == size) break;
    }
    if (!feed(text[i++])) return false;
  }
  return true;
}

bool JsonMachine::complete() const {
  for (uint8_t i = 0; i < count_; ++i) {
    if (path_complete(paths_[i])) return true;
  }
  return false;
}

bool JsonMachine::closed() const {
  for (uint8_t i = 0; i < count_; ++i) {
    if (paths_[i].mode != Mode::kDone) return false;
  }
  return true;
}

bool JsonMachine::path_complete(const Path& path) const {
  if (path.mode == Mode::kDone) return true;
  if (path.depth != 0) return false;
  if (path.mode == Mode::kNumber) return number_whole(path) && (path.checked_node < 0 || in_bounds(path));
  return path.mode == Mode::kEnum && at(path.value_node).values[path.lo].size() == path.at;
}

JsonMachine::Step JsonMachine::step(Path& path, char c) const {
  switch (path.mode) {
    case Mode::kStructure:
      return structure(path, c);
    case Mode::kString:
      if (path.checked_node >= 0) return checked_string(path, c);
      if (c == '"') {
        if (path.key) {
          Frame& frame = path.frames[path.depth - 1];
          frame.stage = Stage::kColon;
          path.value_node = member_node(frame);
          path.mode = Mode::kStructure;
        } else {
          value_done(path);
        }
      } else if (c == '\\') {
        path.mode = Mode::kEscape;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        return Step::kRefused;  // control characters must be escaped
      }
      return Step::kTaken;
    case Mode::kEscape:
      if (path.checked_node >= 0) return escaped(path, c);
      if (c == 'u') {
        path.mode = Mode::kUnicode;
        path.hex_left = 4;
        return Step::kTaken;
      }
      path.mode = Mode::kString;
      return c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't'
                 ? Step::kTaken
                 : Step::kRefused;
    case Mode::kUnicode:
      if (!json_hex(c)) return Step::kRefused;
      path.code_point = path.code_point * 16 + static_cast<uint32_t>(json_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10);
      if (--path.hex_left == 0) {
        path.mode = Mode::kString;
        if (path.checked_node >= 0) return string_char(path, path.code_point);
      }
      if (path.checked_node >= 0 && path.hex_left > 0 && !unicode_may_go_on(path)) return Step::kRefused;
      return Step::kTaken;
    case Mode::kLiteral:
      if (c != *path.literal) return Step::kRefused;
      if (*++path.literal == '\0') value_done(path);
      return Step::kTaken;
    case Mode::kNumber:
      return number(path, c);
    case Mode::kEnum:
      return enumeration(path, c);
    case Mode::kKey:
      return key(path, c);
    case Mode::kDone:
      break;  // the reply ends with its value
  }
  return Step::kRefused;
}

// Between tokens: blanks (a bounded run), then what the open container's stage expects.
JsonMachine::Step JsonMachine::structure(Path& path, char c) const {
  if (json_blank(c)) {
    if (path.whitespace_run >= kMaxWhitespace) return Step::kRefused;
    ++path.whitespace_run;
    return Step::kTaken;
  }
  path.whitespace_run = 0;
  if (path.depth == 0) return begin_value(path, path.value_node, c);
  Frame& frame = path.frames[path.depth - 1];
  const bool close = c == (frame.object ? '}' : ']');
  switch (frame.stage) {
    case Stage::kFirst:
      if (close && may_close(frame)) return close_container(path);
      if (frame.object) return c == '"' ? begin_key(path) : Step::kRefused;
      if (!may_take_item(frame)) return Step::kRefused;
      return begin_value(path, member_node(frame), c);
    case Stage::kKey:
      return c == '"' ? begin_key(path) : Step::kRefused;
    case Stage::kColon:
      if (c != ':') return Step::kRefused;
      frame.stage = Stage::kValue;
      return Step::kTaken;
    case Stage::kValue:
      return begin_value(path, path.value_node, c);
    case Stage::kAfterValue:
      if (close) return may_close(frame) ? close_container(path) : Step::kRefused;
      if (c != ',') return Step::kRefused;
      if (frame.object) {
        const JsonSchemaNode& node = at(frame.node);
        if (node.kind == Kind::kObject && !node.properties.empty() && frame.next >= node.properties.size()) {
          return Step::kRefused;  // every declared property has come: no key can follow
        }
        frame.stage = Stage::kKey;
      } else {
        if (!may_take_item(frame)) return Step::kRefused;
        frame.stage = Stage::kValue;
        path.value_node = member_node(frame);
      }
      return Step::kTaken;
  }
  return Step::kRefused;
}

JsonMachine::Step JsonMachine::begin_value(Path& path, int32_t node_index, char c) const {
  const JsonSchemaNode& node = at(node_index);
  const Kind kind = node.kind;
  if (kind == Kind::kAnyOf) {
    path.value_node = node_index;
    return Step::kSplit;
  }
  const bool any = kind == Kind::kAny;
  if ((c == '{' && (any || kind == Kind::kObject)) || (c == '[' && (any || kind == Kind::kArray))) {
    if (path.depth == kMaxDepth) return Step::kRefused;
    path.frames[path.depth++] = Frame{node_index, Stage::kFirst, c == '{', 0};
    return Step::kTaken;
  }
  if (c == '"' && (any || kind == Kind::kString)) {
    path.mode = Mode::kString;
    path.key = false;
    const bool checked = !any && (node.min_length > 0 || node.max_length >= 0 || node.pattern >= 0);
    path.checked_node = checked ? node_index : -1;
    path.chars = 0;
    path.utf8_left = 0;
    path.pattern = JsonRegex::start();
    return Step::kTaken;  // the schema compiled: some string keeps its keywords (json_schema_scalars.cpp)
  }
  if ((c == '-' || json_digit(c)) && (any || kind == Kind::kNumber || kind == Kind::kInteger)) {
    path.mode = Mode::kNumber;
    path.integer = kind == Kind::kInteger;
    path.number = c == '-' ? Number::kMinus : c == '0' ? Number::kZero : Number::kInt;
    path.digits = c == '-' ? 0 : 1;
    path.checked_node = node.bounded ? node_index : -1;
    if (path.checked_node < 0) return Step::kTaken;
    path.negative = c == '-';
    path.magnitude = c == '-' ? 0 : static_cast<uint64_t>(c - '0');
    if (path.integer) return integer_reachable(path) ? Step::kTaken : Step::kRefused;
    path.magnitude = 0;
    path.digits = 0;
    path.fraction_digits = 0;
    path.significant = 0;
    return c == '-' ? (number_reachable(path) ? Step::kTaken : Step::kRefused) : number_digit(path, c, false);
  }
  const bool boolean = any || kind == Kind::kBoolean;
  if ((c == 't' && boolean) || (c == 'f' && boolean) || (c == 'n' && (any || kind == Kind::kNull))) {
    path.mode = Mode::kLiteral;
    path.literal = c == 't' ? "rue" : c == 'f' ? "alse" : "ull";
    return Step::kTaken;
  }
  if (kind == Kind::kEnum) {
    path.mode = Mode::kEnum;
    path.value_node = node_index;
    path.lo = 0;
    path.hi = static_cast<uint32_t>(node.values.size());
    path.at = 0;
    return enumeration(path, c);
  }
  return Step::kRefused;
}

JsonMachine::Step JsonMachine::number(Path& path, char c) const {
  if (path.checked_node >= 0 && !path.integer) return bounded_number(path, c);
  const bool fraction_or_exponent = c == '.' || c == 'e' || c == 'E';
  // One more digit of the current run, within its bound.
  const auto digit = [&](int bound) { return ++path.digits <= bound ? Step::kTaken : Step::kRefused; };
  switch (path.number) {
    case Number::kMinus:
      if (!json_digit(c)) return Step::kRefused;
      path.number = c == '0' ? Number::kZero : Number::kInt;
      path.digits = 1;
      return path.checked_node >= 0 ? integer_digit(path, c) : Step::kTaken;
    case Number::kZero:
    case Number::kInt:
      if (path.number == Number::kInt && json_digit(c)) {
        const Step taken = digit(kMaxDigits);
        return taken == Step::kTaken && path.checked_node >= 0 ? integer_digit(path, c) : taken;
      }
      if (!fraction_or_exponent || path.integer) return end_then(path, c);
      path.number = c == '.' ? Number::kDot : Number::kE;
      path.digits = 0;
      return Step::kTaken;
    case Number::kDot:
      if (!json_digit(c)) return Step::kRefused;
      path.number = Number::kFraction;
      return digit(kMaxDigits);
    case Number::kFraction:
      if (json_digit(c)) return digit(kMaxDigits);
      if (c != 'e' && c != 'E') return end_then(path, c);
      path.number = Number::kE;
      path.digits = 0;
      return Step::kTaken;
    case Number::kE:
      if (c == '+' || c == '-') {
        path.number = Number::kExponentSign;
        return Step::kTaken;
      }
      [[fallthrough]];
    case Number::kExponentSign:
      if (!json_digit(c)) return Step::kRefused;
      path.number = Number::kExponent;
      return digit(kMaxExponentDigits);
    case Number::kExponent:
      if (json_digit(c)) return digit(kMaxExponentDigits);
      return end_then(path, c);
  }
  return Step::kRefused;
}

// The candidates [lo, hi) share their first `at` bytes; being sorted, those going on with `c`
// are again a range. A candidate that is whole ends the value once no other can go on (a number
// such as 1 among 1 and 12 ends at the first byte that is not 2).
JsonMachine::Step JsonMachine::enumeration(Path& path, char c) const {
  const std::vector<std::string>& values = at(path.value_node).values;
  const bool whole = values[path.lo].size() == path.at;  // the shortest candidate sorts first
  // In the range, ordered by the byte at `at` (a candidate ending there first): binary search.
  const size_t position = path.at;
  const auto key = [position](const std::string& value) {
    return value.size() > position ? static_cast<int>(static_cast<unsigned char>(value[position])) : -1;
  };
  const int wanted = static_cast<unsigned char>(c);
  const auto first = values.begin() + path.lo, last = values.begin() + path.hi;
  const auto from = std::partition_point(first, last, [&](const std::string& v) { return key(v) < wanted; });
  const auto to = std::partition_point(from, last, [&](const std::string& v) { return key(v) == wanted; });
  const auto lo = static_cast<uint32_t>(from - values.begin()), hi = static_cast<uint32_t>(to - values.begin());
  if (lo == hi) return whole ? end_then(path, c) : Step::kRefused;
  path.lo = lo;
  path.hi = hi;
  ++path.at;
  if (hi - lo == 1 && values[lo].size() == path.at) value_done(path);
  return Step::kTaken;
}

// A key of an object with properties: the ones that may come here are matched byte by byte.
JsonMachine::Step JsonMachine::begin_key(Path& path) const {
  const Frame& frame = path.frames[path.depth - 1];
  const JsonSchemaNode& node = at(frame.node);
  if (node.kind == Kind::kAny || node.properties.empty()) {
    if (member_node(frame) < 0) return Step::kRefused;  // additionalProperties false: only {}
    path.mode = Mode::kString;
    path.key = true;
    path.checked_node = -1;
    return Step::kTaken;
  }
  // From the first property not yet passed up to the first required one (it cannot be skipped).
  uint64_t mask = 0;
  for (size_t i = frame.next, bit = 0; i < node.properties.size() && bit < 64; ++i, ++bit) {
    mask |= uint64_t{1} << bit;
    if (node.properties[i].required) break;
  }
  if (mask == 0) return Step::kRefused;
  path.mode = Mode::kKey;
  path.key_mask = mask;
  path.at = 1;  // every key text starts with its quote
  return Step::kTaken;
}

JsonMachine::Step JsonMachine::key(Path& path, char c) const {
  Frame& frame = path.frames[path.depth - 1];
  const JsonSchemaNode& node = at(frame.node);
  uint64_t mask = 0;
  int whole = -1;
  for (uint64_t bits = path.key_mask; bits != 0; bits &= bits - 1) {
    const int bit = __builtin_ctzll(bits);
    const std::string& text = node.properties[frame.next + static_cast<size_t>(bit)].key_text;
    if (text.size() <= path.at || text[path.at] != c) continue;
    mask |= uint64_t{1} << bit;
    if (text.size() == path.at + 1) whole = bit;  // its closing quote: no other key can match on
  }
  if (mask == 0) return Step::kRefused;
  ++path.at;
  path.key_mask = mask;
  if (whole >= 0) {
    const size_t property = frame.next + static_cast<size_t>(whole);
    path.value_node = node.properties[property].node;
    frame.next = static_cast<uint16_t>(property + 1);
    frame.stage = Stage::kColon;
    path.mode = Mode::kStructure;
  }
  return Step::kTaken;
}

JsonMachine::Step JsonMachine::close_container(Path& path) const {
  --path.depth;
  value_done(path);
  return Step::kTaken;
}

// The token being read (a number, or an enum value that another could have gone on from) ended
// at `c`, which is read after the value.
JsonMachine::Step JsonMachine::end_then(Path& path, char c) const {
  if (path.mode == Mode::kNumber) {
    if (!number_whole(path)) return Step::kRefused;
    if (path.checked_node >= 0 && !in_bounds(path)) return Step::kRefused;
  }
  value_done(path);
  return step(path, c);
}

bool JsonMachine::number_whole(const Path& path) const {
  return path.number == Number::kZero || path.number == Number::kInt || path.number == Number::kFraction ||
         path.number == Number::kExponent;
}

void JsonMachine::value_done(Path& path) const {
  path.mode = path.depth == 0 ? Mode::kDone : Mode::kStructure;
  if (path.depth == 0) return;
  Frame& frame = path.frames[path.depth - 1];
  frame.stage = Stage::kAfterValue;
  if (!frame.object && frame.next < UINT16_MAX) ++frame.next;
}

bool JsonMachine::may_close(const Frame& frame) const {
  const JsonSchemaNode& node = at(frame.node);
  if (node.kind == Kind::kAny) return true;
  if (frame.object) return node.properties.empty() || !node.required_from[frame.next];
  return frame.next >= node.min_items;
}

bool JsonMachine::may_take_item(const Frame& frame) const {
  const JsonSchemaNode& node = at(frame.node);
  return node.kind == Kind::kAny || node.max_items < 0 || frame.next < node.max_items;
}

int32_t JsonMachine::member_node(const Frame& frame) const {
  const JsonSchemaNode& node = at(frame.node);
  if (node.kind == Kind::kAny) return frame.node;
  if (frame.object) return node.additional;
  return frame.next < node.prefix_items.size() ? node.prefix_items[frame.next] : node.items;
}

}  // namespace serve
}  // namespace dschat
