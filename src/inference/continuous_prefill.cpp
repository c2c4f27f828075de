#include "dschat/inference/continuous_engine.h"

// ContinuousEngine's admission and prefill: the prefix cache's blocks first, the rest fed in one
// forward, or in chunks of the step's token budget over several steps when the prompt alone is
// longer than the budget (chunked prefill: decode steps go on meanwhile).

#include <algorithm>

#include "dschat/core/error.h"
#include "inference/continuous_sequence.h"
#include "dschat/inference/paged_kv_cache.h"

namespace dschat {
namespace inference {

bool ContinuousEngine::admit_next(int64_t& budget) {
  std::vector<std::unique_ptr<Sequence>>& group = waiting_.front();
  const int64_t rows = static_cast<int64_t>(group.size());
  const int64_t tokens = static_cast<int64_t>(group.front()->tokens.size());
  // A prompt is admitted when one row is free and no earlier prompt's samples are parked: the
  // samples beyond the free rows are prefilled with it and park (holding only its shared blocks)
  // until rows free up, so n samples never wait for n free rows at once.
  const int64_t active = active_rows();
  const bool any_parked = std::any_of(running_.begin(), running_.end(), [](const auto& s) { return s->parked; });
  if (any_parked || active + 1 > options_.max_running_sequences) return false;
  // The cached prefix (retained now, so eviction cannot take it), at most tokens - 1: the last
  // token is always fed, its logits give the first new token.
  std::vector<int64_t> cached =
      prefix_cache_ ? prefix_cache_->match(group.front()->tokens, (tokens - 1) / options_.block_size)
                    : std::vector<int64_t>();
  const int64_t cached_blocks = static_cast<int64_t>(cached.size());
  const int64_t fed = tokens - cached_blocks * options_.block_size;
  // Room for the prompt, and for each sample's next block unless nothing else runs (then the
  // group alone fits, submit() checked; a sample short of a block preempts a sibling).
  const int64_t needed = blocks_for(tokens) - cached_blocks + (running_.empty() ? 0 : rows);
  // A prompt longer than the whole budget starts now and goes on in chunks; one that fits the
  // budget but not what is left of it waits for the next step (it is then fed in one forward).
  const bool chunked = fed > options_.max_prefill_tokens;
  if ((!chunked && fed > budget) || available_blocks() < needed) {
    for (int64_t block : cached) pool_->release(block);
    return false;
  }
  std::vector<std::unique_ptr<Sequence>> admitted = std::move(group);
  waiting_.pop_front();
  Sequence& first = *admitted.front();
  first.cached = cached_blocks * options_.block_size;
  stats_.prefix_hit_tokens += first.cached;
  first.blocks = std::move(cached);
  while (static_cast<int64_t>(first.blocks.size()) < blocks_for(tokens)) {
    first.blocks.push_back(*allocate_block());  // counted above
  }
  stats_.peak_blocks_used = std::max(stats_.peak_blocks_used, blocks_in_use());
  prefilling_.push_back(std::move(admitted));
  advance_prefills(budget);
  return true;
}

void ContinuousEngine::advance_prefills(int64_t& budget) {
  while (!prefilling_.empty() && budget > 0) {
    Sequence& first = *prefilling_.front().front();
    const int64_t chunk = std::min(static_cast<int64_t>(first.tokens.size()) - first.cached, budget);
    budget -= chunk;
    const torch::Tensor logits = prefill_chunk(first, chunk);  // [1, V] once the prompt is in
    if (!logits.defined()) return;                             // the budget ran out mid-prompt
    std::vector<std::unique_ptr<Sequence>> group = std::move(prefilling_.front());
    prefilling_.pop_front();
    finish_prefill(std::move(group), logits);
  }
}

torch::Tensor ContinuousEngine::prefill_chunk(Sequence& first, int64_t chunk) {
  const int64_t tokens = static_cast<int64_t>(first.tokens.size());
  PagedKvCache cache(*pool_, {PagedKvCache::Row{&first.blocks, first.cached}}, chunk);
  const torch::Device device = pool_->storage().device();
  const std::vector<int64_t> fed(first.tokens.begin() + first.cached, first.tokens.begin() + first.cached + chunk);
  torch::Tensor ids = torch::tensor(fed, torch::kInt64).to(device).unsqueeze(0);  // [1, chunk]
  // No padding: over cached tokens the mask is all ones (a causal bias over cached + fed columns).
  if (options_.lockstep) vote_for_forward();
  torch::Tensor hidden =
      model_->hidden_states(ids, cache.attention_mask(), &cache, nn::MaskLayout::kUnpadded);  // [1, chunk, E]
  first.cached += chunk;
  ++stats_.prefill_forwards;
  stats_.prefill_tokens += chunk;
  // Its full blocks are cached now: a prompt admitted later in this step may share them already.
  if (prefix_cache_) prefix_cache_->insert(first.tokens, first.blocks, first.cached / options_.block_size);
  if (first.cached < tokens) return {};
  return model_->lm_logits(hidden.select(1, -1)).to(torch::kFloat32);  // [1, V]
}

void ContinuousEngine::finish_prefill(std::vector<std::unique_ptr<Sequence>> group, const torch::Tensor& logits) {
  Sequence& first = *group.front();
  std::vector<Sequence*> samples;
  for (auto& sequence : group) {
    if (sequence.get() != &first) {  // the samples share the prompt's blocks by reference
      sequence->blocks = first.blocks;
      for (int64_t block : sequence->blocks) pool_->retain(block);
    }
    sequence->cached = first.cached;
    sequence->admitted_at = admissions_++;
    sequence->fresh = true;
    sequence->parked = active_rows() >= options_.max_running_sequences;
    stats_.parked_samples += sequence->parked ? 1 : 0;
    samples.push_back(sequence.get());
    running_.push_back(std::move(sequence));
  }
  // The n samples draw their first tokens from the prompt's logits, each with its own generator.
  sample_into(samples, logits.expand({static_cast<int64_t>(samples.size()), logits.size(1)}));
  stats_.peak_blocks_used = std::max(stats_.peak_blocks_used, blocks_in_use());
}

}  // namespace inference
}  // namespace dschat
