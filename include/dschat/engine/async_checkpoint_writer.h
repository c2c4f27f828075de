#pragma once
// The background thread of asynchronous checkpointing (DeepSpeed's async checkpoint engine,
// PyTorch DCP's async_save): a trainer snapshots its state into host memory, hands the write to
// this writer and goes on training. Jobs run one at a time in the order they were submitted, so
// the parts of one checkpoint (step 3: critic, EMA, then the actor whose tag decides) are
// committed in the order a synchronous save would commit them.
//
// One writer per trainer. The writer itself is not a collective: on several ranks,
// wait_for_checkpoint_writes makes the ranks agree on the outcome.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace dschat {
namespace dist {
class Communicator;
}  // namespace dist
namespace engine {

class AsyncCheckpointWriter {
 public:
  /// A job is told, through `cancelled`, when the writer is being destroyed: a job waiting for
  /// other ranks stops waiting and fails (its own files are finished first).
  using Job = std::function<void(const std::atomic<bool>& cancelled)>;

  AsyncCheckpointWriter() = default;
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;
  /// Finishes the running job with `cancelled` raised, drops the queued ones and joins. A
  /// checkpoint not committed by then stays uncommitted: `latest` names the previous one.
  ~AsyncCheckpointWriter();

  /// Queues `job` behind the ones submitted before (the thread starts on the first job).
  void submit(Job job);
  /// Blocks until every submitted job has run. Rethrows the first failure (once); the jobs queued
  /// behind a failed one are skipped, so a later part never commits over a missing earlier one.
  void wait();
  /// Waits at most `timeout` for every submitted job to have run; true when they have.
  bool wait_for(std::chrono::milliseconds timeout);
  /// The first failure since the last call (null: none), forgotten once returned.
  std::exception_ptr take_failure();
  /// Raises `cancelled` for the running and queued jobs (another rank failed, so rank 0 must stop
  /// waiting for it); lowered again by the next submit once the writer is idle.
  void abandon_waits() { cancelled_.store(true); }
  /// Whether a job is queued or running.
  bool busy() const;

 private:
  void run();

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> queue_;
  bool running_ = false;
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::atomic<bool> cancelled_{false};
  std::thread thread_;
};

/// Collective: every rank waits for its writer's jobs, and the ranks agree on the outcome without
/// waiting on each other's files: they exchange "still writing / failed" flags every 100 ms, and
/// once a rank has failed, the others' waits for it are abandoned. Throws core::IoError on every
/// rank when any rank's job failed (its own error, or the failing ranks' numbers). A null
/// communicator: a world of one.
void wait_for_checkpoint_writes(AsyncCheckpointWriter& writer, dist::Communicator* communicator);

}  // namespace engine
}  // namespace dschat
