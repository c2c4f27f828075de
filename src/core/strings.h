#pragma once
// Small string utilities shared by the config and IO layers.

#include <string>
#include <vector>

namespace dschat {
namespace core {

/// Levenshtein edit distance between two ASCII strings.
size_t edit_distance(const std::string& a, const std::string& b);

/// The candidate closest to `name` by edit distance, or "" when none is close enough to be a
/// plausible typo (distance > max(2, |name| / 3)).
std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates);

/// ", "-joined list: join({"a","b"}) == "a, b".
std::string join(const std::vector<std::string>& items, const std::string& separator = ", ");

inline bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }
inline bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace core
}  // namespace dschat
