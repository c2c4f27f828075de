#include "dschat/inference/logits_processing.h"

#include <ATen/CPUGeneratorImpl.h>

#include <limits>

#include "dschat/core/error.h"

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

torch::Tensor draw_by_inverse_cdf(const torch::Tensor& probabilities, const torch::Tensor& uniform) {
  torch::Tensor cdf = probabilities.cumsum(1);                    // [R, V]
  torch::Tensor total = cdf.narrow(1, cdf.size(1) - 1, 1).contiguous();  // [R, 1]
  torch::Tensor target = uniform.unsqueeze(1).to(cdf.scalar_type()) * total;  // [R, 1]
  torch::Tensor picked = torch::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true);  // [R, 1]
  // u * total can round up to total (u within 2^-24 of 1 in float32): the search would then land
  // past the last token with any probability, on a masked one. The first index whose cdf reaches
  // the total is that last possible token.
  torch::Tensor last_possible = torch::searchsorted(cdf, total, /*out_int32=*/false, /*right=*/false);  // [R, 1]
  return torch::minimum(picked, last_possible).squeeze(1);  // [R]
}

torch::Tensor select_next_tokens(const torch::Tensor& logits, const core::GenerationConfig& config,
                                 std::vector<at::Generator>& row_generators) {
  if (!config.do_sample) return logits.argmax(1);  // [B]
  const int64_t rows = logits.size(0);
  DSCHAT_CHECK(static_cast<int64_t>(row_generators.size()) == rows, InvalidArgument, "sampling: ",
               row_generators.size(), " row generators for ", rows, " rows of logits");
  std::vector<torch::Tensor> uniforms;  // [1] per row, each from its own generator
  uniforms.reserve(rows);
  for (auto& generator : row_generators) {
    uniforms.push_back(
        torch::rand({1}, generator, torch::dtype(torch::kFloat64).device(generator.device())).to(logits.device()));
  }
  return draw_by_inverse_cdf(logits.softmax(1), torch::cat(uniforms));  // [B]
}

uint64_t row_seed(uint64_t seed, int64_t row) {
  // SplitMix64 (Steele, Lea, Flood 2014) over seed + golden-ratio steps: nearby seeds and rows
  // give unrelated streams, and row 0 of seed s is not seed s itself.
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (static_cast<uint64_t>(row) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::vector<at::Generator> make_row_generators(const torch::Device& device, uint64_t seed, int64_t rows,
                                               int64_t first_row) {
  std::vector<at::Generator> generators;
  generators.reserve(rows);
  for (int64_t r = 0; r < rows; ++r) generators.push_back(make_sampling_generator(device, row_seed(seed, first_row + r)));
  return generators;
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
