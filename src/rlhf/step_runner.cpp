#include "dschat/core/host_sync.h"
#include "dschat/rlhf/step_runner.h"

#include <atomic>
#include <fstream>

#include "core/json_object.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "rlhf/step_runner_testing.h"
#include "dschat/engine/checkpoint_shards.h"
#include "dschat/rlhf/step_setup.h"

namespace dschat {
namespace rlhf {
namespace fs = std::filesystem;

namespace {
std::atomic<int64_t> crash_after_steps_for_testing{0};
}  // namespace

namespace testing {
void set_crash_after_optimizer_steps(int64_t steps) { crash_after_steps_for_testing.store(steps); }
}  // namespace testing

fs::path summary_file(const fs::path& output_dir) { return output_dir / "training_summary.json"; }

std::optional<nlohmann::json> finished_step_summary(const fs::path& output_dir) {
  const fs::path file = summary_file(output_dir);
  if (!fs::exists(file)) return std::nullopt;
  return core::read_json_file(file.string());
}

StepRunner::StepRunner(std::string name, const fs::path& output_dir, const CommonStepConfig& common,
                       const StepContext& context)
    : name_(std::move(name)), common_(common), context_(context) {
  DSCHAT_CHECK(!output_dir.empty(), ConfigError, name_, ": key 'output_dir' is empty; the step needs somewhere to "
               "save its model and checkpoints");
  fs::path dir = output_dir.lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // "out/actor/" -> "out/actor"
  checkpoint_dir_ = dir.parent_path() / (dir.filename().string() + "_checkpoints");
  log_dir_ = dir.parent_path() / (dir.filename().string() + "_logs");
}

bool StepRunner::can_resume(const std::string& part) const {
  return fs::exists((part.empty() ? checkpoint_dir_ : checkpoint_dir_ / part) / "latest");
}

void StepRunner::set_checkpoint_parts(std::vector<std::string> parts) {
  DSCHAT_CHECK(!parts.empty(), InvalidArgument, name_, ": a checkpoint needs at least one part");
  parts_ = std::move(parts);
}

void StepRunner::retain_checkpoints() {
  const int64_t keep = common_.keep_checkpoints;
  if (keep > 0 && context_rank(context_) == 0) {
    const fs::path primary = parts_.front().empty() ? checkpoint_dir_ : checkpoint_dir_ / parts_.front();
    const std::vector<engine::CheckpointTag> tags = engine::list_checkpoint_tags(primary);  // oldest first
    std::string latest;
    if (fs::exists(primary / "latest")) latest = engine::latest_checkpoint_tag(primary);
    const size_t first_kept = tags.size() > static_cast<size_t>(keep) ? tags.size() - static_cast<size_t>(keep) : 0;
    for (size_t i = 0; i < first_kept; ++i) {
      if (tags[i].tag == latest) continue;
      for (const std::string& part : parts_) {
        io::remove_directory_tree((part.empty() ? checkpoint_dir_ : checkpoint_dir_ / part) / tags[i].tag);
      }
      core::log_debug(name_, ": removed checkpoint ", tags[i].tag, " (keep_checkpoints ", keep, ")");
    }
  }
  if (context_.communicator) context_.communicator->barrier();
}

void StepRunner::after_optimizer_step(int64_t optimizer_steps, const std::function<void()>& save_now) {
  const auto save = [&] {
    core::HostSync sync("checkpoint");
    save_now();
    retain_checkpoints();
  };
  if (context_.stopping()) {
    core::log_warn(name_, ": stop requested; saving a checkpoint at optimizer step ", optimizer_steps);
    save();
    throw Interrupted(name_ + ": stopped after optimizer step " + std::to_string(optimizer_steps) +
                      "; the run resumes from " + checkpoint_dir_.string());
  }
  if (common_.checkpoint_interval > 0 && optimizer_steps % common_.checkpoint_interval == 0) save();
  const int64_t crash_after = crash_after_steps_for_testing.load();
  if (crash_after > 0 && optimizer_steps >= crash_after) {
    throw Interrupted(name_ + ": test crash after optimizer step " + std::to_string(optimizer_steps));
  }
}

void StepRunner::finish() {
  if (context_rank(context_) == 0) io::remove_directory_tree(checkpoint_dir_);
  if (context_.communicator) context_.communicator->barrier();
}

}  // namespace rlhf
}  // namespace dschat
