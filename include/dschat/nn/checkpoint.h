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

/// Calls around a segment's backward, through which an owner of the parameters `fn` reads (a
/// ZeRO stage 3 engine) materialises them for the recompute and frees them afterwards.
struct CheckpointCallbacks {
  /// In backward, before the segment is re-run (the recompute still sees the forward's RNG state).
  std::function<void()> before_recompute;
  /// In backward, once the recomputed segment's backward has accumulated its parameters' .grad.
  std::function<void()> after_backward;
};

/// As above, with `callbacks` run in the segment's backward (empty ones are skipped). Unlike the
/// plain overload, a segment with a callback takes part in backward whenever grad mode is on at
/// the call, even if `input` needs no gradient (frozen embeddings under LoRA): its parameters
/// still get their gradients and after_backward still runs, so an engine sees every segment.
torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& input,
                         const CheckpointCallbacks& callbacks);

}  // namespace nn
}  // namespace dschat
