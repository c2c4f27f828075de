#pragma once
// Reading a training checkpoint written by TrainingEngine::save_checkpoint, by any number of ranks
// at any ZeRO stage (docs/engine.md, "Checkpoints"):
//
//   <dir>/<tag>/engine.json          rank 0: counters, LR schedule, loss scaler, client state,
//                                    world size and stage, LoRA scales
//   <dir>/<tag>/rank<r>.safetensors  rank r's pieces: "<kind>.<name>" 1-D, kind = master (fp32
//                                    values), exp_avg, exp_avg_sq (Adam moments), frozen (values of
//                                    parameters without gradients); "buffer.<name>" (rank 0);
//                                    "rng.cpu" (rank r's generator state)
//   <dir>/<tag>/rank<r>.json         {"pieces": {name: {"offset", "numel", "shape", "step",
//                                    "trainable"}}}: where each piece sits in its flattened parameter
//   <dir>/<tag>/manifest.json        every file's bytes and SHA-256, written last
//   <dir>/latest                     the newest tag
//
// A piece is a contiguous range of one flattened parameter, so a reader with another world size
// or stage assembles whatever range it needs from the pieces that overlap it.
//   auto shards = engine::CheckpointShards::open(dir / "global_step20");
//   torch::Tensor w = shards.full("master", "model.decoder.layers.0.fc1.weight");

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace dschat {
namespace engine {

/// The engine.json "version" this build writes and reads (one constant for writer and reader).
constexpr int kCheckpointVersion = 2;

/// The tag <dir>/latest names. Throws core::NotFound when there is none.
std::string latest_checkpoint_tag(const std::filesystem::path& dir);

/// A finished checkpoint tag of a directory.
struct CheckpointTag {
  std::string tag;
  int64_t global_steps = -1;  // engine.json's (-1 when it cannot be read)
};
/// The finished tags of `dir` (directories with a manifest.json, which a save writes last; not a
/// save's ".tmp-"/".old-" directories, not the "<tag>.corrupt" / "<tag>.superseded" ones a resume moved aside), oldest first: by global steps, then by name. Empty when
/// `dir` does not exist.
std::vector<CheckpointTag> list_checkpoint_tags(const std::filesystem::path& dir);

/// One tag directory as `dschat ckpt list` / `ckpt verify` report it.
struct CheckpointStatus {
  std::string tag;
  int64_t global_steps = -1;  // engine.json's (-1 when it cannot be read)
  int64_t bytes = 0;          // what the tag's files take on disk
  bool latest = false;        // the tag <dir>/latest names
  std::string fault;          // empty when intact, as far as it was checked
};
/// Every tag directory of `dir` (finished or not, and those moved aside as <tag>.corrupt; not a
/// save's staging directories), newest first. Checked: the manifest exists and lists files that
/// exist with their sizes; with `checksums`, also every file's SHA-256 and the checkpoint's
/// layout (what a resume checks). Throws core::NotFound when `dir` is not a directory, or holds no
/// tag (no `latest`, no global_step* directory, none with engine.json or manifest.json: a saved
/// model's directory, say; the message points at <dir>_checkpoints when that exists).
std::vector<CheckpointStatus> inspect_checkpoints(const std::filesystem::path& dir, bool checksums);

class CheckpointShards {
 public:
  struct ParamInfo {
    std::vector<int64_t> shape;
    bool trainable = false;
  };

  /// Verifies every file against manifest.json (core::FormatError on a mismatch or a missing
  /// file, naming it) and indexes the pieces. Tensors are memory-mapped, not read.
  static CheckpointShards open(const std::filesystem::path& tag_dir);

  const std::filesystem::path& path() const { return root_; }
  const nlohmann::json& engine_state() const { return engine_; }
  int64_t saved_world_size() const { return static_cast<int64_t>(files_.size()); }
  const std::map<std::string, ParamInfo>& params() const { return params_; }

  /// Whether `kind` ("master", "exp_avg", "exp_avg_sq", "frozen") covers any of `name`.
  bool has(const std::string& kind, const std::string& name) const;
  /// Fills dest [n] (any dtype/device) with elements [offset, offset + n) of the flattened
  /// `kind` of parameter `name`. Throws core::FormatError naming the parameter when the pieces
  /// do not cover the range.
  void read(const std::string& kind, const std::string& name, int64_t offset, torch::Tensor dest) const;
  /// The Adam step count stored with the piece that holds element `offset` of `name`.
  int64_t step(const std::string& name, int64_t offset) const;
  /// The whole parameter, in its shape, fp32 (masters/moments) or its saved dtype (frozen).
  torch::Tensor full(const std::string& kind, const std::string& name) const;
  /// A tensor written by one rank under `key` ("rng.cpu", "buffer.<name>"); undefined if absent.
  torch::Tensor rank_tensor(int64_t rank, const std::string& key) const;

 private:
  struct Extent {
    size_t file = 0;
    int64_t offset = 0;
    int64_t numel = 0;
    int64_t step = 0;
  };
  const std::vector<Extent>& extents(const std::string& name) const;

  std::filesystem::path root_;
  nlohmann::json engine_;
  std::vector<std::map<std::string, torch::Tensor>> files_;  // per rank
  std::map<std::string, std::vector<Extent>> extents_;       // per parameter, in file order
  std::map<std::string, ParamInfo> params_;
};

}  // namespace engine
}  // namespace dschat
