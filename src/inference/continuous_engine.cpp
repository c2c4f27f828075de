#include "dschat/inference/continuous_engine.h"

#include <algorithm>

#include "core/log.h"
#include "dschat/core/error.h"
#include "dschat/inference/logits_processing.h"
#include "dschat/inference/paged_kv_cache.h"
#include "inference/continuous_sequence.h"
#include "inference/paged_decode_graph.h"
#include "inference/row_sampling.h"

namespace dschat {
namespace inference {

void ContinuousEngineOptions::size_pool(int64_t memory_bytes, int64_t rows, int64_t tokens) {
  if (memory_bytes > 0) {
    kv_cache_memory = memory_bytes;
    num_blocks = 0;
  } else {
    num_blocks = rows * ((tokens + block_size - 1) / block_size);
  }
}

int64_t ContinuousEngineOptions::pool_blocks(const core::ModelConfig& config, torch::ScalarType dtype) const {
  return num_blocks > 0 ? num_blocks : KvBlockPool::blocks_for_memory(config, block_size, dtype, kv_cache_memory);
}

ContinuousEngine::ContinuousEngine(models::CausalLM model, ContinuousEngineOptions options) : options_(options) {
  DSCHAT_CHECK(options_.block_size >= 1 && options_.max_running_sequences >= 1 && options_.max_prefill_tokens >= 1,
               InvalidArgument, "continuous engine: block_size (", options_.block_size, "), max_running_sequences (",
               options_.max_running_sequences, ") and max_prefill_tokens (", options_.max_prefill_tokens,
               ") must be positive");
  set_model(std::move(model));
}

void ContinuousEngine::set_model(models::CausalLM model) {
  DSCHAT_CHECK(!model.is_empty(), InvalidArgument, "continuous engine: no model given");
  DSCHAT_CHECK(!options_.lockstep || model->backbone().tensor_parallel_group() == nullptr, InvalidArgument,
               "continuous engine: lockstep is for data-parallel ranks; a tensor-parallel group's ranks run one "
               "schedule and need none");
  DSCHAT_CHECK(!has_work(), InvalidArgument, "continuous engine: set_model() needs an idle engine");
  model_ = std::move(model);
  // Cached keys/values belong to the old weights (also when the same module was trained in place),
  // and captured graphs read the old parameters (and maybe the old pool) by address.
  graphs_.reset();
  prefix_cache_.reset();
  const torch::Tensor first = model_->parameters().front();  // a copy: parameters() is a temporary
  const core::ModelConfig& config = model_->config();
  parameters_ = 0;
  for (const auto& p : model_->parameters()) parameters_ += p.numel();
  const torch::Tensor& storage = pool_ ? pool_->storage() : torch::Tensor();
  if (pool_ && storage.size(0) == config.num_hidden_layers && storage.size(4) == config.num_key_value_heads &&
      storage.size(5) == config.head_dim && storage.scalar_type() == first.scalar_type() &&
      storage.device() == first.device()) {
    if (options_.prefix_caching) prefix_cache_ = std::make_unique<PrefixCache>(*pool_);
    return;  // the pool fits the new model as it is
  }
  const int64_t blocks = options_.pool_blocks(config, first.scalar_type());
  pool_.reset();  // the old pool goes first: the two never coexist
  pool_ = std::make_unique<KvBlockPool>(config, blocks, options_.block_size, first.scalar_type(), first.device());
  if (options_.prefix_caching) prefix_cache_ = std::make_unique<PrefixCache>(*pool_);
}

std::optional<int64_t> ContinuousEngine::allocate_block() {
  if (auto block = pool_->allocate()) return block;
  if (prefix_cache_ && prefix_cache_->evict_one()) return pool_->allocate();
  return std::nullopt;
}

int64_t ContinuousEngine::available_blocks() const {
  return pool_->free_blocks() + (prefix_cache_ ? prefix_cache_->evictable_blocks() : 0);
}

ContinuousEngine::~ContinuousEngine() = default;

std::vector<ScoredToken> ContinuousEngine::score_prompt(const std::vector<int64_t>& ids, int64_t top) {
  DSCHAT_CHECK(!options_.lockstep, Unsupported, "continuous engine: score_prompt is not collective (lockstep)");
  return score_tokens(model_, ids, top, pool_->storage().device());
}

bool ContinuousEngine::has_work() const { return !waiting_.empty() || !prefilling_.empty() || !running_.empty(); }

int64_t ContinuousEngine::running_sequences() const {
  int64_t sequences = static_cast<int64_t>(running_.size());
  for (const auto& group : prefilling_) sequences += static_cast<int64_t>(group.size());
  return sequences;
}

int64_t ContinuousEngine::submit(std::vector<int64_t> prompt, const core::GenerationConfig& config,
                                 const SampleOptions& samples) {
  core::validate_generation_config(config, "generation config");
  const int64_t n = config.num_return_sequences;
  const int64_t prompt_length = static_cast<int64_t>(prompt.size());
  DSCHAT_CHECK(prompt_length > 0, InvalidArgument, "continuous engine: empty prompt");
  DSCHAT_CHECK(n <= options_.max_running_sequences, InvalidArgument, "continuous engine: num_return_sequences (", n,
               ") exceeds max_running_sequences (", options_.max_running_sequences, ")");
  const std::vector<uint64_t>& seeds = samples.seeds;
  const std::vector<int64_t>& lengths = samples.max_new_tokens;
  DSCHAT_CHECK(seeds.empty() || static_cast<int64_t>(seeds.size()) == n, InvalidArgument, "continuous engine: ",
               seeds.size(), " seeds for ", n, " samples");
  DSCHAT_CHECK(lengths.empty() || static_cast<int64_t>(lengths.size()) == n, InvalidArgument,
               "continuous engine: ", lengths.size(), " max_new_tokens for ", n, " samples");
  DSCHAT_CHECK(samples.logprobs >= -1 && samples.logprobs <= kMaxTopLogprobs, InvalidArgument,
               "continuous engine: logprobs must be -1 (none) or in [0, ", kMaxTopLogprobs, "], got ", samples.logprobs);
  for (int64_t length : lengths) {
    DSCHAT_CHECK(length >= 1 && length <= config.max_new_tokens, InvalidArgument,
                 "continuous engine: a sample's max_new_tokens (", length, ") must be in [1, ", config.max_new_tokens,
                 "] (the config's)");
  }
  // The last token is sampled, never cached: a sequence holds at most prompt + max_new - 1 tokens.
  const int64_t most_blocks = blocks_for(prompt_length + config.max_new_tokens - 1);
  DSCHAT_CHECK(most_blocks <= pool_->num_blocks(), InvalidArgument, "continuous engine: prompt (", prompt_length,
               " tokens) + max_new_tokens (", config.max_new_tokens, ") needs ", most_blocks, " blocks of ",
               options_.block_size, " tokens, the pool holds ", pool_->num_blocks(),
               " (raise kv_cache_memory or num_blocks)");
  const torch::Device device = pool_->storage().device();
  const int64_t request = next_request_++;
  std::vector<std::unique_ptr<Sequence>> group;
  for (int64_t j = 0; j < n; ++j) {
    auto sequence = std::make_unique<Sequence>();
    sequence->request = request;
    sequence->sample = j;
    sequence->config = config;
    sequence->config.num_return_sequences = 1;
    if (!lengths.empty()) {
      sequence->config.max_new_tokens = lengths[j];
      sequence->config.min_new_tokens = std::min(config.min_new_tokens, lengths[j]);
    }
    sequence->tokens = prompt;
    sequence->prompt_length = prompt_length;
    sequence->logprobs = samples.logprobs;
    sequence->constraint = samples.constraint;
    if (config.do_sample) {
      sequence->generator.push_back(
          make_sampling_generator(device, seeds.empty() ? row_seed(config.seed, j) : seeds[j]));
    }
    group.push_back(std::move(sequence));
  }
  waiting_.push_back(std::move(group));
  return request;
}

int64_t ContinuousEngine::active_rows() const {
  // A prompt being prefilled in chunks keeps a row for its first sample.
  return static_cast<int64_t>(prefilling_.size()) +
         std::count_if(running_.begin(), running_.end(), [](const auto& s) { return !s->parked; });
}

int64_t ContinuousEngine::waiting_sequences() const {
  int64_t sequences = 0;
  for (const auto& group : waiting_) sequences += static_cast<int64_t>(group.size());
  return sequences;
}

void ContinuousEngine::cancel(int64_t request) {
  cancel_where([&](const Sequence& s) { return s.request == request; });
}

void ContinuousEngine::cancel(int64_t request, int64_t sample) {
  cancel_where([&](const Sequence& s) { return s.request == request && s.sample == sample; });
}

void ContinuousEngine::cancel_where(const std::function<bool(const Sequence&)>& matches) {
  for (auto& group : waiting_) {
    group.erase(std::remove_if(group.begin(), group.end(), [&](const auto& s) { return matches(*s); }), group.end());
  }
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), [](const auto& g) { return g.empty(); }),
                 waiting_.end());
  for (auto& group : prefilling_) {  // the front sequence holds the blocks: hand them on first
    auto kept = std::find_if(group.begin(), group.end(), [&](const auto& s) { return !matches(*s); });
    if (kept == group.end()) {
      free_blocks(*group.front());
    } else if (kept != group.begin()) {
      (*kept)->blocks = std::move(group.front()->blocks);
      (*kept)->cached = group.front()->cached;
      group.front()->blocks.clear();
    }
    group.erase(std::remove_if(group.begin(), group.end(), [&](const auto& s) { return matches(*s); }), group.end());
  }
  prefilling_.erase(std::remove_if(prefilling_.begin(), prefilling_.end(), [](const auto& g) { return g.empty(); }),
                    prefilling_.end());
  for (auto& sequence : running_) {
    if (matches(*sequence)) free_blocks(*sequence);
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(), [&](const auto& s) { return matches(*s); }),
                 running_.end());
}

std::vector<SequenceOutput> ContinuousEngine::step() {
  step_tokens_.clear();
  std::vector<SequenceOutput> done;
  if (has_work()) done = run_step();
  if (options_.lockstep) finish_lockstep_step();
  return done;
}

std::vector<SequenceOutput> ContinuousEngine::run_step() {
  torch::NoGradGuard no_grad;
  for (auto& sequence : running_) sequence->fresh = false;
  // Parked samples (a prompt's n samples when fewer rows were free) take free rows first.
  int64_t active = active_rows();
  for (auto& sequence : running_) {
    if (sequence->parked && active < options_.max_running_sequences) {
      sequence->parked = false;
      ++active;
    }
  }
  int64_t budget = options_.max_prefill_tokens;
  StepPrefills prefills = continue_prefills(budget);  // chunked prefills under way go first
  while (!waiting_.empty() && budget > 0 && admit_next(budget, prefills)) {
  }
  run_prefills(prefills);
  std::vector<Sequence*> rows;  // admitted in an earlier step, in admission order
  for (auto& sequence : running_) {
    if (!sequence->fresh && !sequence->finished && !sequence->parked) rows.push_back(sequence.get());
  }
  if (!rows.empty()) decode(std::move(rows));
  ++stats_.steps;
  return retire_finished();
}

bool ContinuousEngine::reserve_decode_slot(Sequence& sequence) {
  const int64_t index = sequence.cached / options_.block_size;  // the block the next token goes to
  const bool new_block = index == static_cast<int64_t>(sequence.blocks.size());
  if (!new_block && pool_->reference_count(sequence.blocks[index]) == 1) return true;
  while (true) {
    if (auto block = allocate_block()) {
      if (new_block) {
        sequence.blocks.push_back(*block);
      } else {  // copy-on-write: this sample's own copy of a block it shares
        pool_->copy_block(sequence.blocks[index], *block);
        pool_->release(sequence.blocks[index]);
        sequence.blocks[index] = *block;
        ++stats_.copy_on_write;
      }
      stats_.peak_blocks_used = std::max(stats_.peak_blocks_used, blocks_in_use());
      return true;
    }
    // The pool is full: recompute preemption of the latest admitted sequence (maybe this one).
    auto latest = std::max_element(running_.begin(), running_.end(), [](const auto& a, const auto& b) {
      return a->admitted_at < b->admitted_at;
    });
    Sequence& victim = **latest;
    const bool self = &victim == &sequence;
    preempt(victim);
    if (self) return false;
  }
}

void ContinuousEngine::preempt(Sequence& victim) {
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == &victim; });
  free_blocks(victim);
  victim.cached = 0;
  victim.fresh = false;
  victim.parked = false;
  ++victim.preemptions;
  ++stats_.preemptions;
  std::vector<std::unique_ptr<Sequence>> alone;
  alone.push_back(std::move(*it));
  running_.erase(it);
  waiting_.push_front(std::move(alone));  // victims are taken latest first: the earliest ends up first
}

void ContinuousEngine::decode(std::vector<Sequence*> rows) {
  std::vector<Sequence*> ready;
  for (Sequence* sequence : rows) {
    // A preemption may have taken a row listed earlier: only rows still running decode.
    const bool running = std::any_of(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == sequence; });
    if (running && reserve_decode_slot(*sequence)) ready.push_back(sequence);
  }
  ready.erase(std::remove_if(ready.begin(), ready.end(),
                             [&](Sequence* s) {
                               return std::none_of(running_.begin(), running_.end(),
                                                   [&](const auto& r) { return r.get() == s; });
                             }),
              ready.end());
  if (ready.empty()) return;
  const int64_t batch = static_cast<int64_t>(ready.size());
  std::vector<PagedKvCache::Row> table;
  std::vector<int64_t> last;  // [B] each row's uncached token
  for (Sequence* sequence : ready) {
    table.push_back({&sequence->blocks, sequence->cached});
    last.push_back(sequence->tokens.back());
  }
  if (options_.lockstep) vote_for_forward();
  torch::Tensor logits;  // [B, V]
  const bool use_graphs = graphs_apply();
  if (use_graphs || options_.fixed_frame_decode) {
    if (!graphs_) graphs_ = std::make_unique<PagedDecodeGraphs>(*pool_);
    const int64_t replays_before = graphs_->replays();
    logits = graphs_->step(model_, table, last, use_graphs);  // undefined: decode through the frame below
    stats_.cuda_graph_replays += graphs_->replays() - replays_before;
  }
  if (!logits.defined()) {
    PagedKvCache cache(*pool_, table, 1);
    cache.gather_for_attention = options_.gather_for_attention;
    torch::Tensor ids = torch::tensor(last, torch::kInt64).to(pool_->storage().device()).unsqueeze(1);  // [B, 1]
    torch::Tensor hidden =
        model_->hidden_states(ids, cache.attention_mask(), &cache, nn::MaskLayout::kLeftPadded);  // [B, 1, E]
    logits = model_->lm_logits(hidden.select(1, -1)).to(torch::kFloat32);                        // [B, V]
  }
  ++stats_.decode_forwards;
  stats_.decode_rows += batch;
  for (Sequence* sequence : ready) sequence->cached += 1;
  sample_into(ready, logits);
}

bool ContinuousEngine::graphs_apply() {
  const torch::Device device = pool_->storage().device();
  const models::Backbone& backbone = model_->backbone();
  const bool apply = options_.enable_cuda_graph && device.is_cuda() && PagedDecodeGraphs::compiled() &&
                     !options_.lockstep && !options_.gather_for_attention &&
                     backbone.layer_parameter_hooks() == nullptr && backbone.tensor_parallel_group() == nullptr;
  if (options_.enable_cuda_graph && !apply && !graph_skip_logged_) {
    graph_skip_logged_ = true;
    core::log_debug("continuous engine: enable_cuda_graph has no effect here (device ", device,
                    options_.lockstep ? ", lockstep" : "", ")");
  }
  return apply;
}

void ContinuousEngine::sample_into(const std::vector<Sequence*>& sequences, const torch::Tensor& logits) {
  std::vector<RowSampling> rows;
  for (Sequence* sequence : sequences) {
    rows.push_back(RowSampling{&sequence->config, sequence->generated(), &sequence->tokens,
                               sequence->generator.empty() ? at::Generator() : sequence->generator.front(),
                               sequence->constraint.get()});
  }
  // The raw distribution's log-probs, taken before sample_rows processes the logits.
  std::vector<int64_t> scored_rows, top;
  for (size_t r = 0; r < sequences.size(); ++r) {
    if (sequences[r]->logprobs < 0) continue;
    scored_rows.push_back(static_cast<int64_t>(r));
    top.push_back(sequences[r]->logprobs);
  }
  torch::Tensor log_probs;  // [R', V]: the rows that report log-probs
  if (!scored_rows.empty()) {
    torch::Tensor index = torch::tensor(scored_rows, torch::kInt64).to(logits.device());
    log_probs = torch::log_softmax(logits.index_select(0, index), /*dim=*/1);
  }
  const std::vector<int64_t> next = sample_rows(logits, rows);
  std::vector<ScoredToken> scored;
  if (!scored_rows.empty()) {
    std::vector<int64_t> drawn;
    for (int64_t r : scored_rows) drawn.push_back(next[static_cast<size_t>(r)]);
    scored = score_rows(log_probs, drawn, top);
  }
  size_t next_scored = 0;
  for (size_t r = 0; r < sequences.size(); ++r) {
    Sequence& sequence = *sequences[r];
    const core::GenerationConfig& config = sequence.config;
    sequence.tokens.push_back(next[r]);
    ++stats_.generated_tokens;
    sequence.ended_on_eos = config.eos_token_id && next[r] == *config.eos_token_id;
    sequence.finished = sequence.ended_on_eos || sequence.generated() >= config.max_new_tokens;
    StepToken step{sequence.request, sequence.sample, next[r], sequence.finished, std::nullopt};
    if (sequence.logprobs >= 0) step.logprobs = std::move(scored[next_scored++]);
    step_tokens_.push_back(std::move(step));
  }
}

void ContinuousEngine::free_blocks(Sequence& sequence) {
  // Its full blocks stay cached for later prompts (and for its own recompute when preempted).
  if (prefix_cache_) prefix_cache_->insert(sequence.tokens, sequence.blocks, sequence.cached / options_.block_size);
  for (int64_t block : sequence.blocks) pool_->release(block);
  sequence.blocks.clear();
}

std::vector<SequenceOutput> ContinuousEngine::retire_finished() {
  std::vector<SequenceOutput> done;
  for (auto& sequence : running_) {
    if (!sequence->finished) continue;
    free_blocks(*sequence);
    done.push_back(SequenceOutput{sequence->request, sequence->sample,
                                  std::vector<int64_t>(sequence->tokens.begin(),
                                                       sequence->tokens.begin() + sequence->prompt_length),
                                  std::vector<int64_t>(sequence->tokens.begin() + sequence->prompt_length,
                                                       sequence->tokens.end()),
                                  sequence->ended_on_eos, sequence->preemptions});
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& s) { return s->finished; }),
                 running_.end());
  return done;
}

}  // namespace inference
}  // namespace dschat
