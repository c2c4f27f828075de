#pragma once
// Library-internal logging helpers on top of dschat/core/logging.h. Message parts are streamed
// like DSCHAT_CHECK's (no format strings; LibTorch bundles its own fmt, which must not meet
// spdlog's):
//   log_info("loaded ", n, " tensors from ", path);
//   log_info_rank0(...) only on rank 0 (or when no rank is set); log_warn_once(...) once per text.

#include <string>

#include "dschat/core/error.h"
#include "dschat/core/logging.h"

namespace dschat {
namespace core {

bool first_time_seen(const std::string& message);  // thread-safe set of already-logged texts

// A status line (monitor::Progress's bar) at the bottom of an interactive stderr. While one is
// drawn, each log line clears it, is written on its row, and the status is drawn again below,
// so the bar stays one row that redraws in place and the log scrolls above it.
void draw_status_line(const std::string& text);  // "\r" + text + erase to the end of the row
void end_status_line();                          // a newline under the status; logging is plain again

template <typename... Args>
void log_at(LogLevel level, const Args&... parts) {
  if (log_enabled(level)) log_message(level, detail::str_cat(parts...));
}
template <typename... Args>
void log_debug(const Args&... parts) { log_at(LogLevel::Debug, parts...); }
template <typename... Args>
void log_info(const Args&... parts) { log_at(LogLevel::Info, parts...); }
template <typename... Args>
void log_warn(const Args&... parts) { log_at(LogLevel::Warn, parts...); }
template <typename... Args>
void log_error(const Args&... parts) { log_at(LogLevel::Error, parts...); }

template <typename... Args>
void log_info_rank0(const Args&... parts) {
  if (log_rank() <= 0) log_at(LogLevel::Info, parts...);
}
template <typename... Args>
void log_warn_once(const Args&... parts) {
  if (!log_enabled(LogLevel::Warn)) return;
  std::string text = detail::str_cat(parts...);
  if (first_time_seen(text)) log_message(LogLevel::Warn, text);
}

}  // namespace core
}  // namespace dschat
