#include "dschat/core/host_sync.h"
#include "dschat/rlhf/loop/guarded_run.h"

#include <torch/torch.h>

#include "core/log.h"
#include "io/atomic_file.h"

namespace dschat {
namespace rlhf {
namespace fs = std::filesystem;

GuardedRun::GuardedRun(const monitor::GuardianConfig& config, const std::string& name, const StepRunner& runner,
                       monitor::MetricsLog* metrics, std::shared_ptr<dist::Communicator> communicator)
    : guardian_(config, name, metrics, !communicator || communicator->rank() == 0),
      name_(name),
      dir_(runner.guardian_dir()),
      communicator_(std::move(communicator)) {}

std::vector<double> GuardedRun::mean_over_ranks(std::vector<double> values) const {
  if (!communicator_ || communicator_->world_size() == 1 || values.empty()) return values;
  torch::Tensor t = torch::tensor(values, torch::kFloat64);  // [n]
  communicator_->all_reduce(t, dist::ReduceOp::Sum);
  t = t / static_cast<double>(communicator_->world_size());
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

monitor::GuardianAction GuardedRun::agree(monitor::GuardianAction local) const {
  if (!communicator_ || communicator_->world_size() == 1) return local;
  torch::Tensor t = torch::full({1}, static_cast<int64_t>(local), torch::kInt64);  // [1]
  communicator_->all_reduce(t, dist::ReduceOp::Max);
  return static_cast<monitor::GuardianAction>(t.item<int64_t>());
}

int64_t GuardedRun::snapshot_step() const {
  for (auto it = snapshots_.rbegin(); it != snapshots_.rend(); ++it) {
    if (it->confirmed) return it->step;
  }
  return -1;
}

bool GuardedRun::snapshot_due(int64_t step) const {
  const monitor::GuardianConfig& c = guardian_.config();
  if (!c.wants_snapshots()) return false;
  return snapshots_.empty() || (step > snapshots_.back().step && step % c.snapshot_interval == 0);
}

void GuardedRun::prune(bool keep_unconfirmed) {
  const int64_t newest_confirmed = snapshot_step();
  const bool rank0 = !communicator_ || communicator_->rank() == 0;
  std::vector<Snapshot> kept;
  for (const Snapshot& s : snapshots_) {
    const bool keep = s.step == newest_confirmed || (keep_unconfirmed && !s.confirmed && s.step > newest_confirmed);
    if (keep) {
      kept.push_back(s);
    } else if (rank0) {
      for (const fs::path& part : {dir_, dir_ / "actor", dir_ / "critic", dir_ / "ema"}) {
        io::remove_directory_tree(part / tag_of(s.step));
      }
    }
  }
  snapshots_ = std::move(kept);
}

void GuardedRun::take_snapshot(int64_t step, const SaveSnapshot& save, bool confirmed) {
  core::HostSync sync("checkpoint");
  const bool rank0 = !communicator_ || communicator_->rank() == 0;
  if (snapshots_.empty() && rank0) io::remove_directory_tree(dir_);  // a previous run's, stale
  if (communicator_) communicator_->barrier();
  save(dir_, tag_of(step));
  snapshots_.push_back(Snapshot{step, guardian_.lr_multiplier(), confirmed || confirmation_lag_ == 0});
  prune(/*keep_unconfirmed=*/true);
  if (communicator_) communicator_->barrier();
  core::log_debug(name_, ": guardian snapshot of step ", step, " in ", dir_.string());
}

void GuardedRun::confirm_healthy(int64_t step) {
  bool changed = false;
  for (Snapshot& s : snapshots_) {
    if (!s.confirmed && s.step + confirmation_lag_ <= step) s.confirmed = changed = true;
  }
  if (!changed) return;
  prune(/*keep_unconfirmed=*/true);
  if (communicator_) communicator_->barrier();
}

bool GuardedRun::roll_back(int64_t from_step, const std::string& cause, const nlohmann::json& skipped,
                           const LoadSnapshot& load, const std::vector<engine::TrainingEngine*>& engines) {
  if (!has_snapshot()) return false;
  const int64_t to_step = snapshot_step();
  if (!guardian_.record_rollback(from_step, to_step, cause, skipped)) return false;
  core::HostSync sync("step setup (models, engines, data)");
  // The unconfirmed snapshots after it belong to the abandoned trajectory.
  prune(/*keep_unconfirmed=*/false);
  if (communicator_) communicator_->barrier();
  const Snapshot& target = snapshots_.back();
  load(dir_, tag_of(target.step));
  const double factor = guardian_.lr_multiplier() / target.lr_multiplier;
  if (factor != 1.0) {
    for (engine::TrainingEngine* e : engines) e->scale_learning_rates(factor);
  }
  return true;
}

void GuardedRun::finish() {
  if (!communicator_ || communicator_->rank() == 0) io::remove_directory_tree(dir_);
  if (communicator_) communicator_->barrier();
  snapshots_.clear();
}

}  // namespace rlhf
}  // namespace dschat
