// `dschat ckpt list DIR` and `dschat ckpt verify DIR`: the tags of a training checkpoint directory
// (e.g. out/actor_checkpoints, or step 3's out/actor_checkpoints/actor), newest first, with their
// global step, size and integrity. `list` checks that each manifest's files are there with their
// sizes; `verify` also hashes every file (what a resume checks) and exits with status 1 when a
// tag is damaged or `latest` names a tag that is not there.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "dschat/core/error.h"
#include "dschat/engine/checkpoint_shards.h"

namespace dschat {
namespace cli {
namespace {

void run_ckpt(const std::string& dir, bool verify) {
  const std::vector<engine::CheckpointStatus> statuses = engine::inspect_checkpoints(dir, verify);
  std::printf("%-28s %10s %12s  %s\n", "tag", "step", "MiB", verify ? "integrity (checksums)" : "integrity (sizes)");
  int64_t damaged = 0;
  for (const engine::CheckpointStatus& s : statuses) {
    const std::string tag = s.tag + (s.latest ? " (latest)" : "");
    std::printf("%-28s %10lld %12.1f  %s\n", tag.c_str(), static_cast<long long>(s.global_steps),
                static_cast<double>(s.bytes) / (1 << 20), s.fault.empty() ? "ok" : s.fault.c_str());
    damaged += s.fault.empty() ? 0 : 1;
  }
  // `latest` naming a tag that is not there (deleted by hand, or a copy that missed it) is damage
  // too: a resume cannot start where `latest` says.
  std::string dangling;
  if (std::filesystem::exists(std::filesystem::path(dir) / "latest")) {
    const std::string latest = engine::latest_checkpoint_tag(dir);
    bool listed = false;
    for (const engine::CheckpointStatus& s : statuses) listed = listed || s.tag == latest;
    if (!listed) {
      dangling = latest;
      std::printf("%-28s %10s %12s  %s\n", (latest + " (latest)").c_str(), "-", "-", "missing: no such tag");
    }
  }
  std::fflush(stdout);
  DSCHAT_CHECK(!verify || dangling.empty(), FormatError, dir, ": 'latest' names ", dangling,
               ", which is not there (a resume uses the newest intact tag instead)");
  DSCHAT_CHECK(!verify || damaged == 0, FormatError, dir, ": ", damaged, " of ", statuses.size(),
               " checkpoint tags are damaged (a resume moves them aside and uses the newest intact one)");
}

}  // namespace

void add_ckpt_command(CLI::App& app) {
  auto* ckpt = app.add_subcommand("ckpt", "Inspect a training checkpoint directory");
  ckpt->require_subcommand(1);
  for (const bool verify : {false, true}) {
    auto dir = std::make_shared<std::string>();
    auto* cmd = ckpt->add_subcommand(verify ? "verify" : "list",
                                     verify ? "Tags with their step and size, every file hashed against its manifest"
                                            : "Tags with their step, size, and whether their files are all there");
    cmd->add_option("dir", *dir, "Checkpoint directory (holds 'latest' and the tags)")->required();
    cmd->callback([dir, verify] { run_ckpt(*dir, verify); });
  }
}

}  // namespace cli
}  // namespace dschat
