// monitor::Guardian on hand-made step figures: each signal fires at its threshold and not below,
// warnings are logged once per episode, the verdict is the most severe action, rollbacks are
// counted and bounded, the state survives a checkpoint, and the "guardian" config block is read
// with errors that name the key.
#include <gtest/gtest.h>

#include <cmath>

#include "dschat/monitor/guardian.h"
#include "dschat/monitor/metrics_log.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "test_util.h"

namespace dschat {
namespace {

using monitor::GuardianAction;
using monitor::StepFigures;

StepFigures at(int64_t step) {
  StepFigures f;
  f.step = step;
  return f;
}

TEST(Guardian, MedianAndSlope) {
  EXPECT_EQ(monitor::median_of({}), 0.0);
  EXPECT_EQ(monitor::median_of({3, 1, 2}), 2.0);
  EXPECT_EQ(monitor::median_of({4, 1, 3, 2}), 2.5);
  EXPECT_NEAR(monitor::slope_of({{0, 1.0}, {1, 3.0}, {2, 5.0}}), 2.0, 1e-12);
  EXPECT_EQ(monitor::slope_of({{5, 1.0}}), 0.0);
}

TEST(Guardian, NonFiniteLossOrGradientRollsBack) {
  monitor::Guardian g(monitor::GuardianConfig{}, "test", nullptr, false);
  StepFigures f = at(1);
  f.loss = 1.0;
  f.grad_norm = 0.5;
  EXPECT_EQ(g.observe(f).action, GuardianAction::kOff);
  f = at(2);
  f.loss = std::nan("");
  monitor::GuardianVerdict v = g.observe(f);
  EXPECT_EQ(v.action, GuardianAction::kRollback);
  EXPECT_EQ(v.cause(), "non_finite");
  f = at(3);
  f.loss = 1.0;
  f.grad_norm = -1.0;  // the engine's mark of non-finite gradients
  EXPECT_EQ(g.observe(f).action, GuardianAction::kRollback);
}

TEST(Guardian, LossSpikeNeedsHistoryAndStaysOutOfTheMedian) {
  monitor::GuardianConfig c;
  c.loss_spike.threshold = 3.0;
  c.loss_spike.window = 4;
  c.loss_spike_min_steps = 3;
  monitor::Guardian g(c, "test", nullptr, false);
  StepFigures f = at(1);
  f.loss = 10.0;  // early: not armed yet, whatever it is
  EXPECT_EQ(g.observe(f).action, GuardianAction::kOff);
  for (int64_t s = 2; s <= 4; ++s) {
    f = at(s);
    f.loss = 1.0;
    EXPECT_EQ(g.observe(f).action, GuardianAction::kOff) << s;
  }
  f = at(5);
  f.loss = 2.9;  // median of {10, 1, 1, 1} is 1: 2.9 < 3 x 1
  EXPECT_EQ(g.observe(f).action, GuardianAction::kOff);
  f = at(6);
  f.loss = 3.1;  // median of the last 4 {1, 1, 1, 2.9} is 1
  monitor::GuardianVerdict v = g.observe(f);
  ASSERT_EQ(v.events.size(), 1u);
  EXPECT_EQ(v.events[0].signal, "loss_spike");
  EXPECT_EQ(v.action, GuardianAction::kRollback);
  f = at(7);
  f.loss = 3.1;  // the spike was not added: the median is still 1
  EXPECT_EQ(g.observe(f).action, GuardianAction::kRollback);
}

TEST(Guardian, ASmallLossIsNotASpikeByRatioAlone) {
  monitor::GuardianConfig c;
  c.loss_spike_min_steps = 3;
  monitor::Guardian g(c, "test", nullptr, false);
  for (int64_t s = 1; s <= 5; ++s) {
    StepFigures f = at(s);
    f.loss = 0.04;  // a reward model's loss late in training
    g.observe(f);
  }
  StepFigures f = at(6);
  f.loss = 0.3;  // 7.5 x the median, but 0.26 nats above it (< min_increase 1.0)
  EXPECT_EQ(g.observe(f).action, GuardianAction::kOff);
  f = at(7);
  f.loss = 1.3;
  EXPECT_EQ(g.observe(f).action, GuardianAction::kRollback);
}

TEST(Guardian, KlLimitAndGrowth) {
  monitor::GuardianConfig c;
  c.kl.threshold = 1.0;
  c.kl_growth.threshold = 0.05;
  c.kl_growth.window = 3;
  monitor::Guardian g(c, "test", nullptr, false);
  const double kls[] = {0.1, 0.12, 0.14, 0.3, 0.5, 1.5};
  std::vector<std::vector<std::string>> fired;
  for (int64_t s = 0; s < 6; ++s) {
    StepFigures f = at(s + 1);
    f.kl = kls[s];
    std::vector<std::string> signals;
    for (const auto& e : g.observe(f).events) signals.push_back(e.signal);
    fired.push_back(signals);
  }
  EXPECT_TRUE(fired[2].empty());  // slope 0.02 per step
  EXPECT_EQ(fired[3], std::vector<std::string>{"kl_growth"});  // slope of {0.12, 0.14, 0.3}: 0.09
  EXPECT_EQ(fired[5], (std::vector<std::string>{"kl", "kl_growth"}));
}

TEST(Guardian, EntropyLengthAndRepetition) {
  monitor::Guardian g(monitor::GuardianConfig{}, "test", nullptr, false);
  StepFigures f = at(1);
  f.entropy = 0.01;
  f.mean_answer_tokens = 2.2;
  f.min_answer_tokens = 2;
  f.max_answer_tokens = 64;
  f.repeated_share = 0.9;
  std::vector<std::string> signals;
  for (const auto& e : g.observe(f).events) signals.push_back(e.signal);
  EXPECT_EQ(signals, (std::vector<std::string>{"entropy", "answer_length", "repeated_answers"}));
  f = at(2);
  f.entropy = 1.0;
  f.mean_answer_tokens = 63.8;  // at the maximum
  f.min_answer_tokens = 2;
  f.max_answer_tokens = 64;
  f.repeated_share = 0.1;
  monitor::GuardianVerdict v = g.observe(f);
  ASSERT_EQ(v.events.size(), 1u);
  EXPECT_EQ(v.events[0].signal, "answer_length");
  EXPECT_EQ(v.action, GuardianAction::kWarn);
  // One-token answers with a one-token minimum are allowed (the demo task's).
  f = at(3);
  f.mean_answer_tokens = 1.0;
  f.min_answer_tokens = 1;
  f.max_answer_tokens = 64;
  EXPECT_TRUE(g.observe(f).events.empty());
}

TEST(Guardian, WarningsAreLoggedOncePerEpisode) {
  testing::TempDir tmp;
  monitor::MetricsLog metrics(tmp.path());
  monitor::Guardian g(monitor::GuardianConfig{}, "test", &metrics, true);
  const double entropies[] = {0.01, 0.01, 1.0, 0.01};
  for (int64_t s = 0; s < 4; ++s) {
    StepFigures f = at(s + 1);
    f.entropy = entropies[s];
    EXPECT_EQ(g.observe(f).action, s == 2 ? GuardianAction::kOff : GuardianAction::kWarn);
  }
  const auto rows = monitor::read_metrics_jsonl(metrics.jsonl_path());
  ASSERT_EQ(rows.size(), 2u);  // steps 1 and 4, not 2
  EXPECT_EQ(rows[0].step, 1);
  EXPECT_EQ(rows[1].step, 4);
  EXPECT_EQ(rows[0].phase, "guardian");
  EXPECT_DOUBLE_EQ(rows[0].values.at("entropy"), 0.01);
  EXPECT_DOUBLE_EQ(rows[0].values.at("entropy_limit"), 0.05);
}

TEST(Guardian, RewardHackingNeedsBothTrends) {
  monitor::GuardianConfig c;
  c.reward_hacking.window = 3;
  c.reward_hacking.threshold = 0.5;  // min_rise
  c.reward_hacking_min_drop = 0.2;
  // The reward rises but the held-out score holds: learning, not hacking.
  monitor::Guardian rising(c, "test", nullptr, false);
  const double holding[] = {1.0, 1.0, 0.95};
  for (int64_t s = 1; s <= 30; ++s) {
    StepFigures f = at(s);
    f.reward = 0.1 * static_cast<double>(s);
    rising.observe(f);
    if (s % 10 == 0) EXPECT_TRUE(rising.observe_heldout(s, holding[s / 10 - 1]).events.empty()) << s;
  }
  // The held-out score falls but so does the reward: a bad run, not a hacked reward.
  monitor::Guardian falling(c, "test", nullptr, false);
  const double dropping[] = {1.0, 0.8, 0.5};
  for (int64_t s = 1; s <= 30; ++s) {
    StepFigures f = at(s);
    f.reward = 1.0 - 0.01 * static_cast<double>(s);
    falling.observe(f);
    if (s % 10 == 0) EXPECT_TRUE(falling.observe_heldout(s, dropping[s / 10 - 1]).events.empty()) << s;
  }
}

TEST(Guardian, RewardHackingFiresWhenBothTrendsHold) {
  monitor::GuardianConfig c;
  c.reward_hacking.window = 3;
  c.reward_hacking.threshold = 0.5;
  c.reward_hacking_min_drop = 0.2;
  c.reward_hacking.action = GuardianAction::kStop;
  monitor::Guardian g(c, "test", nullptr, false);
  const double heldout[] = {1.0, 0.9, 0.6};
  for (int64_t s = 1; s <= 30; ++s) {
    StepFigures f = at(s);
    f.reward = 0.1 * static_cast<double>(s);
    g.observe(f);
    if (s % 10 == 0) {
      monitor::GuardianVerdict v = g.observe_heldout(s, heldout[s / 10 - 1]);
      EXPECT_EQ(v.action, s == 30 ? GuardianAction::kStop : GuardianAction::kOff) << s;
      if (s == 30) EXPECT_EQ(v.cause(), "reward_hacking");
    }
  }
}

TEST(Guardian, RollbacksAreBoundedAndTheStateRoundTrips) {
  monitor::GuardianConfig c;
  c.max_rollbacks = 2;
  c.lr_factor = 0.5;
  monitor::Guardian g(c, "test", nullptr, false);
  StepFigures f = at(5);
  f.loss = 2.0;
  g.observe(f);
  EXPECT_EQ(g.seed_offset(), 0u);
  EXPECT_TRUE(g.record_rollback(7, 3, "non_finite", {{"epoch", 0}, {"begin", 6}, {"end", 7}}));
  EXPECT_TRUE(g.record_rollback(9, 3, "non_finite", {{"epoch", 0}, {"begin", 8}, {"end", 9}}));
  EXPECT_FALSE(g.record_rollback(11, 3, "non_finite", nullptr));
  EXPECT_EQ(g.rollbacks(), 2);
  EXPECT_DOUBLE_EQ(g.lr_multiplier(), 0.25);
  EXPECT_NE(g.seed_offset(), 0u);
  ASSERT_EQ(g.skipped_data().size(), 2u);

  monitor::Guardian restored(c, "test", nullptr, false);
  restored.load_state(g.state());
  EXPECT_EQ(restored.state(), g.state());
  EXPECT_EQ(restored.rollbacks(), 2);
}

TEST(Guardian, ConfigBlockIsReadAndBadKeysAreNamed) {
  nlohmann::json config = {{"step1", {{"model_name_or_path", "x"},
                                      {"guardian",
                                       {{"snapshot_interval", 7},
                                        {"lr_factor", 0.25},
                                        {"batches", "retry"},
                                        {"loss_spike", {{"action", "stop"}, {"factor", 8}, {"window", 5}}},
                                        {"kl", {{"limit", 2.5}}}}}}}};
  const rlhf::PipelineConfig parsed = rlhf::parse_pipeline_config(config, "test.json");
  const monitor::GuardianConfig& g = parsed.step1.common.guardian;
  EXPECT_EQ(g.snapshot_interval, 7);
  EXPECT_EQ(g.lr_factor, 0.25);
  EXPECT_EQ(g.batches, "retry");
  EXPECT_EQ(g.loss_spike.action, GuardianAction::kStop);
  EXPECT_EQ(g.loss_spike.threshold, 8.0);
  EXPECT_EQ(g.loss_spike.window, 5);
  EXPECT_EQ(g.kl.threshold, 2.5);

  const auto error_of = [](const nlohmann::json& guardian) {
    try {
      rlhf::parse_pipeline_config({{"step1", {{"model_name_or_path", "x"}, {"guardian", guardian}}}}, "test.json");
    } catch (const core::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of({{"loss_spik", {{"factor", 2}}}}).find("loss_spik"), std::string::npos);
  EXPECT_NE(error_of({{"kl", {{"action", "explode"}}}}).find("explode"), std::string::npos);
  EXPECT_NE(error_of({{"lr_factor", 2.0}}).find("lr_factor"), std::string::npos);
  EXPECT_NE(error_of({{"batches", "reorder"}}).find("batches"), std::string::npos);
}

}  // namespace
}  // namespace dschat
