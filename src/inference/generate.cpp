#include "dschat/inference/generate.h"

#include "dschat/inference/inference_engine.h"

namespace dschat {
namespace inference {

GenerationResult repeat_for_return_sequences(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                             int64_t num_return_sequences) {
  if (num_return_sequences == 1) return {input_ids, attention_mask};
  return {input_ids.repeat_interleave(num_return_sequences, 0),         // [B * n, T]
          attention_mask.repeat_interleave(num_return_sequences, 0)};   // [B * n, T]
}

GenerationResult generate(models::CausalLM& model, const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                          const core::GenerationConfig& config) {
  InferenceEngineOptions options;
  // Exactly the tokens this call needs (the engine checks the shapes and the config itself).
  options.max_out_tokens = std::max<int64_t>(2, (input_ids.dim() == 2 ? input_ids.size(1) : 0) + config.max_new_tokens);
  options.log_stats = false;
  InferenceEngine engine(model, options);
  return engine.generate(input_ids, attention_mask, config);
}

}  // namespace inference
}  // namespace dschat
