#pragma once
// Serves one model: a bounded queue of GenerationRequests and one worker thread that takes them
// in batches and runs each batch as ONE InferenceEngine call, so concurrent requests share every
// decode step.
//
//   queue ──(first arrival + batch_window, or max_batch_rows reached)──> batch ──> engine.generate
//
// - A batch is formed from the queue in arrival order: every request that fits (rows up to
//   max_batch_rows; longest prompt + longest max_tokens within the engine's max_out_tokens) joins;
//   one that does not waits for the next batch. Requests that arrive while a batch runs wait for
//   it to end (static batching: no request joins a running batch).
// - Every row samples with its own request's settings and seeded generator (batch_run.h), so a
//   seeded request's answer does not depend on what it was batched with (up to the last bits of
//   the batched matmuls), and a request's answers stream back as they are decoded.
// - A cancelled request (its client went away) ends its rows at the next step; one still queued
//   is dropped when a batch is formed. Beyond max_queue waiting requests, submit() throws
//   QueueFull: memory stays bounded by max_queue requests and one batch.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "dschat/core/error.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/models/causal_lm.h"
#include "dschat/serve/generation_request.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace serve {

struct SchedulerOptions {
  int64_t max_batch_rows = 32;                  // rows (prompts x n) decoded together
  std::chrono::milliseconds batch_window{5};    // how long the first request waits for company
  int64_t max_queue = 64;                       // requests waiting beyond the running batch
};

/// Figures since the scheduler started (plus the two gauges queued and running_rows).
struct SchedulerCounters {
  int64_t queued = 0, running_rows = 0;
  int64_t requests_total = 0, completed_total = 0, cancelled_total = 0, rejected_total = 0, failed_total = 0;
  int64_t generated_tokens_total = 0, batches_total = 0;

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
  /// Prompt + answer tokens one row may hold: the KV workspace's and the position table's limit.
  int64_t context_tokens() const { return context_tokens_; }
  int64_t max_batch_rows() const { return options_.max_batch_rows; }
  const tokenizer::Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  struct Queued {
    std::shared_ptr<GenerationRequest> request;
    std::chrono::steady_clock::time_point arrival;
  };
  void work();
  std::vector<std::shared_ptr<GenerationRequest>> take_batch();  // mutex_ held
  void run_batch(const std::vector<std::shared_ptr<GenerationRequest>>& batch);

  tokenizer::Tokenizer tokenizer_;
  inference::InferenceEngine engine_;  // the worker's only
  const SchedulerOptions options_;
  const int64_t context_tokens_;
  const int64_t max_out_tokens_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Queued> queue_;      // guarded by mutex_
  SchedulerCounters counters_;    // guarded by mutex_
  bool stopping_ = false;         // guarded by mutex_
  std::atomic<bool> abort_running_{false};  // read by the running batch at every step
  std::vector<std::shared_ptr<GenerationRequest>> running_;  // guarded by mutex_
  std::thread worker_;
};

}  // namespace serve
}  // namespace dschat
