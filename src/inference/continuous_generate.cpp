#include "dschat/inference/continuous_engine.h"

// ContinuousEngine::generate: InferenceEngine's batch contract on top of submit()/step().

#include <chrono>
#include <map>
#include <string>

#include "dschat/core/error.h"
#include "inference/continuous_sequence.h"
#include "dschat/inference/logits_processing.h"

namespace dschat {
namespace inference {

std::vector<int64_t> ContinuousEngine::submit_rows(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                                   const core::GenerationConfig& config, torch::Tensor& ids,
                                                   torch::Tensor& mask) {
  DSCHAT_CHECK(!has_work(), InvalidArgument, "continuous engine: generate() needs an idle engine (",
               waiting_.size(), " waiting, ", running_.size(), " running)");
  DSCHAT_CHECK(input_ids.dim() == 2 && input_ids.sizes() == attention_mask.sizes() && input_ids.size(0) > 0 &&
                   input_ids.size(1) > 0,
               InvalidArgument, "generate: input_ids ", input_ids.sizes(), " and attention_mask ",
               attention_mask.sizes(), " must both be [batch, tokens] with batch and tokens > 0");
  const int64_t prompts = input_ids.size(0), width = input_ids.size(1), n = config.num_return_sequences;
  ids = input_ids.to(torch::kCPU, torch::kInt64).contiguous();        // [B, T]
  mask = attention_mask.to(torch::kCPU, torch::kInt64).contiguous();  // [B, T]
  // Read in place, not one .item() (an ATen call) per token.
  const auto id_rows = ids.accessor<int64_t, 2>();
  const auto mask_rows = mask.accessor<int64_t, 2>();
  std::vector<int64_t> requests;
  try {
    for (int64_t b = 0; b < prompts; ++b) {
      std::vector<int64_t> prompt;  // the row's real tokens
      for (int64_t t = 0; t < width; ++t) {
        if (mask_rows[b][t] != 0) prompt.push_back(id_rows[b][t]);
      }
      std::vector<uint64_t> seeds;
      for (int64_t j = 0; j < n; ++j) seeds.push_back(row_seed(config.seed, b * n + j));
      requests.push_back(submit(std::move(prompt), config, SampleOptions{std::move(seeds), {}}));
    }
  } catch (...) {
    for (int64_t request : requests) cancel(request);  // a rejected row takes the call's others with it
    throw;
  }
  return requests;
}

GenerationResult ContinuousEngine::generate(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                            const core::GenerationConfig& config) {
  std::vector<int64_t> requests;
  torch::Tensor ids, mask;  // [B, T] int64 on the host, read once
  if (!options_.lockstep) {
    requests = submit_rows(input_ids, attention_mask, config, ids, mask);
  } else {
    // One vote before the first forward: a rank that rejects its input must not leave the others
    // waiting in a collective.
    std::string local_error;
    try {
      requests = submit_rows(input_ids, attention_mask, config, ids, mask);
    } catch (const std::exception& e) {
      local_error = e.what();
    }
    torch::Tensor rejected = torch::tensor({local_error.empty() ? int64_t{0} : int64_t{1}}, torch::kInt64);  // [1]
    options_.lockstep->all_reduce(rejected, dist::ReduceOp::Max);
    DSCHAT_CHECK(local_error.empty(), InvalidArgument, local_error);
    if (rejected.item<int64_t>() != 0) {
      for (int64_t request : requests) cancel(request);
      DSCHAT_CHECK(false, InvalidArgument,
                   "lockstep generate: another rank rejected its generate call (see its error); this rank stops too");
    }
  }
  const int64_t prompts = input_ids.size(0), width = input_ids.size(1), n = config.num_return_sequences;
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> answers;  // (prompt, sample) -> new tokens
  int64_t longest = 0;
  const auto start = std::chrono::steady_clock::now();
  auto forwards = [&] { return stats_.prefill_forwards + stats_.decode_forwards + stats_.idle_forwards; };
  const int64_t forwards_before = forwards(), hits_before = stats_.prefix_hit_tokens;
  lockstep_work_left_ = true;
  while (options_.lockstep ? lockstep_work_left_ : has_work()) {
    for (SequenceOutput& done : step()) {
      longest = std::max(longest, static_cast<int64_t>(done.generated.size()));
      answers[{done.request - requests.front(), done.sample}] = std::move(done.generated);
    }
  }
  GenerationStats& g = generation_stats_;
  g = GenerationStats{};
  g.batch = prompts * n;
  g.prefill_rows = prompts;
  g.prompt_tokens = width;
  g.new_tokens = longest;
  g.forward_steps = forwards() - forwards_before;  // idle lockstep forwards included
  g.cached_prompt_tokens = stats_.prefix_hit_tokens - hits_before;
  g.latency_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  g.parameters = parameters_;
  g.bytes_per_parameter = static_cast<int64_t>(pool_->storage().element_size());
  const core::ModelConfig& model_config = model_->config();
  finish_generation_stats(g, model_config.num_hidden_layers, model_config.hidden_size, model_config.vocab_size);
  const int64_t pad = config.pad_token_id.value_or(config.eos_token_id.value_or(0));
  const GenerationResult repeated = repeat_for_return_sequences(ids, mask, n);
  torch::Tensor sequences = torch::full({prompts * n, width + longest}, pad, torch::kInt64);  // [B * n, T + N]
  torch::Tensor out_mask = torch::zeros({prompts * n, width + longest}, torch::kInt64);        // [B * n, T + N]
  sequences.narrow(1, 0, width).copy_(repeated.sequences);
  out_mask.narrow(1, 0, width).copy_(repeated.attention_mask);
  for (const auto& [key, tokens] : answers) {
    const int64_t row = key.first * n + key.second, length = static_cast<int64_t>(tokens.size());
    sequences[row].narrow(0, width, length).copy_(torch::tensor(tokens, torch::kInt64));
    out_mask[row].narrow(0, width, length).fill_(1);
  }
  const torch::Device device = input_ids.device();
  return {sequences.to(device), out_mask.to(device)};
}

}  // namespace inference
}  // namespace dschat
