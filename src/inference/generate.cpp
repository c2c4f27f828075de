#include "dschat/inference/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include "dschat/core/error.h"
#include "dschat/inference/kv_cache.h"

namespace dschat {
namespace inference {
namespace {

// logits: [B, V] (fp32), seen: [B, S] ids so far -> adjusted logits, as HF's logits processors.
torch::Tensor process_logits(torch::Tensor logits, const torch::Tensor& seen, const core::GenerationConfig& config,
                             int64_t generated) {
  if (config.repetition_penalty != 1.0) {
    torch::Tensor picked = logits.gather(1, seen);  // [B, S]
    picked = torch::where(picked < 0, picked * config.repetition_penalty, picked / config.repetition_penalty);
    logits = logits.scatter(1, seen, picked);
  }
  if (config.eos_token_id && generated < config.min_new_tokens) {
    logits.select(1, *config.eos_token_id).fill_(-std::numeric_limits<float>::infinity());
  }
  if (!config.do_sample) return logits;
  if (config.temperature != 1.0) logits = logits / config.temperature;
  if (config.top_k > 0 && config.top_k < logits.size(1)) {
    torch::Tensor kth = std::get<0>(logits.topk(config.top_k, 1)).narrow(1, config.top_k - 1, 1);  // [B, 1]
    logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
  }
  if (config.top_p < 1.0) {
    auto [sorted, order] = logits.sort(1, /*descending=*/false);                       // [B, V] each
    torch::Tensor cumulative = sorted.softmax(1).cumsum(1);                            // [B, V]
    torch::Tensor drop = cumulative <= (1.0 - config.top_p);                           // [B, V]
    drop.select(1, drop.size(1) - 1).fill_(false);                                     // keep the best token
    logits = logits.masked_fill(drop.scatter(1, order, drop), -std::numeric_limits<float>::infinity());
  }
  return logits;
}

}  // namespace

GenerationResult generate(models::CausalLM& model, const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                          const core::GenerationConfig& config) {
  core::validate_generation_config(config, "generation config");
  DSCHAT_CHECK(input_ids.dim() == 2 && input_ids.sizes() == attention_mask.sizes(), InvalidArgument,
               "generate: input_ids ", input_ids.sizes(), " and attention_mask ", attention_mask.sizes(),
               " must both be [batch, tokens]");
  torch::NoGradGuard no_grad;
  const int64_t batch = input_ids.size(0), prompt = input_ids.size(1);
  const auto& model_config = model->config();
  auto device = input_ids.device();
  auto weight_dtype = model->parameters().front().scalar_type();
  ContiguousKvCache cache(model_config, batch, prompt + config.max_new_tokens, weight_dtype, device);
  const int64_t pad = config.pad_token_id.value_or(config.eos_token_id.value_or(0));
  auto generator = at::make_generator<at::CPUGeneratorImpl>(config.seed);

  torch::Tensor sequences = input_ids;                                // [B, T + n]
  torch::Tensor mask = attention_mask.to(torch::kInt64);              // [B, T + n]
  torch::Tensor finished = torch::zeros({batch}, torch::dtype(torch::kBool).device(device));  // [B]
  torch::Tensor step_input = input_ids;                               // [B, T] then [B, 1]
  for (int64_t step = 0; step < config.max_new_tokens; ++step) {
    torch::Tensor logits = model->forward(step_input, mask, &cache).select(1, -1).to(torch::kFloat32);  // [B, V]
    logits = process_logits(logits, sequences, config, step);
    torch::Tensor next;  // [B]
    if (config.do_sample) {
      next = logits.softmax(1).cpu().multinomial(1, /*replacement=*/false, generator).squeeze(1).to(device);
    } else {
      next = logits.argmax(1);
    }
    next = torch::where(finished, torch::full_like(next, pad), next);
    sequences = torch::cat({sequences, next.unsqueeze(1)}, 1);
    mask = torch::cat({mask, finished.logical_not().to(torch::kInt64).unsqueeze(1)}, 1);
    if (config.eos_token_id) finished = finished.logical_or(next == *config.eos_token_id);
    if (finished.all().item<bool>()) break;
    step_input = next.unsqueeze(1);
  }
  return {sequences, mask};
}

}  // namespace inference
}  // namespace dschat
