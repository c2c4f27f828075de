#pragma once
// A byte machine that accepts exactly the prefixes of the JSON texts a compiled schema allows
// (json_schema.h), RFC 8259's grammar included: schema-guided decoding reads the reply so far
// through it and probes each token's text on a copy. Where an anyOf's branches could all begin
// with the same byte, the machine follows each of them as its own path until the bytes tell them
// apart (at most kMaxPaths at once; a byte that would need more is refused).
//
// Bytes of 0x80 and above are taken as they come inside strings without keywords (UTF-8 is not
// checked: a byte-level token's text may hold part of a character); a string with minLength,
// maxLength, pattern or format is read as code points (UTF-8 checked as Python decodes it, no
// surrogate escapes), counted and stepped through its pattern (json_regex.h), and closes only
// where it keeps them. A bounded integer's digits come only while some value in bounds can still
// follow; a bounded number is written without an exponent, in at most 15 significant digits
// (json_decimal.h), its digits coming only while a number in bounds can still follow. Runs of
// whitespace between tokens are
// bounded (kMaxWhitespace: a model must not loop on blanks until max_tokens), so are a number's
// digit runs (kMaxDigits, kMaxExponentDigits: a sampled model otherwise writes integers of
// hundreds of digits, which no int64 or double holds) and nesting (kMaxDepth), and nothing may
// follow the value (the reply ends there).

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

#include "serve/json_schema.h"

namespace dschat {
namespace serve {

class JsonMachine {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxWhitespace = 16;
  static constexpr int kMaxPaths = 64;  // an anyOf's branches read side by side (json_schema.h bounds them)
  static constexpr int kMaxDigits = 20;         // an integer part, a fraction
  static constexpr int kMaxExponentDigits = 2;   // up to 1e119: never beyond a double

  /// `schema` must outlive the machine.
  explicit JsonMachine(const JsonSchema& schema);
  JsonMachine(const JsonMachine& other) { *this = other; }
  JsonMachine& operator=(const JsonMachine& other);

  /// false: `c` cannot continue the text (the machine is then unusable: feed a copy to probe).
  bool feed(char c);
  bool feed(const std::string& text);
  /// The text so far is a whole value of the schema (a number may still go on: "1" -> "12").
  bool complete() const;
  /// One way of reading, inside a string without keywords (where a token of plain bytes changes
  /// nothing).
  bool reading_string() const { return count_ == 1 && plain_string(paths_[0]); }
  /// Inside a string whose only keywords are minLength / maxLength, between characters: how many
  /// more code points it may take (INT64_MAX: no maxLength); -1 anywhere else.
  int64_t length_only_string_room() const;
  /// Whole, and nothing may follow (a closed object; "1" may still become "12").
  bool closed() const;

 private:
  enum class Mode : uint8_t {
    kStructure, kString, kEscape, kUnicode, kNumber, kLiteral, kEnum, kKey, kDone
  };
  enum class Stage : uint8_t { kFirst, kKey, kColon, kValue, kAfterValue };
  enum class Number : uint8_t { kMinus, kZero, kInt, kDot, kFraction, kE, kExponentSign, kExponent };
  enum class Step : uint8_t { kRefused, kTaken, kSplit };
  // One open object or array.
  struct Frame {
    int32_t node;    // a kObject, kArray or kAny node
    Stage stage;
    bool object;     // '{' (a kAny node opens either)
    uint16_t next;   // object: the first property that may still come; array: items so far
  };
  // One way of reading the text: the open containers and the token being read. No member
  // initializers: the machine is copied once per probed token, and unused paths stay unset.
  struct Path {
    Mode mode;             // kStructure (0) in a value-initialized Path
    Number number;
    bool integer;          // the number being read must be an integer
    bool key;              // the string being read is a key of an object without properties
    uint8_t hex_left;      // \uXXXX digits still to come
    uint8_t whitespace_run;
    uint8_t digits;        // of the number's current digit run
    uint8_t depth;
    int32_t value_node;    // the node of the value that comes next (or the enum being read)
    const char* literal;   // the rest of true / false / null
    uint32_t lo, hi;       // enum: the candidate values [lo, hi)
    uint64_t key_mask;     // key: which of properties [frame.next, frame.next + 64) still match
    uint32_t at;           // enum / key: bytes of the candidates matched so far
    // The string or integer being read when its node has keywords (-1: none): a string's code
    // points so far, the one being decoded and the bytes it still needs (the next one within
    // [utf8_lo, utf8_hi]), its pattern's states; an integer's sign and magnitude (saturating).
    int32_t checked_node;
    uint32_t chars;
    uint32_t code_point;
    uint8_t utf8_left, utf8_lo, utf8_hi;
    bool negative;
    uint64_t magnitude;       // a bounded number: all its digits so far, the point left out
    uint8_t fraction_digits;  // a bounded number: of them after the point
    uint8_t significant;      // a bounded number: of them from the first non-zero one
    JsonRegex::States pattern;
    std::array<Frame, kMaxDepth> frames;  // last: a copy takes [depth] of them (operator=)
  };
  static_assert(std::is_trivially_copyable_v<Path>);

  Step step(Path& path, char c) const;
  Step structure(Path& path, char c) const;
  Step begin_value(Path& path, int32_t node, char c) const;
  Step number(Path& path, char c) const;
  Step checked_string(Path& path, char c) const;
  Step escaped(Path& path, char c) const;
  Step string_char(Path& path, uint32_t code_point) const;
  bool string_may_take(const Path& path, uint32_t lo, uint32_t hi) const;
  bool utf8_may_go_on(const Path& path) const;
  bool unicode_may_go_on(const Path& path) const;
  Step integer_digit(Path& path, char c) const;
  bool integer_reachable(const Path& path) const;
  bool integer_in_bounds(const Path& path) const;
  Step bounded_number(Path& path, char c) const;
  Step number_digit(Path& path, char c, bool fraction) const;
  bool number_reachable(const Path& path) const;
  bool number_in_bounds(const Path& path) const;
  bool in_bounds(const Path& path) const { return path.integer ? integer_in_bounds(path) : number_in_bounds(path); }
  bool number_whole(const Path& path) const;
  static bool plain_string(const Path& path) { return path.mode == Mode::kString && path.checked_node < 0; }
  Step enumeration(Path& path, char c) const;
  Step key(Path& path, char c) const;
  Step begin_key(Path& path) const;
  Step end_then(Path& path, char c) const;  // the token ended at `c`: the value is done, read c after it
  Step close_container(Path& path) const;
  void value_done(Path& path) const;
  bool may_close(const Frame& frame) const;
  bool may_take_item(const Frame& frame) const;
  int32_t member_node(const Frame& frame) const;  // a value's node in an object without properties / an array
  bool path_complete(const Path& path) const;
  const JsonSchemaNode& at(int32_t node) const { return schema_->nodes[static_cast<size_t>(node)]; }

  const JsonSchema* schema_;
  uint8_t count_;  // paths in use
  std::array<Path, kMaxPaths> paths_;  // [count_] in use
};

}  // namespace serve
}  // namespace dschat
