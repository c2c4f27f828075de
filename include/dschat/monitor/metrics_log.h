#pragma once
// The trainers' metrics log: one JSON object per line in <dir>/metrics.jsonl, plus (optionally)
// a TensorBoard event file. `dschat plot` and any script (pandas.read_json(lines=True)) read the
// JSON Lines; TensorBoard reads the event files. Formats and tags: docs/metrics.md.
//
//   rlhf::MetricsLog log(out_dir, options);
//   log.write("ppo", step, {{"reward", r}, {"kl", kl}});
//   // metrics.jsonl: {"phase":"ppo","step":12,"time":1718000000.5,"reward":0.31,"kl":0.02}

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dschat {
namespace monitor {

class EventFileWriter;

struct MetricsLogOptions {
  /// Also write TensorBoard scalars (DeepSpeed's "tensorboard": {"enabled": true}).
  bool tensorboard = false;
  /// Where the event files go; empty means <dir>/tensorboard.
  std::filesystem::path tensorboard_dir;
  /// Only the rank that logs writes; the other ranks' MetricsLog writes nothing.
  bool rank0 = true;
};

class MetricsLog {
 public:
  /// Appends to <dir>/metrics.jsonl (creating dir): a resumed run continues after what is there,
  /// dropping an incomplete last line left by a run killed mid-write. With tensorboard, also
  /// creates <tensorboard_dir>/events.out.tfevents.<unix seconds>.<hostname> (a new file per
  /// MetricsLog, as TensorBoard expects). Throws core::IoError naming the file.
  explicit MetricsLog(std::filesystem::path dir, MetricsLogOptions options = {});
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  /// Writes {"phase": phase, "step": step, "time": <unix seconds>, <name>: <value>...}. Non-finite
  /// values become JSON null (and are left out of TensorBoard). TensorBoard tags are
  /// "<phase>/<name>". Flushed before returning, so a killed run loses nothing written before.
  /// Throws core::InvalidArgument for an empty phase or a name that repeats or is phase/step/time.
  void write(const std::string& phase, int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

  const std::filesystem::path& jsonl_path() const { return jsonl_path_; }
  /// The event file, or empty without TensorBoard (or off rank 0).
  std::filesystem::path tensorboard_path() const;

 private:
  std::filesystem::path jsonl_path_;
  bool enabled_;
  std::ofstream jsonl_;
  std::unique_ptr<EventFileWriter> events_;
};

/// One line of metrics.jsonl.
struct MetricsRow {
  std::string phase;
  int64_t step = 0;
  double time = 0.0;
  std::map<std::string, double> values;  // JSON null -> NaN
};

/// Reads a metrics.jsonl back, rows in file order. Throws core::IoError when the file cannot be
/// read and core::FormatError naming the file and line for a malformed line; an unterminated,
/// unparsable LAST line (a run killed mid-write) is ignored with a warning.
std::vector<MetricsRow> read_metrics_jsonl(const std::filesystem::path& file);

}  // namespace monitor
}  // namespace dschat
