#pragma once
// Background batch preparation: a Prefetcher calls a producer on its own thread and keeps up to
// `depth` finished batches ready, so tokenizing/collating the next batch overlaps the training
// step that consumes the current one (the role of DataLoader's worker prefetching).
//
//   data::Prefetcher<Batch> batches([&]() -> std::optional<Batch> { ... }, /*depth=*/2);
//   while (std::optional<Batch> batch = batches.next()) train_step(*batch);
//
// Guarantees:
// - Order: batches come out of next() in the order the producer returned them.
// - End: the producer returns std::nullopt once; it is not called again, and next() returns
//   std::nullopt from then on (after the batches produced before the end).
// - Errors: an exception thrown by the producer ends production; next() first hands out the
//   batches produced before it, then rethrows it — on that call and every later one.
// - Bound: the producer is called only while fewer than `depth` batches wait, so batches waiting
//   plus the one being produced never exceed `depth`: the producer is at most `depth` calls ahead
//   of the batches next() has handed out (with depth 1, batch k+1 is built while k is in use).
// - Shutdown: the destructor stops the thread without waiting for the queue to drain (the consumer
//   may stop early). It cannot interrupt a producer call already running; it waits for that call
//   to return and then discards its result. Nothing escapes the thread, so no std::terminate.
//
// next() may be called from any thread, including several; the producer only ever runs on the
// prefetch thread, one call at a time.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "dschat/core/error.h"

namespace dschat {
namespace data {

template <class Batch>
class Prefetcher {
 public:
  using Producer = std::function<std::optional<Batch>()>;

  /// Starts the prefetch thread, which calls `producer` right away. Throws core::InvalidArgument
  /// when depth < 1 or the producer is empty.
  Prefetcher(Producer producer, int64_t depth) : producer_(std::move(producer)), depth_(depth) {
    DSCHAT_CHECK(depth >= 1, InvalidArgument, "Prefetcher: depth must be >= 1, got ", depth);
    DSCHAT_CHECK(static_cast<bool>(producer_), InvalidArgument, "Prefetcher: producer is empty");
    worker_ = std::thread([this] { run(); });
  }

  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    space_available_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  Prefetcher(Prefetcher&&) = delete;  // the thread holds `this`
  Prefetcher& operator=(Prefetcher&&) = delete;

  /// Blocks until the next batch is ready; std::nullopt once the producer has reported the end.
  /// Rethrows the producer's exception after the batches produced before it.
  std::optional<Batch> next() {
    std::unique_lock<std::mutex> lock(mutex_);
    batch_ready_.wait(lock, [this] { return !ready_.empty() || done_; });
    if (!ready_.empty()) {
      std::optional<Batch> batch(std::move(ready_.front()));
      ready_.pop_front();
      lock.unlock();
      space_available_.notify_one();
      return batch;
    }
    if (error_) std::rethrow_exception(error_);
    return std::nullopt;
  }

  int64_t depth() const { return depth_; }

 private:
  void run() {
    // Everything, the queue push included, stays inside the try: an exception leaving a
    // std::thread's function would call std::terminate.
    try {
      while (true) {
        {
          std::unique_lock<std::mutex> lock(mutex_);
          space_available_.wait(lock, [this] { return stopping_ || static_cast<int64_t>(ready_.size()) < depth_; });
          if (stopping_) break;
        }
        // Produce without the lock so the consumer can take ready batches meanwhile.
        std::optional<Batch> batch = producer_();
        std::lock_guard<std::mutex> lock(mutex_);
        if (!batch || stopping_) break;
        ready_.push_back(std::move(*batch));
        batch_ready_.notify_one();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    batch_ready_.notify_all();
  }

  Producer producer_;
  const int64_t depth_;
  std::mutex mutex_;
  std::condition_variable batch_ready_;      // consumer waits: a batch arrived or production ended
  std::condition_variable space_available_;  // producer waits: the queue shrank or we are stopping
  std::deque<Batch> ready_;
  bool stopping_ = false;  // set by the destructor
  bool done_ = false;      // the thread will produce nothing more
  std::exception_ptr error_;
  std::thread worker_;  // last: starts after every member it touches exists
};

}  // namespace data
}  // namespace dschat
