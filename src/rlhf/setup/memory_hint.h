#pragma once
// Out-of-memory errors with the context a user needs: which step, which model, which phase, and
// the config keys that lower that phase's memory. LibTorch reports an allocation failure as
// c10::OutOfMemoryError (CUDA) or as a c10::Error from the CPU allocator, with no hint of what
// was running; the trainers run each phase through with_memory_hint() to add it.
#include <c10/util/Exception.h>

#include <string>
#include <utility>

namespace dschat {
namespace rlhf {

// What a phase can change to need less memory (the config keys of docs/config.md).
enum class MemoryAdvice { kLoad, kEvaluate, kTrain, kPpoExperience, kPpoTrain };

/// Where a step is; the trainers update it as they go so an allocation failure names the phase.
struct MemoryPhase {
  std::string step;   // "step 3 (PPO)"
  std::string model;  // what the phase runs: a model path, or "actor <path>, critic <path>"
  std::string phase = "loading the model";
  MemoryAdvice advice = MemoryAdvice::kLoad;

  void enter(std::string what, MemoryAdvice what_to_try) {
    phase = std::move(what);
    advice = what_to_try;
  }
};

/// The config keys to try, as one sentence fragment.
std::string memory_advice_text(MemoryAdvice advice);

/// Whether a LibTorch error is an allocation failure (CUDA or CPU allocator).
bool is_out_of_memory(const c10::Error& error);

/// Throws core::OutOfMemory: "<step>: out of memory while <phase> (<model>); try: <advice>
/// (<allocator message>)".
[[noreturn]] void throw_out_of_memory(const MemoryPhase& where, const c10::Error& error);

/// Runs fn(); an allocation failure inside it becomes core::OutOfMemory naming `where`. Other
/// errors pass through unchanged.
template <typename Fn>
decltype(auto) with_memory_hint(const MemoryPhase& where, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error& error) {
    if (is_out_of_memory(error)) throw_out_of_memory(where, error);
    throw;
  }
}

}  // namespace rlhf
}  // namespace dschat
