// The dschat CLI end to end: info, forward (parity through .npy files), generate, chat, error exits.
#include <gtest/gtest.h>

#include <fstream>

#include "dschat/io/npy.h"
#include "rank_jobs.h"
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

std::string tiny_model_flags() {
  return " --model " + (testing::source_dir() / "assets" / "tiny-opt").string() + " --tokenizer " +
         (testing::source_dir() / "assets" / "gpt2-bpe").string();
}

TEST(CliTest, GenerateContinuesAPromptWithTheBundledModel) {
  testing::TempDir tmp;
  std::string out;
  std::string cmd = cli() + " generate" + tiny_model_flags() + " --prompt 'Human: hello Assistant:' --max-new-tokens 5";
  // stdout only: stderr carries the statistics line, whose timings differ between runs.
  // (run_command appends 2>&1, hence the subshells.)
  ASSERT_EQ(testing::run_command("(" + cmd + " 2>" + (tmp / "err").string() + ")", &out), 0) << out;
  EXPECT_FALSE(out.empty());
  std::string again;
  ASSERT_EQ(testing::run_command("(" + cmd + " 2>/dev/null)", &again), 0);
  EXPECT_EQ(out, again);  // greedy is deterministic
  std::ifstream err_file(tmp / "err");
  std::string err((std::istreambuf_iterator<char>(err_file)), std::istreambuf_iterator<char>());
  EXPECT_NE(err.find("Generation => Latency: "), std::string::npos) << err;
  EXPECT_NE(err.find("Per-token Latency"), std::string::npos) << err;
  EXPECT_EQ(testing::run_command(cmd + " --max-out-tokens 8", &out), 1);
  EXPECT_NE(out.find("exceeds max_out_tokens (8)"), std::string::npos) << out;
  // OpenAI's penalties change the greedy answer; a bias outside the vocabulary names the file.
  std::string penalized;
  const std::string penalties = " --frequency-penalty 2 --presence-penalty 1";
  ASSERT_EQ(testing::run_command("(" + cmd + penalties + " 2>/dev/null)", &penalized), 0);
  EXPECT_NE(penalized, again);
  EXPECT_EQ(testing::run_command(cmd + " --presence-penalty 3", &out), 1);
  EXPECT_NE(out.find("key 'presence_penalty' must be in [-2, 2]"), std::string::npos) << out;
  const std::string config = (tmp / "gen.json").string();
  std::ofstream(config) << R"({"max_new_tokens": 5, "logit_bias": {"99999": 1}})";
  EXPECT_EQ(testing::run_command(cmd + " --config " + config, &out), 1);
  EXPECT_NE(out.find(config + ": key 'logit_bias' names token id 99999, outside the model's vocabulary (50257 ids)"),
            std::string::npos)
      << out;
}

TEST(CliTest, ChatAnswersTwoTurnsThenQuits) {
  std::string out;
  const std::string cmd = "printf 'hello there\\nwhat is the moon\\nquit\\nnever read\\n' | " + cli() + " chat" +
                          tiny_model_flags() + " --max-new-tokens 6";
  ASSERT_EQ(testing::run_command("(" + cmd + " 2>/dev/null)", &out), 0) << out;
  EXPECT_EQ(testing::count_lines_starting(out, "Assistant: "), 2) << out;
  std::string again;
  ASSERT_EQ(testing::run_command("(" + cmd + " 2>/dev/null)", &again), 0);
  EXPECT_EQ(out, again);  // greedy: the same conversation twice
  // `clear` then end of input (no quit): one answer, exit 0.
  ASSERT_EQ(testing::run_command("(printf 'clear\\nhi\\n' | " + cli() + " chat" + tiny_model_flags() +
                                     " --max-new-tokens 3 2>/dev/null)",
                                 &out),
            0)
      << out;
  EXPECT_EQ(testing::count_lines_starting(out, "Assistant: "), 1) << out;
}

TEST(CliTest, ChatPromptAnswersOnceWithoutReadingStdin) {
  std::string out;
  // stdin holds a turn that must not be read: --prompt answers exactly one turn.
  ASSERT_EQ(testing::run_command("(printf 'never read\\n' | " + cli() + " chat" + tiny_model_flags() +
                                     " --prompt 'what is the moon' --max-new-tokens 3 2>/dev/null)",
                                 &out),
            0)
      << out;
  EXPECT_EQ(testing::count_lines_starting(out, "Assistant: "), 1) << out;
}

TEST(CliTest, ChatWithAMissingModelNamesIt) {
  std::string out;
  EXPECT_EQ(testing::run_command("echo hi | " + cli() + " chat --model /nonexistent/chat-model", &out), 1);
  EXPECT_NE(out.find("dschat: error: model '/nonexistent/chat-model' not found"), std::string::npos) << out;
}

TEST(CliTest, InfoSaysWhatAutoPicks) {
  std::string out;
  ASSERT_EQ(testing::run_command(cli() + " info", &out), 0) << out;
  const bool gpu = torch::cuda::is_available();
  EXPECT_NE(out.find(gpu ? "auto        cuda:0" : "auto        cpu"), std::string::npos) << out;
}

TEST(CliTest, DeviceFlagIsCheckedOnEveryModelCommand) {
  std::string out;
  const std::string model = tiny_model_flags();
  const std::vector<std::string> commands = {" generate --prompt hi" + model,
                                             " forward --model x --input-ids y --output z",
                                             " chat --prompt hi" + model, " eval-rm --model x"};
  for (const std::string& command : commands) {
    EXPECT_EQ(testing::run_command(cli() + command + " --device gpu", &out), 1) << command;
    EXPECT_NE(out.find("--device: 'gpu' is not a device (auto, cpu, cuda or cuda:N)"), std::string::npos) << out;
  }
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(testing::run_command(cli() + " generate --prompt hi --device cuda" + model, &out), 1);
    EXPECT_NE(out.find("--device: 'cuda' needs a GPU, but none is visible"), std::string::npos) << out;
  }
  ASSERT_EQ(testing::run_command(cli() + " generate --prompt hi --max-new-tokens 2 --device cpu" + model, &out), 0)
      << out;
}

// --dry-run prints where each step runs. On the CPU a preset's fp16 becomes fp32, unless the
// user's file set the step's dtype.
TEST(CliTest, TrainDryRunShowsDevicesAndTheCpuDtypeRule) {
  testing::TempDir tmp;
  const std::string preset = " train --dry-run --actor opt-1.3b --reward opt-350m --deployment single_gpu";
  std::string out;
  ASSERT_EQ(testing::run_command(cli() + preset + " --device cpu", &out), 0) << out;
  EXPECT_NE(out.find("step1: sft  device cpu  dtype fp32  model opt-1.3b"), std::string::npos) << out;
  EXPECT_NE(out.find("step2: rm   device cpu  dtype fp32  model opt-350m"), std::string::npos) << out;
  EXPECT_NE(out.find("step3: ppo  device cpu  dtype fp32"), std::string::npos) << out;
  EXPECT_NE(out.find("step1: the preset's dtype fp16 runs as fp32 on the CPU"), std::string::npos) << out;
  // Each step's models as its log will start, from the memory plan (nothing loaded).
  EXPECT_NE(out.find("step3 (ppo) on cpu, 1 rank:"), std::string::npos) << out;
  EXPECT_NE(out.find("  reference     "), std::string::npos) << out;
  EXPECT_NE(out.find("planned per rank: resident"), std::string::npos) << out;
  // A bare size names DeepSpeed-Chat's OPT checkpoint (docs/config.md), also given as a flag.
  ASSERT_EQ(testing::run_command(cli() + " train --dry-run --actor 1.3b --reward 350m --deployment single_gpu --device cpu",
                                 &out),
            0)
      << out;
  EXPECT_NE(out.find("step1: sft  device cpu  dtype fp32  model facebook/opt-1.3b"), std::string::npos) << out;
  EXPECT_NE(out.find("step2: rm   device cpu  dtype fp32  model facebook/opt-350m"), std::string::npos) << out;

  const auto config = tmp / "c.json";
  std::ofstream(config) << R"({"device": "cpu", "step1": {"dtype": "bf16"}, "step3": {"device": "gpu"}})";
  EXPECT_EQ(testing::run_command(cli() + preset + " --config " + config.string(), &out), 1);
  EXPECT_NE(out.find("step3: key 'device': 'gpu' is not a device"), std::string::npos) << out;
  std::ofstream(config) << R"({"device": "cpu", "step1": {"dtype": "bf16"}})";
  ASSERT_EQ(testing::run_command(cli() + preset + " --config " + config.string(), &out), 0) << out;
  EXPECT_NE(out.find("step1: sft  device cpu  dtype bf16"), std::string::npos) << out;  // the user's choice
  EXPECT_NE(out.find("step2: rm   device cpu  dtype fp32"), std::string::npos) << out;
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(testing::run_command(cli() + preset + " --device cuda:0", &out), 1);
    // The flag is named, not the config key each step block received it as.
    EXPECT_NE(out.find("--device: 'cuda:0' needs a GPU, but none is visible"), std::string::npos) << out;
    EXPECT_EQ(out.find("step1: key 'device'"), std::string::npos) << out;
  }
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

// A mistyped command or flag is named with the nearest known one, before anything else is
// reported (CLI11 alone says "A subcommand is required", or that a required flag is missing).
TEST(CliTest, TyposAreNamedWithTheNearestCommandOrFlag) {
  const std::pair<std::string, std::string> cases[] = {
      {" trian", "unknown command 'trian' for 'dschat'; did you mean 'train'?"},
      {" ckpt lsit out", "unknown command 'lsit' for 'dschat ckpt'; did you mean 'list'?"},
      {" train --actr opt-13b", "unknown flag '--actr' for 'dschat train'; did you mean '--actor'?"},
      {" generate --promt hi", "unknown flag '--promt' for 'dschat generate'; did you mean '--prompt'?"},
      {" sft --modle x", "unknown flag '--modle' for 'dschat sft'"},
  };
  for (const auto& [args, expected] : cases) {
    std::string out;
    EXPECT_EQ(testing::run_command(cli() + args, &out), 2) << args;
    EXPECT_NE(out.find("dschat: error: " + expected), std::string::npos) << args << "\n" << out;
  }
  std::string out;
  // Values that look like flags or commands are left alone: a negative number, a value after a flag.
  EXPECT_EQ(testing::run_command(cli() + " plan --actor opt-1.3b --reward opt-350m --deployment single_gpu --gpu a100-80g "
                                         "--margin 0.1 --dataset-rows 100 --json",
                                 &out),
            0)
      << out;
  EXPECT_EQ(testing::run_command(cli() + " ckpt --help", &out), 0) << out;
}

}  // namespace
}  // namespace dschat
