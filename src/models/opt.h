#pragma once
// OPT (facebook/opt-*): learned positions with HF's offset of 2, pre-LN or post-LN (opt-350m)
// decoder layers with a ReLU MLP, optional project_in/project_out when word_embed_proj_dim !=
// hidden_size. Parameter names match OPTModel's state dict: decoder.embed_tokens.weight, ...

#include "dschat/models/backbone.h"
#include "dschat/nn/attention.h"
#include "dschat/nn/embedding.h"
#include "dschat/nn/linear.h"
#include "dschat/nn/tensor_parallel.h"

namespace dschat {
namespace models {

class OptDecoderLayerImpl : public torch::nn::Module {
 public:
  explicit OptDecoderLayerImpl(const core::ModelConfig& config);
  /// x: [B, T, H] -> [B, T, H]
  torch::Tensor forward(const torch::Tensor& x, const nn::AttentionInputs& inputs, int64_t layer, nn::KvCache* cache);

  nn::Attention self_attn{nullptr};
  nn::LayerNorm self_attn_layer_norm{nullptr}, final_layer_norm{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr};

 private:
  bool pre_norm_;
  double dropout_;
  int activation_;
};
TORCH_MODULE(OptDecoderLayer);

class OptDecoderImpl : public torch::nn::Module {
 public:
  explicit OptDecoderImpl(const core::ModelConfig& config);

  nn::Embedding embed_tokens{nullptr};     // [V, E]
  nn::Embedding embed_positions{nullptr};  // [max_positions + 2, H]
  nn::Linear project_in{nullptr}, project_out{nullptr};  // E -> H, H -> E (when E != H)
  nn::LayerNorm final_layer_norm{nullptr};        // pre-LN models only
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(OptDecoder);

class OptModel : public Backbone {
 public:
  explicit OptModel(const core::ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask, nn::KvCache* cache,
                        nn::MaskLayout layout = nn::MaskLayout::kUnknown) override;
  torch::Tensor embedding_weight() override { return decoder->embed_tokens->weight; }
  std::vector<std::shared_ptr<torch::nn::Module>> decoder_layers() override { return decoder->layers->children(); }

  OptDecoder decoder{nullptr};
};

}  // namespace models
}  // namespace dschat
