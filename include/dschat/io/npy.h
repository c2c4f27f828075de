#pragma once
// NumPy .npy files (format versions 1.0-3.0, little-endian, C or Fortran order) <-> tensors.
// dtypes: float16/32/64, bfloat16 is not a NumPy type (saved as float32 by callers), int8/16/32/64,
// uint8, bool. Used by `dschat forward` and the parity tests.

#include <torch/torch.h>

#include <filesystem>

namespace dschat {
namespace io {

/// Reads a .npy file into a contiguous CPU tensor. Throws core::FormatError naming the file.
torch::Tensor load_npy(const std::filesystem::path& file);

/// Writes a tensor (copied to a contiguous CPU tensor) as a version 1.0 .npy file, atomically.
void save_npy(const std::filesystem::path& file, const torch::Tensor& tensor);

}  // namespace io
}  // namespace dschat
