#include "hybrid/logits_self_check.h"

#include "dschat/core/host_sync.h"
#include "dschat/core/error.h"
#include "dschat/inference/kv_cache.h"

namespace dschat {
namespace hybrid {

SelfCheckResult check_inference_logits(models::CausalLM& training, models::CausalLM& inference,
                                       const torch::Tensor& prompt) {
  DSCHAT_CHECK(prompt.dim() == 2 && prompt.size(0) == 1 && prompt.size(1) > 0, InvalidArgument,
               "hybrid engine self-check: prompt must be [1, t] with t > 0, got ", prompt.sizes());
  torch::NoGradGuard no_grad;
  torch::Tensor expected = training->forward(prompt).to(torch::kFloat32);  // [1, t, V]
  const auto dtype = inference->parameters().front().scalar_type();
  inference::ContiguousKvCache cache(inference->config(), 1, prompt.size(1), dtype, prompt.device());
  torch::Tensor actual = inference->forward(prompt, {}, &cache).to(torch::kFloat32);  // [1, t, V]
  DSCHAT_CHECK(actual.sizes() == expected.sizes(), Error, "hybrid engine self-check: the generation model returned ",
               actual.sizes(), " logits where the training forward returned ", expected.sizes());

  const auto training_dtype = training->parameters().front().scalar_type();
  const bool exact_dtypes = dtype == torch::kFloat32 && training_dtype == torch::kFloat32;
  const double atol = exact_dtypes ? 1e-3 : 5e-2, rtol = exact_dtypes ? 1e-3 : 5e-2;
  SelfCheckResult result;
  core::HostSync sync("generation (logits self-check, first call after a switch; debug builds)");
  result.max_abs_diff = (actual - expected).abs().max().item<double>();
  result.tolerance = atol + rtol * expected.abs().max().item<double>();
  // NaN compares false both ways: treat a non-finite difference as a mismatch too.
  DSCHAT_CHECK(result.max_abs_diff <= result.tolerance, Error,
               "hybrid engine self-check failed after the switch to generation: the inference path's logits (",
               c10::toString(dtype), ") differ from the training forward's (", c10::toString(training_dtype),
               ") by up to ", result.max_abs_diff, " over the first prompt (", prompt.size(1),
               " tokens), more than the tolerance ", result.tolerance,
               "; generation would run on wrong weights or a wrong kernel. Disable with logits_self_check=false "
               "only to debug");
  return result;
}

}  // namespace hybrid
}  // namespace dschat
