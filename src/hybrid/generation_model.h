#pragma once
// The second model a generation may run on (internal to the hybrid engine), when the actor's own
// parameters will not do: a copy in another dtype (fp32 training, bf16 generation) and/or this
// rank's tensor-parallel shard (inference_tp_size > 1). Built once at the first eval(); its
// weights are bound from the actor at every eval() and dropped at every train(), so between
// generations it holds no memory.

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <vector>

#include "dschat/dist/process_group.h"
#include "dschat/inference/tensor_parallel.h"
#include "dschat/models/causal_lm.h"

namespace dschat {
namespace hybrid {

class GenerationModel {
 public:
  /// `tp_size` > 1 needs `communicator` (its ranks are the TP group). `views_allowed`: the actor's
  /// parameters stay resident and in `dtype` while bound (ZeRO 0-2), so a TP shard may alias them.
  GenerationModel(models::CausalLM& actor, torch::ScalarType dtype, std::shared_ptr<dist::Communicator> communicator,
                  int64_t tp_size, bool views_allowed);

  models::CausalLM model() const;
  /// Binds the weights outside the decoder layers from `actor` (they must be resident).
  void bind_replicated(models::CausalLM& actor);
  /// Binds decoder layers [first, first + count) from `actor` (only those need be resident).
  void bind_layers(models::CausalLM& actor, int64_t first, int64_t count);
  /// Drops every bound tensor (each parameter keeps its shape and dtype over one element).
  void release();
  /// Bytes of the bound parameters that are copies (views of the actor count zero).
  int64_t copied_bytes() const;

 private:
  /// Casts the just-bound parameters of `module` to dtype_ where they are not in it yet.
  void cast_bound(torch::nn::Module& module, bool recurse);

  torch::ScalarType dtype_;
  models::CausalLM cast_copy_{nullptr};                          // tp == 1
  mutable std::optional<inference::TensorParallelShard> shard_;  // tp > 1 (its model() is non-const)
  bool views_;
  std::vector<std::vector<int64_t>> shapes_;  // each parameter's shape, in parameters() order
};

}  // namespace hybrid
}  // namespace dschat
