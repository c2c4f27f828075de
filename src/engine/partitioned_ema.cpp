#include "dschat/engine/partitioned_ema.h"

#include "dschat/core/error.h"
#include "dschat/engine/training_engine.h"
#include "engine/flat_group.h"
#include "engine/zero_optimizer.h"

namespace dschat {
namespace engine {

PartitionedEma::PartitionedEma(TrainingEngine& engine, torch::Device device) : engine_(engine), device_(device) {
  torch::NoGradGuard no_grad;
  ZeroOptimizer& zero = *engine_.zero_;
  for (const auto& group : zero.groups()) {
    parts_.push_back(group->owned_values().to(device_, /*non_blocking=*/false, /*copy=*/true));  // [owned]
  }
  for (const auto& [name, param] : zero.ungrouped()) {
    whole_.emplace_back(name, param.detach().to(device_, /*non_blocking=*/false, /*copy=*/true));
  }
}

void PartitionedEma::update(double beta) {
  torch::NoGradGuard no_grad;
  ZeroOptimizer& zero = *engine_.zero_;
  const auto& groups = zero.groups();
  // torch.lerp(theta, ema, beta), DeepSpeed-Chat's moving_average (rlhf::ema_update's arithmetic).
  auto average = [&](torch::Tensor& ema, const torch::Tensor& theta) {
    ema.copy_(torch::lerp(theta.to(ema.device(), ema.scalar_type()), ema, beta));
  };
  // Only the trainable groups move. A frozen value's average stays its initial copy bit for bit
  // (lerp(x, x, beta) is x), so frozen groups and the ungrouped parameters (all frozen) are not
  // read: at ZeRO-3 with LoRA that skips the frozen base, and for an int8 base its dequantization.
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g]->trainable()) average(parts_[g], groups[g]->owned_values());
  }
}

std::map<std::string, torch::Tensor> PartitionedEma::consolidated() {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> full;
  const auto& groups = engine_.zero_->groups();
  const auto& communicator = engine_.communicator();
  for (size_t g = 0; g < groups.size(); ++g) {
    const FlatParameterGroup& group = *groups[g];
    const FlatLayout& layout = group.layout();
    torch::Tensor flat = parts_[g];  // [padded] once gathered
    if (layout.world_size > 1) {
      flat = torch::empty({layout.padded_numel}, parts_[g].options());
      communicator->all_gather_into(flat, parts_[g].contiguous());
    }
    for (size_t i = 0; i < layout.slots.size(); ++i) {
      const FlatSlot& slot = layout.slots[i];
      full[slot.name] = flat.narrow(0, slot.offset, slot.numel).view(group.member_shape(i)).clone();
    }
  }
  for (const auto& [name, value] : whole_) full[name] = value.clone();
  return full;
}

void PartitionedEma::load(const std::map<std::string, torch::Tensor>& full) {
  torch::NoGradGuard no_grad;
  const auto& groups = engine_.zero_->groups();
  auto value_of = [&](const std::string& name, int64_t numel) -> const torch::Tensor& {
    auto it = full.find(name);
    DSCHAT_CHECK(it != full.end() && it->second.numel() == numel, InvalidArgument, "EMA: no value of ", numel,
                 " elements for parameter '", name, "'");
    return it->second;
  };
  for (size_t g = 0; g < groups.size(); ++g) {
    const FlatLayout& layout = groups[g]->layout();
    for (const Piece& piece : pieces_in_range(layout, groups[g]->owned_range())) {
      const FlatSlot& slot = layout.slots[piece.slot];
      const torch::Tensor source = value_of(slot.name, slot.numel).reshape({-1}).narrow(0, piece.slot_offset, piece.numel);
      parts_[g].narrow(0, piece.range_offset, piece.numel).copy_(source);
    }
  }
  for (auto& [name, value] : whole_) value.copy_(value_of(name, value.numel()).view_as(value));
}

int64_t PartitionedEma::bytes() const {
  int64_t total = 0;
  for (const auto& part : parts_) total += part.numel() * static_cast<int64_t>(part.element_size());
  for (const auto& [name, value] : whole_) total += value.numel() * static_cast<int64_t>(value.element_size());
  return total;
}

}  // namespace engine
}  // namespace dschat
