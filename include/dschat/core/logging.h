#pragma once
// Logging. The library never writes to stdout: messages go to stderr through spdlog, or to a
// callback the application installs (set_log_callback). The level comes from DSCHAT_LOG_LEVEL
// (trace, debug, info, warn, error, off; default info) until set_log_level is called. In a
// multi-rank job every line carries "[rank N]"; the rank is read from RANK (torchrun), or
// OMPI_COMM_WORLD_RANK / SLURM_PROCID, or set with set_log_rank.

#include <functional>
#include <string>

namespace dschat {
namespace core {

enum class LogLevel { Trace, Debug, Info, Warn, Error, Off };

/// Receives each formatted message (without the level/rank prefix) at or above the log level.
using LogCallback = std::function<void(LogLevel level, const std::string& message)>;

/// Parses "trace" | "debug" | "info" | "warn" | "error" | "off"; throws InvalidArgument otherwise.
LogLevel parse_log_level(const std::string& name);

void set_log_level(LogLevel level);
LogLevel log_level();
bool log_enabled(LogLevel level);

/// Replaces the stderr sink; an empty callback restores it.
void set_log_callback(LogCallback callback);

/// The rank shown in the prefix; -1 hides it. Defaults to the launcher's environment.
void set_log_rank(int rank);
int log_rank();

/// Emits one message at `level` (dropped below the current level).
void log_message(LogLevel level, const std::string& message);

}  // namespace core
}  // namespace dschat
