// load_raw_dataset: reads a dataset's files and formats every record.
#include "dschat/data/raw_dataset.h"

#include "core/log.h"
#include "data/record_formats.h"
#include "data/row_table.h"
#include "dschat/core/error.h"
#include "dschat/data/split.h"

namespace dschat {
namespace data {
namespace {

struct Formatted {
  std::vector<PromptRecord> records;
  int64_t skipped = 0;
};

Formatted format_files(const std::vector<std::filesystem::path>& files, const RecordFormatter& format,
                       bool skip_bad_records) {
  Formatted out;
  for (const auto& file : files) {
    RowTable table = read_rows(file, skip_bad_records);
    out.skipped += table.skipped_lines;
    for (size_t i = 0; i < table.rows.size(); ++i) {
      try {
        out.records.push_back(format(table.rows[i]));
      } catch (const core::FormatError& e) {
        if (!skip_bad_records) {
          DSCHAT_THROW(FormatError, table.where(i), ": ", e.what(), " (set skip_bad_records to skip such records)");
        }
        ++out.skipped;
      }
    }
  }
  return out;
}

// DeepSpeed-Chat's "train_eval" split: phase 0 (train) or 1 (eval) of "9,1" over the train rows.
std::vector<PromptRecord> train_eval_part(const std::vector<PromptRecord>& rows, int64_t part, uint32_t seed) {
  std::vector<PromptRecord> out;
  for (int64_t index : phase_indices("9,1", part, seed, static_cast<int64_t>(rows.size()))) out.push_back(rows[index]);
  return out;
}

}  // namespace

RawDataset load_raw_dataset(const DatasetSpec& spec, const DatasetFiles& files, const RawDatasetOptions& options) {
  RecordFormatter format;
  if (spec.schema) {
    format = generic_formatter(*spec.schema);
  } else {
    const NamedFormat* named = match_named_format(spec.name);
    DSCHAT_CHECK(named != nullptr && named->format, ConfigError, "data_path '", spec.name,
                 "': no record format (call locate_dataset first for the full message)");
    format = named->format;
  }
  RawDataset raw;
  raw.files = files;
  Formatted train = format_files(files.train, format, options.skip_bad_records);
  raw.skipped_records = train.skipped;
  if (files.eval.empty()) {
    raw.train = train_eval_part(train.records, 0, options.seed);
    raw.eval = train_eval_part(train.records, 1, options.seed);
  } else {
    raw.train = std::move(train.records);
    Formatted eval = format_files(files.eval, format, options.skip_bad_records);
    raw.eval = std::move(eval.records);
    raw.skipped_records += eval.skipped;
  }
  if (raw.skipped_records > 0) {
    core::log_warn("dataset ", files.name, ": skipped ", raw.skipped_records, " bad records (skip_bad_records)");
  }
  return raw;
}

}  // namespace data
}  // namespace dschat
