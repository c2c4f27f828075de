#pragma once
// "Did you mean" for names a user typed: config keys, CLI commands and flags.

#include <string>
#include <vector>

namespace dschat {
namespace core {

/// Levenshtein edit distance between two ASCII strings.
size_t edit_distance(const std::string& a, const std::string& b);

/// The candidate closest to `name` by edit distance, or "" when none is close enough to be a
/// plausible typo (distance > max(2, |name| / 3)).
std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace core
}  // namespace dschat
