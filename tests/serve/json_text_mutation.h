#pragma once
// The JSON machine tests' changed texts: one byte replaced, inserted or deleted, and whether a text
// is UTF-8 (the machine does not check UTF-8 inside strings, since a byte-level token's text may
// hold part of a character, while nlohmann's parser does, so texts that are not are left out).
#include <nlohmann/json.hpp>

#include <random>
#include <string>

namespace dschat {
namespace serve {

inline bool valid_utf8(const std::string& text) {
  try {
    (void)nlohmann::json(text).dump();  // throws type_error 316 on bytes that are not UTF-8
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

/// `text` (not empty) with one byte, drawn from `alphabet`, replacing one of its bytes, inserted,
/// or one of its bytes deleted.
inline std::string one_byte_changed(const std::string& text, const std::string& alphabet, std::mt19937& random) {
  std::string changed = text;
  const size_t at = random() % changed.size();
  const char c = alphabet[random() % alphabet.size()];
  switch (random() % 3) {
    case 0: changed[at] = c; break;
    case 1: changed.insert(changed.begin() + static_cast<std::ptrdiff_t>(at), c); break;
    default: changed.erase(at, 1);
  }
  return changed;
}

}  // namespace serve
}  // namespace dschat
