#pragma once
// Test-only seam of StepRunner (not installed): make a step die the way a kill would, after a
// given optimizer step, so a test can check what a resumed run recovers.
#include <cstdint>

namespace dschat {
namespace rlhf {
namespace testing {

/// Every StepRunner of this process throws Interrupted from after_optimizer_step once this many
/// optimizer steps are done, without saving beyond the periodic checkpoints. 0 (the default): never.
void set_crash_after_optimizer_steps(int64_t steps);

}  // namespace testing
}  // namespace rlhf
}  // namespace dschat
