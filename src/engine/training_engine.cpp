#include "dschat/engine/training_engine.h"

#include <cmath>

#include "core/log.h"
#include "dschat/core/error.h"
#include "dschat/core/host_sync.h"
#include "engine/host_transfers.h"
#include "engine/zero3_hooks.h"
#include "engine/zero_optimizer.h"

namespace dschat {
namespace engine {
namespace {

ZeroContext make_context(const torch::nn::Module& module, const DeepSpeedConfig& config,
                         dist::Communicator* communicator, const models::DeferredParameters* deferred) {
  ZeroContext context;
  context.communicator = communicator;
  context.rank = communicator ? communicator->rank() : 0;
  context.world_size = communicator ? communicator->world_size() : 1;
  context.stage = config.zero.stage;
  const auto params = module.parameters();
  if (!params.empty()) context.model_device = params.front().device();
  if (deferred != nullptr) context.model_device = deferred->device;
  const ZeroConfig& zero = config.zero;
  context.offload_optimizer = zero.offload_optimizer.enabled();
  context.state_device = context.offload_optimizer ? torch::Device(torch::kCPU) : context.model_device;
  context.param_store_device =
      zero.stage == 3 && zero.offload_param.enabled() ? torch::Device(torch::kCPU) : context.model_device;
  context.pin_memory = zero.offload_optimizer.pin_memory || zero.offload_param.pin_memory;
  context.quantize_frozen = zero.stage == 3 && zero.zero_quantized_nontrainable_weights;
  // DeepSpeed's bucket sizes count elements.
  context.reduce_bucket_elements = zero.reduce_bucket_size;
  context.allgather_bucket_elements = zero.allgather_bucket_size;
  return context;
}

}  // namespace

struct TrainingEngine::WindowNorm {
  explicit WindowNorm(torch::Tensor norm_squared) : squared(std::move(norm_squared)), read(squared) {}
  /// The step's one device->host read (none when the norm is already on the host: offload, CPU).
  double host_value() {
    core::HostSync sync("optimizer step (gradient norm, overflow)");
    return read.get().item<double>();
  }

  torch::Tensor squared;  // [1] fp64 on the gradients' device, summed over ranks
  HostRead read;          // its copy to the host, queued at once
};

TrainingEngine::TrainingEngine(std::shared_ptr<torch::nn::Module> module, TrainingEngineOptions options)
    : module_(std::move(module)), options_(std::move(options)), scaler_(LossScaler::none()) {
  DSCHAT_CHECK(module_ != nullptr, InvalidArgument, "TrainingEngine: no module");
  const DeepSpeedConfig& config = options_.config;
  const int64_t world = options_.communicator ? options_.communicator->world_size() : 1;
  DSCHAT_CHECK(config.train_batch_size == config.train_micro_batch_size_per_gpu * config.gradient_accumulation_steps * world,
               ConfigError, "TrainingEngine: train_batch_size ", config.train_batch_size,
               " != train_micro_batch_size_per_gpu ", config.train_micro_batch_size_per_gpu,
               " * gradient_accumulation_steps ", config.gradient_accumulation_steps, " * world size ", world,
               " (parse the config for the communicator's world size)");
  bool any_trainable = false;
  for (const auto& param : module_->parameters()) any_trainable = any_trainable || param.requires_grad();
  DSCHAT_CHECK(any_trainable, InvalidArgument, "TrainingEngine: the module has no trainable parameters");
  if (!config.not_acted_on.empty() && rank() == 0) {
    std::string keys;
    for (const auto& key : config.not_acted_on) keys += (keys.empty() ? "" : ", ") + key;
    core::log_warn("DeepSpeed config keys accepted but not acted on by dschat: ", keys);
  }
  if (config.precision == Precision::kFp16) scaler_ = LossScaler::from_fp16_config(config.fp16_block, "fp16");

  const OptimizerConfig& opt = config.optimizer ? *config.optimizer : options_.optimizer;
  const models::DeferredParameters* deferred = options_.deferred.get();
  zero_ = std::make_unique<ZeroOptimizer>(*module_,
                                          make_context(*module_, config, options_.communicator.get(), deferred),
                                          config.zero, opt, options_.lora_learning_rate, deferred);
  options_.deferred.reset();  // the checkpoint's mapping is no longer needed
  if (options_.lr_schedule) {
    LrScheduleOptions schedule = *options_.lr_schedule;
    if (schedule.initial_lr == 0.0) schedule.initial_lr = opt.lr;
    scheduler_.emplace(LrSchedule::create(schedule), zero_->adamw().group_lrs());
    apply_schedule();  // LambdaLR sets lr = base * lambda(0) at construction
  }
}

TrainingEngine::~TrainingEngine() = default;

nn::LayerParameterHooks* TrainingEngine::layer_parameter_hooks() { return zero_->layer_hooks(); }

torch::Tensor TrainingEngine::non_finite_weight_count() const {
  torch::Tensor count;  // []
  for (const ZeroOptimizer::OwnedPiece& piece : zero_->owned_pieces()) {
    torch::Tensor bad = torch::logical_not(torch::isfinite(piece.value)).sum();  // []
    count = count.defined() ? count + bad.to(count.device()) : bad;
  }
  return count.defined() ? count : torch::zeros({}, torch::kInt64);
}

int64_t TrainingEngine::rank() const { return options_.communicator ? options_.communicator->rank() : 0; }
int64_t TrainingEngine::world_size() const {
  return options_.communicator ? options_.communicator->world_size() : 1;
}
std::vector<double> TrainingEngine::learning_rates() const { return zero_->adamw().group_lrs(); }

void TrainingEngine::scale_learning_rates(double factor) {
  DSCHAT_CHECK(factor > 0.0 && std::isfinite(factor), InvalidArgument, "scale_learning_rates: factor ", factor);
  if (scheduler_) {
    scheduler_->scale_base_lrs(factor);
    apply_schedule();
    return;
  }
  AdamW& adamw = zero_->adamw();
  const std::vector<double> lrs = adamw.group_lrs();
  for (size_t i = 0; i < lrs.size(); ++i) adamw.set_group_lr(i, lrs[i] * factor);
}
MemoryFootprint TrainingEngine::memory_footprint() const { return zero_->footprint(); }
std::map<std::string, torch::Tensor> TrainingEngine::consolidated_parameters() {
  return zero_->consolidated_parameters();
}
void TrainingEngine::release_gathered_parameters() { zero_->release_gathered(); }

bool TrainingEngine::is_gradient_accumulation_boundary() const {
  return (micro_steps_ + 1) % options_.config.gradient_accumulation_steps == 0;
}

void TrainingEngine::backward(const torch::Tensor& loss) {
  DSCHAT_CHECK(loss.defined() && loss.numel() == 1, InvalidArgument, "TrainingEngine::backward: expects a scalar loss");
  torch::Tensor scaled = loss.to(torch::kFloat32);  // fp16 losses are scaled in fp32, as DeepSpeed does
  if (options_.config.gradient_accumulation_steps > 1) scaled = scaled / options_.config.gradient_accumulation_steps;
  if (scaler_.scale() != 1.0) scaled = scaled * scaler_.scale();
  zero_->before_backward(is_gradient_accumulation_boundary());
  scaled.backward();
  zero_->after_backward();
}

void TrainingEngine::apply_schedule() {
  if (!scheduler_) return;
  AdamW& adamw = zero_->adamw();
  std::vector<double> lrs = adamw.group_lrs();
  scheduler_->apply(lrs);
  for (size_t i = 0; i < lrs.size(); ++i) adamw.set_group_lr(i, lrs[i]);
}

bool TrainingEngine::step() {
  const bool boundary = is_gradient_accumulation_boundary();
  ++micro_steps_;
  if (!boundary) return false;

  // Global L2 norm of the unscaled gradients (accumulated in double as DeepSpeed does), then one
  // multiply that unscales and clips: g *= min(1, clip / (norm + 1e-6)) / scale. The multiplier
  // is computed where the norm is and queued before the host waits for the norm, so a device
  // works through it meanwhile; a step that turns out to be skipped drops the gradients anyway.
  // DeepSpeed unscales with the scale as update_scale() leaves it, which a step that is not
  // skipped can have doubled: that scale is known before the overflow verdict.
  const double scale = scaler_.scale_after_clean_step();
  WindowNorm& window = reduced_window_norm();  // of the scaled gradients
  const double clip = options_.config.gradient_clipping;
  if (clip > 0 || scale != 1.0) zero_->scale_gradients(unscale_and_clip_factor(window.squared, scale, clip));
  const double norm_squared = window.host_value();
  window_norm_.reset();  // the next window reduces afresh
  const bool non_finite = !std::isfinite(norm_squared);
  bool skip = false;
  if (skip_next_step_ && !non_finite) {
    skip = true;  // the other model of an aligned pair overflowed
  } else if (scaler_.checks_overflow()) {
    skip = scaler_.update(non_finite);  // fp16: overflow lowers the scale and skips the step
  } else if (non_finite) {
    DSCHAT_CHECK(options_.config.on_nonfinite_loss == "skip", Error, "non-finite gradients at global step ",
                 global_steps_, " (", options_.config.precision == Precision::kBf16 ? "bf16" : "fp32",
                 "); set on_nonfinite_loss to \"skip\" to skip such steps");
    core::log_warn("non-finite gradients at global step ", global_steps_, ": step skipped");
    skip = true;
  }
  skip_next_step_ = false;
  if (skip) {
    last_grad_norm_ = -1.0;
    ++skipped_steps_;
    zero_->zero_gradients();
    zero_->release_gathered();
    ++global_steps_;
    return false;
  }

  DSCHAT_CHECK(scaler_.scale() == scale, Error, "loss scale ", scaler_.scale(), " after a clean step, expected ",
               scale);
  const double norm = std::sqrt(norm_squared) / scale;
  last_grad_norm_ = norm;
  zero_->step();
  zero_->zero_gradients();
  if (scheduler_) {
    scheduler_->step();
    apply_schedule();
  }
  ++global_steps_;
  log_step(norm);
  return true;
}

bool TrainingEngine::check_overflow() {
  if (!is_gradient_accumulation_boundary()) return false;
  return !std::isfinite(reduced_window_norm().host_value());
}

TrainingEngine::WindowNorm& TrainingEngine::reduced_window_norm() {
  if (!window_norm_) {
    zero_->reduce_at_boundary();
    window_norm_ = std::make_unique<WindowNorm>(zero_->gradient_norm_squared());
  }
  return *window_norm_;
}

void TrainingEngine::log_step(double grad_norm) const {
  const int64_t every = options_.config.steps_per_print;
  if (every <= 0 || global_steps_ % every != 0 || rank() != 0) return;
  const std::vector<double> lrs = learning_rates();
  core::log_info("step ", global_steps_, ": lr ", lrs.empty() ? 0.0 : lrs.front(), ", grad norm ", grad_norm,
                 scaler_.checks_overflow() ? ", loss scale " + std::to_string(scaler_.scale()) : "");
}

}  // namespace engine
}  // namespace dschat
