#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <unordered_set>

#include "core/env.h"
#include "core/log.h"
#include "dschat/core/error.h"

namespace dschat {
namespace core {
namespace {

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::Trace: return spdlog::level::trace;
    case LogLevel::Debug: return spdlog::level::debug;
    case LogLevel::Info: return spdlog::level::info;
    case LogLevel::Warn: return spdlog::level::warn;
    case LogLevel::Error: return spdlog::level::err;
    case LogLevel::Off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

int rank_from_environment() {
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (auto value = read_int_from_env(name)) return static_cast<int>(*value);
  }
  return -1;
}

// All mutable logging state lives here, created on first use (no static-init order issues).
struct LogState {
  std::mutex mutex;
  std::atomic<LogLevel> level{LogLevel::Info};
  std::atomic<int> rank{-1};
  LogCallback callback;
  std::shared_ptr<spdlog::logger> logger;
  std::unordered_set<std::string> seen_once;
  std::string status_line;  // drawn on stderr's last row; "" : none

  LogState() {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    logger = std::make_shared<spdlog::logger>("dschat", sink);
    logger->set_level(spdlog::level::trace);  // filtering happens in log_enabled
    if (auto name = read_string_from_env("DSCHAT_LOG_LEVEL")) level = parse_log_level(*name);
    rank = rank_from_environment();
    apply_pattern();
  }
  void apply_pattern() {
    int r = rank.load();
    std::string prefix = r >= 0 ? "[rank " + std::to_string(r) + "] " : "";
    logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [dschat] [%l] " + prefix + "%v");
  }
};

LogState& state() {
  static LogState* instance = new LogState();  // leaked on purpose: usable during shutdown
  return *instance;
}

}  // namespace

LogLevel parse_log_level(const std::string& name) {
  if (name == "trace") return LogLevel::Trace;
  if (name == "debug") return LogLevel::Debug;
  if (name == "info") return LogLevel::Info;
  if (name == "warn" || name == "warning") return LogLevel::Warn;
  if (name == "error") return LogLevel::Error;
  if (name == "off") return LogLevel::Off;
  DSCHAT_THROW(InvalidArgument, "log level: expected one of trace, debug, info, warn, error, off; got '",
               name, "'");
}

void set_log_level(LogLevel level) { state().level = level; }
LogLevel log_level() { return state().level; }
bool log_enabled(LogLevel level) {
  return level != LogLevel::Off && static_cast<int>(level) >= static_cast<int>(state().level.load());
}

void set_log_callback(LogCallback callback) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().callback = std::move(callback);
}

void set_log_rank(int rank) {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.rank = rank;
  s.apply_pattern();
}
int log_rank() { return state().rank; }

void log_message(LogLevel level, const std::string& message) {
  if (!log_enabled(level)) return;
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.callback) {
    s.callback(level, message);
    return;
  }
  // The sink writes through the same FILE* stderr, so these escapes and the line stay in order.
  if (!s.status_line.empty()) std::fputs("\r\033[K", stderr);
  s.logger->log(to_spdlog(level), message);
  s.logger->flush();
  if (!s.status_line.empty()) {
    std::fprintf(stderr, "\r%s\033[K", s.status_line.c_str());
    std::fflush(stderr);
  }
}

void draw_status_line(const std::string& text) {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.status_line = text;
  std::fprintf(stderr, "\r%s\033[K", text.c_str());
  std::fflush(stderr);
}

void end_status_line() {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.status_line.empty()) return;
  s.status_line.clear();
  std::fputs("\n", stderr);
  std::fflush(stderr);
}

bool first_time_seen(const std::string& message) {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.seen_once.insert(message).second;
}

}  // namespace core
}  // namespace dschat
