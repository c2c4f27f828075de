#include "hybrid/generation_model.h"

#include "dschat/core/error.h"
#include "hybrid/model_layers.h"

namespace dschat {
namespace hybrid {
namespace {

// param <- source in param's dtype, always a copy (the source may be transient or fp32).
void copy_into(torch::Tensor& param, const torch::Tensor& source) {
  param.set_data(source.to(param.scalar_type(), /*non_blocking=*/false, /*copy=*/true).contiguous());
}

void cast_in_place(torch::Tensor& param, torch::ScalarType dtype) {
  if (param.scalar_type() != dtype) param.set_data(param.to(dtype));
}

}  // namespace

GenerationModel::GenerationModel(models::CausalLM& actor, torch::ScalarType dtype,
                                 std::shared_ptr<dist::Communicator> communicator, int64_t tp_size, bool views_allowed)
    : dtype_(dtype), views_(views_allowed && tp_size > 1) {
  torch::NoGradGuard no_grad;
  const auto device = actor->parameters().front().device();
  if (tp_size == 1) {
    cast_copy_ = models::CausalLM(actor->config());
    cast_copy_->to(device, dtype);
    cast_copy_->eval();
    for (auto& param : cast_copy_->parameters()) param.set_requires_grad(false);
  } else {
    DSCHAT_CHECK(communicator != nullptr && communicator->world_size() == tp_size, InvalidArgument,
                 "hybrid engine: inference_tp_size ", tp_size, " needs a communicator of that many ranks");
    shard_.emplace(actor->config(), inference::make_tensor_parallel_group(communicator),
                   views_ ? inference::ShardStorage::View : inference::ShardStorage::Copy);
    shard_->model()->to(device);
  }
  release();  // nothing is held until the first bind
}

models::CausalLM GenerationModel::model() const { return shard_ ? shard_->model() : cast_copy_; }

void GenerationModel::cast_bound(torch::nn::Module& module, bool recurse) {
  for (auto& param : module.parameters(recurse)) cast_in_place(param, dtype_);
}

void GenerationModel::bind_replicated(models::CausalLM& actor) {
  torch::NoGradGuard no_grad;
  models::CausalLM target = model();
  const auto prefixes = layer_prefixes(target);
  if (shard_) {
    shard_->bind_replicated(actor);
    for (auto& item : target->named_parameters()) {
      if (layer_of(item.key(), prefixes) < 0) cast_in_place(item.value(), dtype_);
    }
    return;
  }
  auto sources = actor->named_parameters();
  for (auto& item : target->named_parameters()) {
    if (layer_of(item.key(), prefixes) >= 0) continue;
    const torch::Tensor* source = sources.find(item.key());
    DSCHAT_CHECK(source != nullptr, Error, "hybrid engine: the generation model's parameter ", item.key(),
                 " has no counterpart in the actor");
    copy_into(item.value(), *source);
  }
}

void GenerationModel::bind_layers(models::CausalLM& actor, int64_t first, int64_t count) {
  torch::NoGradGuard no_grad;
  auto target_layers = model()->backbone().decoder_layers();
  if (shard_) {
    shard_->bind_layers(actor, first, count);
    for (int64_t i = first; i < first + count; ++i) cast_bound(*target_layers[i], /*recurse=*/true);
    return;
  }
  auto actor_layers = actor->backbone().decoder_layers();
  for (int64_t i = first; i < first + count; ++i) {
    auto sources = actor_layers[i]->named_parameters();
    for (auto& item : target_layers[i]->named_parameters()) {
      const torch::Tensor* source = sources.find(item.key());
      DSCHAT_CHECK(source != nullptr, Error, "hybrid engine: layer ", i, "'s parameter ", item.key(),
                   " has no counterpart in the actor");
      copy_into(item.value(), *source);
    }
  }
}

void GenerationModel::release() {
  torch::NoGradGuard no_grad;
  auto params = model()->parameters();
  if (shapes_.empty()) {
    for (const auto& param : params) shapes_.push_back(param.sizes().vec());
  }
  // One element broadcast to the parameter's shape: the binds still see the shape they check,
  // while the memory is gone.
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].set_data(torch::empty({1}, params[i].options().dtype(dtype_)).expand(shapes_[i]));
  }
}

int64_t GenerationModel::copied_bytes() const {
  if (views_) return 0;
  int64_t bytes = 0;
  for (const auto& param : model()->parameters()) {
    if (param.is_contiguous()) bytes += param.numel() * static_cast<int64_t>(param.element_size());
  }
  return bytes;
}

}  // namespace hybrid
}  // namespace dschat
