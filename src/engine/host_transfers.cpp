#include "engine/host_transfers.h"

#include <optional>
#include <utility>
#include <vector>

#include "dschat/core/host_sync.h"

#ifdef DSCHAT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dschat {
namespace engine {

struct HostGradientQueue::State {
  // One queued addition whose source is being copied to the host.
  struct PendingAddition {
    torch::Tensor target;  // [n] host
    torch::Tensor staged;  // [n] pinned host written by the side stream's copy; undefined: it wrote target
#ifdef DSCHAT_WITH_CUDA
    at::cuda::CUDAEvent copied;  // recorded on the side stream after the copy
#endif
  };
  std::vector<PendingAddition> pending;  // in the order add() was called
#ifdef DSCHAT_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> side;  // from the pool, on the sources' device
#endif
};

HostGradientQueue::HostGradientQueue() : state_(std::make_unique<State>()) {}

// Queued copies still running write into pinned blocks that the caching host allocator keeps
// until their copy event has passed, and read device memory kept by record_stream: dropping the
// queue without waiting is safe.
HostGradientQueue::~HostGradientQueue() = default;

void HostGradientQueue::add(torch::Tensor target, torch::Tensor source) {
  queue(std::move(target), std::move(source), /*copy_into_target=*/false);
}

void HostGradientQueue::add_to_zeros(torch::Tensor target, torch::Tensor source) {
  // A copy into pageable memory would block the host, so only a pinned target takes it directly.
  const bool direct = source.is_cuda() && target.is_pinned();
  queue(std::move(target), std::move(source), direct);
}

void HostGradientQueue::queue(torch::Tensor target, torch::Tensor source, bool copy_into_target) {
  torch::NoGradGuard no_grad;
  if (source.device() == target.device()) {
    target.add_(source);
    return;
  }
#ifdef DSCHAT_WITH_CUDA
  if (source.is_cuda() && target.is_cpu()) {
    const c10::DeviceIndex device = source.device().index();
    if (!state_->side || state_->side->device_index() != device) {
      state_->side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device);
    }
    const c10::cuda::CUDAStream side = *state_->side;
    State::PendingAddition pending;
    pending.target = std::move(target);
    if (!copy_into_target) {
      pending.staged = torch::empty(source.sizes(), torch::dtype(source.scalar_type()).pinned_memory(true));
    }
    at::cuda::CUDAEvent produced;
    produced.record(c10::cuda::getCurrentCUDAStream(device));
    produced.block(side);  // the copy starts once the reduction that wrote `source` is done
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      (copy_into_target ? pending.target : pending.staged).copy_(source, /*non_blocking=*/true);
      pending.copied.record(side);
    }
    // The caller may free `source` now: its memory must not go to other work on the current
    // stream before the side stream has read it.
    source.record_stream(side);
    state_->pending.push_back(std::move(pending));
    return;
  }
#endif
  target.add_(source.to(target.device()));
}

void HostGradientQueue::complete() {
  if (state_->pending.empty()) return;
  torch::NoGradGuard no_grad;
  std::vector<State::PendingAddition> pending = std::move(state_->pending);
  state_->pending.clear();
  core::HostSync sync("optimizer offload (host waits for its gradient copies)");
  for (State::PendingAddition& addition : pending) {
#ifdef DSCHAT_WITH_CUDA
    addition.copied.synchronize();  // this copy only; the device keeps computing
#endif
    if (addition.staged.defined()) addition.target.add_(addition.staged);
  }
}

void HostGradientQueue::discard() { state_->pending.clear(); }

bool HostGradientQueue::empty() const { return state_->pending.empty(); }

int64_t HostGradientQueue::staged_bytes() const {
  int64_t bytes = 0;
  for (const State::PendingAddition& addition : state_->pending) {
    if (addition.staged.defined()) bytes += static_cast<int64_t>(addition.staged.nbytes());
  }
  return bytes;
}

void copy_to_device(torch::Tensor& dst, const torch::Tensor& src) {
  torch::NoGradGuard no_grad;
#ifdef DSCHAT_WITH_CUDA
  if (dst.is_cuda() && src.device().is_cpu()) {
    // The same CPU-side cast as a blocking copy_ does, so the same bits arrive. The staging block
    // goes back to the caching host allocator only after the copy has run.
    torch::Tensor staged =
        torch::empty(src.sizes(), torch::dtype(dst.scalar_type()).pinned_memory(true));  // [src shape]
    staged.copy_(src);
    dst.copy_(staged, /*non_blocking=*/true);
    return;
  }
#endif
  dst.copy_(src);
}

struct HostRead::State {
  torch::Tensor host;  // the values on the host; pinned while a copy fills it
#ifdef DSCHAT_WITH_CUDA
  std::optional<at::cuda::CUDAEvent> copied;  // pending until get() has waited for it
#endif
};

HostRead::HostRead(const torch::Tensor& values) : state_(std::make_unique<State>()) {
  torch::NoGradGuard no_grad;
#ifdef DSCHAT_WITH_CUDA
  if (values.is_cuda()) {
    state_->host = torch::empty(values.sizes(), torch::dtype(values.scalar_type()).pinned_memory(true));
    state_->host.copy_(values, /*non_blocking=*/true);  // on the current stream, behind its producer
    state_->copied.emplace();
    state_->copied->record(c10::cuda::getCurrentCUDAStream(values.device().index()));
    return;
  }
#endif
  state_->host = values.device().is_cpu() ? values : values.to(torch::kCPU);
}

HostRead::~HostRead() = default;

const torch::Tensor& HostRead::get() {
#ifdef DSCHAT_WITH_CUDA
  if (state_->copied) {
    state_->copied->synchronize();
    state_->copied.reset();
  }
#endif
  return state_->host;
}

}  // namespace engine
}  // namespace dschat
