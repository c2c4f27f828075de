#include "plan/dataset_rows.h"

#include <nlohmann/json.hpp>

#include "dschat/core/error.h"
#include "dschat/data/raw_dataset.h"
#include "dschat/data/split.h"

namespace dschat {
namespace plan {
namespace {

// Train rows of one dataset; its phase's share when `data_split` is set.
int64_t rows_of(const std::string& path, const rlhf::DataConfig& data, uint32_t seed, int phase, bool whole) {
  data::RawDatasetOptions options;
  options.seed = seed;
  options.local_jsonfile_dir = data.local_jsonfile_dir;
  const data::DatasetSpec spec = data::DatasetSpec::from_json(nlohmann::json(path), "data_path");
  const data::RawDataset raw = data::load_raw_dataset(spec, data::locate_dataset(spec, options), options);
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

}  // namespace plan
}  // namespace dschat
