#pragma once
// Group-wise symmetric int8 storage of frozen weights (internal), for ZeRO++'s
// zero_quantized_nontrainable_weights (DeepSpeed-Chat's --enable_mixed_precision_lora): the frozen
// base weights under LoRA keep their stage-3 partitions as int8 and are dequantized to the model
// dtype when a layer is gathered.
//
// Why int8 with one fp32 scale per 256 consecutive elements: DeepSpeed quantizes the
// non-trainable partitions to 8 bits with per-group scales as well (its ZeRO++ weight
// quantization); fp6/fp8 would need hardware-specific formats that CPU and older GPUs lack. The
// per-element error is at most half a step, absmax(group) / 254, and the storage 1 + 4/256 bytes
// per element (fp16: 51%, fp32: 25% of the unquantized partition).
//
//   QuantizedValues q = quantize_groupwise(values);  // values [n]
//   torch::Tensor back = dequantize_groupwise(q, n, torch::kHalf);  // [n]

#include <torch/torch.h>

namespace dschat {
namespace engine {

constexpr int64_t kQuantGroupElements = 256;

struct QuantizedValues {
  torch::Tensor values;  // [groups * kQuantGroupElements] int8; the tail past n is zero
  torch::Tensor scales;  // [groups] fp32: absmax / 127 of each group (1 for an all-zero group)
  int64_t bytes() const;
};

/// Number of groups for n elements.
int64_t quant_groups(int64_t n);

/// values [n] (any floating dtype) -> int8 groups on values' device (round to nearest, ties even).
QuantizedValues quantize_groupwise(const torch::Tensor& values);

/// [n] in `dtype` on quantized's device: values * scale of their group.
torch::Tensor dequantize_groupwise(const QuantizedValues& quantized, int64_t n, torch::ScalarType dtype);

/// The same for `rows` ranks' partitions side by side: values [rows, groups * G] int8 and scales
/// [rows, groups] -> [rows, n] in `dtype` (n <= groups * G: each row's first n elements).
torch::Tensor dequantize_rows(const torch::Tensor& values, const torch::Tensor& scales, int64_t n,
                              torch::ScalarType dtype);

}  // namespace engine
}  // namespace dschat
