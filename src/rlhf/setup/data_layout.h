#pragma once
// Where in an epoch a checkpoint stands, independent of the world size. A rank of a W-rank job
// takes positions r, r + W, r + 2W, ... of the epoch's shuffled order (data::DistributedSampler,
// as PyTorch's), so after k micro-batches of b rows on every rank the job has consumed exactly
// the first k * b * W positions. A resume with another world size or micro-batch size continues
// at that position: k' = k * b * W / (b' * W') micro-batches of its own layout. The optimizer
// steps (and the LR schedule) line up when the global batch b * W * GAS is the same; when it is
// not, an exact continuation does not exist and the resume is refused unless the step's
// `elastic_resume` is "allow".
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "dschat/core/error.h"

namespace dschat {
namespace rlhf {

/// Micro-batches of `micro` rows on each of `world` ranks, `gas` per optimizer step.
struct DataLayout {
  int64_t world = 1;
  int64_t micro = 1;
  int64_t gas = 1;

  int64_t global_batch() const { return world * micro * gas; }
  nlohmann::json to_json() const { return {{"world_size", world}, {"micro_batch", micro}, {"gas", gas}}; }
  std::string describe() const {
    return std::to_string(world) + (world == 1 ? " rank" : " ranks") + " x " + std::to_string(micro) +
           " rows x GAS " + std::to_string(gas) + " (global batch " + std::to_string(global_batch()) + ")";
  }
  bool operator==(const DataLayout& o) const { return world == o.world && micro == o.micro && gas == o.gas; }
};

/// The checkpoint key the layout is saved under (beside "epoch" and "batch").
inline const char* data_layout_key() { return "data_layout"; }

/// The layout a checkpoint's client state was written by, or nullopt when it names none (then it
/// was written by the same layout as the run reading it).
inline std::optional<DataLayout> saved_layout(const nlohmann::json& state) {
  if (!state.contains(data_layout_key())) return std::nullopt;
  const nlohmann::json& saved = state.at(data_layout_key());
  return DataLayout{saved.at("world_size").get<int64_t>(), saved.at("micro_batch").get<int64_t>(),
                    saved.at("gas").get<int64_t>()};
}

/// A checkpoint's guardian state (monitor::Guardian::state()) for a run on `current`: its skipped
/// windows ({"epoch", "begin", "end"}, micro-batches of the layout that wrote `state`) become
/// the micro-batches of `current` holding the same samples, widened to whole micro-batches where
/// they do not fall on this layout's boundaries.
inline nlohmann::json guardian_state_for(const nlohmann::json& state, const DataLayout& current) {
  nlohmann::json guardian = state.at("guardian");
  const std::optional<DataLayout> saved = saved_layout(state);
  if (!saved || !guardian.contains("skipped")) return guardian;
  const int64_t from = saved->world * saved->micro, to = current.world * current.micro;  // samples per micro-batch index
  for (nlohmann::json& window : guardian.at("skipped")) {
    if (!window.is_object() || !window.contains("begin") || !window.contains("end")) continue;
    window["begin"] = window.at("begin").get<int64_t>() * from / to;
    window["end"] = (window.at("end").get<int64_t>() * from + to - 1) / to;
  }
  return guardian;
}

/// The micro-batches of `current` to skip in the checkpoint's epoch, given the checkpoint's
/// client state (its "batch" counted in the saved layout; a checkpoint without a layout was
/// written by the same layout). Logs what a changed layout does; throws core::ConfigError naming
/// both layouts when the global batch changed and `allow_global_batch_change` is false.
inline int64_t resume_micro_batch(const nlohmann::json& state, const DataLayout& current,
                                  bool allow_global_batch_change, const std::string& where) {
  const int64_t batch = state.at("batch").get<int64_t>();
  const std::optional<DataLayout> saved_or_none = saved_layout(state);
  if (!saved_or_none || *saved_or_none == current) return batch;
  const DataLayout saved = *saved_or_none;
  DSCHAT_CHECK(allow_global_batch_change || saved.global_batch() == current.global_batch(), ConfigError, where,
               ": the checkpoint was written by ", saved.describe(), " and this run is ", current.describe(),
               ": with another global batch the optimizer steps, and the learning-rate schedule over them, cannot "
               "continue as they were. Set gradient_accumulation_steps (or the batch size) so that rows x GAS x "
               "ranks is ", saved.global_batch(), " again, or set the step's key 'elastic_resume' to \"allow\" to go "
               "on from the same sample with the schedule at the same optimizer step");
  const int64_t samples = batch * saved.world * saved.micro;  // the consumed prefix of the epoch's order
  const int64_t unit = current.world * current.micro;
  const int64_t skip = samples / unit;
  core::log_warn(where, ": resuming on ", current.describe(), " from a checkpoint of ", saved.describe(), "; epoch ",
                 state.at("epoch").get<int64_t>() + 1, " continues at sample ", skip * unit,
                 " of its shuffled order (micro-batch ", skip, " of this layout)",
                 samples % unit == 0 ? std::string()
                                     : "; " + std::to_string(samples - skip * unit) +
                                           " samples before it are trained again (not a micro-batch boundary here)");
  return skip;
}

}  // namespace rlhf
}  // namespace dschat
