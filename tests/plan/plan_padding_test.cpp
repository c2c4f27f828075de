// dschat pads a supervised batch to its longest row (DeepSpeed-Chat: to max_seq_len), so with the
// data at hand the planner plans SFT and reward passes at the data's longest row: found by
// tokenising rows longest in bytes first, it must equal the longest over every row tokenised.
#include <gtest/gtest.h>

#include "dschat/data/raw_dataset.h"
#include "dschat/plan/step_plan.h"
#include "dschat/tokenizer/tokenizer.h"
#include "test_util.h"
#include "tiny_pipeline.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;

// Every train row of the local/jsonfile data in `dir`, tokenised, + the eos the trainers append.
int64_t brute_force_longest(const fs::path& dir, const fs::path& tokenizer_dir, bool pairs) {
  const tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::load(tokenizer_dir);
  data::RawDatasetOptions options;
  options.local_jsonfile_dir = dir.string();
  const data::DatasetSpec spec = data::DatasetSpec::from_json("local/jsonfile", "data_path");
  int64_t longest = 0;
  for (const data::PromptRecord& r : data::load_raw_dataset(spec, data::locate_dataset(spec, options), options).train) {
    for (const auto* text : {&r.prompt_and_chosen, pairs ? &r.prompt_and_rejected : nullptr}) {
      if (text != nullptr && text->has_value()) {
        longest = std::max(longest, static_cast<int64_t>(tokenizer.encode(**text).size()) + 1);
      }
    }
  }
  return longest;
}

TEST(PlanPadding, SupervisedStepsArePlannedAtTheDataLongestRow) {
  testing::TempDir tmp;
  const fs::path data = testing::make_tiny_demo_data(tmp.path());
  const std::string model = (testing::source_dir() / "assets" / "demo-opt").string();
  const nlohmann::json json = {
      {"actor_model", model},
      {"reward_model", model},
      {"output_dir", (tmp / "out").string()},
      {"steps", {1, 2}},
      {"data", {{"data_path", {"local/jsonfile"}}, {"local_jsonfile_dir", data.string()}, {"data_split", "2,4,4"}}},
      {"step1",
       {{"model_name_or_path", model}, {"max_seq_len", 512}, {"data", {{"local_jsonfile_dir", (data / "sft").string()}}}}},
      {"step2", {{"model_name_or_path", model}, {"max_seq_len", 512}}}};
  const rlhf::PipelineConfig config = rlhf::parse_pipeline_config(json, "padding test");
  plan::PlanOptions options;
  options.hardware = plan::cpu_hardware(1);
  const plan::PipelinePlan planned = plan::plan_pipeline(config, options);
  ASSERT_EQ(planned.steps.size(), 2u);

  const int64_t sft = brute_force_longest(data / "sft", model, /*pairs=*/false);
  const int64_t pairs = brute_force_longest(data, model, /*pairs=*/true);
  ASSERT_LT(sft, 512);
  ASSERT_LT(pairs, 512);
  EXPECT_EQ(planned.steps[0].longest_row, sft);
  EXPECT_EQ(planned.steps[1].longest_row, pairs);
  EXPECT_NE(planned.steps[0].steps_note.find("rows padded to at most " + std::to_string(sft) + " tokens"),
            std::string::npos)
      << planned.steps[0].steps_note;
  // The passes at the data's length hold less than at max_seq_len, and the same as planned at it.
  for (int step : {1, 2}) {
    const plan::StepPlan& at_data = planned.steps[static_cast<size_t>(step - 1)];
    EXPECT_LT(at_data.peak_bytes, plan::plan_step(config, step, options, -1).peak_bytes) << "step" << step;
    EXPECT_EQ(at_data.peak_bytes, plan::plan_step(config, step, options, -1, at_data.longest_row).peak_bytes);
  }
  // Without the data at hand (the count skipped) the plan keeps max_seq_len.
  options.count_rows = false;
  EXPECT_EQ(plan::plan_pipeline(config, options).steps[0].longest_row, -1);
}

}  // namespace
}  // namespace dschat
