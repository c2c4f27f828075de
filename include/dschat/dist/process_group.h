#pragma once
// Collectives across the ranks of a job, on LibTorch's own c10d: a TCPStore for the rendezvous
// (rank 0 serves it at MASTER_ADDR:MASTER_PORT), ProcessGroupGloo for CPU tensors and, in builds
// with CUDA when asked for, ProcessGroupNCCL for CUDA tensors. Each call is routed by the device of
// its tensors.
//
// Every call is blocking (for NCCL: enqueued on the current CUDA stream, as torch.distributed
// does) and must be made by all ranks in the same order. A rank that dies or stops answering
// does not hang the others: the Gloo transport and the store give up after `timeout`, and the
// call throws core::Error naming the operation. The communicator is unusable after that.
// A world of one needs no network: collectives are identities.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

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

  /// In place: every rank ends with rank `src`'s values.
  void broadcast(at::Tensor& tensor, int64_t src);

  /// output [world * n] <- input [n] of every rank, in rank order. Both contiguous, same dtype.
  void all_gather_into(at::Tensor& output, const at::Tensor& input);

  /// output [n] <- sum over ranks r of input_r[rank * n, (rank + 1) * n); input [world * n].
  void reduce_scatter(at::Tensor& output, const at::Tensor& input);

  /// Returns once every rank has entered it.
  void barrier();

 private:
  struct Impl;
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dist
}  // namespace dschat
