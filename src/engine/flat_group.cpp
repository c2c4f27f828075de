#include "engine/flat_group.h"

#include "core/tensor_util.h"
#include "dschat/core/device.h"
#include "dschat/core/error.h"

namespace dschat {
namespace engine {
namespace {

int64_t bytes_of(const torch::Tensor& tensor) {
  return tensor.defined() ? tensor.numel() * static_cast<int64_t>(tensor.element_size()) : 0;
}

// A caller's bare torch::kCUDA names the current GPU; the parameters there report cuda:N, and the
// placement check below compares the two.
ZeroContext with_indexed_devices(ZeroContext context) {
  context.model_device = core::indexed_device(context.model_device);
  context.state_device = core::indexed_device(context.state_device);
  context.param_store_device = core::indexed_device(context.param_store_device);
  return context;
}

}  // namespace

const torch::Tensor& deferred_value(const std::map<std::string, torch::Tensor>* values, const std::string& name) {
  DSCHAT_CHECK(values != nullptr, InvalidArgument, "ZeRO: parameter '", name,
               "' is on the meta device but the engine was given no deferred values (a model loaded with "
               "models::LoadOptions::deferred needs TrainingEngineOptions::deferred)");
  auto it = values->find(name);
  DSCHAT_CHECK(it != values->end(), InvalidArgument, "ZeRO: parameter '", name,
               "' is on the meta device and the deferred load has no value for it");
  return it->second;
}

FlatParameterGroup::FlatParameterGroup(std::string label, std::vector<Member> members, bool trainable,
                                       bool partition_params, const ZeroContext& context,
                                       const std::map<std::string, torch::Tensor>* deferred_values)
    : label_(std::move(label)),
      members_(std::move(members)),
      trainable_(trainable),
      partition_params_(partition_params),
      context_(with_indexed_devices(context)) {
  DSCHAT_CHECK(!members_.empty(), InvalidArgument, "ZeRO group '", label_, "' has no parameters");
  dtype_ = members_.front().param.scalar_type();
  std::vector<std::pair<std::string, int64_t>> numels;
  for (const Member& member : members_) {
    const bool placed = member.param.device() == context_.model_device || member.param.is_meta();
    DSCHAT_CHECK(member.param.scalar_type() == dtype_ && placed,
                 InvalidArgument, "ZeRO group '", label_, "': parameter '", member.name, "' is ",
                 member.param.scalar_type(), " on ", member.param.device(), ", the group is ", dtype_, " on ",
                 context_.model_device);
    shapes_.push_back(member.param.sizes().vec());
    numels.emplace_back(member.name, member.param.numel());
  }
  // Stage 0 replicates the optimizer state: a world of one owns the whole buffer on every rank.
  const int64_t owner_world = context_.stage == 0 ? 1 : context_.world_size;
  owner_rank_ = context_.stage == 0 ? 0 : context_.rank;
  layout_ = plan_flat_layout(numels, owner_world);

  torch::NoGradGuard no_grad;
  // A member's value, flattened: the parameter's own, or a deferred load's host tensor.
  auto value_of = [&](size_t i) -> torch::Tensor {  // [numel]
    const Member& member = members_[i];
    if (!member.param.is_meta()) return member.param.detach().reshape({-1});
    return deferred_value(deferred_values, member.name).reshape({-1});
  };
  const ElementRange owned = owned_range();
  if (partition_params_) {
    const bool pin =
        context_.pin_memory && context_.param_store_device.is_cpu() && context_.model_device.is_cuda();
    param_partition_ = torch::zeros({owned.size()},  // [owned]: padding stays zero
                                    torch::dtype(dtype_).device(context_.param_store_device).pinned_memory(pin));
    for (const Piece& piece : pieces_in_range(layout_, owned)) {
      param_partition_.narrow(0, piece.range_offset, piece.numel)
          .copy_(value_of(piece.slot).narrow(0, piece.slot_offset, piece.numel));
    }
    if (!trainable_ && context_.quantize_frozen && c10::isFloatingType(dtype_)) {
      quantized_partition_ = quantize_groupwise(param_partition_);
      param_partition_ = torch::Tensor();
      quantized_ = true;
    }
    bind_deferred_members();
    point_members_at_nothing();
  } else {
    flat_params_ = torch::zeros({layout_.padded_numel}, torch::dtype(dtype_).device(context_.model_device));  // [padded]
    for (size_t i = 0; i < members_.size(); ++i) {
      const FlatSlot& slot = layout_.slots[i];
      flat_params_.narrow(0, slot.offset, slot.numel).copy_(value_of(i));
    }
    bind_deferred_members();
    point_members_at(flat_params_);
  }
  if (trainable_) {
    torch::Tensor source = owned_values();  // [owned]
    if (dtype_ == torch::kFloat32 && source.device() == context_.state_device) {
      master_ = source;  // fp32 models step their own values in place
    } else {
      master_ = new_state_tensor(owned.size());
      master_.copy_(source);
    }
  }
}

torch::Tensor FlatParameterGroup::new_state_tensor(int64_t numel) const {
  const bool pin = context_.pin_memory && context_.state_device.is_cpu() && context_.model_device.is_cuda();
  return torch::zeros({numel}, torch::dtype(torch::kFloat32).device(context_.state_device).pinned_memory(pin));
}

void FlatParameterGroup::bind_deferred_members() {
  torch::Tensor nothing = torch::empty({0}, torch::dtype(dtype_).device(context_.model_device));  // [0]
  for (Member& member : members_) {
    if (member.param.is_meta()) core::rebind_parameter_data(member.param, nothing);
  }
}

void FlatParameterGroup::point_members_at(const torch::Tensor& flat) {
  for (size_t i = 0; i < members_.size(); ++i) {
    const FlatSlot& slot = layout_.slots[i];
    members_[i].param.set_data(flat.narrow(0, slot.offset, slot.numel).view(shapes_[i]));
  }
}

void FlatParameterGroup::point_members_at_nothing() {
  torch::Tensor nothing = torch::empty({0}, torch::dtype(dtype_).device(context_.model_device));  // [0]
  for (Member& member : members_) member.param.set_data(nothing);
}

void FlatParameterGroup::gather() {
  begin_gather();
  finish_gather();
}

void FlatParameterGroup::begin_gather() {
  if (!partition_params_ || gathered() || gather_pending()) return;
  torch::NoGradGuard no_grad;
  const int64_t world = owner_world();
  const int64_t part = layout_.partition_numel();
  pending_flat_ = torch::empty({layout_.padded_numel}, torch::dtype(dtype_).device(context_.model_device));
  if (quantized_) {
    // One all-gather of the int8 partitions and one of their scales; finish_gather dequantizes.
    torch::Tensor values = quantized_partition_.values.to(context_.model_device, /*non_blocking=*/true);  // [groups * G]
    torch::Tensor scales = quantized_partition_.scales.to(context_.model_device, /*non_blocking=*/true);  // [groups]
    if (world == 1) {
      pending_quantized_ = values.unsqueeze(0);
      pending_scales_ = scales.unsqueeze(0);
      return;
    }
    pending_quantized_ = torch::empty({world, values.numel()}, values.options());  // [world, groups * G]
    pending_scales_ = torch::empty({world, scales.numel()}, scales.options());     // [world, groups]
    for (auto [landing, source] : {std::pair{pending_quantized_, values}, std::pair{pending_scales_, scales}}) {
      PendingBucket bucket;
      bucket.source = source;  // kept alive until the collective completes; no landing: nothing to copy
      bucket.work.emplace(context_.communicator->start_all_gather_into(landing, source));
      pending_buckets_.push_back(std::move(bucket));
    }
    return;
  }
  pending_source_ = param_partition_.to(context_.model_device, /*non_blocking=*/true);
  if (world == 1) {
    pending_flat_.copy_(pending_source_);
    return;
  }
  for (const ElementRange& columns : partition_column_buckets(layout_, context_.allgather_bucket_elements)) {
    PendingBucket bucket;
    bucket.columns = columns;
    if (columns.size() == part) {
      bucket.work.emplace(context_.communicator->start_all_gather_into(pending_flat_, pending_source_));
    } else {
      bucket.landing = torch::empty({world, columns.size()}, pending_flat_.options());
      bucket.source = pending_source_.narrow(0, columns.begin, columns.size()).contiguous();
      bucket.work.emplace(context_.communicator->start_all_gather_into(bucket.landing, bucket.source));
    }
    pending_buckets_.push_back(std::move(bucket));
  }
}

void FlatParameterGroup::finish_gather() {
  if (!gather_pending()) return;
  torch::NoGradGuard no_grad;
  const int64_t part = layout_.partition_numel();
  torch::Tensor rows = pending_flat_.view({owner_world(), part});  // [world, part]: row r is rank r's partition
  for (PendingBucket& bucket : pending_buckets_) {
    bucket.work->wait();
    if (bucket.landing.defined()) rows.narrow(1, bucket.columns.begin, bucket.columns.size()).copy_(bucket.landing);
  }
  pending_buckets_.clear();
  if (quantized_) {
    rows.copy_(dequantize_rows(pending_quantized_, pending_scales_, part, dtype_));
    pending_quantized_ = pending_scales_ = torch::Tensor();
  }
  pending_source_ = torch::Tensor();
  flat_params_ = std::move(pending_flat_);
  pending_flat_ = torch::Tensor();
  point_members_at(flat_params_);
}

void FlatParameterGroup::release() {
  finish_gather();
  if (!partition_params_ || !gathered()) return;
  point_members_at_nothing();
  flat_params_ = torch::Tensor();
}

torch::Tensor FlatParameterGroup::owned_values() const {
  if (quantized_) return dequantize_groupwise(quantized_partition_, owned_range().size(), dtype_);
  if (partition_params_) return param_partition_;
  const ElementRange owned = owned_range();
  return flat_params_.narrow(0, owned.begin, owned.size());
}

void FlatParameterGroup::publish_master() {
  if (!trainable_) return;
  torch::NoGradGuard no_grad;
  DSCHAT_CHECK(!partition_params_ || !gathered(), Error, "ZeRO group '", label_,
               "': parameters must be released before the optimizer step");
  torch::Tensor values = owned_values();  // [owned]
  // ZeRO-Offload on CUDA: queued without blocking; the all-gather below and the next forward
  // run behind it on the same stream.
  if (!master_.is_alias_of(values)) copy_to_device(values, master_);
  if (partition_params_ || owner_world() == 1) return;
  // Replicated groups of stages 1-2: every rank fetches the others' updated partitions.
  const int64_t world = owner_world();
  const int64_t part = layout_.partition_numel();
  torch::Tensor rows = flat_params_.view({world, part});  // [world, part]
  for (const ElementRange& columns : partition_column_buckets(layout_, context_.allgather_bucket_elements)) {
    torch::Tensor mine = values.narrow(0, columns.begin, columns.size()).clone();    // [columns]
    torch::Tensor gathered = torch::empty({world, columns.size()}, flat_params_.options());  // [world, columns]
    context_.communicator->all_gather_into(gathered, mine);
    rows.narrow(1, columns.begin, columns.size()).copy_(gathered);
  }
}

void FlatParameterGroup::load_owned(const torch::Tensor& values) {
  torch::NoGradGuard no_grad;
  if (trainable_) {
    master_.copy_(values);
  } else if (quantized_) {
    quantized_partition_ = quantize_groupwise(values.to(context_.param_store_device, dtype_));
  } else {
    owned_values().copy_(values);
  }
}

MemoryFootprint FlatParameterGroup::footprint() const {
  MemoryFootprint bytes;
  bytes.parameter_bytes = bytes_of(flat_params_) + bytes_of(pending_flat_) + bytes_of(param_partition_) +
                         quantized_partition_.bytes() + bytes_of(pending_quantized_) + bytes_of(pending_scales_);
  bytes.gradient_bytes = bytes_of(flat_grad_) + bytes_of(grad_partition_) + host_gradients_.staged_bytes();
  for (const PendingReduction& pending : pending_reductions_) bytes.gradient_bytes += bytes_of(pending.staged);
  for (const Member& member : members_) bytes.gradient_bytes += bytes_of(member.param.grad());
  if (master_.defined() && !master_.is_alias_of(owned_values())) bytes.optimizer_bytes = bytes_of(master_);
  return bytes;
}

}  // namespace engine
}  // namespace dschat
