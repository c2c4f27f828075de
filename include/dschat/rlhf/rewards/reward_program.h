#pragma once
// A reward computed by an external program (issue 18's `{"type": "command", "argv": [...]}`): the
// program is started once and kept running; each query is one JSON Lines record on its stdin,
//   {"prompt": "...", "response": "...", "meta": {...}}
// and it answers one line per query, in order, on its stdout:
//   {"reward": 0.5}
// Anything else stops the step with an error naming the program and the offending line: an
// answer that is not JSON, has no "reward", or whose reward is not a finite number; the program
// exiting, or not answering within the timeout (it is then killed). Queries are written while
// answers are read, so a program that answers as it reads never blocks either side.
//
//   rlhf::RewardProgram program({{"python3", "verify.py"}, std::chrono::seconds(30)});
//   std::vector<double> rewards = program.score({{prompt, response, {{"answer", "42"}}}});
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/rlhf/config/reward_source_config.h"

namespace dschat {
namespace rlhf {

struct RewardProgramOptions {
  std::vector<std::string> argv;  // the program (looked up in PATH) and its arguments
  std::chrono::milliseconds timeout{60000};  // per score() call, from its first query to its last answer
};

class RewardProgram {
 public:
  /// Starts the program with its stdin and stdout connected to this object (stderr is
  /// inherited). Throws core::InvalidArgument for an empty argv, core::IoError naming argv[0]
  /// when it cannot be started.
  explicit RewardProgram(RewardProgramOptions options);
  /// Closes its stdin, gives it a second to exit, then kills it.
  ~RewardProgram();
  RewardProgram(const RewardProgram&) = delete;
  RewardProgram& operator=(const RewardProgram&) = delete;

  /// One reward per query, in order. Throws core::FormatError (a bad answer line, quoted) or
  /// core::IoError (the program exited or timed out; it is killed and every later call throws),
  /// both naming the program and the query's index.
  std::vector<double> score(const std::vector<RewardQuery>& queries);

  const std::string& name() const { return name_; }

 private:
  [[noreturn]] void fail_io(const std::string& what);
  void stop();

  RewardProgramOptions options_;
  std::string name_;  // the command line, for messages
  pid_t pid_ = -1;
  int fd_ = -1;  // our end of a socket pair: the program's stdin and stdout
  std::string pending_;  // answer bytes read beyond the last complete line
  bool broken_ = false;
};

}  // namespace rlhf
}  // namespace dschat
