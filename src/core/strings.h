#pragma once
// Small string utilities shared by the config and IO layers.

#include <string>
#include <vector>

#include "dschat/core/names.h"

namespace dschat {
namespace core {

/// ", "-joined list: join({"a","b"}) == "a, b".
std::string join(const std::vector<std::string>& items, const std::string& separator = ", ");

inline bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }
inline bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace core
}  // namespace dschat
