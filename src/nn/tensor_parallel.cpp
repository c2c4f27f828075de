#include "dschat/nn/tensor_parallel.h"

#include "dschat/core/error.h"
#include "dschat/ops/skinny_linear.h"

namespace dschat {
namespace nn {

torch::Tensor row_parallel_linear(LinearImpl& linear, const torch::Tensor& x, TensorParallelGroup& group,
                                  torch::Tensor* deferred_bias) {
  DSCHAT_CHECK(!linear.has_lora() || linear.lora_fused(), InvalidArgument,
               "tensor parallel: a row-parallel Linear(in=", linear.options.in_features(), ", out=",
               linear.options.out_features(), ") has unfused LoRA adapters; fuse them before sharding");
  // Without the bias: every rank would add it, and the sum would count it tp times.
  torch::Tensor y = ops::linear(x, linear.weight, torch::Tensor()).contiguous();  // [..., out] partial sum
  group.all_reduce_sum(y);
  if (deferred_bias != nullptr) {
    *deferred_bias = linear.bias;
    return y;
  }
  return linear.bias.defined() ? y + linear.bias : y;
}

void require_tensor_parallel_inference(const TensorParallelGroup* group, bool inference, const char* where) {
  DSCHAT_CHECK(group == nullptr || inference, InvalidArgument, where,
               ": a tensor-parallel shard (tp=", group->size(),
               ") runs only for generation: a forward with a KV cache, under torch::NoGradGuard, in eval mode "
               "(no dropout); got a forward outside that inference path");
}

}  // namespace nn
}  // namespace dschat
