#pragma once
// The record -> PromptRecord mappings: one per dataset DeepSpeed-Chat supports (same strings as
// its raw_datasets.py) plus the user-described generic schema.

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "dschat/data/raw_dataset.h"

namespace dschat {
namespace data {

using RecordFormatter = std::function<PromptRecord(const nlohmann::json& row)>;

struct NamedFormat {
  std::string name;        // "Dahoas/rm-static"
  std::string clean_name;  // "Dahoas_rm_static"
  std::string train_split;
  std::string eval_split;  // empty: 9:1 train_eval split of train
  RecordFormatter format;  // empty: DeepSpeed-Chat has it, dschat has no format yet
};

/// DeepSpeed-Chat's datasets in its substring-matching order (first match wins).
const std::vector<NamedFormat>& named_formats();

/// The first entry whose name is a substring of `data_path`, or nullptr.
const NamedFormat* match_named_format(const std::string& data_path);

RecordFormatter generic_formatter(const GenericSchema& schema);

/// DeepSpeed-Chat's webgpt citation clean-up: re.sub(r" [\(\[].*?[\)\]]", "", s), then the same
/// without the leading space.
std::string remove_citations(const std::string& text);

}  // namespace data
}  // namespace dschat
