// The parts of `dschat serve` below HTTP: the text stream (stop strings, split characters), the
// chat template, request parsing, the batch scheduler's queue, and the engine's step hooks. The
// HTTP API itself is tested through the openai client (tests/serve/api_test.py).
#include <gtest/gtest.h>

#include <map>

#include <fstream>
#include <thread>

#include "dschat/core/error.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/models/load_save.h"
#include "dschat/serve/batch_scheduler.h"
#include "dschat/serve/chat_template.h"
#include "dschat/serve/text_stream.h"
#include "serve/openai_protocol.h"
#include "test_util.h"

namespace dschat {
namespace serve {
namespace {

const tokenizer::Tokenizer& gpt2() {
  static const tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::load(testing::source_dir() / "assets" / "gpt2-bpe");
  return tokenizer;
}

// Pushes `text`'s ids one at a time; returns the pieces handed out (finish() last).
std::vector<std::string> stream_pieces(const std::string& text, std::vector<std::string> stops, bool trim,
                                       bool* stopped = nullptr) {
  TextStream stream(&gpt2(), std::move(stops), trim);
  std::vector<std::string> pieces;
  for (int64_t id : gpt2().encode(text, false)) pieces.push_back(stream.push(id));
  pieces.push_back(stream.finish());
  if (stopped) *stopped = stream.stopped();
  return pieces;
}

std::string joined(const std::vector<std::string>& pieces) {
  std::string text;
  for (const auto& piece : pieces) text += piece;
  return text;
}

TEST(TextStream, PiecesAddUpToTheTextAndNeverSplitACharacter) {
  const std::string text = "Tokyo is 東京, café ☕ and 🙂 done";  // multi-byte characters split across byte tokens
  const auto pieces = stream_pieces(text, {}, false);
  EXPECT_EQ(joined(pieces), text);
  for (const auto& piece : pieces) EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << piece;
  EXPECT_GT(std::count_if(pieces.begin(), pieces.end(), [](const std::string& p) { return !p.empty(); }), 5);
}

TEST(TextStream, StopStringEndsTheAnswerAndIsNeverHandedOut) {
  bool stopped = false;
  const auto pieces = stream_pieces("The answer is 42.\n Human: and now?", {" Human:", "Human:"}, false, &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(joined(pieces), "The answer is 42.\n");
  // Held back while it could still become the stop string, then released when it does not.
  const auto released = stream_pieces("Hum drum", {" Human:"}, false, &stopped);
  EXPECT_FALSE(stopped);
  EXPECT_EQ(joined(released), "Hum drum");
}

TEST(TextStream, TrimsLeadingWhitespaceOfAChatReply) {
  EXPECT_EQ(joined(stream_pieces("   \n Paris.", {}, true)), "Paris.");
  EXPECT_EQ(find_first_stop("abcHuman:x Human:", {" Human:", "Human:"}), 3u);
  EXPECT_EQ(stop_prefix_suffix("text Hu", {" Human:"}), 3u);
  EXPECT_EQ(stop_prefix_suffix("text", {" Human:"}), 0u);
}

TEST(ChatTemplate, DefaultIsDeepSpeedChatsFormat) {
  const ChatTemplate chat;
  EXPECT_EQ(chat.render({{"user", "Hi"}}), " Human: Hi\n Assistant: ");
  EXPECT_EQ(chat.render({{"system", "S"}, {"user", "A"}, {"assistant", "B"}, {"user", "C"}}),
            "S\n\n Human: A\n Assistant: B\n\n Human: C\n Assistant: ");
  EXPECT_THROW(chat.render({{"robot", "x"}}), core::InvalidArgument);
}

TEST(ChatTemplate, FileErrorsNameTheKeyAndFile) {
  testing::TempDir tmp;
  const auto write = [&](const std::string& text) {
    std::ofstream((tmp / "t.json").string()) << text;
    return (tmp / "t.json").string();
  };
  const ChatTemplate custom = load_chat_template(write(R"({"user": "<|user|>{content}", "stop": ["<|user|>"]})"));
  EXPECT_EQ(custom.render({{"user", "x"}}), "<|user|>x Assistant: ");
  EXPECT_EQ(custom.stop, std::vector<std::string>{"<|user|>"});
  try {
    load_chat_template(write(R"({"usr": "{content}"})"));
    FAIL() << "unknown key accepted";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'usr'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("t.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_chat_template(write(R"({"user": "no placeholder"})")), core::ConfigError);
}

TEST(OpenAiProtocol, ParsesAndNamesTheBadKey) {
  const ApiRequest chat = parse_api_request(
      R"({"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}]}],
          "max_completion_tokens": 7, "temperature": 0, "stop": "x", "seed": 3, "stream": true,
          "stream_options": {"include_usage": true}})",
      Endpoint::kChat, 16);
  EXPECT_EQ(chat.messages[0].role, "system");
  EXPECT_EQ(chat.messages[0].content, "a");
  EXPECT_EQ(chat.params.max_tokens, 7);
  EXPECT_TRUE(chat.params.greedy());
  EXPECT_EQ(chat.params.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(*chat.params.seed, 3u);
  EXPECT_TRUE(chat.stream && chat.include_usage);
  const ApiRequest penalized = parse_api_request(
      R"({"model": "m", "prompt": "x", "presence_penalty": -0.5, "frequency_penalty": 1.5, "repetition_penalty": 1.1,
          "logit_bias": {"50256": -100, "7": 2.5}})",
      Endpoint::kCompletions, 16);
  EXPECT_EQ(penalized.params.presence_penalty, -0.5);
  EXPECT_EQ(penalized.params.frequency_penalty, 1.5);
  EXPECT_EQ(penalized.params.repetition_penalty, 1.1);
  EXPECT_EQ(penalized.params.logit_bias, (std::map<int64_t, double>{{7, 2.5}, {50256, -100.0}}));
  const ApiRequest ids = parse_api_request(R"({"model": "m", "prompt": [[1, 2], [3]]})", Endpoint::kCompletions, 16);
  EXPECT_EQ(ids.prompt_ids.size(), 2u);
  EXPECT_EQ(ids.params.max_tokens, 16);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"model": "m", "prompt": "x", "top_p": 1.5})", "top_p"},
      {R"({"model": "m", "prompt": "x", "n": 200})", "n"},
      {R"({"model": "m", "prompt": "x", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"model": "m", "prompt": "x", "presence_penalty": 2.5})", "presence_penalty"},
      {R"({"model": "m", "prompt": "x", "frequency_penalty": "high"})", "frequency_penalty"},
      {R"({"model": "m", "prompt": "x", "repetition_penalty": 0.5})", "repetition_penalty"},
      {R"({"model": "m", "prompt": "x", "logit_bias": {"-3": 1}})", "logit_bias"},
      {R"({"model": "m", "prompt": "x", "logit_bias": {"50256": 101}})", "logit_bias"},
      {R"({"model": "m", "prompt": "x", "logit_bias": [1, 2]})", "logit_bias"},
      {R"({"model": "m", "prompt": "x", "best_of": 2})", "best_of"},
      {R"({"model": "m", "prompt": "x", "stop": [""]})", "stop"},
      {R"({"model": "m", "prompt": []})", "prompt"},
      {R"({"prompt": "x"})", "model"},
  };
  for (const auto& [body, param] : bad) {
    try {
      parse_api_request(body, Endpoint::kCompletions, 16);
      ADD_FAILURE() << body << " accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, param) << e.what();
    }
  }
  EXPECT_THROW(parse_api_request(R"({"model": "m"})", Endpoint::kChat, 16), ApiError);  // no messages
}

TEST(OpenAiProtocol, RawBytesAndHugeNumbersAreClientErrorsInOurOwnWords) {
  const std::vector<std::pair<std::string, std::string>> bad = {  // body, what the message says
      {"{\"model\": \"m\", \"prompt\": \"caf\xe9\"}", "text that is not UTF-8 at byte"},
      {"{\"model\": \"m\xff\", \"prompt\": \"x\"}", "text that is not UTF-8 at byte"},
      {"{\"model\": \"m\", \"prompt\": \"x\", \"stop\": [\"\xc3\"]}", "text that is not UTF-8 at byte"},
      {R"({"model": "m", "prompt": "x", "temperature": 1e400})", "outside the range of a double"},
      {R"({"model": "m", "prompt": "x")", "a syntax error at byte"},
  };
  for (const auto& [body, says] : bad) {
    try {
      parse_api_request(body, Endpoint::kCompletions, 16);
      ADD_FAILURE() << body << " accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("json.exception"), std::string::npos) << e.what();
    }
  }
  // What goes out is UTF-8 whatever the text holds: a lone byte becomes U+FFFD.
  EXPECT_EQ(wire_json(nlohmann::json{{"text", std::string("a\xff")}}), "{\"text\":\"a\xef\xbf\xbd\"}");
}

models::CausalLM tiny_model() { return models::load_causal_lm((testing::source_dir() / "assets" / "tiny-opt").string()); }

TEST(BatchScheduler, FullQueueRefusesAndStopFailsTheWaiting) {
  SchedulerOptions options;
  options.max_queue = 2;
  options.batch_window = std::chrono::milliseconds(60'000);  // nothing runs: the queue only fills
  options.max_batch_rows = 4;
  BatchScheduler scheduler(tiny_model(), gpt2(), {}, options);
  SamplingParams params;
  params.max_tokens = 4;
  auto first = std::make_shared<GenerationRequest>(std::vector<std::vector<int64_t>>{{10, 11}}, params);
  auto second = std::make_shared<GenerationRequest>(std::vector<std::vector<int64_t>>{{12}}, params);
  scheduler.submit(first);
  scheduler.submit(second);
  EXPECT_THROW(scheduler.submit(std::make_shared<GenerationRequest>(std::vector<std::vector<int64_t>>{{1}}, params)),
               QueueFull);
  EXPECT_EQ(scheduler.counters().rejected_total, 1);
  EXPECT_EQ(scheduler.counters().queued, 2);
  scheduler.stop();
  std::vector<ChoiceEvent> events;
  EXPECT_TRUE(first->wait(events, std::chrono::milliseconds(0)));
  EXPECT_NE(first->error().find("stopping"), std::string::npos);
  EXPECT_THROW(scheduler.submit(second), core::InvalidArgument);
}

TEST(BatchScheduler, AKvPoolBelowOneBlockIsANamedError) {
  SchedulerOptions options;
  options.kv_cache_memory = -1;
  EXPECT_THROW_WITH(BatchScheduler(tiny_model(), gpt2(), {}, options), core::InvalidArgument,
                    "kv_cache_memory must be >= 0 bytes, got -1");
  options.kv_cache_memory = 1000;
  EXPECT_THROW_WITH(BatchScheduler(tiny_model(), gpt2(), {}, options), core::InvalidArgument,
                    "kv_cache_memory of 1000 bytes is below one block of 16 tokens");
}

TEST(BatchScheduler, CancelledWhileQueuedNeverRunsAndLengthsArePerRequest) {
  SchedulerOptions options;
  options.batch_window = std::chrono::milliseconds(200);
  BatchScheduler scheduler(tiny_model(), gpt2(), {}, options);
  SamplingParams short_answer, long_answer;
  short_answer.max_tokens = 3;
  short_answer.temperature = 0;
  long_answer.max_tokens = 9;
  long_answer.temperature = 0.9;
  long_answer.seed = 5;
  auto gone = std::make_shared<GenerationRequest>(std::vector<std::vector<int64_t>>{{50, 51, 52}}, short_answer);
  auto a = std::make_shared<GenerationRequest>(std::vector<std::vector<int64_t>>{{50, 51, 52}}, short_answer);
  auto b = std::make_shared<GenerationRequest>(std::vector<std::vector<int64_t>>{{7}}, long_answer);
  scheduler.submit(gone);
  gone->cancel();
  scheduler.submit(a);
  scheduler.submit(b);
  std::vector<ChoiceEvent> a_events, b_events, gone_events;
  while (!a->wait(a_events, std::chrono::milliseconds(100))) {}
  while (!b->wait(b_events, std::chrono::milliseconds(100))) {}
  EXPECT_EQ(a->completion_tokens(), 3);  // the eos of a random tiny model is unlikely in 3 or 9 tokens
  EXPECT_EQ(b->completion_tokens(), 9);
  EXPECT_EQ(a_events.back().finish_reason, "length");
  EXPECT_FALSE(gone->wait(gone_events, std::chrono::milliseconds(0)));  // dropped, never answered
  // The counters are updated when the batch call returns, just after its last answer went out.
  SchedulerCounters counters = scheduler.counters();
  for (int i = 0; i < 500 && counters.completed_total < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    counters = scheduler.counters();
  }
  EXPECT_EQ(counters.cancelled_total, 1);
  EXPECT_EQ(counters.batches_total, 1);  // a and b decoded together
  EXPECT_EQ(counters.completed_total, 2);
  EXPECT_EQ(counters.generated_tokens_total, 12);
}

// Continuous batching: a request that arrives while a long one decodes joins its steps and
// finishes long before it, and a seeded sampled answer is the same text alone or joined mid-run.
TEST(BatchScheduler, ALateRequestJoinsTheRunningRowsAndAnswersAsAlone) {
  SchedulerOptions options;
  options.batch_window = std::chrono::milliseconds(0);
  BatchScheduler scheduler(tiny_model(), gpt2(), {}, options);
  SamplingParams long_answer, late;
  long_answer.max_tokens = 200;
  long_answer.temperature = 0;
  late.max_tokens = 6;
  late.temperature = 0.8;
  late.seed = 11;
  late.n = 2;
  auto answer_of = [](const std::shared_ptr<GenerationRequest>& request) {
    std::vector<ChoiceEvent> events;
    while (!request->wait(events, std::chrono::milliseconds(100))) {}
    std::map<int64_t, std::string> text;
    for (const auto& event : events) text[event.index] += event.text;
    return text;
  };
  auto alone = std::make_shared<GenerationRequest>(std::vector<std::vector<int64_t>>{{7, 8}}, late);
  scheduler.submit(alone);
  const std::map<int64_t, std::string> alone_text = answer_of(alone);

  auto first = std::make_shared<GenerationRequest>(std::vector<std::vector<int64_t>>{{50, 51, 52}}, long_answer);
  scheduler.submit(first);
  while (first->completion_tokens() < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto joined = std::make_shared<GenerationRequest>(std::vector<std::vector<int64_t>>{{7, 8}}, late);
  scheduler.submit(joined);
  const std::map<int64_t, std::string> joined_text = answer_of(joined);
  EXPECT_LT(first->completion_tokens(), 200) << "the late request waited for the long one to end";
  EXPECT_EQ(joined_text, alone_text);
  EXPECT_EQ(joined->completion_tokens(), 12);
  answer_of(first);
  EXPECT_EQ(first->completion_tokens(), 200);
}

// Two chats with one long system prompt: the second prefills only what follows the system
// prompt's full 16-token blocks, and answers as a server without prefix caching does.
TEST(BatchScheduler, ASharedSystemPromptComesFromThePrefixCache) {
  SamplingParams params;
  params.max_tokens = 5;
  params.temperature = 0.7;
  params.seed = 3;
  std::vector<int64_t> system;
  for (int64_t t = 0; t < 37; ++t) system.push_back(100 + 3 * t);  // 2 full blocks and 5 tokens
  auto chat = [&](int64_t question) {
    std::vector<int64_t> prompt = system;
    prompt.push_back(question);
    return std::make_shared<GenerationRequest>(std::vector<std::vector<int64_t>>{prompt}, params);
  };
  std::map<bool, std::vector<std::string>> answers;
  for (const bool prefix_caching : {false, true}) {
    SchedulerOptions options;
    options.batch_window = std::chrono::milliseconds(0);
    options.prefix_caching = prefix_caching;
    BatchScheduler scheduler(tiny_model(), gpt2(), {}, options);
    for (int64_t question : {7, 9}) {
      auto request = chat(question);
      scheduler.submit(request);
      std::vector<ChoiceEvent> events;
      while (!request->wait(events, std::chrono::milliseconds(100))) {}
      std::string text;
      for (const auto& event : events) text += event.text;
      answers[prefix_caching].push_back(text);
    }
    SchedulerCounters counters = scheduler.counters();
    for (int i = 0; i < 500 && counters.completed_total < 2; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      counters = scheduler.counters();
    }
    EXPECT_EQ(counters.cached_prompt_tokens_total, prefix_caching ? 32 : 0);
    EXPECT_EQ(counters.prefilled_tokens_total, prefix_caching ? 38 + 6 : 2 * 38);
  }
  EXPECT_EQ(answers[true], answers[false]);
}

// Requests arriving together are prefilled in one forward (batched_prefill) or one forward each:
// the same seeded answers either way.
TEST(BatchScheduler, RequestsArrivingTogetherGetTheSameAnswersWithAndWithoutBatchedPrefill) {
  SamplingParams params;
  params.max_tokens = 6;
  params.temperature = 0.8;
  params.seed = 11;
  std::map<bool, std::vector<std::string>> answers;
  for (const bool batched : {false, true}) {
    SchedulerOptions options;
    options.batch_window = std::chrono::milliseconds(200);  // the four start in one step
    options.batched_prefill = batched;
    BatchScheduler scheduler(tiny_model(), gpt2(), {}, options);
    std::vector<std::shared_ptr<GenerationRequest>> requests;
    for (int64_t length : {3, 9, 5, 14}) {
      std::vector<int64_t> prompt;
      for (int64_t t = 0; t < length; ++t) prompt.push_back(200 + 7 * t + length);
      requests.push_back(std::make_shared<GenerationRequest>(std::vector<std::vector<int64_t>>{prompt}, params));
      scheduler.submit(requests.back());
    }
    for (auto& request : requests) {
      std::vector<ChoiceEvent> events;
      while (!request->wait(events, std::chrono::milliseconds(100))) {}
      std::string text;
      for (const auto& event : events) text += event.text;
      answers[batched].push_back(text);
    }
  }
  EXPECT_EQ(answers[true], answers[false]);
  EXPECT_EQ(answers[true].size(), 4u);
}

// The server's sampler (grouped warpers, one inverse-CDF draw per row) draws from the warped
// distribution: with top_k = 2 every token is one of the two likeliest, and the likeliest comes up
// about as often as its renormalised probability says.
TEST(BatchScheduler, SampledTokensFollowTheWarpedDistribution) {
  const std::vector<int64_t> prompt = {50, 51, 52};
  models::CausalLM model = tiny_model();
  torch::Tensor first_logits;  // [1, V]
  {
    inference::InferenceEngine engine(model);
    inference::StepHooks capture;
    capture.select_next = [&](const torch::Tensor& logits, const torch::Tensor&, int64_t) {
      first_logits = logits.clone();
      return logits.argmax(1);
    };
    core::GenerationConfig one;
    one.max_new_tokens = 1;
    engine.generate(torch::tensor(prompt, torch::kInt64).unsqueeze(0), torch::ones({1, 3}, torch::kInt64), one, capture);
  }
  // A low temperature sharpens the random tiny model's near-even top two into a lopsided pair.
  constexpr double kTemperature = 0.02;
  const auto [top, ids] = (first_logits / kTemperature).softmax(1).topk(2, 1);  // [1, 2] each
  const double expected_share = (top[0][0] / top[0].sum()).item<double>();

  SchedulerOptions options;
  options.max_batch_rows = 64;
  BatchScheduler scheduler(model, gpt2(), {}, options);
  int64_t first = 0, total = 0;
  for (uint64_t seed : {1, 2, 3, 4}) {
    SamplingParams params;
    params.max_tokens = 1;
    params.temperature = kTemperature;
    params.top_k = 2;
    params.n = 64;
    params.seed = seed;
    auto request = std::make_shared<GenerationRequest>(std::vector<std::vector<int64_t>>{prompt}, params);
    scheduler.submit(request);
    std::vector<ChoiceEvent> events;
    while (!request->wait(events, std::chrono::milliseconds(100))) {}
    for (const auto& event : events) {
      if (event.finish_reason.empty()) continue;
      ++total;
      const std::string top1 = gpt2().decode({ids[0][0].item<int64_t>()}), top2 = gpt2().decode({ids[0][1].item<int64_t>()});
      ASSERT_TRUE(event.text == top1 || event.text == top2) << "'" << event.text << "' is not among the top 2";
      first += event.text == top1 ? 1 : 0;
    }
  }
  ASSERT_EQ(total, 256);
  // 256 draws: the share's standard deviation is at most 0.031; 0.13 is over 4 of them.
  EXPECT_NEAR(static_cast<double>(first) / total, expected_share, 0.13) << "expected share " << expected_share;
}

TEST(StepHooks, CallerPicksTokensAndEndsRows) {
  inference::InferenceEngine engine(tiny_model());
  torch::Tensor ids = torch::tensor({{5, 6, 7}, {8, 9, 10}}, torch::kInt64);  // [2, 3]
  torch::Tensor mask = torch::ones_like(ids);                                   // [2, 3]
  core::GenerationConfig config;
  config.max_new_tokens = 6;
  config.pad_token_id = 0;
  const auto greedy = engine.generate(ids, mask, config);
  inference::StepHooks hooks;
  int64_t calls = 0;
  hooks.select_next = [](const torch::Tensor& logits, const torch::Tensor&, int64_t) { return logits.argmax(1); };
  hooks.end_rows = [&](const torch::Tensor& next, int64_t step) {
    ++calls;
    EXPECT_EQ(next.device(), torch::Device(torch::kCPU));
    return std::vector<bool>{step == 1, false};  // row 0 ends after its second token
  };
  const auto hooked = engine.generate(ids, mask, config, hooks);
  EXPECT_EQ(calls, 6);
  EXPECT_TRUE(torch::equal(hooked.sequences[1], greedy.sequences[1]));
  EXPECT_TRUE(torch::equal(hooked.sequences[0].narrow(0, 0, 5), greedy.sequences[0].narrow(0, 0, 5)));
  EXPECT_EQ(hooked.attention_mask[0].sum().item<int64_t>(), 5);  // 3 prompt + 2 answer tokens
  EXPECT_EQ(hooked.sequences[0][5].item<int64_t>(), 0);          // pad after the end
}

}  // namespace
}  // namespace serve
}  // namespace dschat
