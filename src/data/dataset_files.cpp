// locate_dataset: from a data_path entry to the files of its train and eval splits.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/json_object.h"
#include "core/strings.h"
#include "data/record_formats.h"
#include "dschat/core/error.h"
#include "dschat/data/raw_dataset.h"
#include "dschat/io/model_source.h"

namespace dschat {
namespace data {
namespace {

namespace fs = std::filesystem;

bool is_data_file(const fs::path& file) {
  std::string ext = file.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".parquet" || ext == ".json" || ext == ".jsonl";
}

bool is_parquet(const fs::path& file) { return file.extension() == ".parquet"; }

// "train-00000-of-00001.parquet", "train.jsonl", "train_part1.json" belong to split "train".
bool name_starts_with_split(const std::string& stem, const std::string& split) {
  if (stem.compare(0, split.size(), split) != 0) return false;
  return stem.size() == split.size() || stem[split.size()] == '-' || stem[split.size()] == '_' ||
         stem[split.size()] == '.';
}

// Every data file of `split` under `dir`, sorted by path; Parquet preferred over JSON.
std::vector<fs::path> split_files(const fs::path& dir, const std::string& split) {
  std::vector<fs::path> parquet, text;
  std::error_code ec;
  auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::path& path = it->path();
    if (path.filename().string().rfind('.', 0) == 0) {  // .git, .cache, .huggingface
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec) || !is_data_file(path)) continue;
    bool in_split_folder = false;
    for (const auto& part : fs::relative(path.parent_path(), dir, ec)) in_split_folder |= part == split;
    if (!in_split_folder && !name_starts_with_split(path.stem().string(), split)) continue;
    (is_parquet(path) ? parquet : text).push_back(path);
  }
  DSCHAT_CHECK(!ec, IoError, dir.string(), ": cannot list (", ec.message(), ")");
  std::vector<fs::path>& chosen = parquet.empty() ? text : parquet;
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

// The eval split's files: the first alias that has any.
std::vector<fs::path> eval_split_files(const fs::path& dir, const std::string& preferred) {
  std::vector<std::string> aliases = {preferred, "test", "validation", "valid", "dev", "eval"};
  for (const auto& alias : aliases) {
    if (alias.empty()) continue;
    auto files = split_files(dir, alias);
    if (!files.empty()) return files;
  }
  return {};
}

void refuse_save_to_disk(const fs::path& dir) {
  DSCHAT_CHECK(!fs::exists(dir / "dataset_dict.json") && !fs::exists(dir / "dataset_info.json") &&
                   !fs::exists(dir / "state.json"),
               Unsupported, dir.string(),
               " was written by datasets.save_to_disk (Arrow files), which dschat does not read; "
               "export each split with dataset.to_parquet(\"<dir>/<split>.parquet\") or to_json(..., lines=True)");
}

// A directory on disk, else the hub cache's datasets--org--name snapshot.
fs::path dataset_dir(const std::string& name, const std::string& hub_id) {
  std::vector<std::string> searched = {fs::absolute(name).string()};
  std::error_code ec;
  if (fs::is_directory(name, ec)) return name;
  auto has_files = [](const fs::path& dir) { return fs::is_directory(dir); };
  if (auto snapshot = io::find_cached_snapshot("datasets", hub_id, has_files, &searched)) return *snapshot;
  DSCHAT_THROW(NotFound, "dataset '", name, "' not found (nothing is downloaded; searched: ",
               core::join(searched), ")");
}

DatasetFiles from_directory(const fs::path& dir, const std::string& train_split, const std::string& eval_split,
                            bool has_eval_split) {
  refuse_save_to_disk(dir);
  DatasetFiles files;
  files.train = split_files(dir, train_split);
  DSCHAT_CHECK(!files.train.empty(), NotFound, dir.string(), ": no '", train_split,
               "' split (looked for .parquet/.json/.jsonl files named ", train_split, "* or in a folder named ",
               train_split, ")");
  if (has_eval_split) {
    files.eval = eval_split_files(dir, eval_split);
    DSCHAT_CHECK(!files.eval.empty(), NotFound, dir.string(), ": no '", eval_split, "' split");
  }
  return files;
}

std::string clean(std::string name) {
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

DatasetFiles locate_jsonfile(const std::string& name, const RawDatasetOptions& options) {
  const std::string prefix = "local/jsonfile:";
  fs::path dir = name.compare(0, prefix.size(), prefix) == 0 ? fs::path(name.substr(prefix.size()))
                                                              : options.local_jsonfile_dir;
  DatasetFiles files;
  files.name = "local/jsonfile";
  files.clean_name = "jsonfile";
  for (const char* split : {"train", "eval"}) {
    fs::path file = dir / (std::string(split) + ".json");
    DSCHAT_CHECK(fs::is_regular_file(file), NotFound, "local/jsonfile needs ", file.string(),
                 " (and ", (dir / (split == std::string("train") ? "eval.json" : "train.json")).string(),
                 "): JSON Lines or a JSON array of {\"prompt\", \"chosen\", \"rejected\"} records");
    (split == std::string("train") ? files.train : files.eval).push_back(file);
  }
  return files;
}

DatasetFiles locate_generic(const DatasetSpec& spec) {
  DatasetFiles files;
  files.name = spec.name;
  files.clean_name = clean(spec.name);
  std::error_code ec;
  if (fs::is_regular_file(spec.name, ec)) {
    files.train = {spec.name};
  } else {
    fs::path dir = dataset_dir(spec.name, spec.name);
    files = from_directory(dir, "train", "test", false);
    files.name = spec.name;
    files.clean_name = clean(spec.name);
    if (spec.schema->eval_path.empty()) files.eval = eval_split_files(dir, "test");
  }
  if (!spec.schema->eval_path.empty()) {
    fs::path eval(spec.schema->eval_path);
    if (fs::is_directory(eval, ec)) {
      files.eval = eval_split_files(eval, "test");
      DSCHAT_CHECK(!files.eval.empty(), NotFound, "eval_path ", eval.string(), ": no eval split files");
    } else {
      DSCHAT_CHECK(fs::is_regular_file(eval, ec), NotFound, "eval_path ", eval.string(), ": no such file");
      files.eval = {eval};
    }
  }
  return files;
}

}  // namespace

std::vector<std::string> supported_dataset_names() {
  std::vector<std::string> names;
  for (const auto& format : named_formats()) {
    if (format.format) names.push_back(format.name);
  }
  return names;
}

DatasetFiles locate_dataset(const DatasetSpec& spec, const RawDatasetOptions& options) {
  DSCHAT_CHECK(!spec.name.empty(), ConfigError, "data_path: empty dataset name");
  if (spec.schema) return locate_generic(spec);
  const NamedFormat* format = match_named_format(spec.name);
  DSCHAT_CHECK(format != nullptr, ConfigError, "data_path '", spec.name,
               "' is not a supported dataset (supported: ", core::join(supported_dataset_names()),
               "; for other data give a schema: {\"path\": ..., \"prompt_field\": ..., \"chosen_field\": ..., "
               "\"rejected_field\": ...})");
  DSCHAT_CHECK(static_cast<bool>(format->format), Unsupported, "data_path '", spec.name, "': ",
               format->name, " is a DeepSpeed-Chat dataset dschat has no record format for yet; describe its fields "
               "with a schema ({\"path\": ..., \"prompt_field\": ..., \"chosen_field\": ...})");
  if (format->name == "local/jsonfile") return locate_jsonfile(spec.name, options);
  DatasetFiles files = from_directory(dataset_dir(spec.name, format->name), format->train_split, format->eval_split,
                                      !format->eval_split.empty());
  files.name = format->name;
  files.clean_name = format->clean_name;
  return files;
}

DatasetSpec DatasetSpec::from_json(const nlohmann::json& value, const std::string& where) {
  DatasetSpec spec;
  if (value.is_string()) {
    spec.name = value.get<std::string>();
    return spec;
  }
  DSCHAT_CHECK(value.is_object(), ConfigError, where, ": a dataset is a name/path string or an object");
  core::JsonObject object(value, where);
  spec.name = object.require<std::string>("path");
  GenericSchema schema;
  schema.prompt_field = object.get<std::string>("prompt_field", schema.prompt_field);
  schema.chosen_field = object.get<std::string>("chosen_field", schema.chosen_field);
  schema.rejected_field = object.get<std::string>("rejected_field", schema.rejected_field);
  schema.format = object.get<std::string>("format", schema.format);
  schema.eval_path = object.get<std::string>("eval_path", schema.eval_path);
  object.finish();
  DSCHAT_CHECK(schema.format == "human_assistant" || schema.format == "raw", ConfigError, object.at("format"),
               ": '", schema.format, "' is not one of human_assistant, raw");
  DSCHAT_CHECK(!schema.prompt_field.empty() && !schema.chosen_field.empty(), ConfigError, where,
               ": prompt_field and chosen_field must not be empty");
  spec.schema = schema;
  return spec;
}

}  // namespace data
}  // namespace dschat
