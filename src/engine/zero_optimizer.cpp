#include "engine/zero_optimizer.h"

#include <set>
#include <unordered_map>

#include "core/tensor_util.h"
#include "dschat/core/error.h"
#include "dschat/engine/param_groups.h"
#include "dschat/engine/zero_groups.h"
#include "dschat/models/backbone.h"
#include "engine/grad_norm_cpu.h"
#include "dschat/models/load_save.h"
#include "engine/bucket_reducer.h"
#include "engine/zero3_hooks.h"

namespace dschat {
namespace engine {
namespace {

using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;

// Every parameter once (tied weights are registered once but may be reached twice), in
// registration order.
NamedParams unique_parameters(torch::nn::Module& module) {
  NamedParams params;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& item : module.named_parameters()) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) params.emplace_back(item.key(), item.value());
  }
  return params;
}

std::shared_ptr<models::Backbone> find_backbone(torch::nn::Module& module) {
  std::shared_ptr<models::Backbone> found;
  for (const auto& child : module.modules(/*include_self=*/true)) {
    auto backbone = std::dynamic_pointer_cast<models::Backbone>(child);
    if (!backbone) continue;
    DSCHAT_CHECK(!found, Unsupported, "ZeRO stage 3: the model holds more than one decoder backbone");
    found = backbone;
  }
  DSCHAT_CHECK(found, Unsupported, "ZeRO stage 3 needs a model built on a dschat decoder backbone (CausalLM, "
               "ValueHeadModel): it gathers each decoder layer's parameters around the layer");
  return found;
}

// A deferred load's parameters before the groups are built: host ones (LoRA adapters made after
// the load) move to the model device; meta ones that will not be partitioned are materialised
// whole there from their deferred value. `partitioned(numel)`: whether a parameter of that size
// goes into a partitioned group.
template <typename Partitioned>
void place_deferred_parameters(const NamedParams& params, const models::DeferredParameters& deferred,
                               const torch::Device& device, Partitioned partitioned) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, param] : params) {
    torch::Tensor variable = param;  // shares the module's Variable: set_data re-points the module's
    if (variable.is_meta()) {
      if (partitioned(variable.numel())) continue;
      torch::Tensor placed = torch::empty(variable.sizes(), torch::dtype(variable.scalar_type()).device(device));
      placed.copy_(deferred_value(&deferred.values, name));
      core::rebind_parameter_data(variable, placed);
    } else if (variable.device() != device) {
      variable.set_data(variable.to(device));
    }
  }
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(torch::nn::Module& module, const ZeroContext& context, const ZeroConfig& zero,
                             const OptimizerConfig& optimizer, double lora_learning_rate,
                             const models::DeferredParameters* deferred)
    : context_(context) {
  if (deferred != nullptr) {
    const bool stage3 = context_.stage == 3;
    const int64_t threshold = zero.stage3_param_persistence_threshold;
    place_deferred_parameters(unique_parameters(module), *deferred, context_.model_device,
                              [&](int64_t numel) { return stage3 && numel > threshold; });
  }
  if (context_.world_size > 1) {
    // DeepSpeed's _broadcast_model: every rank starts from rank 0's values. A deferred load's
    // partitioned parameters are not materialised: each rank reads its part of the same files.
    torch::NoGradGuard no_grad;
    for (auto& [name, param] : unique_parameters(module)) {
      if (param.is_meta()) continue;
      torch::Tensor values = param.detach();
      context_.communicator->broadcast(values, 0);
    }
    for (auto& item : module.named_buffers()) {
      torch::Tensor values = item.value();
      context_.communicator->broadcast(values, 0);
    }
  }
  build_groups(module, zero, deferred);
  build_optimizer(optimizer, lora_learning_rate);
  // Stage 2 on several ranks always reduces in backward, from bucket staging (no rank holds the
  // full gradient); overlap_comm then only decides whether a bucket's reduction overlaps the next.
  const bool staged = context_.stage == 2 && context_.world_size > 1;
  if ((zero.overlap_comm && context_.stage < 3) || staged) {
    std::vector<FlatParameterGroup*> trainable;
    for (const auto& group : groups_) {
      if (group->trainable()) trainable.push_back(group.get());
    }
    BucketGradientReducer::Options reducer;
    reducer.bucket_elements = context_.reduce_bucket_elements;
    reducer.staged = staged;
    reducer.overlap = zero.overlap_comm;
    reducer_ = std::make_unique<BucketGradientReducer>(std::move(trainable), reducer);
  }
}

ZeroOptimizer::~ZeroOptimizer() {
  reducer_.reset();  // removes the hooks before the groups they point into go
  if (backbone_ && backbone_->layer_parameter_hooks() == hooks_.get()) backbone_->set_layer_parameter_hooks(nullptr);
}

void ZeroOptimizer::build_groups(torch::nn::Module& module, const ZeroConfig& zero,
                                 const models::DeferredParameters* deferred) {
  const NamedParams params = unique_parameters(module);
  const std::map<std::string, torch::Tensor>* deferred_values = deferred ? &deferred->values : nullptr;
  std::vector<std::shared_ptr<torch::nn::Module>> layers;
  std::unordered_map<const c10::TensorImpl*, int64_t> layer_of;
  if (context_.stage == 3) {
    backbone_ = find_backbone(module);
    layers = backbone_->decoder_layers();
    for (size_t i = 0; i < layers.size(); ++i) {
      for (const auto& param : layers[i]->parameters()) layer_of[param.unsafeGetTensorImpl()] = static_cast<int64_t>(i);
    }
  }
  std::vector<ParameterSpec> specs;
  for (const auto& [name, param] : params) {
    auto it = layer_of.find(param.unsafeGetTensorImpl());
    specs.push_back({name, param.numel(), param.scalar_type(), param.requires_grad(),
                     it == layer_of.end() ? -1 : it->second});
  }
  const ZeroGrouping grouping = group_parameters(specs, context_.stage, zero.stage3_param_persistence_threshold);
  for (size_t index : grouping.ungrouped) ungrouped_.push_back(params[index]);
  std::vector<std::vector<FlatParameterGroup*>> layer_groups(layers.size());
  std::vector<FlatParameterGroup*> outer;
  for (const GroupSpec& spec : grouping.groups) {
    std::vector<FlatParameterGroup::Member> members;
    for (size_t index : spec.members) members.push_back({params[index].first, params[index].second});
    groups_.push_back(std::make_unique<FlatParameterGroup>(spec.label, std::move(members), spec.trainable,
                                                           spec.partitioned, context_, deferred_values));
    if (!spec.partitioned) continue;
    const int64_t layer = specs[spec.members.front()].layer;
    (layer < 0 ? outer : layer_groups[layer]).push_back(groups_.back().get());
  }
  if (context_.stage < 3) return;
  hooks_ = std::make_unique<Zero3LayerHooks>(std::move(layer_groups), std::move(outer),
                                             zero.stage3_prefetch_bucket_size, zero.stage3_max_live_parameters);
  backbone_->set_layer_parameter_hooks(hooks_.get());
}

void ZeroOptimizer::build_optimizer(const OptimizerConfig& optimizer, double lora_learning_rate) {
  NamedParams named_pieces;
  std::vector<std::string> trainable_names;  // the whole model's, whatever this rank owns
  for (const auto& group : groups_) {
    if (!group->trainable()) continue;
    for (const auto& slot : group->layout().slots) trainable_names.push_back(slot.name);
    const ElementRange owned = group->owned_range();
    for (const Piece& piece : pieces_in_range(group->layout(), owned)) {
      OwnedPiece owned_piece{group.get(), piece.slot, piece.slot_offset,
                             group->master().narrow(0, piece.range_offset, piece.numel), piece.range_offset};
      owned_piece.value.set_requires_grad(true);  // the grouping takes trainable tensors only
      named_pieces.emplace_back(group->layout().slots[piece.slot].name, owned_piece.value);
      pieces_.push_back(std::move(owned_piece));
    }
  }
  AdamWOptions adam;
  adam.betas = {optimizer.beta1, optimizer.beta2};
  adam.eps = optimizer.eps;
  adam.bias_correction = optimizer.bias_correction;
  adam.adam_w_mode = optimizer.adam_w_mode;
  adamw_ = std::make_unique<AdamW>(
      optimizer_grouped_parameters(named_pieces, optimizer.lr, optimizer.weight_decay, lora_learning_rate,
                                   &trainable_names),
      adam);
}

void ZeroOptimizer::before_backward(bool boundary) {
  if (reducer_ && (context_.stage == 2 || boundary)) reducer_->arm();
}

void ZeroOptimizer::after_backward() {
  if (reducer_ && reducer_->armed()) {
    reducer_->finish();
    if (context_.stage < 2) reduced_in_backward_ = true;
    return;
  }
  // Stage 3's layer groups were reduced by the hooks inside backward; the rest is done here.
  for (const auto& group : groups_) {
    if (context_.stage >= 2) {
      group->reduce_gradients();
    } else {
      group->accumulate_gradients();
    }
  }
}

void ZeroOptimizer::reduce_at_boundary() {
  if (context_.stage >= 2 || reduced_in_backward_) return;
  for (const auto& group : groups_) group->reduce_gradients();
}

torch::Tensor unscale_and_clip_factor(const torch::Tensor& norm_squared, double scale, double clip) {
  if (!norm_squared.device().is_cpu()) return unscale_and_clip_factor_by_tensor_ops(norm_squared, scale, clip);
  // On the host already (a CPU run, an offloaded partition): reading it waits for nothing, and
  // CPU tensor sqrt goes through vectorised math that is not always rounded to nearest.
  const double norm = std::sqrt(norm_squared.item<double>()) / scale;
  double factor = 1.0 / scale;
  if (clip > 0 && norm + 1e-6 > clip) factor *= clip / (norm + 1e-6);
  return torch::scalar_tensor(factor, torch::kFloat64);
}

torch::Tensor unscale_and_clip_factor_by_tensor_ops(const torch::Tensor& norm_squared, double scale, double clip) {
  torch::NoGradGuard no_grad;
  // Constants are filled in on the device (a kernel argument, no copy); tensor-by-tensor
  // arithmetic keeps CUDA from dividing through a rounded reciprocal of a host scalar.
  auto constant = [&](double value) { return torch::full({}, value, norm_squared.options()); };  // []
  const torch::Tensor unscale = constant(1.0 / scale);                                             // []
  if (clip <= 0) return unscale;
  const torch::Tensor shifted = norm_squared.reshape({}).sqrt().div(constant(scale)).add(1e-6);  // [] norm + 1e-6
  const torch::Tensor clipped = unscale.mul(constant(clip).div(shifted));                         // []
  return torch::where(shifted.gt(clip), clipped, unscale);  // a non-finite norm: the step is skipped anyway
}

torch::Tensor ZeroOptimizer::gradient_norm_squared() {
  // One pass, double accumulation, no full-size double copy of the gradients. An inf or NaN
  // anywhere makes the sum non-finite, which is also the overflow test. On the CPU: the fp32 loop
  // of grad_norm_cpu.h (its fixed order: the same bits at any thread count). On a device: chunks
  // of 1M elements cast to double and reduced there (the accumulator stays on the device).
  constexpr int64_t kChunk = int64_t{1} << 20;
  torch::NoGradGuard no_grad;
  for (const auto& group : groups_) group->complete_gradient_copies();
  torch::Tensor squares = torch::zeros({1}, torch::dtype(torch::kFloat64).device(context_.state_device));  // [1]
  for (const auto& group : groups_) {
    const torch::Tensor grads = group->owned_gradients();  // [owned] fp32
    if (!grads.defined()) continue;
    if (grads.is_cpu() && grads.scalar_type() == torch::kFloat32 && grads.is_contiguous()) {
      squares.add_(detail::sum_of_squares(grads.data_ptr<float>(), grads.numel()));
      continue;
    }
    for (const ElementRange& chunk : split_into_chunks(grads.numel(), kChunk)) {
      const torch::Tensor norm = at::linalg_vector_norm(grads.narrow(0, chunk.begin, chunk.size()), 2, c10::nullopt,
                                                        false, torch::kFloat64);  // []
      squares.add_(norm.mul(norm));
    }
  }
  // Stage 0 owns everything; otherwise one collective, on the gradients' device (NCCL for CUDA,
  // Gloo for an offloaded host partition). NaN and inf propagate through the sum.
  if (context_.stage > 0 && context_.world_size > 1) context_.communicator->all_reduce(squares, dist::ReduceOp::Sum);
  return squares;
}

void ZeroOptimizer::scale_gradients(const torch::Tensor& factor) {
  torch::NoGradGuard no_grad;
  for (const auto& group : groups_) {
    torch::Tensor grads = group->owned_gradients();  // [owned] fp32
    if (grads.defined()) grads.mul_(factor);
  }
}

void ZeroOptimizer::bind_piece_gradients(const FlatParameterGroup* only) {
  for (OwnedPiece& piece : pieces_) {
    torch::Tensor grads = only && piece.group != only ? torch::Tensor() : piece.group->owned_gradients();
    piece.value.mutable_grad() =
        grads.defined() ? grads.narrow(0, piece.range_offset, piece.value.numel()) : torch::Tensor();
  }
}

void ZeroOptimizer::step() {
  if (hooks_) hooks_->release_all();
  for (const auto& group : groups_) group->complete_gradient_copies();
  if (!context_.offload_optimizer) {
    bind_piece_gradients();
    adamw_->step();
    for (const auto& group : groups_) group->publish_master();
    return;
  }
  // ZeRO-Offload: the CPU steps one group while the previous group's new values travel to the
  // device (and stages 1-2 all-gather them), as DeepSpeed steps stage 3's sub-groups. A piece's
  // update depends on its own state alone, so this equals one step over all pieces.
  for (const auto& group : groups_) {
    if (!group->trainable()) continue;
    bind_piece_gradients(group.get());
    adamw_->step();
    group->publish_master();
  }
}

void ZeroOptimizer::publish_all() {
  if (hooks_) hooks_->release_all();
  for (const auto& group : groups_) group->publish_master();
}

void ZeroOptimizer::zero_gradients() {
  reduced_in_backward_ = false;
  if (reducer_) reducer_->reset_peak();
  for (OwnedPiece& piece : pieces_) piece.value.mutable_grad() = torch::Tensor();
  for (const auto& group : groups_) group->zero_gradients();
  for (auto& [name, param] : ungrouped_) param.mutable_grad() = torch::Tensor();
}

void ZeroOptimizer::release_gathered() {
  if (hooks_) hooks_->release_all();
}

std::map<std::string, torch::Tensor> ZeroOptimizer::consolidated_parameters() {
  std::map<std::string, torch::Tensor> params;
  torch::NoGradGuard no_grad;
  for (const auto& group : groups_) {
    const bool was_gathered = group->gathered();
    group->gather();
    for (const auto& member : group->members()) params[member.name] = member.param.detach().clone();
    if (!was_gathered) group->release();
  }
  for (const auto& [name, param] : ungrouped_) params[name] = param.detach().clone();
  return params;
}

MemoryFootprint ZeroOptimizer::footprint() const {
  MemoryFootprint total;
  for (const auto& group : groups_) {
    const MemoryFootprint bytes = group->footprint();
    total.parameter_bytes += bytes.parameter_bytes;
    total.gradient_bytes += bytes.gradient_bytes;
    total.optimizer_bytes += bytes.optimizer_bytes;
  }
  for (const auto& [name, param] : ungrouped_) {
    total.parameter_bytes += param.numel() * static_cast<int64_t>(param.element_size());
    if (param.grad().defined()) total.gradient_bytes += param.grad().numel() * static_cast<int64_t>(param.grad().element_size());
  }
  total.optimizer_bytes += adamw_->state_bytes();
  if (reducer_) total.peak_staging_bytes = reducer_->peak_staging_bytes();
  return total;
}

}  // namespace engine
}  // namespace dschat
