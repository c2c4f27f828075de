#pragma once
// LLaMA (and LLaMA-2/3 shapes) and the families that are LLaMA with switches: Mistral (sliding
// window), Qwen2/2.5 (q/k/v biases, windowed layers by layer_types), Qwen3 (q/k RMSNorm per
// head, head_dim apart from hidden / heads). RMSNorm, rotary embeddings with the configured
// scaling, SwiGLU MLP, grouped-query attention. Parameter names match LlamaModel's state dict
// (and Mistral's, Qwen2's, Qwen3's): embed_tokens.weight, layers.N.self_attn.q_proj.weight, ...,
// norm.weight.

#include "dschat/models/backbone.h"
#include "dschat/nn/attention.h"
#include "dschat/nn/embedding.h"
#include "dschat/nn/linear.h"
#include "dschat/nn/rms_norm.h"
#include "dschat/nn/rotary.h"
#include "dschat/nn/tensor_parallel.h"

namespace dschat {
namespace models {

class LlamaMlpImpl : public torch::nn::Module {
 public:
  explicit LlamaMlpImpl(const core::ModelConfig& config);
  /// x: [B, T, H] -> down(act(gate(x)) * up(x)): [B, T, H]
  torch::Tensor forward(const torch::Tensor& x);
  /// As forward, through the fused inference ops (ops::silu_and_mul for SiLU); no autograd. With
  /// `tensor_parallel` this is one rank's slice of the features and down_proj's partial output
  /// is all-reduced before its bias (nn::row_parallel_linear).
  torch::Tensor forward_inference(const torch::Tensor& x, nn::TensorParallelGroup* tensor_parallel = nullptr);

  nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  int activation_;
};
TORCH_MODULE(LlamaMlp);

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const core::ModelConfig& config, int64_t layer);
  /// x: [B, T, H] -> [B, T, H]
  torch::Tensor forward(const torch::Tensor& x, const nn::AttentionInputs& inputs, int64_t layer, nn::KvCache* cache);

  nn::Attention self_attn{nullptr};
  LlamaMlp mlp{nullptr};
  nn::RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

class LlamaModel : public Backbone {
 public:
  explicit LlamaModel(const core::ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask, nn::KvCache* cache,
                        nn::MaskLayout layout = nn::MaskLayout::kUnknown) override;
  torch::Tensor embedding_weight() override { return embed_tokens->weight; }
  std::vector<std::shared_ptr<torch::nn::Module>> decoder_layers() override { return layers->children(); }

  nn::Embedding embed_tokens{nullptr};  // [V, H]
  torch::nn::ModuleList layers{nullptr};
  nn::RmsNorm norm{nullptr};

 private:
  // The rotary inverse frequencies, kept on each device the model runs on (no host->device copy
  // per forward). Not a registered buffer: it must stay fp32 when the model is cast, and stay out
  // of state dicts and ZeRO partitions.
  std::shared_ptr<nn::RotaryFrequencies> rotary_;
};

}  // namespace models
}  // namespace dschat
