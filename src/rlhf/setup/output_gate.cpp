// The last check before a step writes its model and marks itself finished: a diverged model
// (NaN/Inf weights) or a step that never updated the weights fails the step instead, so the
// next `dschat train` does not skip it and nothing downstream starts from garbage.
#include "dschat/rlhf/setup/output_gate.h"

#include <string>
#include <vector>

#include "core/strings.h"
#include "dschat/engine/checkpoint_shards.h"
#include "dschat/rlhf/setup/step_setup.h"

namespace dschat {
namespace rlhf {
namespace fs = std::filesystem;

std::string checkpoint_note(const fs::path& output_dir) {
  fs::path dir = output_dir.lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  const fs::path checkpoints = dir.parent_path() / (dir.filename().string() + "_checkpoints");
  for (const fs::path& part : {checkpoints, checkpoints / "actor"}) {
    if (fs::exists(part / "latest")) {
      return checkpoints.string() + " keeps the step's checkpoints (latest: " + engine::latest_checkpoint_tag(part) +
             "; `dschat ckpt verify " + part.string() + "` lists them, `--resume-from TAG` restarts from one)";
    }
  }
  return "no checkpoint of this step was written";
}

std::string non_finite_weights(const std::map<std::string, torch::Tensor>& params) {
  int64_t bad_values = 0, values = 0;
  std::vector<std::string> bad_names;
  for (const auto& [name, tensor] : params) {
    values += tensor.numel();
    if (!tensor.is_floating_point()) continue;
    const int64_t bad = torch::logical_not(torch::isfinite(tensor)).sum().item<int64_t>();
    if (bad == 0) continue;
    bad_values += bad;
    bad_names.push_back(name);
  }
  if (bad_values == 0) return "";
  if (bad_names.size() > 3) bad_names.resize(3), bad_names.push_back("...");
  return std::to_string(bad_values) + " of " + std::to_string(values) + " weights are NaN or Inf (in " +
         core::join(bad_names) + ")";
}

void check_step_output(const std::map<std::string, torch::Tensor>& params, int64_t optimizer_steps,
                       const fs::path& output_dir, const StepContext& context) {
  std::string fault;
  if (context_rank(context) == 0) {  // the rank that holds the gathered weights
    if (optimizer_steps == 0) {
      fault = "the step made no optimizer update (every step was skipped for non-finite gradients or rolled back, "
              "or the data holds fewer samples than one global batch), so the model is untrained";
    } else {
      const std::string bad = non_finite_weights(params);
      if (!bad.empty()) fault = "the training diverged: " + bad + " after " + std::to_string(optimizer_steps) +
                                " optimizer updates (lower the learning rate, or turn the guardian's non_finite rollback on)";
    }
  }
  bool failed = !fault.empty();
  if (context.communicator) {  // every rank fails alike, so none waits at the save's barrier
    torch::Tensor flag = torch::full({1}, failed ? 1 : 0, torch::kInt64);  // [1]
    context.communicator->all_reduce(flag, dist::ReduceOp::Max);
    failed = flag.item<int64_t>() != 0;
  }
  if (!failed) return;
  if (fault.empty()) fault = "rank 0 refused the trained model (its log says why)";
  throw StepFailed(output_dir.string() + ": the model is not saved and the step is not marked finished: " + fault + "; " +
                   checkpoint_note(output_dir));
}

}  // namespace rlhf
}  // namespace dschat
