#pragma once
// Runs of `dschat train` on 1..4 local ranks for the elastic-resume tests: to the end, or killed
// (the launcher and every rank, SIGKILL) once a number of checkpoints is committed; and the
// per-epoch multisets of the sample ids a step's log_sample_ids wrote (src/rlhf/setup/sample_log.h).
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/child_runner.h"
#include "rank_jobs.h"  // free_port
#include "test_util.h"

namespace dschat {
namespace testing {

/// `dschat train --config <config> --step <step>` on `world` ranks (through `dschat launch` when
/// more than one), output into <dir>/<tag>.out and .err.
inline Process start_train(int world, const std::filesystem::path& config, int step, const std::filesystem::path& dir,
                           const std::string& tag) {
  const std::string cli = DSCHAT_CLI_PATH;
  std::vector<std::string> argv;
  if (world > 1) {
    argv = {cli, "launch", "--nproc-per-node", std::to_string(world), "--master-port", std::to_string(free_port()),
            "--"};
  }
  for (const std::string& arg :
       {cli, std::string("train"), std::string("--config"), config.string(), std::string("--step"),
        std::to_string(step), std::string("--no-progress")}) {
    argv.push_back(arg);
  }
  return Process(argv, {"OMP_NUM_THREADS=1"}, dir / (tag + ".out"), dir / (tag + ".err"));
}

/// Runs to the end; the exit code (stderr into *err).
inline int run_train(int world, const std::filesystem::path& config, int step, const std::filesystem::path& dir,
                     const std::string& tag, std::string* err) {
  Process job = start_train(world, config, step, dir, tag);
  if (!job.wait_for(std::chrono::seconds(400))) {
    *err = "timed out\n" + job.err();
    return -1;
  }
  *err = job.out() + job.err();
  return job.exit_code();
}

/// SIGKILLs every process whose command line mentions `tag` (the launcher and its ranks).
inline void kill_all_mentioning(const std::string& tag) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (read_text(entry.path() / "cmdline").find(tag) != std::string::npos) {
      kill(static_cast<pid_t>(std::stoi(name)), SIGKILL);
    }
  }
}

/// The optimizer step of the tag `latest` names in `checkpoints` (0 when none).
inline int64_t committed_step(const std::filesystem::path& checkpoints) {
  const std::filesystem::path latest = checkpoints / "latest";
  const std::string tag = std::filesystem::exists(latest) ? read_text(latest) : "";
  return tag.rfind("global_step", 0) == 0 && tag.size() > 11 ? std::stoll(tag.substr(11)) : 0;
}

/// Starts the run and kills it once `checkpoints` holds global_step`at_least` or later. Fails
/// the test when the run ends first.
inline void run_train_killed(int world, const std::filesystem::path& config, int step, const std::filesystem::path& dir,
                             const std::filesystem::path& checkpoints, int64_t at_least) {
  Process job = start_train(world, config, step, dir, "killed");
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (job.running() && std::chrono::steady_clock::now() < give_up && committed_step(checkpoints) < at_least) {
    job.wait_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(job.running()) << "the run ended before it could be killed\n" << job.err();
  kill_all_mentioning(config.string());
  ASSERT_TRUE(job.wait_for(std::chrono::seconds(30))) << job.err();
}

/// What a step's sample log says was trained: per epoch the multiset of sample ids, and the
/// optimizer steps (`update`) the records feed.
struct SampleLogContents {
  std::map<int64_t, std::multiset<int64_t>> ids_per_epoch;
  std::set<int64_t> updates;
  int64_t resumes = 0;
};

inline SampleLogContents read_sample_log(const std::filesystem::path& log_dir) {
  SampleLogContents contents;
  for (const auto& entry : std::filesystem::directory_iterator(log_dir)) {
    if (entry.path().filename().string().rfind("samples.rank", 0) != 0) continue;
    std::ifstream in(entry.path());
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json record = nlohmann::json::parse(line);
      if (record.value("event", "") == "resume") ++contents.resumes;
      if (!record.contains("ids")) continue;
      contents.updates.insert(record.at("update").get<int64_t>());
      for (int64_t id : record.at("ids").get<std::vector<int64_t>>()) {
        contents.ids_per_epoch[record.at("epoch").get<int64_t>()].insert(id);
      }
    }
  }
  return contents;
}

}  // namespace testing
}  // namespace dschat
