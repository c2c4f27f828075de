// monitor::MetricsLog (JSON Lines + TensorBoard event files, checked by an independent Python decoder) and
// the monitor::Progress display.
#include "dschat/monitor/metrics_log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "dschat/core/logging.h"
#include "dschat/monitor/progress.h"
#include "monitor/tensorboard_events.h"
#include "test_util.h"

namespace dschat {
namespace {

using monitor::MetricsLog;
using monitor::MetricsLogOptions;
using testing::TempDir;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void append_text(const std::filesystem::path& file, const std::string& text) {
  std::ofstream(file, std::ios::binary | std::ios::app) << text;
}

std::vector<std::filesystem::path> event_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

TEST(MetricsLog, WritesJsonLinesThatReadBack) {
  TempDir tmp;
  {
    monitor::MetricsLog log(tmp / "run");
    log.write("sft", 1, {{"loss", 2.5}, {"lr", 1e-4}});
    log.write("sft", 2, {{"loss", kNaN}, {"eval_loss", std::numeric_limits<double>::infinity()}});
  }
  const std::string text = read_text(tmp / "run" / "metrics.jsonl");
  EXPECT_EQ(text.rfind("{\"phase\":\"sft\",\"step\":1,\"time\":", 0), 0u) << text;
  EXPECT_NE(text.find("\"loss\":2.5,\"lr\":0.0001}\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\"loss\":null,\"eval_loss\":null}\n"), std::string::npos) << text;

  const auto rows = monitor::read_metrics_jsonl(tmp / "run" / "metrics.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].phase, "sft");
  EXPECT_EQ(rows[0].step, 1);
  EXPECT_GT(rows[0].time, 1.6e9);  // unix seconds, not a monotonic clock
  EXPECT_DOUBLE_EQ(rows[0].values.at("loss"), 2.5);
  EXPECT_DOUBLE_EQ(rows[0].values.at("lr"), 1e-4);
  EXPECT_TRUE(std::isnan(rows[1].values.at("loss")));
  EXPECT_TRUE(std::isnan(rows[1].values.at("eval_loss")));
  EXPECT_GE(rows[1].time, rows[0].time);
}

TEST(MetricsLog, ResumedRunAppendsAfterTheExistingLines) {
  TempDir tmp;
  { monitor::MetricsLog(tmp.path()).write("ppo", 1, {{"reward", 0.5}}); }
  // A run killed mid-write leaves an unterminated fragment; the resumed run must not glue onto it.
  append_text(tmp / "metrics.jsonl", "{\"phase\":\"ppo\",\"st");
  { monitor::MetricsLog(tmp.path()).write("ppo", 2, {{"reward", 0.75}}); }
  const auto rows = monitor::read_metrics_jsonl(tmp / "metrics.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].step, 1);
  EXPECT_EQ(rows[1].step, 2);
  EXPECT_DOUBLE_EQ(rows[1].values.at("reward"), 0.75);
}

TEST(MetricsLog, ReaderIgnoresATruncatedLastLineOnly) {
  TempDir tmp;
  const auto file = tmp / "metrics.jsonl";
  append_text(file, "{\"phase\":\"rm\",\"step\":3,\"time\":1.5,\"loss\":0.25,\"note\":\"text\"}\n{\"phase\":\"rm\",\"ste");
  auto rows = monitor::read_metrics_jsonl(file);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].values.size(), 1u);  // non-numeric values are not metrics

  append_text(file, "\n{\"phase\":\"rm\",\"step\":4,\"time\":2.5}\n");
  EXPECT_THROW_WITH(monitor::read_metrics_jsonl(file), core::FormatError, "metrics.jsonl:2");

  TempDir tmp2;
  append_text(tmp2 / "metrics.jsonl", "{\"phase\":\"rm\",\"time\":2.5}\n");
  EXPECT_THROW_WITH(monitor::read_metrics_jsonl(tmp2 / "metrics.jsonl"), core::FormatError, "'step'");
  EXPECT_THROW_WITH(monitor::read_metrics_jsonl(tmp2 / "absent.jsonl"), core::IoError, "absent.jsonl");
}

TEST(MetricsLog, RejectsReservedRepeatedOrEmptyNames) {
  TempDir tmp;
  monitor::MetricsLog log(tmp.path());
  EXPECT_THROW_WITH(log.write("sft", 1, {{"step", 1.0}}), core::InvalidArgument, "'step'");
  EXPECT_THROW_WITH(log.write("sft", 1, {{"loss", 1.0}, {"loss", 2.0}}), core::InvalidArgument, "'loss'");
  EXPECT_THROW_WITH(log.write("", 1, {{"loss", 1.0}}), core::InvalidArgument, "empty phase");
}

TEST(MetricsLog, OtherRanksWriteNothing) {
  TempDir tmp;
  monitor::MetricsLogOptions options;
  options.rank0 = false;
  options.tensorboard = true;
  monitor::MetricsLog log(tmp / "run", options);
  log.write("ppo", 1, {{"kl", 0.1}});
  EXPECT_FALSE(std::filesystem::exists(tmp / "run"));
  EXPECT_EQ(log.jsonl_path(), tmp / "run" / "metrics.jsonl");
  EXPECT_TRUE(log.tensorboard_path().empty());
}

TEST(MetricsLog, Crc32cMatchesKnownVectors) {
  EXPECT_EQ(monitor::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(monitor::crc32c("", 0), 0u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(monitor::crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(monitor::crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  // Running checksums continue across pieces.
  EXPECT_EQ(monitor::crc32c("6789", 4, monitor::crc32c("12345", 5)), 0xE3069283u);
}

TEST(MetricsLog, EachLogStartsANewEventFile) {
  TempDir tmp;
  monitor::MetricsLogOptions options;
  options.tensorboard = true;
  monitor::MetricsLog first(tmp.path(), options);
  monitor::MetricsLog second(tmp.path(), options);
  EXPECT_NE(first.tensorboard_path(), second.tensorboard_path());
  EXPECT_EQ(first.tensorboard_path().parent_path(), tmp / "tensorboard");
  EXPECT_EQ(first.tensorboard_path().filename().string().rfind("events.out.tfevents.", 0), 0u);
  EXPECT_EQ(event_files(tmp / "tensorboard").size(), 2u);
}

// Frames, CRCs and protobuf decoded by a Python reader written from the format description
// (TensorBoard itself is optional: when importable, its EventAccumulator must see the same tags).
TEST(MetricsLog, TensorBoardEventFileDecodesInPython) {
  TempDir tmp;
  monitor::MetricsLogOptions options;
  options.tensorboard = true;
  options.tensorboard_dir = tmp / "tb";
  const int64_t big_step = int64_t{1} << 40;  // a multi-byte varint
  {
    monitor::MetricsLog log(tmp.path(), options);
    log.write("ppo", 3, {{"reward", 0.25}, {"kl", kNaN}, {"actor_loss", -1.5}});
    log.write("sft", big_step, {{"loss", 2.0}});
  }
  const auto files = event_files(tmp / "tb");
  ASSERT_EQ(files.size(), 1u);
  const std::string script = R"PY(
import json, os, struct, sys
path = r""")PY" + files[0].string() + R"PY("""
def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
def varint(buf, i):
    v = shift = 0
    while True:
        b = buf[i]; i += 1
        v |= (b & 0x7F) << shift; shift += 7
        if not b & 0x80:
            return v, i
def fields(buf):
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0: v, i = varint(buf, i)
        elif wire == 1: v = buf[i:i + 8]; i += 8
        elif wire == 5: v = buf[i:i + 4]; i += 4
        elif wire == 2:
            n, i = varint(buf, i); v = buf[i:i + n]; i += n
        else: raise ValueError("wire type %d" % wire)
        yield field, wire, v
    assert i == len(buf), "message overrun"
data = open(path, "rb").read()
events, pos = [], 0
while pos < len(data):
    header = data[pos:pos + 8]
    (length,) = struct.unpack("<Q", header)
    assert struct.unpack("<I", data[pos + 8:pos + 12])[0] == masked(header), "length crc"
    body = data[pos + 12:pos + 12 + length]
    assert len(body) == length, "truncated record"
    assert struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])[0] == masked(body), "data crc"
    pos += 16 + length
    ev = {}
    for f, w, v in fields(body):
        if (f, w) == (1, 1): ev["wall_time"] = struct.unpack("<d", v)[0]
        elif (f, w) == (2, 0): ev["step"] = v
        elif (f, w) == (3, 2): ev["file_version"] = v.decode()
        elif (f, w) == (5, 2):
            ev["values"] = []
            for f2, w2, v2 in fields(v):
                assert (f2, w2) == (1, 2), "summary field"
                item = {}
                for f3, w3, v3 in fields(v2):
                    if (f3, w3) == (1, 2): item["tag"] = v3.decode()
                    elif (f3, w3) == (2, 5): item["value"] = struct.unpack("<f", v3)[0]
                    else: raise ValueError("value field %d" % f3)
                ev["values"].append(item)
        else: raise ValueError("event field %d wire %d" % (f, w))
    events.append(ev)
tags = None
try:
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(os.path.dirname(path))
    acc.Reload()
    tags = sorted(acc.Tags()["scalars"])
except ImportError:
    pass
json.dump({"events": events, "tensorboard_tags": tags}, open(sys.argv[1], "w"))
)PY";
  const nlohmann::json result = testing::run_python_json(script);
  ASSERT_TRUE(result.is_object()) << result.dump();
  const nlohmann::json& events = result["events"];
  ASSERT_EQ(events.size(), 3u) << result.dump();
  EXPECT_EQ(events[0]["file_version"], "brain.Event:2");
  EXPECT_GT(events[0]["wall_time"].get<double>(), 1.6e9);
  EXPECT_FALSE(events[0].contains("values"));

  EXPECT_EQ(events[1]["step"], 3);
  ASSERT_EQ(events[1]["values"].size(), 2u);  // the NaN kl is left out
  EXPECT_EQ(events[1]["values"][0]["tag"], "ppo/reward");
  EXPECT_FLOAT_EQ(events[1]["values"][0]["value"].get<float>(), 0.25f);
  EXPECT_EQ(events[1]["values"][1]["tag"], "ppo/actor_loss");
  EXPECT_FLOAT_EQ(events[1]["values"][1]["value"].get<float>(), -1.5f);

  EXPECT_EQ(events[2]["step"].get<int64_t>(), big_step);
  EXPECT_EQ(events[2]["values"][0]["tag"], "sft/loss");
  if (!result["tensorboard_tags"].is_null()) {
    EXPECT_EQ(result["tensorboard_tags"], nlohmann::json({"ppo/actor_loss", "ppo/reward", "sft/loss"}));
  }
}

TEST(Progress, FormatsDurations) {
  EXPECT_EQ(monitor::format_duration(42.2), "42 s");
  EXPECT_EQ(monitor::format_duration(0), "0 s");
  EXPECT_EQ(monitor::format_duration(185), "3 min 05 s");
  EXPECT_EQ(monitor::format_duration(3725), "1 h 02 min");
  EXPECT_EQ(monitor::format_duration(-1), "?");
  EXPECT_EQ(monitor::format_duration(kNaN), "?");
}

TEST(Progress, FormatsTheLine) {
  EXPECT_EQ(monitor::format_progress("ppo", 37, 100, 12.3, "reward 0.31"),
            "ppo [###########...................] 37/100  12.3 s elapsed, ETA 21 s  reward 0.31");
  EXPECT_EQ(monitor::format_progress("sft", 0, 10, 0.0), "sft [..............................] 0/10  0.0 s elapsed, ETA ?");
  EXPECT_EQ(monitor::format_progress("rm", 10, 10, 125.0),
            "rm [##############################] 10/10  2 min 05 s elapsed");
}

TEST(Progress, PlainModeLogsEveryIntervalAndAtTheEnd) {
  std::vector<std::string> lines;
  const core::LogLevel saved_level = core::log_level();
  core::set_log_level(core::LogLevel::Info);
  core::set_log_callback([&lines](core::LogLevel, const std::string& message) { lines.push_back(message); });
  {
    monitor::Progress progress("sft", 25, 10, /*force_plain=*/true);
    EXPECT_FALSE(progress.interactive());
    for (int64_t i = 1; i <= 25; ++i) progress.update(i, "loss 1.0");
    progress.finish();
    progress.finish();  // idempotent
  }
  {
    monitor::Progress progress("rm", 25, 10, true);
    for (int64_t i = 1; i <= 13; ++i) progress.update(i);
    progress.finish();  // stopped early: the last state is logged once
  }
  core::set_log_callback(nullptr);
  core::set_log_level(saved_level);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0].rfind("sft [############..................] 10/25  ", 0), 0u) << lines[0];
  EXPECT_NE(lines[1].find(" 20/25 "), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find(" 25/25 "), std::string::npos) << lines[2];
  EXPECT_EQ(lines[2].find("ETA"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("  loss 1.0"), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find(" 10/25 "), std::string::npos) << lines[3];
  EXPECT_NE(lines[4].find(" 13/25 "), std::string::npos) << lines[4];
}

TEST(Progress, RejectsBadArguments) {
  EXPECT_THROW_WITH(monitor::Progress("x", -1), core::InvalidArgument, "total");
  EXPECT_THROW_WITH(monitor::Progress("x", 5, 0), core::InvalidArgument, "plain_interval");
}

}  // namespace
}  // namespace dschat
