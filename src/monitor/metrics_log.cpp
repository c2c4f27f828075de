#include "dschat/monitor/metrics_log.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/log.h"
#include "dschat/core/error.h"
#include "monitor/tensorboard_events.h"

namespace dschat {
namespace monitor {
namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string read_whole_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  DSCHAT_CHECK(in.is_open(), IoError, file.string(), ": cannot open: ", std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  DSCHAT_CHECK(!in.bad(), IoError, file.string(), ": read failed");
  return buffer.str();
}

// A run killed mid-write leaves a last line without its '\n'. Appending after it would glue the
// next record onto the fragment and turn it into a malformed line in the middle of the file, so
// the fragment is cut off before the resumed run appends.
void drop_unterminated_tail(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return;
  const std::string text = read_whole_file(file);
  if (text.empty() || text.back() == '\n') return;
  const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  core::log_warn(file.string(), ": dropping an incomplete last line (", text.size() - keep,
                 " bytes) left by an interrupted run");
  std::filesystem::resize_file(file, keep, ec);
  DSCHAT_CHECK(!ec, IoError, file.string(), ": cannot truncate the incomplete last line: ", ec.message());
}

MetricsRow parse_row(const std::string& line, const std::filesystem::path& file, size_t line_no) {
  const std::string where = file.string() + ":" + std::to_string(line_no);
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    DSCHAT_THROW(FormatError, where, ": not a JSON object: ", e.what());
  }
  DSCHAT_CHECK(value.is_object(), FormatError, where, ": expected a JSON object, got ", value.type_name());
  auto phase = value.find("phase");
  auto step = value.find("step");
  auto time = value.find("time");
  DSCHAT_CHECK(phase != value.end() && phase->is_string(), FormatError, where, ": missing string key 'phase'");
  DSCHAT_CHECK(step != value.end() && step->is_number_integer(), FormatError, where,
               ": missing integer key 'step'");
  DSCHAT_CHECK(time != value.end() && time->is_number(), FormatError, where, ": missing number key 'time'");
  MetricsRow row;
  row.phase = phase->get<std::string>();
  row.step = step->get<int64_t>();
  row.time = time->get<double>();
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (it.key() == "phase" || it.key() == "step" || it.key() == "time") continue;
    if (it->is_number()) {
      row.values[it.key()] = it->get<double>();
    } else if (it->is_null()) {
      row.values[it.key()] = std::numeric_limits<double>::quiet_NaN();
    }
    // Other types (strings, lists) are not metrics: a newer writer may add them, so skip them.
  }
  return row;
}

}  // namespace

MetricsLog::MetricsLog(std::filesystem::path dir, MetricsLogOptions options)
    : jsonl_path_(dir / "metrics.jsonl"), enabled_(options.rank0) {
  if (!enabled_) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DSCHAT_CHECK(!ec, IoError, dir.string(), ": cannot create the metrics directory: ", ec.message());
  drop_unterminated_tail(jsonl_path_);
  jsonl_.open(jsonl_path_, std::ios::out | std::ios::app);
  DSCHAT_CHECK(jsonl_.is_open(), IoError, jsonl_path_.string(), ": cannot open for appending: ",
               std::strerror(errno));
  if (options.tensorboard) {
    const std::filesystem::path tb_dir =
        options.tensorboard_dir.empty() ? dir / "tensorboard" : options.tensorboard_dir;
    events_ = std::make_unique<EventFileWriter>(tb_dir);
  }
}

MetricsLog::~MetricsLog() = default;

std::filesystem::path MetricsLog::tensorboard_path() const { return events_ ? events_->path() : std::filesystem::path(); }

void MetricsLog::write(const std::string& phase, int64_t step,
                       const std::vector<std::pair<std::string, double>>& scalars) {
  DSCHAT_CHECK(!phase.empty(), InvalidArgument, "MetricsLog::write: empty phase (step ", step, ")");
  std::set<std::string> seen;
  for (const auto& scalar : scalars) {
    DSCHAT_CHECK(!scalar.first.empty() && scalar.first != "phase" && scalar.first != "step" &&
                     scalar.first != "time" && seen.insert(scalar.first).second,
                 InvalidArgument, "MetricsLog::write: metric name '", scalar.first, "' of phase '", phase,
                 "' is empty, reserved (phase, step, time) or repeated");
  }
  if (!enabled_) return;
  const double now = unix_seconds();
  // ordered_json keeps phase/step/time first and the metrics in the caller's order.
  nlohmann::ordered_json line;
  line["phase"] = phase;
  line["step"] = step;
  line["time"] = now;
  std::vector<std::pair<std::string, float>> tb_scalars;
  for (const auto& scalar : scalars) {
    if (std::isfinite(scalar.second)) {
      line[scalar.first] = scalar.second;
      tb_scalars.emplace_back(phase + "/" + scalar.first, static_cast<float>(scalar.second));
    } else {
      line[scalar.first] = nullptr;
    }
  }
  jsonl_ << line.dump() << '\n';
  jsonl_.flush();
  DSCHAT_CHECK(jsonl_.good(), IoError, jsonl_path_.string(), ": write failed: ", std::strerror(errno));
  if (events_) events_->add_scalars(now, step, tb_scalars);
}

std::vector<MetricsRow> read_metrics_jsonl(const std::filesystem::path& file) {
  const std::string text = read_whole_file(file);
  std::vector<MetricsRow> rows;
  size_t begin = 0;
  size_t line_no = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    const bool terminated = end != std::string::npos;
    std::string line = text.substr(begin, terminated ? end - begin : std::string::npos);
    begin = terminated ? end + 1 : text.size();
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (!terminated) {
      try {
        rows.push_back(parse_row(line, file, line_no));
      } catch (const core::FormatError&) {
        core::log_warn(file.string(), ":", line_no, ": ignoring an incomplete last line (interrupted run?)");
      }
      break;
    }
    rows.push_back(parse_row(line, file, line_no));
  }
  return rows;
}

}  // namespace monitor
}  // namespace dschat
