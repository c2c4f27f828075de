#include "dschat/core/host_sync.h"
#include "dschat/rlhf/step_runner.h"

#include <algorithm>
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

namespace {

// Why `tag` cannot be resumed from in `part_dir`, or "" when it can: an engine checkpoint (it has
// an engine.json or a manifest.json) must match its manifest; another part (step 3's EMA
// weights) must exist.
std::string tag_fault(const fs::path& part_dir, const std::string& tag, bool engine_part) {
  const fs::path dir = part_dir / tag;
  if (!fs::is_directory(dir)) return dir.string() + ": missing";
  if (!engine_part) return "";
  try {
    engine::CheckpointShards::open(dir);
  } catch (const std::exception& e) {  // core::Error, or a malformed file's parse error
    return e.what();
  }
  return "";
}

}  // namespace

bool StepRunner::prepare_resume() {
  const auto part_dir = [&](const std::string& part) { return part.empty() ? checkpoint_dir_ : checkpoint_dir_ / part; };
  const fs::path primary = part_dir(parts_.front());
  if (context_rank(context_) == 0 && fs::exists(primary)) {
    std::vector<std::string> candidates;
    if (fs::exists(primary / "latest")) candidates.push_back(engine::latest_checkpoint_tag(primary));
    const std::vector<engine::CheckpointTag> tags = engine::list_checkpoint_tags(primary);
    for (auto it = tags.rbegin(); it != tags.rend(); ++it) {
      if (std::find(candidates.begin(), candidates.end(), it->tag) == candidates.end()) candidates.push_back(it->tag);
    }
    std::string intact;
    for (const std::string& tag : candidates) {
      std::string fault;
      for (size_t i = 0; i < parts_.size() && fault.empty(); ++i) {
        // Parts other than the first are engine checkpoints when they have a `latest` (step 3's critic).
        const bool engine_part = i == 0 || fs::exists(part_dir(parts_[i]) / "latest");
        if (i > 0 && !fs::exists(part_dir(parts_[i]))) continue;  // a part this run does not write
        fault = tag_fault(part_dir(parts_[i]), tag, engine_part);
      }
      if (fault.empty()) {
        intact = tag;
        break;
      }
      core::log_warn(name_, ": checkpoint ", tag, " cannot be resumed from (", fault, "); moved aside as ", tag,
                     ".corrupt, trying an older one");
      for (const std::string& part : parts_) {
        const fs::path from = part_dir(part) / tag, to = part_dir(part) / (tag + ".corrupt");
        if (!fs::exists(from)) continue;
        io::remove_directory_tree(to);
        fs::rename(from, to);
      }
    }
    for (const std::string& part : parts_) {
      const fs::path latest = part_dir(part) / "latest";
      if (!fs::exists(latest)) continue;
      if (intact.empty()) {
        fs::remove(latest);
      } else {
        io::write_file_atomically(latest, intact);
      }
    }
    if (intact.empty() && !candidates.empty()) {
      core::log_warn(name_, ": no intact checkpoint in ", primary.string(), "; the step starts from the beginning");
    }
  }
  if (context_.communicator) context_.communicator->barrier();
  return can_resume(parts_.front());
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
