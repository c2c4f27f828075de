#include "dschat/inference/continuous_engine.h"

// ContinuousEngine in lockstep across data-parallel ranks (options.lockstep): every forward is
// collective there (ZeRO-3 gathers each layer's parameters from all ranks), while each rank
// schedules its own prompts, so one rank may prefill three prompts in a step where another only
// decodes. The ranks agree forward by forward instead of counting in advance:
//   before each of its own forwards   a rank votes kForward (the vote's result is kForward too)
//   at the end of its step            it votes kDone or kDoneWithWork (has_work()); a result of
//                                     kForward means another rank is about to run a forward, so
//                                     it runs an idle one alongside and votes again
// Votes are a max all-reduce, so they pair up one to one and so do the forwards between them.

#include "dschat/core/error.h"

namespace dschat {
namespace inference {
namespace {

constexpr int64_t kDone = 0;          // no forward left in this step, no work left
constexpr int64_t kDoneWithWork = 1;  // no forward left in this step, sequences still to run
constexpr int64_t kForward = 2;       // about to run a forward

}  // namespace

void ContinuousEngine::vote_for_forward() {
  torch::Tensor vote = torch::tensor({kForward}, torch::kInt64);  // [1]
  options_.lockstep->all_reduce(vote, dist::ReduceOp::Max);
}

void ContinuousEngine::finish_lockstep_step() {
  torch::NoGradGuard no_grad;
  while (true) {
    torch::Tensor vote = torch::tensor({has_work() ? kDoneWithWork : kDone}, torch::kInt64);  // [1]
    options_.lockstep->all_reduce(vote, dist::ReduceOp::Max);
    const int64_t result = vote.item<int64_t>();
    if (result != kForward) {
      lockstep_work_left_ = result == kDoneWithWork;
      return;
    }
    // Another rank runs a forward: one token without a cache gathers (and releases) every layer
    // the same way, and touches no block of the pool.
    const torch::Tensor token = torch::zeros({1, 1}, torch::dtype(torch::kInt64).device(pool_->storage().device()));
    model_->hidden_states(token, {}, nullptr, nn::MaskLayout::kUnpadded);  // [1, 1, E], dropped
    ++stats_.idle_forwards;
  }
}

}  // namespace inference
}  // namespace dschat
