#include "models/opt.h"

#include "dschat/nn/activation.h"
#include "dschat/ops/bias_activation.h"
#include "dschat/ops/residual_norm.h"

namespace dschat {
namespace models {
namespace {

constexpr int64_t kPositionOffset = 2;  // OPT's learned positions start at index 2
constexpr double kLayerNormEps = 1e-5;

nn::LayerNorm make_layer_norm(const core::ModelConfig& config) {
  return nn::LayerNorm(
      nn::LayerNormOptions(config.hidden_size).eps(kLayerNormEps).elementwise_affine(config.layer_norm_elementwise_affine));
}

// LayerNorm(x + bias + residual) with `norm`'s parameters, and the sum, in one op.
ops::ResidualNormOutput add_and_norm(const nn::LayerNorm& norm, const torch::Tensor& x,
                                     const torch::Tensor& bias, const torch::Tensor& residual) {
  return ops::bias_residual_layer_norm(x, bias, residual, norm->weight, norm->bias, norm->options.eps());
}

}  // namespace

OptDecoderLayerImpl::OptDecoderLayerImpl(const core::ModelConfig& config)
    : pre_norm_(config.do_layer_norm_before),
      dropout_(config.dropout),
      activation_(static_cast<int>(nn::parse_activation(config.activation))) {
  const int64_t h = config.hidden_size;
  // head_dim explicitly: a tensor-parallel shard has fewer heads of the same size (hidden / heads
  // of the full model), which AttentionOptions' default hidden / num_heads would get wrong.
  const int64_t head_dim = config.head_dim > 0 ? config.head_dim : h / config.num_attention_heads;
  self_attn = register_module("self_attn", nn::Attention(nn::AttentionOptions(h, config.num_attention_heads)
                                                              .head_dim(head_dim)
                                                              .bias(config.enable_bias)
                                                              .output_bias(config.enable_bias)
                                                              .output_name("out_proj")
                                                              .scale_query(true)
                                                              .dropout(config.attention_dropout)));
  self_attn_layer_norm = register_module("self_attn_layer_norm", make_layer_norm(config));
  fc1 = register_module("fc1", nn::Linear(nn::LinearOptions(h, config.intermediate_size).bias(config.enable_bias)));
  fc2 = register_module("fc2", nn::Linear(nn::LinearOptions(config.intermediate_size, h).bias(config.enable_bias)));
  final_layer_norm = register_module("final_layer_norm", make_layer_norm(config));
}

torch::Tensor OptDecoderLayerImpl::forward(const torch::Tensor& x, const nn::AttentionInputs& inputs, int64_t layer,
                                           nn::KvCache* cache) {
  namespace F = torch::nn::functional;
  if (nn::use_inference_ops(cache, is_training() && dropout_ > 0.0)) {
    // The same layer through the fused ops (no dropout to apply): out_proj's and fc1's biases
    // ride in the residual-norm and activation epilogues.
    torch::Tensor attn_bias, fc1_bias, fc2_bias;
    torch::Tensor a = self_attn->forward(pre_norm_ ? self_attn_layer_norm(x) : x, inputs, layer, cache,
                                         &attn_bias);  // [B, T, H]
    // pre-LN: h = x + a, f = final_layer_norm(h); post-LN: h = f = self_attn_layer_norm(x + a).
    auto [f, h] = add_and_norm(pre_norm_ ? final_layer_norm : self_attn_layer_norm, a, attn_bias, x);
    if (!pre_norm_) h = f;
    torch::Tensor g = nn::linear_deferring_bias(*fc1, f, &fc1_bias);                          // [B, T, F]
    g = ops::bias_activation(g, fc1_bias, nn::fused_activation(static_cast<nn::Activation>(activation_)));
    // A tensor-parallel shard holds columns of fc2: its output is a partial sum (row_parallel_linear).
    nn::TensorParallelGroup* tp = inputs.tensor_parallel;
    if (pre_norm_) return h + (tp != nullptr ? nn::row_parallel_linear(*fc2, g, *tp) : fc2(g));
    torch::Tensor y = tp != nullptr ? nn::row_parallel_linear(*fc2, g, *tp, &fc2_bias)
                                    : nn::linear_deferring_bias(*fc2, g, &fc2_bias);  // [B, T, H]
    return add_and_norm(final_layer_norm, y, fc2_bias, h).output;
  }
  nn::require_tensor_parallel_inference(inputs.tensor_parallel, false, "OPT decoder layer");
  auto drop = F::DropoutFuncOptions().p(dropout_).training(is_training());
  torch::Tensor residual = x;                                    // [B, T, H]
  torch::Tensor h = pre_norm_ ? self_attn_layer_norm(x) : x;     // [B, T, H]
  h = residual + F::dropout(self_attn(h, inputs, layer, cache), drop);
  if (!pre_norm_) h = self_attn_layer_norm(h);

  residual = h;
  torch::Tensor f = pre_norm_ ? final_layer_norm(h) : h;  // [B, T, H]
  f = fc1(f);                                             // [B, T, F]
  f = nn::apply_activation(static_cast<nn::Activation>(activation_), f);
  h = residual + F::dropout(fc2(f), drop);
  return pre_norm_ ? h : final_layer_norm(h);
}

OptDecoderImpl::OptDecoderImpl(const core::ModelConfig& config) {
  const int64_t e = config.word_embed_proj_dim, h = config.hidden_size;
  // transformers' OPTDecoder: nn.Embedding(vocab, word_embed_proj_dim, pad_token_id).
  embed_tokens = register_module("embed_tokens", nn::Embedding(config.vocab_size, e, nn::padding_row(config.pad_token_id, config.vocab_size)));
  embed_positions =
      register_module("embed_positions", nn::Embedding(config.max_position_embeddings + kPositionOffset, h));
  if (e != h) {
    project_out = register_module("project_out", nn::Linear(nn::LinearOptions(h, e).bias(false)));
    project_in = register_module("project_in", nn::Linear(nn::LinearOptions(e, h).bias(false)));
  }
  if (config.do_layer_norm_before && !config.remove_final_layer_norm) {
    final_layer_norm = register_module("final_layer_norm", make_layer_norm(config));
  }
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers->push_back(OptDecoderLayer(config));
}

OptModel::OptModel(const core::ModelConfig& config) : Backbone(config) {
  decoder = register_module("decoder", OptDecoder(config));
}

torch::Tensor OptModel::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                nn::KvCache* cache, nn::MaskLayout layout) {
  begin_forward(cache);  // the layer hooks' start, before any parameter is read
  torch::Tensor mask = full_mask(input_ids, attention_mask, cache);  // [B, S]
  const int64_t steps = input_ids.size(1);
  torch::Tensor positions = nn::positions_from_mask(mask, steps, /*pad_position=*/-1) + kPositionOffset;  // [B, T]
  torch::Tensor h = decoder->embed_tokens(input_ids);  // [B, T, E]
  if (!decoder->project_in.is_empty()) h = decoder->project_in(h);
  h = h + decoder->embed_positions(positions);         // [B, T, H]

  nn::AttentionInputs inputs =
      nn::attention_masking(mask, steps, h.scalar_type(), resolve_mask_layout(attention_mask, cache, layout));
  inputs.tensor_parallel = tensor_parallel_group().get();
  h = run_layers<OptDecoderLayerImpl>(decoder->layers, h, inputs, cache);
  if (!decoder->final_layer_norm.is_empty()) h = decoder->final_layer_norm(h);
  if (!decoder->project_out.is_empty()) h = decoder->project_out(h);
  return h;  // [B, T, E]
}

}  // namespace models
}  // namespace dschat
