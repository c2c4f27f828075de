// nn::checkpoint with callbacks: their order around the recompute, gradients equal to the
// un-checkpointed run (dropout masks repeat), a parameter that exists only between the callbacks
// (as under ZeRO stage 3), and a frozen input that still reaches the segment's backward.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dschat/nn/checkpoint.h"
#include "dschat/ops/skinny_linear.h"
#include "test_util.h"

namespace dschat {
namespace {

using testing::max_abs_diff;

// A segment with a parameter and dropout, so a recompute with a different mask would show.
struct Segment {
  torch::Tensor weight = torch::randn({6, 6}).requires_grad_(true);  // [H, H]
  std::vector<std::string>* log = nullptr;

  torch::Tensor operator()(const torch::Tensor& x) const {  // [B, H] -> [B, H]
    if (log != nullptr) log->push_back("fn");
    return torch::dropout(torch::tanh(torch::matmul(x, weight)), 0.5, /*train=*/true);
  }
};

TEST(CheckpointCallbacks, RunAroundTheRecomputeInOrder) {
  torch::manual_seed(3);
  std::vector<std::string> log;
  Segment segment;
  segment.log = &log;
  torch::Tensor x = torch::randn({4, 6}).requires_grad_(true);  // [B, H]
  nn::CheckpointCallbacks callbacks;
  callbacks.before_recompute = [&] { log.push_back("before_recompute"); };
  callbacks.after_backward = [&] {
    // The segment's parameter gradient is already accumulated when this runs.
    log.push_back(segment.weight.grad().defined() ? "after_backward(grad)" : "after_backward(no grad)");
  };
  torch::Tensor y = nn::checkpoint(segment, x, callbacks);  // [B, H]
  EXPECT_EQ(log, (std::vector<std::string>{"fn"}));
  y.sum().backward();
  EXPECT_EQ(log, (std::vector<std::string>{"fn", "before_recompute", "fn", "after_backward(grad)"}));
}

TEST(CheckpointCallbacks, GradientsEqualTheUncheckpointedRun) {
  // Same ops on the same values with the same dropout mask: equal to rounding (bitwise on CPU).
  torch::manual_seed(5);
  Segment segment;
  torch::Tensor x = torch::randn({4, 6});          // [B, H]
  torch::Tensor grad_out = torch::randn({4, 6});   // [B, H]
  torch::Tensor grads[2][2];                       // [plain, checkpointed] x [input, weight]
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    torch::Tensor input = x.clone().requires_grad_(true);  // [B, H]
    segment.weight.mutable_grad() = torch::Tensor();
    torch::manual_seed(9);
    int calls = 0;
    nn::CheckpointCallbacks callbacks{[&] { ++calls; }, [&] { ++calls; }};
    torch::Tensor y = checkpointed ? nn::checkpoint(segment, input, callbacks) : segment(input);  // [B, H]
    y.backward(grad_out);
    EXPECT_EQ(calls, checkpointed ? 2 : 0);
    grads[checkpointed][0] = input.grad();
    grads[checkpointed][1] = segment.weight.grad();
  }
  EXPECT_LE(max_abs_diff(grads[0][0], grads[1][0]), 1e-6);
  EXPECT_LE(max_abs_diff(grads[0][1], grads[1][1]), 1e-6);
}

TEST(Checkpoint, TheFirstPassComputesTheRecomputesBitsThroughOpsLinear) {
  // ops::linear on 4 rows without autograd is the skinny kernel, with autograd at::linear (MKL):
  // within a checkpoint both passes take at::linear, so the output the loss sees is the one whose
  // activations the backward differentiates.
  torch::manual_seed(7);
  const torch::Tensor weight = torch::randn({40, 96});    // [N, K]
  const torch::Tensor trained = weight.clone().requires_grad_(true);  // [N, K]
  const torch::Tensor x = torch::randn({4, 96});          // [B, K]
  {
    torch::NoGradGuard no_grad;
    ASSERT_TRUE(ops::skinny_linear_applies(x, weight, {}));
    ASSERT_FALSE(torch::equal(ops::linear(x, weight, {}), at::linear(x, weight, {})))
        << "the two products round alike here: the test would not tell the passes apart";
    ops::AtLinearGuard guard;
    EXPECT_FALSE(ops::skinny_linear_applies(x, weight, {}));
    {
      ops::AtLinearGuard nested;
    }
    EXPECT_TRUE(ops::AtLinearGuard::active());
  }
  EXPECT_FALSE(ops::AtLinearGuard::active());
  std::vector<torch::Tensor> seen;  // the segment's product in each pass
  const auto segment = [&](const torch::Tensor& in) {  // [B, K] -> [B, N]
    torch::Tensor y = ops::linear(in, trained, {});     // [B, N]
    seen.push_back(y.detach().clone());
    return y;
  };
  torch::Tensor y = nn::checkpoint(segment, x.clone().requires_grad_(true));  // [B, N]
  y.sum().backward();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(torch::equal(seen[0], seen[1]));
  EXPECT_TRUE(torch::equal(seen[0], at::linear(x, weight, {})));
}

TEST(CheckpointCallbacks, ParameterMaterialisedOnlyBetweenCallbacks) {
  // The ZeRO-3 pattern: the weight's data is freed after forward, restored for the recompute and
  // freed again after its gradient is in; the Variable (and its .grad) stays the same.
  torch::manual_seed(7);
  Segment segment;
  torch::Tensor full = segment.weight.detach().clone();  // [H, H]
  torch::Tensor x = torch::randn({4, 6}).requires_grad_(true);  // [B, H]
  auto release = [&] { segment.weight.set_data(torch::empty({0}, segment.weight.options())); };

  torch::manual_seed(1);
  torch::Tensor expected = segment(x);  // [B, H]
  expected.sum().backward();
  torch::Tensor expected_grad = segment.weight.grad().clone();  // [H, H]
  segment.weight.mutable_grad() = torch::Tensor();

  nn::CheckpointCallbacks callbacks;
  callbacks.before_recompute = [&] { segment.weight.set_data(full); };
  callbacks.after_backward = release;
  torch::manual_seed(1);
  torch::Tensor y = nn::checkpoint(segment, x, callbacks);  // [B, H]
  release();
  y.sum().backward();
  EXPECT_EQ(segment.weight.numel(), 0);
  EXPECT_LE(max_abs_diff(y, expected), 1e-6);
  EXPECT_LE(max_abs_diff(segment.weight.grad(), expected_grad), 1e-6);
}

TEST(CheckpointCallbacks, FrozenInputStillReachesTheSegmentsBackward) {
  // LoRA with frozen embeddings: the input needs no gradient, the parameter inside does.
  torch::manual_seed(11);
  Segment segment;
  torch::Tensor x = torch::randn({4, 6});  // [B, H], requires_grad false
  bool after_backward = false;
  nn::CheckpointCallbacks callbacks;
  callbacks.after_backward = [&] { after_backward = true; };
  torch::Tensor y = nn::checkpoint(segment, x, callbacks);  // [B, H]
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  EXPECT_TRUE(after_backward);
  EXPECT_TRUE(segment.weight.grad().defined());
  EXPECT_FALSE(x.grad().defined());

  // Without grad mode nothing is recorded and no callback can run.
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(nn::checkpoint(segment, x, callbacks).requires_grad());
}

TEST(CheckpointCallbacks, EmptyCallbacksBehaveAsThePlainOverload) {
  torch::manual_seed(13);
  Segment segment;
  torch::Tensor frozen = torch::randn({4, 6});  // [B, H]
  // The plain overload keeps its contract: a frozen input gives an output outside autograd.
  EXPECT_FALSE(nn::checkpoint(segment, frozen).requires_grad());
  EXPECT_FALSE(nn::checkpoint(segment, frozen, nn::CheckpointCallbacks{}).requires_grad());
}

}  // namespace
}  // namespace dschat
