#pragma once
// Multi-process test jobs: start world_size copies of a program as the ranks of one job on
// 127.0.0.1 (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT set as
// torchrun does, launcher variables of the test's own environment removed), wait for them with a
// deadline (killing leftovers), and collect exit codes and output. A port taken between probing
// and binding is retried.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace dschat {
namespace testing {

struct RankOutcome {
  int exit_code = -1;    // -1 when killed by a signal
  int signal = 0;        // the signal that killed it, if any
  std::string out, err;  // stdout, stderr
  double seconds = 0;    // from start to exit
};

struct JobOutcome {
  std::vector<RankOutcome> ranks;
  bool deadline_hit = false;
  std::string describe() const;
};

struct JobSpec {
  std::vector<std::string> argv;  // the program and its arguments, the same for every rank
  int world_size = 2;
  std::chrono::seconds deadline{60};
  bool stop_peers_after_rank0 = false;  // kill the others as soon as rank 0 exits
  /// Called every 10 ms while the job runs with the ranks' pids (-1 once exited) and the
  /// seconds elapsed; a test kills a rank from here.
  std::function<void(const std::vector<pid_t>&, double)> monitor;
};

/// A port nothing listens on now (another process may take it before rank 0 binds it).
int free_port();
JobOutcome run_rank_job(const JobSpec& spec);

int count_lines_starting(const std::string& text, const std::string& prefix);

}  // namespace testing
}  // namespace dschat
