// A model's Jinja chat template in `dschat serve` and `dschat chat` (serve/chat_template.h): found
// in the tokenizer directory and bound to its special tokens, its end-of-turn token a stop id,
// --chat-template deepspeed / FILE overriding it, what cannot be rendered refused by name; and an
// end-of-turn id ending an answer in the batch scheduler.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "dschat/core/error.h"
#include "dschat/inference/generate.h"
#include "dschat/models/load_save.h"
#include "dschat/serve/batch_scheduler.h"
#include "dschat/serve/chat_template.h"
#include "dschat/serve/text_stream.h"
#include "test_util.h"

namespace dschat {
namespace serve {
namespace {

using Json = nlohmann::json;

const char* const kChatMl =
    "{%- for message in messages %}\n"
    "    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}";

Json special(const std::string& content) {
  return {{"content", content}, {"lstrip", false}, {"normalized", false}, {"rstrip", false}, {"single_word", false},
          {"special", true}};
}

// The bundled GPT-2 tokenizer files plus a tokenizer_config.json: <|endoftext|> as bos and eos,
// <|im_end|> added as special token 50257, and `chat_template`.
std::filesystem::path tokenizer_dir(const testing::TempDir& tmp, const std::string& chat_template) {
  for (const char* name : {"vocab.json", "merges.txt"}) {
    std::filesystem::copy_file(testing::source_dir() / "assets" / "gpt2-bpe" / name, tmp / name);
  }
  const Json config = {{"bos_token", "<|endoftext|>"},
                       {"eos_token", "<|endoftext|>"},
                       {"added_tokens_decoder", {{"50256", special("<|endoftext|>")}, {"50257", special("<|im_end|>")}}},
                       {"chat_template", chat_template}};
  std::ofstream(tmp / "tokenizer_config.json") << config.dump();
  return tmp.path();
}

// A special token the tool-call parser needs (Mistral's [TOOL_CALLS]) keeps its text in the
// answer; the other special tokens are dropped as before, and the runs around it decode as usual.
TEST(TextStreamKeptSpecialTokens, KeepTheirTextAndTheRestDecodesAsBefore) {
  testing::TempDir tmp;
  const auto tokenizer = tokenizer::Tokenizer::load(tokenizer_dir(tmp, kChatMl));
  std::vector<int64_t> ids = tokenizer.encode("Checking.", false);
  ids.push_back(50257);  // <|im_end|>, special
  for (int64_t id : tokenizer.encode(" [{\"name\": \"f\"}]", false)) ids.push_back(id);
  ids.push_back(50256);  // <|endoftext|>, special and not kept
  const auto stream_text = [&](std::vector<int64_t> kept) {
    TextStream stream(&tokenizer, {}, false, std::move(kept));
    std::string text;
    for (int64_t id : ids) text += stream.push(id);
    return text + stream.finish();
  };
  EXPECT_EQ(stream_text({}), "Checking. [{\"name\": \"f\"}]");
  EXPECT_EQ(stream_text({50257}), "Checking.<|im_end|> [{\"name\": \"f\"}]");
}

TEST(JinjaChatTemplate, TheTokenizerDirectorysTemplateIsUsedWithItsEndOfTurnToken) {
  testing::TempDir tmp;
  const auto dir = tokenizer_dir(tmp, kChatMl);
  const auto tokenizer = tokenizer::Tokenizer::load(dir);
  const ChatTemplate chat = select_chat_template("", tokenizer);
  ASSERT_TRUE(chat.jinja);
  EXPECT_EQ(chat.source, (dir / "tokenizer_config.json").string());
  EXPECT_EQ(chat.render({{"system", "S"}, {"user", "Hi"}}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(chat.render({{"user", "Hi"}}, /*add_generation_prompt=*/false), "<|im_start|>user\nHi<|im_end|>\n");
  // The reply ends at <|im_end|> (what the template writes after an assistant turn) or at eos;
  // no stop strings, nothing trimmed, and the prompt gets no tokenizer-added specials.
  EXPECT_EQ(chat.stop_token_ids, std::vector<int64_t>{50257});
  EXPECT_TRUE(chat.stop.empty());
  EXPECT_FALSE(chat.trim_leading_space);
  EXPECT_FALSE(chat.add_special_tokens);
  EXPECT_EQ(chat.jinja_variables["eos_token"], "<|endoftext|>");
  EXPECT_EQ(chat.jinja_variables["bos_token"], "<|endoftext|>");
}

TEST(JinjaChatTemplate, EosAsTheEndOfTurnAddsNoStopIdAndFlagsOverride) {
  testing::TempDir tmp;
  const auto dir = tokenizer_dir(
      tmp, "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{{ eos_token }}\n{% endfor %}<|assistant|>\n");
  const auto tokenizer = tokenizer::Tokenizer::load(dir);
  const ChatTemplate zephyr = select_chat_template("", tokenizer);
  ASSERT_TRUE(zephyr.jinja);
  EXPECT_TRUE(zephyr.stop_token_ids.empty());  // eos ends replies anyway
  EXPECT_EQ(zephyr.render({{"user", "x"}}), "<|user|>\nx<|endoftext|>\n<|assistant|>");  // a final newline is dropped, as jinja2 drops it
  // --chat-template deepspeed: DeepSpeed-Chat's format whatever the directory has.
  const ChatTemplate deepspeed = select_chat_template(kDeepSpeedChatTemplate, tokenizer);
  EXPECT_FALSE(deepspeed.jinja);
  EXPECT_EQ(deepspeed.render({{"user", "Hi"}}), " Human: Hi\n Assistant: ");
  EXPECT_TRUE(deepspeed.add_special_tokens);
  EXPECT_EQ(deepspeed.stop, (std::vector<std::string>{" Human:", "Human:"}));
  // A JSON template file (today's format) and a .jinja file.
  testing::TempDir files;
  std::ofstream(files / "t.json") << R"({"user": "<|user|>{content}", "stop": ["<|user|>"]})";
  const ChatTemplate json = select_chat_template((files / "t.json").string(), tokenizer);
  EXPECT_FALSE(json.jinja);
  EXPECT_EQ(json.render({{"user", "x"}}), "<|user|>x Assistant: ");
  EXPECT_EQ(json.source, (files / "t.json").string());
  std::ofstream(files / "t.jinja") << kChatMl;
  const ChatTemplate jinja = select_chat_template((files / "t.jinja").string(), tokenizer);
  ASSERT_TRUE(jinja.jinja);
  EXPECT_EQ(jinja.source, (files / "t.jinja").string());
  EXPECT_EQ(jinja.stop_token_ids, std::vector<int64_t>{50257});
  // Without a template in the directory: DeepSpeed-Chat's format.
  const ChatTemplate plain = select_chat_template("", tokenizer::Tokenizer::load(testing::source_dir() / "assets" / "gpt2-bpe"));
  EXPECT_FALSE(plain.jinja);
  EXPECT_EQ(plain.render({{"user", "Hi"}}), " Human: Hi\n Assistant: ");
}

TEST(JinjaChatTemplate, WhatCannotBeRenderedIsRefusedNamingFileConstructAndPosition) {
  testing::TempDir tmp;
  const auto dir = tokenizer_dir(tmp, "{% for m in messages %}\n  {% macro say(x) %}{{ x }}{% endmacro %}{% endfor %}");
  const auto tokenizer = tokenizer::Tokenizer::load(dir);
  EXPECT_THROW_WITH(select_chat_template("", tokenizer), core::Unsupported,
                    (dir / "tokenizer_config.json").string() + ":2:6: '{% macro %}' is not supported");
  // A template that refuses the conversation: core::InvalidArgument (HTTP 400) with its message.
  testing::TempDir other;
  std::ifstream in(testing::fixture("chat_templates") / "mistral-v0.1.jinja");
  const std::string mistral((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const ChatTemplate chat = select_chat_template("", tokenizer::Tokenizer::load(tokenizer_dir(other, mistral)));
  EXPECT_EQ(chat.render({{"user", "a"}, {"assistant", "b"}, {"user", "c"}}),
            "<|endoftext|>[INST] a [/INST]b<|endoftext|> [INST] c [/INST]");
  EXPECT_THROW_WITH(chat.render({{"user", "a"}, {"user", "b"}}), core::InvalidArgument,
                    "raise_exception: Conversation roles must alternate user/assistant/user/assistant/...");
}

// Templates that list `tools` and show <tool_call> blocks (Qwen2.5, Qwen3) offer Hermes-style tool
// calls, and render the tools they are given; Mistral v0.3's [TOOL_CALLS] list is Mistral's
// format, LLaMA 3.1's <|python_tag|> and {"name", "parameters"} LLaMA's; the others offer none.
TEST(JinjaChatTemplate, HermesTemplatesOfferToolCalls) {
  const auto load = [](const std::string& name) {
    std::ifstream in(testing::fixture("chat_templates") / (name + ".jinja"));
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::map<std::string, std::string> formats = {{"qwen2.5", "hermes"}, {"qwen3", "hermes"}, {"chatml", ""},
                                                      {"llama3-instruct", ""}, {"mistral-v0.3", "mistral"},
                                                      {"llama3.1-instruct", "llama3_json"}};
  for (const auto& [name, format] : formats) {
    testing::TempDir tmp;
    const ChatTemplate chat = select_chat_template("", tokenizer::Tokenizer::load(tokenizer_dir(tmp, load(name))));
    EXPECT_EQ(chat.tool_call_format, format) << name;
    if (format != "hermes") continue;
    const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
        R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])");
    const std::string prompt = chat.render({{"user", "Weather?"}}, true, tools);
    EXPECT_NE(prompt.find("<tools>\n"), std::string::npos) << prompt;
    const std::string written = R"({"type": "function", "function": {"name": "get_weather", )"
                                R"("parameters": {"type": "object"}}})";
    EXPECT_NE(prompt.find(written), std::string::npos)
        << name << ": the tool as transformers' tojson writes it\n" << prompt;
    EXPECT_EQ(chat.render({{"user", "Weather?"}}, true).find("<tools>"), std::string::npos) << name;
  }
}

// The tiny model's greedy answer, then the same request with one of its tokens as an end-of-turn
// id: the answer stops there ("stop"), that token and everything after it left out.
TEST(JinjaChatTemplate, AnEndOfTurnIdEndsTheAnswer) {
  models::CausalLM model = models::load_causal_lm((testing::source_dir() / "assets" / "tiny-opt").string());
  const auto tokenizer = tokenizer::Tokenizer::load(testing::source_dir() / "assets" / "gpt2-bpe");
  const std::vector<int64_t> prompt = {50, 51, 52};
  core::GenerationConfig greedy;
  greedy.max_new_tokens = 8;
  const auto result = inference::generate(model, torch::tensor(prompt).reshape({1, 3}), torch::ones({1, 3}, torch::kInt64), greedy);
  std::vector<int64_t> answer;
  for (int64_t t = 3; t < result.sequences.size(1); ++t) answer.push_back(result.sequences[0][t].item<int64_t>());
  // The first token not seen before it (a greedy tiny model repeats itself).
  size_t stop_at = 1;
  while (stop_at < answer.size() &&
         std::find(answer.begin(), answer.begin() + static_cast<std::ptrdiff_t>(stop_at), answer[stop_at]) !=
             answer.begin() + static_cast<std::ptrdiff_t>(stop_at)) {
    ++stop_at;
  }
  ASSERT_LT(stop_at, answer.size()) << "the tiny model's greedy answer repeats one token";
  SchedulerOptions options;
  options.batch_window = std::chrono::milliseconds(0);
  BatchScheduler scheduler(model, tokenizer, {}, options);
  SamplingParams params;
  params.max_tokens = 8;
  params.temperature = 0;
  params.stop_token_ids = {answer[stop_at]};
  auto request = std::make_shared<GenerationRequest>(std::vector<std::vector<int64_t>>{prompt}, params);
  scheduler.submit(request);
  std::vector<ChoiceEvent> events;
  while (!request->wait(events, std::chrono::milliseconds(100))) {
  }
  std::string text;
  for (const auto& event : events) text += event.text;
  EXPECT_EQ(events.back().finish_reason, "stop");
  EXPECT_EQ(request->completion_tokens(), static_cast<int64_t>(stop_at) + 1);  // the end-of-turn token counted
  EXPECT_EQ(text, tokenizer.decode(std::vector<int64_t>(answer.begin(), answer.begin() + static_cast<std::ptrdiff_t>(stop_at)),
                                   /*skip_special_tokens=*/true));
  scheduler.stop();
}

}  // namespace
}  // namespace serve
}  // namespace dschat
