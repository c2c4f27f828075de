#include "models/gpt_block.h"

#include <cmath>

#include "dschat/core/error.h"
#include "dschat/nn/activation.h"
#include "dschat/nn/tensor_parallel.h"
#include "dschat/ops/bias_activation.h"
#include "dschat/ops/residual_norm.h"

namespace dschat {
namespace models {
namespace F = torch::nn::functional;

GptNames gpt_names(const core::ModelConfig& config) {
  using core::Architecture;
  switch (config.architecture) {
    case Architecture::Gpt2:
    case Architecture::GptNeo:
      return {"wte", "wpe", "", "h", "ln_f", "ln_1", "attn", "ln_2", "mlp",
              config.architecture == Architecture::Gpt2 ? "c_proj" : "out_proj", "c_fc", "c_proj",
              PositionKind::kLearned};
    case Architecture::GptJ:
      return {"wte", "", "", "h", "ln_f", "ln_1", "attn", "", "mlp", "out_proj", "fc_in", "fc_out",
              PositionKind::kRotary};
    case Architecture::GptNeox:
      return {"embed_in", "", "", "layers", "final_layer_norm", "input_layernorm", "attention",
              "post_attention_layernorm", "mlp", "dense", "dense_h_to_4h", "dense_4h_to_h", PositionKind::kRotary};
    case Architecture::Bloom:
      return {"word_embeddings", "", "word_embeddings_layernorm", "h", "ln_f", "input_layernorm", "self_attention",
              "post_attention_layernorm", "mlp", "dense", "dense_h_to_4h", "dense_4h_to_h", PositionKind::kAlibi};
    default: break;
  }
  DSCHAT_THROW(InvalidArgument, "model_type '", config.model_type, "' is not a LayerNorm (GPT-style) family");
}

torch::Tensor alibi_slopes(int64_t heads) {
  const int64_t power = int64_t{1} << static_cast<int64_t>(std::floor(std::log2(static_cast<double>(heads))));
  auto geometric = [](int64_t n, int64_t first, int64_t step, int64_t count) {
    const double base = std::pow(2.0, -std::pow(2.0, -(std::log2(static_cast<double>(n)) - 3.0)));
    torch::Tensor powers = torch::arange(first, first + step * count, step, torch::kInt32);  // [count]
    return torch::pow(torch::scalar_tensor(base, torch::kFloat32), powers);
  };
  torch::Tensor slopes = geometric(power, 1, 1, power);  // [power]
  if (power == heads) return slopes;
  const int64_t extra = std::min(power, heads - power);
  return torch::cat({slopes, geometric(2 * power, 1, 2, extra)});  // [heads]
}

GptMlpImpl::GptMlpImpl(const core::ModelConfig& config, const GptNames& names)
    : activation_(nn::parse_activation(config.activation)) {
  const int64_t h = config.hidden_size, f = config.intermediate_size;
  fc_in = register_module(names.fc_in, nn::Linear(nn::LinearOptions(h, f).bias(true)));
  fc_out = register_module(names.fc_out, nn::Linear(nn::LinearOptions(f, h).bias(true)));
}

torch::Tensor GptMlpImpl::forward(const torch::Tensor& x) {
  return fc_out(nn::apply_activation(activation_, fc_in(x)));  // [B, T, H]
}

torch::Tensor GptMlpImpl::forward_inference(const torch::Tensor& x, nn::TensorParallelGroup* tensor_parallel) {
  torch::Tensor bias;
  torch::Tensor g = nn::linear_deferring_bias(*fc_in, x, &bias);              // [B, T, F]
  g = ops::bias_activation(g, bias, nn::fused_activation(activation_));       // [B, T, F]
  if (tensor_parallel != nullptr) return nn::row_parallel_linear(*fc_out, g, *tensor_parallel);
  return fc_out(g);  // [B, T, H]
}

GptBlockImpl::GptBlockImpl(const core::ModelConfig& config, const GptNames& names, int64_t layer)
    : parallel_(config.parallel_residual),
      residual_after_norm_(config.residual_post_layernorm),
      dropout_(config.dropout) {
  auto norm_options = nn::LayerNormOptions(config.hidden_size).eps(config.layer_norm_eps);
  ln_1 = register_module(names.ln_1, nn::LayerNorm(norm_options));
  // head_dim explicitly: a tensor-parallel shard has fewer heads of the full model's size.
  attn = register_module(names.attn, nn::Attention(nn::AttentionOptions(config.hidden_size, config.num_attention_heads)
                                                       .head_dim(config.head_dim)
                                                       .bias(config.attention_bias)
                                                       .output_bias(config.attention_output_bias)
                                                       .output_name(names.out_proj)
                                                       .scaled(config.scale_attention)
                                                       .sliding_window(config.is_sliding_layer(layer))
                                                       .dropout(config.attention_dropout)));
  if (!names.ln_2.empty()) ln_2 = register_module(names.ln_2, nn::LayerNorm(norm_options));
  mlp = register_module(names.mlp, GptMlp(config, names));
}

torch::Tensor GptBlockImpl::forward(const torch::Tensor& x, const nn::AttentionInputs& inputs, int64_t layer,
                                    nn::KvCache* cache) {
  if (nn::use_inference_ops(cache, is_training() && (dropout_ > 0.0 || attn->options.dropout() > 0.0))) {
    return forward_inference(x, inputs, layer, cache);
  }
  nn::require_tensor_parallel_inference(inputs.tensor_parallel, false, "decoder block");
  auto drop = [&](const torch::Tensor& t) {
    return F::dropout(t, F::DropoutFuncOptions().p(dropout_).training(is_training()));
  };
  torch::Tensor normed = ln_1(x);                                 // [B, T, H]
  torch::Tensor a = drop(attn(normed, inputs, layer, cache));     // [B, T, H]
  if (parallel_) {  // GPT-J, CodeGen (one norm), GPT-NeoX's use_parallel_residual (two)
    torch::Tensor m = drop(mlp(ln_2.is_empty() ? normed : ln_2(x)));  // [B, T, H]
    return x + a + m;
  }
  torch::Tensor h = (residual_after_norm_ ? normed : x) + a;  // [B, T, H]
  torch::Tensor f = ln_2(h);                                  // [B, T, H]
  return (residual_after_norm_ ? f : h) + drop(mlp(f));
}

torch::Tensor GptBlockImpl::forward_inference(const torch::Tensor& x, const nn::AttentionInputs& inputs, int64_t layer,
                                              nn::KvCache* cache) {
  nn::TensorParallelGroup* tp = inputs.tensor_parallel;
  torch::Tensor normed = ln_1(x);  // [B, T, H]
  torch::Tensor attn_bias;
  torch::Tensor a = attn->forward(normed, inputs, layer, cache, &attn_bias);  // [B, T, H], bias deferred
  if (parallel_) {
    torch::Tensor m = mlp->forward_inference(ln_2.is_empty() ? normed : ln_2(x), tp);  // [B, T, H]
    if (attn_bias.defined()) a = a + attn_bias;
    return x + a + m;
  }
  if (residual_after_norm_) {
    torch::Tensor h = normed + (attn_bias.defined() ? a + attn_bias : a);  // [B, T, H]
    torch::Tensor f = ln_2(h);
    return f + mlp->forward_inference(f, tp);
  }
  // Pre-LN: the residual add, attention bias and ln_2 in one pass.
  auto [f, h] = ops::bias_residual_layer_norm(a, attn_bias, x, ln_2->weight, ln_2->bias, ln_2->options.eps());
  return h + mlp->forward_inference(f, tp);
}

GptModel::GptModel(const core::ModelConfig& config) : Backbone(config), names_(gpt_names(config)) {
  const int64_t h = config.hidden_size;
  embed = register_module(names_.embed, nn::Embedding(config.vocab_size, h));
  if (names_.position == PositionKind::kLearned) {
    positions = register_module(names_.positions, nn::Embedding(config.max_position_embeddings, h));
  }
  auto norm_options = nn::LayerNormOptions(h).eps(config.layer_norm_eps);
  if (!names_.embed_norm.empty()) embed_norm = register_module(names_.embed_norm, nn::LayerNorm(norm_options));
  layers = register_module(names_.layers, torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers->push_back(GptBlock(config, names_, i));
  final_norm = register_module(names_.final_norm, nn::LayerNorm(norm_options));
  if (names_.position == PositionKind::kRotary) rotary_ = std::make_shared<nn::RotaryFrequencies>(config);
}

torch::Tensor GptModel::alibi_bias(const torch::Tensor& mask, int64_t new_tokens, torch::ScalarType dtype) {
  // A tensor-parallel shard holds heads [rank * H, (rank + 1) * H) of the full model's slopes.
  const auto& tp = tensor_parallel_group();
  const int64_t heads = config_.num_attention_heads, ranks = tp ? tp->size() : 1, rank = tp ? tp->rank() : 0;
  // Made on the host once per device: a host copy cannot run inside a CUDA-graph capture.
  if (!alibi_slopes_.defined() || alibi_slopes_.device() != mask.device() || alibi_slopes_rank_ != rank) {
    alibi_slopes_ = alibi_slopes(heads * ranks).narrow(0, rank * heads, heads).to(mask.device());  // [H]
    alibi_slopes_rank_ = rank;
  }
  const torch::Tensor& slopes = alibi_slopes_;  // [H]
  torch::Tensor key_mask = mask.to(torch::kInt64);                                         // [B, S]
  torch::Tensor key_position = ((key_mask.cumsum(1) - 1) * key_mask).to(torch::kFloat32);  // [B, S]
  torch::Tensor alibi = slopes.view({1, heads, 1, 1}) * key_position.view({mask.size(0), 1, 1, -1});  // [B, H, 1, S]
  torch::Tensor causal = nn::causal_attention_bias(mask, new_tokens, torch::kFloat32);             // [B, 1, T, S]
  return (causal + alibi).to(dtype);                                                                // [B, H, T, S]
}

torch::Tensor GptModel::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                nn::KvCache* cache, nn::MaskLayout layout) {
  begin_forward(cache);  // the layer hooks' start, before any parameter is read
  torch::Tensor mask = full_mask(input_ids, attention_mask, cache);  // [B, S]
  const int64_t steps = input_ids.size(1);
  // Positions follow the mask (as HF generate computes them), so left padding does not shift them.
  torch::Tensor position_ids = nn::positions_from_mask(mask, steps, /*pad_position=*/1);  // [B, T]
  torch::Tensor h = embed(input_ids);                                                   // [B, T, H]
  if (!positions.is_empty()) h = h + positions(position_ids);
  if (!embed_norm.is_empty()) h = embed_norm(h);
  h = F::dropout(h, F::DropoutFuncOptions().p(config_.dropout).training(is_training()));

  nn::AttentionInputs inputs = nn::attention_masking(
      mask, steps, h.scalar_type(), resolve_mask_layout(attention_mask, cache, layout), config_.sliding_window);
  if (rotary_) std::tie(inputs.cos, inputs.sin) = rotary_->cos_sin(position_ids, h.scalar_type());  // [B, T, R]
  if (names_.position == PositionKind::kAlibi) {
    inputs.bias = alibi_bias(mask, steps, h.scalar_type());  // [B, H, T, S]
    inputs.is_causal = false;
    inputs.bias_carries_scores = true;
  }
  inputs.tensor_parallel = tensor_parallel_group().get();
  h = run_layers<GptBlockImpl>(layers, h, inputs, cache);
  return final_norm(h);  // [B, T, H]
}

}  // namespace models
}  // namespace dschat
