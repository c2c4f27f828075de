// LR schedules against transformers' get_scheduler, run at test time through the project venv:
// every DeepSpeed-Chat type, edge-case warmup/total combinations, every step up to total + 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dschat/engine/lr_schedule.h"
#include "test_util.h"

namespace dschat {
namespace {

using engine::LrSchedule;
using engine::LrScheduleOptions;
using engine::LrScheduler;

// DeepSpeed-Chat's groups: the optimizer's lr and a LoRA group with its own lr.
constexpr double kLr = 1e-3;
constexpr double kLoraLr = 5e-4;

LrScheduleOptions options_for(const std::string& type, int64_t warmup, int64_t total) {
  LrScheduleOptions o;
  o.type = type;
  o.num_warmup_steps = warmup;
  o.num_training_steps = total;
  o.initial_lr = kLr;
  return o;
}

// 1e-12 relative, but at least 1e-15 (~5 ulps of 1.0): a multiplier is computed from terms of
// order 1 (1 + cos(x) near x = pi at the end of a cosine, step / warmup), so near zero, and at
// zero (warmup step 0, past a cosine's end), its rounding is of that size, not of its own.
double multiplier_tolerance(double want) { return std::max(1e-12 * std::abs(want), 1e-15); }

TEST(LrSchedule, MatchesTransformersGetSchedulerAtEveryStep) {
  const std::string script = R"PY(
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
from transformers import get_scheduler
types = ["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"]
combos = [(0, 10), (3, 10), (10, 10), (0, 1), (1, 1), (0, 0), (5, 3), (100, 1000), (7, 50)]
runs = [(t, w, n, {}) for t in types for (w, n) in combos]
runs += [("cosine", 4, 40, {"num_cycles": 2.25}), ("cosine_with_restarts", 4, 40, {"num_cycles": 3}),
         ("polynomial", 4, 40, {"lr_end": 1e-5, "power": 2.0}), ("polynomial", 0, 9, {"power": 0.5})]
cases = []
for name, warmup, total, kwargs in runs:
    params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.SGD([{"params": [params[0]]}, {"params": [params[1]], "lr": 5e-4}], lr=1e-3)
    case = {"type": name, "warmup": warmup, "total": total, "kwargs": kwargs, "lrs": [], "mults": [], "error": None}
    try:
        sched = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=total,
                              scheduler_specific_kwargs=dict(kwargs))
        for step in range(total + 3):
            if step:
                opt.step()
                sched.step()
            case["lrs"].append([g["lr"] for g in opt.param_groups])
            case["mults"].append(float(sched.lr_lambdas[0](step)))
    except ZeroDivisionError:
        case["error"] = "ZeroDivisionError"
    cases.append(case)
json.dump(cases, open(sys.argv[1], "w"))
)PY";
  nlohmann::json cases = testing::run_python_json(script);
  ASSERT_EQ(cases.size(), 6u * 9u + 4u);
  int compared_steps = 0;
  int python_errors = 0;
  for (const auto& c : cases) {
    auto options = options_for(c["type"], c["warmup"], c["total"]);
    const auto& kwargs = c["kwargs"];
    if (kwargs.contains("num_cycles")) options.num_cycles = kwargs["num_cycles"].get<double>();
    if (kwargs.contains("lr_end")) options.lr_end = kwargs["lr_end"].get<double>();
    if (kwargs.contains("power")) options.power = kwargs["power"].get<double>();
    const std::string label = c["type"].get<std::string>() + " warmup " + c["warmup"].dump() + " total " +
                              c["total"].dump() + " " + kwargs.dump();
    if (!c["error"].is_null()) {
      // transformers divides by zero at the last step; create() refuses such a schedule up front.
      ++python_errors;
      EXPECT_THROW(LrSchedule::create(options), core::ConfigError) << label;
      continue;
    }
    const double base_lrs[2] = {kLr, kLoraLr};
    LrScheduler scheduler(LrSchedule::create(options), {base_lrs[0], base_lrs[1]});
    const auto& want_lrs = c["lrs"];
    ASSERT_EQ(want_lrs.size(), static_cast<size_t>(options.num_training_steps + 3)) << label;
    for (size_t step = 0; step < want_lrs.size(); ++step) {
      if (step > 0) scheduler.step();
      ASSERT_EQ(scheduler.step_count(), static_cast<int64_t>(step));
      double want_mult = c["mults"][step].get<double>();
      EXPECT_NEAR(scheduler.schedule().multiplier(step), want_mult, multiplier_tolerance(want_mult))
          << label << " step " << step;
      auto lrs = scheduler.current_lrs();
      ASSERT_EQ(lrs.size(), 2u);
      for (size_t g = 0; g < 2; ++g) {
        double want = want_lrs[step][g].get<double>();
        EXPECT_NEAR(lrs[g], want, base_lrs[g] * multiplier_tolerance(want / base_lrs[g]))
            << label << " step " << step << " group " << g;
      }
      ++compared_steps;
    }
  }
  // Only polynomial with warmup == total fails in transformers: (10,10), (1,1), (0,0).
  EXPECT_EQ(python_errors, 3);
  EXPECT_GT(compared_steps, 6000);
}

TEST(LrSchedule, DocumentedShapes) {
  // DeepSpeed-Chat's default: cosine, linear warmup then 0.5 * (1 + cos(pi * progress)).
  auto cosine = LrSchedule::create(options_for("cosine", 100, 1100));
  EXPECT_DOUBLE_EQ(cosine.num_cycles(), 0.5);
  EXPECT_DOUBLE_EQ(cosine.multiplier(0), 0.0);
  EXPECT_DOUBLE_EQ(cosine.multiplier(50), 0.5);
  EXPECT_DOUBLE_EQ(cosine.multiplier(100), 1.0);
  EXPECT_NEAR(cosine.multiplier(600), 0.5, 1e-15);
  EXPECT_DOUBLE_EQ(cosine.multiplier(1100), 0.0);
  EXPECT_DOUBLE_EQ(LrSchedule::create(options_for("cosine_with_restarts", 0, 10)).num_cycles(), 1.0);
  // Polynomial ends at lr_end / initial_lr and stays there past the end.
  auto poly = LrSchedule::create(options_for("polynomial", 0, 10));
  EXPECT_DOUBLE_EQ(poly.multiplier(10), 1e-7 / kLr);
  EXPECT_DOUBLE_EQ(poly.multiplier(25), 1e-7 / kLr);
  // "constant" ignores the warmup, as get_scheduler does.
  EXPECT_DOUBLE_EQ(LrSchedule::create(options_for("constant", 5, 10)).multiplier(0), 1.0);
  EXPECT_DOUBLE_EQ(LrSchedule::create(options_for("constant_with_warmup", 4, 10)).multiplier(1), 0.25);
}

TEST(LrSchedule, BadOptionsAreConfigErrors) {
  EXPECT_THROW_WITH(LrSchedule::create(options_for("cosine_annealing", 0, 10)), core::ConfigError,
                    "'cosine_annealing' is not one of: linear, cosine, cosine_with_restarts, polynomial, constant, "
                    "constant_with_warmup");
  EXPECT_THROW_WITH(LrSchedule::create(options_for("linear", -1, 10)), core::ConfigError, "num_warmup_steps");
  EXPECT_THROW_WITH(LrSchedule::create(options_for("linear", 0, -5)), core::ConfigError, "num_training_steps");
  auto poly = options_for("polynomial", 0, 10);
  poly.initial_lr = 1e-7;  // transformers: "lr_end (1e-07) must be smaller than initial lr (1e-07)"
  EXPECT_THROW_WITH(LrSchedule::create(poly), core::ConfigError, "must be smaller than the initial lr");
  EXPECT_THROW_WITH(LrSchedule::create(options_for("polynomial", 10, 10)), core::ConfigError,
                    "must differ from num_warmup_steps");
  auto cycles = options_for("cosine", 0, 10);
  cycles.num_cycles = -1.0;
  EXPECT_THROW_WITH(LrSchedule::create(cycles), core::ConfigError, "num_cycles");
  EXPECT_THROW_WITH(LrSchedule::create(options_for("linear", 0, 10)).multiplier(-1), core::InvalidArgument,
                    "step must be >= 0");
}

TEST(LrScheduler, AppliesToGroupLrsAndRoundTripsItsState) {
  LrScheduler scheduler(LrSchedule::create(options_for("linear", 2, 10)), {kLr, kLoraLr});
  std::vector<double> group_lrs = {9.0, 9.0};
  scheduler.apply(group_lrs);
  EXPECT_EQ(group_lrs, (std::vector<double>{0.0, 0.0}));
  for (int i = 0; i < 6; ++i) scheduler.step();
  scheduler.apply(group_lrs);
  EXPECT_DOUBLE_EQ(group_lrs[0], kLr * 0.5);  // (10 - 6) / (10 - 2)
  EXPECT_DOUBLE_EQ(group_lrs[1], kLoraLr * 0.5);
  std::vector<double> wrong_size = {1.0};
  EXPECT_THROW_WITH(scheduler.apply(wrong_size), core::InvalidArgument, "holds 2 param groups");

  // Through text, as a checkpoint stores it.
  auto state = nlohmann::json::parse(scheduler.state_dict().dump());
  EXPECT_EQ(state["step_count"], 6);
  EXPECT_EQ(state["schedule"]["type"], "linear");
  LrScheduler resumed(LrSchedule::create(options_for("linear", 2, 10)), {1.0, 1.0});
  resumed.load_state_dict(state, "ckpt/lr_scheduler.json");
  EXPECT_EQ(resumed.step_count(), 6);
  EXPECT_EQ(resumed.base_lrs(), (std::vector<double>{kLr, kLoraLr}));
  EXPECT_EQ(resumed.current_lrs(), scheduler.current_lrs());
  resumed.step();
  scheduler.step();
  EXPECT_EQ(resumed.current_lrs(), scheduler.current_lrs());

  LrScheduler three_groups(LrSchedule::create(options_for("linear", 2, 10)), {1.0, 1.0, 1.0});
  EXPECT_THROW_WITH(three_groups.load_state_dict(state, "ckpt"), core::ConfigError, "this run has 3");
  auto typo = state;
  typo["step_cout"] = 3;
  EXPECT_THROW_WITH(resumed.load_state_dict(typo, "ckpt"), core::ConfigError, "did you mean 'step_count'");
  auto negative = state;
  negative["step_count"] = -2;
  EXPECT_THROW_WITH(resumed.load_state_dict(negative, "ckpt"), core::ConfigError, "must be >= 0");
  EXPECT_EQ(resumed.step_count(), 7);  // failed loads leave the state alone
}

}  // namespace
}  // namespace dschat
