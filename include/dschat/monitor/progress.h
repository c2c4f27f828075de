#pragma once
// A progress display for a loop of `total` steps.
//   * On an interactive terminal (stderr is a tty): one line redrawn in place with "\r",
//       "ppo [#########.....................] 37/100  12.3 s elapsed, ETA 21 s  reward 0.31"
//     at most ten redraws a second (and always for the last step); finish() ends the line. The
//     line is the logger's status line (core::draw_status_line), so log lines written meanwhile
//     appear above the bar instead of on its row.
//   * Otherwise (log files, CI, pipes), or with force_plain: the same text as an info log line
//     (dschat's logging, so it carries the level and rank prefixes) every `plain_interval` steps
//     and at the end.
// ETA = remaining steps x the mean step time so far. The display is the caller's choice per rank:
// construct it on the rank that reports (rank 0).

#include <chrono>
#include <cstdint>
#include <string>

namespace dschat {
namespace monitor {

class Progress {
 public:
  /// Throws core::InvalidArgument for total < 0 or plain_interval < 1.
  Progress(std::string label, int64_t total, int64_t plain_interval = 10, bool force_plain = false);
  /// Ends the terminal line if finish() was not called.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// `done` steps of `total` are complete (clamped to [0, total]); `extra` is appended to the line.
  void update(int64_t done, const std::string& extra = "");
  /// Newline on a terminal; in plain mode, logs the last state unless it was just logged.
  void finish();

  bool interactive() const { return interactive_; }

 private:
  void emit();

  std::string label_;
  int64_t total_;
  int64_t plain_interval_;
  bool interactive_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  int64_t done_ = 0;
  int64_t last_logged_ = -1;
  bool drawn_ = false;  // terminal: a line is on screen
  bool stale_ = false;  // terminal: an update was throttled, the screen lags done_
  std::string extra_;
};

/// "42 s", "3 min 05 s", "1 h 02 min" (rounded to whole seconds); "?" for negative or non-finite.
std::string format_duration(double seconds);

/// The display text (without "\r"): "<label> [####......] done/total  <elapsed> elapsed, ETA <eta>
/// <extra>", with a 30-character bar. Exposed for tests and for callers with their own output.
std::string format_progress(const std::string& label, int64_t done, int64_t total, double elapsed_seconds,
                            const std::string& extra = "");

}  // namespace monitor
}  // namespace dschat
