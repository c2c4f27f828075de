#include "dschat/rlhf/rewards/reward_sources.h"

#include <cctype>
#include <chrono>
#include <cmath>
#include <optional>

#include "dschat/core/error.h"
#include "dschat/data/demo_task.h"

namespace dschat {
namespace rlhf {
namespace {

std::string_view trim(std::string_view text) {
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

// The contents of the last "\boxed{...}" (braces balanced), or nullopt.
std::optional<std::string_view> last_boxed(std::string_view text) {
  const size_t start = text.rfind("\\boxed{");
  if (start == std::string_view::npos) return std::nullopt;
  const size_t open = start + 7;
  int depth = 1;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '{') ++depth;
    if (text[i] == '}' && --depth == 0) return text.substr(open, i - open);
  }
  return std::nullopt;
}

std::vector<double> checked_scores(std::vector<double> scores, size_t expected, const RewardSourceConfig& source) {
  DSCHAT_CHECK(scores.size() == expected, InvalidArgument, "reward source '", source.name, "' (", reward_source_type_name(source.type),
               ") returned ", scores.size(), " rewards for ", expected, " answers");
  for (size_t i = 0; i < scores.size(); ++i) {
    DSCHAT_CHECK(std::isfinite(scores[i]), InvalidArgument, "reward source '", source.name, "' (", reward_source_type_name(source.type),
                 ") returned ", scores[i], " for answer ", i, "; rewards must be finite numbers");
  }
  return scores;
}

// The reference answer of a record: its "answer" field where the data has one, else its chosen
// answer (DeepSpeed-Chat's records).
std::string reference_answer(const RewardQuery& query) {
  for (const char* key : {"answer", "chosen"}) {
    auto it = query.meta.find(key);
    if (it != query.meta.end() && it->is_string()) return it->get<std::string>();
  }
  DSCHAT_THROW(InvalidArgument, "reward source exact_match: the record of prompt '", query.prompt,
               "' has no reference answer (an \"answer\" or \"chosen\" field)");
}

}  // namespace

std::string normalize_answer(std::string_view text) {
  std::string out;
  bool pending_space = false;
  for (char c : trim(text)) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      pending_space = true;
      continue;
    }
    if (pending_space && !out.empty()) out += ' ';
    pending_space = false;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (!out.empty() && out.back() == '.') out.pop_back();
  if (!out.empty() && out.front() == '$') out.erase(0, 1);
  // "1,000" -> "1000": a comma between digits groups them.
  std::string cleaned;
  for (size_t i = 0; i < out.size(); ++i) {
    const bool grouping = out[i] == ',' && i > 0 && i + 1 < out.size() &&
                          std::isdigit(static_cast<unsigned char>(out[i - 1])) &&
                          std::isdigit(static_cast<unsigned char>(out[i + 1]));
    if (!grouping) cleaned += out[i];
  }
  return std::string(trim(cleaned));
}

std::string final_answer(std::string_view text) {
  const size_t hashes = text.rfind("####");
  if (hashes != std::string_view::npos) return normalize_answer(text.substr(hashes + 4));
  if (auto boxed = last_boxed(text)) return normalize_answer(*boxed);
  return normalize_answer(text);
}

double exact_match_reward(std::string_view response, std::string_view reference) {
  const std::string expected = final_answer(reference);
  return !expected.empty() && final_answer(response) == expected ? 1.0 : 0.0;
}

double regex_reward(const std::regex& pattern, std::string_view response) {
  const std::string_view text = trim(response);
  return std::regex_match(text.begin(), text.end(), pattern) ? 1.0 : 0.0;
}

RewardSources::RewardSources(std::vector<RewardSourceConfig> configs, const RewardCallbacks& callbacks,
                             const ModelLoader& load_model)
    : configs_(std::move(configs)) {
  DSCHAT_CHECK(!configs_.empty(), ConfigError, "rewards: at least one reward source is needed");
  for (const RewardSourceConfig& c : configs_) {
    callbacks_.emplace_back();
    models_.emplace_back();
    programs_.emplace_back();
    patterns_.emplace_back();
    if (c.type == RewardSourceType::kCallback) {
      auto it = callbacks.find(c.name);
      if (it == callbacks.end()) {
        std::string known;
        for (const auto& [name, fn] : callbacks) known += (known.empty() ? "" : ", ") + name;
        DSCHAT_THROW(ConfigError, "rewards: no callback is registered under the name '", c.name,
                     "' (registered: ", known.empty() ? "none" : known, ")");
      }
      callbacks_.back() = it->second;
    } else if (c.type == RewardSourceType::kRewardModel) {
      DSCHAT_CHECK(static_cast<bool>(load_model), ConfigError, "rewards: source '", c.name,
                   "' is a reward model, but this caller cannot load one");
      models_.back() = load_model(c);
    } else if (c.type == RewardSourceType::kCommand) {
      RewardProgramOptions options;
      options.argv = c.argv;
      options.timeout = std::chrono::milliseconds(static_cast<int64_t>(c.timeout_seconds * 1000.0));
      programs_.back() = std::make_unique<RewardProgram>(std::move(options));
    } else if (c.type == RewardSourceType::kRegex) {
      patterns_.back() = std::make_unique<std::regex>(c.pattern, std::regex::ECMAScript);
    }
  }
}

RewardSources::~RewardSources() = default;

torch::Tensor RewardSources::weights() const {
  std::vector<float> w;
  for (const RewardSourceConfig& c : configs_) w.push_back(static_cast<float>(c.weight));
  return torch::tensor(w, torch::kFloat32);  // [F]
}

std::vector<double> RewardSources::score_source(size_t f, const std::vector<RewardQuery>& queries,
                                                const torch::Tensor& seq, const torch::Tensor& attention_mask,
                                                int64_t prompt_length) {
  const RewardSourceConfig& c = configs_[f];
  std::vector<double> scores;
  if (c.type == RewardSourceType::kRewardModel) {
    torch::NoGradGuard no_grad;
    torch::Tensor values = models_[f](seq, attention_mask, prompt_length).to(torch::kCPU, torch::kFloat64);  // [N]
    scores.assign(values.data_ptr<double>(), values.data_ptr<double>() + values.numel());
  } else if (c.type == RewardSourceType::kCallback) {
    scores = callbacks_[f](queries);
  } else if (c.type == RewardSourceType::kCommand) {
    scores = programs_[f]->score(queries);
  } else {
    for (const RewardQuery& q : queries) {
      if (c.type == RewardSourceType::kExactMatch) scores.push_back(exact_match_reward(q.response, reference_answer(q)));
      if (c.type == RewardSourceType::kRegex) scores.push_back(regex_reward(*patterns_[f], q.response));
      if (c.type == RewardSourceType::kDemoTask) scores.push_back(data::demo_task_score(q.prompt, q.response));
    }
  }
  return checked_scores(std::move(scores), queries.size(), c);
}

torch::Tensor RewardSources::score(const std::vector<RewardQuery>& queries, const torch::Tensor& seq,
                                   const torch::Tensor& attention_mask, int64_t prompt_length) {
  const int64_t n = static_cast<int64_t>(queries.size());
  DSCHAT_CHECK(seq.size(0) == n, InvalidArgument, "reward sources: ", n, " queries for ", seq.size(0), " sequences");
  torch::Tensor out = torch::empty({n, size()}, torch::kFloat32);  // [N, F]
  auto cells = out.accessor<float, 2>();
  for (size_t f = 0; f < configs_.size(); ++f) {
    const std::vector<double> scores = score_source(f, queries, seq, attention_mask, prompt_length);
    for (int64_t i = 0; i < n; ++i) cells[i][static_cast<int64_t>(f)] = static_cast<float>(scores[static_cast<size_t>(i)]);
  }
  return out;
}

}  // namespace rlhf
}  // namespace dschat
