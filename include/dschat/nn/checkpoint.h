#pragma once
// Activation checkpointing: run `fn` without keeping its intermediate activations and recompute
// them during backward. The CPU (and current CUDA) random state is restored for the recompute, so
// dropout masks match the first pass and gradients equal those of the un-checkpointed run.

#include <torch/torch.h>

#include <functional>

namespace dschat {
namespace nn {

/// input: any shape requiring grad (or not); fn must be a pure function of `input` and of tensors
/// it captures that need no gradient (masks, rotary tables). Parameters used inside `fn` receive
/// their gradients (accumulated into .grad) during backward.
torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& input);

}  // namespace nn
}  // namespace dschat
