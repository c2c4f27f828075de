#pragma once
// Communicator's state, shared by process_group.cpp (the blocking calls) and
// pending_collective.cpp (the start_* calls and the handles of started collectives, which keep it
// alive).

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "dschat/dist/process_group.h"
#include "error_text.h"
#include "peer_monitor.h"

namespace dschat {
namespace dist {

struct Communicator::Impl {
  int64_t rank = 0;
  int64_t world_size = 1;
  Backend backend = Backend::Gloo;
  std::chrono::milliseconds timeout{0};
  bool serves_store = false;                     // rank 0, unless torchrun's agent serves it
  c10::intrusive_ptr<c10d::Store> store;         // null in a world of one
  c10::intrusive_ptr<c10d::Backend> cpu_group;   // Gloo; dropped after a failure (closes its sockets)
  c10::intrusive_ptr<c10d::Backend> cuda_group;  // NCCL, only with Backend::Nccl
  std::unique_ptr<PeerMonitor> monitor;          // null in a world of one
  int in_flight = 0;                             // collectives started and not yet waited for
  std::string failed_operation;                  // set once a collective failed
  LaunchEnv env;                                 // how this communicator was made (its subgroups' devices)
  int64_t subgroups = 0;                         // subgroup() calls so far (each one's store prefix)

  /// After a failure, rank 0 keeps serving the store a little for the others' diagnoses.
  ~Impl();

  /// Throws core::Error once a collective failed: the ranks no longer agree on the sequence.
  void check_usable(const char* op) const;
  /// The group for the tensor's device (after check_usable).
  c10d::Backend& group_for(const at::Tensor& tensor, const char* op);

  /// Bracket every collective (the heartbeat thread samples peers during long ones).
  void started();
  void finished();

  /// Marks the communicator failed, drops the Gloo group, names the lost rank, throws core::Error.
  [[noreturn]] void fail(const char* op, const std::exception& error);

  /// Starts one collective and waits for it.
  void run(const char* op, const std::function<c10::intrusive_ptr<c10d::Work>()>& start);
  /// Starts one collective and returns its work without waiting; counted in flight until the
  /// handle is waited. Throws core::Error (and marks the communicator failed) if it cannot start.
  c10::intrusive_ptr<c10d::Work> start(const char* op, const std::function<c10::intrusive_ptr<c10d::Work>()>& launch);
};

struct PendingCollective::State {
  std::shared_ptr<Communicator::Impl> impl;
  c10::intrusive_ptr<c10d::Work> work;
  const char* op = "";
  at::Tensor output, input;        // kept alive until the transfer is done
  std::function<void()> epilogue;  // local work after the transfer (Avg's division, Gloo's sum)
};

// Argument checks shared by the blocking and the start_* calls (throw core::InvalidArgument).
void check_dense(const at::Tensor& tensor, const char* op, const char* name);
void check_pair(const at::Tensor& output, const at::Tensor& input, const char* op);

}  // namespace dist
}  // namespace dschat
