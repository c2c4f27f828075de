#include "rlhf/setup/sample_log.h"

#include <algorithm>
#include <sstream>

#include "dschat/core/error.h"
#include "io/atomic_file.h"

namespace dschat {
namespace rlhf {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPrefix = "samples.rank";
constexpr const char* kSuffix = ".jsonl";

// The lines of `file` a rewind to `global_steps` keeps: events, and records of updates up to it.
std::string kept_lines(const fs::path& file, int64_t global_steps) {
  std::ifstream in(file);
  DSCHAT_CHECK(in.good(), IoError, "sample log: cannot read ", file.string());
  std::string kept, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    // A line cut short by a kill mid-write is not a record of anything trained.
    const nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object()) continue;
    if (parsed.contains("update") && parsed.at("update").get<int64_t>() > global_steps) continue;
    kept += line + '\n';
  }
  return kept;
}

}  // namespace

std::vector<fs::path> sample_log_files(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    const size_t prefix = std::string(kPrefix).size(), suffix = std::string(kSuffix).size();
    if (name.size() <= prefix + suffix || name.compare(0, prefix, kPrefix) != 0 ||
        name.compare(name.size() - suffix, suffix, kSuffix) != 0) {
      continue;
    }
    const std::string digits = name.substr(prefix, name.size() - prefix - suffix);
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    found.emplace_back(std::stoll(digits), it->path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> files;
  for (auto& [rank, path] : found) files.push_back(std::move(path));
  return files;
}

SampleLog::SampleLog(fs::path dir, std::shared_ptr<dist::Communicator> communicator)
    : dir_(std::move(dir)), communicator_(std::move(communicator)) {
  rank_ = communicator_ ? communicator_->rank() : 0;
  file_ = dir_ / (kPrefix + std::to_string(rank_) + kSuffix);
}

void SampleLog::rewind(int64_t global_steps, nlohmann::json event) {
  if (out_.is_open()) out_.close();
  if (rank_ == 0) {
    std::error_code error;
    fs::create_directories(dir_, error);
    DSCHAT_CHECK(!error, IoError, "sample log: cannot create ", dir_.string(), ": ", error.message());
    for (const fs::path& file : sample_log_files(dir_)) {
      if (global_steps == 0) {
        DSCHAT_CHECK(fs::remove(file, error) || !error, IoError, "sample log: cannot remove ", file.string(), ": ",
                     error.message());
      } else {
        io::write_file_atomically(file, kept_lines(file, global_steps));
      }
    }
    event["global_step"] = global_steps;
    append(event);
  }
  // No rank appends before rank 0 has rewritten its file.
  if (communicator_) communicator_->barrier();
}

void SampleLog::record(int64_t epoch, int64_t micro_batch, int64_t update, const std::vector<int64_t>& ids) {
  append({{"epoch", epoch}, {"micro_batch", micro_batch}, {"update", update}, {"ids", ids}});
}

void SampleLog::append(const nlohmann::json& line) {
  if (!out_.is_open()) {
    std::error_code error;
    fs::create_directories(dir_, error);
    out_.open(file_, std::ios::app);
    DSCHAT_CHECK(out_.is_open(), IoError, "sample log: cannot open ", file_.string(), " for appending");
  }
  out_ << line.dump() << '\n';
  out_.flush();  // a kill after a checkpoint must not lose the records the checkpoint holds
  DSCHAT_CHECK(out_.good(), IoError, "sample log: cannot write ", file_.string(), " (disk full?)");
}

std::optional<SampleLog> open_policy_sample_log(bool log_sample_ids, const fs::path& log_dir,
                                                const std::shared_ptr<dist::Communicator>& communicator,
                                                bool resumed, int64_t step, const nlohmann::json& layout) {
  if (!log_sample_ids) return std::nullopt;
  std::optional<SampleLog> log(std::in_place, log_dir, communicator);
  log->rewind(resumed ? step : 0, {{"event", resumed ? "resume" : "start"}, {"layout", layout}});
  return log;
}

}  // namespace rlhf
}  // namespace dschat
