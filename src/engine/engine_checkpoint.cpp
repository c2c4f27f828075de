// TrainingEngine::save_checkpoint / load_checkpoint: one directory per tag holding
//   state.safetensors   module.<name> (parameters and buffers), master.<name> (fp32 masters of
//                       bf16/fp16 parameters), optim.<key> (moments and step counts), rng.cpu
//   engine.json         counters, LR schedule, loss scaler, optimizer scalars, client state
//   manifest.json       file -> {bytes, sha256}, written last
// and <dir>/latest naming the newest tag.
#include <unistd.h>

#include <fstream>

#include <ATen/CPUGeneratorImpl.h>

#include "data/content_hash.h"
#include "dschat/core/error.h"
#include "dschat/engine/training_engine.h"
#include "dschat/io/state_dict.h"
#include "io/atomic_file.h"

namespace dschat {
namespace engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kCheckpointVersion = 1;
const char* const kFiles[] = {"state.safetensors", "engine.json"};

void write_text(const fs::path& file, const std::string& text) {
  io::AtomicFileWriter out(file);
  out.write(text.data(), text.size());
  out.commit();
}

json read_json(const fs::path& file) {
  std::ifstream in(file);
  DSCHAT_CHECK(in, NotFound, file.string(), ": missing");
  json value = json::parse(in, nullptr, false);
  DSCHAT_CHECK(!value.is_discarded(), FormatError, file.string(), ": malformed JSON");
  return value;
}

json optimizer_scalars(const AdamWStateDict& state) {
  const AdamWOptions& o = state.options;
  return {{"betas", {o.betas[0], o.betas[1]}}, {"eps", o.eps}, {"lr", o.lr}, {"weight_decay", o.weight_decay},
          {"bias_correction", o.bias_correction}, {"adam_w_mode", o.adam_w_mode}, {"group_lrs", state.group_lrs},
          {"group_weight_decays", state.group_weight_decays}, {"group_names", state.group_names}};
}

AdamWStateDict optimizer_state_from(const json& scalars, const io::TensorMap& tensors) {
  AdamWStateDict state;
  state.options.betas = {scalars["betas"][0].get<double>(), scalars["betas"][1].get<double>()};
  state.options.eps = scalars["eps"].get<double>();
  state.options.lr = scalars["lr"].get<double>();
  state.options.weight_decay = scalars["weight_decay"].get<double>();
  state.options.bias_correction = scalars["bias_correction"].get<bool>();
  state.options.adam_w_mode = scalars["adam_w_mode"].get<bool>();
  state.group_lrs = scalars["group_lrs"].get<std::vector<double>>();
  state.group_weight_decays = scalars["group_weight_decays"].get<std::vector<double>>();
  state.group_names = scalars["group_names"].get<std::vector<std::vector<std::string>>>();
  const std::string prefix = "optim.";
  for (const auto& [name, tensor] : tensors) {
    if (name.compare(0, prefix.size(), prefix) == 0) state.tensors[name.substr(prefix.size())] = tensor;
  }
  return state;
}

// Copies `source` into `target` after checking the shape; names the tensor and file otherwise.
void restore(torch::Tensor target, const io::TensorMap& tensors, const std::string& name, const fs::path& file) {
  auto it = tensors.find(name);
  DSCHAT_CHECK(it != tensors.end(), FormatError, file.string(), ": tensor '", name, "' is missing");
  DSCHAT_CHECK(it->second.sizes() == target.sizes(), FormatError, file.string(), ": tensor '", name, "' has shape ",
               it->second.sizes(), ", the model's is ", target.sizes());
  torch::NoGradGuard no_grad;
  target.copy_(it->second);
}

}  // namespace

void TrainingEngine::save_checkpoint(const fs::path& dir, std::string tag, const json& client_state) {
  DSCHAT_CHECK(micro_steps_ % options_.config.gradient_accumulation_steps == 0, InvalidArgument,
               "save_checkpoint: called inside a gradient-accumulation window (micro step ", micro_steps_,
               "); save after step() returned at a boundary");
  if (tag.empty()) tag = "global_step" + std::to_string(global_steps_);
  DSCHAT_CHECK(tag.find('/') == std::string::npos && tag[0] != '.', InvalidArgument, "save_checkpoint: bad tag '",
               tag, "'");
  std::error_code ec;
  fs::create_directories(dir, ec);
  DSCHAT_CHECK(!ec, IoError, dir.string(), ": cannot create (", ec.message(), ")");

  io::TensorMap tensors;
  for (const auto& item : module_->named_parameters()) tensors["module." + item.key()] = item.value().detach().cpu();
  for (const auto& item : module_->named_buffers()) tensors["module." + item.key()] = item.value().detach().cpu();
  for (const auto& t : trainables_) {
    if (t.has_master()) tensors["master." + t.name] = t.master.detach().cpu();
  }
  AdamWStateDict optimizer = optimizer_->state_dict();
  for (const auto& [key, tensor] : optimizer.tensors) tensors["optim." + key] = tensor.cpu();
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    tensors["rng.cpu"] = generator.get_state();  // [5056] uint8: the MT19937 state and normal cache
  }

  json engine = {{"version", kCheckpointVersion},
                 {"global_steps", global_steps_},
                 {"skipped_steps", skipped_steps_},
                 {"micro_steps", micro_steps_},
                 {"world_size", 1},
                 {"zero_stage", options_.config.zero.stage},
                 {"loss_scaler", scaler_.state_dict()},
                 {"lr_scheduler", scheduler_ ? scheduler_->state_dict() : json(nullptr)},
                 {"optimizer", optimizer_scalars(optimizer)},
                 {"client_state", client_state}};

  const fs::path staging = dir / (".tmp-" + tag + "-" + std::to_string(::getpid()));
  io::remove_directory_tree(staging);
  fs::create_directories(staging, ec);
  DSCHAT_CHECK(!ec, IoError, staging.string(), ": cannot create (", ec.message(), ")");
  try {
    io::save_safetensors(staging / "state.safetensors", tensors);
    write_text(staging / "engine.json", engine.dump(1));
    json manifest = {{"tag", tag}, {"files", json::object()}};
    for (const char* name : kFiles) {
      manifest["files"][name] = {{"bytes", fs::file_size(staging / name)},
                                 {"sha256", data::sha256_of_file(staging / name)}};
    }
    write_text(staging / "manifest.json", manifest.dump(1));
    // Swap the finished directory into place; an older copy of the same tag is removed only after.
    const fs::path final_dir = dir / tag, old = dir / (".old-" + tag + "-" + std::to_string(::getpid()));
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(staging, final_dir);
    write_text(dir / "latest", tag);
    io::remove_directory_tree(old);
  } catch (...) {
    io::remove_directory_tree(staging);
    throw;
  }
}

json TrainingEngine::load_checkpoint(const fs::path& dir, const std::string& requested_tag) {
  std::string tag = requested_tag;
  if (tag.empty()) {
    std::ifstream latest(dir / "latest");
    DSCHAT_CHECK(latest && std::getline(latest, tag) && !tag.empty(), NotFound, (dir / "latest").string(),
                 ": no checkpoint (the file naming the latest tag is missing)");
  }
  const fs::path root = dir / tag;
  const json manifest = read_json(root / "manifest.json");
  for (const char* name : kFiles) {
    DSCHAT_CHECK(manifest["files"].contains(name), FormatError, (root / "manifest.json").string(), ": lists no ", name);
    const std::string expected = manifest["files"][name]["sha256"].get<std::string>();
    DSCHAT_CHECK(data::sha256_of_file(root / name) == expected, FormatError, (root / name).string(),
                 ": checksum mismatch (corrupt or modified checkpoint)");
  }
  const json engine = read_json(root / "engine.json");
  DSCHAT_CHECK(engine.value("version", 0) == kCheckpointVersion, FormatError, (root / "engine.json").string(),
               ": checkpoint format version ", engine.value("version", 0), ", this dschat reads ", kCheckpointVersion);
  const fs::path state_file = root / "state.safetensors";
  io::TensorMap tensors = io::load_safetensors(state_file);

  // Validate everything first, so a bad checkpoint leaves the engine untouched.
  for (const auto& item : module_->named_parameters()) {
    auto it = tensors.find("module." + item.key());
    DSCHAT_CHECK(it != tensors.end() && it->second.sizes() == item.value().sizes(), FormatError, state_file.string(),
                 ": tensor 'module.", item.key(), "' is missing or mis-shaped");
  }
  for (const auto& t : trainables_) {
    if (!t.has_master()) continue;
    auto it = tensors.find("master." + t.name);
    DSCHAT_CHECK(it != tensors.end() && it->second.sizes() == t.master.sizes(), FormatError, state_file.string(),
                 ": tensor 'master.", t.name, "' is missing or mis-shaped");
  }
  DSCHAT_CHECK(tensors.count("rng.cpu"), FormatError, state_file.string(), ": tensor 'rng.cpu' is missing");
  // AdamW::load_state_dict validates everything before it changes anything.
  optimizer_->load_state_dict(optimizer_state_from(engine["optimizer"], tensors));

  for (const auto& item : module_->named_parameters()) restore(item.value(), tensors, "module." + item.key(), state_file);
  for (const auto& item : module_->named_buffers()) restore(item.value(), tensors, "module." + item.key(), state_file);
  for (auto& t : trainables_) {
    if (t.has_master()) restore(t.master, tensors, "master." + t.name, state_file);
  }
  scaler_.load_state_dict(engine["loss_scaler"], (root / "engine.json").string() + ": loss_scaler");
  if (scheduler_ && !engine["lr_scheduler"].is_null()) {
    scheduler_->load_state_dict(engine["lr_scheduler"], (root / "engine.json").string() + ": lr_scheduler");
  }
  global_steps_ = engine["global_steps"].get<int64_t>();
  skipped_steps_ = engine["skipped_steps"].get<int64_t>();
  micro_steps_ = engine["micro_steps"].get<int64_t>();
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(tensors.at("rng.cpu").clone());
  }
  zero_grads();
  return engine["client_state"];
}

}  // namespace engine
}  // namespace dschat
