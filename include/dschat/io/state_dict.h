#pragma once
// Hugging Face checkpoint files <-> named CPU tensors.
//
// Supported on disk:
//   model.safetensors                          one safetensors file
//   model.safetensors.index.json + shards      sharded safetensors ("weight_map": name -> file)
//   pytorch_model.bin                          torch.save zip archive of a state dict
//   pytorch_model.bin.index.json + shards      sharded .bin
// Tensors come back on the CPU in the file's dtype. Safetensors data is memory-mapped and the
// tensors alias the mapping (kept alive by the tensors) whenever the element offset is aligned;
// otherwise it is copied once.

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

namespace dschat {
namespace io {

/// Name -> tensor, ordered by name so that writing is deterministic.
using TensorMap = std::map<std::string, torch::Tensor>;
/// Free-form string metadata (the safetensors "__metadata__" block).
using Metadata = std::map<std::string, std::string>;

/// Reads one safetensors file. Throws core::IoError / core::FormatError naming the file and,
/// where it applies, the tensor: truncated file, bad header JSON, unknown dtype, offsets out of
/// range or overlapping, shape/size mismatch. The whole header is validated before any tensor
/// is created. The mapping is private copy-on-write: in-place updates of the returned tensors
/// are safe and never reach the file.
TensorMap load_safetensors(const std::filesystem::path& file, Metadata* metadata = nullptr);

/// Writes one safetensors file atomically (temp file + rename): a crash leaves the old file or
/// none, never half of one. Tensors must be on the CPU (others are copied to it, one at a time).
/// The header lists tensors by name; the data is laid out largest element size first (as the
/// reference writer does), so every tensor is aligned and loads zero-copy.
void save_safetensors(const std::filesystem::path& file, const TensorMap& tensors,
                      const Metadata& metadata = {});

/// Reads a torch.save archive of a state dict (pytorch_model.bin). Storages shared by several
/// keys stay shared; views keep their storage offset and strides.
TensorMap load_torch_bin(const std::filesystem::path& file);

/// Writes a state dict as torch.save does (a zip archive whose data.pkl uses only the globals
/// torch.load(weights_only=True) allows), atomically. Each tensor gets its own storage.
void save_torch_bin(const std::filesystem::path& file, const TensorMap& tensors);

/// Loads every weight of a model directory in any of the layouts above (safetensors preferred
/// when both exist). Throws core::NotFound listing the file names looked for.
TensorMap load_state_dict(const std::filesystem::path& model_dir);

/// Writes `tensors` into `model_dir` as model.safetensors, or as shards
/// model-00001-of-0000N.safetensors + model.safetensors.index.json when the total exceeds
/// `max_shard_bytes`. Tensors sharing storage (tied weights) must be de-duplicated by the caller.
/// Every shard gets the metadata entry "format": "pt" (transformers requires it) unless
/// `metadata` sets "format". Shard files and a model.safetensors left by an earlier save with
/// a different layout are removed, so the directory always holds exactly one layout.
void save_state_dict(const std::filesystem::path& model_dir, const TensorMap& tensors,
                     int64_t max_shard_bytes = int64_t{5} << 30, const Metadata& metadata = {});

/// The file layout a model directory's weights are written in.
enum class WeightsFormat {
  kSafetensors,  // model.safetensors (sharded above max_shard_bytes): dschat's and transformers' default
  kTorchBin,     // pytorch_model.bin, one file, as DeepSpeed-Chat's save_hf_format writes (its step 3
                 // loads the reward model from exactly that file)
};
/// "safetensors" | "bin"; throws core::ConfigError naming `where` and the choices otherwise.
WeightsFormat parse_weights_format(const std::string& name, const std::string& where);
const char* weights_format_name(WeightsFormat format);

/// save_state_dict in `format`. kTorchBin writes one pytorch_model.bin and removes the
/// safetensors files and a .bin index an earlier save left (they would be read first).
void save_state_dict(const std::filesystem::path& model_dir, const TensorMap& tensors, WeightsFormat format,
                     int64_t max_shard_bytes = int64_t{5} << 30);

}  // namespace io
}  // namespace dschat
