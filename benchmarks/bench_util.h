#pragma once
// What the benchmark binaries share: the median of timed runs (and of timed calls), and running the Python peer as a
// child process (fork + exec, the child's exit status; 128 + signal when it was killed).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "dschat/core/error.h"

namespace dschat {
namespace bench {

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n == 0 ? 0.0 : n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// The median wall time of `reps` calls in milliseconds, after one untimed warm-up call (the
/// operands' pages, the thread pool).
inline double median_call_ms(const std::function<void()>& call, int64_t reps) {
  call();
  std::vector<double> ms;
  for (int64_t i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    call();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return median(ms);
}

inline int run_process(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::cout.flush();
  const pid_t pid = ::fork();
  DSCHAT_CHECK(pid >= 0, Error, "fork failed");
  if (pid == 0) {
    ::execvp(args[0], args.data());
    std::perror(args[0]);
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace bench
}  // namespace dschat
