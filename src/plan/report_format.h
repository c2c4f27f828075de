#pragma once
// Number formats the plan's tables share (format_plan, step_overview).
#include <cstdint>
#include <cstdio>
#include <string>

namespace dschat {
namespace plan {

/// Bytes as GiB with two decimals: "1.25".
inline std::string gib_text(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

/// `text` padded with spaces to `width` characters (longer text is kept whole).
inline std::string padded(std::string text, size_t width) {
  if (text.size() < width) text.resize(width, ' ');
  return text;
}

}  // namespace plan
}  // namespace dschat
