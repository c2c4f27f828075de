#pragma once
// What a training step runs with besides its config: the data-parallel ranks, how base models
// are initialised, where the tokenizer is, the stop flag that Ctrl-C raises, and the reward
// functions a C++ caller registers.
#include <atomic>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "dschat/core/error.h"
#include "dschat/dist/process_group.h"
#include "dschat/rlhf/config/reward_source_config.h"

namespace dschat {
namespace rlhf {

struct StepContext {
  /// The data-parallel ranks; null is a world of one.
  std::shared_ptr<dist::Communicator> communicator;
  /// Base models (step 1's model, step 2's model, and in `dschat ppo --init random` step 3's
  /// actor and critic) are built with random weights from a preset name or a config.json.
  bool random_init = false;
  /// Tokenizer directory; empty: the model's own directory.
  std::string tokenizer_dir;
  /// Raised (by a signal handler) to stop: the trainer saves a resumable checkpoint at the next
  /// micro-step boundary and throws Interrupted. Null: never stopped.
  const std::atomic<bool>* stop_requested = nullptr;
  /// The launcher's LOCAL_RANK (-1: not launched): "auto"/"cuda" devices resolve to
  /// cuda:local_rank (core::resolve_device).
  int64_t local_rank = -1;
  /// Progress bars on an interactive terminal (plain lines otherwise); false: lines only.
  bool progress = true;
  /// `--resume-from TAG`: the checkpoint tag the step resumes from instead of the newest intact
  /// one (rlhf::StepRunner::prepare_resume). run_pipeline gives it to the first step it runs only.
  std::string resume_from;
  /// The C++ reward functions the critic-free step's "callback" reward sources name.
  RewardCallbacks reward_callbacks;
  /// What a step runs with, by step number (1, 2, 3): run_pipeline logs `text` (rank 0) as the
  /// step starts and the step stores `json` in its training_summary.json as "run_overview".
  /// `dschat train` fills it from the memory plan (plan::step_overview); empty: no table.
  struct Overview {
    std::string text;
    nlohmann::json json;
  };
  std::map<int, Overview> step_overviews;
  /// The running step's overview JSON (run_pipeline sets it from step_overviews); null: none.
  nlohmann::json run_overview;

  bool stopping() const { return stop_requested != nullptr && stop_requested->load(); }
};

/// A step stopped on request (Ctrl-C) after saving a checkpoint it will resume from.
class Interrupted : public core::Error {
 public:
  using core::Error::Error;
};

}  // namespace rlhf
}  // namespace dschat
