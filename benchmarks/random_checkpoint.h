#pragma once
// What the generation benchmarks share: a random model of a preset's shape (transformers' init,
// N(0, 0.02), seeded) saved as a safetensors checkpoint that both dschat and the Python peer load,
// in a work dir the caller names or a new temporary one, removed with its files afterwards.
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "dschat/core/error.h"
#include "dschat/models/load_save.h"

namespace dschat {
namespace bench {

struct RandomCheckpoint {
  std::filesystem::path work;       // the work dir
  std::filesystem::path model_dir;  // work / "model": config.json + model.safetensors
  bool temporary = false;           // made here: remove() deletes it

  /// Deletes a temporary work dir, file by file: libtorch.so exports its own
  /// std::filesystem::remove_all, which crashed when a benchmark called it.
  void remove() const {
    if (!temporary) return;
    std::error_code error;
    for (const std::filesystem::path& dir : {model_dir, work}) {
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      for (const auto& file : files) std::filesystem::remove(file, error);
      std::filesystem::remove(dir, error);
    }
  }
};

/// Saves the random model into `work_dir` (empty: a new temporary dir named after `tag`).
inline RandomCheckpoint save_random_checkpoint(const std::string& preset, int64_t seed, const std::string& work_dir,
                                               const std::string& tag) {
  RandomCheckpoint checkpoint{work_dir, {}, work_dir.empty()};
  if (checkpoint.temporary) {
    std::string pattern = (std::filesystem::temp_directory_path() / (tag + "_XXXXXX")).string();
    DSCHAT_CHECK(::mkdtemp(pattern.data()) != nullptr, IoError, "mkdtemp failed for ", pattern);
    checkpoint.work = pattern;
  }
  checkpoint.model_dir = checkpoint.work / "model";
  torch::manual_seed(static_cast<uint64_t>(seed));
  models::LoadOptions random;
  random.random_init = true;
  auto model = models::load_causal_lm(preset, random);
  models::save_causal_lm(model, checkpoint.model_dir);
  return checkpoint;
}

}  // namespace bench
}  // namespace dschat
