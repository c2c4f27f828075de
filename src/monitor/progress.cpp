#include "dschat/monitor/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "core/log.h"
#include "dschat/core/error.h"

namespace dschat {
namespace monitor {
namespace {

constexpr int kBarWidth = 30;
constexpr double kRedrawSeconds = 0.1;

std::string format_fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long long total = std::llround(seconds);
  char buffer[64];
  if (total < 60) {
    std::snprintf(buffer, sizeof buffer, "%lld s", total);
  } else if (total < 3600) {
    std::snprintf(buffer, sizeof buffer, "%lld min %02lld s", total / 60, total % 60);
  } else {
    std::snprintf(buffer, sizeof buffer, "%lld h %02lld min", total / 3600, (total % 3600) / 60);
  }
  return buffer;
}

std::string format_progress(const std::string& label, int64_t done, int64_t total, double elapsed_seconds,
                            const std::string& extra) {
  const int filled =
      total > 0 ? static_cast<int>(std::min<int64_t>(kBarWidth, done * kBarWidth / total)) : kBarWidth;
  std::string text = label + " [" + std::string(filled, '#') + std::string(kBarWidth - filled, '.') + "] " +
                     std::to_string(done) + "/" + std::to_string(total) + "  ";
  // Sub-minute times keep a decimal so short runs show movement; longer ones read as durations.
  text += elapsed_seconds < 60 ? format_fixed(elapsed_seconds, 1) + " s" : format_duration(elapsed_seconds);
  text += " elapsed";
  if (done < total) {
    text += ", ETA ";
    text += done > 0 ? format_duration(elapsed_seconds / static_cast<double>(done) * (total - done)) : "?";
  }
  if (!extra.empty()) text += "  " + extra;
  return text;
}

Progress::Progress(std::string label, int64_t total, int64_t plain_interval, bool force_plain)
    : label_(std::move(label)),
      total_(total),
      plain_interval_(plain_interval),
      interactive_(!force_plain && ::isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  DSCHAT_CHECK(total >= 0, InvalidArgument, "Progress '", label_, "': total must be >= 0, got ", total);
  DSCHAT_CHECK(plain_interval >= 1, InvalidArgument, "Progress '", label_, "': plain_interval must be >= 1, got ",
               plain_interval);
}

Progress::~Progress() {
  // Leave the terminal on a fresh line even when the loop ended by an exception.
  if (interactive_ && drawn_ && !finished_) core::end_status_line();
}

void Progress::update(int64_t done, const std::string& extra) {
  done_ = std::max<int64_t>(0, std::min(done, total_));
  extra_ = extra;
  const auto now = std::chrono::steady_clock::now();
  if (interactive_) {
    const double since_draw = std::chrono::duration<double>(now - last_draw_).count();
    if (!drawn_ || done_ == total_ || since_draw >= kRedrawSeconds) {
      last_draw_ = now;
      emit();
    } else {
      stale_ = true;
    }
  } else if (done_ % plain_interval_ == 0 || done_ == total_) {
    if (done_ != last_logged_) emit();
  }
}

void Progress::finish() {
  if (finished_) return;
  if (interactive_) {
    if (stale_ || !drawn_) emit();  // the final state, when the last update was throttled
    core::end_status_line();
  } else if (done_ != last_logged_) {
    emit();
  }
  finished_ = true;
}

void Progress::emit() {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::string text = format_progress(label_, done_, total_, elapsed, extra_);
  if (interactive_) {
    // Through the logger, which keeps log lines above the bar instead of on its row.
    core::draw_status_line(text);
    drawn_ = true;
    stale_ = false;
  } else {
    core::log_info(text);
    last_logged_ = done_;
  }
}

}  // namespace monitor
}  // namespace dschat
