// The sample log (src/rlhf/setup/sample_log.h): records written through, a rewind to step K drops the
// records of later updates from every rank's file (ranks of an earlier, larger world included)
// and keeps the event lines, a fresh start empties it, a line cut short by a kill is dropped,
// and a folder that cannot be written is an IoError naming the file.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/core/error.h"
#include "dist/child_runner.h"  // read_text
#include "rlhf/setup/sample_log.h"
#include "test_util.h"

namespace dschat {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

std::vector<json> lines_of(const fs::path& file) {
  std::vector<json> lines;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

std::vector<int64_t> updates_of(const fs::path& file) {
  std::vector<int64_t> updates;
  for (const json& line : lines_of(file)) {
    if (line.contains("update")) updates.push_back(line.at("update").get<int64_t>());
  }
  return updates;
}

TEST(SampleLog, RewindDropsLaterUpdatesFromEveryRanksFileAndKeepsEvents) {
  testing::TempDir dir;
  const fs::path logs = dir / "actor_logs";
  rlhf::SampleLog log(logs, nullptr);
  log.rewind(0, {{"event", "start"}});
  for (int64_t micro = 0; micro < 6; ++micro) log.record(0, micro, micro / 2 + 1, {2 * micro, 2 * micro + 1});
  ASSERT_EQ(log.file(), logs / "samples.rank0.jsonl");
  const std::vector<json> written = lines_of(log.file());  // read while the log is open: written through
  ASSERT_EQ(written.size(), 7u);
  EXPECT_EQ(written[0], json({{"event", "start"}, {"global_step", 0}}));
  EXPECT_EQ(written[3], json({{"epoch", 0}, {"micro_batch", 2}, {"update", 2}, {"ids", {4, 5}}}));

  // Rank 1 of an earlier 2-rank run of the step, and a last line cut short by a kill.
  std::ofstream(logs / "samples.rank1.jsonl") << json({{"epoch", 0}, {"micro_batch", 0}, {"update", 1}, {"ids", {9}}})
                                                     .dump()
                                              << '\n'
                                              << json({{"epoch", 0}, {"micro_batch", 1}, {"update", 3}, {"ids", {8}}})
                                                     .dump()
                                              << "\n{\"epoch\":0,\"micro_ba";
  std::ofstream(logs / "samples.rankX.jsonl") << "not ours\n";

  log.rewind(2, {{"event", "resume"}});
  EXPECT_EQ(updates_of(logs / "samples.rank0.jsonl"), (std::vector<int64_t>{1, 1, 2, 2}));
  EXPECT_EQ(updates_of(logs / "samples.rank1.jsonl"), (std::vector<int64_t>{1}));
  EXPECT_EQ(lines_of(logs / "samples.rank0.jsonl").back(), json({{"event", "resume"}, {"global_step", 2}}));
  EXPECT_EQ(testing::read_text(logs / "samples.rankX.jsonl"), "not ours\n");
  EXPECT_EQ(rlhf::sample_log_files(logs),
            (std::vector<fs::path>{logs / "samples.rank0.jsonl", logs / "samples.rank1.jsonl"}));

  log.record(0, 4, 3, {100});  // appended after the rewind's event
  EXPECT_EQ(updates_of(logs / "samples.rank0.jsonl"), (std::vector<int64_t>{1, 1, 2, 2, 3}));

  // A fresh start of the step: nothing of the earlier runs is left.
  log.rewind(0, {{"event", "start"}});
  EXPECT_FALSE(fs::exists(logs / "samples.rank1.jsonl"));
  EXPECT_EQ(lines_of(logs / "samples.rank0.jsonl").size(), 1u);
}

TEST(SampleLog, AnUnwritableFolderNamesTheFile) {
  testing::TempDir dir;
  std::ofstream(dir / "blocker") << "a file where the log folder should be";
  rlhf::SampleLog log(dir / "blocker", nullptr);
  EXPECT_THROW_WITH(log.record(0, 0, 1, {0}), core::IoError, (dir / "blocker/samples.rank0.jsonl").string());
  EXPECT_THROW_WITH(log.rewind(0, json::object()), core::IoError, (dir / "blocker").string());
}

}  // namespace
}  // namespace dschat
