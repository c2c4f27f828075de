#pragma once
// The resumable skeleton every trainer runs in: where its checkpoints live, restoring the latest
// one, periodic checkpoints every `checkpoint_interval` optimizer steps, and the stop request
// (Ctrl-C) turned into "save a checkpoint, then throw Interrupted". Saves are asynchronous unless
// `async_checkpoint` is off: the trainer's save function snapshots its engines' state and hands
// the writes to the runner's background writer; the next save, a stop request and the end of
// the step wait for them (and report a failed write on every rank).
//
// Layout for a step whose output is <dir> (e.g. <out>/actor):
//   <dir>_checkpoints/            training checkpoints (engine format, `latest` pointer)
//   <dir>_logs/                   metrics.jsonl and TensorBoard events (kept: `dschat plot`)
//   <dir>_guardian/               the guardian's last healthy snapshot (removed at the end)
//   <dir>/                        the finished Hugging Face model, renamed into place at the end,
//   <dir>/training_summary.json   with the step's figures: its presence means "step finished"
// so an interrupted step leaves <dir> absent (or the previous run's) and resumes from
// <dir>_checkpoints; a finished step is skipped by `dschat train`.
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/engine/async_checkpoint_writer.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/config/step_context.h"

namespace dschat {
namespace rlhf {

/// <dir>/training_summary.json: written last, inside the atomically renamed model directory.
std::filesystem::path summary_file(const std::filesystem::path& output_dir);
/// The summary of a finished step, or nullopt when the step has not finished there.
std::optional<nlohmann::json> finished_step_summary(const std::filesystem::path& output_dir);

class StepRunner {
 public:
  /// `name` ("step 1 (SFT)") appears in messages.
  StepRunner(std::string name, const std::filesystem::path& output_dir, const CommonStepConfig& common,
             const StepContext& context);
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;
  ~StepRunner();

  const std::filesystem::path& checkpoint_dir() const { return checkpoint_dir_; }
  const std::filesystem::path& log_dir() const { return log_dir_; }
  /// <dir>_guardian: the guardian's snapshots of a healthy state (rlhf/loop/guarded_run.h).
  const std::filesystem::path& guardian_dir() const { return guardian_dir_; }
  /// Whether a checkpoint to resume from exists (in checkpoint_dir()/<part> when the step keeps
  /// several engines' checkpoints, as step 3 does).
  bool can_resume(const std::string& part = "") const;

  /// Saves one checkpoint (collective): given the writer, it submits the writes there
  /// (TrainingEngine::save_checkpoint's `background`); given null, it writes before returning.
  using SaveFunction = std::function<void(engine::AsyncCheckpointWriter* background)>;

  /// Call after every optimizer step with the number of optimizer steps taken so far and the
  /// save function. Saves every checkpoint_interval steps; on a stop request saves, waits for
  /// the write and throws Interrupted.
  void after_optimizer_step(int64_t optimizer_steps, const SaveFunction& save);
  /// Whether after_optimizer_step(optimizer_steps, ...) will save (a stop request, or the interval).
  bool checkpoint_due(int64_t optimizer_steps) const;
  /// Collective: waits for the previous save, then saves (asynchronously unless async_checkpoint
  /// is off, or `wait` asks to finish the write before returning).
  void save_checkpoint(const SaveFunction& save, bool wait = false);
  /// Collective: waits until every rank's pending checkpoint writes are committed (and retention,
  /// queued on rank 0's writer behind each save, has run). Throws core::IoError on every rank when a write failed anywhere (the checkpoint
  /// before it stays `latest`).
  void wait_for_checkpoints();

  /// The sub-directories of checkpoint_dir() a step's checkpoint spans, the first an engine's
  /// (its tags decide); default {""}: checkpoint_dir() itself. Step 3: {"actor", "critic", "ema"}.
  void set_checkpoint_parts(std::vector<std::string> parts);
  /// Collective, before a resume: finds the newest intact tag, `latest`'s first, then the others
  /// newest first. A tag is intact when every part that exists holds it, each engine part's copy
  /// matches its manifest (checksums, sizes, missing or truncated files) and every other part's
  /// weights read back. Rank 0 warns naming each bad tag and its fault, renames it to
  /// <tag>.corrupt in every part, and points every engine part's `latest` at the intact tag;
  /// after a barrier every rank reads that tag. Returns whether there is one to resume from
  /// (false, with a warning, when none is intact).
  ///
  /// With StepContext::resume_from (`--resume-from TAG`), that tag is the one: it must exist and
  /// be intact (core::NotFound / core::FormatError naming it and the tags there otherwise), and
  /// the tags saved after it are moved aside as <tag>.superseded so retention and later resumes
  /// follow the run that continues from it.
  bool prepare_resume();

  /// Collective, after a save has completed (save_checkpoint does it; on the writer's thread when
  /// saves are asynchronous, right after the commit): keeps the newest common.keep_checkpoints tags (0:
  /// all) of the first part, the one its `latest` names always among them, and deletes the other
  /// tags from every part (rank 0 deletes, then a barrier).
  void retain_checkpoints();

  /// Collective, after a guardian rollback restored the state of `global_steps` (the first part's
  /// engine's count): the checkpoints saved after it belong to the abandoned trajectory and are
  /// moved aside as <tag>.superseded (as --resume-from does), `latest` pointing at the newest
  /// remaining one, so a later resume continues the run as it goes on now.
  void supersede_checkpoints_after(int64_t global_steps);

  const std::string& name() const { return name_; }

  /// Removes the checkpoints once the model and its summary are in place, after waiting for the
  /// pending writes (rank 0 removes; collective). Tags a resume renamed <tag>.corrupt stay, with
  /// a warning naming them, for inspection.
  void finish();

 private:
  std::filesystem::path part_dir(const std::string& part) const;
  // The tag prepare_resume resumes from (rank 0), or "" for none: StepContext::resume_from's or
  // the newest intact one.
  std::string choose_resume_tag();
  std::string requested_resume_tag();
  // Why `tag` cannot be resumed from in some part of the step's checkpoint, or "" when it can.
  std::string fault_in_parts(const std::string& tag) const;
  void remove_old_tags();  // retention's deletions (rank 0)
  void remove_checkpoints_but_damaged();  // finish()'s deletions (rank 0)

  std::string name_;
  std::filesystem::path checkpoint_dir_;
  std::filesystem::path log_dir_;
  std::filesystem::path guardian_dir_;
  CommonStepConfig common_;
  const StepContext& context_;
  std::vector<std::string> parts_{""};
  // Null when async_checkpoint is off. Declared last: destroyed (its thread joined) first.
  std::unique_ptr<engine::AsyncCheckpointWriter> writer_;
};

}  // namespace rlhf
}  // namespace dschat
