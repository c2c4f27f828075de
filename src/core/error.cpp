#include "dschat/core/error.h"

namespace dschat {
namespace core {
namespace detail {

void throw_status(const char* library, const char* expression, long code, const char* description,
                  const char* file, int line) {
  throw DeviceError(str_cat(library, " call failed: ", expression, " returned ", code, " (",
                            description ? description : "no description", ") at ", file, ":",
                            line));
}

}  // namespace detail
}  // namespace core
}  // namespace dschat
