#include "engine/checkpoint_write.h"

#include <chrono>
#include <fstream>
#include <mutex>
#include <thread>

#include "dschat/core/error.h"
#include "engine/checkpoint_testing.h"
#include "io/atomic_file.h"
#include "io/sha256.h"

namespace dschat {
namespace engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::mutex hook_mutex;
std::function<void(const fs::path&)> write_hook_for_testing;

void run_write_hook(const fs::path& staging) {
  std::function<void(const fs::path&)> hook;
  {
    std::lock_guard<std::mutex> lock(hook_mutex);
    hook = write_hook_for_testing;
  }
  if (hook) hook(staging);
}

fs::path marker(const fs::path& staging, int64_t rank, const char* kind) {
  return staging / (".rank" + std::to_string(rank) + "." + kind);
}

json file_entry(const fs::path& file) {
  return {{"bytes", fs::file_size(file)}, {"sha256", io::sha256_of_file(file)}};
}

// Rank 0: the other ranks' file entries, once each has marked its files done. Throws when a rank
// marked a failure, or when `cancelled` is raised first.
json wait_for_ranks(const CheckpointSnapshot& snapshot, const fs::path& staging, const std::atomic<bool>& cancelled) {
  json files = json::object();
  auto pause = std::chrono::milliseconds(5);
  for (int64_t r = 1; r < snapshot.world_size;) {
    const fs::path done = marker(staging, r, "done"), failed = marker(staging, r, "failed");
    if (fs::exists(done)) {
      std::ifstream in(done);
      json entries = json::parse(in, nullptr, /*allow_exceptions=*/false);
      DSCHAT_CHECK(entries.is_object(), IoError, done.string(), ": unreadable marker of rank ", r);
      files.update(entries);
      ++r;
      continue;
    }
    if (fs::exists(failed)) {
      std::ifstream in(failed);
      const std::string why((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      throw core::IoError("checkpoint " + snapshot.tag + ": rank " + std::to_string(r) +
                          " could not write its part: " + why);
    }
    DSCHAT_CHECK(!cancelled.load(), IoError, "checkpoint ", snapshot.tag, ": abandoned while waiting for rank ", r,
                 " to finish writing (the run is stopping); ", snapshot.dir.string(),
                 "/latest still names the previous checkpoint");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  return files;
}

void commit(const CheckpointSnapshot& snapshot, const fs::path& staging, json files) {
  io::write_file_atomically(staging / "engine.json", snapshot.engine_state.dump(1));
  files["engine.json"] = file_entry(staging / "engine.json");
  io::write_file_atomically(staging / "manifest.json", json{{"tag", snapshot.tag}, {"files", files}}.dump(1));
  for (int64_t r = 1; r < snapshot.world_size; ++r) fs::remove(marker(staging, r, "done"));
  // Swap the finished directory into place; an older copy of the same tag is removed only after.
  const fs::path final_dir = snapshot.dir / snapshot.tag, old = snapshot.dir / (".old-" + snapshot.tag);
  io::remove_directory_tree(old);
  if (fs::exists(final_dir)) fs::rename(final_dir, old);
  fs::rename(staging, final_dir);
  io::write_file_atomically(snapshot.dir / "latest", snapshot.tag);
  io::remove_directory_tree(old);
}

}  // namespace

namespace testing {
void set_checkpoint_write_hook(std::function<void(const fs::path&)> hook) {
  std::lock_guard<std::mutex> lock(hook_mutex);
  write_hook_for_testing = std::move(hook);
}
}  // namespace testing

fs::path checkpoint_staging_dir(const fs::path& dir, const std::string& tag) { return dir / (".tmp-" + tag); }

void write_checkpoint(const CheckpointSnapshot& snapshot, const std::atomic<bool>& cancelled) {
  const fs::path staging = checkpoint_staging_dir(snapshot.dir, snapshot.tag);
  const std::string stem = "rank" + std::to_string(snapshot.rank);
  try {
    io::save_safetensors(staging / (stem + ".safetensors"), snapshot.tensors);
    io::write_file_atomically(staging / (stem + ".json"),
                              json{{"rank", snapshot.rank}, {"pieces", snapshot.pieces}}.dump(1));
    run_write_hook(staging);
    // Each rank hashes its own files: the manifest costs rank 0 no pass over the others' bytes.
    const json mine = {{stem + ".safetensors", file_entry(staging / (stem + ".safetensors"))},
                       {stem + ".json", file_entry(staging / (stem + ".json"))}};
    if (snapshot.rank != 0) {
      io::write_file_atomically(marker(staging, snapshot.rank, "done"), mine.dump());
      return;
    }
    json files = snapshot.world_size > 1 ? wait_for_ranks(snapshot, staging, cancelled) : json::object();
    files.update(mine);
    commit(snapshot, staging, std::move(files));
  } catch (const std::exception& e) {
    if (snapshot.rank == 0) {
      try {
        io::remove_directory_tree(staging);
      } catch (const std::exception&) {  // reported below; the next save of the tag clears it
      }
    } else {
      try {
        io::write_file_atomically(marker(staging, snapshot.rank, "failed"), e.what());
      } catch (const std::exception&) {  // rank 0 then waits until it is cancelled
      }
    }
    throw;
  }
}

}  // namespace engine
}  // namespace dschat
