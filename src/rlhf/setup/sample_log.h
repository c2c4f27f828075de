#pragma once
// The samples each rank trained on (the step key `log_sample_ids`): one JSON line per trained
// micro-batch in <dir>_logs/samples.rank<r>.jsonl,
//   {"epoch":0,"micro_batch":3,"update":2,"ids":[17,4]}
// where `ids` are positions in the step's training set (before the epoch's shuffle) and `update`
// is the optimizer step the micro-batch's gradient goes into (1-based, engine.global_steps()
// after that step). It is an audit of what the saved model saw: the records of every rank, of
// every run of the step, together hold each epoch's samples once (the sampler's padding aside).
//
// A rewind keeps that true across a resume or a guardian rollback to global step K: rank 0 drops
// the records with update > K from every rank's file (those of a world size no longer running
// included: that state was lost) and appends an event line {"event":"resume"|"rollback"|"start",
// "global_step":K,...} to its own; a fresh start (K = 0) empties the log. Every line is written
// through to the file, so a kill loses no record of a committed checkpoint.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/dist/process_group.h"

namespace dschat {
namespace rlhf {

class SampleLog {
 public:
  /// `dir`: the step's log folder (StepRunner::log_dir()); `communicator` null for one process.
  SampleLog(std::filesystem::path dir, std::shared_ptr<dist::Communicator> communicator);

  /// Collective: drops every record with update > global_steps (all of them when 0) and notes
  /// `event` (an object; "global_step" is added). Throws core::IoError naming a file.
  void rewind(int64_t global_steps, nlohmann::json event);

  /// One trained micro-batch. Throws core::IoError naming the file when it cannot be written.
  void record(int64_t epoch, int64_t micro_batch, int64_t update, const std::vector<int64_t>& ids);

  /// This rank's file.
  const std::filesystem::path& file() const { return file_; }

 private:
  void append(const nlohmann::json& line);

  std::filesystem::path dir_;
  std::shared_ptr<dist::Communicator> communicator_;
  int64_t rank_ = 0;
  std::filesystem::path file_;
  std::ofstream out_;  // opened for appending at the first line after a rewind
};

/// A policy loop's log (PPO, the critic-free step): none when the step's log_sample_ids is off;
/// else rewound to `step` ("resume" when `resumed`, else a fresh "start"), noting the layout.
/// Collective. Its records are prompt batches; `update` is the policy step they feed.
std::optional<SampleLog> open_policy_sample_log(bool log_sample_ids, const std::filesystem::path& log_dir,
                                                const std::shared_ptr<dist::Communicator>& communicator,
                                                bool resumed, int64_t step, const nlohmann::json& layout);

/// The files of every rank that ever wrote to `dir`'s sample log, in rank order.
std::vector<std::filesystem::path> sample_log_files(const std::filesystem::path& dir);

}  // namespace rlhf
}  // namespace dschat
