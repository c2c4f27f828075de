#pragma once
// Test-only seam of TrainingEngine::save_checkpoint (not installed): the free space the
// pre-save check sees, so a test can run out of disk without filling one.
#include <cstdint>

namespace dschat {
namespace engine {
namespace testing {

/// The free bytes every later save_checkpoint of this process assumes; -1 (the default): the
/// file system's own figure.
void set_checkpoint_free_bytes(int64_t bytes);

}  // namespace testing
}  // namespace engine
}  // namespace dschat
