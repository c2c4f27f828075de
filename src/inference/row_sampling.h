#pragma once
// The next token of many rows that each have their own sampling config and generator (the
// continuous engine's sequences): rows whose processing is the same (greedy or the same
// temperature / top-k / top-p, EOS suppressed or not, no penalty, logit bias or constraint) go
// through process_logits and select_next_tokens together, one ATen call per group instead of per
// row; a row with a penalty (which reads its own tokens), a logit bias or a constraint goes alone,
// its constraint's mask applied first. Every op involved works
// row by row, so a row's token is what it would get alone, and the ids reach the host in one copy.

#include <ATen/core/Generator.h>
#include <torch/torch.h>

#include <vector>

#include "dschat/core/generation_config.h"
#include "dschat/inference/token_constraint.h"

namespace dschat {
namespace inference {

struct RowSampling {
  const core::GenerationConfig* config;  // its own settings
  int64_t generated;                     // tokens it generated before this one (min_new_tokens)
  const std::vector<int64_t>* tokens;    // prompt + generated (the penalties' "seen")
  at::Generator generator;               // its own (do_sample only; a handle sharing its state)
  const TokenConstraint* constraint = nullptr;  // which tokens may come next; none: any
};

/// logits [R, V] float32, rows[r] describing row r -> the R next ids on the host.
std::vector<int64_t> sample_rows(const torch::Tensor& logits, const std::vector<RowSampling>& rows);

}  // namespace inference
}  // namespace dschat
