// The reward-model diagnostics and the gate before step 3 (reward_diagnostics.h, reward_gate.h):
// the summary's math against hand-computed values; a real tiny value-head model built so that its
// score grows with the answer's length, reported and refused; the gate's config keys; and
// `dschat eval-rm --json -` on a saved tiny reward model.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "dschat/core/json_file.h"
#include "dschat/models/load_save.h"
#include "dschat/rlhf/rewards/reward_diagnostics.h"
#include "dschat/rlhf/rewards/reward_gate.h"
#include "test_util.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;
using rlhf::RewardDiagnostics;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Two-pass mean / population std / Pearson r, the textbook way (numpy's np.mean, np.std,
// np.corrcoef), to check the one-pass sums the library reduces over ranks.
double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}
double std_of(const std::vector<double>& v) {
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}
double pearson_of(const std::vector<double>& x, const std::vector<double>& y) {
  const double mx = mean_of(x), my = mean_of(y);
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  return sxy / std::sqrt(sxx * syy);
}

rlhf::RewardPairScores synthetic_scores() {
  rlhf::RewardPairScores s;
  s.chosen = {2.0, 1.0, 0.5, -1.0, 3.0, 0.0, 6.0, -0.2};
  s.rejected = {1.0, 1.5, 0.5, -2.0, 0.0, 0.1, 1.0, -7.0};
  // margins d:     1, -0.5, 0 (a tie: wrong), 1, 3, -0.1, 5, 6.8  -> 5 of 8 right
  s.chosen_tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  s.rejected_tokens = {2, 2, 4, 1, 9, 3, 2, 5};
  s.padded = {2.5, kNaN, 0.4, -0.5, 3.0, kNaN, 7.0, -0.1};
  s.truncated = {1.0, 1.2, 0.6, -1.5, 2.0, -0.3, 5.0, -0.2};
  return s;
}

TEST(RewardDiagnostics, SummaryMatchesHandComputedValues) {
  const rlhf::RewardPairScores s = synthetic_scores();
  rlhf::RewardDiagnosticsOptions options;
  options.clip_reward_value = 5.0;
  const RewardDiagnostics d = rlhf::summarize_reward_scores(s, options);
  const double tol = 1e-12;
  EXPECT_EQ(d.pairs, 8);
  EXPECT_NEAR(d.accuracy, 5.0 / 8.0, tol);
  EXPECT_NEAR(d.mean_margin, 16.2 / 8.0, tol);
  EXPECT_NEAR(d.chosen_score, 11.3 / 8.0, tol);
  EXPECT_NEAR(d.rejected_score, -4.9 / 8.0, tol);

  // Every answer: chosen then rejected.
  std::vector<double> scores = s.chosen, tokens;
  scores.insert(scores.end(), s.rejected.begin(), s.rejected.end());
  for (int64_t t : s.chosen_tokens) tokens.push_back(static_cast<double>(t));
  for (int64_t t : s.rejected_tokens) tokens.push_back(static_cast<double>(t));
  // The one-pass moments lose a few digits against the two-pass formula; 1e-9 is far below
  // anything a limit compares.
  EXPECT_NEAR(d.length_bias, pearson_of(tokens, scores), 1e-9);
  EXPECT_NEAR(d.score_mean, mean_of(scores), 1e-12);
  EXPECT_NEAR(d.score_std, std_of(scores), 1e-9);
  EXPECT_NEAR(d.clip_share, 2.0 / 16.0, tol);  // 6.0 and -7.0 lie beyond 5

  // Quartiles of 1..8 ("lower"): 2, 4, 6, then the maximum 8.
  ASSERT_EQ(d.length_buckets.size(), 4u);
  const int64_t lo[] = {1, 3, 5, 7}, hi[] = {2, 4, 6, 8};
  const double acc[] = {0.5, 0.5, 0.5, 1.0};
  for (size_t b = 0; b < 4; ++b) {
    EXPECT_EQ(d.length_buckets[b].min_tokens, lo[b]) << b;
    EXPECT_EQ(d.length_buckets[b].max_tokens, hi[b]) << b;
    EXPECT_EQ(d.length_buckets[b].pairs, 2) << b;
    EXPECT_NEAR(d.length_buckets[b].accuracy, acc[b], tol) << b;
  }

  // Confidence sigmoid(|d|), placed by hand: bin 0 [0.50, 0.55) holds d = 0 and -0.1 (both
  // wrong), bin 2 [0.60, 0.65) d = -0.5 (wrong), bin 4 [0.70, 0.75) d = 1 twice (right), bin 9
  // [0.95, 1] d = 3, 5, 6.8 (right).
  ASSERT_EQ(d.calibration.size(), 10u);
  const std::vector<int64_t> counts = {2, 0, 1, 0, 2, 0, 0, 0, 0, 3};
  for (size_t b = 0; b < 10; ++b) EXPECT_EQ(d.calibration[b].pairs, counts[b]) << b;
  const double conf0 = (0.5 + sigmoid(0.1)) / 2, conf2 = sigmoid(0.5), conf4 = sigmoid(1.0);
  const double conf9 = (sigmoid(3.0) + sigmoid(5.0) + sigmoid(6.8)) / 3;
  EXPECT_NEAR(d.calibration[0].mean_confidence, conf0, tol);
  EXPECT_NEAR(d.calibration[9].mean_confidence, conf9, tol);
  EXPECT_NEAR(d.calibration[4].accuracy, 1.0, tol);
  EXPECT_NEAR(d.calibration[0].accuracy, 0.0, tol);
  EXPECT_TRUE(std::isnan(d.calibration[1].mean_confidence));  // empty: null in JSON
  EXPECT_NEAR(d.calibration[9].lower, 0.95, tol);
  const double ece = (2 * conf0 + 1 * conf2 + 2 * (1 - conf4) + 3 * (1 - conf9)) / 8;
  EXPECT_NEAR(d.ece, ece, 1e-12);

  // Padding: 6 probed (2 NaN); higher in 4 (a tie is not higher); changes 0.5-0.1+0.5+0+1+0.1.
  EXPECT_EQ(d.padding.pairs, 6);
  EXPECT_NEAR(d.padding.win_rate, 4.0 / 6.0, tol);
  EXPECT_NEAR(d.padding.mean_score_change, 2.0 / 6.0, tol);
  EXPECT_EQ(d.truncation.pairs, 8);
  EXPECT_NEAR(d.truncation.win_rate, 2.0 / 8.0, tol);
  EXPECT_NEAR(d.truncation.mean_score_change, -3.5 / 8.0, tol);

  const nlohmann::json j = d.to_json();
  for (const char* key : {"pairs", "accuracy", "mean_margin", "length_bias", "length_buckets", "calibration", "ece",
                          "score_mean", "score_std", "clip_share", "padding_probe", "truncation_probe"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_TRUE(j["calibration"][1]["accuracy"].is_null());
  const std::string table = rlhf::format_reward_diagnostics(d);
  EXPECT_NE(table.find("ECE"), std::string::npos) << table;
  EXPECT_NE(table.find("padded with filler"), std::string::npos) << table;
}

TEST(RewardDiagnostics, SummaryEdgeCases) {
  rlhf::RewardPairScores s;
  s.chosen = {1.0, 2.0, 3.0};
  s.rejected = {0.0, 0.0, 0.0};
  s.chosen_tokens = {4, 4, 4};
  s.rejected_tokens = {4, 4, 4};
  // Constant lengths: no measurable bias (r is 0, not NaN); one bucket; no probe vectors.
  RewardDiagnostics d = rlhf::summarize_reward_scores(s, {});
  EXPECT_EQ(d.length_bias, 0.0);
  ASSERT_EQ(d.length_buckets.size(), 1u);
  EXPECT_EQ(d.length_buckets[0].min_tokens, 4);
  EXPECT_EQ(d.length_buckets[0].pairs, 3);
  EXPECT_EQ(d.padding.pairs, 0);
  EXPECT_EQ(d.padding.win_rate, 0.0);
  // No pairs at all: zeros, not NaN.
  d = rlhf::summarize_reward_scores(rlhf::RewardPairScores{}, {});
  EXPECT_EQ(d.pairs, 0);
  EXPECT_EQ(d.accuracy, 0.0);
  EXPECT_EQ(d.ece, 0.0);
  s.rejected.pop_back();
  EXPECT_THROW_WITH(rlhf::summarize_reward_scores(s, {}), core::InvalidArgument, "per-pair vector");
}

// Demo-format pairs under one fixed prompt: answers of 1..6 copies of a word, chosen the shorter
// one in most pairs (so a length-loving model also ranks them badly).
void write_length_data(const fs::path& dir) {
  fs::create_directories(dir);
  auto answer = [](int n) {
    std::string a = "apple";
    for (int i = 1; i < n; ++i) a += " apple";
    return a;
  };
  for (const char* file : {"train.json", "eval.json"}) {
    std::ofstream out(dir / file);
    for (int i = 0; i < 24; ++i) {
      const int shorter = 1 + i % 3, longer = shorter + 1 + (i * 7) % 3;
      const bool chosen_short = i % 4 != 0;
      out << nlohmann::json{{"prompt", "Human: Say apple. Assistant:"},
                            {"chosen", " " + answer(chosen_short ? shorter : longer)},
                            {"rejected", " " + answer(chosen_short ? longer : shorter)}}
                 .dump()
          << "\n";
    }
  }
}

// A real OPT value-head model (the demo's shape) whose end score is a monotone function of the
// scored token's position: token embeddings are zero, every layer's output projection (attention
// out_proj, fc2) is zero so the residual stream is the position embedding alone, and position p
// embeds a_p * u + w with u, w orthogonal zero-mean +-1 patterns. The final LayerNorm maps it to
// (a_p u + w) / sqrt(a_p^2 + 1), and v_head = k u / d reads k a_p / sqrt(a_p^2 + 1): increasing
// in p. Same prompt, so a longer answer scores higher.
void write_length_loving_model(const fs::path& dir) {
  const fs::path shape = testing::source_dir() / "assets/demo-opt";
  models::LoadOptions random;
  random.random_init = true;
  torch::manual_seed(3);
  models::ValueHeadModel model = models::load_value_model(shape.string(), random);
  const int64_t d = model->config().hidden_size;
  torch::Tensor index = torch::arange(d);                                      // [d]
  torch::Tensor u = 1.0 - 2.0 * (index % 2).to(torch::kFloat32);               // [d] +1 -1 +1 -1 ...
  torch::Tensor w = 1.0 - 2.0 * ((index / 2) % 2).to(torch::kFloat32);         // [d] +1 +1 -1 -1 ...
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    auto ends = [&](const std::string& tail) {
      return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (name.find("embed_tokens") != std::string::npos || name.find("out_proj") != std::string::npos ||
        name.find("fc2") != std::string::npos) {
      p.zero_();
    } else if (name.find("embed_positions") != std::string::npos) {
      torch::Tensor a = (torch::arange(p.size(0)).to(torch::kFloat32) - 16.0) / 6.0;  // [P]
      p.copy_(a.unsqueeze(1) * u.unsqueeze(0) + w.unsqueeze(0));                     // [P, d]
    } else if (ends("decoder.final_layer_norm.weight")) {
      p.fill_(1.0);
    } else if (ends("decoder.final_layer_norm.bias")) {
      p.zero_();
    } else if (name.find("v_head") != std::string::npos) {
      p.copy_((4.0 * u / static_cast<double>(d)).unsqueeze(0));  // [1, d]
    }
  }
  models::save_value_model(model, dir);
  for (const char* file : {"vocab.json", "merges.txt"}) fs::copy_file(shape / file, dir / file);
}

rlhf::RewardGateInputs gate_inputs(const fs::path& tmp) {
  rlhf::RewardGateInputs inputs;
  inputs.reward_model = (tmp / "rm").string();
  inputs.data.data_path = {"local/jsonfile"};
  inputs.data.local_jsonfile_dir = (tmp / "data").string();
  inputs.data.data_split = "0,10,0";
  inputs.data.data_output_path = "";
  inputs.options.max_seq_len = 32;
  inputs.options.batch_size = 8;
  inputs.report_file = tmp / "out/step3_logs/reward_gate.json";
  return inputs;
}

TEST(RewardDiagnostics, LengthLovingModelIsReportedAndRefused) {
  testing::TempDir tmp;
  write_length_data(tmp / "data");
  write_length_loving_model(tmp / "rm");
  const rlhf::RewardGateInputs inputs = gate_inputs(tmp.path());
  rlhf::StepContext context;

  // The default gate refuses it, naming every failing number, its limit and its key.
  bool refused = false;
  try {
    rlhf::run_reward_gate(rlhf::RewardGateConfig{}, inputs, context);
  } catch (const core::ConfigError& e) {
    refused = true;
    const std::string what = e.what();
    for (const char* part : {"step 3 refused", "accuracy 0.25 < 0.55 (step3.reward_gate.min_accuracy)",
                             "> 0.5 (step3.reward_gate.max_length_bias)",
                             "padding win rate 1 > 0.5 (step3.reward_gate.max_padding_win_rate)",
                             "step3.reward_gate.action"}) {
      EXPECT_NE(what.find(part), std::string::npos) << part << "\n" << what;
    }
  }
  EXPECT_TRUE(refused);
  const nlohmann::json report = core::read_json_file(inputs.report_file.string());
  EXPECT_FALSE(report.at("passed").get<bool>());
  EXPECT_GT(report.at("diagnostics").at("length_bias").get<double>(), 0.9);

  // "warn" reports the same and returns.
  rlhf::RewardGateConfig warn;
  warn.action = rlhf::GateAction::kWarn;
  const rlhf::RewardGateOutcome outcome = rlhf::run_reward_gate(warn, inputs, context);
  EXPECT_TRUE(outcome.ran);
  EXPECT_FALSE(outcome.passed);
  const RewardDiagnostics& d = outcome.diagnostics;
  EXPECT_EQ(d.pairs, 24);
  EXPECT_GT(d.length_bias, 0.9);               // the score is a function of the answer's length
  EXPECT_EQ(d.padding.pairs, 24);              // every answer had room for filler
  EXPECT_EQ(d.padding.win_rate, 1.0);          // and filler always scores higher
  EXPECT_GT(d.padding.mean_score_change, 0.0);
  EXPECT_EQ(d.truncation.win_rate, 0.0);       // while cutting the answer always scores lower
  EXPECT_NEAR(d.accuracy, 6.0 / 24.0, 1e-12);  // right exactly where the chosen one is longer
  ASSERT_EQ(outcome.checks.size(), 3u);
  for (const rlhf::RewardGateCheck& c : outcome.checks) EXPECT_FALSE(c.passed) << c.metric;
  // Loose enough limits pass it; "off" runs nothing.
  rlhf::RewardGateConfig loose;
  loose.min_accuracy = 0.2;
  loose.max_length_bias = 1.0;
  loose.max_padding_win_rate = 1.0;
  loose.max_pairs = 8;
  const rlhf::RewardGateOutcome passed = rlhf::run_reward_gate(loose, inputs, context);
  EXPECT_TRUE(passed.passed);
  EXPECT_EQ(passed.diagnostics.pairs, 8);
  rlhf::RewardGateConfig off;
  off.action = rlhf::GateAction::kOff;
  EXPECT_FALSE(rlhf::run_reward_gate(off, inputs, context).ran);
}

TEST(RewardDiagnostics, GateKeysParseAndUnknownOnesAreNamed) {
  const rlhf::PpoConfig defaults = rlhf::parse_ppo_config(nlohmann::json::object(), "my.json: step3");
  EXPECT_EQ(defaults.reward_gate.action, rlhf::GateAction::kRefuse);
  EXPECT_EQ(defaults.reward_gate.min_accuracy, 0.55);
  EXPECT_EQ(defaults.reward_gate.max_length_bias, 0.5);
  EXPECT_EQ(defaults.reward_gate.max_padding_win_rate, 0.5);
  EXPECT_EQ(defaults.reward_gate.max_pairs, 0);
  const rlhf::PpoConfig set = rlhf::parse_ppo_config(
      {{"reward_gate", {{"action", "warn"}, {"min_accuracy", 0.6}, {"max_length_bias", 0.3},
                        {"max_padding_win_rate", 0.4}, {"max_pairs", 100}}}},
      "my.json: step3");
  EXPECT_EQ(set.reward_gate.action, rlhf::GateAction::kWarn);
  EXPECT_EQ(set.reward_gate.min_accuracy, 0.6);
  EXPECT_EQ(set.reward_gate.max_length_bias, 0.3);
  EXPECT_EQ(set.reward_gate.max_padding_win_rate, 0.4);
  EXPECT_EQ(set.reward_gate.max_pairs, 100);
  EXPECT_THROW_WITH(rlhf::parse_ppo_config({{"reward_gate", {{"min_acuracy", 0.6}}}}, "my.json: step3"),
                    core::ConfigError, "min_acuracy");
  EXPECT_THROW_WITH(rlhf::parse_ppo_config({{"reward_gate", {{"action", "stop"}}}}, "my.json: step3"),
                    core::ConfigError, "key 'action'");
  EXPECT_THROW_WITH(rlhf::parse_ppo_config({{"reward_gate", {{"min_accuracy", 1.5}}}}, "my.json: step3"),
                    core::ConfigError, "key 'min_accuracy'");
  EXPECT_THROW_WITH(rlhf::parse_pipeline_config({{"step3", {{"reward_gate", {{"max_pair", 1}}}}}}, "my.json"),
                    core::ConfigError, "max_pair");
}

TEST(RewardDiagnostics, EvalRmPrintsTheTableAndJson) {
  testing::TempDir tmp;
  write_length_data(tmp / "data");
  write_length_loving_model(tmp / "rm");
  const std::string cmd = std::string(DSCHAT_CLI_PATH) + " eval-rm --model " + (tmp / "rm").string() +
                          " --data-path local/jsonfile --local-jsonfile-dir " + (tmp / "data").string() +
                          " --data-split 0,10,0 --max-seq-len 32 --batch-size 8 --clip-reward-value 2";
  std::string out;
  // stdout only: the JSON must parse from it (run_command appends 2>&1, hence the subshell).
  ASSERT_EQ(testing::run_command("(" + cmd + " --json - 2>/dev/null)", &out), 0) << out;
  for (const char* part : {"pairs: 24, chosen_last_scores (higher is better) : ", "acc (higher is better) : 0.25",
                           "reward-model diagnostics over 24 pairs", "length bias", "ECE", "truncated to half"}) {
    EXPECT_NE(out.find(part), std::string::npos) << part << "\n" << out;
  }
  const size_t start = out.find("\n{");
  ASSERT_NE(start, std::string::npos) << out;
  const nlohmann::json j = nlohmann::json::parse(out.substr(start + 1));
  EXPECT_EQ(j.at("pairs").get<int64_t>(), 24);
  EXPECT_EQ(j.at("clip_reward_value").get<double>(), 2.0);
  EXPECT_GT(j.at("length_bias").get<double>(), 0.9);
  EXPECT_EQ(j.at("calibration").size(), 10u);
  for (const char* key : {"accuracy", "mean_margin", "length_buckets", "ece", "score_mean", "score_std", "clip_share",
                          "padding_probe", "truncation_probe"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  // --json FILE writes the same object.
  ASSERT_EQ(testing::run_command(cmd + " --json " + (tmp / "d.json").string(), &out), 0) << out;
  EXPECT_EQ(core::read_json_file((tmp / "d.json").string()), j);
}

}  // namespace
}  // namespace dschat
