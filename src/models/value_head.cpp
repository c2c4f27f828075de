#include "dschat/models/value_head.h"

#include "dschat/models/hf_layout.h"

namespace dschat {
namespace models {

ValueHeadModelImpl::ValueHeadModelImpl(const core::ModelConfig& config) {
  backbone_ = register_module("rwtransformer", make_backbone(config));
  v_head_ = register_module("v_head", nn::Linear(nn::LinearOptions(config.output_dim(), 1).bias(false)));
}

torch::Tensor ValueHeadModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                          nn::MaskLayout layout) {
  torch::Tensor hidden = backbone_->forward(input_ids, attention_mask, nullptr, layout);  // [B, T, E]
  return v_head_(hidden).squeeze(-1);                                            // [B, T]
}

void ValueHeadModelImpl::load_weights(const NamedTensors& weights, const std::string& source,
                                      bool allow_missing_head, NamedTensors* deferred) {
  WeightBinding binding;
  binding.deferred = deferred;
  binding.ignored.insert("lm_head.weight");
  binding.ignored.insert("lm_head.bias");
  if (allow_missing_head) binding.optional.insert("v_head.weight");
  models::load_weights(*this, from_hf_layout(config(), weights, "rwtransformer.", source), binding, source);
}

NamedTensors ValueHeadModelImpl::state_dict() const { return to_hf_layout(config(), named_weights(*this)); }

}  // namespace models
}  // namespace dschat
