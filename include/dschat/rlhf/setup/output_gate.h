#pragma once
// The gate before a step's final save (rlhf::save_trained_model, rlhf::save_rl_outputs): a model
// with NaN/Inf weights, or one no optimizer step updated, is refused with StepFailed, naming the
// cause and the checkpoints kept, instead of being written and marked finished.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include <torch/torch.h>

#include "dschat/core/error.h"
#include "dschat/rlhf/config/step_context.h"

namespace dschat {
namespace rlhf {

/// A step that ran to its end but produced nothing worth saving (diverged, or never updated).
class StepFailed : public core::Error {
 public:
  using core::Error::Error;
};

/// Where a step writing `output_dir` keeps its checkpoints and which tag is the latest, with how to
/// inspect and resume them; or that it has written none.
std::string checkpoint_note(const std::filesystem::path& output_dir);

/// "" when every floating-point tensor is finite; otherwise how many values are not, and where.
std::string non_finite_weights(const std::map<std::string, torch::Tensor>& params);

/// Collective. `params` are the gathered weights on rank 0 (empty elsewhere), `optimizer_steps`
/// the updates the engine made (global steps less the skipped ones). Throws StepFailed on every rank when rank 0 finds the model diverged or
/// untrained; the message names `output_dir`, the cause and `<output_dir>_checkpoints`' latest tag.
void check_step_output(const std::map<std::string, torch::Tensor>& params, int64_t optimizer_steps,
                       const std::filesystem::path& output_dir, const StepContext& context);

}  // namespace rlhf
}  // namespace dschat
