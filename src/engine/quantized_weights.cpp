#include "engine/quantized_weights.h"

#include "dschat/core/error.h"

namespace dschat {
namespace engine {

int64_t QuantizedValues::bytes() const {
  auto of = [](const torch::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; };
  return of(values) + of(scales);
}

int64_t quant_groups(int64_t n) { return (n + kQuantGroupElements - 1) / kQuantGroupElements; }

QuantizedValues quantize_groupwise(const torch::Tensor& values) {
  DSCHAT_CHECK(values.dim() == 1 && values.is_floating_point(), InvalidArgument,
               "quantize_groupwise: expects a 1-D floating tensor, got ", values.sizes(), " ", values.scalar_type());
  torch::NoGradGuard no_grad;
  const int64_t n = values.numel();
  const int64_t groups = quant_groups(n);
  torch::Tensor padded = torch::zeros({groups * kQuantGroupElements}, values.options().dtype(torch::kFloat32));  // [groups * G]
  padded.narrow(0, 0, n).copy_(values);
  torch::Tensor grouped = padded.view({groups, kQuantGroupElements});                 // [groups, G]
  torch::Tensor absmax = std::get<0>(grouped.abs().max(1));                            // [groups]
  torch::Tensor scales = torch::where(absmax > 0, absmax / 127.0, torch::ones_like(absmax));  // [groups]
  QuantizedValues out;
  out.values = grouped.div(scales.unsqueeze(1)).round().clamp(-127, 127).to(torch::kInt8).view({-1});  // [groups * G]
  out.scales = scales;
  return out;
}

torch::Tensor dequantize_rows(const torch::Tensor& values, const torch::Tensor& scales, int64_t n,
                              torch::ScalarType dtype) {
  const int64_t rows = values.size(0);
  const int64_t groups = scales.size(1);
  DSCHAT_CHECK(values.size(1) == groups * kQuantGroupElements && n <= groups * kQuantGroupElements, InvalidArgument,
               "dequantize_rows: ", values.sizes(), " int8 values do not match ", scales.sizes(), " scales and ", n,
               " elements");
  torch::NoGradGuard no_grad;
  torch::Tensor grouped = values.view({rows, groups, kQuantGroupElements}).to(torch::kFloat32);  // [rows, groups, G]
  torch::Tensor full = grouped.mul_(scales.unsqueeze(2)).view({rows, groups * kQuantGroupElements});  // [rows, groups * G]
  return full.narrow(1, 0, n).to(dtype);  // [rows, n]
}

torch::Tensor dequantize_groupwise(const QuantizedValues& quantized, int64_t n, torch::ScalarType dtype) {
  return dequantize_rows(quantized.values.unsqueeze(0), quantized.scales.unsqueeze(0), n, dtype).squeeze(0).contiguous();
}

}  // namespace engine
}  // namespace dschat
