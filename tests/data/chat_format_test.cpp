// The conversation format a model is trained in (data::infer_chat_format), recorded with it, and
// what `dschat chat` / `serve` then prompt it with (serve::select_chat_template): the training
// prompt, byte for byte, for DeepSpeed-Chat's spacings.
#include <gtest/gtest.h>

#include <fstream>

#include "dschat/data/chat_format.h"
#include "dschat/serve/chat_template.h"
#include "test_util.h"

namespace dschat {
namespace {

// The training prompt of `sample` (everything up to and including its last "Assistant:").
std::string prompt_of(const std::string& sample) { return sample.substr(0, sample.rfind("Assistant:") + 10); }

serve::ChatTemplate template_of(const nlohmann::json& format, const std::filesystem::path& dir) {
  std::ofstream(dir / data::kChatFormatFile) << format.dump(2);
  return serve::load_chat_template((dir / data::kChatFormatFile).string());
}

TEST(ChatFormat, RendersTheTrainingPromptOfEachSpacing) {
  testing::TempDir tmp;
  const std::pair<std::string, std::string> samples[] = {
      {" Human: Which is bigger, 7 or 6? Assistant: 7", "Which is bigger, 7 or 6?"},  // the demo (local/jsonfile)
      {"\n\nHuman: How do I bake bread?\n\nAssistant: Mix flour and water.", "How do I bake bread?"},  // HH
      {"Human: What is 3 plus 4? Assistant:7", "What is 3 plus 4?"},  // no space before the answer
  };
  for (const auto& [sample, question] : samples) {
    SCOPED_TRACE(sample);
    const auto format = data::infer_chat_format(sample);
    ASSERT_TRUE(format.has_value());
    const serve::ChatTemplate chat = template_of(*format, tmp.path());
    EXPECT_EQ(chat.render({{"user", question}}), prompt_of(sample));
    // The answer's leading space is the model's to write (" 7" is one token); chat trims it.
    EXPECT_EQ(chat.trim_leading_space, sample.find("Assistant: ") != std::string::npos);
    EXPECT_FALSE(chat.stop.empty());
  }
  EXPECT_FALSE(data::infer_chat_format("just some text").has_value());
  EXPECT_FALSE(data::infer_chat_format("Assistant: only").has_value());
}

// A model directory with a recorded format is prompted in it, before its tokenizer's Jinja
// template and DeepSpeed-Chat's default; "deepspeed" still forces the default.
TEST(ChatFormat, TheRecordedFormatIsTheDefaultChatTemplate) {
  testing::TempDir dir;
  for (const char* file : {"vocab.json", "merges.txt"}) {
    std::filesystem::copy_file(testing::source_dir() / "assets" / "gpt2-bpe" / file, dir / file);
  }
  const auto tokenizer = tokenizer::Tokenizer::load(dir.path());
  EXPECT_EQ(serve::select_chat_template("", tokenizer).render({{"user", "hi"}}), " Human: hi\n Assistant: ");
  std::ofstream(dir / data::kChatFormatFile) << data::infer_chat_format(" Human: hi Assistant: ok")->dump();
  const auto recorded = tokenizer::Tokenizer::load(dir.path());
  const serve::ChatTemplate chat = serve::select_chat_template("", recorded);
  EXPECT_EQ(chat.render({{"user", "Which is bigger, 7 or 6?"}}), " Human: Which is bigger, 7 or 6? Assistant:");
  EXPECT_NE(chat.source.find("the format the model was trained in"), std::string::npos) << chat.source;
  EXPECT_EQ(serve::select_chat_template("deepspeed", recorded).render({{"user", "hi"}}), " Human: hi\n Assistant: ");
}

}  // namespace
}  // namespace dschat
