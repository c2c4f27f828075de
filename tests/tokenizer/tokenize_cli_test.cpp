// `dschat tokenize`: JSON Lines through the CLI binary.

#include <fstream>

#include "test_util.h"

namespace dschat {
namespace {

using testing::TempDir;

std::string gpt2_dir() { return (testing::source_dir() / "assets/gpt2-bpe").string(); }

int run_cli(const std::string& args, const std::string& stdin_text, std::string* output) {
  TempDir dir;
  std::ofstream(dir / "in.jsonl") << stdin_text;
  return testing::run_command(std::string(DSCHAT_CLI_PATH) + " tokenize --tokenizer " + gpt2_dir() + " " + args +
                                  " < " + (dir / "in.jsonl").string(),
                              output);
}

TEST(TokenizerCli, EncodesJsonLinesFromStdin) {
  std::string output;
  ASSERT_EQ(run_cli("", "{\"text\": \"Hello world\"}\n\n{\"text\": \"a<|endoftext|>b\"}\n{\"text\": \"\"}\n", &output),
            0)
      << output;
  EXPECT_EQ(output, "{\"ids\":[15496,995]}\n{\"ids\":[64,50256,65]}\n{\"ids\":[]}\n");
}

TEST(TokenizerCli, EncodesOneTextAndDecodes) {
  std::string output;
  ASSERT_EQ(run_cli("--text ' Hello world'", "", &output), 0) << output;
  EXPECT_EQ(output, "{\"ids\":[18435,995]}\n");
  ASSERT_EQ(run_cli("--decode", "{\"ids\": [15496, 995]}\n{\"ids\": [64, 50256, 65]}\n", &output), 0) << output;
  EXPECT_EQ(output, "{\"text\":\"Hello world\"}\n{\"text\":\"a<|endoftext|>b\"}\n");
  ASSERT_EQ(run_cli("--decode --no-special-tokens", "{\"ids\": [64, 50256, 65]}\n", &output), 0) << output;
  EXPECT_EQ(output, "{\"text\":\"ab\"}\n");
}

TEST(TokenizerCli, BadLineFailsWithItsLineNumber) {
  std::string output;
  EXPECT_NE(run_cli("", "{\"text\": \"ok\"}\n{\"text\": oops}\n", &output), 0);
  EXPECT_NE(output.find("line 2"), std::string::npos) << output;
  EXPECT_NE(run_cli("--decode", "{\"ids\": [1, \"x\"]}\n", &output), 0);
  EXPECT_NE(output.find("line 1"), std::string::npos) << output;
  EXPECT_NE(run_cli("", "{\"txt\": \"a\"}\n", &output), 0);
  EXPECT_NE(output.find("'text'"), std::string::npos) << output;
}

}  // namespace
}  // namespace dschat
