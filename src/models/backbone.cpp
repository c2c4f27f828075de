#include "dschat/models/backbone.h"

#include "dschat/core/error.h"
#include "dschat/core/host_sync.h"
#include "models/gpt_block.h"
#include "models/llama.h"
#include "models/opt.h"

namespace dschat {
namespace models {

torch::Tensor Backbone::full_mask(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                  const nn::KvCache* cache) const {
  DSCHAT_CHECK(input_ids.dim() == 2, InvalidArgument, "forward: input_ids must be [batch, tokens], got shape ",
               input_ids.sizes());
  const int64_t cached = cache ? cache->cached_length() : 0;
  const int64_t total = cached + input_ids.size(1);
  if (!attention_mask.defined()) {
    return torch::ones({input_ids.size(0), total}, torch::dtype(torch::kInt64).device(input_ids.device()));
  }
  DSCHAT_CHECK(attention_mask.dim() == 2 && attention_mask.size(0) == input_ids.size(0) &&
                   attention_mask.size(1) == total,
               InvalidArgument, "forward: attention_mask must be [", input_ids.size(0), ", ", total,
               "] (cached + new tokens), got ", attention_mask.sizes());
  return attention_mask;
}

nn::MaskLayout Backbone::resolve_mask_layout(const torch::Tensor& attention_mask, const nn::KvCache* cache,
                                             nn::MaskLayout layout) {
  if (!attention_mask.defined()) return nn::MaskLayout::kUnpadded;
  if (layout != nn::MaskLayout::kUnknown) return layout;
  if (cache == nullptr) return nn::MaskLayout::kUnknown;
  core::HostSync sync("attention mask padding (a KV-cache forward without a layout)");
  return nn::detect_mask_layout(attention_mask);
}

void Backbone::begin_forward(const nn::KvCache* cache) {
  // Refused here, before the hooks or the cache see anything; the layers check dropout as well.
  nn::require_tensor_parallel_inference(tensor_parallel_.get(), cache != nullptr && !torch::GradMode::is_enabled(),
                                        "backbone forward");
  if (layer_hooks_ == nullptr) return;
  // With hooks and grad every layer is recomputed in backward, and a recompute cannot replay
  // attention over a cache that has since moved on; cached generation runs without grad anyway.
  DSCHAT_CHECK(cache == nullptr || !torch::GradMode::is_enabled(), Unsupported,
               "forward: a backbone with layer parameter hooks (ZeRO stage 3) cannot run a grad-enabled "
               "forward with a KV cache; run cached generation under torch::NoGradGuard");
  layer_hooks_->begin_forward();
}

nn::CheckpointCallbacks Backbone::recompute_callbacks(nn::LayerParameterHooks* hooks, int64_t layer) {
  nn::CheckpointCallbacks callbacks;
  callbacks.before_recompute = [hooks, layer] { hooks->acquire_layer(layer); };
  callbacks.after_backward = [hooks, layer] {
    hooks->layer_gradients_ready(layer);
    hooks->release_layer(layer);
  };
  return callbacks;
}

std::shared_ptr<Backbone> make_backbone(const core::ModelConfig& config) {
  switch (config.architecture) {
    case core::Architecture::Opt: return std::make_shared<OptModel>(config);
    case core::Architecture::Llama: return std::make_shared<LlamaModel>(config);
    case core::Architecture::Gpt2:
    case core::Architecture::GptNeo:
    case core::Architecture::GptJ:
    case core::Architecture::GptNeox:
    case core::Architecture::Bloom: return std::make_shared<GptModel>(config);
  }
  DSCHAT_THROW(Unsupported, "model_type '", config.model_type, "' has no backbone");
}

}  // namespace models
}  // namespace dschat
