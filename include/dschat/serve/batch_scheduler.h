#pragma once
// Serves one model: a bounded queue of GenerationRequests and one worker thread that runs a
// ContinuousEngine (inference/continuous_engine.h): iteration-level batching, so a request joins
// the running rows at the next decode step instead of waiting for a batch to end.
//
//   queue ──(rows fit: running + its n x prompts <= max_batch_rows)──> engine ──step()──> tokens
//
// - Requests move from the queue into the engine in arrival order whenever their rows fit beside
//   the running ones (max_batch_rows); a request that does not fit waits (its rows never exceed
//   max_batch_rows, the handler checked). When the engine is idle, the first arrival waits up to
//   batch_window for company, so a burst starts together. Each engine step admits and prefills
//   the newcomers, decodes one token for every running row and retires the finished ones.
// - Every row samples with its own request's settings and a generator seeded from the request's
//   seed and its choice index (request_rows.h), so a seeded request's answer does not depend on
//   what it ran beside (up to the last bits of the batched matmuls), and its answers stream back
//   as they are decoded.
// - The KV cache is a pool of 16-token blocks (kv_cache_memory; by default half of max_batch_rows
//   rows of max_out_tokens: few rows use their whole context); rows take blocks as they grow and
//   free them at once, and a row that finds none free preempts the latest admitted one, which
//   is recomputed when rows free up.
// - Prefix caching (on unless prefix_caching is false): a prompt's full blocks stay in the pool
//   after its rows end, so a later prompt with the same start (a system prompt, a chat's earlier
//   turns and answers) prefills only the rest; unheld cached blocks are evicted, least recently
//   used first, when rows need room.
// - A cancelled request (its client went away) ends its rows at the next step; one still queued
//   is dropped before it reaches the engine. Beyond max_queue waiting requests, submit() throws
//   QueueFull: memory stays bounded by max_queue requests and the pool.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "dschat/core/error.h"
#include "dschat/inference/continuous_engine.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/models/causal_lm.h"
#include "dschat/serve/generation_request.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace serve {

class RequestRows;  // private (src/serve/request_rows.h)

struct SchedulerOptions {
  int64_t max_batch_rows = 64;                  // rows (prompts x n) decoded together at most
  int64_t kv_cache_memory = 0;                  // bytes of the KV block pool; 0: half of
                                                // max_batch_rows full rows (max_out_tokens each)
  std::chrono::milliseconds batch_window{5};    // how long a request arriving at an idle engine waits for company
  int64_t max_queue = 64;                       // requests waiting beyond the running batch
  bool prefix_caching = true;                   // reuse the KV blocks of earlier prompts' prefixes
  bool batched_prefill = true;                  // a step's prompts prefilled in one forward
};

/// Figures since the scheduler started (plus the two gauges queued and running_rows).
struct SchedulerCounters {
  int64_t queued = 0, running_rows = 0;
  int64_t requests_total = 0, completed_total = 0, cancelled_total = 0, rejected_total = 0, failed_total = 0;
  int64_t generated_tokens_total = 0;
  int64_t batches_total = 0;  // busy periods: times the engine started from idle (requests that
                              // arrive together, or join running rows, share one)
  int64_t steps_total = 0;    // engine steps (one decode forward each, plus the newcomers' prefills)
  int64_t prefilled_tokens_total = 0;      // prompt tokens run through prefill forwards
  int64_t cached_prompt_tokens_total = 0;  // prompt tokens taken from the prefix cache instead

  /// Adds every field (the server's totals over its models).
  SchedulerCounters& operator+=(const SchedulerCounters& other);
};

/// submit() on a full queue.
class QueueFull : public core::Error {
 public:
  using core::Error::Error;
};

class BatchScheduler {
 public:
  BatchScheduler(models::CausalLM model, tokenizer::Tokenizer tokenizer,
                 inference::InferenceEngineOptions engine_options, SchedulerOptions options);
  ~BatchScheduler();  // stop()
  BatchScheduler(const BatchScheduler&) = delete;
  BatchScheduler& operator=(const BatchScheduler&) = delete;

  /// Queues `request` (already validated against context_tokens() and max_batch_rows); throws
  /// QueueFull when max_queue requests wait, core::InvalidArgument after stop().
  void submit(std::shared_ptr<GenerationRequest> request);
  /// Fails every queued and running request ("the server is stopping") and joins the worker.
  void stop();

  SchedulerCounters counters() const;
  /// Prompt + answer tokens one row may hold: max_out_tokens and the position table's limit.
  int64_t context_tokens() const { return context_tokens_; }
  int64_t max_batch_rows() const { return options_.max_batch_rows; }
  const tokenizer::Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  struct Queued {
    std::shared_ptr<GenerationRequest> request;
    std::chrono::steady_clock::time_point arrival;
  };
  void work();
  /// Moves queued requests whose rows fit into the engine (mutex_ held).
  void admit_queued();
  /// One engine step and its tokens streamed out; a throwing engine fails its requests.
  void run_step();
  void fail_running(const std::string& message);

  tokenizer::Tokenizer tokenizer_;
  models::CausalLM model_;
  inference::ContinuousEngineOptions engine_options_;
  std::unique_ptr<inference::ContinuousEngine> engine_;  // the worker's only (rebuilt after a failure)
  std::unique_ptr<RequestRows> rows_;                    // the worker's only
  const SchedulerOptions options_;
  const int64_t context_tokens_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Queued> queue_;      // guarded by mutex_
  SchedulerCounters counters_;    // guarded by mutex_
  bool stopping_ = false;         // guarded by mutex_
  std::atomic<bool> abort_running_{false};  // read by the worker at every step
  std::vector<std::shared_ptr<GenerationRequest>> running_;  // in the engine; guarded by mutex_
  int64_t generated_before_reset_ = 0;  // tokens of engines dropped after a failure; guarded by mutex_
  std::thread worker_;
};

}  // namespace serve
}  // namespace dschat
