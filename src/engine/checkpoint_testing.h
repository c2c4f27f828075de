#pragma once
// Test-only seams of TrainingEngine::save_checkpoint (not installed): the free space the
// pre-save check sees, so a test can run out of disk without filling one, and a hook inside the
// write, so a test can kill a process while a (background) write is under way.
#include <cstdint>
#include <filesystem>
#include <functional>

namespace dschat {
namespace engine {
namespace testing {

/// The free bytes every later save_checkpoint of this process assumes; -1 (the default): the
/// file system's own figure.
void set_checkpoint_free_bytes(int64_t bytes);

/// Called by every later checkpoint write of this process once this rank's files are in the
/// staging directory (passed) and before it marks them done, i.e. before the checkpoint can be
/// committed; on the writer thread when the save is asynchronous. Empty: none.
void set_checkpoint_write_hook(std::function<void(const std::filesystem::path& staging)> hook);

}  // namespace testing
}  // namespace engine
}  // namespace dschat
