#pragma once
// The hybrid engine's guard against the silent "garbage after the switch" failure (wrong weights
// bound, a stale cast, a bad shard, a kernel that disagrees with the training math): the
// generation model's prefill logits over one prompt, through the inference path (KV cache, fused
// ops, TP all-reduces), are compared with the training forward's over the same tokens.

#include <torch/torch.h>

#include "dschat/models/causal_lm.h"

namespace dschat {
namespace hybrid {

struct SelfCheckResult {
  double max_abs_diff = 0.0;  // over every position and vocabulary entry
  double tolerance = 0.0;     // what the difference was allowed to be
};

/// prompt: [1, t] real tokens only (no padding). Runs `training` without a cache and with grad
/// off (collective under ZeRO-3: every rank calls it) and `inference` with a fresh KV cache, and
/// throws core::Error naming both dtypes, the difference and the tolerance when
///   max |inference - training| > atol + rtol * max |training|
/// with (atol, rtol) = (1e-3, 1e-3) when both run in fp32, else (5e-2, 5e-2).
SelfCheckResult check_inference_logits(models::CausalLM& training, models::CausalLM& inference,
                                       const torch::Tensor& prompt);

}  // namespace hybrid
}  // namespace dschat
