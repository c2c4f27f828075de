// DeepSpeed's fp16 loss scaler: the fp16-block gotcha (DeepSpeed-Chat's configs), hand-traced
// update_scale sequences, the min-scale error, static and no scaling, checkpoint state, and the
// fused inf/NaN check.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "dschat/core/logging.h"
#include "dschat/engine/loss_scaler.h"
#include "test_util.h"

namespace dschat {
namespace {

using engine::DynamicLossScaleOptions;
using engine::LossScaleMode;
using engine::LossScaler;
using nlohmann::json;

LossScaler from_block(const json& block) { return LossScaler::from_fp16_config(block, "ds_config.json: fp16"); }

DynamicLossScaleOptions traced_options(int64_t window, int64_t hysteresis, bool consecutive) {
  DynamicLossScaleOptions o;
  o.init_scale = 1024.0;
  o.scale_window = window;
  o.delayed_shift = hysteresis;
  o.consecutive_hysteresis = consecutive;
  return o;
}

// One update and the state after it: {skipped, scale, cur_hysteresis, last_overflow_iter}.
void expect_update(LossScaler& s, bool overflow, double scale, int64_t hysteresis, int64_t last_overflow) {
  int64_t iter = s.cur_iter();
  EXPECT_EQ(s.update(overflow), overflow) << "iter " << iter;
  EXPECT_EQ(s.scale(), scale) << "iter " << iter;
  EXPECT_EQ(s.cur_hysteresis(), hysteresis) << "iter " << iter;
  EXPECT_EQ(s.last_overflow_iter(), last_overflow) << "iter " << iter;
  EXPECT_EQ(s.cur_iter(), iter + 1);
}

// Captures info log lines for the lifetime of the object.
class LogCapture {
 public:
  LogCapture() : level_(core::log_level()), rank_(core::log_rank()) {
    core::set_log_level(core::LogLevel::Info);
    core::set_log_rank(-1);
    core::set_log_callback([this](core::LogLevel, const std::string& message) { lines.push_back(message); });
  }
  ~LogCapture() {
    core::set_log_callback({});
    core::set_log_level(level_);
    core::set_log_rank(rank_);
  }
  std::vector<std::string> lines;

 private:
  core::LogLevel level_;
  int rank_;
};

TEST(LossScaler, DeepSpeedChatTrainConfigUsesWindow100Hysteresis2) {
  // get_train_ds_config: "fp16": {"enabled": true, "loss_scale_window": 100}
  auto s = from_block({{"enabled", true}, {"loss_scale_window", 100}});
  ASSERT_EQ(s.mode(), LossScaleMode::Dynamic);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.options().scale_window, 100);
  EXPECT_EQ(s.options().delayed_shift, 2);
  EXPECT_EQ(s.cur_hysteresis(), 2);
  EXPECT_EQ(s.options().min_scale, 1.0);
  EXPECT_FALSE(s.options().consecutive_hysteresis);
  EXPECT_TRUE(s.options().raise_error_at_min_scale);
}

TEST(LossScaler, EnabledAloneKeepsTheClassDefaults) {
  // get_eval_ds_config: "fp16": {"enabled": true} names no dynamic key, so ZeRO uses
  // DynamicLossScaler() as constructed: 2^32, window 1000, min 1, no hysteresis.
  auto s = from_block({{"enabled", true}});
  ASSERT_EQ(s.mode(), LossScaleMode::Dynamic);
  EXPECT_EQ(s.scale(), 4294967296.0);
  EXPECT_EQ(s.options().scale_window, 1000);
  EXPECT_EQ(s.options().delayed_shift, 1);
  EXPECT_EQ(s.options().min_scale, 1.0);
  // Keys outside the five (auto_cast, loss_scale 0) do not switch to the config values.
  auto t = from_block({{"enabled", true}, {"auto_cast", false}, {"loss_scale", 0}});
  EXPECT_EQ(t.scale(), 4294967296.0);
  EXPECT_EQ(t.options().delayed_shift, 1);
  // Any one of the five does, with the config defaults for the others.
  auto u = from_block({{"enabled", true}, {"consecutive_hysteresis", true}});
  EXPECT_EQ(u.scale(), 65536.0);
  EXPECT_EQ(u.options().scale_window, 1000);
  EXPECT_EQ(u.options().delayed_shift, 2);
  EXPECT_TRUE(u.options().consecutive_hysteresis);
  auto v = from_block({{"enabled", true}, {"initial_scale_power", 12}, {"min_loss_scale", 0.5}, {"hysteresis", 3}});
  EXPECT_EQ(v.scale(), 4096.0);
  EXPECT_EQ(v.options().min_scale, 0.5);
  EXPECT_EQ(v.options().delayed_shift, 3);
}

TEST(LossScaler, DisabledAndBf16MeanNoScaling) {
  for (const auto& block : {json::object(), json{{"enabled", false}, {"loss_scale_window", 100}}}) {
    auto s = from_block(block);
    EXPECT_EQ(s.mode(), LossScaleMode::None) << block.dump();
    EXPECT_EQ(s.scale(), 1.0);
    EXPECT_FALSE(s.checks_overflow());
    EXPECT_FALSE(s.update(true));  // bf16/fp32 never skip a step
    EXPECT_EQ(s.scale(), 1.0);
  }
}

TEST(LossScaler, StaticScaleNeverChangesButSkipsOverflowingSteps) {
  auto s = from_block({{"enabled", true}, {"loss_scale", 128}, {"hysteresis", 4}});
  ASSERT_EQ(s.mode(), LossScaleMode::Static);
  EXPECT_TRUE(s.checks_overflow());
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_THROW_WITH(LossScaler::fixed(0.0), core::ConfigError, "static loss scale");
}

TEST(LossScaler, HysteresisTwoDelaysTheFirstDropAndRefillsOnGrowth) {
  LogCapture log;
  LossScaler s = LossScaler::dynamic(traced_options(3, 2, false));
  expect_update(s, true, 1024, 1, 0);   // first overflow: hysteresis 2 -> 1, scale kept
  expect_update(s, true, 512, 1, 1);    // second overflow halves
  expect_update(s, false, 512, 1, 1);   // (2 - 1) % 3 != 0
  expect_update(s, false, 512, 1, 1);   // (3 - 1) % 3 != 0
  expect_update(s, false, 1024, 2, 1);  // (4 - 1) % 3 == 0: grow, refill the hysteresis
  expect_update(s, true, 1024, 1, 5);
  expect_update(s, false, 1024, 1, 5);  // not consecutive: a clean step does not refill
  expect_update(s, true, 512, 1, 7);
  ASSERT_EQ(log.lines.size(), 4u);
  EXPECT_EQ(log.lines[0],
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1024, but hysteresis is 2. "
            "Reducing hysteresis to 1");
  EXPECT_EQ(log.lines[1], "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1024, reducing to 512");
}

TEST(LossScaler, ConsecutiveHysteresisRefillsAfterEveryCleanStep) {
  LossScaler s = LossScaler::dynamic(traced_options(3, 2, true));
  expect_update(s, true, 1024, 1, 0);
  expect_update(s, false, 1024, 2, 0);  // refilled; (1 - 0) % 3 != 0
  expect_update(s, true, 1024, 1, 2);   // so this overflow again only spends hysteresis
  expect_update(s, true, 512, 1, 3);
  expect_update(s, false, 512, 2, 3);
}

TEST(LossScaler, GrowsAfterWindowCleanSteps) {
  LossScaler s = LossScaler::dynamic(traced_options(3, 1, false));
  // last_overflow_iter starts at -1, so the first growth comes after exactly `window` updates.
  expect_update(s, false, 1024, 1, -1);
  expect_update(s, false, 1024, 1, -1);
  expect_update(s, false, 2048, 1, -1);
  expect_update(s, true, 1024, 1, 3);
  expect_update(s, false, 1024, 1, 3);
  expect_update(s, false, 1024, 1, 3);
  expect_update(s, false, 2048, 1, 3);
}

TEST(LossScaler, OverflowAtMinimumScaleThrows) {
  DynamicLossScaleOptions o;
  o.init_scale = 3.0;
  o.min_scale = 2.0;
  LossScaler s = LossScaler::dynamic(o);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 2.0);  // max(3 / 2, min_scale)
  EXPECT_THROW_WITH(s.update(true), core::Error, "loss scale already at minimum (2)");
  EXPECT_EQ(s.cur_iter(), 1);  // state untouched by the failed update
  EXPECT_EQ(s.last_overflow_iter(), 0);
  o.raise_error_at_min_scale = false;
  LossScaler quiet = LossScaler::dynamic(o);
  quiet.update(true);
  EXPECT_TRUE(quiet.update(true));
  EXPECT_EQ(quiet.scale(), 2.0);
}

TEST(LossScaler, StateRoundTripsThroughCheckpointJson) {
  auto options = traced_options(3, 2, false);
  LossScaler s = LossScaler::dynamic(options);
  for (bool overflow : {true, false, false, true, true, false}) s.update(overflow);
  auto state = json::parse(s.state_dict().dump());
  EXPECT_EQ(state["mode"], "dynamic");
  LossScaler resumed = LossScaler::dynamic(options);
  resumed.load_state_dict(state, "ckpt/loss_scaler");
  EXPECT_EQ(resumed.scale(), s.scale());
  EXPECT_EQ(resumed.cur_iter(), s.cur_iter());
  EXPECT_EQ(resumed.last_overflow_iter(), s.last_overflow_iter());
  EXPECT_EQ(resumed.cur_hysteresis(), s.cur_hysteresis());
  ASSERT_NE(resumed.scale(), 1024.0);  // the round trip changed something
  for (bool overflow : {false, false, true, false, false, false, true, true}) {
    s.update(overflow);
    resumed.update(overflow);
    EXPECT_EQ(resumed.state_dict(), s.state_dict());
  }

  LossScaler fixed = LossScaler::fixed(64.0);
  EXPECT_THROW_WITH(fixed.load_state_dict(state, "ckpt"), core::ConfigError, "'dynamic' loss scaler, this run a 'static'");
  auto bad = state;
  bad["last_overflow_iter"] = state["cur_iter"];
  EXPECT_THROW_WITH(resumed.load_state_dict(bad, "ckpt"), core::ConfigError, "last_overflow_iter");
  auto typo = state;
  typo["cur_hysterisis"] = 1;
  EXPECT_THROW_WITH(resumed.load_state_dict(typo, "ckpt"), core::ConfigError, "did you mean 'cur_hysteresis'");
}

TEST(LossScaler, Fp16BlockErrorsNameTheKey) {
  EXPECT_THROW_WITH(from_block({{"enabled", true}, {"loss_scale_windw", 100}}), core::ConfigError,
                    "ds_config.json: fp16: unknown key 'loss_scale_windw' (did you mean 'loss_scale_window'?)");
  EXPECT_THROW_WITH(from_block({{"enabled", true}, {"loss_scale_window", 0}}), core::ConfigError,
                    "key 'loss_scale_window' must be in [1,");
  EXPECT_THROW_WITH(from_block({{"enabled", true}, {"hysteresis", 0}}), core::ConfigError, "key 'hysteresis'");
  EXPECT_THROW_WITH(from_block({{"enabled", true}, {"min_loss_scale", 0}}), core::ConfigError, "min_loss_scale");
  EXPECT_THROW_WITH(from_block({{"enabled", true}, {"loss_scale", -1}}), core::ConfigError, "loss_scale");
  EXPECT_THROW_WITH(from_block({{"enabled", "yes"}}), core::ConfigError, "key 'enabled' expects a boolean");
  EXPECT_THROW_WITH(from_block(json::array()), core::ConfigError, "expected a JSON object");
  auto o = traced_options(0, 2, false);
  EXPECT_THROW_WITH(LossScaler::dynamic(o), core::ConfigError, "scale_window must be >= 1");
}

TEST(LossScalerOverflowCheck, FindsInfAndNanInAnyTensor) {
  auto finite = torch::full({3, 4}, 65504.0, torch::kHalf);  // fp16 max: large but finite
  auto other = torch::randn({7}, torch::kBFloat16);
  EXPECT_FALSE(engine::has_inf_or_nan({finite, other, torch::Tensor(), torch::empty({0})}));
  EXPECT_FALSE(engine::has_inf_or_nan({}));
  for (double bad : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    auto last = torch::zeros({5}, torch::kFloat);
    last[3].fill_(bad);
    EXPECT_TRUE(engine::has_inf_or_nan({finite, other, torch::Tensor(), last})) << bad;
    EXPECT_TRUE(engine::has_inf_or_nan({last.to(torch::kHalf), finite})) << bad;
  }
}

}  // namespace
}  // namespace dschat
