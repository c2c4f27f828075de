// Collectives started without waiting (Communicator::start_*) and their handles. The transfer
// itself runs on the backend's own threads (Gloo's worker threads, NCCL's stream); what is left to
// do locally afterwards (an Avg's division, the rank-ordered sum of Gloo's reduce-scatter) is the
// handle's epilogue, run by wait() on the waiting thread.
#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "communicator_impl.h"
#include "dschat/core/error.h"

namespace dschat {
namespace dist {

PendingCollective::PendingCollective() = default;
PendingCollective::PendingCollective(std::unique_ptr<State> state) : state_(std::move(state)) {}
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;

PendingCollective& PendingCollective::operator=(PendingCollective&& other) noexcept {
  if (this != &other) {
    try {
      wait();
    } catch (const std::exception&) {  // recorded in the communicator: its next call reports it
    }
    state_ = std::move(other.state_);
  }
  return *this;
}

PendingCollective::~PendingCollective() {
  try {
    wait();
  } catch (const std::exception&) {  // recorded in the communicator: its next call reports it
  }
}

void PendingCollective::wait() {
  if (!state_) return;
  std::unique_ptr<State> state = std::move(state_);  // whatever happens, a second wait() is a no-op
  Communicator::Impl& impl = *state->impl;
  {
    struct Finish {
      Communicator::Impl& impl;
      ~Finish() { impl.finished(); }
    } finish{impl};
    try {
      state->work->wait();
    } catch (const std::exception& e) {
      state->work.reset();
      impl.fail(state->op, e);
    }
  }
  if (state->epilogue) state->epilogue();
}

PendingCollective Communicator::start_all_gather_into(at::Tensor& output, const at::Tensor& input) {
  check_pair(output, input, "all_gather_into");
  const int64_t n = input.numel();
  DSCHAT_CHECK(output.numel() == impl_->world_size * n, InvalidArgument, "dist::all_gather_into: output has ",
               output.numel(), " elements, expected world_size * input.numel() = ", impl_->world_size, " * ", n);
  at::Tensor flat_output = output.view({-1});  // [world * n]
  at::Tensor flat_input = input.view({-1});    // [n]
  if (impl_->world_size == 1) {
    flat_output.copy_(flat_input);
    return PendingCollective();
  }
  if (n == 0) return PendingCollective();
  c10d::Backend& group = impl_->group_for(input, "all_gather_into");
  auto state = std::make_unique<PendingCollective::State>();
  state->impl = impl_;
  state->op = "all_gather_into";
  state->output = flat_output;
  state->input = flat_input;
  state->work = impl_->start("all_gather_into", [&] { return group._allgather_base(flat_output, flat_input); });
  return PendingCollective(std::move(state));
}

PendingCollective Communicator::start_all_reduce(at::Tensor& tensor, ReduceOp op) {
  check_dense(tensor, "all_reduce", "tensor");
  DSCHAT_CHECK(op != ReduceOp::Avg || at::isFloatingType(tensor.scalar_type()), InvalidArgument,
               "dist::all_reduce: Avg needs a floating-point tensor, got ", tensor.scalar_type());
  if (impl_->world_size == 1 || tensor.numel() == 0) return PendingCollective();
  c10d::AllreduceOptions options;
  // Gloo has no AVG (NCCL-only in c10d): sum, then divide, the same on both backends.
  options.reduceOp = op == ReduceOp::Max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
  c10d::Backend& group = impl_->group_for(tensor, "all_reduce");
  auto state = std::make_unique<PendingCollective::State>();
  state->impl = impl_;
  state->op = "all_reduce";
  state->output = tensor;
  if (op == ReduceOp::Avg) {
    const int64_t world = impl_->world_size;
    state->epilogue = [tensor, world]() mutable { tensor.div_(world); };
  }
  state->work = impl_->start("all_reduce", [&] {
    std::vector<at::Tensor> tensors{tensor};
    return group.allreduce(tensors, options);
  });
  return PendingCollective(std::move(state));
}

PendingCollective Communicator::start_reduce_scatter(at::Tensor& output, const at::Tensor& input) {
  check_pair(output, input, "reduce_scatter");
  const int64_t n = output.numel();
  const int64_t world = impl_->world_size;
  DSCHAT_CHECK(input.numel() == world * n, InvalidArgument, "dist::reduce_scatter: input has ", input.numel(),
               " elements, expected world_size * output.numel() = ", world, " * ", n);
  if (world == 1 || n == 0 || !input.is_cuda()) {
    // Gloo's own reduce_scatter all-reduces the whole [world * n] input and keeps one slice: each
    // rank moves ~2 (world - 1) n elements. The all-to-all of the uneven form moves just the
    // world chunks of each rank's slice, as a ring reduce-scatter does, and sums them in rank order.
    return start_reduce_scatter(output, input, std::vector<int64_t>(world, n));
  }
  at::Tensor flat_output = output.view({-1});  // [n]
  at::Tensor flat_input = input.view({-1});    // [world * n]
  c10d::Backend& group = impl_->group_for(input, "reduce_scatter");
  auto state = std::make_unique<PendingCollective::State>();
  state->impl = impl_;
  state->op = "reduce_scatter";
  state->output = flat_output;
  state->input = flat_input;
  // NCCL reduce-scatters natively.
  state->work = impl_->start("reduce_scatter", [&] { return group._reduce_scatter_base(flat_output, flat_input); });
  return PendingCollective(std::move(state));
}

PendingCollective Communicator::start_reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                                     const std::vector<int64_t>& counts) {
  check_pair(output, input, "reduce_scatter");
  const int64_t world = impl_->world_size;
  const int64_t rank = impl_->rank;
  DSCHAT_CHECK(static_cast<int64_t>(counts.size()) == world, InvalidArgument, "dist::reduce_scatter: ",
               counts.size(), " counts for a world of ", world);
  for (int64_t count : counts) {
    DSCHAT_CHECK(count >= 0, InvalidArgument, "dist::reduce_scatter: negative count ", count);
  }
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const int64_t n = counts[rank];
  DSCHAT_CHECK(input.numel() == total && output.numel() == n, InvalidArgument, "dist::reduce_scatter: input has ",
               input.numel(), " elements and output ", output.numel(), ", expected sum(counts) = ", total,
               " and counts[", rank, "] = ", n);
  at::Tensor flat_output = output.view({-1});  // [n]
  at::Tensor flat_input = input.view({-1});    // [total]
  if (world == 1) {
    flat_output.copy_(flat_input);
    return PendingCollective();
  }
  if (total == 0) return PendingCollective();
  c10d::Backend& group = impl_->group_for(input, "reduce_scatter");
  // Every rank sends segment r of its input to rank r and receives `n` elements from each rank:
  // row r of chunks_for_me is rank r's segment `rank`.
  at::Tensor chunks_for_me = at::empty({world, n}, input.options());  // [world, n]
  at::Tensor flat_chunks = chunks_for_me.view({-1});                   // [world * n]
  auto state = std::make_unique<PendingCollective::State>();
  state->impl = impl_;
  state->op = "reduce_scatter";
  state->output = flat_output;
  state->input = flat_input;
  state->epilogue = [flat_output, chunks_for_me]() mutable {
    if (flat_output.numel() > 0) {
      at::sum_out(flat_output, chunks_for_me, {0}, /*keepdim=*/false, flat_output.scalar_type());
    }
  };
  const bool even = std::all_of(counts.begin(), counts.end(), [n](int64_t count) { return count == n; });
  std::vector<int64_t> input_splits = even ? std::vector<int64_t>{} : counts;  // empty = world equal parts
  std::vector<int64_t> output_splits = even ? std::vector<int64_t>{} : std::vector<int64_t>(world, n);
  state->work = impl_->start("reduce_scatter", [&] {
    return group.alltoall_base(flat_chunks, flat_input, output_splits, input_splits);
  });
  return PendingCollective(std::move(state));
}

}  // namespace dist
}  // namespace dschat
