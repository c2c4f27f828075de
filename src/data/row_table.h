#pragma once
// The rows of one data file as JSON objects, with where each row came from so that an error about
// a record can name its file and line. JSON Lines, JSON (an array of records, an object of
// equal-length columns, or an object holding one array of records) and Parquet are read.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace dschat {
namespace data {

struct RowTable {
  std::filesystem::path file;
  std::vector<nlohmann::json> rows;
  /// 1-based line of each row in a text file; empty for Parquet (rows are named by index).
  std::vector<int64_t> lines;
  /// Lines that were not valid JSON and were skipped (only with skip_bad_records).
  int64_t skipped_lines = 0;

  /// "file:LINE" or "file: row N", for messages.
  std::string where(size_t row) const;
};

/// Reads `file` by its extension: .jsonl/.json/.parquet (.json may hold JSON Lines too, as HF's
/// json loader allows). Malformed JSON throws core::FormatError naming the file and line, unless
/// `skip_bad_records`, which skips such lines of a JSON Lines file and counts them.
RowTable read_rows(const std::filesystem::path& file, bool skip_bad_records);

/// Reads `file` whole. Throws core::IoError naming it (missing, unreadable, a directory).
std::string read_file_bytes(const std::filesystem::path& file);

}  // namespace data
}  // namespace dschat
