#pragma once
// Wall-clock seconds for the trainers' and engines' timing figures (private to libdschat).
#include <chrono>

namespace dschat {
namespace core {

using SteadyClock = std::chrono::steady_clock;

/// Seconds from `start` to now on the steady clock.
inline double seconds_since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

}  // namespace core
}  // namespace dschat
