// TrainingEngine::save_checkpoint / load_checkpoint. The layout is described in
// dschat/engine/checkpoint_shards.h: every rank writes the pieces of the parameters it owns, so
// a checkpoint is read back by any world size and stage.
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <optional>

#include "dschat/core/error.h"
#include "dschat/engine/checkpoint_export.h"
#include "dschat/engine/async_checkpoint_writer.h"
#include "dschat/engine/checkpoint_shards.h"
#include "dschat/engine/training_engine.h"
#include "dschat/io/state_dict.h"
#include "dschat/nn/linear.h"
#include "engine/zero_optimizer.h"
#include "engine/checkpoint_testing.h"
#include "engine/checkpoint_write.h"
#include "io/atomic_file.h"

namespace dschat {
namespace engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// "state.<k>.<field>" keys of AdamW's state dict, by the parameter (piece) name at index k.
std::map<std::string, int64_t> optimizer_index_by_name(const AdamWStateDict& state) {
  std::map<std::string, int64_t> index;
  int64_t k = 0;
  for (const auto& names : state.group_names) {
    for (const auto& name : names) index[name] = k++;
  }
  return index;
}

std::string state_key(int64_t k, const char* field) { return "state." + std::to_string(k) + "." + field; }

torch::Tensor cpu_rng_state() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();  // [5056] uint8: the MT19937 state and the normal cache
}

// The host tensors a checkpoint is written from. On a device they are pinned buffers filled by
// asynchronous copies (finish() waits for them); on the host they are the tensors themselves, or
// clones when the write runs in the background while training changes the originals.
class HostSnapshots {
 public:
  explicit HostSnapshots(bool copy) : copy_(copy) {}
  torch::Tensor take(const torch::Tensor& tensor) {
    if (tensor.device().is_cpu()) return copy_ ? tensor.clone() : tensor;
    device_ = tensor.device();
    torch::Tensor host = torch::empty(tensor.sizes(), tensor.options().device(torch::kCPU).pinned_memory(true));
    host.copy_(tensor, /*non_blocking=*/true);
    return host;
  }
  void finish() {
    if (!device_) return;
    c10::impl::VirtualGuardImpl guard(device_->type());
    guard.getStream(*device_).synchronize();  // the copies were queued on the current stream
  }

 private:
  bool copy_;
  std::optional<torch::Device> device_;
};

int64_t free_bytes_for_testing = -1;

// Collective, before anything is written: the checkpoint's bytes (every rank's tensors, summed)
// against the free space of `dir`'s file system, as rank 0 sees it; every rank throws the same
// core::IoError when they do not fit. Creates `dir`.
void check_free_space(const fs::path& dir, const std::string& tag, const io::TensorMap& tensors,
                      dist::Communicator* communicator) {
  double mine = 64 * 1024;  // the JSON files, generously
  for (const auto& [name, tensor] : tensors) mine += static_cast<double>(tensor.nbytes());
  torch::Tensor figures = torch::tensor({mine, 0.0}, torch::kFloat64);  // [2]: needed, free
  if (communicator) communicator->all_reduce(figures, dist::ReduceOp::Sum);
  const bool rank0 = communicator == nullptr || communicator->rank() == 0;
  if (rank0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    DSCHAT_CHECK(!ec, IoError, dir.string(), ": cannot create (", ec.message(), ")");
    const fs::space_info space = fs::space(dir, ec);
    const double available = free_bytes_for_testing >= 0 ? static_cast<double>(free_bytes_for_testing)
                             : ec ? -1.0 : static_cast<double>(space.available);
    figures[1] = available;
  }
  if (communicator) communicator->broadcast(figures, 0);
  const double needed = figures[0].item<double>(), available = figures[1].item<double>();
  DSCHAT_CHECK(available < 0 || needed <= available, IoError, dir.string(), ": not enough free space for checkpoint ",
               tag, ": it needs ", static_cast<int64_t>(needed), " bytes and ", static_cast<int64_t>(available),
               " are free (nothing was written; the previous checkpoints are intact; older tags are deleted only "
               "after a newer one is complete: lower keep_checkpoints or free space)");
}

}  // namespace

namespace testing {
void set_checkpoint_free_bytes(int64_t bytes) { free_bytes_for_testing = bytes; }
}  // namespace testing

void TrainingEngine::save_checkpoint(const fs::path& dir, std::string tag, const json& client_state,
                                     AsyncCheckpointWriter* background) {
  DSCHAT_CHECK(micro_steps_ % options_.config.gradient_accumulation_steps == 0, InvalidArgument,
               "save_checkpoint: called inside a gradient-accumulation window (micro step ", micro_steps_,
               "); save after step() returned at a boundary");
  if (tag.empty()) tag = "global_step" + std::to_string(global_steps_);
  DSCHAT_CHECK(tag.find('/') == std::string::npos && tag[0] != '.', InvalidArgument, "save_checkpoint: bad tag '",
               tag, "'");
  dist::Communicator* communicator = options_.communicator.get();
  // A background write owns copies; a write the caller waits for reads the state in place.
  const bool copy = background != nullptr;
  HostSnapshots host(copy);
  auto snapshot = std::make_shared<CheckpointSnapshot>();
  snapshot->dir = dir;
  snapshot->tag = tag;
  snapshot->rank = rank();
  snapshot->world_size = world_size();
  // This rank's pieces. Stage 0 replicates everything, so rank 0 alone writes its groups.
  io::TensorMap& tensors = snapshot->tensors;
  json& pieces = snapshot->pieces;
  pieces = json::object();
  const AdamWStateDict optimizer = zero_->adamw().state_dict();
  const auto optimizer_index = optimizer_index_by_name(optimizer);
  for (const auto& group : zero_->groups()) {
    const bool writes = group->layout().world_size > 1 || rank() == 0;
    if (!writes || group->trainable()) continue;
    const torch::Tensor values = group->owned_values();  // [owned]
    for (const Piece& piece : pieces_in_range(group->layout(), group->owned_range())) {
      const auto& member = group->members()[piece.slot];
      tensors["frozen." + member.name] = host.take(values.narrow(0, piece.range_offset, piece.numel));
      pieces[member.name] = {{"offset", piece.slot_offset}, {"numel", piece.numel}, {"step", 0}, {"trainable", false}};
    }
  }
  for (const auto& piece : zero_->owned_pieces()) {
    if (piece.group->layout().world_size == 1 && rank() != 0) continue;
    const std::string& name = piece.group->layout().slots[piece.slot].name;
    tensors["master." + name] = host.take(piece.value.detach());
    int64_t step = 0;
    auto k = optimizer_index.find(name);
    if (k != optimizer_index.end() && optimizer.tensors.count(state_key(k->second, "step"))) {
      step = optimizer.tensors.at(state_key(k->second, "step")).item<int64_t>();
      tensors["exp_avg." + name] = host.take(optimizer.tensors.at(state_key(k->second, "exp_avg")));
      tensors["exp_avg_sq." + name] = host.take(optimizer.tensors.at(state_key(k->second, "exp_avg_sq")));
    }
    pieces[name] = {{"offset", piece.param_offset}, {"numel", piece.value.numel()}, {"step", step}, {"trainable", true}};
  }
  // Shapes come from the layout (stage 3 members are released, their tensors are empty).
  for (const auto& group : zero_->groups()) {
    for (size_t i = 0; i < group->members().size(); ++i) {
      const std::string& name = group->members()[i].name;
      if (pieces.contains(name)) pieces[name]["shape"] = group->member_shape(i);
    }
  }
  if (rank() == 0) {
    for (const auto& [name, param] : zero_->ungrouped()) {
      tensors["frozen." + name] = host.take(param.detach().reshape({-1}));
      pieces[name] = {{"offset", 0}, {"numel", param.numel()}, {"shape", param.sizes().vec()}, {"step", 0},
                      {"trainable", false}};
    }
    for (const auto& item : module_->named_buffers()) tensors["buffer." + item.key()] = host.take(item.value().detach());
    snapshot->engine_state = {{"version", kCheckpointVersion},
                              {"global_steps", global_steps_},
                              {"skipped_steps", skipped_steps_},
                              {"micro_steps", micro_steps_},
                              {"world_size", world_size()},
                              {"zero_stage", options_.config.zero.stage},
                              {"loss_scaler", scaler_.state_dict()},
                              {"lr_scheduler", scheduler_ ? scheduler_->state_dict() : json(nullptr)},
                              {"group_lrs", learning_rates()},
                              {"lora_scales", lora_scales(*module_)},
                              {"client_state", client_state}};
  }
  tensors["rng.cpu"] = cpu_rng_state();
  host.finish();  // the device-to-host copies have landed
  check_free_space(dir, tag, tensors, communicator);

  const fs::path staging = checkpoint_staging_dir(dir, tag);  // the same name on every rank
  if (rank() == 0) {
    std::error_code ec;
    io::remove_directory_tree(staging);  // left by a save that died
    fs::create_directories(staging, ec);
    DSCHAT_CHECK(!ec, IoError, staging.string(), ": cannot create (", ec.message(), ")");
  }
  if (communicator) communicator->barrier();
  auto job = [snapshot](const std::atomic<bool>& cancelled) { write_checkpoint(*snapshot, cancelled); };
  if (background) {
    background->submit(std::move(job));
    return;
  }
  AsyncCheckpointWriter writer;
  writer.submit(std::move(job));
  wait_for_checkpoint_writes(writer, communicator);  // nobody returns before the checkpoint is complete
}

json TrainingEngine::load_checkpoint(const fs::path& dir, const std::string& requested_tag) {
  const std::string tag = requested_tag.empty() ? latest_checkpoint_tag(dir) : requested_tag;
  const CheckpointShards shards = CheckpointShards::open(dir / tag);
  const json& engine = shards.engine_state();
  const std::string where = (dir / tag).string();

  // Assemble everything this rank needs into temporaries first, so a bad checkpoint leaves the
  // engine untouched.
  auto check_shape = [&](const std::string& name, const std::vector<int64_t>& shape) {
    auto it = shards.params().find(name);
    DSCHAT_CHECK(it != shards.params().end(), FormatError, where, ": tensor '", name,
                 "' is missing (a checkpoint of a different model?)");
    DSCHAT_CHECK(it->second.shape == shape, FormatError, where, ": tensor '", name, "' has shape ",
                 c10::IntArrayRef(it->second.shape), ", the model's is ", c10::IntArrayRef(shape));
  };
  std::vector<torch::Tensor> owned_values;  // per group: [owned] fp32 masters or model-dtype values
  for (const auto& group : zero_->groups()) {
    for (size_t i = 0; i < group->members().size(); ++i) check_shape(group->members()[i].name, group->member_shape(i));
    torch::Tensor values = group->trainable() ? torch::zeros_like(group->master(), torch::kCPU)
                                              : torch::zeros_like(group->owned_values(), torch::kCPU);
    for (const Piece& piece : pieces_in_range(group->layout(), group->owned_range())) {
      const std::string& name = group->members()[piece.slot].name;
      shards.read(group->trainable() ? "master" : "frozen", name, piece.slot_offset,
                  values.narrow(0, piece.range_offset, piece.numel));
    }
    owned_values.push_back(values);
  }
  std::vector<torch::Tensor> ungrouped_values;
  for (const auto& [name, param] : zero_->ungrouped()) {
    check_shape(name, param.sizes().vec());
    ungrouped_values.push_back(shards.full("frozen", name));
  }
  AdamWStateDict optimizer = zero_->adamw().state_dict();
  optimizer.tensors.clear();
  const auto optimizer_index = optimizer_index_by_name(optimizer);
  for (const auto& piece : zero_->owned_pieces()) {
    const std::string& name = piece.group->layout().slots[piece.slot].name;
    const int64_t step = shards.step(name, piece.param_offset);
    if (step == 0 || !shards.has("exp_avg", name)) continue;
    const int64_t k = optimizer_index.at(name);
    for (const char* field : {"exp_avg", "exp_avg_sq"}) {
      torch::Tensor moment = torch::empty_like(piece.value);  // [numel] on the state device
      shards.read(field, name, piece.param_offset, moment);
      optimizer.tensors[state_key(k, field)] = moment;
    }
    optimizer.tensors[state_key(k, "step")] = torch::tensor(step, torch::kInt64);
  }
  std::map<std::string, torch::Tensor> buffers;
  for (const auto& item : module_->named_buffers()) {
    torch::Tensor saved = shards.rank_tensor(0, "buffer." + item.key());
    DSCHAT_CHECK(saved.defined() && saved.sizes() == item.value().sizes(), FormatError, where, ": buffer '",
                 item.key(), "' is missing or mis-shaped");
    buffers[item.key()] = saved;
  }
  torch::Tensor rng = shards.rank_tensor(rank() < shards.saved_world_size() ? rank() : 0, "rng.cpu");
  DSCHAT_CHECK(rng.defined(), FormatError, where, ": tensor 'rng.cpu' is missing");
  zero_->adamw().load_state_dict(optimizer);  // validates before it changes anything

  // Apply.
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < zero_->groups().size(); ++g) zero_->groups()[g]->load_owned(owned_values[g]);
  for (size_t i = 0; i < zero_->ungrouped().size(); ++i) zero_->ungrouped()[i].second.copy_(ungrouped_values[i]);
  for (const auto& item : module_->named_buffers()) item.value().copy_(buffers.at(item.key()));
  zero_->publish_all();
  scaler_.load_state_dict(engine["loss_scaler"], where + "/engine.json: loss_scaler");
  if (scheduler_ && !engine["lr_scheduler"].is_null()) {
    scheduler_->load_state_dict(engine["lr_scheduler"], where + "/engine.json: lr_scheduler");
  } else if (!scheduler_ && engine.contains("group_lrs")) {  // a constant rate, possibly scaled since
    const std::vector<double> lrs = engine["group_lrs"].get<std::vector<double>>();
    if (lrs.size() == zero_->adamw().group_lrs().size()) {
      for (size_t i = 0; i < lrs.size(); ++i) zero_->adamw().set_group_lr(i, lrs[i]);
    }
  }
  apply_schedule();
  global_steps_ = engine["global_steps"].get<int64_t>();
  skipped_steps_ = engine["skipped_steps"].get<int64_t>();
  // Micro steps restart at this world's boundary: the saved count is in the saver's micro-batches.
  micro_steps_ = global_steps_ * options_.config.gradient_accumulation_steps;
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(rng.clone());
  }
  zero_->zero_gradients();
  return engine["client_state"];
}

}  // namespace engine
}  // namespace dschat
