#include "models/llama.h"

#include "dschat/nn/activation.h"
#include "dschat/nn/rotary.h"
#include "dschat/ops/bias_activation.h"
#include "dschat/ops/residual_norm.h"

namespace dschat {
namespace models {

LlamaMlpImpl::LlamaMlpImpl(const core::ModelConfig& config)
    : activation_(static_cast<int>(nn::parse_activation(config.activation))) {
  const int64_t h = config.hidden_size, f = config.intermediate_size;
  gate_proj = register_module("gate_proj", nn::Linear(nn::LinearOptions(h, f).bias(config.mlp_bias)));
  up_proj = register_module("up_proj", nn::Linear(nn::LinearOptions(h, f).bias(config.mlp_bias)));
  down_proj = register_module("down_proj", nn::Linear(nn::LinearOptions(f, h).bias(config.mlp_bias)));
}

torch::Tensor LlamaMlpImpl::forward(const torch::Tensor& x) {
  torch::Tensor gate = nn::apply_activation(static_cast<nn::Activation>(activation_), gate_proj(x));  // [B, T, F]
  return down_proj(gate * up_proj(x));
}

torch::Tensor LlamaMlpImpl::forward_inference(const torch::Tensor& x, nn::TensorParallelGroup* tensor_parallel) {
  const auto activation = static_cast<nn::Activation>(activation_);
  if (tensor_parallel == nullptr && activation != nn::Activation::Silu) return forward(x);
  torch::Tensor gated = activation == nn::Activation::Silu
                            ? ops::silu_and_mul(gate_proj(x), up_proj(x))
                            : nn::apply_activation(activation, gate_proj(x)) * up_proj(x);  // [B, T, F]
  // A tensor-parallel shard holds columns of down_proj: its output is a partial sum.
  if (tensor_parallel != nullptr) return nn::row_parallel_linear(*down_proj, gated, *tensor_parallel);
  return down_proj(gated);  // [B, T, H]
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const core::ModelConfig& config, int64_t layer) {
  self_attn = register_module(
      "self_attn", nn::Attention(nn::AttentionOptions(config.hidden_size, config.num_attention_heads)
                                     .num_kv_heads(config.num_key_value_heads)
                                     .head_dim(config.head_dim)
                                     .bias(config.attention_bias)
                                     .output_bias(config.attention_output_bias)
                                     .qk_norm_eps(config.qk_norm ? config.rms_norm_eps : 0.0)
                                     .sliding_window(config.is_sliding_layer(layer))
                                     .output_name("o_proj")
                                     .dropout(config.attention_dropout)));
  mlp = register_module("mlp", LlamaMlp(config));
  auto norm_options = nn::RmsNormOptions(config.hidden_size).eps(config.rms_norm_eps);
  input_layernorm = register_module("input_layernorm", nn::RmsNorm(norm_options));
  post_attention_layernorm = register_module("post_attention_layernorm", nn::RmsNorm(norm_options));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const nn::AttentionInputs& inputs, int64_t layer,
                                             nn::KvCache* cache) {
  if (nn::use_inference_ops(cache, is_training() && self_attn->options.dropout() > 0.0)) {
    // The same layer through the fused ops: residual add + post-attention RMSNorm in one pass
    // (o_proj's bias, when attention_bias, rides along), the SiLU gate in one kernel.
    torch::Tensor attn_bias;
    torch::Tensor a = self_attn->forward(input_layernorm(x), inputs, layer, cache, &attn_bias);  // [B, T, H]
    auto [f, h] = ops::bias_residual_rms_norm(a, attn_bias, x, post_attention_layernorm->weight,
                                              post_attention_layernorm->options.eps());
    return h + mlp->forward_inference(f, inputs.tensor_parallel);
  }
  nn::require_tensor_parallel_inference(inputs.tensor_parallel, false, "LLaMA decoder layer");
  torch::Tensor h = x + self_attn(input_layernorm(x), inputs, layer, cache);  // [B, T, H]
  return h + mlp(post_attention_layernorm(h));
}

LlamaModel::LlamaModel(const core::ModelConfig& config)
    : Backbone(config), rotary_(std::make_shared<nn::RotaryFrequencies>(config)) {
  embed_tokens =  // transformers' LlamaModel: nn.Embedding(vocab, hidden, pad_token_id)
      register_module("embed_tokens", nn::Embedding(config.vocab_size, config.hidden_size,
                                                    nn::padding_row(config.pad_token_id, config.vocab_size)));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers->push_back(LlamaDecoderLayer(config, i));
  norm = register_module("norm", nn::RmsNorm(nn::RmsNormOptions(config.hidden_size).eps(config.rms_norm_eps)));
}

torch::Tensor LlamaModel::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                  nn::KvCache* cache, nn::MaskLayout layout) {
  begin_forward(cache);  // the layer hooks' start, before any parameter is read
  torch::Tensor mask = full_mask(input_ids, attention_mask, cache);  // [B, S]
  const int64_t steps = input_ids.size(1);
  // Positions follow the mask (as HF generate computes them), so left padding does not shift them.
  torch::Tensor positions = nn::positions_from_mask(mask, steps, /*pad_position=*/1);  // [B, T]
  torch::Tensor h = embed_tokens(input_ids);                                          // [B, T, H]

  nn::AttentionInputs inputs = nn::attention_masking(
      mask, steps, h.scalar_type(), resolve_mask_layout(attention_mask, cache, layout), config_.sliding_window);
  std::tie(inputs.cos, inputs.sin) = rotary_->cos_sin(positions, h.scalar_type());  // [B, T, D] each
  inputs.tensor_parallel = tensor_parallel_group().get();
  h = run_layers<LlamaDecoderLayerImpl>(layers, h, inputs, cache);
  return norm(h);  // [B, T, H]
}

}  // namespace models
}  // namespace dschat
