#pragma once
// The one line of a c10 or std exception worth quoting in a dschat message.

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace dschat {
namespace dist {

// c10 errors carry a C++ backtrace in what(); the first line of the short form says what failed.
inline std::string describe_error(const std::exception& error) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
  std::string text = c10_error != nullptr ? c10_error->what_without_backtrace() : error.what();
  return text.substr(0, text.find('\n'));
}

}  // namespace dist
}  // namespace dschat
