#pragma once
// The values a chat template computes with, and their Python meaning: what str(), repr(),
// truthiness, == and json.dumps give for each, as jinja2 (which renders with Python objects) does.
// Private to src/tokenizer/jinja.

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace dschat {
namespace tokenizer {
namespace jinja {

/// Where a token or node starts in the template source (1-based).
struct Pos {
  int line = 1;
  int column = 1;
};

/// "ORIGIN:LINE:COLUMN" for messages.
std::string where(const std::string& origin, Pos pos);

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python's dict
struct Callable;

enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict, kNamespace, kCallable };

struct Value {
  Kind kind = Kind::kUndefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0.0;
  std::string text;                     // kString; for kUndefined, what was undefined (for errors)
  std::shared_ptr<List> list;           // kList, kTuple
  std::shared_ptr<Dict> dict;           // kDict, kNamespace (a namespace's attributes are mutable)
  std::shared_ptr<const Callable> callable;

  static Value undefined(std::string what = "");
  static Value none();
  static Value of(bool b);
  static Value of(int64_t i);
  static Value of(double d);
  static Value of(std::string s);
  static Value of_list(List items, bool tuple = false);
  static Value of_dict(Dict entries);
  static Value of_namespace(Dict entries);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_sequence() const { return kind == Kind::kList || kind == Kind::kTuple; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  /// The dict entry `key`, or nullptr (kDict and kNamespace).
  const Value* find(const std::string& key) const;
};

/// Arguments of a call: positional, then keyword (in call order).
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

/// A builtin function, or a method bound to its object (e.g. "abc".split).
struct Callable {
  std::string name;
  std::function<Value(const Args&)> call;
};

/// The Python type name jinja2 would show ("str", "int", "dict", "undefined", ...).
const char* type_name(const Value& value);
/// Python's bool(value).
bool truthy(const Value& value);
/// Python's str(value) (undefined: ""). Throws core::InvalidArgument for callables.
std::string to_str(const Value& value);
/// Python's repr(value).
std::string repr(const Value& value);
/// Python's float repr ("1.0", "0.30000000000000004", "1e+16").
std::string float_repr(double value);
/// Python's value == other (1 == 1.0 == True; dicts compare unordered).
bool equal(const Value& a, const Value& b);
/// json.dumps(value, ensure_ascii=False, indent=indent (<0: none), separators, sort_keys).
std::string to_json(const Value& value, int indent, const std::string& item_separator,
                    const std::string& key_separator, bool sort_keys);
/// A JSON document as template data (objects keep their key order).
Value from_json(const nlohmann::ordered_json& json);

// ---- UTF-8 text as Python's str sees it: a sequence of code points.
std::vector<uint32_t> code_points(const std::string& text);
std::string utf8(const std::vector<uint32_t>& points);
/// str.isspace() for one code point (also what `\s` matches in jinja2's lexer).
bool is_space(uint32_t point);
/// str.strip/lstrip/rstrip: `chars` empty and !has_chars: whitespace.
std::string strip(const std::string& text, bool left, bool right, const std::string* chars = nullptr);

}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
