#pragma once
// What the multi-process test workers (the ranks that tests/rank_jobs.h starts: engine/train_worker,
// hybrid/hybrid_worker, inference/tp_worker, inference/generate_worker, dist/dist_worker) share:
// walking argv's "--flag [value]" pairs, joining the parent test's job, and main's error report.
// Header-only, without GTest or anything else from tests/: dschat_tp_worker and dschat_dist_worker
// are built with neither tests/ nor src/ in their include path, so every worker includes this by
// its relative path ("../worker_args.h").

#include <ATen/Parallel.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <iostream>
#include <memory>
#include <string>

#include "dschat/core/error.h"
#include "dschat/dist/launch_env.h"
#include "dschat/dist/process_group.h"

namespace dschat {
namespace worker {

/// argv[1..] as flags, each followed by its value where it takes one:
///   WorkerFlags flags(argc, argv);
///   while (flags.next()) {
///     if (flags.is("--out")) args.out = flags.value();
///     else if (flags.is("--lora")) args.lora = true;
///     else flags.unknown();
///   }
class WorkerFlags {
 public:
  WorkerFlags(int argc, char** argv) : argc_(argc), argv_(argv) {}

  /// Moves to the next flag; false after the last one.
  bool next() {
    if (++index_ >= argc_) return false;
    flag_ = argv_[index_];
    return true;
  }

  const std::string& flag() const { return flag_; }
  bool is(const char* name) const { return flag_ == name; }

  /// The current flag's value (the next argument, which is consumed).
  std::string value() {
    DSCHAT_CHECK(index_ + 1 < argc_, InvalidArgument, flag_, " needs a value");
    return argv_[++index_];
  }
  int64_t int_value() { return std::stoll(value()); }

  [[noreturn]] void unknown() const { DSCHAT_THROW(InvalidArgument, "unknown flag ", flag_); }

 private:
  int argc_;
  char** argv_;
  int index_ = 0;  // argv_[index_] is the current flag; argv_[0] is the program
  std::string flag_;
};

/// This rank's communicator in the job the parent test started (RANK, WORLD_SIZE, MASTER_ADDR and
/// MASTER_PORT in the environment, as any dschat program joins one), over Gloo. Also sets one
/// intra-op thread: the job's ranks share the machine's cores (CI has two).
inline std::shared_ptr<dist::Communicator> join_job(int64_t timeout_ms) {
  at::set_num_threads(1);
  const dist::LaunchEnv env = dist::LaunchEnv::from_environment();
  return std::make_shared<dist::Communicator>(
      dist::Communicator::create(env, dist::Backend::Gloo, std::chrono::milliseconds(timeout_ms)));
}

/// A worker's main: returns what `body` returns, or 1 after "<name>: error: <what>" on stderr
/// (which the parent test prints with the job's outcome).
template <typename Body>
int run_worker(const char* name, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::cerr << name << ": error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace worker
}  // namespace dschat
