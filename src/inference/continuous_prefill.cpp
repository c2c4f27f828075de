#include "dschat/inference/continuous_engine.h"

// ContinuousEngine's admission and prefill: the prefix cache's blocks first, the rest fed in one
// forward with the step's other prefills (batched prefill), or in chunks of the step's token
// budget over several steps when the prompt alone is longer than the budget (chunked prefill:
// decode steps go on meanwhile).

#include <algorithm>

#include "dschat/core/error.h"
#include "inference/continuous_sequence.h"
#include "dschat/inference/paged_kv_cache.h"

namespace dschat {
namespace inference {
namespace {

// A batched prefill forward computes rows x its longest chunk tokens: at most this many times the
// tokens its rows feed.
constexpr int64_t kMaxPrefillPadding = 2;

}  // namespace

ContinuousEngine::StepPrefills ContinuousEngine::continue_prefills(int64_t& budget) {
  StepPrefills prefills;
  for (const auto& group : prefilling_) {
    if (budget == 0) break;
    const Sequence& first = *group.front();
    const int64_t chunk = std::min(static_cast<int64_t>(first.tokens.size()) - first.cached, budget);
    budget -= chunk;
    prefills.chunks.push_back(chunk);
  }
  return prefills;
}

bool ContinuousEngine::admit_next(int64_t& budget, StepPrefills& prefills) {
  std::vector<std::unique_ptr<Sequence>>& group = waiting_.front();
  const int64_t rows = static_cast<int64_t>(group.size());
  const int64_t tokens = static_cast<int64_t>(group.front()->tokens.size());
  // A prompt is admitted when one row is free and no earlier prompt's samples are parked: the
  // samples beyond the free rows are prefilled with it and park (holding only its shared blocks)
  // until rows free up, so n samples never wait for n free rows at once. The prompts admitted in
  // this step count with all their samples, as if already prefilled.
  const int64_t active = active_rows() + prefills.extra_rows;
  const bool any_parked = std::any_of(running_.begin(), running_.end(), [](const auto& s) { return s->parked; });
  if (any_parked || active + 1 > options_.max_running_sequences) return false;
  // The cached prefix (retained now, so eviction cannot take it), at most tokens - 1: the last
  // token is always fed, its logits give the first new token.
  std::vector<int64_t> cached =
      prefix_cache_ ? prefix_cache_->match(group.front()->tokens, (tokens - 1) / options_.block_size)
                    : std::vector<int64_t>();
  const int64_t cached_blocks = static_cast<int64_t>(cached.size());
  const int64_t fed = tokens - cached_blocks * options_.block_size;
  // Room for the prompt, and for each sample's next block unless nothing else runs or is being
  // prefilled (then the group alone fits, submit() checked; a sample short of a block preempts a
  // sibling).
  const bool alone = running_.empty() && prefilling_.empty();
  const int64_t needed = blocks_for(tokens) - cached_blocks + (alone ? 0 : rows);
  // A prompt longer than the whole budget starts now and goes on in chunks; one that fits the
  // budget but not what is left of it waits for the next step (it is then fed in one forward).
  // So does one whose prefix a prompt of this step is about to cache.
  const bool chunked = fed > options_.max_prefill_tokens;
  if ((!chunked && fed > budget) || available_blocks() < needed ||
      (prefix_cache_ && shares_a_pending_prefix(group.front()->tokens, cached_blocks, prefills))) {
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
  const int64_t chunk = std::min(fed, budget);
  budget -= chunk;
  prefills.chunks.push_back(chunk);
  prefills.extra_rows += rows - 1;
  return true;
}

bool ContinuousEngine::shares_a_pending_prefix(const std::vector<int64_t>& tokens, int64_t cached_blocks,
                                               const StepPrefills& prefills) const {
  const int64_t block = options_.block_size;
  const int64_t most = (static_cast<int64_t>(tokens.size()) - 1) / block;  // blocks a prompt may take cached
  if (cached_blocks >= most) return false;
  for (size_t i = 0; i < prefills.chunks.size(); ++i) {
    const Sequence& pending = *prefilling_[i].front();
    const int64_t full = std::min((pending.cached + prefills.chunks[i]) / block, most);  // cached after the forward
    if (full <= cached_blocks) continue;
    // Equal through one block more than the cache gave: that block is cached after the forward.
    const int64_t span = (cached_blocks + 1) * block;
    if (std::equal(tokens.begin(), tokens.begin() + span, pending.tokens.begin())) return true;
  }
  return false;
}

void ContinuousEngine::run_prefills(const StepPrefills& prefills) {
  const int64_t count = static_cast<int64_t>(prefills.chunks.size());
  if (count == 0) return;
  std::vector<torch::Tensor> logits(count);  // [1, V] each, for the rows that complete their prompt
  // Consecutive rows share a forward while its padded tokens (rows x the longest chunk) stay
  // within twice its real ones: a 500-token chunk and ten 5-token prompts run as two forwards,
  // not one of 11 x 500 tokens.
  int64_t begin = 0, real = 0, longest = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t chunk = prefills.chunks[i];
    const bool fits = options_.batched_prefill &&
                      (i - begin + 1) * std::max(longest, chunk) <= kMaxPrefillPadding * (real + chunk);
    if (i > begin && !fits) {
      prefill_forward(prefills, begin, i, logits);
      begin = i;
      real = longest = 0;
    }
    real += chunk;
    longest = std::max(longest, chunk);
  }
  prefill_forward(prefills, begin, count, logits);
  // Only the last row can stop mid-prompt (the budget ran out there); the completed ones are the
  // front of prefilling_, finished in admission order.
  for (int64_t i = 0; i < count && logits[i].defined(); ++i) {
    std::vector<std::unique_ptr<Sequence>> group = std::move(prefilling_.front());
    prefilling_.pop_front();
    finish_prefill(std::move(group), logits[i]);
  }
}

void ContinuousEngine::prefill_forward(const StepPrefills& prefills, int64_t begin, int64_t end,
                                       std::vector<torch::Tensor>& logits) {
  std::vector<PagedKvCache::Row> table;
  std::vector<int64_t> fed;  // [R] tokens each row feeds
  for (int64_t i = begin; i < end; ++i) {
    Sequence& first = *prefilling_[i].front();
    table.push_back({&first.blocks, first.cached});
    fed.push_back(prefills.chunks[i]);
  }
  PagedKvCache cache(*pool_, table, fed);
  const int64_t rows = end - begin, width = cache.new_tokens();
  // Row r's chunk right-aligned in its `width` columns; the padding before it repeats its first id.
  std::vector<int64_t> ids_host(rows * width);  // [R * width]
  for (int64_t r = 0; r < rows; ++r) {
    const Sequence& first = *prefilling_[begin + r].front();
    const auto chunk = first.tokens.begin() + first.cached;
    std::fill_n(ids_host.begin() + r * width, width - fed[r], *chunk);
    std::copy(chunk, chunk + fed[r], ids_host.begin() + r * width + width - fed[r]);
  }
  const torch::Device device = pool_->storage().device();
  torch::Tensor ids = torch::tensor(ids_host, torch::kInt64).view({rows, width}).to(device);  // [R, width]
  // One row over its cached tokens has no padding: a causal bias over cached + fed columns.
  const nn::MaskLayout layout = cache.padded() ? nn::MaskLayout::kLeftPadded : nn::MaskLayout::kUnpadded;
  if (options_.lockstep) vote_for_forward();
  torch::Tensor hidden = model_->hidden_states(ids, cache.attention_mask(), &cache, layout);  // [R, width, E]
  ++stats_.prefill_forwards;
  std::vector<int64_t> complete;  // rows whose prompt is now fully cached
  for (int64_t r = 0; r < rows; ++r) {
    Sequence& first = *prefilling_[begin + r].front();
    first.cached += fed[r];
    ++stats_.prefill_rows;
    stats_.prefill_tokens += fed[r];
    // Its full blocks are cached now: a prompt admitted in a later step may share them.
    if (prefix_cache_) prefix_cache_->insert(first.tokens, first.blocks, first.cached / options_.block_size);
    if (first.cached == static_cast<int64_t>(first.tokens.size())) complete.push_back(r);
  }
  if (complete.empty()) return;
  torch::Tensor index = torch::tensor(complete, torch::kInt64).to(device);                       // [C]
  torch::Tensor last = hidden.select(1, width - 1).index_select(0, index);                      // [C, E]
  torch::Tensor complete_logits = model_->lm_logits(last).to(torch::kFloat32);                   // [C, V]
  for (size_t c = 0; c < complete.size(); ++c) {
    logits[begin + complete[c]] = complete_logits.narrow(0, static_cast<int64_t>(c), 1);  // [1, V]
  }
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
