#include "dschat/dist/activity.h"

#include <mutex>
#include <utility>

namespace dschat {
namespace dist {
namespace {

std::mutex& activity_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::string& activity_text() {
  static std::string text;  // guarded by activity_mutex()
  return text;
}

}  // namespace

void set_activity(std::string text) {
  std::lock_guard<std::mutex> lock(activity_mutex());
  activity_text() = std::move(text);
}

std::string current_activity() {
  std::lock_guard<std::mutex> lock(activity_mutex());
  return activity_text();
}

}  // namespace dist
}  // namespace dschat
