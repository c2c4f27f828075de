#pragma once
// A decoder backbone: the Hugging Face "base model" (OPTModel, LlamaModel, GPT2Model, ...) from
// token ids to the final hidden states. CausalLM adds the LM head; ValueHeadModel adds a scalar
// head. OPT (opt.cpp) and the LLaMA family (llama.cpp: LLaMA, Mistral, Qwen2, Qwen3) have their
// own decoder layers; GPT-2, GPT-Neo, GPT-J, CodeGen, GPT-NeoX and BLOOM share gpt_block.cpp's
// LayerNorm block with per-family switches and names. make_backbone picks by architecture.

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "dschat/core/model_config.h"
#include "dschat/nn/attention.h"
#include "dschat/nn/checkpoint.h"
#include "dschat/nn/kv_cache.h"
#include "dschat/nn/layer_hooks.h"
#include "dschat/nn/tensor_parallel.h"

namespace dschat {
namespace models {

class Backbone : public torch::nn::Module {
 public:
  explicit Backbone(core::ModelConfig config) : config_(std::move(config)) {}

  /// input_ids: [B, T] int64; attention_mask: [B, S] with S = cached + T (1 = real token,
  /// undefined = all real); cache: optional, owned by the caller; layout: what the caller knows
  /// of the mask's padding (nn::MaskLayout: it picks SDPA's causal path or the explicit mask
  /// without reading the mask on the host). Returns [B, T, output_dim]; with kRightPadded the
  /// rows at padded positions are unspecified.
  virtual torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                nn::KvCache* cache, nn::MaskLayout layout = nn::MaskLayout::kUnknown) = 0;

  /// The token embedding matrix [vocab, embed_dim], which a tied LM head reuses.
  virtual torch::Tensor embedding_weight() = 0;

  /// The decoder layer modules in order (layer i's parameters are decoder_layers()[i]->parameters()).
  virtual std::vector<std::shared_ptr<torch::nn::Module>> decoder_layers() = 0;

  /// Recompute each decoder layer's activations in backward instead of storing them.
  void set_gradient_checkpointing(bool enabled) { gradient_checkpointing_ = enabled; }
  bool gradient_checkpointing() const { return gradient_checkpointing_; }

  /// Hands the decoder layers' parameters to `hooks` (ZeRO stage 3; protocol in layer_hooks.h);
  /// nullptr removes them. Not owned: it must outlive every backward of a forward that used it.
  void set_layer_parameter_hooks(nn::LayerParameterHooks* hooks) { layer_hooks_ = hooks; }
  nn::LayerParameterHooks* layer_parameter_hooks() const { return layer_hooks_; }

  /// Makes this backbone one rank's tensor-parallel shard (inference/tensor_parallel.h builds
  /// such shards): the attention and MLP output projections all-reduce their partial sums over
  /// `group`. Generation only: a forward outside the inference path (no KV cache, grad enabled,
  /// dropout) then throws core::InvalidArgument. nullptr = not sharded.
  void set_tensor_parallel_group(std::shared_ptr<nn::TensorParallelGroup> group) {
    tensor_parallel_ = std::move(group);
  }
  const std::shared_ptr<nn::TensorParallelGroup>& tensor_parallel_group() const { return tensor_parallel_; }

  const core::ModelConfig& config() const { return config_; }

 protected:
  /// The mask the layers see: `attention_mask`, or all ones [B, cached + T] when undefined.
  torch::Tensor full_mask(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                          const nn::KvCache* cache) const;

  /// The layout the masking follows: kUnpadded for an undefined `attention_mask` (the caller's,
  /// before full_mask); `layout` when stated; for kUnknown with a KV cache the mask read on the
  /// host (nn::detect_mask_layout: incremental decoding as before layouts existed); kUnknown
  /// otherwise, which attention_masking serves with the explicit mask.
  static nn::MaskLayout resolve_mask_layout(const torch::Tensor& attention_mask, const nn::KvCache* cache,
                                            nn::MaskLayout layout);

  /// Each architecture's forward calls this first: refuses what the layer hooks cannot serve
  /// (a grad-enabled forward with a KV cache), then tells them a forward begins.
  void begin_forward(const nn::KvCache* cache);

  /// Runs every decoder layer (type LayerImpl) over h: [B, T, H], then marks the new tokens as
  /// cached. Without layer hooks each layer is checkpointed when enabled in training (never with
  /// a cache: generation keeps no activations anyway). With hooks each layer runs between
  /// acquire_layer and release_layer and, when grad is enabled, is always checkpointed, its
  /// recompute bracketed by the hooks (layer_hooks.h).
  template <typename LayerImpl>
  torch::Tensor run_layers(torch::nn::ModuleList& layers, torch::Tensor h, const nn::AttentionInputs& inputs,
                           nn::KvCache* cache) {
    nn::LayerParameterHooks* hooks = layer_hooks_;
    const bool recompute_under_hooks = hooks != nullptr && torch::GradMode::is_enabled();
    const bool checkpoint_plain = gradient_checkpointing_ && is_training() && cache == nullptr;
    for (size_t i = 0; i < layers->size(); ++i) {
      auto layer = layers[i]->as<LayerImpl>();
      const auto index = static_cast<int64_t>(i);
      auto run_layer = [=](const torch::Tensor& x) { return layer->forward(x, inputs, index, nullptr); };
      if (hooks != nullptr) hooks->acquire_layer(index);
      if (recompute_under_hooks) {
        h = nn::checkpoint(run_layer, h, recompute_callbacks(hooks, index));
      } else if (checkpoint_plain) {
        h = nn::checkpoint(run_layer, h);
      } else {
        h = layer->forward(h, inputs, index, cache);
      }
      if (hooks != nullptr) hooks->release_layer(index);
    }
    if (cache != nullptr) cache->commit(h.size(1));
    return h;
  }

  core::ModelConfig config_;
  bool gradient_checkpointing_ = false;

 private:
  /// Brackets layer `layer`'s recompute in backward: acquire; then gradients ready, release.
  static nn::CheckpointCallbacks recompute_callbacks(nn::LayerParameterHooks* hooks, int64_t layer);

  nn::LayerParameterHooks* layer_hooks_ = nullptr;  // not owned
  std::shared_ptr<nn::TensorParallelGroup> tensor_parallel_;  // null unless this is a TP shard
};

/// Builds the backbone of config.architecture with freshly initialised weights.
std::shared_ptr<Backbone> make_backbone(const core::ModelConfig& config);

}  // namespace models
}  // namespace dschat
