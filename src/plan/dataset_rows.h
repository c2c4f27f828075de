#pragma once
// How many rows of data a step of the pipeline reads (internal to `dschat plan`): its datasets'
// train rows, split as DeepSpeed-Chat splits them for the step's phase; and how long the longest
// of them is in tokens (dschat pads a batch to its longest row, not to max_seq_len).
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

/// The longest train row of a supervised step's datasets (SFT: prompt + chosen; reward and DPO:
/// prompt + chosen and prompt + rejected), in tokens with the eos text the trainers append, at
/// most `max_seq_len`: the most any batch is padded to. Rows are tokenised longest in bytes first,
/// and the search stops once no shorter row can be longer in tokens (a tokenizer makes at most one
/// token per byte, plus its few special tokens). Without a tokenizer here, that bound of the
/// longest row. -1: the data cannot be read here, or the step pads to a fixed length (PPO, GRPO).
int64_t longest_row_tokens(const rlhf::PipelineConfig& config, int step, int64_t max_seq_len);

}  // namespace plan
}  // namespace dschat
