#pragma once
// Typed reads of tokenizer.json component objects ({"type": "...", ...}) with errors that name the
// file, the component path and the key: "tok/tokenizer.json: decoder.decoders[2]: key 'content'
// expects a string, got number".

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace dschat {
namespace tokenizer {

class JsonSpec {
 public:
  JsonSpec(const nlohmann::json& value, std::string where);

  const std::string& where() const { return where_; }
  /// The "type" string of the component.
  std::string type() const;
  bool has(const char* key) const;
  std::string string(const char* key) const;
  std::string string_or(const char* key, const std::string& fallback) const;
  bool boolean_or(const char* key, bool fallback) const;
  int64_t integer(const char* key) const;
  double number_or(const char* key, double fallback) const;
  const nlohmann::json& array(const char* key) const;
  const nlohmann::json& object(const char* key) const;
  /// A single-code-point string such as Metaspace's "replacement".
  char32_t character(const char* key) const;
  /// The children of a Sequence component under `key`, each with its own location.
  std::vector<JsonSpec> children(const char* key) const;

  [[noreturn]] void unsupported(const std::string& what, const std::string& supported) const;

 private:
  const nlohmann::json& at(const char* key, bool (nlohmann::json::*check)() const noexcept,
                           const char* expected) const;

  const nlohmann::json& value_;
  std::string where_;
};

}  // namespace tokenizer
}  // namespace dschat
