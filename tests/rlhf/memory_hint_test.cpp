// Out-of-memory errors name the step, the model, the phase and what to change: a real CPU
// allocation failure and CUDA's exception type both become core::OutOfMemory; other LibTorch
// errors pass through untouched.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "rlhf/setup/memory_hint.h"
#include "test_util.h"

namespace dschat {
namespace {

TEST(MemoryHint, ACpuAllocationFailureNamesStepModelPhaseAndAdvice) {
  rlhf::MemoryPhase where{"step 3 (PPO)", "actor out/actor, critic out/reward"};
  where.enter("training the actor and critic", rlhf::MemoryAdvice::kPpoTrain);
  // 2^52 bytes: more than any machine's memory, so the CPU allocator really fails.
  auto allocate = [] { return torch::empty({int64_t{1} << 52}, torch::kUInt8); };
  EXPECT_THROW_WITH(rlhf::with_memory_hint(where, allocate), core::OutOfMemory,
                    "step 3 (PPO): out of memory while training the actor and critic (actor out/actor, critic "
                    "out/reward); try: lower per_device_training_batch_size");
  try {
    rlhf::with_memory_hint(where, allocate);
  } catch (const core::OutOfMemory& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("actor_gradient_checkpointing"), std::string::npos) << message;
    EXPECT_NE(message.find("4503599627370496 bytes"), std::string::npos) << "keeps the allocator's figure: " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  }
}

TEST(MemoryHint, CudaOutOfMemoryErrorIsRecognisedByType) {
  rlhf::MemoryPhase where{"step 1 (SFT)", "facebook/opt-1.3b"};
  where.enter("training", rlhf::MemoryAdvice::kTrain);
  auto cuda_oom = []() -> int {
    throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                "CUDA out of memory. Tried to allocate 2.00 GiB");
  };
  EXPECT_THROW_WITH(rlhf::with_memory_hint(where, cuda_oom), core::OutOfMemory,
                    "step 1 (SFT): out of memory while training (facebook/opt-1.3b); try: lower "
                    "per_device_train_batch_size or max_seq_len");
}

TEST(MemoryHint, OtherErrorsAndResultsPassThrough) {
  rlhf::MemoryPhase where{"step 2 (reward model)", "m"};
  EXPECT_EQ(rlhf::with_memory_hint(where, [] { return 42; }), 42);
  auto shape_error = [] { return torch::ones({2, 3}).matmul(torch::ones({2, 3})); };
  EXPECT_THROW(rlhf::with_memory_hint(where, shape_error), c10::Error);
  auto not_torch = []() -> int { throw core::NotFound("model m"); };
  EXPECT_THROW_WITH(rlhf::with_memory_hint(where, not_torch), core::NotFound, "model m");
  for (rlhf::MemoryAdvice advice : {rlhf::MemoryAdvice::kLoad, rlhf::MemoryAdvice::kEvaluate,
                                    rlhf::MemoryAdvice::kTrain, rlhf::MemoryAdvice::kPpoExperience,
                                    rlhf::MemoryAdvice::kPpoTrain}) {
    EXPECT_FALSE(rlhf::memory_advice_text(advice).empty());
  }
}

}  // namespace
}  // namespace dschat
