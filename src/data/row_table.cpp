#include "data/row_table.h"

#include <fstream>
#include <sstream>

#include "data/parquet_rows.h"
#include "dschat/core/error.h"

namespace dschat {
namespace data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string lowercase_extension(const fs::path& file) {
  std::string ext = file.extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

// 1-based line of byte `offset` in `text`.
int64_t line_of(const std::string& text, size_t offset) {
  int64_t line = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) line += text[i] == '\n';
  return line;
}

size_t first_non_space(const std::string& text) {
  size_t i = 0;
  // A UTF-8 byte order mark is skipped, as Python's json loader does with utf-8-sig.
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) i = 3;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  return i;
}

void read_json_lines(const std::string& text, bool skip_bad_records, RowTable& table) {
  size_t begin = first_non_space(text) == 3 ? 3 : 0;
  int64_t line = 1;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view raw(text.data() + begin, end - begin);
    bool blank = raw.find_first_not_of(" \t\r") == std::string_view::npos;
    if (!blank) {
      json row = json::parse(raw.begin(), raw.end(), nullptr, /*allow_exceptions=*/false);
      if (row.is_discarded() || !row.is_object()) {
        if (!skip_bad_records) {
          DSCHAT_THROW(FormatError, table.file.string(), ":", line, ": ",
                       row.is_discarded() ? "malformed JSON" : "a JSON Lines record must be an object",
                       " (set skip_bad_records to skip such lines)");
        }
        ++table.skipped_lines;
      } else {
        table.rows.push_back(std::move(row));
        table.lines.push_back(line);
      }
    }
    if (end == text.size()) break;
    begin = end + 1;
    ++line;
  }
}

// A whole-file JSON document: [records], {"column": [values], ...} or {"key": [records]}.
void read_json_document(const std::string& text, RowTable& table) {
  json document;
  try {
    document = json::parse(text);
  } catch (const json::parse_error& e) {
    DSCHAT_THROW(FormatError, table.file.string(), ":", line_of(text, e.byte == 0 ? 0 : e.byte - 1),
                 ": malformed JSON: ", e.what());
  }
  const std::string& where = table.file.string();
  if (document.is_array()) {
    for (size_t i = 0; i < document.size(); ++i) {
      DSCHAT_CHECK(document[i].is_object(), FormatError, where, ": record ", i,
                   " of the top-level array is not a JSON object");
      table.rows.push_back(std::move(document[i]));
    }
    return;
  }
  DSCHAT_CHECK(document.is_object(), FormatError, where,
               ": expected JSON Lines, an array of records or an object of columns");
  if (document.size() == 1 && document.begin()->is_array() &&
      (document.begin()->empty() || document.begin()->front().is_object())) {
    for (auto& record : *document.begin()) {
      DSCHAT_CHECK(record.is_object(), FormatError, where, ": '", document.begin().key(),
                   "' mixes records with non-objects");
      table.rows.push_back(std::move(record));
    }
    return;
  }
  size_t count = 0;
  bool first = true;
  for (auto& [column, values] : document.items()) {
    DSCHAT_CHECK(values.is_array(), FormatError, where, ": column '", column,
                 "' is not an array (a JSON object file must map column names to equal-length arrays)");
    DSCHAT_CHECK(first || values.size() == count, FormatError, where, ": column '", column, "' has ",
                 values.size(), " values, the first column has ", count);
    count = values.size();
    first = false;
  }
  table.rows.assign(count, json::object());
  for (auto& [column, values] : document.items()) {
    for (size_t i = 0; i < count; ++i) table.rows[i][column] = std::move(values[i]);
  }
}

}  // namespace

std::string RowTable::where(size_t row) const {
  std::ostringstream out;
  if (row < lines.size()) {
    out << file.string() << ":" << lines[row];
  } else {
    out << file.string() << ": row " << row;
  }
  return out.str();
}

std::string read_file_bytes(const std::filesystem::path& file) {
  std::error_code ec;
  DSCHAT_CHECK(fs::is_regular_file(file, ec), IoError, file.string(),
               fs::exists(file, ec) ? ": not a regular file" : ": no such file");
  std::ifstream in(file, std::ios::binary);
  DSCHAT_CHECK(in, IoError, file.string(), ": cannot open for reading");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  DSCHAT_CHECK(!in.bad(), IoError, file.string(), ": read failed");
  return std::move(buffer).str();
}

RowTable read_rows(const std::filesystem::path& file, bool skip_bad_records) {
  RowTable table;
  table.file = file;
  const std::string ext = lowercase_extension(file);
  if (ext == ".parquet") {
    table.rows = read_parquet_rows(file);
    return table;
  }
  DSCHAT_CHECK(ext == ".json" || ext == ".jsonl", FormatError, file.string(),
               ": unsupported data file type '", ext, "' (use .json, .jsonl or .parquet)");
  const std::string text = read_file_bytes(file);
  const size_t start = first_non_space(text);
  if (start == text.size()) return table;  // an empty file is an empty table; callers decide
  // HF's json loader reads a .json file that holds JSON Lines; so do we. A single-line document
  // ("[...]" or a one-record file) is told apart by whether its first line is a whole object.
  bool json_lines = ext == ".jsonl";
  if (!json_lines && text[start] == '{') {
    size_t end = text.find('\n', start);
    std::string_view first_line(text.data() + start, (end == std::string::npos ? text.size() : end) - start);
    json probe = json::parse(first_line.begin(), first_line.end(), nullptr, false);
    json_lines = !probe.is_discarded() && probe.is_object() &&
                 !(probe.size() == 1 && probe.begin()->is_array()) && end != std::string::npos;
    if (!json_lines && end == std::string::npos && !probe.is_discarded()) {
      // One line holding one object: a one-record JSON Lines file unless it is columnar.
      bool columnar = !probe.empty();
      for (auto& value : probe) columnar = columnar && value.is_array();
      json_lines = !columnar;
    }
  }
  if (json_lines) {
    read_json_lines(text, skip_bad_records, table);
  } else {
    read_json_document(text, table);
  }
  return table;
}

}  // namespace data
}  // namespace dschat
