#pragma once
// A decoder backbone: the Hugging Face "base model" (OPTModel, LlamaModel) from token ids to the
// final hidden states. CausalLM adds the LM head; ValueHeadModel adds a scalar head. Each
// architecture is one file (opt.cpp, llama.cpp) registered in make_backbone.

#include <torch/torch.h>

#include <memory>

#include "dschat/core/model_config.h"
#include "dschat/nn/attention.h"
#include "dschat/nn/checkpoint.h"
#include "dschat/nn/kv_cache.h"

namespace dschat {
namespace models {

class Backbone : public torch::nn::Module {
 public:
  explicit Backbone(core::ModelConfig config) : config_(std::move(config)) {}

  /// input_ids: [B, T] int64; attention_mask: [B, S] with S = cached + T (1 = real token,
  /// undefined = all real); cache: optional, owned by the caller. Returns [B, T, output_dim].
  virtual torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                nn::KvCache* cache) = 0;

  /// The token embedding matrix [vocab, embed_dim], which a tied LM head reuses.
  virtual torch::Tensor embedding_weight() = 0;

  /// Recompute each decoder layer's activations in backward instead of storing them.
  void set_gradient_checkpointing(bool enabled) { gradient_checkpointing_ = enabled; }
  bool gradient_checkpointing() const { return gradient_checkpointing_; }

  const core::ModelConfig& config() const { return config_; }

 protected:
  /// The mask the layers see: `attention_mask`, or all ones [B, cached + T] when undefined.
  torch::Tensor full_mask(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                          const nn::KvCache* cache) const;

  /// Runs every decoder layer (type LayerImpl) over h: [B, T, H], checkpointing each one when
  /// enabled in training (never with a cache: generation keeps no activations anyway), then
  /// marks the new tokens as cached.
  template <typename LayerImpl>
  torch::Tensor run_layers(torch::nn::ModuleList& layers, torch::Tensor h, const nn::AttentionInputs& inputs,
                           nn::KvCache* cache) {
    for (size_t i = 0; i < layers->size(); ++i) {
      auto layer = layers[i]->as<LayerImpl>();
      const auto index = static_cast<int64_t>(i);
      if (gradient_checkpointing_ && is_training() && cache == nullptr) {
        h = nn::checkpoint([=](const torch::Tensor& x) { return layer->forward(x, inputs, index, nullptr); }, h);
      } else {
        h = layer->forward(h, inputs, index, cache);
      }
    }
    if (cache != nullptr) cache->commit(h.size(1));
    return h;
  }

  core::ModelConfig config_;
  bool gradient_checkpointing_ = false;
};

/// Builds the backbone of config.architecture with freshly initialised weights.
std::shared_ptr<Backbone> make_backbone(const core::ModelConfig& config);

}  // namespace models
}  // namespace dschat
