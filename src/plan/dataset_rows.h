#pragma once
// How many rows of data a step of the pipeline reads (internal to `dschat plan`): its datasets'
// train rows, split as DeepSpeed-Chat splits them for the step's phase. Nothing is tokenised.
#include <cstdint>

#include "dschat/rlhf/config/pipeline_config.h"

namespace dschat {
namespace plan {

/// Rows of step `step`'s phase over all of its data_path datasets (step 1 adds its
/// sft_only_data_path whole); -1 when a dataset cannot be found or read here.
int64_t count_phase_rows(const rlhf::PipelineConfig& config, int step);

/// The share of `rows` train rows (before the split) that step `step`'s phase reads under its
/// data_split (`dschat plan --dataset-rows`, for datasets not on this machine).
int64_t split_phase_rows(const rlhf::PipelineConfig& config, int step, int64_t rows);

}  // namespace plan
}  // namespace dschat
