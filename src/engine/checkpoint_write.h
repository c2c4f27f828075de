#pragma once
// Writing a snapshotted training checkpoint (internal to TrainingEngine::save_checkpoint), on the
// caller's thread or on an AsyncCheckpointWriter's. It uses no collective, so a background write
// never interleaves with training's: the ranks meet through the shared directory instead. Each
// rank writes its files into <dir>/.tmp-<tag>/, hashes them and leaves a marker
// (.rank<r>.done with the hashes, or .rank<r>.failed with the error); rank 0 waits for every
// rank's marker, writes engine.json and manifest.json, renames the directory to <dir>/<tag> and
// points <dir>/latest at it. Until then `latest` names the previous checkpoint, whatever fails
// or whoever is killed.
#include <atomic>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "dschat/io/state_dict.h"

namespace dschat {
namespace engine {

struct CheckpointSnapshot {
  std::filesystem::path dir;  // the checkpoint directory, shared by the ranks
  std::string tag;
  int64_t rank = 0;
  int64_t world_size = 1;
  io::TensorMap tensors;  // this rank's pieces on the host (copies when written in the background)
  nlohmann::json pieces;  // rank<r>.json: what each tensor is a piece of
  nlohmann::json engine_state;  // rank 0: engine.json
};

/// <dir>/.tmp-<tag>: where a save stages its files (created by rank 0 before the write).
std::filesystem::path checkpoint_staging_dir(const std::filesystem::path& dir, const std::string& tag);

/// Writes and (rank 0) commits `snapshot` as described above. Throws core::IoError naming the
/// file, or the rank that failed; rank 0 then removes the staging directory. `cancelled` stops
/// rank 0's wait for the other ranks (the job is being torn down): the checkpoint stays
/// uncommitted.
void write_checkpoint(const CheckpointSnapshot& snapshot, const std::atomic<bool>& cancelled);

}  // namespace engine
}  // namespace dschat
