#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "dschat/core/error.h"

namespace dschat {
namespace tokenizer {
namespace jinja {
namespace value_detail {

void append_hex(std::string& out, const char* format, uint32_t point) {
  char buffer[16];
  std::snprintf(buffer, sizeof(buffer), format, point);
  out += buffer;
}

// json.dumps' string with ensure_ascii=False.
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          append_hex(out, "\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string string_repr(const std::string& text) {
  const bool double_quote = text.find('\'') != std::string::npos && text.find('"') == std::string::npos;
  const char quote = double_quote ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : text) {
    if (c == quote || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      append_hex(out, "\\x%02x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + quote;
}

void dump(const Value& value, int indent, int depth, const std::string& item_sep, const std::string& key_sep,
          bool sort_keys, std::string& out) {
  const auto newline = [&](int level) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * level), ' ');
  };
  switch (value.kind) {
    case Kind::kNone: out += "null"; return;
    case Kind::kBool: out += value.boolean ? "true" : "false"; return;
    case Kind::kInt: out += std::to_string(value.integer); return;
    case Kind::kFloat:
      out += std::isnan(value.number) ? "NaN" : std::isinf(value.number) ? (value.number > 0 ? "Infinity" : "-Infinity")
                                                                          : float_repr(value.number);
      return;
    case Kind::kString: out += json_string(value.text); return;
    case Kind::kList:
    case Kind::kTuple: {
      if (value.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < value.list->size(); ++i) {
        if (i > 0) out += item_sep;
        newline(depth + 1);
        dump((*value.list)[i], indent, depth + 1, item_sep, key_sep, sort_keys, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Kind::kDict: {
      if (value.dict->empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : *value.dict) entries.push_back(&entry);
      if (sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += item_sep;
        newline(depth + 1);
        out += json_string(entries[i]->first) + key_sep;
        dump(entries[i]->second, indent, depth + 1, item_sep, key_sep, sort_keys, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    default:
      DSCHAT_THROW(InvalidArgument, "tojson: Object of type ", type_name(value), " is not JSON serializable");
  }
}

}  // namespace value_detail

std::string where(const std::string& origin, Pos pos) {
  return origin + ":" + std::to_string(pos.line) + ":" + std::to_string(pos.column);
}

Value Value::undefined(std::string what) {
  Value v;
  v.text = std::move(what);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::of(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.boolean = b;
  return v;
}
Value Value::of(int64_t i) {
  Value v;
  v.kind = Kind::kInt;
  v.integer = i;
  return v;
}
Value Value::of(double d) {
  Value v;
  v.kind = Kind::kFloat;
  v.number = d;
  return v;
}
Value Value::of(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.text = std::move(s);
  return v;
}
Value Value::of_list(List items, bool tuple) {
  Value v;
  v.kind = tuple ? Kind::kTuple : Kind::kList;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::of_dict(Dict entries) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<Dict>(std::move(entries));
  return v;
}
Value Value::of_namespace(Dict entries) {
  Value v = of_dict(std::move(entries));
  v.kind = Kind::kNamespace;
  return v;
}

const Value* Value::find(const std::string& key) const {
  if (kind != Kind::kDict && kind != Kind::kNamespace) return nullptr;
  for (const auto& entry : *dict) {
    if (entry.first == key) return &entry.second;
  }
  return nullptr;
}

const char* type_name(const Value& value) {
  switch (value.kind) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "namespace";
    case Kind::kCallable: return "function";
  }
  return "?";
}

bool truthy(const Value& value) {
  switch (value.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return value.boolean;
    case Kind::kInt: return value.integer != 0;
    case Kind::kFloat: return value.number != 0.0;
    case Kind::kString: return !value.text.empty();
    case Kind::kList:
    case Kind::kTuple: return !value.list->empty();
    case Kind::kDict: return !value.dict->empty();
    default: return true;
  }
}

std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  for (int precision = 1; precision <= 17; ++precision) {  // the shortest digits that round-trip
    std::snprintf(buffer, sizeof(buffer), "%.*e", precision - 1, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  const std::string scientific = buffer;  // "-d.ddde+XX"
  const bool negative = scientific[0] == '-';
  const size_t e = scientific.find('e');
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i) {
    if (scientific[i] != '.') digits += scientific[i];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int exponent = std::atoi(scientific.c_str() + e + 1);
  const int point = exponent + 1;  // digits before the decimal point
  std::string out = negative ? "-" : "";
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      out += "0." + std::string(static_cast<size_t>(-point), '0') + digits;
    } else if (point >= static_cast<int>(digits.size())) {
      out += digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(point)) + "." + digits.substr(static_cast<size_t>(point));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp[16];
  std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp;
}

std::string to_str(const Value& value) {
  switch (value.kind) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return value.boolean ? "True" : "False";
    case Kind::kInt: return std::to_string(value.integer);
    case Kind::kFloat: return float_repr(value.number);
    case Kind::kString: return value.text;
    case Kind::kCallable: DSCHAT_THROW(InvalidArgument, "cannot turn the function '", value.callable->name, "' into text");
    default: return repr(value);
  }
}

std::string repr(const Value& value) {
  switch (value.kind) {
    case Kind::kString: return value_detail::string_repr(value.text);
    case Kind::kList:
    case Kind::kTuple: {
      const bool tuple = value.kind == Kind::kTuple;
      std::string out = tuple ? "(" : "[";
      for (size_t i = 0; i < value.list->size(); ++i) out += (i ? ", " : "") + repr((*value.list)[i]);
      if (tuple && value.list->size() == 1) out += ",";
      return out + (tuple ? ")" : "]");
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      std::string out = value.kind == Kind::kNamespace ? "<Namespace {" : "{";
      for (size_t i = 0; i < value.dict->size(); ++i) {
        out += (i ? ", " : "") + value_detail::string_repr((*value.dict)[i].first) + ": " + repr((*value.dict)[i].second);
      }
      return out + (value.kind == Kind::kNamespace ? "}>" : "}");
    }
    default: return to_str(value);
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::kFloat || b.kind == Kind::kFloat) {
      const auto number = [](const Value& v) {
        return v.kind == Kind::kFloat ? v.number : static_cast<double>(v.kind == Kind::kBool ? v.boolean : v.integer);
      };
      return number(a) == number(b);
    }
    return (a.kind == Kind::kBool ? a.boolean : a.integer) == (b.kind == Kind::kBool ? b.boolean : b.integer);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.text == b.text;
    case Kind::kList:
    case Kind::kTuple:
      return a.list->size() == b.list->size() &&
             std::equal(a.list->begin(), a.list->end(), b.list->begin(), [](const Value& x, const Value& y) { return equal(x, y); });
    case Kind::kDict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [key, item] : *a.dict) {
        const Value* other = b.find(key);
        if (other == nullptr || !equal(item, *other)) return false;
      }
      return true;
    }
    default: return a.dict == b.dict && a.callable == b.callable;  // identity
  }
}

std::string to_json(const Value& value, int indent, const std::string& item_separator,
                    const std::string& key_separator, bool sort_keys) {
  std::string out;
  value_detail::dump(value, indent, 0, item_separator, key_separator, sort_keys, out);
  return out;
}

Value from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::of(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned: return Value::of(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float: return Value::of(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::of(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& item : json) items.push_back(from_json(item));
      return Value::of_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict entries;
      for (const auto& [key, item] : json.items()) entries.emplace_back(key, from_json(item));
      return Value::of_dict(std::move(entries));
    }
    default: DSCHAT_THROW(InvalidArgument, "template data: unsupported JSON value ", json.dump());
  }
}

}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
