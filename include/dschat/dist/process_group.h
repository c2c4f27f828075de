#pragma once
// Collectives across the ranks of a job, on LibTorch's own c10d: a TCPStore for the rendezvous
// (rank 0 serves it at MASTER_ADDR:MASTER_PORT), ProcessGroupGloo for CPU tensors and, in builds
// with CUDA when asked for, ProcessGroupNCCL for CUDA tensors. Each call is routed by the device of
// its tensors.
//
// Every call is blocking (for NCCL: enqueued on the current CUDA stream, as torch.distributed
// does), except the start_* calls, and must be made by all ranks in the same order. A rank
// that dies or stops answering does not hang the others: the Gloo transport and the store give up
// after `timeout`, and the call throws core::Error naming the operation. The communicator is
// unusable after that.
//
// Naming the lost rank: each rank bumps a heartbeat counter in the store every 0.5 s from a thread
// of its own. When a collective fails, the rank closes its Gloo connections at once (so the peers
// still waiting on it fail now rather than at their timeout), compares the counters 1.5 s apart
// (a collective that ran into its timeout was already sampled during its last seconds: no extra
// wait) and appends what it found to the message: "lost rank 2 (its heartbeat in the store
// stopped ...)", or that no heartbeat stopped (a rank is alive but did not join the collective),
// or that the store itself is gone (rank 0 serves it, unless torchrun's agent does). Rank 0's
// destructor keeps the store up for up to 4 s after a failure, until the other ranks have read
// it. NCCL failures are reported by NCCL's own watchdog instead.
// A world of one needs no network: collectives are identities.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dschat/dist/launch_env.h"

namespace dschat {
namespace dist {

enum class Backend {
  Gloo,  // CPU tensors only
  Nccl,  // CUDA tensors through NCCL, CPU tensors through Gloo (torch's "cpu:gloo,cuda:nccl")
};

enum class ReduceOp { Sum, Max, Avg };

/// DeepSpeed's default_pg_timeout.
constexpr std::chrono::milliseconds kDefaultCollectiveTimeout = std::chrono::minutes(30);

class Communicator;

/// A collective started by one of Communicator's start_* calls and not yet waited for. Movable;
/// a default-constructed or already waited one holds nothing.
class PendingCollective {
 public:
  PendingCollective();
  PendingCollective(PendingCollective&&) noexcept;
  /// Waits for the collective this handle held before (errors stay with the communicator).
  PendingCollective& operator=(PendingCollective&&) noexcept;
  /// Waits if wait() was not called; a failure cannot be thrown from here, so it only makes the
  /// communicator unusable (its next call throws, naming the failed operation).
  ~PendingCollective();

  /// Blocks until the collective is done (NCCL: until it is enqueued on the current stream), then
  /// runs its local epilogue (the division of an Avg, the rank-ordered sum of a Gloo
  /// reduce-scatter); throws core::Error like the blocking calls when it failed. A second call
  /// does nothing.
  void wait();

 private:
  friend class Communicator;
  struct State;
  explicit PendingCollective(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

class Communicator {
 public:
  /// Joins the job described by `env`. Blocks until all world_size ranks have connected to the
  /// store, or throws core::Error after `timeout`. Backend::Nccl throws core::Unsupported in
  /// builds without CUDA.
  static Communicator create(const LaunchEnv& env, Backend backend = Backend::Gloo,
                             std::chrono::milliseconds timeout = kDefaultCollectiveTimeout);

  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  ~Communicator();

  int64_t rank() const;
  int64_t world_size() const;
  Backend backend() const;
  std::chrono::milliseconds timeout() const;

  /// In place, elementwise over ranks. Avg is a sum divided by world_size (floating dtypes only).
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);

  /// all_reduce that returns at once, with start_all_gather_into's rules; an Avg is divided when
  /// the handle is waited.
  PendingCollective start_all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);

  /// In place: every rank ends with rank `src`'s values.
  void broadcast(at::Tensor& tensor, int64_t src);

  /// output [world * n] <- input [n] of every rank, in rank order. Both contiguous, same dtype.
  void all_gather_into(at::Tensor& output, const at::Tensor& input);

  /// all_gather_into that returns at once: the transfer runs in the background until the handle is
  /// waited (or destroyed). Neither tensor may be touched before that. Collectives started later
  /// may complete first, but every rank must still start them in the same order. The handle keeps
  /// the communicator's state alive, so it may outlive the Communicator object.
  PendingCollective start_all_gather_into(at::Tensor& output, const at::Tensor& input);

  /// output [n] <- sum over ranks r of input_r[rank * n, (rank + 1) * n); input [world * n].
  void reduce_scatter(at::Tensor& output, const at::Tensor& input);

  /// reduce_scatter that returns at once, with start_all_gather_into's rules. On Gloo (an
  /// all-to-all, then a local sum in rank order) the sum runs when the handle is waited.
  PendingCollective start_reduce_scatter(at::Tensor& output, const at::Tensor& input);

  /// Uneven reduce-scatter (MPI's recvcounts): input [sum(counts)] is world consecutive segments,
  /// segment r having counts[r] elements; output [counts[rank]] <- the sum over ranks of their
  /// segment `rank`. `counts` (world_size entries, >= 0) must be the same on every rank; a rank
  /// whose count is 0 still takes part. An all-to-all plus a local sum in rank order on both
  /// backends (on Gloo the same values as reduce_scatter's, bit for bit).
  PendingCollective start_reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                         const std::vector<int64_t>& counts);

  /// Returns once every rank has entered it.
  void barrier();

  /// A communicator over `ranks` of this one (ascending, distinct, this rank among them), numbered
  /// by their order there: torch.distributed.new_group's, e.g. DeepSpeed's tensor-parallel groups
  /// of consecutive ranks. Only the ranks in `ranks` call it, in the same order as the group's
  /// other members call theirs (the n-th call of each member makes the n-th group); they connect
  /// through this communicator's store, blocking until all have (or throwing after the timeout).
  /// Its collectives involve its ranks only; same backend and timeout. Throws
  /// core::InvalidArgument for a list that breaks these rules.
  Communicator subgroup(const std::vector<int64_t>& ranks);

 private:
  struct Impl;
  friend class PendingCollective;
  explicit Communicator(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // shared with the PendingCollective handles
};

}  // namespace dist
}  // namespace dschat
