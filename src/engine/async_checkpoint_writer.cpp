#include "dschat/engine/async_checkpoint_writer.h"

#include <string>

#include <torch/torch.h>

#include "core/log.h"
#include "dschat/core/error.h"
#include "dschat/dist/process_group.h"

namespace dschat {
namespace engine {

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    if (!queue_.empty()) core::log_warn("checkpoint writer: ", queue_.size(), " queued checkpoint part(s) dropped");
    queue_.clear();
  }
  cancelled_.store(true);
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (failure_) {
    try {
      std::rethrow_exception(failure_);
    } catch (const std::exception& e) {
      core::log_warn("checkpoint writer: a background checkpoint write failed and was never waited for: ", e.what());
    }
  }
}

void AsyncCheckpointWriter::submit(Job job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!running_ && queue_.empty()) cancelled_.store(false);
    queue_.push_back(std::move(job));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  changed_.notify_all();
}

void AsyncCheckpointWriter::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return queue_.empty() && !running_; });
  if (failure_) {
    std::exception_ptr failure = failure_;
    failure_ = nullptr;
    std::rethrow_exception(failure);
  }
}

bool AsyncCheckpointWriter::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return queue_.empty() && !running_; });
}

std::exception_ptr AsyncCheckpointWriter::take_failure() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::exception_ptr failure = failure_;
  failure_ = nullptr;
  return failure;
}

bool AsyncCheckpointWriter::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return running_ || !queue_.empty();
}

void AsyncCheckpointWriter::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping
    Job job = std::move(queue_.front());
    queue_.pop_front();
    if (failure_) {  // skipped: a later part must not commit over a failed earlier one
      changed_.notify_all();
      continue;
    }
    running_ = true;
    lock.unlock();
    std::exception_ptr failure;
    try {
      job(cancelled_);
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    running_ = false;
    if (failure && !failure_) failure_ = failure;
    changed_.notify_all();
  }
}

void wait_for_checkpoint_writes(AsyncCheckpointWriter& writer, dist::Communicator* communicator) {
  if (communicator == nullptr || communicator->world_size() == 1) {
    writer.wait();
    return;
  }
  const int64_t world = communicator->world_size();
  std::exception_ptr failure;  // this rank's, kept until every rank has stopped writing
  while (true) {
    const bool idle = writer.wait_for(std::chrono::milliseconds(100));
    if (idle && !failure) failure = writer.take_failure();
    // [2 * world]: per rank, still writing; failed.
    torch::Tensor flags = torch::zeros({2 * world}, torch::kInt64);
    flags[communicator->rank()] = idle ? 0 : 1;
    flags[world + communicator->rank()] = failure ? 1 : 0;
    communicator->all_reduce(flags, dist::ReduceOp::Sum);
    std::string failed;
    for (int64_t r = 0; r < world; ++r) {
      if (flags[world + r].item<int64_t>() != 0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
    }
    // Every rank decides on the same all-reduced flags, so all leave after the same round.
    if (!failed.empty()) writer.abandon_waits();  // rank 0 stops waiting for a rank that failed
    if (flags.narrow(0, 0, world).sum().item<int64_t>() != 0) continue;
    if (failure) std::rethrow_exception(failure);
    if (failed.empty()) return;
    throw core::IoError("a checkpoint write failed on rank(s) " + failed +
                        " (see that rank's error); the previous checkpoint stays the latest");
  }
}

}  // namespace engine
}  // namespace dschat
