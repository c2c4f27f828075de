#include "dschat/serve/batch_scheduler.h"

#include <algorithm>

#include "core/log.h"
#include "serve/batch_run.h"

namespace dschat {
namespace serve {
namespace {

const char* const kStoppingMessage = "the server is stopping";

// The server reports its own figures; the engine's per-call statistics line would flood the log.
inference::InferenceEngineOptions quiet(inference::InferenceEngineOptions options) {
  options.log_stats = false;
  return options;
}

}  // namespace

SchedulerCounters& SchedulerCounters::operator+=(const SchedulerCounters& other) {
  queued += other.queued;
  running_rows += other.running_rows;
  requests_total += other.requests_total;
  completed_total += other.completed_total;
  cancelled_total += other.cancelled_total;
  rejected_total += other.rejected_total;
  failed_total += other.failed_total;
  generated_tokens_total += other.generated_tokens_total;
  batches_total += other.batches_total;
  return *this;
}

BatchScheduler::BatchScheduler(models::CausalLM model, tokenizer::Tokenizer tokenizer,
                               inference::InferenceEngineOptions engine_options, SchedulerOptions options)
    : tokenizer_(std::move(tokenizer)),
      engine_(model, quiet(engine_options)),
      options_(options),
      context_tokens_(std::min(engine_options.max_out_tokens, model->config().max_position_embeddings)),
      max_out_tokens_(engine_options.max_out_tokens) {
  DSCHAT_CHECK(options_.max_batch_rows >= 1, InvalidArgument, "max_batch_rows must be at least 1, got ",
               options_.max_batch_rows);
  DSCHAT_CHECK(options_.max_queue >= 1, InvalidArgument, "max_queue must be at least 1, got ", options_.max_queue);
  DSCHAT_CHECK(options_.batch_window.count() >= 0, InvalidArgument, "batch_window must be >= 0 ms, got ",
               options_.batch_window.count());
  worker_ = std::thread([this] { work(); });
}

BatchScheduler::~BatchScheduler() { stop(); }

void BatchScheduler::submit(std::shared_ptr<GenerationRequest> request) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    DSCHAT_CHECK(!stopping_, InvalidArgument, kStoppingMessage);
    if (static_cast<int64_t>(queue_.size()) >= options_.max_queue) {
      ++counters_.rejected_total;
      throw QueueFull(core::detail::str_cat("the request queue is full (", options_.max_queue,
                                            " requests wait); retry later"));
    }
    ++counters_.requests_total;
    queue_.push_back(Queued{std::move(request), std::chrono::steady_clock::now()});
  }
  wake_.notify_all();
}

void BatchScheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
    abort_running_ = true;
    for (auto& queued : queue_) queued.request->fail(kStoppingMessage);
    queue_.clear();
    for (auto& request : running_) request->fail(kStoppingMessage);
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

SchedulerCounters BatchScheduler::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  SchedulerCounters counters = counters_;
  counters.queued = static_cast<int64_t>(queue_.size());
  return counters;
}

std::vector<std::shared_ptr<GenerationRequest>> BatchScheduler::take_batch() {
  std::vector<std::shared_ptr<GenerationRequest>> batch;
  int64_t rows = 0, longest_prompt = 0, longest_answer = 0;
  for (auto it = queue_.begin(); it != queue_.end();) {
    GenerationRequest& request = *it->request;
    if (request.cancelled()) {  // its client left while it waited
      ++counters_.cancelled_total;
      it = queue_.erase(it);
      continue;
    }
    const int64_t prompt = std::max(longest_prompt, request.longest_prompt());
    const int64_t answer = std::max(longest_answer, request.params().max_tokens);
    // The head always fits (submit's caller checked it alone); others join while the batch holds them.
    if (batch.empty() || (rows + request.rows() <= options_.max_batch_rows && prompt + answer <= max_out_tokens_)) {
      rows += request.rows();
      longest_prompt = prompt;
      longest_answer = answer;
      batch.push_back(it->request);
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  return batch;
}

void BatchScheduler::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    // The batch window: the first request waits a few milliseconds for others to share its steps.
    const auto deadline = queue_.front().arrival + options_.batch_window;
    wake_.wait_until(lock, deadline, [&] {
      int64_t rows = 0;
      for (const auto& queued : queue_) rows += queued.request->rows();
      return stopping_ || rows >= options_.max_batch_rows;
    });
    if (stopping_) return;
    running_ = take_batch();
    if (running_.empty()) continue;
    int64_t rows = 0;
    for (const auto& request : running_) rows += request->rows();
    counters_.running_rows = rows;
    ++counters_.batches_total;
    lock.unlock();
    run_batch(running_);
    lock.lock();
    running_.clear();
    counters_.running_rows = 0;
  }
}

void BatchScheduler::run_batch(const std::vector<std::shared_ptr<GenerationRequest>>& batch) {
  int64_t tokens = 0, cancelled = 0, failed = 0;
  try {
    BatchRun run(batch, tokenizer_, engine_.model()->parameters().front().device(), abort_running_);
    run.run(engine_);
    tokens = run.generated_tokens();
    cancelled = run.cancelled_requests();
  } catch (const std::exception& e) {
    // One failed batch fails its requests, not the server: the next batch starts afresh.
    core::log_warn("serve: a batch of ", batch.size(), " requests failed: ", e.what());
    for (const auto& request : batch) request->fail(std::string("generation failed: ") + e.what());
    failed = static_cast<int64_t>(batch.size());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  counters_.generated_tokens_total += tokens;
  counters_.cancelled_total += cancelled;
  counters_.failed_total += failed;
  counters_.completed_total += static_cast<int64_t>(batch.size()) - cancelled - failed;
}

}  // namespace serve
}  // namespace dschat
