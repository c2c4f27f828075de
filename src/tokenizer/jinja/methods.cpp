// Item and attribute access, iteration, ordering, the global functions and the str/dict methods.
#include <algorithm>
#include <cctype>
#include <ctime>

#include "dschat/core/error.h"
#include "tokenizer/jinja/builtins.h"

namespace dschat {
namespace tokenizer {
namespace jinja {
namespace methods_detail {

Value bound(const std::string& name, std::function<Value(const Args&)> call) {
  Value v;
  v.kind = Kind::kCallable;
  v.callable = std::make_shared<Callable>(Callable{name, std::move(call)});
  return v;
}

std::string string_arg(const Args& args, size_t index, const char* name, const std::string& function) {
  const Value* v = arg(args, index, name);
  DSCHAT_CHECK(v && v->is_string(), InvalidArgument, function, "() needs a string argument '", name, "', got ",
               v ? type_name(*v) : "nothing");
  return v->text;
}

// Python's str.split / rsplit: on `sep`, or on whitespace runs when there is none.
List split(const std::string& text, const Value* sep, int64_t max_split, bool from_right) {
  std::vector<std::string> parts;
  if (sep && sep->kind != Kind::kNone) {
    DSCHAT_CHECK(sep->is_string() && !sep->text.empty(), InvalidArgument, "split() needs a non-empty string separator");
    const std::string& s = sep->text;
    if (!from_right) {
      size_t start = 0;
      for (size_t at; (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) &&
                      (at = text.find(s, start)) != std::string::npos;
           start = at + s.size()) {
        parts.push_back(text.substr(start, at - start));
      }
      parts.push_back(text.substr(start));
    } else {
      size_t end = text.size();
      std::vector<std::string> reversed;
      while (max_split < 0 || static_cast<int64_t>(reversed.size()) < max_split) {
        if (end < s.size()) break;
        const size_t at = text.rfind(s, end - s.size());
        if (at == std::string::npos) break;
        reversed.push_back(text.substr(at + s.size(), end - at - s.size()));
        end = at;
      }
      reversed.push_back(text.substr(0, end));
      parts.assign(reversed.rbegin(), reversed.rend());
    }
  } else {
    DSCHAT_CHECK(!from_right || max_split < 0, InvalidArgument, "rsplit() on whitespace with maxsplit is not supported");
    const std::vector<uint32_t> points = code_points(text);
    size_t i = 0;
    while (true) {
      while (i < points.size() && is_space(points[i])) ++i;
      if (i >= points.size()) break;
      if (max_split >= 0 && static_cast<int64_t>(parts.size()) >= max_split) {
        std::vector<uint32_t> rest(points.begin() + static_cast<std::ptrdiff_t>(i), points.end());
        parts.push_back(utf8(rest));
        break;
      }
      size_t j = i;
      while (j < points.size() && !is_space(points[j])) ++j;
      parts.push_back(utf8(std::vector<uint32_t>(points.begin() + static_cast<std::ptrdiff_t>(i),
                                                 points.begin() + static_cast<std::ptrdiff_t>(j))));
      i = j;
    }
  }
  List out;
  for (auto& part : parts) out.push_back(Value::of(std::move(part)));
  return out;
}

bool affix(const std::string& text, const Value& candidates, bool prefix, const char* function) {
  const auto one = [&](const Value& c) {
    DSCHAT_CHECK(c.is_string(), InvalidArgument, function, "() needs a string or a tuple of strings, got ", type_name(c));
    if (c.text.size() > text.size()) return false;
    return text.compare(prefix ? 0 : text.size() - c.text.size(), c.text.size(), c.text) == 0;
  };
  if (candidates.is_sequence()) return std::any_of(candidates.list->begin(), candidates.list->end(), one);
  return one(candidates);
}

void require_ascii(const std::string& text, const char* function) {
  for (unsigned char c : text) {
    DSCHAT_CHECK(c < 0x80, Unsupported, function, "() of non-ASCII text is not supported by dschat's Jinja subset");
  }
}

std::string change_case(std::string text, bool upper, const char* function) {
  require_ascii(text, function);
  for (char& c : text) c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  return text;
}

Value string_method(const std::string& text, const std::string& name) {
  const std::string fn = "str." + name;
  if (name == "startswith" || name == "endswith") {
    return bound(fn, [text, name, fn](const Args& args) {
      check_args(args, fn, {"prefix"});
      const Value* c = arg(args, 0, "prefix");
      DSCHAT_CHECK(c, InvalidArgument, fn, "() takes one argument");
      return Value::of(affix(text, *c, name == "startswith", fn.c_str()));
    });
  }
  if (name == "split" || name == "rsplit") {
    return bound(fn, [text, name, fn](const Args& args) {
      check_args(args, fn, {"sep", "maxsplit"});
      const Value* max = arg(args, 1, "maxsplit");
      return Value::of_list(split(text, arg(args, 0, "sep"), max ? max->integer : -1, name == "rsplit"));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return bound(fn, [text, name, fn](const Args& args) {
      check_args(args, fn, {"chars"});
      const Value* chars = arg(args, 0, "chars");
      const bool given = chars && chars->kind != Kind::kNone;
      DSCHAT_CHECK(!given || chars->is_string(), InvalidArgument, fn, "() needs a string argument");
      return Value::of(strip(text, name != "rstrip", name != "lstrip", given ? &chars->text : nullptr));
    });
  }
  if (name == "upper" || name == "lower") {
    return bound(fn, [text, name, fn](const Args& args) {
      check_args(args, fn, {});
      return Value::of(change_case(text, name == "upper", fn.c_str()));
    });
  }
  if (name == "title" || name == "capitalize") {
    return bound(fn, [text, name, fn](const Args& args) {
      check_args(args, fn, {});
      std::string out = change_case(text, false, fn.c_str());
      for (size_t i = 0; i < out.size(); ++i) {
        const bool start = name == "title" ? (i == 0 || !std::isalpha(static_cast<unsigned char>(out[i - 1]))) : i == 0;
        if (start) out[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[i])));
      }
      return Value::of(out);
    });
  }
  if (name == "replace") {
    return bound(fn, [text, fn](const Args& args) {
      check_args(args, fn, {"old", "new", "count"});
      return apply_filter("replace", Value::of(text), args);
    });
  }
  if (name == "find" || name == "count") {
    return bound(fn, [text, name, fn](const Args& args) {
      check_args(args, fn, {"sub"});
      const std::string sub = string_arg(args, 0, "sub", fn);
      if (name == "find") {
        const size_t at = text.find(sub);
        return Value::of(at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(code_points(text.substr(0, at)).size()));
      }
      DSCHAT_CHECK(!sub.empty(), Unsupported, "str.count('') is not supported");
      int64_t n = 0;
      for (size_t at = text.find(sub); at != std::string::npos; at = text.find(sub, at + sub.size())) ++n;
      return Value::of(n);
    });
  }
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value dict_method(const Value& dict, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return bound("dict." + name, [dict, name](const Args& args) {
      check_args(args, "dict." + name, {});
      List out;
      for (const auto& [key, item] : *dict.dict) {
        if (name == "items") out.push_back(Value::of_list({Value::of(key), item}, true));
        if (name == "keys") out.push_back(Value::of(key));
        if (name == "values") out.push_back(item);
      }
      return Value::of_list(std::move(out));
    });
  }
  if (name == "get") {
    return bound("dict.get", [dict](const Args& args) {
      check_args(args, "dict.get", {"key", "default"});
      const Value* key = arg(args, 0, "key");
      DSCHAT_CHECK(key, InvalidArgument, "dict.get() needs a key");
      const Value* found = key->is_string() ? dict.find(key->text) : nullptr;
      if (found) return *found;
      const Value* fallback = arg(args, 1, "default");
      return fallback ? *fallback : Value::none();
    });
  }
  return Value::undefined();
}

[[noreturn]] void undefined_error(const Value& value, const std::string& access) {
  DSCHAT_THROW(InvalidArgument, value.text.empty() ? "an undefined value" : value.text, " (is undefined; accessing ", access,
               ")");
}

}  // namespace methods_detail

using methods_detail::bound;

const Value* arg(const Args& args, size_t index, const char* name) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& [key, value] : args.keyword) {
    if (key == name) return &value;
  }
  return nullptr;
}

void check_args(const Args& args, const std::string& function, std::initializer_list<const char*> names) {
  DSCHAT_CHECK(args.positional.size() <= names.size(), InvalidArgument, function, "() takes at most ", names.size(),
               " arguments, got ", args.positional.size());
  for (const auto& [key, value] : args.keyword) {
    const bool known = std::any_of(names.begin(), names.end(), [&](const char* n) { return key == n; });
    DSCHAT_CHECK(known, InvalidArgument, function, "() got an unexpected keyword argument '", key, "'");
  }
}

List iterate(const Value& value) {
  switch (value.kind) {
    case Kind::kUndefined: return {};
    case Kind::kList:
    case Kind::kTuple: return *value.list;
    case Kind::kDict: {
      List keys;
      for (const auto& entry : *value.dict) keys.push_back(Value::of(entry.first));
      return keys;
    }
    case Kind::kString: {
      List chars;
      for (uint32_t p : code_points(value.text)) chars.push_back(Value::of(utf8({p})));
      return chars;
    }
    default: DSCHAT_THROW(InvalidArgument, "'", type_name(value), "' object is not iterable");
  }
}

int64_t length(const Value& value) {
  switch (value.kind) {
    case Kind::kUndefined: return 0;
    case Kind::kString: return static_cast<int64_t>(code_points(value.text).size());
    case Kind::kList:
    case Kind::kTuple: return static_cast<int64_t>(value.list->size());
    case Kind::kDict: return static_cast<int64_t>(value.dict->size());
    default: DSCHAT_THROW(InvalidArgument, "object of type '", type_name(value), "' has no len()");
  }
}

Value get_attribute(const Value& object, const std::string& name) {
  switch (object.kind) {
    case Kind::kUndefined: methods_detail::undefined_error(object, "." + name);
    case Kind::kDict: {
      Value m = methods_detail::dict_method(object, name);
      if (!m.is_undefined()) return m;
      const Value* found = object.find(name);
      return found ? *found : Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Kind::kNamespace: {
      const Value* found = object.find(name);
      return found ? *found : Value::undefined("'Namespace' object has no attribute '" + name + "'");
    }
    case Kind::kString: return methods_detail::string_method(object.text, name);
    default: return Value::undefined("'" + std::string(type_name(object)) + " object' has no attribute '" + name + "'");
  }
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) methods_detail::undefined_error(object, "[" + repr(key) + "]");
  if ((object.kind == Kind::kDict || object.kind == Kind::kNamespace) && key.is_string()) {
    if (const Value* found = object.find(key.text)) return *found;
    return get_attribute(object, key.text);
  }
  if ((object.is_sequence() || object.is_string()) && (key.kind == Kind::kInt || key.kind == Kind::kBool)) {
    int64_t index = key.kind == Kind::kBool ? key.boolean : key.integer;
    if (object.is_string()) {
      const std::vector<uint32_t> points = code_points(object.text);
      if (index < 0) index += static_cast<int64_t>(points.size());
      if (index < 0 || index >= static_cast<int64_t>(points.size())) return Value::undefined("string index out of range");
      return Value::of(utf8({points[static_cast<size_t>(index)]}));
    }
    if (index < 0) index += static_cast<int64_t>(object.list->size());
    if (index < 0 || index >= static_cast<int64_t>(object.list->size())) {
      return Value::undefined(std::string(type_name(object)) + " object has no element " + repr(key));
    }
    return (*object.list)[static_cast<size_t>(index)];
  }
  if (key.is_string()) return get_attribute(object, key.text);
  return Value::undefined(std::string(type_name(object)) + " object has no element " + repr(key));
}

Value method(const Value& object, const std::string& name) {
  if (object.is_string()) return methods_detail::string_method(object.text, name);
  if (object.kind == Kind::kDict) return methods_detail::dict_method(object, name);
  return Value::undefined();
}

int compare(const Value& a, const Value& b, const std::string& op) {
  if (a.is_number() && b.is_number()) {
    const auto as_double = [](const Value& v) {
      return v.kind == Kind::kFloat ? v.number : static_cast<double>(v.kind == Kind::kBool ? v.boolean : v.integer);
    };
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) {
      const int64_t x = a.kind == Kind::kBool ? a.boolean : a.integer, y = b.kind == Kind::kBool ? b.boolean : b.integer;
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const double x = as_double(a), y = as_double(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.text < b.text ? -1 : a.text > b.text ? 1 : 0;  // UTF-8: code point order
  if (a.kind == b.kind && a.is_sequence()) {
    for (size_t i = 0; i < a.list->size() && i < b.list->size(); ++i) {
      if (!equal((*a.list)[i], (*b.list)[i])) return compare((*a.list)[i], (*b.list)[i], op);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  DSCHAT_THROW(InvalidArgument, "'", op, "' not supported between instances of '", type_name(a), "' and '", type_name(b),
               "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::kString:
      DSCHAT_CHECK(item.is_string(), InvalidArgument, "'in <string>' requires string as left operand, not ", type_name(item));
      return container.text.find(item.text) != std::string::npos;
    case Kind::kList:
    case Kind::kTuple:
      return std::any_of(container.list->begin(), container.list->end(), [&](const Value& v) { return equal(v, item); });
    case Kind::kDict: return item.is_string() && container.find(item.text) != nullptr;
    case Kind::kUndefined: return false;  // iterates as empty
    default: DSCHAT_THROW(InvalidArgument, "argument of type '", type_name(container), "' is not iterable");
  }
}

bool is_global_function(const std::string& name) {
  return name == "raise_exception" || name == "namespace" || name == "range" || name == "dict" || name == "strftime_now";
}

bool is_method(const std::string& name) {
  static const char* const kMethods[] = {"startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip",
                                         "upper", "lower", "replace", "title", "capitalize", "find", "count",
                                         "items", "keys", "values", "get", "cycle"};
  return std::any_of(std::begin(kMethods), std::end(kMethods), [&](const char* m) { return name == m; });
}

Value global_function(const std::string& name) {
  if (name == "raise_exception") {
    return bound(name, [](const Args& args) -> Value {
      const Value* message = arg(args, 0, "message");
      DSCHAT_THROW(InvalidArgument, "raise_exception: ", message ? to_str(*message) : "");
    });
  }
  if (name == "namespace" || name == "dict") {
    return bound(name, [name](const Args& args) {
      DSCHAT_CHECK(args.positional.size() <= 1, InvalidArgument, name, "() takes at most one positional argument");
      Dict entries;
      if (!args.positional.empty()) {
        DSCHAT_CHECK(args.positional[0].kind == Kind::kDict, InvalidArgument, name, "() needs a dict, got ",
                     type_name(args.positional[0]));
        entries = *args.positional[0].dict;
      }
      for (const auto& [key, value] : args.keyword) {
        auto same = std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.first == key; });
        if (same != entries.end()) {
          same->second = value;
        } else {
          entries.emplace_back(key, value);
        }
      }
      return name == "dict" ? Value::of_dict(std::move(entries)) : Value::of_namespace(std::move(entries));
    });
  }
  if (name == "range") {
    return bound(name, [](const Args& args) {
      DSCHAT_CHECK(!args.positional.empty() && args.positional.size() <= 3 && args.keyword.empty(), InvalidArgument,
                   "range() takes 1 to 3 integer arguments");
      for (const auto& v : args.positional) {
        DSCHAT_CHECK(v.kind == Kind::kInt, InvalidArgument, "range() needs integers, got ", type_name(v));
      }
      const auto& p = args.positional;
      const int64_t start = p.size() > 1 ? p[0].integer : 0, stop = p.size() > 1 ? p[1].integer : p[0].integer;
      const int64_t step = p.size() > 2 ? p[2].integer : 1;
      DSCHAT_CHECK(step != 0, InvalidArgument, "range() arg 3 must not be zero");
      DSCHAT_CHECK((stop - start) / step <= 100000, InvalidArgument, "range() of more than 100000 items");
      List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value::of(i));
      return Value::of_list(std::move(out));
    });
  }
  if (name == "strftime_now") {
    return bound(name, [](const Args& args) {
      const std::string format = methods_detail::string_arg(args, 0, "format", "strftime_now");
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buffer[256];
      const size_t n = std::strftime(buffer, sizeof(buffer), format.c_str(), &local);
      return Value::of(std::string(buffer, n));
    });
  }
  return Value::undefined(name);
}

}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
