#include "rlhf/trainers/critic_free_support.h"

#include <algorithm>
#include <cctype>

#include "core/log.h"
#include "dschat/core/error.h"
#include "dschat/core/host_sync.h"
#include "dschat/data/raw_dataset.h"
#include "dschat/rlhf/setup/experience.h"
#include "dschat/rlhf/setup/step_setup.h"

namespace dschat {
namespace rlhf {
namespace {

std::string trimmed(const std::string& text) {
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  return text.substr(b, e - b);
}

bool needs_meta(const GrpoConfig& config) {
  for (const RewardSourceConfig& r : config.rewards) {
    if (r.type == RewardSourceType::kExactMatch || r.type == RewardSourceType::kCommand ||
        r.type == RewardSourceType::kCallback) {
      return true;
    }
  }
  return false;
}

// Every record of the step's datasets (train and eval splits) by its trimmed prompt: the meta a
// verifier compares against.
std::unordered_map<std::string, nlohmann::json> prompt_meta(const GrpoConfig& config, const std::string& eos_text) {
  std::unordered_map<std::string, nlohmann::json> meta;
  const data::PromptDataOptions options =
      prompt_data_options(config.data, 3, config.common.seed, config.max_prompt_seq_len, eos_text);
  data::RawDatasetOptions raw;
  raw.seed = options.seed;
  raw.skip_bad_records = options.skip_bad_records;
  raw.local_jsonfile_dir = options.local_jsonfile_dir;
  for (const data::DatasetSpec& spec : options.data_path) {
    const data::RawDataset dataset = data::load_raw_dataset(spec, data::locate_dataset(spec, raw), raw);
    for (const auto* split : {&dataset.train, &dataset.eval}) {
      for (const data::PromptRecord& r : *split) {
        if (!r.prompt) continue;
        nlohmann::json m = nlohmann::json::object();
        if (r.chosen) m["chosen"] = trimmed(*r.chosen);
        if (r.rejected) m["rejected"] = trimmed(*r.rejected);
        meta.emplace(trimmed(*r.prompt), std::move(m));
      }
    }
  }
  return meta;
}

// Whether each group of n answers carries a signal: its weighted rewards are not all equal.
std::vector<bool> informative_groups(const CriticFreeBatch& batch, const torch::Tensor& weights, int64_t n) {
  const torch::Tensor rewards = (batch.rewards_per_source * weights).sum(1).view({-1, n});  // [G, n] on the CPU
  const torch::Tensor spread = (std::get<0>(rewards.max(1)) - std::get<0>(rewards.min(1))).contiguous();  // [G]
  std::vector<bool> out;
  for (int64_t g = 0; g < spread.size(0); ++g) out.push_back(spread[g].item<float>() != 0.0f);
  return out;
}

}  // namespace

ScoredReward::ScoredReward(const GrpoConfig& config, const StepContext& context, const RlhfPlacement& placement,
                           const tokenizer::Tokenizer& tokenizer, int64_t pad_token_id)
    : tokenizer_(tokenizer), pad_(pad_token_id) {
  if (needs_meta(config)) meta_ = prompt_meta(config, eos_text_of(tokenizer));
  auto load_model = [&](const RewardSourceConfig& source) -> RewardFunction {
    models::LoadOptions load;
    load.device = placement.trained.device;
    load.dtype = placement.trained.dtype;
    engines_.emplace_back();
    models::ValueHeadModel model = load_frozen_value_model(source.model, ModelPlacement{load.device, load.dtype}, load,
                                                           context, engines_.back());
    check_vocab(model->config().vocab_size, tokenizer_, source.model);
    return reward_model_scores(model, pad_, engines_.back().get());
  };
  RewardCallbacks callbacks = context.reward_callbacks;
  sources_ = std::make_unique<RewardSources>(config.rewards, callbacks, load_model);
}

std::vector<RewardQuery> ScoredReward::queries(const torch::Tensor& seq, int64_t prompt_length) const {
  const torch::Tensor host = seq.to(torch::kCPU).contiguous();  // [N, L]
  std::vector<RewardQuery> out;
  for (int64_t i = 0; i < host.size(0); ++i) {
    const int64_t* ids = host[i].data_ptr<int64_t>();
    std::vector<int64_t> prompt;
    for (int64_t t = 0; t < prompt_length; ++t) {
      if (ids[t] != pad_) prompt.push_back(ids[t]);
    }
    RewardQuery q;
    q.prompt = tokenizer_.decode(prompt, /*skip_special_tokens=*/true);
    q.response = tokenizer_.decode(std::vector<int64_t>(ids + prompt_length, ids + host.size(1)), true);
    auto it = meta_.find(trimmed(q.prompt));
    if (it != meta_.end()) q.meta = it->second;
    out.push_back(std::move(q));
  }
  return out;
}

torch::Tensor ScoredReward::score(const torch::Tensor& seq, const torch::Tensor& attention_mask, int64_t prompt_length) {
  core::HostSync sync("critic-free step (answers decoded for the reward sources)");
  return sources_->score(queries(seq, prompt_length), seq, attention_mask, prompt_length);
}

CriticFreeBatch sample_and_score(RlhfModels& models, ScoredReward& reward, const GrpoConfig& config,
                                 const data::PromptBatch& batch, int64_t eos_token_id, int64_t pad_token_id,
                                 uint64_t seed) {
  torch::Tensor per_source;  // [N, F]
  const torch::Tensor weights = reward.sources().weights();
  ExperienceSources sources;
  sources.policy = models.actor.get();
  sources.reference = models.ref;
  sources.reference_engine = models.ref_engine.get();
  sources.reward = [&](const torch::Tensor& seq, const torch::Tensor& mask, int64_t prompt_length) {
    per_source = reward.score(seq, mask, prompt_length);
    return (per_source * weights).sum(1);  // [N]
  };
  ExperienceOptions options;
  options.generation = experience_generation_config(config, eos_token_id, pad_token_id, seed);
  options.generation.num_return_sequences = config.n_samples_per_prompt;
  options.pad_token_id = pad_token_id;
  options.drop_short_answers = false;  // a group needs all of its n answers
  std::optional<Experience> exp = generate_experience(sources, batch.input_ids, batch.attention_mask, options);
  DSCHAT_CHECK(exp.has_value(), InvalidArgument, "critic-free step: generation returned no answers");
  CriticFreeBatch out;
  out.exp = std::move(*exp);
  out.rewards_per_source = per_source;
  prepare_answers(out);
  return out;
}

double heldout_score(RlhfModels& models, ScoredReward& reward, const GrpoConfig& config, const data::PromptBatch& batch,
                     int64_t eos_token_id, int64_t pad_token_id, const std::string& source) {
  const int64_t column = [&]() -> int64_t {
    if (source.empty()) return -1;
    for (int64_t s = 0; s < reward.sources().size(); ++s) {
      if (reward.sources().config(s).name == source) return s;
    }
    DSCHAT_THROW(ConfigError, "guardian.reward_hacking.source: '", source, "' is not one of the step's reward sources");
  }();
  torch::Tensor per_source;  // [N, F]
  const torch::Tensor weights = reward.sources().weights();  // [F]
  ExperienceSources sources;
  sources.policy = models.actor.get();
  sources.reward = [&](const torch::Tensor& seq, const torch::Tensor& mask, int64_t prompt_length) {
    per_source = reward.score(seq, mask, prompt_length);
    return (per_source * weights).sum(1);  // [N]
  };
  ExperienceOptions options;
  options.generation = experience_generation_config(config, eos_token_id, pad_token_id, 0);
  options.generation.do_sample = false;  // the same answers for the same policy: a trend, not noise
  options.generation.num_return_sequences = 1;
  options.pad_token_id = pad_token_id;
  options.drop_short_answers = false;
  std::optional<Experience> exp = generate_experience(sources, batch.input_ids, batch.attention_mask, options);
  DSCHAT_CHECK(exp.has_value() && per_source.defined(), InvalidArgument, "held-out check: generation returned no answers");
  const torch::Tensor scores = column < 0 ? (per_source * weights).sum(1) : per_source.select(1, column);  // [N]
  return scores.to(torch::kFloat64).mean().item<double>();
}

std::optional<StepAnswers> take_step_answers(const std::vector<CriticFreeBatch>& pool, int64_t pool_batches,
                                             const GrpoConfig& config, const torch::Tensor& weights, int64_t groups,
                                             int64_t pad_token_id, const StepContext& context) {
  const int64_t n = config.n_samples_per_prompt;
  if (!config.dynamic_sampling) return StepAnswers{pool.back(), 0, 1.0};
  std::vector<std::pair<size_t, int64_t>> kept, flat;  // (batch, group)
  int64_t sampled = 0;
  for (size_t b = 0; b < pool.size(); ++b) {
    const std::vector<bool> informative = informative_groups(pool[b], weights, n);
    for (size_t g = 0; g < informative.size(); ++g) {
      (informative[g] ? kept : flat).emplace_back(b, static_cast<int64_t>(g));
      ++sampled;
    }
  }
  const bool at_limit = pool_batches >= config.dynamic_sampling_max_batches;
  const double full_here = static_cast<int64_t>(kept.size()) >= groups ? 1.0 : 0.0;
  if (!at_limit && all_reduce_mean(context, full_here) < 1.0) return std::nullopt;  // every rank full, or wait
  std::vector<std::pair<size_t, int64_t>> chosen(kept.begin(), kept.begin() + std::min<int64_t>(groups, kept.size()));
  for (size_t i = 0; static_cast<int64_t>(chosen.size()) < groups && i < flat.size(); ++i) chosen.push_back(flat[i]);
  std::vector<CriticFreeBatch> parts;
  for (size_t b = 0; b < pool.size(); ++b) {
    std::vector<int64_t> rows;
    for (const auto& [batch, group] : chosen) {
      if (batch != b) continue;
      for (int64_t r = 0; r < n; ++r) rows.push_back(group * n + r);
    }
    if (!rows.empty()) parts.push_back(select_rows(pool[b], torch::tensor(rows, torch::kInt64)));
  }
  StepAnswers out;
  out.batch = concatenate(parts, pad_token_id);
  out.dropped_groups = static_cast<int64_t>(flat.size());
  out.kept_share = static_cast<double>(kept.size()) / static_cast<double>(std::max<int64_t>(sampled, 1));
  return out;
}

void print_answers(const CriticFreeBatch& batch, const ScoredReward& reward, const torch::Tensor& weights) {
  core::HostSync sync("statistics (print_answers, on request)");
  const int64_t shown = std::min<int64_t>(batch.exp.rows(), 4);
  const std::vector<RewardQuery> q = reward.queries(batch.exp.seq.slice(0, 0, shown), batch.exp.prompt_length);
  const torch::Tensor rewards = (batch.rewards_per_source * weights).sum(1);  // [N]
  for (int64_t i = 0; i < shown; ++i) {
    core::log_info("--- answer ", i, " (reward ", rewards[i].item<double>(), "): ", q[static_cast<size_t>(i)].response);
  }
}

StepFigures read_step(const CriticFreeBatch& batch, const torch::Tensor& weights, int64_t n,
                      const std::vector<CriticFreeMicroStats>& micro, double kept_share, const StepContext& context) {
  core::HostSync sync("critic-free step (statistics, once per step)");
  StepFigures f;
  const torch::Tensor rewards = (batch.rewards_per_source * weights).sum(1);  // [N] on the CPU
  f.reward = all_reduce_mean(context, rewards.mean().item<double>());
  f.group_std = all_reduce_mean(context, rewards.view({-1, n}).std(1, /*unbiased=*/true).mean().item<double>());
  const torch::Tensor means = batch.rewards_per_source.mean(0);  // [F]
  for (int64_t i = 0; i < means.size(0); ++i) f.source_means.push_back(all_reduce_mean(context, means[i].item<double>()));
  std::vector<torch::Tensor> rows;  // each [4]
  for (const CriticFreeMicroStats& m : micro) {
    rows.push_back(torch::stack({m.loss, m.clip_fraction, m.kl, m.entropy}).to(torch::kFloat64));
  }
  const torch::Tensor mean = torch::stack(rows).mean(0).cpu();  // [4]
  f.loss = all_reduce_mean(context, mean[0].item<double>());
  f.clip_fraction = all_reduce_mean(context, mean[1].item<double>());
  f.kl = all_reduce_mean(context, mean[2].item<double>());
  f.entropy = all_reduce_mean(context, mean[3].item<double>());
  double tokens = 0.0;
  for (int64_t t : batch.answer_tokens) tokens += static_cast<double>(t);
  f.answer_tokens = all_reduce_mean(context, tokens / static_cast<double>(std::max<size_t>(batch.answer_tokens.size(), 1)));
  f.kept_groups = all_reduce_mean(context, kept_share);
  return f;
}

void log_step(monitor::MetricsLog& metrics, const GrpoConfig& config, const RewardSources& sources, int64_t step,
              int64_t epoch, const StepFigures& f, double generate_seconds, double train_seconds, int64_t rank) {
  const int64_t print_interval = config.common.print_interval;
  if (rank == 0 && print_interval > 0 && step % print_interval == 0) {
    core::log_info("Epoch: ", epoch, " | Step: ", step, " | ", mode_name(config.advantage_estimator), " | Loss: ", f.loss,
                   " | Reward: ", f.reward, " (group std ", f.group_std, ") | KL: ", f.kl, " | Clip: ", f.clip_fraction,
                   " | Entropy: ", f.entropy, " | Answer length: ", f.answer_tokens,
                   config.dynamic_sampling ? " | Groups kept: " + std::to_string(f.kept_groups) : std::string(),
                   " | Generation: ", generate_seconds, "s, Training: ", train_seconds, "s");
  }
  std::vector<std::pair<std::string, double>> row = {{"reward", f.reward},
                                                     {"reward_group_std", f.group_std},
                                                     {"kl", f.kl},
                                                     {"entropy", f.entropy},
                                                     {"clip_frac", f.clip_fraction},
                                                     {"loss", f.loss},
                                                     {"answer_len", f.answer_tokens},
                                                     {"kept_groups", f.kept_groups},
                                                     {"gen_seconds", generate_seconds},
                                                     {"train_seconds", train_seconds}};
  for (int64_t s = 0; s < sources.size(); ++s) {
    row.emplace_back("source_" + sources.config(s).name, f.source_means[static_cast<size_t>(s)]);
  }
  metrics.write("grpo", step, row);
}

}  // namespace rlhf
}  // namespace dschat
