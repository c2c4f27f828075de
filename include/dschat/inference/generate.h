#pragma once
// Autoregressive generation with a KV cache: one prefill over the (left-padded) prompts, then one
// token per step. Rows that emit EOS are padded afterwards; the loop ends when all rows have
// finished or max_new_tokens is reached. generate() is a one-off InferenceEngine
// (inference_engine.h) whose workspace holds exactly prompt + max_new_tokens tokens; callers that
// generate repeatedly keep an engine and reuse its workspace.

#include <torch/torch.h>

#include "dschat/core/generation_config.h"
#include "dschat/models/causal_lm.h"

namespace dschat {
namespace inference {

struct GenerationResult {
  torch::Tensor sequences;       // [B, T + N] prompt followed by the new tokens (pad after EOS)
  torch::Tensor attention_mask;  // [B, T + N] 1 for prompt tokens and generated tokens up to EOS
};

/// The prompts each repeated `num_return_sequences` times, a prompt's copies in adjacent rows (as
/// Hugging Face's generate): [B, T] -> [B * n, T]. n = 1 returns the tensors themselves. The
/// row layout of generate()'s result; generate() itself prefills each prompt once, not n times.
GenerationResult repeat_for_return_sequences(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                             int64_t num_return_sequences);

/// input_ids, attention_mask: [B, T] (left padding: zeros at the start of short rows). Returns
/// B * config.num_return_sequences rows, prompt i's answers in rows [i * n, (i + 1) * n): the
/// prompt is prefilled once and its KV cache shared by its n samples. Logs nothing.
GenerationResult generate(models::CausalLM& model, const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                          const core::GenerationConfig& config);

}  // namespace inference
}  // namespace dschat
