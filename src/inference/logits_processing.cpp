#include "dschat/inference/logits_processing.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <map>
#include <vector>

#include "dschat/core/error.h"

#ifdef DSCHAT_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace dschat {
namespace inference {

namespace {

torch::Tensor add_logit_bias(const torch::Tensor& logits, const std::map<int64_t, double>& bias) {
  std::vector<int64_t> ids;
  std::vector<float> values;
  for (const auto& [id, value] : bias) {
    DSCHAT_CHECK(id >= 0 && id < logits.size(1), InvalidArgument, "logit_bias: token id ", id,
                 " is outside the vocabulary (", logits.size(1), " ids)");
    ids.push_back(id);
    values.push_back(static_cast<float>(value));
  }
  torch::Tensor index = torch::tensor(ids, torch::kInt64).to(logits.device());                           // [K]
  torch::Tensor added =
      torch::tensor(values).to(logits.device(), logits.scalar_type()).expand({logits.size(0), -1});  // [B, K]
  return logits.index_add(1, index, added);
}

}  // namespace

torch::Tensor process_logits(torch::Tensor logits, const torch::Tensor& seen, const core::GenerationConfig& config,
                             int64_t generated) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  // vLLM's order: the bias, then the repetition penalty over prompt and answer, then OpenAI's
  // frequency and presence penalties over the answer (Hugging Face's sequence_bias also comes
  // before its repetition penalty).
  if (!config.logit_bias.empty()) logits = add_logit_bias(logits, config.logit_bias);
  if (config.repetition_penalty != 1.0) {
    torch::Tensor picked = logits.gather(1, seen);  // [B, S]
    picked = torch::where(picked < 0, picked * config.repetition_penalty, picked / config.repetition_penalty);
    logits = logits.scatter(1, seen, picked);
  }
  if (config.frequency_penalty != 0.0 || config.presence_penalty != 0.0) {
    DSCHAT_CHECK(generated >= 0 && generated <= seen.size(1), InvalidArgument, "process_logits: ", generated,
                 " generated tokens but only ", seen.size(1), " seen");
    torch::Tensor answer = seen.narrow(1, seen.size(1) - generated, generated);  // [B, generated]
    torch::Tensor counts =  // [B, V]: how often each token was generated
        torch::zeros_like(logits).scatter_add(1, answer, torch::ones_like(answer, logits.options()));
    if (config.frequency_penalty != 0.0) logits = logits - counts * config.frequency_penalty;
    if (config.presence_penalty != 0.0) {
      logits = logits - (counts > 0).to(logits.scalar_type()) * config.presence_penalty;
    }
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
  if (config.top_p < 1.0) logits = logits.masked_fill(outside_top_p(logits, config.top_p), kMasked);
  return logits;
}

namespace {

// The smallest probability top-p keeps in one row: the probability of the first token (in
// descending order) at which the mass so far reaches top_p. A quickselect that partitions by a
// pivot and keeps only the side holding that token, so O(V) expected instead of a sort.
// `values` is scratch (the row's probabilities, reordered).
float top_p_threshold(std::vector<float>& values, double top_p) {
  double needed = top_p;  // mass still to collect from the region [begin, end)
  auto begin = values.begin(), end = values.end();
  float threshold = *std::min_element(begin, end);  // if rounding leaves the mass short: keep all
  while (begin != end) {
    // Median of three as the pivot.
    const float a = *begin, b = *(begin + (end - begin) / 2), c = *(end - 1);
    const float pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));
    auto greater_end = std::partition(begin, end, [&](float x) { return x > pivot; });
    auto equal_end = std::partition(greater_end, end, [&](float x) { return x == pivot; });
    double greater = 0.0;
    for (auto it = begin; it != greater_end; ++it) greater += *it;
    if (greater >= needed) {  // the boundary token is among the greater ones
      end = greater_end;
      continue;
    }
    const double equal = static_cast<double>(pivot) * static_cast<double>(equal_end - greater_end);
    if (greater + equal >= needed) return pivot;
    needed -= greater + equal;
    threshold = pivot;
    begin = equal_end;
  }
  return threshold;
}

}  // namespace

torch::Tensor outside_top_p(const torch::Tensor& logits, double top_p) {
  if (!logits.device().is_cpu()) return outside_top_p_by_topk(logits, top_p);
  torch::Tensor probabilities = logits.to(torch::kFloat32).softmax(1).contiguous();  // [B, V]
  const int64_t rows = probabilities.size(0), vocab = probabilities.size(1);
  torch::Tensor thresholds = torch::empty({rows, 1}, probabilities.options());  // [B, 1]
  const float* probability = probabilities.data_ptr<float>();
  float* threshold = thresholds.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t first, int64_t last) {
    std::vector<float> values(static_cast<size_t>(vocab));
    for (int64_t r = first; r < last; ++r) {
      std::copy(probability + r * vocab, probability + (r + 1) * vocab, values.begin());
      threshold[r] = top_p_threshold(values, top_p);
    }
  });
  return probabilities < thresholds;  // ties at the threshold are kept
}

torch::Tensor outside_top_p_by_topk(const torch::Tensor& logits, double top_p) {
  // In descending order a token is kept when the mass of the tokens before it is < top_p. Only the
  // first tokens in descending order can be kept, so the most likely k (topk, no full sort) decide
  // it once they hold at least top_p of the mass; k grows 4x until they do (a flat distribution
  // with top_p near 1 ends in the whole vocabulary).
  const int64_t vocab = logits.size(1);
  torch::Tensor probabilities = logits.softmax(1);  // [B, V]
  int64_t k = std::min<int64_t>(vocab, 64);
  for (;;) {
    auto [mass, candidates] = probabilities.topk(k, 1, /*largest=*/true, /*sorted=*/true);  // [B, k] each
    torch::Tensor before = mass.cumsum(1) - mass;  // [B, k]: the mass of the candidates before each
    const bool decided = k == vocab || (mass.sum(1) >= top_p).all().item<bool>();
    if (decided) {
      torch::Tensor kept = before < top_p;  // [B, k]
      kept.select(1, 0).fill_(true);        // the best token always stays
      torch::Tensor drop = torch::ones_like(logits, torch::kBool);  // [B, V]
      return drop.scatter(1, candidates, kept.logical_not());
    }
    k = std::min(vocab, k * 4);
  }
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
