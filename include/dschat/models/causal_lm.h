#pragma once
// A causal language model: backbone + LM head (tied to the token embedding when the config says
// so; with a bias for GPT-J and CodeGen). Parameter names are "model.<backbone>" and
// "lm_head.*": the HF *ForCausalLM names for OPT and the LLaMA family, and for the other families
// the mapping of dschat/models/hf_layout.h, which load_weights and state_dict apply. The model
// keeps no runtime state.
//   CausalLM lm(core::load_model_config(dir));
//   lm->load_weights(io::load_state_dict(dir), dir);
//   torch::Tensor logits = lm->forward(ids, mask);  // [B, T, V]

#include <torch/torch.h>

#include "dschat/models/backbone.h"
#include "dschat/models/weights.h"
#include "dschat/nn/linear.h"

namespace dschat {
namespace models {

class CausalLMImpl : public torch::nn::Module {
 public:
  explicit CausalLMImpl(const core::ModelConfig& config);

  /// input_ids: [B, T]; attention_mask: [B, cached + T] or undefined -> logits [B, T, V].
  /// `layout` states the mask's padding (nn::MaskLayout; Backbone::forward): kRightPadded for
  /// right-padded training batches (SDPA's causal path; logits at padded positions unspecified),
  /// kLeftPadded for left-padded ones (the explicit mask); kUnknown takes the explicit mask too.
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                        nn::KvCache* cache = nullptr, nn::MaskLayout layout = nn::MaskLayout::kUnknown);
  /// forward without a cache, with the mask's layout: lm->forward(ids, mask, nn::MaskLayout::kRightPadded).
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask, nn::MaskLayout layout) {
    return forward(input_ids, attention_mask, nullptr, layout);
  }
  /// Final hidden states [B, T, E] (before the LM head).
  torch::Tensor hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                              nn::KvCache* cache = nullptr, nn::MaskLayout layout = nn::MaskLayout::kUnknown);
  /// hidden: [..., E] -> logits [..., V]
  torch::Tensor lm_logits(const torch::Tensor& hidden);

  /// Binds HF checkpoint tensors in the family's layout (models::from_hf_layout: any base-model
  /// prefix or none, as old OPT checkpoints have; a tied "lm_head.weight" is ignored). `source`
  /// names the checkpoint in errors.
  /// `deferred`: see WeightBinding::deferred.
  void load_weights(const NamedTensors& weights, const std::string& source, NamedTensors* deferred = nullptr);
  /// The HF state dict in the family's layout (tied lm_head omitted, as transformers saves it);
  /// models::named_weights gives the module names.
  NamedTensors state_dict() const;

  const core::ModelConfig& config() const { return backbone_->config(); }
  Backbone& backbone() { return *backbone_; }
  void pretty_print(std::ostream& stream) const override;

 private:
  std::shared_ptr<Backbone> backbone_;  // registered as "model"
  nn::Linear lm_head_{nullptr};         // [V, E]; absent when tied
};
TORCH_MODULE(CausalLM);

}  // namespace models
}  // namespace dschat
