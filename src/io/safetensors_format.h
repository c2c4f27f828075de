#pragma once
// The safetensors container format (https://github.com/huggingface/safetensors):
//   [8-byte little-endian header length N][N bytes of JSON header][data section]
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end)} with offsets
// relative to the data section, plus an optional "__metadata__" string->string object.
// This file parses and validates a header completely (before any tensor data is touched) and
// builds headers for the writer.

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dschat/io/state_dict.h"

namespace dschat {
namespace io {

/// Largest header accepted, as in the reference implementation (guards against absurd lengths).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// One validated tensor entry of a header.
struct SafetensorsEntry {
  std::string name;
  torch::ScalarType dtype = torch::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the data section
  uint64_t end = 0;
};

/// A validated header: entries in name order, all ranges inside the data section and disjoint.
struct SafetensorsHeader {
  uint64_t data_start = 0;  // absolute file offset of the data section (8 + N)
  uint64_t data_size = 0;   // bytes in the data section
  std::vector<SafetensorsEntry> entries;
  Metadata metadata;
};

/// Parses and validates the header of a `file_size`-byte file whose bytes start at `bytes`.
/// `where` (the file path) starts every error message. Throws core::FormatError.
SafetensorsHeader parse_safetensors_header(const std::string& where, const uint8_t* bytes,
                                           size_t file_size);

/// The safetensors dtype name of `dtype` ("F32"), or "" when the format cannot store it.
std::string safetensors_dtype_name(torch::ScalarType dtype);

/// The comma-separated list of supported dtype names, for error messages.
std::string safetensors_supported_dtypes();

/// Builds the JSON header (entries in the given order, `__metadata__` first when non-empty),
/// padded with spaces so that the data section starts at a multiple of 8 bytes.
std::string build_safetensors_header(const std::vector<SafetensorsEntry>& entries,
                                     const Metadata& metadata);

}  // namespace io
}  // namespace dschat
