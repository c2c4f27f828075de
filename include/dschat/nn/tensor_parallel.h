#pragma once
// Tensor parallelism for generation (Megatron layout): each rank of a group of `size()` holds a
// slice of every decoder layer. q/k/v and the MLP input projections are column-parallel (a rank
// owns some output rows: its heads, its slice of the intermediate features); the attention and
// MLP output projections are row-parallel (the matching input columns), so each rank's output is
// a partial sum that all_reduce_sum completes, after which the (full, replicated) bias is added
// once. This interface keeps nn/ and models/ free of dist/; inference/tensor_parallel.h adapts a
// dist::Communicator to it and builds the per-rank shard models.

#include <torch/torch.h>

#include "dschat/nn/linear.h"

namespace dschat {
namespace nn {

class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  /// This rank's index in [0, size()).
  virtual int64_t rank() const = 0;
  virtual int64_t size() const = 0;
  /// In place: every rank ends with the elementwise sum over the group. Called by all ranks in
  /// the same order (a collective); `t` is contiguous.
  virtual void all_reduce_sum(torch::Tensor& t) = 0;
};

/// The row-parallel output projection: x: [..., in / tp] -> x W_shard^T summed over the group,
/// [..., out]. The bias (kept whole on every rank) is added once after the sum, or, with
/// `deferred_bias`, returned there for a fused epilogue (undefined without a bias). Throws
/// core::InvalidArgument when `linear` has unfused LoRA adapters (their delta is not sharded).
torch::Tensor row_parallel_linear(LinearImpl& linear, const torch::Tensor& x, TensorParallelGroup& group,
                                  torch::Tensor* deferred_bias = nullptr);

/// Throws core::InvalidArgument unless a forward with a tensor-parallel group (non-null `group`)
/// runs the inference path (use_inference_ops: a KV cache, no grad, no dropout): the shards'
/// partial sums are reduced only there, so anything else would be silently wrong. `where` names
/// the caller in the message.
void require_tensor_parallel_inference(const TensorParallelGroup* group, bool inference, const char* where);

}  // namespace nn
}  // namespace dschat
