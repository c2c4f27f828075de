#pragma once
// The default random generators' states (CPU and accelerators), read and restored: activation
// checkpointing replays a layer's dropout masks with them, and the training guardian's held-out
// checks run inside a RandomStateGuard so that watching a run never changes its random draws.
#include <ATen/ATen.h>

#include <vector>

namespace dschat {
namespace core {

/// The state of each device's default generator, in order.
std::vector<at::Tensor> random_states(const std::vector<c10::Device>& devices);
/// Restores states read by random_states for the same devices.
void set_random_states(const std::vector<c10::Device>& devices, const std::vector<at::Tensor>& states);

/// Restores the CPU's and `device`'s default generators when it goes out of scope.
class RandomStateGuard {
 public:
  explicit RandomStateGuard(const c10::Device& device);
  ~RandomStateGuard();
  RandomStateGuard(const RandomStateGuard&) = delete;
  RandomStateGuard& operator=(const RandomStateGuard&) = delete;

 private:
  std::vector<c10::Device> devices_;
  std::vector<at::Tensor> states_;
};

}  // namespace core
}  // namespace dschat
