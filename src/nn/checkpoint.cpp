#include "dschat/nn/checkpoint.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

#include "dschat/core/error.h"
#include "dschat/core/random_state.h"
#include "dschat/ops/skinny_linear.h"

namespace dschat {
namespace nn {
namespace {

// Holds the closure so it can ride in the autograd context (which stores IValues only).
struct ClosureHolder : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> fn;
  CheckpointCallbacks callbacks;
  std::vector<c10::Device> devices;         // CPU, plus the input's accelerator if any
  std::vector<at::Tensor> rng_states;        // generator state of each device before the first pass
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // backward_anchor: absent, or an empty tensor requiring grad that makes the output require grad
  // (and so this backward run) when `input` does not; it never receives a gradient.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const std::optional<torch::Tensor>& /*backward_anchor*/,
                               c10::intrusive_ptr<ClosureHolder> holder) {
    holder->rng_states = core::random_states(holder->devices);
    ctx->save_for_backward({input});
    ctx->saved_data["closure"] = c10::IValue::make_capsule(holder);
    torch::NoGradGuard no_grad;
    ops::AtLinearGuard same_linear_as_the_recompute;
    return holder->fn(input);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto holder = c10::static_intrusive_pointer_cast<ClosureHolder>(ctx->saved_data["closure"].toCapsule());
    const CheckpointCallbacks& callbacks = holder->callbacks;
    if (callbacks.before_recompute) callbacks.before_recompute();
    torch::Tensor input = ctx->get_saved_variables()[0].detach().requires_grad_(ctx->needs_input_grad(0));
    std::vector<at::Tensor> states_now = core::random_states(holder->devices);
    core::set_random_states(holder->devices, holder->rng_states);  // same dropout masks as the first pass
    torch::Tensor output;
    {
      torch::AutoGradMode enable(true);
      ops::AtLinearGuard same_linear_as_the_first_pass;  // frozen layers would take the skinny kernel
      output = holder->fn(input);
    }
    core::set_random_states(holder->devices, states_now);
    // Without the anchor the output requires grad whenever backward runs; with it, a segment
    // whose input and parameters are all frozen has nothing to differentiate.
    if (output.requires_grad()) torch::autograd::backward({output}, {grad_outputs[0]});
    if (callbacks.after_backward) callbacks.after_backward();
    return {input.requires_grad() ? input.grad() : torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& input) {
  return checkpoint(fn, input, CheckpointCallbacks{});
}

torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& input,
                         const CheckpointCallbacks& callbacks) {
  DSCHAT_CHECK(input.defined(), InvalidArgument, "checkpoint: input tensor is undefined");
  auto holder = c10::make_intrusive<ClosureHolder>();
  holder->fn = fn;
  holder->callbacks = callbacks;
  holder->devices.emplace_back(c10::kCPU);
  if (!input.is_cpu()) holder->devices.push_back(input.device());
  const bool has_callbacks = callbacks.before_recompute || callbacks.after_backward;
  std::optional<torch::Tensor> backward_anchor;  // [0] when present
  if (has_callbacks && torch::GradMode::is_enabled() && !input.requires_grad()) {
    backward_anchor = torch::empty({0}, torch::TensorOptions().requires_grad(true));
  }
  return CheckpointFunction::apply(input, backward_anchor, holder);
}

}  // namespace nn
}  // namespace dschat
