#include "plan/dataset_rows.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>

#include "dschat/core/error.h"
#include "dschat/data/raw_dataset.h"
#include "dschat/data/split.h"
#include "dschat/io/model_source.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace plan {
namespace {

data::RawDataset load_dataset(const std::string& path, const rlhf::DataConfig& data, uint32_t seed) {
  data::RawDatasetOptions options;
  options.seed = seed;
  options.local_jsonfile_dir = data.local_jsonfile_dir;
  const data::DatasetSpec spec = data::DatasetSpec::from_json(nlohmann::json(path), "data_path");
  return data::load_raw_dataset(spec, data::locate_dataset(spec, options), options);
}

// Train rows of one dataset; its phase's share when `data_split` is set.
int64_t rows_of(const std::string& path, const rlhf::DataConfig& data, uint32_t seed, int phase, bool whole) {
  const data::RawDataset raw = load_dataset(path, data, seed);
  const int64_t size = static_cast<int64_t>(raw.train.size());
  if (whole) return size;
  const std::vector<int64_t> bounds = data::split_boundaries(data::parse_data_split(data.data_split), size);
  return bounds[phase + 1] - bounds[phase];
}

const rlhf::DataConfig& data_of(const rlhf::PipelineConfig& config, rlhf::StepKind kind) {
  switch (kind) {
    case rlhf::StepKind::kSft: return config.step1.data;
    case rlhf::StepKind::kRewardModel: return config.step2.data;
    case rlhf::StepKind::kDpo: return config.step2_dpo.data;
    case rlhf::StepKind::kPpo: return config.step3.data;
    case rlhf::StepKind::kCriticFree: return config.step2_grpo.data;
  }
  return config.step1.data;
}

// The data split's phase a step reads (0-based): SFT's, the pairs', or the prompts'.
int phase_of(rlhf::StepKind kind) {
  switch (kind) {
    case rlhf::StepKind::kSft: return 0;
    case rlhf::StepKind::kRewardModel:
    case rlhf::StepKind::kDpo: return 1;
    case rlhf::StepKind::kPpo:
    case rlhf::StepKind::kCriticFree: return 2;
  }
  return 0;
}

// The tokenizer the step's trainer loads (the config's, else the model's), or none here.
std::optional<tokenizer::Tokenizer> step_tokenizer(const rlhf::PipelineConfig& config, int step) {
  try {
    if (!config.tokenizer.empty()) return tokenizer::Tokenizer::load(config.tokenizer);
    return tokenizer::Tokenizer::load(io::resolve_model_dir(config.model_of(step)));
  } catch (const core::Error&) {
    return std::nullopt;
  }
}

}  // namespace

int64_t split_phase_rows(const rlhf::PipelineConfig& config, int step, int64_t rows) {
  const rlhf::StepKind kind = config.kind_of(step);
  const int phase = phase_of(kind);
  const std::vector<int64_t> bounds = data::split_boundaries(data::parse_data_split(data_of(config, kind).data_split), rows);
  return bounds[phase + 1] - bounds[phase];
}

int64_t count_phase_rows(const rlhf::PipelineConfig& config, int step) {
  const rlhf::StepKind kind = config.kind_of(step);
  const rlhf::DataConfig& data = data_of(config, kind);
  const int phase = phase_of(kind);
  const uint32_t seed = config.common_of(step).seed;
  try {
    int64_t rows = 0;
    for (const std::string& path : data.data_path) rows += rows_of(path, data, seed, phase, false);
    if (kind == rlhf::StepKind::kSft) {
      for (const std::string& path : data.sft_only_data_path) rows += rows_of(path, data, seed, phase, true);
    }
    return rows;
  } catch (const core::Error&) {
    return -1;  // not here (a hub dataset not downloaded): the plan says so and times one step only
  }
}

int64_t longest_row_tokens(const rlhf::PipelineConfig& config, int step, int64_t max_seq_len) {
  const rlhf::StepKind kind = config.kind_of(step);
  if (kind == rlhf::StepKind::kPpo || kind == rlhf::StepKind::kCriticFree) return -1;
  const rlhf::DataConfig& data = data_of(config, kind);
  std::vector<std::string> paths = data.data_path;
  if (kind == rlhf::StepKind::kSft) paths.insert(paths.end(), data.sft_only_data_path.begin(), data.sft_only_data_path.end());
  std::vector<std::string> texts;
  try {
    for (const std::string& path : paths) {
      for (const data::PromptRecord& record : load_dataset(path, data, config.common_of(step).seed).train) {
        if (record.prompt_and_chosen) texts.push_back(*record.prompt_and_chosen);
        if (kind != rlhf::StepKind::kSft && record.prompt_and_rejected) texts.push_back(*record.prompt_and_rejected);
      }
    }
  } catch (const core::Error&) {
    return -1;
  }
  if (texts.empty()) return -1;
  std::sort(texts.begin(), texts.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  // Tokens of a text are at most its bytes plus the tokenizer's specials (BOS, a dummy prefix) and
  // the eos text the trainer appends (one token): kSlack covers those.
  constexpr int64_t kSlack = 4;
  constexpr size_t kMostTokenised = 256;
  const auto bound = [&](const std::string& text) { return static_cast<int64_t>(text.size()) + kSlack; };
  const std::optional<tokenizer::Tokenizer> tokenizer = step_tokenizer(config, step);
  if (!tokenizer) return std::min(max_seq_len, bound(texts.front()));
  int64_t longest = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (bound(texts[i]) <= longest || longest >= max_seq_len) return std::min(longest, max_seq_len);
    if (i == kMostTokenised) return std::min(max_seq_len, std::max(longest, bound(texts[i])));
    longest = std::max(longest, static_cast<int64_t>(tokenizer->encode(texts[i]).size()) + 1);  // + the eos
  }
  return std::min(longest, max_seq_len);
}

}  // namespace plan
}  // namespace dschat
