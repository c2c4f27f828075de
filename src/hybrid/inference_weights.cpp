#include "hybrid/inference_weights.h"

#include <algorithm>
#include <chrono>

#include "core/stopwatch.h"
#include "core/log.h"
#include "dschat/core/error.h"
#include "dschat/nn/lora.h"
#include "hybrid/model_layers.h"

#ifdef DSCHAT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace dschat {
namespace hybrid {
namespace {

using Clock = core::SteadyClock;
using core::seconds_since;

// LoRA adapters outside the decoder layers (e.g. on lm_head) cannot be fused layer by layer.
void require_lora_only_in_layers(models::CausalLM& actor, const char* why) {
  const auto prefixes = layer_prefixes(actor);
  for (const auto& item : actor->named_parameters()) {
    DSCHAT_CHECK(!nn::is_lora_parameter(item.key()) || layer_of(item.key(), prefixes) >= 0, Unsupported,
                 "hybrid engine: LoRA parameter ", item.key(), " lies outside the decoder layers, which ", why,
                 " can only fuse layer by layer; use pin_parameters=true or restrict lora_module_name to the layers");
  }
}

// ZeRO-3 without pin_parameters, borrowing: each layer is gathered on every forward, so its
// adapters are fused right after the gather and unfused right before the release.
class LoraFusingHooks : public nn::LayerParameterHooks {
 public:
  LoraFusingHooks(nn::LayerParameterHooks* inner, std::vector<std::shared_ptr<torch::nn::Module>> layers)
      : inner_(inner), layers_(std::move(layers)) {}
  void begin_forward() override { inner_->begin_forward(); }
  void acquire_layer(int64_t layer) override {
    inner_->acquire_layer(layer);
    // The exact weights are kept on their own device: this runs once per layer per step.
    nn::fuse_lora(*layers_[layer], device_of(*layers_[layer]));
  }
  void release_layer(int64_t layer) override {
    nn::unfuse_lora(*layers_[layer]);
    inner_->release_layer(layer);
  }
  void layer_gradients_ready(int64_t layer) override { inner_->layer_gradients_ready(layer); }

 private:
  static torch::Device device_of(const torch::nn::Module& module) {
    const auto params = module.parameters();
    return params.empty() ? torch::Device(torch::kCPU) : params.front().device();
  }
  nn::LayerParameterHooks* inner_;
  std::vector<std::shared_ptr<torch::nn::Module>> layers_;
};

// Bytes the device can still give: the driver's free memory plus what the caching allocator holds
// unused. -1 without CUDA.
int64_t free_device_bytes(const torch::Device& device) {
#ifdef DSCHAT_WITH_CUDA
  if (!device.is_cuda()) return -1;
  c10::cuda::CUDAGuard guard(device);
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  return static_cast<int64_t>(free) + stats.reserved_bytes[0].current - stats.allocated_bytes[0].current;
#else
  (void)device;
  return -1;
#endif
}

}  // namespace

const char* lora_fuse_backup_name(LoraFuseBackup backup) {
  switch (backup) {
    case LoraFuseBackup::kAuto: return "auto";
    case LoraFuseBackup::kDevice: return "device";
    case LoraFuseBackup::kHost: return "host";
  }
  return "auto";
}

std::optional<LoraFuseBackup> lora_fuse_backup_named(const std::string& name) {
  for (LoraFuseBackup b : {LoraFuseBackup::kAuto, LoraFuseBackup::kDevice, LoraFuseBackup::kHost}) {
    if (name == lora_fuse_backup_name(b)) return b;
  }
  return std::nullopt;
}

torch::Device lora_backup_device(models::CausalLM& actor, LoraFuseBackup choice) {
  const auto params = actor->parameters();
  const torch::Device device = params.empty() ? torch::Device(torch::kCPU) : params.front().device();
  if (choice == LoraFuseBackup::kHost) return torch::kCPU;
  if (choice == LoraFuseBackup::kDevice || device.is_cpu()) return device;
  int64_t backup_bytes = 0;  // the weights of the Linear layers that carry adapters
  const auto named = actor->named_parameters();
  for (const auto& item : named) {
    const std::string& name = item.key();
    const size_t suffix = name.rfind(".lora_left_weight");
    if (suffix == std::string::npos || suffix + 17 != name.size()) continue;
    const torch::Tensor* weight = named.find(name.substr(0, suffix) + ".weight");
    if (weight != nullptr) backup_bytes += weight->numel() * weight->element_size();
  }
  const int64_t free = free_device_bytes(device);
  const bool fits = free >= 2 * backup_bytes;
  core::log_debug("hybrid engine: LoRA backups of ", backup_bytes, " bytes kept on ", fits ? "the device" : "the host",
                  " (", free, " bytes free)");
  return fits ? device : torch::Device(torch::kCPU);
}

InferenceWeights::InferenceWeights(models::CausalLM actor, nn::LayerParameterHooks* zero3_hooks,
                                   const InferenceWeightsOptions& options)
    : actor_(std::move(actor)), hooks_(zero3_hooks), options_(options) {
  borrow();
}

InferenceWeights::InferenceWeights(models::CausalLM actor, nn::LayerParameterHooks* zero3_hooks,
                                   const InferenceWeightsOptions& options, GenerationModel& target)
    : actor_(std::move(actor)), target_(&target), hooks_(zero3_hooks), options_(options), borrowed_(false) {
  DSCHAT_CHECK(options_.layers_per_gather >= 1, ConfigError,
               "hybrid_engine.tp_gather_partition_size must be >= 1, got ", options_.layers_per_gather);
  fill();
}

InferenceWeights::~InferenceWeights() {
  try {
    restore();
  } catch (const std::exception& error) {
    core::log_error("hybrid engine: restoring the training weights failed: ", error.what());
  }
}

void InferenceWeights::borrow() {
  torch::NoGradGuard no_grad;
  const auto start = Clock::now();
  models::Backbone& backbone = actor_->backbone();
  const bool has_lora = nn::count_lora_layers(*actor_) > 0;
  if (hooks_ != nullptr && options_.pin_parameters) {
    // DeepSpeed's pinned path: the whole model stays gathered for every generate() until train().
    hooks_->begin_forward();
    for (size_t i = 0; i < backbone.decoder_layers().size(); ++i) hooks_->acquire_layer(static_cast<int64_t>(i));
    layers_gathered_ = true;
    backbone.set_layer_parameter_hooks(nullptr);
    hooks_detached_ = true;
  } else if (hooks_ != nullptr && has_lora) {
    require_lora_only_in_layers(actor_, "ZeRO-3 without pin_parameters");
    lora_hooks_ = std::make_unique<LoraFusingHooks>(hooks_, backbone.decoder_layers());
    backbone.set_layer_parameter_hooks(lora_hooks_.get());
  }
  if (has_lora && lora_hooks_ == nullptr) {
    nn::fuse_lora(*actor_, lora_backup_device(actor_, options_.lora_fuse_backup));
    actor_fused_ = true;
  }
  gather_seconds_ = seconds_since(start);
}

void InferenceWeights::fill() {
  torch::NoGradGuard no_grad;
  const auto start = Clock::now();
  const auto actor_layers = actor_->backbone().decoder_layers();
  const bool has_lora = nn::count_lora_layers(*actor_) > 0;
  // The target copies from the fused weights. Under ZeRO-3 each gathered layer is fused, copied
  // and unfused; otherwise the whole actor is fused once, and stays so while the target may hold
  // views of it (unfused at restore()).
  if (hooks_ != nullptr) {
    if (has_lora) require_lora_only_in_layers(actor_, "a ZeRO-3 fill");
    hooks_->begin_forward();  // the parameters outside the layers, kept until the next step
  }
  const torch::Device backup = has_lora ? lora_backup_device(actor_, options_.lora_fuse_backup) : torch::kCPU;
  if (hooks_ == nullptr && has_lora) {
    nn::fuse_lora(*actor_, backup);
    actor_fused_ = true;
  }
  target_->bind_replicated(actor_);
  const int64_t layers = static_cast<int64_t>(actor_layers.size());
  const int64_t group = hooks_ == nullptr || options_.pin_parameters ? layers : options_.layers_per_gather;
  for (int64_t first = 0; first < layers; first += group) {
    const int64_t count = std::min(group, layers - first);
    for (int64_t i = first; i < first + count && hooks_ != nullptr; ++i) hooks_->acquire_layer(i);
    for (int64_t i = first; i < first + count && hooks_ != nullptr && has_lora; ++i) {
      nn::fuse_lora(*actor_layers[i], backup);
    }
    target_->bind_layers(actor_, first, count);
    for (int64_t i = first; i < first + count && hooks_ != nullptr && has_lora; ++i) nn::unfuse_lora(*actor_layers[i]);
    for (int64_t i = first; i < first + count && hooks_ != nullptr; ++i) hooks_->release_layer(i);
  }
  if (actor_fused_ && target_->copied_bytes() > 0) {
    nn::unfuse_lora(*actor_);  // nothing aliases the fused weights
    actor_fused_ = false;
  }
  gather_seconds_ = seconds_since(start);
}

void InferenceWeights::restore() {
  if (restored_) return;
  restored_ = true;
  torch::NoGradGuard no_grad;
  models::Backbone& backbone = actor_->backbone();
  if (actor_fused_) nn::unfuse_lora(*actor_);
  actor_fused_ = false;
  if (lora_hooks_ != nullptr || hooks_detached_) backbone.set_layer_parameter_hooks(hooks_);
  hooks_detached_ = false;
  if (layers_gathered_) {
    for (size_t i = 0; i < backbone.decoder_layers().size(); ++i) hooks_->release_layer(static_cast<int64_t>(i));
  }
  layers_gathered_ = false;
  lora_hooks_.reset();
  if (target_ != nullptr) target_->release();
}

}  // namespace hybrid
}  // namespace dschat
