#include "rlhf/setup/memory_hint.h"

#include "dschat/core/error.h"

namespace dschat {
namespace rlhf {

bool is_out_of_memory(const c10::Error& error) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr) return true;
  // The CPU allocator's failure is a plain c10::Error ("DefaultCPUAllocator: can't allocate
  // memory: you tried to allocate N bytes"); CUDA's older builds say "CUDA out of memory".
  const std::string message = error.what_without_backtrace();
  for (const char* marker : {"can't allocate memory", "not enough memory", "out of memory"}) {
    if (message.find(marker) != std::string::npos) return true;
  }
  return false;
}

std::string memory_advice_text(MemoryAdvice advice) {
  switch (advice) {
    case MemoryAdvice::kLoad:
      return "a machine with more memory, dtype bf16 or fp16, or zero_stage 3 with offload";
    case MemoryAdvice::kEvaluate:
      return "lower per_device_eval_batch_size or max_seq_len";
    case MemoryAdvice::kTrain:
      return "lower per_device_train_batch_size or max_seq_len (raise gradient_accumulation_steps to keep the "
             "batch), or set gradient_checkpointing, zero_stage 3, offload or lora_dim";
    case MemoryAdvice::kPpoExperience:
      return "lower per_device_generation_batch_size, max_prompt_seq_len or max_answer_seq_len, set "
             "offload_reference_model and offload_reward_model, or with enable_hybrid_engine set "
             "release_inference_cache or inference_tp_size";
    case MemoryAdvice::kPpoTrain:
      return "lower per_device_training_batch_size, or set actor_gradient_checkpointing and "
             "critic_gradient_checkpointing, actor_zero_stage and critic_zero_stage 3, offload, or actor_lora_dim and "
             "critic_lora_dim";
  }
  return {};
}

void throw_out_of_memory(const MemoryPhase& where, const c10::Error& error) {
  std::string cause = error.what_without_backtrace();
  const size_t line_end = cause.find('\n');
  if (line_end != std::string::npos) cause.resize(line_end);
  throw core::OutOfMemory(where.step + ": out of memory while " + where.phase + " (" + where.model +
                          "); try: " + memory_advice_text(where.advice) + " (" + cause + ")");
}

}  // namespace rlhf
}  // namespace dschat
