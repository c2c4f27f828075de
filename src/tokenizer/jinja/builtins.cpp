// Filters and tests (jinja2's, with transformers' tojson).
#include "tokenizer/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "dschat/core/error.h"

namespace dschat {
namespace tokenizer {
namespace jinja {
namespace builtins_detail {

const char* const kFilters[] = {"abs", "capitalize", "count", "d", "default", "first", "float", "int", "items",
                                "join", "last", "length", "list", "lower", "map", "reject", "rejectattr", "replace",
                                "reverse", "safe", "select", "selectattr", "string", "title", "tojson", "trim", "upper"};
const char* const kTests[] = {"defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number",
                              "integer", "float", "boolean", "true", "false", "callable", "eq", "equalto", "==", "ne",
                              "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "in",
                              "odd", "even", "divisibleby", "lower", "upper", "sameas"};

Args shifted(const Args& args, size_t drop) {
  Args rest;
  rest.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(std::min(drop, args.positional.size())),
                         args.positional.end());
  rest.keyword = args.keyword;
  return rest;
}

// jinja2's do_title: words begin after runs of "-", whitespace, "(", "{", "[", "<".
std::string title(const std::string& text) {
  std::string out;
  bool start = true;
  for (char c : text) {
    DSCHAT_CHECK(static_cast<unsigned char>(c) < 0x80, Unsupported, "title of non-ASCII text is not supported by dschat's Jinja subset");
    const bool separator = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || std::isspace(static_cast<unsigned char>(c));
    out += static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
    start = separator;
  }
  return out;
}

Value to_json_filter(const Value& value, const Args& args) {
  check_args(args, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  const Value* ascii = arg(args, 0, "ensure_ascii");
  DSCHAT_CHECK(!ascii || !truthy(*ascii), Unsupported, "tojson(ensure_ascii=True) is not supported by dschat's Jinja subset");
  const Value* indent = arg(args, 1, "indent");
  const bool indented = indent && indent->kind != Kind::kNone;
  DSCHAT_CHECK(!indented || indent->kind == Kind::kInt, Unsupported, "tojson(indent=...) needs an integer");
  std::string item_sep = indented ? "," : ", ", key_sep = ": ";
  if (const Value* separators = arg(args, 2, "separators"); separators && separators->kind != Kind::kNone) {
    DSCHAT_CHECK(separators->is_sequence() && separators->list->size() == 2 && (*separators->list)[0].is_string() &&
                     (*separators->list)[1].is_string(),
                 InvalidArgument, "tojson(separators=...) needs two strings");
    item_sep = (*separators->list)[0].text;
    key_sep = (*separators->list)[1].text;
  }
  const Value* sort = arg(args, 3, "sort_keys");
  return Value::of(to_json(value, indented ? static_cast<int>(std::max<int64_t>(indent->integer, 0)) : -1, item_sep,
                           key_sep, sort && truthy(*sort)));
}

// select/reject (attribute empty) and selectattr/rejectattr.
Value select(const Value& value, const Args& args, bool keep, bool by_attribute) {
  List out;
  std::string attribute;
  size_t next = 0;
  if (by_attribute) {
    const Value* a = arg(args, 0, "attribute");
    DSCHAT_CHECK(a && a->is_string(), InvalidArgument, "selectattr/rejectattr need an attribute name");
    attribute = a->text;
    next = 1;
  }
  const Value* test = next < args.positional.size() ? &args.positional[next] : nullptr;
  DSCHAT_CHECK(!test || test->is_string(), InvalidArgument, "select: the test must be named by a string");
  DSCHAT_CHECK(!test || is_test(test->text), Unsupported, "the test '", test ? test->text : "", "' is not supported by dschat's Jinja subset");
  const Args test_args = shifted(args, next + 1);
  for (const Value& item : iterate(value)) {
    const Value subject = by_attribute ? get_attribute(item, attribute) : item;
    const bool passed = test ? apply_test(test->text, subject, test_args) : truthy(subject);
    if (passed == keep) out.push_back(item);
  }
  return Value::of_list(std::move(out));
}

Value map(const Value& value, const Args& args) {
  List out;
  if (const Value* attribute = arg(args, 99, "attribute")) {
    DSCHAT_CHECK(attribute->is_string(), InvalidArgument, "map(attribute=...) needs a string");
    const Value* fallback = arg(args, 99, "default");
    for (const Value& item : iterate(value)) {
      Value v = get_attribute(item, attribute->text);
      out.push_back(v.is_undefined() && fallback ? *fallback : v);
    }
    return Value::of_list(std::move(out));
  }
  DSCHAT_CHECK(!args.positional.empty() && args.positional[0].is_string(), InvalidArgument,
               "map() needs a filter name or attribute=");
  const std::string& filter = args.positional[0].text;
  DSCHAT_CHECK(is_filter(filter), Unsupported, "the filter '", filter, "' is not supported by dschat's Jinja subset");
  const Args rest = shifted(args, 1);
  for (const Value& item : iterate(value)) out.push_back(apply_filter(filter, item, rest));
  return Value::of_list(std::move(out));
}

Value to_int(const Value& value, const Args& args) {
  check_args(args, "int", {"default", "base"});
  DSCHAT_CHECK(!value.is_undefined(), InvalidArgument, "int of an undefined value");
  const Value* fallback = arg(args, 0, "default");
  const Value otherwise = fallback ? *fallback : Value::of(int64_t{0});
  switch (value.kind) {
    case Kind::kInt: return value;
    case Kind::kBool: return Value::of(static_cast<int64_t>(value.boolean));
    case Kind::kFloat: return std::isfinite(value.number) ? Value::of(static_cast<int64_t>(value.number)) : otherwise;
    case Kind::kString: {
      const std::string text = strip(value.text, true, true);
      char* end = nullptr;
      const long long parsed = std::strtoll(text.c_str(), &end, 10);
      if (!text.empty() && end == text.c_str() + text.size()) return Value::of(static_cast<int64_t>(parsed));
      const double number = std::strtod(text.c_str(), &end);
      if (!text.empty() && end == text.c_str() + text.size() && std::isfinite(number)) return Value::of(static_cast<int64_t>(number));
      return otherwise;
    }
    default: return otherwise;
  }
}

Value to_float(const Value& value, const Args& args) {
  check_args(args, "float", {"default"});
  DSCHAT_CHECK(!value.is_undefined(), InvalidArgument, "float of an undefined value");
  const Value* fallback = arg(args, 0, "default");
  const Value otherwise = fallback ? *fallback : Value::of(0.0);
  if (value.is_number()) return Value::of(value.kind == Kind::kFloat ? value.number : static_cast<double>(value.kind == Kind::kBool ? value.boolean : value.integer));
  if (value.is_string()) {
    const std::string text = strip(value.text, true, true);
    char* end = nullptr;
    const double number = std::strtod(text.c_str(), &end);
    if (!text.empty() && end == text.c_str() + text.size()) return Value::of(number);
  }
  return otherwise;
}

}  // namespace builtins_detail

namespace bd = builtins_detail;

bool is_filter(const std::string& name) {
  return std::any_of(std::begin(bd::kFilters), std::end(bd::kFilters), [&](const char* f) { return name == f; });
}

bool is_test(const std::string& name) {
  return std::any_of(std::begin(bd::kTests), std::end(bd::kTests), [&](const char* t) { return name == t; });
}

Value apply_filter(const std::string& name, const Value& value, const Args& args) {
  if (name == "default" || name == "d") {
    check_args(args, name, {"default_value", "boolean"});
    const Value* fallback = arg(args, 0, "default_value");
    const Value* boolean = arg(args, 1, "boolean");
    const bool use = value.is_undefined() || (boolean && truthy(*boolean) && !truthy(value));
    return use ? (fallback ? *fallback : Value::of(std::string())) : value;
  }
  if (name == "tojson") return bd::to_json_filter(value, args);
  if (name == "map") return bd::map(value, args);
  if (name == "select" || name == "reject") return bd::select(value, args, name == "select", false);
  if (name == "selectattr" || name == "rejectattr") return bd::select(value, args, name == "selectattr", true);
  if (name == "int") return bd::to_int(value, args);
  if (name == "float") return bd::to_float(value, args);
  if (name == "join") {
    check_args(args, name, {"d", "attribute"});
    const Value* separator = arg(args, 0, "d");
    const Value* attribute = arg(args, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(value)) {
      if (!first) out += separator ? to_str(*separator) : "";
      first = false;
      out += to_str(attribute ? get_item(item, *attribute) : item);
    }
    return Value::of(out);
  }
  if (name == "replace") {
    check_args(args, name, {"old", "new", "count"});
    const Value* old_text = arg(args, 0, "old");
    const Value* new_text = arg(args, 1, "new");
    const Value* count = arg(args, 2, "count");
    DSCHAT_CHECK(old_text && new_text, InvalidArgument, "replace() needs the old and the new text");
    const std::string from = to_str(*old_text), to = to_str(*new_text);
    DSCHAT_CHECK(!from.empty(), Unsupported, "replace('') is not supported by dschat's Jinja subset");
    std::string text = to_str(value), out;
    int64_t left = count && count->kind == Kind::kInt ? count->integer : -1;
    size_t start = 0;
    for (size_t at; left != 0 && (at = text.find(from, start)) != std::string::npos; start = at + from.size(), --left) {
      out += text.substr(start, at - start) + to;
    }
    return Value::of(out + text.substr(start));
  }
  if (name == "trim") {
    check_args(args, name, {"chars"});
    const Value* chars = arg(args, 0, "chars");
    const bool given = chars && chars->kind != Kind::kNone;
    return Value::of(strip(to_str(value), true, true, given ? &chars->text : nullptr));
  }
  check_args(args, name, {});  // the filters below take no arguments
  if (name == "length" || name == "count") return Value::of(length(value));
  if (name == "string") return Value::of(to_str(value));
  if (name == "safe") return value;
  if (name == "upper" || name == "lower") return method(Value::of(to_str(value)), name).callable->call(Args{});
  if (name == "capitalize") return method(Value::of(to_str(value)), name).callable->call(Args{});
  if (name == "title") return Value::of(bd::title(to_str(value)));
  if (name == "list") return Value::of_list(iterate(value));
  if (name == "first" || name == "last") {
    const List items = iterate(value);
    if (items.empty()) return Value::undefined("no " + name + " item, the sequence was empty");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (value.is_string()) {
      std::vector<uint32_t> points = code_points(value.text);
      std::reverse(points.begin(), points.end());
      return Value::of(utf8(points));
    }
    List items = iterate(value);
    std::reverse(items.begin(), items.end());
    return Value::of_list(std::move(items));
  }
  if (name == "items") {
    if (value.is_undefined()) return Value::of_list({});
    DSCHAT_CHECK(value.kind == Kind::kDict, InvalidArgument, "items: can only get items from a mapping, got ", type_name(value));
    return method(value, "items").callable->call(Args{});
  }
  if (name == "abs") {
    if (value.kind == Kind::kFloat) return Value::of(std::fabs(value.number));
    DSCHAT_CHECK(value.kind == Kind::kInt || value.kind == Kind::kBool, InvalidArgument, "bad operand type for abs(): '",
                 type_name(value), "'");
    const int64_t i = value.kind == Kind::kBool ? value.boolean : value.integer;
    return Value::of(i < 0 ? -i : i);
  }
  DSCHAT_THROW(Unsupported, "the filter '", name, "' is not supported by dschat's Jinja subset");
}

bool apply_test(const std::string& name, const Value& value, const Args& args) {
  const Value* other = arg(args, 0, "other");
  const auto need_other = [&]() -> const Value& {
    DSCHAT_CHECK(other, InvalidArgument, "the test '", name, "' needs an argument");
    return *other;
  };
  const auto is_integer = [](const Value& v) { return v.kind == Kind::kInt; };
  if (name == "defined") return !value.is_undefined();
  if (name == "undefined") return value.is_undefined();
  if (name == "none") return value.kind == Kind::kNone;
  if (name == "string") return value.is_string();
  if (name == "mapping") return value.kind == Kind::kDict;
  if (name == "iterable" || name == "sequence") {
    return value.is_sequence() || value.is_string() || value.kind == Kind::kDict || value.is_undefined();
  }
  if (name == "number") return value.is_number();
  if (name == "integer") return is_integer(value);
  if (name == "float") return value.kind == Kind::kFloat;
  if (name == "boolean") return value.kind == Kind::kBool;
  if (name == "true") return value.kind == Kind::kBool && value.boolean;
  if (name == "false") return value.kind == Kind::kBool && !value.boolean;
  if (name == "callable") return value.kind == Kind::kCallable;
  if (name == "eq" || name == "equalto" || name == "==") return equal(value, need_other());
  if (name == "ne" || name == "!=") return !equal(value, need_other());
  if (name == "lt" || name == "lessthan" || name == "<") return compare(value, need_other(), "<") < 0;
  if (name == "le" || name == "<=") return compare(value, need_other(), "<=") <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(value, need_other(), ">") > 0;
  if (name == "ge" || name == ">=") return compare(value, need_other(), ">=") >= 0;
  if (name == "in") return contains(need_other(), value);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    DSCHAT_CHECK(is_integer(value), InvalidArgument, "the test '", name, "' needs an integer, got ", type_name(value));
    const int64_t divisor = name == "divisibleby" ? need_other().integer : 2;
    DSCHAT_CHECK(divisor != 0, InvalidArgument, "divisibleby(0)");
    const int64_t rest = ((value.integer % divisor) + divisor) % divisor;
    return name == "odd" ? rest == 1 : rest == 0;
  }
  if (name == "lower" || name == "upper") {
    const std::string text = to_str(value);
    bool cased = false;
    for (char c : text) {
      if (std::isalpha(static_cast<unsigned char>(c))) {
        cased = true;
        if ((name == "lower") != (std::islower(static_cast<unsigned char>(c)) != 0)) return false;
      }
    }
    return cased;
  }
  if (name == "sameas") {
    const Value& o = need_other();
    if (value.kind != o.kind) return false;
    if (value.is_sequence()) return value.list == o.list;
    if (value.kind == Kind::kDict || value.kind == Kind::kNamespace) return value.dict == o.dict;
    return equal(value, o);
  }
  DSCHAT_THROW(Unsupported, "the test '", name, "' is not supported by dschat's Jinja subset");
}

}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
