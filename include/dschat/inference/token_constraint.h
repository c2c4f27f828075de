#pragma once
// A rule on which tokens may come next in a sequence (structured output: `dschat serve`'s JSON
// mode). The continuous engine asks it once per drawn token, before any other logits processing,
// and masks what it refuses; a row with a constraint samples alone (row_sampling.h).

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace dschat {
namespace inference {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  /// `generated`: the sequence's tokens after its prompt so far -> [vocab] bool on the CPU, true
  /// for the tokens that may come next. Stateless (the engine may preempt and recompute a
  /// sequence), so one constraint serves every sample of a request. At least one token must be
  /// allowed.
  virtual torch::Tensor allowed(const std::vector<int64_t>& generated, int64_t vocab) const = 0;
};

}  // namespace inference
}  // namespace dschat
