#pragma once
// Where a model named on the command line lives. In order:
//   1. a local directory (containing config.json);
//   2. a Hugging Face id in the local HF cache: $HF_HUB_CACHE, $HF_HOME/hub or
//      ~/.cache/huggingface/hub, as models--org--name/snapshots/<refs/main or newest>;
//   3. a short name mapped to its HF id ("opt-1.3b" -> "facebook/opt-1.3b",
//      "llama-2-7b" -> "meta-llama/Llama-2-7b-hf"), then looked up as in 2.
// Nothing is downloaded: a model that is not on disk is an error listing every path searched.

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dschat {
namespace io {

/// The directory holding config.json for `name_or_path`. Throws core::NotFound listing the
/// paths searched.
std::filesystem::path resolve_model_dir(const std::string& name_or_path);

/// The HF id a short name stands for ("opt-350m" -> "facebook/opt-350m"), or the input itself.
std::string expand_short_model_name(const std::string& name);

/// The hub cache roots consulted, in order (existing or not).
std::vector<std::filesystem::path> hf_cache_roots();

/// The snapshot of `repo_id` in the hub cache: <root>/<kind>--org--name/snapshots/<hash>, kind
/// "models" or "datasets"; the hash refs/main names if `accept` takes it, else the newest accepted
/// snapshot; roots in hf_cache_roots() order. Every path looked at is appended to `searched`.
std::optional<std::filesystem::path> find_cached_snapshot(const std::string& kind, const std::string& repo_id,
                                                          const std::function<bool(const std::filesystem::path&)>& accept,
                                                          std::vector<std::string>* searched);

}  // namespace io
}  // namespace dschat
