#include "dschat/serve/batch_scheduler.h"

#include <algorithm>

#include "core/log.h"
#include "serve/request_rows.h"

namespace dschat {
namespace serve {
namespace {

const char* const kStoppingMessage = "the server is stopping";

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
  steps_total += other.steps_total;
  prefilled_tokens_total += other.prefilled_tokens_total;
  cached_prompt_tokens_total += other.cached_prompt_tokens_total;
  return *this;
}

BatchScheduler::BatchScheduler(models::CausalLM model, tokenizer::Tokenizer tokenizer,
                               inference::InferenceEngineOptions engine_options, SchedulerOptions options)
    : tokenizer_(std::move(tokenizer)),
      model_(model),
      options_(options),
      context_tokens_(std::min(engine_options.max_out_tokens, model->config().max_position_embeddings)) {
  DSCHAT_CHECK(options_.max_batch_rows >= 1, InvalidArgument, "max_batch_rows must be at least 1, got ",
               options_.max_batch_rows);
  DSCHAT_CHECK(options_.max_queue >= 1, InvalidArgument, "max_queue must be at least 1, got ", options_.max_queue);
  DSCHAT_CHECK(options_.batch_window.count() >= 0, InvalidArgument, "batch_window must be >= 0 ms, got ",
               options_.batch_window.count());
  DSCHAT_CHECK(engine_options.max_out_tokens >= 2, InvalidArgument, "max_out_tokens must be at least 2, got ",
               engine_options.max_out_tokens);
  DSCHAT_CHECK(options_.kv_cache_memory >= 0, InvalidArgument, "kv_cache_memory must be >= 0 bytes, got ",
               options_.kv_cache_memory);
  engine_options_.max_running_sequences = options_.max_batch_rows;
  engine_options_.prefix_caching = options_.prefix_caching;
  engine_options_.batched_prefill = options_.batched_prefill;
  engine_options_.enable_cuda_graph = engine_options.enable_cuda_graph;
  // By default half the rows at their full context: most answers end long before it.
  engine_options_.size_pool(options_.kv_cache_memory, std::max<int64_t>(1, options_.max_batch_rows / 2),
                            engine_options.max_out_tokens);
  engine_ = std::make_unique<inference::ContinuousEngine>(model_, engine_options_);
  rows_ = std::make_unique<RequestRows>(tokenizer_);
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

void BatchScheduler::admit_queued() {
  int64_t rows = rows_->open_rows();
  for (auto it = queue_.begin(); it != queue_.end();) {
    GenerationRequest& request = *it->request;
    if (request.cancelled()) {  // its client left while it waited
      ++counters_.cancelled_total;
      it = queue_.erase(it);
      continue;
    }
    // Arrival order: a request that does not fit yet holds back the ones behind it.
    if (rows + request.rows() > options_.max_batch_rows) break;
    rows += request.rows();
    try {
      if (rows_->add(it->request, *engine_)) {
        running_.push_back(it->request);
      } else {
        ++counters_.completed_total;  // echo only: answered without the engine
      }
    } catch (const std::exception& e) {  // the engine refused it (the handler's checks passed)
      it->request->fail(std::string("generation failed: ") + e.what());
      ++counters_.failed_total;
    }
    it = queue_.erase(it);
  }
  counters_.running_rows = rows_->open_rows();
}

void BatchScheduler::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || engine_->has_work(); });
    if (stopping_) break;
    if (!engine_->has_work()) {
      // An idle engine: the first arrival waits a few milliseconds for others to start with it.
      const auto deadline = queue_.front().arrival + options_.batch_window;
      wake_.wait_until(lock, deadline, [&] {
        int64_t rows = 0;
        for (const auto& queued : queue_) rows += queued.request->rows();
        return stopping_ || rows >= options_.max_batch_rows;
      });
      if (stopping_) break;
      admit_queued();
      if (!engine_->has_work()) continue;  // every queued request was cancelled or refused
      ++counters_.batches_total;
    } else {
      admit_queued();
    }
    lock.unlock();
    run_step();
    lock.lock();
  }
  // stop() failed the requests; the engine's rows go with it.
  rows_->clear();
}

void BatchScheduler::run_step() {
  std::vector<std::pair<std::shared_ptr<GenerationRequest>, bool>> done;
  std::string failure;
  const inference::ContinuousStats before = engine_->stats();
  try {
    engine_->step();
    done = rows_->on_step(*engine_, abort_running_.load());
  } catch (const std::exception& e) {
    failure = e.what();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.steps_total;
  counters_.prefilled_tokens_total += engine_->stats().prefill_tokens - before.prefill_tokens;
  counters_.cached_prompt_tokens_total += engine_->stats().prefix_hit_tokens - before.prefix_hit_tokens;
  if (!failure.empty()) {
    fail_running(failure);
    return;
  }
  for (const auto& [request, gone] : done) {
    ++(gone ? counters_.cancelled_total : counters_.completed_total);
    running_.erase(std::remove(running_.begin(), running_.end(), request), running_.end());
  }
  counters_.generated_tokens_total = generated_before_reset_ + rows_->generated_tokens();
  counters_.running_rows = rows_->open_rows();
}

void BatchScheduler::fail_running(const std::string& message) {
  // One failed step fails the requests in the engine, not the server: the engine starts afresh.
  core::log_warn("serve: a step over ", running_.size(), " requests failed: ", message);
  for (const auto& request : rows_->clear()) request->fail(std::string("generation failed: ") + message);
  counters_.failed_total += static_cast<int64_t>(running_.size());
  running_.clear();
  generated_before_reset_ = counters_.generated_tokens_total;
  engine_ = std::make_unique<inference::ContinuousEngine>(model_, engine_options_);
  rows_ = std::make_unique<RequestRows>(tokenizer_);
  counters_.running_rows = 0;
}

}  // namespace serve
}  // namespace dschat
