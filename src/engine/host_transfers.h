#pragma once
// Copies between a CUDA device and host memory that do not stall the training step (internal to
// the training engine): ZeRO-Offload's gradient and parameter traffic, and the step's one
// device->host read.
//
// Why: a blocking device->host copy waits for everything queued on the stream before it, and a
// copy from pageable host memory blocks the CPU thread. DeepSpeed's ZeRO-Offload copies the
// reduced gradient partitions into pinned host buffers asynchronously during backward and copies
// the updated parameters back without blocking after the CPU Adam step; these are those copies.
//
// Every class here also takes CPU tensors and then does the plain synchronous thing, so CPU-only
// runs go through the same calls with the same results. The CUDA parts are compiled only into
// CUDA builds (DSCHAT_WITH_CUDA), behind pointers, so this header means the same to every
// translation unit.

#include <torch/torch.h>

#include <cstdint>
#include <memory>

namespace dschat {
namespace engine {

/// Additions `target += source` of gradients reduced on a CUDA device into a host partition,
/// queued so that the device->host copies overlap with the compute that follows.
///
/// add() copies `source` into a pinned staging buffer on a side stream, after the work already
/// queued on the current stream (which produced it), and returns. complete() waits for those
/// copies only and performs the additions in the order they were queued, so every element gets
/// the same additions in the same order as synchronous copies would give: the same bits. A
/// `source` already on the target's device (a CPU run) is added at once.
///
/// Staging costs host memory: up to one backward's share of gradients, pinned (the caching host
/// allocator keeps it for the next step). A pinned target that is still all zeros (the window's
/// first contribution, add_to_zeros()) needs none: the copy lands in it directly.
class HostGradientQueue {
 public:
  HostGradientQueue();
  ~HostGradientQueue();
  HostGradientQueue(const HostGradientQueue&) = delete;
  HostGradientQueue& operator=(const HostGradientQueue&) = delete;

  /// target [n] (host), source [n]; `source` may be freed by the caller right after.
  void add(torch::Tensor target, torch::Tensor source);
  /// add() for a target of zeros that no other addition touches (a gradient partition created
  /// for this window). A pinned target receives the copy directly, leaving nothing to add: the
  /// result differs from 0 + source only in the sign of a zero (-0 arrives as -0), which no
  /// later arithmetic of the step can tell apart. Otherwise exactly add().
  void add_to_zeros(torch::Tensor target, torch::Tensor source);
  /// Waits for the queued copies and adds them into their targets, in queue order.
  void complete();
  /// Drops the queued additions (their gradients are being dropped). Does not wait.
  void discard();
  bool empty() const;
  /// Bytes of pinned staging memory held by queued additions.
  int64_t staged_bytes() const;

 private:
  // Queues target += source, or target = source when `copy_into_target` (a pinned target of zeros).
  void queue(torch::Tensor target, torch::Tensor source, bool copy_into_target);

  struct State;
  std::unique_ptr<State> state_;
};

/// dst.copy_(src) for a host `src` and a CUDA `dst` without blocking the host: `src` is cast to
/// dst's dtype on the CPU (which also halves a bf16/fp16 transfer) into a pinned staging buffer,
/// and the copy is queued on the current stream, ahead of whatever reads `dst` next. `src` may be
/// modified as soon as this returns. Every other pairing is a plain copy_.
void copy_to_device(torch::Tensor& dst, const torch::Tensor& src);

/// One device->host read that waits for nothing queued after it: the constructor queues the copy
/// of `values` (behind the work that computes it) and get() waits for that copy alone, so work
/// queued in between keeps the device busy meanwhile. CPU tensors are read as they are.
class HostRead {
 public:
  explicit HostRead(const torch::Tensor& values);
  ~HostRead();
  HostRead(const HostRead&) = delete;
  HostRead& operator=(const HostRead&) = delete;

  /// The values on the host (same shape and dtype); the first call waits for the copy.
  const torch::Tensor& get();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace engine
}  // namespace dschat
