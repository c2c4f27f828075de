#pragma once
// Reading JSON text and files with errors that name the source (the configs' first step).
#include <nlohmann/json.hpp>

#include <string>

namespace dschat {
namespace core {

/// Parses JSON text; syntax errors become ConfigError naming `where` and the byte offset.
nlohmann::json parse_json_text(const std::string& text, const std::string& where);
/// Reads and parses a JSON file (IoError when unreadable).
nlohmann::json read_json_file(const std::string& path);

}  // namespace core
}  // namespace dschat
