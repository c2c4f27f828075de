#pragma once
// An exponential moving average of a ZeRO-3 TrainingEngine's parameters, partitioned the way the
// engine partitions them (DeepSpeed-Chat's EMA actor is a ZeRO-3 model of its own): for every flat
// parameter group, this rank's owned range in the model dtype; nothing full-size is ever held
// between calls, and an update gathers nothing.
//
//   engine::PartitionedEma ema(actor_engine, torch::kCPU);  // starts at the engine's values
//   ema.load(full_state_dict);                               // or at these (this rank's ranges)
//   ema.update(0.992);                                       // after each actor step, local
//   auto full = ema.consolidated();                          // collective: every parameter by name
//
// update() is, element for element, the replicated EMA's torch.lerp(actor, ema, beta)
// (DeepSpeed-Chat's moving_average, rlhf::ema_update) over the gathered parameters, so the
// consolidated result is that EMA's bit for bit.

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

namespace dschat {
namespace engine {

class TrainingEngine;

class PartitionedEma {
 public:
  /// Copies the engine's owned parameter ranges (and any parameter outside its groups, whole) to
  /// `device` (the host to offload them). The engine must outlive this object.
  PartitionedEma(TrainingEngine& engine, torch::Device device);

  /// ema <- torch.lerp(actor, ema, beta), range by range, for the trainable groups; frozen
  /// parameters keep their copy, which is what the lerp gives them. No collective.
  void update(double beta);
  /// Collective (every rank calls it): every parameter's full value by name, on `device`.
  std::map<std::string, torch::Tensor> consolidated();
  /// Takes this rank's ranges of `full` (every parameter by name; core::InvalidArgument names a
  /// missing or misshapen one).
  void load(const std::map<std::string, torch::Tensor>& full);
  /// Bytes of this rank's EMA state.
  int64_t bytes() const;

 private:
  TrainingEngine& engine_;
  torch::Device device_;
  std::vector<torch::Tensor> parts_;                          // per flat group: [owned] model dtype
  std::vector<std::pair<std::string, torch::Tensor>> whole_;  // parameters outside the groups
};

}  // namespace engine
}  // namespace dschat
