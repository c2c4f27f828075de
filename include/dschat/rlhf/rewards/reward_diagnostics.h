#pragma once
// What a reward model rewards, before PPO optimises against it (`dschat eval-rm`, the gate before
// step 3 in reward_gate.h). Over the pairs of a phase-2 eval split, scored as step 2 scores them
// (the value at the answer's last real token, reward_loss.h's end index):
//   accuracy, mean margin     share of pairs with s_c > s_r; mean of s_c - s_r
//   length buckets            accuracy by the chosen answer's token count, cut at its quartiles
//   length bias               Pearson r of score vs answer tokens over every answer (chosen and
//                             rejected); r > 0: longer answers score higher
//   calibration, ECE          p = sigmoid(s_c - s_r) folded to confidence max(p, 1 - p), correct =
//                             (s_c > s_r); 10 equal bins over [0.5, 1]; ECE = sum_b n_b/N |acc_b - conf_b|
//   score mean/std, clip      over every answer; share with |s| > PPO's clip_reward_value
//   padding probe             the chosen answer with filler tokens inserted before its trailing eos
//   truncation probe          the chosen answer cut to the first half of its tokens (eos kept)
// A probe reports the share of pairs where the probed answer scores higher than the original
// chosen answer, and the mean score change. docs/reward_diagnostics_section.md has the details.
//
// The probes work on token ids, not text: answer tokens are a row's tokens after its stored prompt
// length (TokenizedDataset::prompt_length), without a trailing eos. The filler is the tokenised
// `filler` text repeated (cut mid-sentence) to add ceil(filler_ratio * answer tokens) tokens.
#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/data/tokenized_dataset.h"
#include "dschat/models/value_head.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/config/step_context.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace rlhf {

/// The padding probe's default filler: a sentence that says nothing about any question.
inline constexpr const char* kRewardProbeFiller = " This sentence adds no information.";

struct RewardDiagnosticsOptions {
  int64_t batch_size = 16;   // pairs per forward (each pair is up to 4 rows: chosen, rejected, 2 probes)
  int64_t max_pairs = 0;     // the first max_pairs pairs of the split; 0: all of them
  int64_t max_seq_len = 512; // data truncation, and the longest probe row (its eos stays last)
  double clip_reward_value = 5.0;  // PPO's clamp of the reward score (ppo_math.h)
  std::string filler = kRewardProbeFiller;
  double filler_ratio = 0.5;  // padding adds ceil(filler_ratio * answer tokens) tokens
  uint32_t data_seed = 1234;  // the phase split's seed (step 2's "seed") for the *_on_data path
};

struct RewardLengthBucket {
  int64_t min_tokens = 0, max_tokens = 0;  // chosen answer tokens in [min, max]
  int64_t pairs = 0;
  double accuracy = 0.0;
};

struct RewardCalibrationBin {
  double lower = 0.0, upper = 0.0;  // confidence range [lower, upper) ([lower, 1] for the last)
  int64_t pairs = 0;
  double mean_confidence = 0.0;  // NaN (JSON null) for an empty bin
  double accuracy = 0.0;         // share of the bin's pairs with s_c > s_r; NaN when empty
};

struct RewardProbe {
  int64_t pairs = 0;              // pairs probed (an answer with no tokens, or no room, is skipped)
  double win_rate = 0.0;          // share of probed pairs where the probed answer scores higher
  double mean_score_change = 0.0; // mean of s_probe - s_c over probed pairs
};

struct RewardDiagnostics {
  int64_t pairs = 0;
  double accuracy = 0.0;
  double mean_margin = 0.0;  // mean s_c - s_r
  double chosen_score = 0.0, rejected_score = 0.0;  // mean end scores
  std::vector<RewardLengthBucket> length_buckets;
  double length_bias = 0.0;  // Pearson r(score, answer tokens); 0 when either is constant
  std::vector<RewardCalibrationBin> calibration;  // 10 bins
  double ece = 0.0;
  double score_mean = 0.0, score_std = 0.0;  // over all 2N answers; std divides by 2N
  double clip_reward_value = 0.0;
  double clip_share = 0.0;  // share of the 2N scores with |s| > clip_reward_value
  RewardProbe padding, truncation;

  nlohmann::json to_json() const;
};

/// The human table (several lines, newline-terminated).
std::string format_reward_diagnostics(const RewardDiagnostics& d);

/// Per-pair scores on the host: the pure input of summarize_reward_scores. Index i = pair i.
struct RewardPairScores {
  std::vector<double> chosen, rejected;                 // [N] end scores
  std::vector<int64_t> chosen_tokens, rejected_tokens;  // [N] answer tokens
  std::vector<double> padded, truncated;  // [N] probed chosen scores, NaN: not probed; empty: no probe
};

/// The metrics above from given scores (what diagnose_reward_model computes after scoring).
/// Uses options.clip_reward_value only. Throws core::InvalidArgument for mismatched sizes.
RewardDiagnostics summarize_reward_scores(const RewardPairScores& scores, const RewardDiagnosticsOptions& options);

/// Collective: scores the first max_pairs pairs of `pairs` (a phase-2 dataset) and their probes on
/// the model's device, pair i on rank i % world, and all-reduces the sums, so every rank returns
/// the same result. Pad and eos ids come from `tokenizer` (pad_token_of), which also encodes the
/// filler. The scores are read to the host once, after the last forward.
RewardDiagnostics diagnose_reward_model(models::ValueHeadModel& model, const data::TokenizedDataset& pairs,
                                        const tokenizer::Tokenizer& tokenizer, int64_t num_padding_at_beginning,
                                        const RewardDiagnosticsOptions& options, const StepContext& context);

/// diagnose_reward_model over the phase-2 eval split of `data` (options.data_seed, max_seq_len),
/// the model loaded from `model_dir` onto `device` in `dtype`, the context's tokenizer or the
/// model's. An empty split gives pairs == 0 (callers decide whether that is an error).
RewardDiagnostics diagnose_reward_model_on_data(const std::string& model_dir, const DataConfig& data,
                                                std::optional<int64_t> num_padding_at_beginning,
                                                const RewardDiagnosticsOptions& options, const StepContext& context,
                                                const torch::Device& device = torch::kCPU,
                                                torch::ScalarType dtype = torch::kFloat32);

}  // namespace rlhf
}  // namespace dschat
