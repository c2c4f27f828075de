#pragma once
// Tensor-parallel generation (DeepSpeed's inference_tp_size, with the layout DeepSpeed intended,
// docs/inference.md): each rank of a group runs a shard of the causal LM that holds its slice of
// every decoder layer, and the shards' row-parallel outputs are all-reduced (nn/tensor_parallel.h).
// Rank r of tp, for W [out, in]:
//   q, k, v; fc1 (OPT); gate, up (LLaMA)   column-parallel: rows [r * out/tp, (r+1) * out/tp) of W
//                                          and of the bias (k/v by key/value heads; with fewer
//                                          key/value heads than ranks each is replicated on the
//                                          tp / num_kv_heads ranks whose query heads it serves)
//   out_proj / o_proj; fc2 / down_proj     row-parallel: the matching columns of W; bias kept
//                                          whole and added once, after the all-reduce
//   norms, embeddings, positions, LM head  replicated
// The shard's config has the per-rank head and intermediate counts and the full hidden size.
//   auto group = inference::make_tensor_parallel_group(communicator);
//   models::CausalLM shard = inference::make_tensor_parallel_shard(full, group, ShardStorage::View);
//   auto result = inference::generate(shard, ids, mask, config);  // same on every rank
//
// Ownership: with ShardStorage::View the shard's parameters are narrow() views of the full
// model's tensors (no copy): they alias its storage, so an in-place update of the full model (an
// optimizer step, LoRA fuse/unfuse) is visible to the shard, and the full model must outlive it.
// A view aliases the storage the full tensor had when bound: after the full model's parameters
// are re-pointed (set_data, e.g. into ZeRO's flat buffers), bind again.
// With ShardStorage::Copy the shard owns its tensors and each bind copies into them, for full
// tensors that are transient (ZeRO-3 layers gathered a group at a time, then released).

#include <torch/torch.h>

#include <memory>

#include "dschat/core/model_config.h"
#include "dschat/dist/process_group.h"
#include "dschat/models/causal_lm.h"
#include "dschat/nn/tensor_parallel.h"

namespace dschat {
namespace inference {

/// The communicator's ranks are the tensor-parallel group (all_reduce_sum = Communicator::all_reduce).
std::shared_ptr<nn::TensorParallelGroup> make_tensor_parallel_group(std::shared_ptr<dist::Communicator> communicator);

enum class ShardStorage {
  View,  // narrow() views of the full model's tensors
  Copy,  // the shard's own tensors, filled by copying
};

/// One rank's slice: query heads [head_first, head_first + heads), key/value heads
/// [kv_head_first, + kv_heads), intermediate features [ffn_first, + ffn).
struct TensorParallelLayout {
  int64_t tp = 1, rank = 0;
  int64_t head_dim = 0;
  int64_t heads = 0, head_first = 0;
  int64_t kv_heads = 0, kv_head_first = 0;
  int64_t ffn = 0, ffn_first = 0;
};

/// Throws core::InvalidArgument, naming the sizes and tp, unless num_attention_heads % tp == 0,
/// intermediate_size % tp == 0 and either num_key_value_heads % tp == 0 or tp % num_key_value_heads
/// == 0 (then key/value heads are replicated), and 0 <= rank < tp.
TensorParallelLayout tensor_parallel_layout(const core::ModelConfig& config, int64_t tp, int64_t rank);

/// `config` with one rank's head, key/value head and intermediate counts (and dropout off).
core::ModelConfig tensor_parallel_shard_config(const core::ModelConfig& config, int64_t tp);

/// One rank's shard and how to (re)bind its weights from a full model of the same config.
class TensorParallelShard {
 public:
  /// A shard for rank group->rank() of a model with `full_config`, with freshly allocated weights
  /// until bound (in eval mode, requires_grad off, a tensor-parallel backbone). Throws as
  /// tensor_parallel_layout.
  TensorParallelShard(const core::ModelConfig& full_config, std::shared_ptr<nn::TensorParallelGroup> group,
                      ShardStorage storage);

  /// Every weight: bind_replicated, then bind_layers over all layers.
  void bind_all(models::CausalLM& full);
  /// The weights outside the decoder layers (embeddings, positions, final norm, projections, LM
  /// head); reads no layer of `full`.
  void bind_replicated(models::CausalLM& full);
  /// Decoder layers [first, first + count) only; the other layers of `full` need not be resident.
  /// Throws core::InvalidArgument for a range outside the model, a tensor of `full` with 0
  /// elements (not gathered), a shape that does not match the config, or a Linear with unfused
  /// LoRA adapters (fuse them first: the shard holds plain weights).
  void bind_layers(models::CausalLM& full, int64_t first, int64_t count);

  models::CausalLM& model() { return model_; }
  models::CausalLM model() const { return model_; }  // a holder: the same module
  const TensorParallelLayout& layout() const { return layout_; }
  ShardStorage storage() const { return storage_; }

 private:
  void bind_layer(models::CausalLM& full, int64_t layer);
  void bind_tensor(torch::Tensor& shard, const torch::Tensor& full_slice);

  core::ModelConfig full_config_;
  TensorParallelLayout layout_;
  ShardStorage storage_;
  models::CausalLM model_{nullptr};
};

/// A shard of `full` for rank group->rank(), every weight bound (TensorParallelShard::bind_all).
models::CausalLM make_tensor_parallel_shard(models::CausalLM& full, std::shared_ptr<nn::TensorParallelGroup> group,
                                            ShardStorage storage);

}  // namespace inference
}  // namespace dschat
