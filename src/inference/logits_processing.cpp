#include "dschat/inference/logits_processing.h"

#include <ATen/CPUGeneratorImpl.h>

#include <limits>

#ifdef DSCHAT_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace dschat {
namespace inference {

torch::Tensor process_logits(torch::Tensor logits, const torch::Tensor& seen, const core::GenerationConfig& config,
                             int64_t generated) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  if (config.repetition_penalty != 1.0) {
    torch::Tensor picked = logits.gather(1, seen);  // [B, S]
    picked = torch::where(picked < 0, picked * config.repetition_penalty, picked / config.repetition_penalty);
    logits = logits.scatter(1, seen, picked);
  }
  if (config.eos_token_id && generated < config.min_new_tokens) {
    logits.select(1, *config.eos_token_id).fill_(kMasked);
  }
  if (!config.do_sample) return logits;
  if (config.temperature != 1.0) logits = logits / config.temperature;
  if (config.top_k > 0 && config.top_k < logits.size(1)) {
    torch::Tensor kth = std::get<0>(logits.topk(config.top_k, 1)).narrow(1, config.top_k - 1, 1);  // [B, 1]
    logits = logits.masked_fill(logits < kth, kMasked);
  }
  if (config.top_p < 1.0) {
    auto [sorted, order] = logits.sort(1, /*descending=*/false);  // [B, V] each
    torch::Tensor cumulative = sorted.softmax(1).cumsum(1);       // [B, V]
    torch::Tensor drop = cumulative <= (1.0 - config.top_p);      // [B, V]
    drop.select(1, drop.size(1) - 1).fill_(false);                // keep the best token
    logits = logits.masked_fill(drop.scatter(1, order, drop), kMasked);
  }
  return logits;
}

torch::Tensor select_next_tokens(const torch::Tensor& logits, const core::GenerationConfig& config,
                                 at::Generator& generator) {
  if (!config.do_sample) return logits.argmax(1);  // [B]
  torch::Tensor probabilities = logits.softmax(1);  // [B, V]
  if (generator.device() == logits.device()) {
    // multinomial's argument checks are device-side asserts (torch >= 2.1): no host sync here.
    return probabilities.multinomial(1, /*replacement=*/false, generator).squeeze(1);  // [B]
  }
  return probabilities.to(generator.device())
      .multinomial(1, /*replacement=*/false, generator)
      .squeeze(1)
      .to(logits.device());  // [B]
}

at::Generator make_sampling_generator(const torch::Device& device, uint64_t seed) {
#ifdef DSCHAT_WITH_CUDA
  if (device.is_cuda()) {
    at::Generator generator = at::cuda::detail::createCUDAGenerator(device.index());
    generator.set_current_seed(seed);
    return generator;
  }
#endif
  (void)device;
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

}  // namespace inference
}  // namespace dschat
