#include "dschat/engine/training_engine.h"

#include <cmath>

#include "core/log.h"
#include "dschat/core/error.h"

namespace dschat {
namespace engine {
namespace {

bool needs_master(const torch::Tensor& param) { return param.scalar_type() != torch::kFloat32; }

}  // namespace

TrainingEngine::TrainingEngine(std::shared_ptr<torch::nn::Module> module, TrainingEngineOptions options)
    : module_(std::move(module)), options_(std::move(options)), scaler_(LossScaler::none()) {
  DSCHAT_CHECK(module_ != nullptr, InvalidArgument, "TrainingEngine: no module");
  const DeepSpeedConfig& config = options_.config;
  DSCHAT_CHECK(config.zero.stage == 0, Unsupported, "TrainingEngine: ZeRO stage ", config.zero.stage,
               " is not implemented yet (stage 0 only)");
  DSCHAT_CHECK(config.train_batch_size == config.train_micro_batch_size_per_gpu * config.gradient_accumulation_steps,
               Unsupported, "TrainingEngine: data parallelism (world size > 1) is not implemented yet");
  if (!config.not_acted_on.empty()) {
    std::string keys;
    for (const auto& key : config.not_acted_on) keys += (keys.empty() ? "" : ", ") + key;
    core::log_warn("DeepSpeed config keys accepted but not acted on by dschat: ", keys);
  }
  if (config.precision == Precision::kFp16) scaler_ = LossScaler::from_fp16_config(config.fp16_block, "fp16");

  // Trainable parameters, with fp32 masters for reduced-precision ones; the optimizer groups are
  // built over the masters under the module's parameter names (DeepSpeed-Chat's grouping rules).
  std::vector<std::pair<std::string, torch::Tensor>> named_masters;
  for (const auto& item : module_->named_parameters()) {
    const torch::Tensor& param = item.value();
    if (!param.requires_grad()) continue;
    torch::Tensor master = param;
    if (needs_master(param)) {
      torch::NoGradGuard no_grad;
      master = param.detach().to(torch::kFloat32).clone().set_requires_grad(true);  // same shape as param
    }
    trainables_.push_back({item.key(), param, master});
    named_masters.emplace_back(item.key(), master);
  }
  DSCHAT_CHECK(!trainables_.empty(), InvalidArgument, "TrainingEngine: the module has no trainable parameters");
  const OptimizerConfig& opt = config.optimizer ? *config.optimizer : options_.optimizer;
  AdamWOptions adam;
  adam.betas = {opt.beta1, opt.beta2};
  adam.eps = opt.eps;
  adam.bias_correction = opt.bias_correction;
  adam.adam_w_mode = opt.adam_w_mode;
  optimizer_ = std::make_unique<AdamW>(
      optimizer_grouped_parameters(named_masters, opt.lr, opt.weight_decay, options_.lora_learning_rate), adam);
  if (options_.lr_schedule) {
    LrScheduleOptions schedule = *options_.lr_schedule;
    if (schedule.initial_lr == 0.0) schedule.initial_lr = opt.lr;
    scheduler_.emplace(LrSchedule::create(schedule), optimizer_->group_lrs());
    apply_schedule();  // LambdaLR sets lr = base * lambda(0) at construction
  }
}

int64_t TrainingEngine::optimizer_state_bytes() const {
  int64_t bytes = optimizer_->state_bytes();
  for (const auto& t : trainables_) {
    if (needs_master(t.param)) bytes += t.master.numel() * static_cast<int64_t>(t.master.element_size());
  }
  return bytes;
}

bool TrainingEngine::is_gradient_accumulation_boundary() const {
  return (micro_steps_ + 1) % options_.config.gradient_accumulation_steps == 0;
}

void TrainingEngine::backward(const torch::Tensor& loss) {
  DSCHAT_CHECK(loss.defined() && loss.numel() == 1, InvalidArgument, "TrainingEngine::backward: expects a scalar loss");
  torch::Tensor scaled = loss.to(torch::kFloat32);  // fp16 losses are scaled in fp32, as DeepSpeed does
  if (options_.config.gradient_accumulation_steps > 1) scaled = scaled / options_.config.gradient_accumulation_steps;
  if (scaler_.scale() != 1.0) scaled = scaled * scaler_.scale();
  scaled.backward();
  move_grads_to_masters();
}

void TrainingEngine::move_grads_to_masters() {
  // fp32 accumulation for reduced-precision models: each micro-step's grad is added to the
  // master's grad and dropped from the model.
  torch::NoGradGuard no_grad;
  for (auto& t : trainables_) {
    if (!needs_master(t.param) || !t.param.grad().defined()) continue;
    torch::Tensor grad = t.param.grad().to(torch::kFloat32);  // same shape as param
    if (t.master.grad().defined()) {
      t.master.mutable_grad().add_(grad);
    } else {
      t.master.mutable_grad() = grad;
    }
    t.param.mutable_grad() = torch::Tensor();
  }
}

std::vector<torch::Tensor> TrainingEngine::master_grads() const {
  std::vector<torch::Tensor> grads;
  for (const auto& t : trainables_) {
    if (t.master.grad().defined()) grads.push_back(t.master.grad());
  }
  return grads;
}

void TrainingEngine::zero_grads() {
  for (auto& t : trainables_) {
    t.param.mutable_grad() = torch::Tensor();
    t.master.mutable_grad() = torch::Tensor();
  }
}

void TrainingEngine::apply_schedule() {
  if (!scheduler_) return;
  std::vector<double> lrs = optimizer_->group_lrs();
  scheduler_->apply(lrs);
  for (size_t i = 0; i < lrs.size(); ++i) optimizer_->set_group_lr(i, lrs[i]);
}

bool TrainingEngine::step() {
  const bool boundary = is_gradient_accumulation_boundary();
  ++micro_steps_;
  if (!boundary) return false;

  const std::vector<torch::Tensor> grads = master_grads();
  const bool non_finite = has_inf_or_nan(grads);
  bool skip = false;
  if (scaler_.checks_overflow()) {
    skip = scaler_.update(non_finite);  // fp16: overflow lowers the scale and skips the step
  } else if (non_finite) {
    DSCHAT_CHECK(options_.config.on_nonfinite_loss == "skip", Error, "non-finite gradients at global step ",
                 global_steps_, " (", options_.config.precision == Precision::kBf16 ? "bf16" : "fp32",
                 "); set on_nonfinite_loss to \"skip\" to skip such steps");
    core::log_warn("non-finite gradients at global step ", global_steps_, ": step skipped");
    skip = true;
  }
  if (skip) {
    last_grad_norm_ = -1.0;
    ++skipped_steps_;
    zero_grads();
    ++global_steps_;
    return false;
  }

  // Global L2 norm of the unscaled gradients (accumulated in double as DeepSpeed does), then one
  // multiply that unscales and clips: g *= min(1, clip / (norm + 1e-6)) / scale.
  double squares = 0.0;
  for (const auto& g : grads) squares += g.to(torch::kFloat64).pow(2).sum().item<double>();
  const double norm = std::sqrt(squares) / scaler_.scale();
  last_grad_norm_ = norm;
  double factor = 1.0 / scaler_.scale();
  const double clip = options_.config.gradient_clipping;
  if (clip > 0 && norm + 1e-6 > clip) factor *= clip / (norm + 1e-6);
  if (factor != 1.0) {
    torch::NoGradGuard no_grad;
    for (const auto& g : grads) g.mul_(factor);
  }

  optimizer_->step();
  {
    torch::NoGradGuard no_grad;
    for (auto& t : trainables_) {
      if (needs_master(t.param)) t.param.copy_(t.master);  // round the fp32 master into the model
    }
  }
  zero_grads();
  if (scheduler_) {
    scheduler_->step();
    apply_schedule();
  }
  ++global_steps_;
  if (options_.config.steps_per_print > 0 && global_steps_ % options_.config.steps_per_print == 0) {
    core::log_info_rank0("step ", global_steps_, ": lr ", optimizer_->group_lrs().front(), ", grad norm ", norm,
                         scaler_.checks_overflow() ? ", loss scale " + std::to_string(scaler_.scale()) : "");
  }
  return true;
}

}  // namespace engine
}  // namespace dschat
