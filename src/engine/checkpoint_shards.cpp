#include "dschat/engine/checkpoint_shards.h"

#include <algorithm>
#include <fstream>

#include "io/sha256.h"
#include "dschat/core/error.h"
#include "dschat/io/state_dict.h"

namespace dschat {
namespace engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const fs::path& file) {
  std::ifstream in(file);
  DSCHAT_CHECK(in, NotFound, file.string(), ": missing");
  json value = json::parse(in, nullptr, false);
  DSCHAT_CHECK(!value.is_discarded(), FormatError, file.string(), ": malformed JSON");
  return value;
}

}  // namespace

std::string latest_checkpoint_tag(const fs::path& dir) {
  std::ifstream latest(dir / "latest");
  std::string tag;
  DSCHAT_CHECK(latest && std::getline(latest, tag) && !tag.empty(), NotFound, (dir / "latest").string(),
               ": no checkpoint (the file naming the latest tag is missing)");
  return tag;
}

std::vector<CheckpointTag> list_checkpoint_tags(const fs::path& dir) {
  std::vector<CheckpointTag> tags;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return tags;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const auto ends_with = [&](const std::string& suffix) {
      return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    const bool aside = ends_with(".corrupt") || ends_with(".superseded");  // moved aside by a resume
    if (name.empty() || name[0] == '.' || aside || !entry.is_directory() ||
        !fs::exists(entry.path() / "manifest.json")) {
      continue;
    }
    CheckpointTag tag{name, -1};
    try {
      tag.global_steps = read_json(entry.path() / "engine.json").value("global_steps", int64_t{-1});
    } catch (const std::exception&) {
      // unreadable: ordered first, so retention removes it before any readable tag
    }
    tags.push_back(tag);
  }
  std::sort(tags.begin(), tags.end(), [](const CheckpointTag& a, const CheckpointTag& b) {
    return a.global_steps != b.global_steps ? a.global_steps < b.global_steps : a.tag < b.tag;
  });
  return tags;
}

std::vector<CheckpointStatus> inspect_checkpoints(const fs::path& dir, bool checksums) {
  std::error_code ec;
  DSCHAT_CHECK(fs::is_directory(dir, ec), NotFound, dir.string(), ": no such checkpoint directory");
  std::string latest;
  if (fs::exists(dir / "latest")) latest = latest_checkpoint_tag(dir);
  std::vector<CheckpointStatus> statuses;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.' || !entry.is_directory()) continue;
    // A tag: what `latest` names, a global_stepN directory, or one holding an engine state or a
    // manifest (a damaged tag keeps at least its name); other directories are not checkpoints.
    const bool tag = name == latest || name.rfind("global_step", 0) == 0 || fs::exists(entry.path() / "engine.json") ||
                     fs::exists(entry.path() / "manifest.json");
    if (!tag) continue;
    CheckpointStatus status;
    status.tag = name;
    status.latest = name == latest;
    for (const auto& file : fs::directory_iterator(entry.path())) {
      if (file.is_regular_file()) status.bytes += static_cast<int64_t>(file.file_size());
    }
    try {
      status.global_steps = read_json(entry.path() / "engine.json").value("global_steps", int64_t{-1});
      const json manifest = read_json(entry.path() / "manifest.json");
      for (const auto& [file, listed] : manifest.at("files").items()) {
        const fs::path path = entry.path() / file;
        DSCHAT_CHECK(fs::exists(path), FormatError, path.string(), ": listed in the manifest but missing");
        const int64_t size = static_cast<int64_t>(fs::file_size(path)), expected = listed.value("bytes", int64_t{-1});
        DSCHAT_CHECK(size == expected, FormatError, path.string(), ": ", size, " bytes, the manifest says ", expected,
                     " (truncated or modified)");
      }
      if (checksums) CheckpointShards::open(entry.path());
    } catch (const std::exception& e) {
      status.fault = e.what();
    }
    statuses.push_back(status);
  }
  if (statuses.empty() && latest.empty()) {
    // An output directory (a saved model) given for its checkpoints, most likely.
    std::string hint;
    fs::path sibling = dir;
    while (!sibling.empty() && sibling.filename().empty()) sibling = sibling.parent_path();  // "out/actor/"
    sibling += "_checkpoints";
    if (fs::is_directory(sibling, ec)) hint = "; a run keeps its checkpoints beside its output: " + sibling.string();
    DSCHAT_CHECK(false, NotFound, dir.string(),
                 ": no checkpoint tags here (no 'latest', no global_step* or tag directory with engine.json)", hint);
  }
  std::sort(statuses.begin(), statuses.end(), [](const CheckpointStatus& a, const CheckpointStatus& b) {
    return a.global_steps != b.global_steps ? a.global_steps > b.global_steps : a.tag > b.tag;
  });
  return statuses;
}

CheckpointShards CheckpointShards::open(const fs::path& tag_dir) {
  CheckpointShards shards;
  shards.root_ = tag_dir;
  const fs::path manifest_file = tag_dir / "manifest.json";
  DSCHAT_CHECK(fs::exists(tag_dir), NotFound, tag_dir.string(), ": no such checkpoint");
  const json manifest = read_json(manifest_file);
  DSCHAT_CHECK(manifest.contains("files") && manifest["files"].is_object(), FormatError, manifest_file.string(),
               ": has no \"files\" object");
  for (const auto& [name, entry] : manifest["files"].items()) {
    const fs::path file = tag_dir / name;
    DSCHAT_CHECK(fs::exists(file), FormatError, file.string(), ": listed in ", manifest_file.string(),
                 " but missing (incomplete checkpoint)");
    DSCHAT_CHECK(io::sha256_of_file(file) == entry.value("sha256", ""), FormatError, file.string(),
                 ": checksum mismatch (corrupt or modified checkpoint)");
  }
  shards.engine_ = read_json(tag_dir / "engine.json");
  DSCHAT_CHECK(shards.engine_.value("version", 0) == kCheckpointVersion, FormatError,
               (tag_dir / "engine.json").string(), ": checkpoint format version ", shards.engine_.value("version", 0),
               ", this dschat reads ", kCheckpointVersion);
  const int64_t world = shards.engine_.value("world_size", int64_t{0});
  DSCHAT_CHECK(world >= 1, FormatError, (tag_dir / "engine.json").string(), ": bad world_size ", world);
  for (int64_t rank = 0; rank < world; ++rank) {
    const std::string stem = "rank" + std::to_string(rank);
    DSCHAT_CHECK(manifest["files"].contains(stem + ".safetensors") && manifest["files"].contains(stem + ".json"),
                 FormatError, manifest_file.string(), ": lists no files of rank ", rank, " (saved by ", world,
                 " ranks)");
    shards.files_.push_back(io::load_safetensors(tag_dir / (stem + ".safetensors")));
    const json index = read_json(tag_dir / (stem + ".json"));
    for (const auto& [name, piece] : index.at("pieces").items()) {
      Extent extent{static_cast<size_t>(rank), piece.at("offset").get<int64_t>(), piece.at("numel").get<int64_t>(),
                    piece.value("step", int64_t{0})};
      shards.extents_[name].push_back(extent);
      shards.params_[name] = {piece.at("shape").get<std::vector<int64_t>>(), piece.at("trainable").get<bool>()};
    }
  }
  return shards;
}

const std::vector<CheckpointShards::Extent>& CheckpointShards::extents(const std::string& name) const {
  auto it = extents_.find(name);
  DSCHAT_CHECK(it != extents_.end(), FormatError, root_.string(), ": no parameter '", name,
               "' in this checkpoint (a different model?)");
  return it->second;
}

bool CheckpointShards::has(const std::string& kind, const std::string& name) const {
  auto it = extents_.find(name);
  if (it == extents_.end()) return false;
  for (const Extent& extent : it->second) {
    if (files_[extent.file].count(kind + "." + name)) return true;
  }
  return false;
}

void CheckpointShards::read(const std::string& kind, const std::string& name, int64_t offset, torch::Tensor dest) const {
  const int64_t numel = dest.numel();
  torch::Tensor flat_dest = dest.view({-1});  // [numel]
  int64_t covered = 0;
  for (const Extent& extent : extents(name)) {
    const int64_t begin = std::max(offset, extent.offset);
    const int64_t end = std::min(offset + numel, extent.offset + extent.numel);
    if (end <= begin) continue;
    const auto& file = files_[extent.file];
    auto it = file.find(kind + "." + name);
    DSCHAT_CHECK(it != file.end() && it->second.numel() == extent.numel, FormatError, root_.string(), "/rank",
                 extent.file, ".safetensors: tensor '", kind, ".", name, "' is missing or has the wrong size");
    torch::NoGradGuard no_grad;
    flat_dest.narrow(0, begin - offset, end - begin).copy_(it->second.narrow(0, begin - extent.offset, end - begin));
    covered += end - begin;
  }
  DSCHAT_CHECK(covered == numel, FormatError, root_.string(), ": the saved pieces of '", name, "' cover ", covered,
               " of elements [", offset, ", ", offset + numel, ") (", kind, ")");
}

int64_t CheckpointShards::step(const std::string& name, int64_t offset) const {
  for (const Extent& extent : extents(name)) {
    if (offset >= extent.offset && offset < extent.offset + extent.numel) return extent.step;
  }
  DSCHAT_THROW(FormatError, root_.string(), ": no saved piece of '", name, "' holds element ", offset);
}

torch::Tensor CheckpointShards::full(const std::string& kind, const std::string& name) const {
  const std::vector<Extent>& saved = extents(name);
  const ParamInfo& info = params_.at(name);
  torch::ScalarType dtype = torch::kFloat32;
  for (const Extent& extent : saved) {
    auto it = files_[extent.file].find(kind + "." + name);
    if (it != files_[extent.file].end()) dtype = it->second.scalar_type();
  }
  torch::Tensor value = torch::empty(info.shape, torch::dtype(dtype));  // the parameter's shape
  read(kind, name, 0, value);
  return value;
}

torch::Tensor CheckpointShards::rank_tensor(int64_t rank, const std::string& key) const {
  if (rank < 0 || rank >= saved_world_size()) return torch::Tensor();
  auto it = files_[rank].find(key);
  return it == files_[rank].end() ? torch::Tensor() : it->second;
}

}  // namespace engine
}  // namespace dschat
