// load_state_dict / save_state_dict: the Hugging Face checkpoint directory layouts.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>

#include "dschat/core/error.h"
#include "dschat/io/state_dict.h"
#include "io/atomic_file.h"

namespace dschat {
namespace io {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSafetensors = "model.safetensors";
constexpr const char* kSafetensorsIndex = "model.safetensors.index.json";
constexpr const char* kBin = "pytorch_model.bin";
constexpr const char* kBinIndex = "pytorch_model.bin.index.json";

using Loader = std::function<TensorMap(const fs::path&)>;

nlohmann::json read_index(const fs::path& index) {
  std::ifstream in(index, std::ios::binary);
  DSCHAT_CHECK(in.good(), IoError, index.string(), ": cannot open for reading");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    DSCHAT_THROW(FormatError, index.string(), ": not valid JSON: ", e.what());
  }
}

// A shard named by an index must be a plain file next to it: no absolute paths, no "..".
void check_shard_name(const fs::path& index, const std::string& tensor, const std::string& shard) {
  fs::path p(shard);
  bool ok = !shard.empty() && p.is_relative() && p.has_filename();
  for (const auto& part : p) ok = ok && part != "..";
  DSCHAT_CHECK(ok, FormatError, index.string(), ": tensor '", tensor, "' maps to shard '", shard,
               "', which is not a file name inside the model directory");
}

TensorMap load_sharded(const fs::path& index, const Loader& loader) {
  nlohmann::json json = read_index(index);
  DSCHAT_CHECK(json.is_object() && json.contains("weight_map") && json["weight_map"].is_object(),
               FormatError, index.string(), ": expected an object with a 'weight_map' object");
  // shard file -> tensor names, so that every shard is loaded exactly once.
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [tensor, shard] : json["weight_map"].items()) {
    DSCHAT_CHECK(shard.is_string(), FormatError, index.string(), ": weight_map entry '", tensor,
                 "' must be a file name string");
    check_shard_name(index, tensor, shard.get<std::string>());
    by_shard[shard.get<std::string>()].push_back(tensor);
  }
  TensorMap tensors;
  for (const auto& [shard, names] : by_shard) {
    const fs::path shard_path = index.parent_path() / shard;
    TensorMap loaded = loader(shard_path);
    for (const auto& name : names) {
      auto found = loaded.find(name);
      DSCHAT_CHECK(found != loaded.end(), FormatError, index.string(), ": tensor '", name,
                   "' is mapped to shard ", shard_path.string(), ", which does not contain it");
      tensors[name] = found->second;
    }
  }
  return tensors;
}

std::string shard_name(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", index, count);
  return name;
}

void remove_file(const fs::path& file) {
  std::error_code ec;
  fs::remove(file, ec);
  DSCHAT_CHECK(!ec, IoError, file.string(), ": cannot remove stale checkpoint file: ", ec.message());
}

// Removes shard files of earlier saves that the new layout does not use, so that no index or
// loader can pick up weights of a different save.
void remove_stale_shards(const fs::path& dir, const std::set<std::string>& keep) {
  static const std::regex kShard(R"(model-\d{5,}-of-\d{5,}\.safetensors)");
  std::vector<fs::path> stale;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (std::regex_match(name, kShard) && !keep.count(name)) stale.push_back(entry.path());
  }
  DSCHAT_CHECK(!ec, IoError, dir.string(), ": cannot list directory: ", ec.message());
  for (const auto& file : stale) remove_file(file);
}

}  // namespace

TensorMap load_state_dict(const fs::path& model_dir) {
  auto safetensors = [](const fs::path& file) { return load_safetensors(file); };
  if (fs::is_regular_file(model_dir / kSafetensors)) return load_safetensors(model_dir / kSafetensors);
  if (fs::is_regular_file(model_dir / kSafetensorsIndex)) {
    return load_sharded(model_dir / kSafetensorsIndex, safetensors);
  }
  if (fs::is_regular_file(model_dir / kBin)) return load_torch_bin(model_dir / kBin);
  if (fs::is_regular_file(model_dir / kBinIndex)) return load_sharded(model_dir / kBinIndex, load_torch_bin);
  DSCHAT_THROW(NotFound, model_dir.string(), ": no checkpoint found; looked for ", kSafetensors, ", ",
               kSafetensorsIndex, ", ", kBin, " and ", kBinIndex,
               fs::is_directory(model_dir) ? "" : " (the directory does not exist)");
}

void save_state_dict(const fs::path& model_dir, const TensorMap& tensors, int64_t max_shard_bytes,
                     const Metadata& metadata) {
  DSCHAT_CHECK(max_shard_bytes > 0, InvalidArgument, model_dir.string(),
               ": max_shard_bytes must be positive, got ", max_shard_bytes);
  std::error_code ec;
  fs::create_directories(model_dir, ec);
  DSCHAT_CHECK(!ec, IoError, model_dir.string(), ": cannot create directory: ", ec.message());
  // transformers refuses safetensors checkpoints whose metadata lacks a "format" entry.
  Metadata meta = metadata;
  meta.emplace("format", "pt");

  // Greedy split in name order: a new shard starts when the next tensor would overflow the
  // current one (a single tensor larger than the limit gets a shard of its own).
  std::vector<TensorMap> shards(1);
  int64_t shard_bytes = 0;
  int64_t total_bytes = 0;
  for (const auto& [name, tensor] : tensors) {
    const int64_t bytes = tensor.defined() ? static_cast<int64_t>(tensor.numel() * tensor.element_size()) : 0;
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace(name, tensor);
    shard_bytes += bytes;
    total_bytes += bytes;
  }

  if (shards.size() == 1) {
    save_safetensors(model_dir / kSafetensors, tensors, meta);
    remove_file(model_dir / kSafetensorsIndex);
    remove_stale_shards(model_dir, {});
    return;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  std::set<std::string> names;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shard_name(i + 1, shards.size());
    save_safetensors(model_dir / name, shards[i], meta);
    for (const auto& entry : shards[i]) weight_map[entry.first] = name;
    names.insert(name);
  }
  // model.safetensors would take precedence over the index: remove it before the index exists.
  remove_file(model_dir / kSafetensors);
  nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  write_file_atomically(model_dir / kSafetensorsIndex, index.dump(2) + "\n");
  remove_stale_shards(model_dir, names);
}

WeightsFormat parse_weights_format(const std::string& name, const std::string& where) {
  if (name == "safetensors") return WeightsFormat::kSafetensors;
  if (name == "bin") return WeightsFormat::kTorchBin;
  DSCHAT_THROW(ConfigError, where, ": '", name, "' is not a weights format (safetensors or bin)");
}

const char* weights_format_name(WeightsFormat format) {
  return format == WeightsFormat::kTorchBin ? "bin" : "safetensors";
}

void save_state_dict(const fs::path& model_dir, const TensorMap& tensors, WeightsFormat format,
                     int64_t max_shard_bytes) {
  if (format == WeightsFormat::kSafetensors) {
    save_state_dict(model_dir, tensors, max_shard_bytes);
    return;
  }
  std::error_code ec;
  fs::create_directories(model_dir, ec);
  DSCHAT_CHECK(!ec, IoError, model_dir.string(), ": cannot create directory: ", ec.message());
  save_torch_bin(model_dir / kBin, tensors);
  remove_file(model_dir / kSafetensors);
  remove_file(model_dir / kSafetensorsIndex);
  remove_file(model_dir / kBinIndex);
  remove_stale_shards(model_dir, {});
}

}  // namespace io
}  // namespace dschat
