#include "dschat/core/host_sync.h"
#include "dschat/rlhf/setup/step_runner.h"

#include <algorithm>
#include <atomic>
#include <fstream>

#include "core/json_object.h"
#include "core/log.h"
#include "core/strings.h"
#include "io/atomic_file.h"
#include "rlhf/setup/step_runner_testing.h"
#include "dschat/engine/checkpoint_shards.h"
#include "dschat/io/state_dict.h"
#include "dschat/rlhf/setup/step_setup.h"

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
  guardian_dir_ = dir.parent_path() / (dir.filename().string() + "_guardian");
  if (common_.async_checkpoint) writer_ = std::make_unique<engine::AsyncCheckpointWriter>();
}

StepRunner::~StepRunner() {
  // Unwinding (a failure in training, or the crash seam): in a world of one the pending write is
  // finished, and retention applied, as a wait would; with several ranks the writer's destructor
  // finishes this rank's files but does not wait for the others (they may be gone).
  const bool alone = !context_.communicator || context_.communicator->world_size() == 1;
  if (!writer_ || !alone) return;
  try {
    writer_->wait();  // the save and its retention
  } catch (const std::exception& e) {
    core::log_warn(name_, ": the last checkpoint write failed: ", e.what());
  }
}

fs::path StepRunner::part_dir(const std::string& part) const {
  return part.empty() ? checkpoint_dir_ : checkpoint_dir_ / part;
}

bool StepRunner::can_resume(const std::string& part) const { return fs::exists(part_dir(part) / "latest"); }

void StepRunner::set_checkpoint_parts(std::vector<std::string> parts) {
  DSCHAT_CHECK(!parts.empty(), InvalidArgument, name_, ": a checkpoint needs at least one part");
  parts_ = std::move(parts);
}

namespace {

// Why `tag` cannot be resumed from in `part_dir`, or "" when it can: an engine checkpoint must
// match its manifest; another part (step 3's EMA weights) must read back.
std::string tag_fault(const fs::path& part_dir, const std::string& tag, bool engine_part) {
  const fs::path dir = part_dir / tag;
  if (!fs::is_directory(dir)) return dir.string() + ": missing";
  try {
    if (engine_part) {
      engine::CheckpointShards::open(dir);
    } else {
      io::load_state_dict(dir);  // headers against file sizes (memory-mapped, nothing copied)
    }
  } catch (const std::exception& e) {  // core::Error, or a malformed file's parse error
    return e.what();
  }
  return "";
}

void move_aside(const fs::path& from, const std::string& suffix) {
  if (!fs::exists(from)) return;
  const fs::path to = from.string() + suffix;
  io::remove_directory_tree(to);
  fs::rename(from, to);
}

}  // namespace

std::string StepRunner::fault_in_parts(const std::string& tag) const {
  for (size_t i = 0; i < parts_.size(); ++i) {
    const fs::path dir = part_dir(parts_[i]);
    if (i > 0 && !fs::exists(dir)) continue;  // a part this run does not write
    // Parts other than the first are engine checkpoints when they have a `latest` (step 3's critic).
    std::string fault = tag_fault(dir, tag, i == 0 || fs::exists(dir / "latest"));
    if (!fault.empty()) return fault;
  }
  return "";
}

std::string StepRunner::requested_resume_tag() {
  const std::string& tag = context_.resume_from;
  const fs::path primary = part_dir(parts_.front());
  const std::vector<engine::CheckpointTag> tags = engine::list_checkpoint_tags(primary);
  std::string available;
  for (const engine::CheckpointTag& t : tags) available += " " + t.tag;
  DSCHAT_CHECK(fs::is_directory(primary / tag), NotFound, name_, ": --resume-from ", tag, ": no such checkpoint in ",
               primary.string(), available.empty() ? " (it holds none)" : "; it holds:" + available);
  const std::string fault = fault_in_parts(tag);
  DSCHAT_CHECK(fault.empty(), FormatError, name_, ": --resume-from ", tag, ": the checkpoint is damaged (", fault,
               "); intact tags are found by `dschat ckpt verify ", primary.string(), "`");
  // The tags saved after it belong to the run being abandoned: set aside, not deleted.
  int64_t chosen_step = -1;
  for (const engine::CheckpointTag& t : tags) {
    if (t.tag == tag) chosen_step = t.global_steps;
  }
  for (const engine::CheckpointTag& t : tags) {
    if (t.global_steps <= chosen_step || t.tag == tag) continue;
    core::log_warn(name_, ": --resume-from ", tag, ": the later checkpoint ", t.tag, " is moved aside as ", t.tag,
                   ".superseded");
    for (const std::string& part : parts_) move_aside(part_dir(part) / t.tag, ".superseded");
  }
  return tag;
}

std::string StepRunner::choose_resume_tag() {
  const fs::path primary = part_dir(parts_.front());
  std::vector<std::string> candidates;
  if (fs::exists(primary / "latest")) candidates.push_back(engine::latest_checkpoint_tag(primary));
  const std::vector<engine::CheckpointTag> tags = engine::list_checkpoint_tags(primary);
  for (auto it = tags.rbegin(); it != tags.rend(); ++it) {
    if (std::find(candidates.begin(), candidates.end(), it->tag) == candidates.end()) candidates.push_back(it->tag);
  }
  for (const std::string& tag : candidates) {
    const std::string fault = fault_in_parts(tag);
    if (fault.empty()) return tag;
    core::log_warn(name_, ": checkpoint ", tag, " cannot be resumed from (", fault, "); moved aside as ", tag,
                   ".corrupt, trying an older one");
    for (const std::string& part : parts_) move_aside(part_dir(part) / tag, ".corrupt");
  }
  if (!candidates.empty()) {
    core::log_warn(name_, ": no intact checkpoint in ", primary.string(), "; the step starts from the beginning");
  }
  return "";
}

bool StepRunner::prepare_resume() {
  const fs::path primary = part_dir(parts_.front());
  std::exception_ptr failure;
  if (context_rank(context_) == 0 && (fs::exists(primary) || !context_.resume_from.empty())) {
    try {
      const std::string tag = context_.resume_from.empty() ? choose_resume_tag() : requested_resume_tag();
      for (const std::string& part : parts_) {
        const fs::path latest = part_dir(part) / "latest";
        if (tag.empty()) {
          if (fs::exists(latest)) fs::remove(latest);
        } else if (fs::exists(latest) || fs::exists(part_dir(part) / tag / "engine.json")) {
          io::write_file_atomically(latest, tag);
        }
      }
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (context_.communicator) {  // every rank learns whether rank 0 failed, so none waits for it
    torch::Tensor failed = torch::full({1}, failure ? 1 : 0, torch::kInt64);  // [1]
    context_.communicator->all_reduce(failed, dist::ReduceOp::Max);
    DSCHAT_CHECK(failure || failed.item<int64_t>() == 0, Error, name_,
                 ": rank 0 could not choose the checkpoint to resume from (its error says why)");
  }
  if (failure) std::rethrow_exception(failure);
  return can_resume(parts_.front());
}

void StepRunner::remove_old_tags() {
  const int64_t keep = common_.keep_checkpoints;
  if (keep > 0) {
    const fs::path primary = part_dir(parts_.front());
    const std::vector<engine::CheckpointTag> tags = engine::list_checkpoint_tags(primary);  // oldest first
    std::string latest;
    if (fs::exists(primary / "latest")) latest = engine::latest_checkpoint_tag(primary);
    const size_t first_kept = tags.size() > static_cast<size_t>(keep) ? tags.size() - static_cast<size_t>(keep) : 0;
    for (size_t i = 0; i < first_kept; ++i) {
      if (tags[i].tag == latest) continue;
      for (const std::string& part : parts_) io::remove_directory_tree(part_dir(part) / tags[i].tag);
      core::log_debug(name_, ": removed checkpoint ", tags[i].tag, " (keep_checkpoints ", keep, ")");
    }
  }
}

void StepRunner::retain_checkpoints() {
  if (context_rank(context_) == 0) remove_old_tags();
  if (context_.communicator) context_.communicator->barrier();
}

void StepRunner::wait_for_checkpoints() {
  if (writer_) engine::wait_for_checkpoint_writes(*writer_, context_.communicator.get());
}

void StepRunner::save_checkpoint(const SaveFunction& save, bool wait) {
  core::HostSync sync("checkpoint");
  wait_for_checkpoints();  // one save in flight at a time
  save(writer_.get());
  if (!writer_) {
    retain_checkpoints();
    return;
  }
  // Queued behind the save's parts, so it runs once they are committed, and is skipped if one failed.
  if (context_rank(context_) == 0) writer_->submit([this](const std::atomic<bool>&) { remove_old_tags(); });
  if (wait) wait_for_checkpoints();
}

bool StepRunner::checkpoint_due(int64_t optimizer_steps) const {
  return context_.stopping() || (common_.checkpoint_interval > 0 && optimizer_steps % common_.checkpoint_interval == 0);
}

void StepRunner::after_optimizer_step(int64_t optimizer_steps, const SaveFunction& save) {
  if (context_.stopping()) {
    core::log_warn(name_, ": stop requested; saving a checkpoint at optimizer step ", optimizer_steps);
    save_checkpoint(save, /*wait=*/true);
    throw Interrupted(name_ + ": stopped after optimizer step " + std::to_string(optimizer_steps) +
                      "; the run resumes from " + checkpoint_dir_.string());
  }
  if (common_.checkpoint_interval > 0 && optimizer_steps % common_.checkpoint_interval == 0) save_checkpoint(save);
  const int64_t crash_after = crash_after_steps_for_testing.load();
  if (crash_after > 0 && optimizer_steps >= crash_after) {
    throw Interrupted(name_ + ": test crash after optimizer step " + std::to_string(optimizer_steps));
  }
}

void StepRunner::supersede_checkpoints_after(int64_t global_steps) {
  wait_for_checkpoints();
  if (context_rank(context_) == 0) {
    std::string newest;
    for (const engine::CheckpointTag& t : engine::list_checkpoint_tags(part_dir(parts_.front()))) {
      if (t.global_steps <= global_steps) {
        newest = t.tag;
        continue;
      }
      core::log_warn(name_, ": checkpoint ", t.tag, " was saved after the state the guardian rolled back to; moved "
                     "aside as ", t.tag, ".superseded");
      for (const std::string& part : parts_) move_aside(part_dir(part) / t.tag, ".superseded");
    }
    for (const std::string& part : parts_) {
      const fs::path latest = part_dir(part) / "latest";
      if (!fs::exists(latest)) continue;
      if (newest.empty()) {
        fs::remove(latest);
      } else {
        io::write_file_atomically(latest, newest);
      }
    }
  }
  if (context_.communicator) context_.communicator->barrier();
}

void StepRunner::finish() {
  wait_for_checkpoints();
  if (context_rank(context_) == 0) remove_checkpoints_but_damaged();
  if (context_.communicator) context_.communicator->barrier();
}

void StepRunner::remove_checkpoints_but_damaged() {
  // <tag>.corrupt directories (in the checkpoint dir or a part of it) are what a resume found
  // damaged: they stay for inspection; with keep_last_checkpoint so do `latest` and the tag it
  // names; everything else goes.
  std::vector<fs::path> damaged;
  bool kept_last = false;
  auto sweep = [&](const fs::path& dir, bool recurse_into_parts) {
    std::string last;
    if (common_.keep_last_checkpoint && fs::exists(dir / "latest")) last = engine::latest_checkpoint_tag(dir);
    for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_directory() && core::ends_with(name, ".corrupt")) {
        damaged.push_back(entry.path());
      } else if (recurse_into_parts && entry.is_directory() &&
                 std::find(parts_.begin(), parts_.end(), name) != parts_.end()) {
        continue;  // a part: swept below
      } else if (!last.empty() && (name == "latest" || name == last)) {
        kept_last = true;
      } else {
        io::remove_directory_tree(entry.path());
      }
    }
  };
  if (!fs::exists(checkpoint_dir_)) return;
  sweep(checkpoint_dir_, true);
  for (const std::string& part : parts_) {
    if (part.empty() || !fs::exists(part_dir(part))) continue;
    sweep(part_dir(part), false);
    if (fs::is_empty(part_dir(part))) io::remove_directory_tree(part_dir(part));
  }
  if (fs::is_empty(checkpoint_dir_)) {
    io::remove_directory_tree(checkpoint_dir_);
    return;
  }
  if (kept_last) {
    core::log_info(name_, ": finished; its last checkpoint stays in ", checkpoint_dir_.string(),
                   " (keep_last_checkpoint; `dschat ckpt list` shows it)");
  }
  if (damaged.empty()) return;
  std::vector<std::string> names;
  for (const fs::path& path : damaged) names.push_back(path.string());
  core::log_warn(name_, ": finished; the damaged checkpoints found on resuming stay for inspection (delete them when "
                 "done): ", core::join(names));
}

}  // namespace rlhf
}  // namespace dschat
