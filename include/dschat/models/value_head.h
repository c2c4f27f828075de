#pragma once
// Reward / critic model: backbone + v_head = Linear(output_dim, 1, bias=false), with
// DeepSpeed-Chat's checkpoint layout ("rwtransformer.<backbone names>", "v_head.weight") so
// checkpoints move between the two systems. output_dim is word_embed_proj_dim for OPT (512 for
// opt-350m) and hidden_size otherwise.

#include <torch/torch.h>

#include "dschat/models/backbone.h"
#include "dschat/models/weights.h"
#include "dschat/nn/linear.h"

namespace dschat {
namespace models {

class ValueHeadModelImpl : public torch::nn::Module {
 public:
  explicit ValueHeadModelImpl(const core::ModelConfig& config);

  /// input_ids: [B, T]; attention_mask: [B, T] or undefined -> per-token values [B, T] (fp32
  /// accumulation is the caller's choice; values come in the model dtype). `layout`: as
  /// CausalLM::forward (with kRightPadded the values at padded positions are unspecified).
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                        nn::MaskLayout layout = nn::MaskLayout::kUnknown);

  /// Binds a DeepSpeed-Chat reward checkpoint ("rwtransformer.*" + "v_head.weight"). With
  /// `allow_missing_head`, a plain causal-LM checkpoint ("model.*", lm_head ignored) initialises
  /// the backbone and v_head keeps its fresh initialisation (how step 2 starts from the SFT model).
  /// `deferred`: see WeightBinding::deferred.
  void load_weights(const NamedTensors& weights, const std::string& source, bool allow_missing_head = false,
                    NamedTensors* deferred = nullptr);
  /// The DeepSpeed-Chat layout: rwtransformer.* and v_head.weight.
  NamedTensors state_dict() const;

  const core::ModelConfig& config() const { return backbone_->config(); }
  Backbone& backbone() { return *backbone_; }

 private:
  std::shared_ptr<Backbone> backbone_;  // registered as "rwtransformer"
  nn::Linear v_head_{nullptr};          // [1, output_dim]
};
TORCH_MODULE(ValueHeadModel);

}  // namespace models
}  // namespace dschat
