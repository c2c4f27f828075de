#pragma once
// Continuous (iteration-level) batching over a paged KV cache: the rollout engine.
//
//   ContinuousEngineOptions options;
//   options.kv_cache_memory = 256 << 20;          // the block pool's bytes
//   ContinuousEngine engine(model, options);
//   engine.submit(prompt_ids, config);             // any time, also between steps
//   while (engine.has_work()) for (auto& done : engine.step()) use(done);
//   GenerationResult out = engine.generate(ids, mask, config);  // InferenceEngine's contract
//
// Every step(): (1) goes on with prompts being prefilled in chunks, then admits waiting sequences
// in arrival order while the decode batch has room (max_running_sequences), the step's prefill
// token budget lasts (max_prefill_tokens) and the pool has blocks for the prompt; the step's
// prefills (the admitted prompts, a chunk of a prompt longer than the whole budget: chunked
// prefill, so running sequences keep decoding meanwhile) run together in one forward (a few when
// their lengths differ widely: padding at most doubles a forward's tokens), each row over its own
// cached tokens (PagedKvCache's padded frame; batched_prefill), and each admitted
// prompt is prefilled once: its n samples share its blocks by reference (copy-on-write of the
// last, partly filled one when a sample first writes to it); each sample
// draws its first token; when fewer rows are free than the prompt has samples, the others park
// (holding only the shared blocks) and take rows as they free up, before any later prompt is
// admitted. (2) Decodes one token for every sequence admitted in an earlier step, in
// one batched forward whose keys/values are read through the block tables (PagedKvCache). A
// sequence that needs a block when none is free preempts the most recently admitted sequence
// (vLLM's recompute preemption: its blocks are freed and it waits at the head of the queue to be
// prefilled again over its prompt and the tokens it had generated, which it keeps). (3) Retires
// sequences that emitted EOS (after min_new_tokens) or reached max_new_tokens, freeing their blocks
// at once.
//
// Sampling is per sequence: its own config (max/min_new_tokens, EOS, temperature, top-k, top-p,
// repetition penalty over its own tokens) and its own generator, sample j of a request seeded with
// row_seed(config.seed, j) unless the caller gives seeds. A sequence's tokens therefore depend on
// its prompt, config and seed only, not on what else is in the batch, when it arrived or whether
// it was preempted (up to the float rounding of a differently shaped forward; on the CPU a decode
// step of up to 8 rows is bitwise batch-invariant, docs/ops.md). generate() submits row r = b * n
// + j with row_seed(config.seed, r), the seed InferenceEngine gives that row, so both engines
// return the same ids (tests/inference/continuous_engine_test.cpp).
//
// With prefix_caching, full blocks outlive their sequences in a PrefixCache (prefix_cache.h): a
// prompt starting with cached tokens (a system prompt, a chat's earlier turns, a preempted
// sequence's own tokens) takes those blocks by reference and prefills only the rest, attending to
// them as cached keys; cached blocks nobody holds are evicted, least recently used first, before
// anything is preempted. A cached prefix changes the prefill's shapes, so ids equal the uncached
// engine's up to float rounding (greedy ids equal on every fixture; tests); set_model() empties it.
//
// Tensor-parallel shards (inference/tensor_parallel.h): every rank of the group runs its own
// engine over its shard on the same prompts; the scheduler's decisions depend only on the prompts,
// configs and the (identical) sampled tokens, so the ranks admit, preempt, cache and free the same
// blocks in the same steps and every forward's all-reduces pair up. Each rank's pool holds its own
// key/value heads.
//
// Lockstep (options.lockstep, data-parallel ranks with different prompts whose forwards are
// collective, ZeRO-3's layer gathers): before each forward the rank votes "forward" in an
// all-reduce; at the end of a step it votes "done" (and whether it has work left) until every rank
// is done, running an idle one-token forward (no cache) for each vote a rank with more forwards in
// this step wins. So every rank runs the same number of forwards, and generate() returns when no
// rank has work. With lockstep only generate() (or step() on every rank, until
// lockstep_work_left() is false on all) may be called.
//
// With enable_cuda_graph on a CUDA pool, decode steps replay CUDA graphs captured over a
// fixed-shape frame (rows and cached width rounded up to buckets; paged_decode_graph.h), the
// continuous counterpart of InferenceEngine's; prefills run eagerly. Not thread-safe.

#include <torch/torch.h>

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dschat/core/generation_config.h"
#include "dschat/dist/process_group.h"
#include "dschat/inference/generate.h"
#include "dschat/inference/generation_stats.h"
#include "dschat/inference/kv_block_pool.h"
#include "dschat/inference/prefix_cache.h"
#include "dschat/inference/token_constraint.h"
#include "dschat/inference/token_logprobs.h"
#include "dschat/models/causal_lm.h"

namespace dschat {
namespace inference {

struct ContinuousEngineOptions {
  int64_t block_size = 16;            // tokens per KV block
  int64_t kv_cache_memory = 64 << 20;  // bytes of the block pool (used when num_blocks is 0)
  int64_t num_blocks = 0;              // > 0: exactly this many blocks (tests force preemption)
  int64_t max_running_sequences = 8;   // rows of one decode step (<= ops::skinny_linear_auto_rows(): the
                                       // CPU's batch-invariant kernel)
  int64_t max_prefill_tokens = 512;    // prompt tokens prefilled per step (a longer prompt: in chunks)
  bool batched_prefill = true;         // one forward for all of a step's prefills; false: one per
                                       // prompt (each prefill's shapes then independent of the others)
  bool gather_for_attention = false;   // decode steps gather the blocks into a copy (the reference
                                       // path) instead of attending in place (ops::paged_decode_attention)
  bool prefix_caching = false;         // keep full blocks for later prompts with the same prefix
  /// Capture the decode step as CUDA graphs (CUDA pools only; ignored on CPU): one per bucket of
  /// rows (a power of two) and cached width (a power-of-two number of blocks), replayed over static
  /// buffers (src/inference/paged_decode_graph.h; a free pool block serves each step as scratch).
  /// Not with lockstep, layer-parameter hooks, a tensor-parallel shard or gather_for_attention.
  bool enable_cuda_graph = false;
  /// Run that fixed-shape decode layout eagerly, on any device and without capturing: checks its
  /// arithmetic where no GPU is present (the tests).
  bool fixed_frame_decode = false;
  /// Data-parallel ranks whose forwards are collective (ZeRO-3): every rank runs as many forwards
  /// as the busiest (idle ones where it has none). Not with a tensor-parallel shard.
  std::shared_ptr<dist::Communicator> lockstep;

  /// Sizes the pool by `memory_bytes` when > 0, else for `rows` sequences of `tokens` tokens
  /// (num_blocks): the hybrid engine's, dschat serve's and the planner's one rule.
  void size_pool(int64_t memory_bytes, int64_t rows, int64_t tokens);
  /// The pool's blocks for `config` in `dtype`: num_blocks when set, else what kv_cache_memory holds.
  int64_t pool_blocks(const core::ModelConfig& config, torch::ScalarType dtype) const;
};

/// Per-sample settings of one submit() (empty: the defaults).
struct SampleOptions {
  std::vector<uint64_t> seeds;           // sample j's generator seed
  std::vector<int64_t> max_new_tokens;   // sample j's own length limit (RLVR benchmarks force lengths)
  /// >= 0: every drawn token comes with its log-probability and the `logprobs` most likely tokens
  /// at its position (StepToken::logprobs; token_logprobs.h); -1: none.
  int64_t logprobs = -1;
  /// Which tokens may come next (token_constraint.h), shared by the request's samples; none: any.
  std::shared_ptr<const TokenConstraint> constraint;
};

/// One finished sequence.
struct SequenceOutput {
  int64_t request = 0;              // submit()'s return value
  int64_t sample = 0;               // j in [0, n)
  std::vector<int64_t> prompt;      // its prompt ids
  std::vector<int64_t> generated;   // its new tokens, EOS included when it ended on one
  bool ended_on_eos = false;        // else it reached max_new_tokens
  int64_t preemptions = 0;          // times it was preempted and recomputed
};

/// One token a sequence drew in a step (streaming callers read them all).
struct StepToken {
  int64_t request = 0, sample = 0;
  int64_t token = 0;
  bool finished = false;  // EOS or its max_new_tokens: the engine ended it in this step
  std::optional<ScoredToken> logprobs;  // when its request asked (SampleOptions::logprobs)
};

struct ContinuousStats {
  int64_t steps = 0;             // step() calls that ran a forward
  int64_t prefill_forwards = 0;  // forwards that prefilled (one per step with prefills, more when its
                                 // rows differ widely in length; batched_prefill off: one per row)
  int64_t prefill_rows = 0;      // prompts (or chunks of one) prefilled: one per admitted prompt (n
                                 // samples share it), recomputation or chunk
  int64_t prefill_tokens = 0;    // tokens those rows fed (padding not counted)
  int64_t decode_forwards = 0;   // batched decode forwards
  int64_t decode_rows = 0;       // rows over all decode forwards (the tokens they produced)
  int64_t generated_tokens = 0;  // new tokens of all sequences (decode rows + first tokens)
  int64_t preemptions = 0;
  int64_t peak_blocks_used = 0;  // most pool blocks sequences held at once (not counting cached
                                 // blocks only the prefix cache holds)
  int64_t copy_on_write = 0;     // blocks copied because a sample wrote into a shared one
  int64_t parked_samples = 0;    // samples prefilled with their prompt that waited for a free row
  int64_t prefix_hit_tokens = 0;  // prompt tokens taken from the prefix cache instead of prefilled
  int64_t idle_forwards = 0;      // lockstep: one-token forwards run while another rank had work
  int64_t cuda_graph_replays = 0;  // decode forwards served by a captured CUDA graph
};

class PagedDecodeGraphs;  // private (src/inference/paged_decode_graph.h)

class ContinuousEngine {
 public:
  ContinuousEngine(models::CausalLM model, ContinuousEngineOptions options = {});
  ~ContinuousEngine();
  ContinuousEngine(const ContinuousEngine&) = delete;
  ContinuousEngine& operator=(const ContinuousEngine&) = delete;

  /// Queues `prompt` (token ids, no padding) for config.num_return_sequences samples; sample j's
  /// generator is seeded with samples.seeds[j] when given (n of them), else row_seed(config.seed,
  /// j), and it stops after samples.max_new_tokens[j] tokens when given (each <=
  /// config.max_new_tokens), else config.max_new_tokens. Returns the request's id (0, 1, ... in
  /// submission order). Throws core::InvalidArgument for an empty prompt, n above
  /// max_running_sequences, per-sample lists of another length than n, or a prompt +
  /// max_new_tokens that the whole pool could not hold.
  int64_t submit(std::vector<int64_t> prompt, const core::GenerationConfig& config, const SampleOptions& samples = {});
  /// One iteration (admit, prefill, decode, retire); returns the sequences that finished in it.
  /// With lockstep it is collective (every rank calls it, also one without work).
  std::vector<SequenceOutput> step();
  /// Lockstep: whether some rank still had work after the last step() (true before the first).
  bool lockstep_work_left() const { return lockstep_work_left_; }
  /// Every token drawn in the last step(), in the order drawn.
  const std::vector<StepToken>& last_step_tokens() const { return step_tokens_; }
  /// Ends every sequence of `request` now (a client that left, a stop string): waiting ones leave
  /// the queue, running ones free their blocks. They are not reported by step(). Unknown or
  /// already finished requests are ignored.
  void cancel(int64_t request);
  /// Ends one sample of a request (the others go on).
  void cancel(int64_t request, int64_t sample);
  /// Every token of `ids` after the first with its log-probability given those before it and the
  /// `top` most likely tokens there (score_tokens on this engine's model and device: a prompt's
  /// scores, OpenAI's echo). Runs a forward outside the pool; not with lockstep.
  std::vector<ScoredToken> score_prompt(const std::vector<int64_t>& ids, int64_t top);
  /// Sequences waiting or running.
  bool has_work() const;
  /// Sequences waiting (not admitted, or preempted) and running (admitted, holding blocks).
  int64_t waiting_sequences() const;
  int64_t running_sequences() const;  // parked and those being prefilled in chunks included

  /// InferenceEngine::generate's contract: ids, mask [B, T] left-padded -> [B * n, T + N], prompt
  /// b's samples in rows [b * n, (b + 1) * n), pad (mask 0) after a row's end. Runs until done
  /// (with lockstep: until every rank is done). Input a rank rejects leaves nothing queued; with
  /// lockstep every rank then throws (core::InvalidArgument), before any forward.
  GenerationResult generate(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                            const core::GenerationConfig& config);

  /// Swaps in another model of the same shape (the hybrid engine's generation weights after a
  /// training step); the pool is kept when the model's layers, heads, dtype and device match it,
  /// else taken afresh. Needs an idle engine.
  void set_model(models::CausalLM model);
  /// DeepSpeed-Chat's generation figures of the last generate() call (its prefill_s is 0: the
  /// prefills interleave with decode steps).
  const GenerationStats& last_stats() const { return generation_stats_; }

  const KvBlockPool& pool() const { return *pool_; }
  /// The prefix cache (options().prefix_caching), else null.
  const PrefixCache* prefix_cache() const { return prefix_cache_.get(); }
  const ContinuousStats& stats() const { return stats_; }
  const ContinuousEngineOptions& options() const { return options_; }

 private:
  struct Sequence;
  /// The prefills of one step: the first chunks.size() groups of prefilling_, row i feeding
  /// chunks[i] tokens; extra_rows: decode rows their samples will take beyond the one each
  /// prefilling group already counts in active_rows().
  struct StepPrefills {
    std::vector<int64_t> chunks;
    int64_t extra_rows = 0;
  };
  /// Plans this step's chunks of the prefills under way (prefilling_), in admission order, while
  /// `budget` lasts.
  StepPrefills continue_prefills(int64_t& budget);
  /// Admits the first waiting group if a row, the budget and the blocks allow, adding its chunk.
  bool admit_next(int64_t& budget, StepPrefills& prefills);
  /// Whether a prompt prefilled in this step would give `tokens` more cached blocks than
  /// `cached_blocks` once its forward ran (then `tokens` waits a step, to share them).
  bool shares_a_pending_prefix(const std::vector<int64_t>& tokens, int64_t cached_blocks, const StepPrefills& prefills) const;
  /// Runs the planned prefills (one forward, or one per row) and hands every completed prompt's
  /// blocks to its samples (finish_prefill), in admission order.
  void run_prefills(const StepPrefills& prefills);
  /// Feeds rows [begin, end) of the planned prefills in one forward over their cached tokens;
  /// logits[i] = the last token's logits [1, V] of row i when that completes its tokens.
  void prefill_forward(const StepPrefills& prefills, int64_t begin, int64_t end, std::vector<torch::Tensor>& logits);
  void finish_prefill(std::vector<std::unique_ptr<Sequence>> group, const torch::Tensor& logits);
  /// A free block, evicting an unheld cached one when none is free; nullopt when neither.
  std::optional<int64_t> allocate_block();
  /// Blocks free now or after evicting the cached ones nobody holds.
  int64_t available_blocks() const;
  bool reserve_decode_slot(Sequence& sequence);
  void preempt(Sequence& victim);
  void decode(std::vector<Sequence*> rows);
  /// Whether decode steps run as CUDA graphs here (enable_cuda_graph, a CUDA pool, nothing that
  /// syncs with the host between layers); logs once at debug level when the option has no effect.
  bool graphs_apply();
  /// Draws each sequence's next token from its row of logits [S, V] and records it.
  void sample_into(const std::vector<Sequence*>& sequences, const torch::Tensor& logits);
  std::vector<SequenceOutput> retire_finished();
  /// step() without lockstep's end-of-step votes.
  std::vector<SequenceOutput> run_step();
  /// Lockstep: this rank's vote before one of its own forwards.
  void vote_for_forward();
  /// Lockstep: votes "done" (and has_work()) until no rank wants a forward, running an idle
  /// forward each time one does; records whether any rank has work left.
  void finish_lockstep_step();
  /// Submits every row of a generate() call (its request ids; ids and mask receive the host
  /// copies [B, T] int64 it read them from); on failure none stays queued.
  std::vector<int64_t> submit_rows(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                   const core::GenerationConfig& config, torch::Tensor& ids, torch::Tensor& mask);
  void free_blocks(Sequence& sequence);
  void cancel_where(const std::function<bool(const Sequence&)>& matches);
  int64_t blocks_for(int64_t tokens) const { return (tokens + options_.block_size - 1) / options_.block_size; }
  int64_t active_rows() const;  // running sequences that decode (not parked)
  /// Blocks sequences hold (cached blocks only the prefix cache holds are not counted: free on demand).
  int64_t blocks_in_use() const { return pool_->num_blocks() - available_blocks(); }

  models::CausalLM model_{nullptr};
  ContinuousEngineOptions options_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<PrefixCache> prefix_cache_;  // after pool_: destroyed (releasing its blocks) first
  std::unique_ptr<PagedDecodeGraphs> graphs_;  // after pool_ (it refers to it); made at the first use
  std::deque<std::vector<std::unique_ptr<Sequence>>> waiting_;  // groups: a request's n samples, or one preempted
  std::deque<std::vector<std::unique_ptr<Sequence>>> prefilling_;  // admitted groups whose prompt is
                                                                  // prefilled in chunks (front: the holder)
  std::vector<std::unique_ptr<Sequence>> running_;              // in admission order
  int64_t next_request_ = 0;
  int64_t parameters_ = 0;  // elements of model_'s parameters (the generation statistics)
  int64_t admissions_ = 0;  // admission counter: the latest admitted is preempted first
  bool lockstep_work_left_ = true;
  bool graph_skip_logged_ = false;  // enable_cuda_graph without effect is logged once
  ContinuousStats stats_;
  std::vector<StepToken> step_tokens_;
  GenerationStats generation_stats_;
};

}  // namespace inference
}  // namespace dschat
