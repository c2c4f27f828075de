// Scoring for reward_diagnostics.h: the eval pairs and their two probes are built on the host as
// token rows, scored in chunks on the model's device, read back once and summarised
// (reward_score_summary.cpp), the sums all-reduced over the ranks.
#include "dschat/rlhf/rewards/reward_diagnostics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "core/log.h"
#include "core/tensor_util.h"
#include "dschat/core/host_sync.h"
#include "dschat/data/prompt_dataset.h"
#include "dschat/models/load_save.h"
#include "dschat/rlhf/setup/rlhf_models.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "rlhf/rewards/reward_score_summary.h"

namespace dschat {
namespace rlhf {
// Named, not anonymous: the unity build shares a unit with other rlhf files' helpers.
namespace rm_probe {

using Ids = std::vector<int64_t>;

// One stored row split into its parts: [0, prompt) the prompt, [prompt, prompt + body) the answer,
// then the eos when the row ends with one (a row cut at max_seq_len has none).
struct RowParts {
  int64_t prompt = 0, body = 0;
  bool eos = false;
};

RowParts parts_of(const data::TokenSpan& row, int64_t prompt_length, std::optional<int64_t> eos) {
  RowParts p;
  p.eos = eos && row.size > prompt_length && row.data[row.size - 1] == *eos;
  const int64_t before_eos = row.size - (p.eos ? 1 : 0);
  p.prompt = std::min<int64_t>(prompt_length, before_eos);
  p.body = before_eos - p.prompt;
  return p;
}

Ids head_of(const data::TokenSpan& row, int64_t tokens) { return Ids(row.data, row.data + tokens); }

// The chosen row with filler inserted before its eos: ceil(ratio * body) filler tokens, fewer when
// max_seq_len leaves less room. nullopt: no answer tokens or no room (nothing to compare).
std::optional<Ids> padded_row(const data::TokenSpan& row, const RowParts& p, const Ids& filler, double ratio,
                              int64_t max_seq_len, std::optional<int64_t> eos) {
  const int64_t room = max_seq_len - (p.eos ? 1 : 0) - (p.prompt + p.body);
  const auto wanted = static_cast<int64_t>(std::ceil(ratio * static_cast<double>(p.body)));
  const int64_t add = std::min(room, wanted);
  if (p.body == 0 || filler.empty() || add <= 0) return std::nullopt;
  Ids ids = head_of(row, p.prompt + p.body);
  for (int64_t i = 0; i < add; ++i) ids.push_back(filler[i % filler.size()]);
  if (p.eos) ids.push_back(*eos);
  return ids;
}

// The chosen row keeping the first floor(body / 2) answer tokens and the eos. A one-token answer
// becomes empty: the end score is then read at the prompt's last token, as for an empty answer.
std::optional<Ids> truncated_row(const data::TokenSpan& row, const RowParts& p, std::optional<int64_t> eos) {
  if (p.body == 0) return std::nullopt;
  Ids ids = head_of(row, p.prompt + p.body / 2);
  if (p.eos) ids.push_back(*eos);
  if (ids.empty()) return std::nullopt;
  return ids;
}

// reward_loss.cpp's end index on an unpadded row: the position of its (npb)-th pad token, else
// its length; the score is read one before it. With the pad equal to eos (GPT-2) that is the last
// answer token, as step 2 and step 3 read it.
int64_t end_of(const Ids& ids, int64_t pad, int64_t npb) {
  int64_t seen = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] != pad) continue;
    if (seen++ == npb) return static_cast<int64_t>(t);
  }
  return static_cast<int64_t>(ids.size());
}

// End scores of `rows`, right padded into one batch: [R] float32 on the model's device.
torch::Tensor score_rows(models::ValueHeadModel& model, const std::vector<Ids>& rows, int64_t pad, int64_t npb,
                         const torch::Device& device) {
  int64_t width = 0;
  for (const Ids& r : rows) width = std::max<int64_t>(width, static_cast<int64_t>(r.size()));
  const auto count = static_cast<int64_t>(rows.size());
  torch::Tensor ids = torch::full({count, width}, pad, torch::kInt64);  // [R, T]
  torch::Tensor mask = torch::zeros({count, width}, torch::kInt64);     // [R, T]
  std::vector<int64_t> last(count);                                     // [R] the scored position
  auto id = ids.accessor<int64_t, 2>();
  auto m = mask.accessor<int64_t, 2>();
  for (int64_t i = 0; i < count; ++i) {
    const Ids& r = rows[i];
    for (size_t t = 0; t < r.size(); ++t) {
      id[i][t] = r[t];
      m[i][t] = 1;
    }
    const int64_t end = end_of(r, pad, npb);
    DSCHAT_CHECK(end > 0, InvalidArgument, "reward diagnostics: a row begins with the pad id ", pad,
                 " that num_padding_at_beginning ", npb, " does not skip (OPT's BOS is its pad: use 1)");
    last[i] = end - 1;
  }
  torch::Tensor index = torch::tensor(last, torch::kInt64).unsqueeze(1);  // [R, 1]
  // Right padded and only real tokens' values are read: SDPA's causal path is exact.
  torch::Tensor values = model->forward(core::host_to_device(ids, device), core::host_to_device(mask, device),
                                        nn::MaskLayout::kRightPadded);  // [R, T]
  return values.to(torch::kFloat32).gather(1, core::host_to_device(index, device)).squeeze(1);  // [R]
}

// Where pair i's rows landed in the flat list of scored rows (-1: that probe was skipped).
struct PairSlots {
  int64_t chosen = 0, rejected = 0, padded = -1, truncated = -1;
};

RewardDiagnostics diagnose(models::ValueHeadModel& model, const data::TokenizedDataset& pairs,
                           const tokenizer::Tokenizer& tokenizer, int64_t num_padding_at_beginning,
                           const RewardDiagnosticsOptions& options, const StepContext& context) {
  DSCHAT_CHECK(pairs.kind() == data::PhaseKind::kReward, InvalidArgument,
               "diagnose_reward_model: expected a phase-2 (reward pair) dataset");
  DSCHAT_CHECK(options.batch_size > 0 && options.max_seq_len > 0 && options.max_pairs >= 0 &&
                   options.filler_ratio >= 0.0,
               InvalidArgument, "diagnose_reward_model: batch_size and max_seq_len must be > 0, max_pairs and "
               "filler_ratio >= 0");
  const int64_t pad = pad_token_of(tokenizer);
  const std::optional<int64_t> eos = tokenizer.eos_token_id();
  const Ids filler = tokenizer.encode(options.filler, /*add_special_tokens=*/false);
  const int64_t total = options.max_pairs > 0 ? std::min(options.max_pairs, pairs.size()) : pairs.size();
  const int64_t rank = context_rank(context), world = context_world(context);

  // Every rank knows every pair's lengths (host data): the buckets' edges need all of them.
  std::vector<int64_t> all_chosen_tokens(total);
  for (int64_t i = 0; i < total; ++i) {
    all_chosen_tokens[i] = parts_of(pairs.sequence(i, 0), pairs.prompt_length(i), eos).body;
  }

  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  const torch::Device device = parameter_device(*model);
  // Up to 4 rows a pair: half a batch of pairs keeps a forward at the eval's 2B rows.
  const int64_t pairs_per_forward = std::max<int64_t>(1, options.batch_size / 2);
  RewardPairScores local;
  std::vector<PairSlots> slots;
  std::vector<torch::Tensor> scores;  // per forward: [R] on the device
  std::vector<Ids> rows;
  int64_t scored = 0;  // rows in `scores` so far
  auto flush = [&] {
    if (rows.empty()) return;
    scores.push_back(score_rows(model, rows, pad, num_padding_at_beginning, device));
    scored += static_cast<int64_t>(rows.size());
    rows.clear();
  };
  auto add_row = [&](Ids ids) {
    rows.push_back(std::move(ids));
    return scored + static_cast<int64_t>(rows.size()) - 1;
  };
  for (int64_t i = rank; i < total; i += world) {
    const data::TokenSpan chosen = pairs.sequence(i, 0), rejected = pairs.sequence(i, 1);
    const int64_t prompt = pairs.prompt_length(i);
    const RowParts c = parts_of(chosen, prompt, eos);
    PairSlots s;
    s.chosen = add_row(head_of(chosen, chosen.size));
    s.rejected = add_row(head_of(rejected, rejected.size));
    if (auto p = padded_row(chosen, c, filler, options.filler_ratio, options.max_seq_len, eos)) s.padded = add_row(*p);
    if (auto t = truncated_row(chosen, c, eos)) s.truncated = add_row(*t);
    slots.push_back(s);
    local.chosen_tokens.push_back(c.body);
    local.rejected_tokens.push_back(parts_of(rejected, prompt, eos).body);
    if (static_cast<int64_t>(slots.size()) % pairs_per_forward == 0) flush();
  }
  flush();
  if (was_training) model->train();

  std::vector<double> host;  // [scored] every row's end score, in row order
  if (!scores.empty()) {
    core::HostSync sync("evaluation (perplexity / reward accuracy)");
    torch::Tensor all = torch::cat(scores).to(torch::kCPU, torch::kFloat64).contiguous();  // [scored]
    host.assign(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
  }
  const double not_probed = std::numeric_limits<double>::quiet_NaN();
  for (const PairSlots& s : slots) {
    local.chosen.push_back(host[s.chosen]);
    local.rejected.push_back(host[s.rejected]);
    local.padded.push_back(s.padded >= 0 ? host[s.padded] : not_probed);
    local.truncated.push_back(s.truncated >= 0 ? host[s.truncated] : not_probed);
  }
  auto reduce = [&](std::vector<double>& sums) {
    if (world == 1) return;
    torch::Tensor t = torch::tensor(sums, torch::kFloat64);  // [F] on the host: Gloo
    context.communicator->all_reduce(t, dist::ReduceOp::Sum);
    sums.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  };
  return summarize_reward_scores(local, all_chosen_tokens, options.clip_reward_value, reduce);
}

}  // namespace rm_probe

RewardDiagnostics diagnose_reward_model(models::ValueHeadModel& model, const data::TokenizedDataset& pairs,
                                        const tokenizer::Tokenizer& tokenizer, int64_t num_padding_at_beginning,
                                        const RewardDiagnosticsOptions& options, const StepContext& context) {
  return rm_probe::diagnose(model, pairs, tokenizer, num_padding_at_beginning, options, context);
}

RewardDiagnostics diagnose_reward_model_on_data(const std::string& model_dir, const DataConfig& data,
                                                std::optional<int64_t> num_padding_at_beginning,
                                                const RewardDiagnosticsOptions& options, const StepContext& context,
                                                const torch::Device& device, torch::ScalarType dtype) {
  auto tokenizer = load_step_tokenizer(context, model_dir);
  models::LoadOptions load;
  load.device = device;
  load.dtype = dtype;
  models::ValueHeadModel model = models::load_value_model(model_dir, load);
  check_vocab(model->config().vocab_size, tokenizer, model_dir);
  data::PhaseData phase = data::create_prompt_dataset(
      prompt_data_options(data, 2, options.data_seed, options.max_seq_len, eos_text_of(tokenizer)), tokenizer);
  if (phase.eval.size() == 0) return {};
  return diagnose_reward_model(model, phase.eval, tokenizer,
                               num_padding_at_beginning.value_or(padding_at_beginning(tokenizer)), options, context);
}

}  // namespace rlhf
}  // namespace dschat
