#pragma once
// What the benchmark binaries share: the median of timed runs, and running the Python peer as a
// child process (fork + exec, the child's exit status; 128 + signal when it was killed).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
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
