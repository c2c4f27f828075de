#include "dschat/ops/rotary.h"

#include "dschat/core/error.h"
#include "ops/kernel_dispatch.h"

#ifdef DSCHAT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "dschat/core/status_check.h"
#include "kernels/rotary.cuh"
#endif

namespace dschat {
namespace ops {
namespace {

void check_rotary_arguments(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                     const torch::Tensor& sin) {
  DSCHAT_CHECK(q.defined() && q.dim() == 4, InvalidArgument, "rotary_embedding: expected q of shape [B, H, T, D], got ",
               detail::shape_of(q));
  const int64_t batch = q.size(0), tokens = q.size(2), dim = q.size(3);
  DSCHAT_CHECK(k.defined() && k.dim() == 4 && k.size(0) == batch && k.size(2) == tokens && k.size(3) == dim,
               InvalidArgument, "rotary_embedding: expected k of shape [", batch, ", H_kv, ", tokens, ", ", dim,
               "], got ", detail::shape_of(k));
  DSCHAT_CHECK(dim % 2 == 0, InvalidArgument, "rotary_embedding: head_dim must be even, got ", dim);
  const std::vector<int64_t> table{batch, tokens, dim};
  DSCHAT_CHECK(cos.defined() && sin.defined() && cos.sizes() == table && sin.sizes() == table, InvalidArgument,
               "rotary_embedding: expected cos and sin of shape ", c10::IntArrayRef(table), ", got cos ",
               detail::shape_of(cos), " and sin ", detail::shape_of(sin));
  DSCHAT_CHECK(q.is_floating_point(), InvalidArgument, "rotary_embedding: q must be floating point, got ",
               q.scalar_type());
  for (const auto& [name, t] : {std::pair<const char*, const torch::Tensor&>{"k", k}, {"cos", cos}, {"sin", sin}}) {
    DSCHAT_CHECK(t.scalar_type() == q.scalar_type(), InvalidArgument, "rotary_embedding: ", name, " dtype ",
                 t.scalar_type(), " differs from q dtype ", q.scalar_type());
    DSCHAT_CHECK(t.device() == q.device(), InvalidArgument, "rotary_embedding: ", name, " is on ", t.device(),
                 ", q on ", q.device());
  }
}

#ifdef DSCHAT_WITH_CUDA
std::pair<torch::Tensor, torch::Tensor> run_rotary_kernel(const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& cos, const torch::Tensor& sin) {
  c10::cuda::CUDAGuard guard(q.device());
  torch::Tensor qs = q.stride(3) == 1 ? q : q.contiguous();  // [B, H, T, D]
  torch::Tensor ks = k.stride(3) == 1 ? k : k.contiguous();  // [B, H_kv, T, D]
  torch::Tensor c = cos.contiguous(), s = sin.contiguous();  // [B, T, D]
  torch::Tensor q_out = torch::empty(q.sizes(), q.options());  // [B, H, T, D] contiguous
  torch::Tensor k_out = torch::empty(k.sizes(), k.options());  // [B, H_kv, T, D] contiguous
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  detail::dispatch_kernel_dtype("rotary_embedding", q.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    kernels::RotaryParams<T> p{};
    p.q = detail::data_as<T>(qs);
    p.k = detail::data_as<T>(ks);
    p.cos = detail::data_as<T>(c);
    p.sin = detail::data_as<T>(s);
    p.q_out = detail::mutable_data_as<T>(q_out);
    p.k_out = detail::mutable_data_as<T>(k_out);
    p.batch = q.size(0);
    p.q_heads = q.size(1);
    p.k_heads = k.size(1);
    p.tokens = q.size(2);
    p.head_dim = q.size(3);
    p.q_stride_b = detail::stride_of(qs, 0);
    p.q_stride_h = detail::stride_of(qs, 1);
    p.q_stride_t = detail::stride_of(qs, 2);
    p.k_stride_b = detail::stride_of(ks, 0);
    p.k_stride_h = detail::stride_of(ks, 1);
    p.k_stride_t = detail::stride_of(ks, 2);
    DSCHAT_CUDA_CHECK(kernels::rotary_embedding(p, stream));
  });
  return {q_out, k_out};
}
#endif

}  // namespace

torch::Tensor rotary_embedding_reference(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  torch::Tensor x1 = x.narrow(-1, 0, half);                  // [B, H, T, D/2]
  torch::Tensor x2 = x.narrow(-1, half, x.size(-1) - half);  // [B, H, T, D/2]
  torch::Tensor rotated = torch::cat({-x2, x1}, -1);         // [B, H, T, D]
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

std::pair<torch::Tensor, torch::Tensor> rotary_embedding(const torch::Tensor& q, const torch::Tensor& k,
                                                         const torch::Tensor& cos, const torch::Tensor& sin) {
  check_rotary_arguments(q, k, cos, sin);
#ifdef DSCHAT_WITH_CUDA
  if (detail::kernel_applies(q, {q, k, cos, sin}) && q.size(0) * q.size(2) <= 0x7fffffff) {
    return run_rotary_kernel(q, k, cos, sin);
  }
#endif
  return {rotary_embedding_reference(q, cos, sin), rotary_embedding_reference(k, cos, sin)};
}

}  // namespace ops
}  // namespace dschat
