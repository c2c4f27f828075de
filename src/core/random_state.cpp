#include "dschat/core/random_state.h"

#include <mutex>

namespace dschat {
namespace core {

std::vector<at::Tensor> random_states(const std::vector<c10::Device>& devices) {
  std::vector<at::Tensor> states;
  for (const auto& device : devices) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    states.push_back(gen.get_state());
  }
  return states;
}

void set_random_states(const std::vector<c10::Device>& devices, const std::vector<at::Tensor>& states) {
  for (size_t i = 0; i < devices.size(); ++i) {
    at::Generator gen = at::globalContext().defaultGenerator(devices[i]);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(states[i]);
  }
}

RandomStateGuard::RandomStateGuard(const c10::Device& device) : devices_{c10::Device(c10::kCPU)} {
  if (!device.is_cpu()) devices_.push_back(device);
  states_ = random_states(devices_);
}

RandomStateGuard::~RandomStateGuard() { set_random_states(devices_, states_); }

}  // namespace core
}  // namespace dschat
