// The dschat CLI end to end: info, forward (parity through .npy files), generate, error exits.
#include <gtest/gtest.h>

#include "dschat/io/npy.h"
#include "test_util.h"

namespace dschat {
namespace {

std::string cli() { return DSCHAT_CLI_PATH; }

TEST(CliTest, InfoReportsVersionsAndFeatures) {
  std::string out;
  ASSERT_EQ(testing::run_command(cli() + " info", &out), 0) << out;
  EXPECT_NE(out.find("LibTorch    2.11.0"), std::string::npos) << out;
  EXPECT_NE(out.find("CUDA"), std::string::npos);
  EXPECT_NE(out.find("NCCL"), std::string::npos);
  EXPECT_NE(out.find("features"), std::string::npos);
}

TEST(CliTest, ForwardWritesTransformersLogits) {
  testing::TempDir tmp;
  auto exp = testing::fixture("llama-gqa") / "expected";
  std::string out;
  ASSERT_EQ(testing::run_command(cli() + " forward --model " + testing::fixture("llama-gqa").string() + " --input-ids " +
                                     (exp / "input_ids.npy").string() + " --attention-mask " +
                                     (exp / "attention_mask.npy").string() + " --output " + (tmp / "l.npy").string(),
                                 &out),
            0)
      << out;
  torch::Tensor logits = io::load_npy(tmp / "l.npy");                 // [B, T, V]
  torch::Tensor expected = io::load_npy(exp / "logits.npy");          // [B, T, V]
  torch::Tensor keep = io::load_npy(exp / "attention_mask.npy").to(torch::kBool);  // [B, T]
  EXPECT_LT(testing::max_abs_diff(logits.index({keep}), expected.index({keep})), 1e-4);
}

TEST(CliTest, ForwardValueHeadWritesPerTokenValues) {
  testing::TempDir tmp;
  auto dir = testing::fixture("reward-opt-postln");
  std::string out;
  ASSERT_EQ(testing::run_command(cli() + " forward --value-head --model " + dir.string() + " --input-ids " +
                                     (dir / "expected" / "input_ids.npy").string() + " --output " +
                                     (tmp / "v.npy").string(),
                                 &out),
            0)
      << out;
  EXPECT_EQ(io::load_npy(tmp / "v.npy").sizes(), (torch::IntArrayRef{3, 10}));
}

TEST(CliTest, GenerateContinuesAPromptWithTheBundledModel) {
  std::string out;
  std::string cmd = cli() + " generate --model " + (testing::source_dir() / "assets" / "tiny-opt").string() +
                    " --tokenizer " + (testing::source_dir() / "assets" / "gpt2-bpe").string() +
                    " --prompt 'Human: hello Assistant:' --max-new-tokens 5";
  ASSERT_EQ(testing::run_command(cmd, &out), 0) << out;
  EXPECT_FALSE(out.empty());
  std::string again;
  ASSERT_EQ(testing::run_command(cmd, &again), 0);
  EXPECT_EQ(out, again);  // greedy is deterministic
}

TEST(CliTest, BadArgumentsExitNonZeroWithANamedError) {
  std::string out;
  EXPECT_EQ(testing::run_command(cli() + " forward --model /nonexistent/model --input-ids " +
                                     (testing::fixture("opt-preln") / "expected" / "input_ids.npy").string() +
                                     " --output /tmp/x.npy",
                                 &out),
            1);
  EXPECT_NE(out.find("dschat: error: model '/nonexistent/model' not found"), std::string::npos) << out;
  EXPECT_EQ(testing::run_command(cli() + " forward --model x --input-ids y --output z --dtype fp8", &out), 1);
  EXPECT_NE(out.find("dtype: expected fp32, bf16 or fp16, got 'fp8'"), std::string::npos) << out;
  EXPECT_EQ(testing::run_command(cli() + " frobnicate", &out), 2);
}

}  // namespace
}  // namespace dschat
