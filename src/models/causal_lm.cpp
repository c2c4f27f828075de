#include "dschat/models/causal_lm.h"

#include "dschat/models/hf_layout.h"
#include "dschat/ops/skinny_linear.h"

namespace dschat {
namespace models {

CausalLMImpl::CausalLMImpl(const core::ModelConfig& config) {
  backbone_ = register_module("model", make_backbone(config));
  if (!config.tie_word_embeddings) {
    lm_head_ = register_module("lm_head",
                               nn::Linear(nn::LinearOptions(config.output_dim(), config.vocab_size).bias(config.lm_head_bias)));
  }
}

torch::Tensor CausalLMImpl::hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                          nn::KvCache* cache, nn::MaskLayout layout) {
  return backbone_->forward(input_ids, attention_mask, cache, layout);
}

torch::Tensor CausalLMImpl::lm_logits(const torch::Tensor& hidden) {
  // Tied to the embedding (OPT): the decode step's largest product, hence ops::linear's skinny
  // kernel for a few rows on the CPU.
  if (lm_head_.is_empty()) return ops::linear(hidden, backbone_->embedding_weight(), torch::Tensor());
  return lm_head_(hidden);
}

torch::Tensor CausalLMImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                    nn::KvCache* cache, nn::MaskLayout layout) {
  return lm_logits(hidden_states(input_ids, attention_mask, cache, layout));
}

void CausalLMImpl::load_weights(const NamedTensors& weights, const std::string& source, NamedTensors* deferred) {
  WeightBinding binding;
  binding.deferred = deferred;
  if (config().tie_word_embeddings) binding.ignored.insert("lm_head.weight");
  models::load_weights(*this, from_hf_layout(config(), weights, "model.", source), binding, source);
}

NamedTensors CausalLMImpl::state_dict() const { return to_hf_layout(config(), named_weights(*this)); }

void CausalLMImpl::pretty_print(std::ostream& stream) const {
  const auto& c = backbone_->config();
  stream << "dschat::models::CausalLM(" << c.model_type << ", layers=" << c.num_hidden_layers
         << ", hidden=" << c.hidden_size << ", vocab=" << c.vocab_size
         << ", tied=" << (c.tie_word_embeddings ? "true" : "false") << ")";
}

}  // namespace models
}  // namespace dschat
