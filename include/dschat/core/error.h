#pragma once
// The library's exceptions. Every failure the library reports is one of these; library code never
// calls exit() or abort(). Messages name the thing (file, key, argument, tensor), what was expected
// and what was found, e.g.
//   "model.safetensors: tensor 'lm_head.weight' data [0, 4096) exceeds the 100-byte data section".

#include <sstream>
#include <stdexcept>
#include <string>

namespace dschat {
namespace core {

/// Base class of every exception thrown by libdschat.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A caller passed a bad argument or value (CLI flag, API argument, tensor shape).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// A configuration file or key is wrong: unknown key, wrong type, out of range.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// Reading or writing a file failed (missing, unreadable, truncated).
class IoError : public Error {
 public:
  using Error::Error;
};

/// A file was read but its content is malformed (corrupt header, bad offsets, wrong dtype).
class FormatError : public IoError {
 public:
  using IoError::IoError;
};

/// Something named does not exist: a model, a tensor name, a preset.
class NotFound : public Error {
 public:
  using Error::Error;
};

/// A request this build or this model does not support (a rope type, a device).
class Unsupported : public Error {
 public:
  using Error::Error;
};

/// A CUDA, cuBLAS or NCCL call returned an error status.
class DeviceError : public Error {
 public:
  using Error::Error;
};

/// An allocation failed (CUDA's caching allocator or the CPU allocator). The message names what
/// was running and what to change.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

namespace detail {

/// Streams every argument into one string: str_cat("expected ", 3, ", got ", 4).
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

/// Throws DeviceError for a failed status code of `library` (CUDA, NCCL, cuBLAS).
[[noreturn]] void throw_status(const char* library, const char* expression, long code,
                               const char* description, const char* file, int line);

}  // namespace detail
}  // namespace core
}  // namespace dschat

/// Throws ExcType (a dschat::core exception name) with the streamed message parts.
#define DSCHAT_THROW(ExcType, ...) \
  throw ::dschat::core::ExcType(::dschat::core::detail::str_cat(__VA_ARGS__))

/// Throws ExcType with the streamed message parts unless `cond` holds.
#define DSCHAT_CHECK(cond, ExcType, ...)  \
  do {                                    \
    if (!(cond)) {                        \
      DSCHAT_THROW(ExcType, __VA_ARGS__); \
    }                                     \
  } while (0)

/// Invariants of the library itself: a failure is a dschat bug, reported with file and line.
#define DSCHAT_INTERNAL_ASSERT(cond, ...)                                                     \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      DSCHAT_THROW(Error, "internal error at ", __FILE__, ":", __LINE__, ": ", #cond, " ",    \
                   ::dschat::core::detail::str_cat(__VA_ARGS__), " (please report this bug)"); \
    }                                                                                         \
  } while (0)
