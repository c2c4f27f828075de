#pragma once
// Preference datasets as DeepSpeed-Chat sees them: each record yields a prompt (P), a chosen and a
// rejected answer (C, R) and the two full texts (PC, PR), built with the same strings as
// DeepSpeed-Chat's raw_datasets.py (" Human: ... Assistant:" conventions), from local files or the
// local Hugging Face hub cache. Nothing is downloaded.
//
// A data_path entry is resolved like DeepSpeed-Chat's: the first supported name that is a
// substring of it picks the record format ("Dahoas/rm-static", "/data/Dahoas/rm-static" ...). If
// the entry is a directory on disk its files are read, otherwise the hub cache
// (datasets--org--name) is searched. "local/jsonfile" reads <local_jsonfile_dir>/train.json and
// eval.json ("local/jsonfile:DIR" names the directory). A DatasetSpec with a schema reads any
// file or directory with user-named fields.
//
// Split files inside a directory: every .parquet/.json/.jsonl file whose name starts with the
// split name ("train-00000-of-00001.parquet", "test.jsonl") or that sits in a folder named after
// it ("train/part-0.parquet", "askscience/train.json"), sorted by path; Parquet wins over JSON
// when a split has both. Datasets with no eval split take DeepSpeed-Chat's 9:1 "train_eval" split
// of their train rows (same seed, same rows).
//
// A field that is JSON null gives an absent view (the phase then skips the record, as
// DeepSpeed-Chat skips None); a missing field or one of the wrong type is a core::FormatError
// naming the file, line and field, or with skip_bad_records a skipped, counted record.

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace dschat {
namespace data {

/// DeepSpeed-Chat's five views of one record; std::nullopt where the dataset has none.
struct PromptRecord {
  std::optional<std::string> prompt;               // P: ends in "Assistant:" (no trailing space)
  std::optional<std::string> chosen;               // C: " " + answer
  std::optional<std::string> rejected;             // R: " " + answer
  std::optional<std::string> prompt_and_chosen;    // PC
  std::optional<std::string> prompt_and_rejected;  // PR
};

/// A dataset whose fields the user names (the "generic schema").
struct GenericSchema {
  std::string prompt_field = "prompt";
  std::string chosen_field = "chosen";
  std::string rejected_field = "rejected";  // empty: the dataset has no rejected answers
  /// "human_assistant": P = " Human: " + p + " Assistant:", C = " " + c, PC = P + C.
  /// "raw": P = p, C = c, PC = p + c (for text already in the HH "\n\nHuman: ... Assistant:" form).
  std::string format = "human_assistant";
  /// A file or directory with the eval split; empty: the eval split of the data directory, or
  /// the 9:1 train_eval split of the train rows when there is none.
  std::string eval_path;
};

struct DatasetSpec {
  std::string name;                     // a supported name, "local/jsonfile[:DIR]" or a path
  std::optional<GenericSchema> schema;  // set: read `name` (file, directory or hub id) with it

  /// A config value: a string, or {"path", "prompt_field", "chosen_field", "rejected_field",
  /// "format", "eval_path"}. Throws core::ConfigError naming `where` and the key.
  static DatasetSpec from_json(const nlohmann::json& value, const std::string& where);
};

/// The files a dataset reads, found without parsing them (so a cache can be checked first).
struct DatasetFiles {
  std::string name;        // canonical: "Dahoas/rm-static", "local/jsonfile", or the path
  std::string clean_name;  // DeepSpeed-Chat's dataset_name_clean ("Dahoas_rm_static")
  std::vector<std::filesystem::path> train;
  std::vector<std::filesystem::path> eval;  // empty: eval comes from the 9:1 train_eval split
};

struct RawDatasetOptions {
  uint32_t seed = 1234;  // for the 9:1 train_eval split
  bool skip_bad_records = false;
  std::filesystem::path local_jsonfile_dir = "data";
};

struct RawDataset {
  DatasetFiles files;
  std::vector<PromptRecord> train;
  std::vector<PromptRecord> eval;
  int64_t skipped_records = 0;  // malformed lines and records with missing fields (skip mode)
};

/// The names with a built-in record format, in DeepSpeed-Chat's matching order.
std::vector<std::string> supported_dataset_names();

/// Finds the files of `spec`. Throws core::NotFound listing the paths searched, core::ConfigError
/// for an unknown name (listing the supported ones), core::Unsupported for DeepSpeed-Chat
/// datasets dschat has no format for and for `datasets.save_to_disk` folders.
DatasetFiles locate_dataset(const DatasetSpec& spec, const RawDatasetOptions& options);

/// Reads and formats every record of `files`.
RawDataset load_raw_dataset(const DatasetSpec& spec, const DatasetFiles& files, const RawDatasetOptions& options);

}  // namespace data
}  // namespace dschat
