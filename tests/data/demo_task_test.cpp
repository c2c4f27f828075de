// The demo job's synthetic preference data: seeded determinism, a strict ground-truth scorer
// (every chosen scores 1, every rejected 0), held-out eval prompts, and data/demo/ being exactly
// what the command in data/demo/README.md writes.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "dschat/data/demo_task.h"
#include "test_util.h"

namespace dschat {
namespace {

using data::DemoPromptSet;
using data::demo_task_score;

// The arguments of the command data/demo/README.md documents (without --out).
const std::string kReadmeArgs = "--seed 1234 --train 2000 --eval 200";

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<data::PreferenceExample> read_jsonl(const std::filesystem::path& path) {
  std::vector<data::PreferenceExample> examples;
  std::istringstream lines(read_file(path));
  for (std::string line; std::getline(lines, line);) {
    auto record = nlohmann::json::parse(line);
    EXPECT_EQ(record.size(), 3u) << line;
    examples.push_back({record.at("prompt"), record.at("chosen"), record.at("rejected")});
  }
  return examples;
}

std::set<std::string> prompts_of(const std::vector<data::PreferenceExample>& examples) {
  std::set<std::string> prompts;
  for (const auto& example : examples) prompts.insert(example.prompt);
  return prompts;
}

TEST(DemoTask, SameSeedSameExamplesOtherSeedOthers) {
  data::DemoTaskOptions options;
  options.count = 500;
  auto first = data::generate_demo_examples(options);
  EXPECT_EQ(first, data::generate_demo_examples(options));
  EXPECT_EQ(first.size(), 500u);
  options.seed = 1235;
  EXPECT_NE(first, data::generate_demo_examples(options));
}

TEST(DemoTask, PinnedFirstRecordsAcrossStandardLibraries) {
  // mt19937_64 and our own integer helpers are fully specified, so these bytes never change.
  auto examples = data::generate_demo_examples({1234, 3, data::demo_task_kinds(), DemoPromptSet::kAll});
  EXPECT_EQ(data::demo_examples_to_jsonl(examples),
            "{\"prompt\":\"Human: What is 5 plus 7? Assistant:\",\"chosen\":\"12\",\"rejected\":\"7\"}\n"
            "{\"prompt\":\"Human: Repeat the word: door. Assistant:\",\"chosen\":\"door\",\"rejected\":\"cake\"}\n"
            "{\"prompt\":\"Human: What is 5 plus 5? Assistant:\",\"chosen\":\"10\",\"rejected\":\"Sorry, I cannot "
            "answer that.\"}\n");
}

TEST(DemoTask, EveryChosenScoresOneAndEveryRejectedZero) {
  for (uint64_t seed : {1ull, 1234ull, 987654321ull}) {
    auto examples = data::generate_demo_examples({seed, 5000, data::demo_task_kinds(), DemoPromptSet::kAll});
    std::map<std::string, int> per_kind;
    std::set<std::string> rejected_forms;
    for (const auto& example : examples) {
      ASSERT_EQ(demo_task_score(example.prompt, example.chosen), 1.0) << example.prompt << " / " << example.chosen;
      ASSERT_EQ(demo_task_score(example.prompt, example.rejected), 0.0) << example.prompt << " / " << example.rejected;
      // The loader's form " " + prompt and " " + answer + EOS score the same.
      ASSERT_EQ(demo_task_score(" " + example.prompt, " " + example.chosen + "</s>"), 1.0);
      ASSERT_EQ(demo_task_score(" " + example.prompt, " " + example.rejected + "<|endoftext|>"), 0.0);
      EXPECT_EQ(data::parse_demo_prompt(example.prompt).answer, example.chosen);
      EXPECT_NE(example.chosen, example.rejected);
      EXPECT_EQ(example.prompt.substr(example.prompt.size() - 10), "Assistant:");
      EXPECT_NE(example.chosen.front(), ' ');
      EXPECT_NE(example.rejected.front(), ' ');
      ++per_kind[data::parse_demo_prompt(example.prompt).kind];
      rejected_forms.insert(example.rejected);
    }
    for (const std::string& kind : data::demo_task_kinds()) EXPECT_GT(per_kind[kind], 1500) << kind;
    EXPECT_TRUE(rejected_forms.count("I don't know.")) << "wrong-format answers are part of the mix";
  }
}

TEST(DemoTask, SloppyDemonstrationsDoubleThatShareOfAnswersAndNothingElse) {
  auto examples = data::generate_demo_examples({1234, 4000, data::demo_task_kinds(), DemoPromptSet::kTrain});
  auto sloppy = data::sloppy_demonstrations(examples, 1234);
  ASSERT_EQ(sloppy.size(), examples.size());
  EXPECT_EQ(sloppy, data::sloppy_demonstrations(examples, 1234));
  EXPECT_NE(sloppy, data::sloppy_demonstrations(examples, 1235));
  size_t doubled = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    EXPECT_EQ(sloppy[i].prompt, examples[i].prompt);
    EXPECT_EQ(sloppy[i].rejected, examples[i].rejected);
    if (sloppy[i].chosen == examples[i].chosen) continue;
    ++doubled;
    EXPECT_EQ(sloppy[i].chosen, examples[i].chosen + " " + examples[i].chosen);
    EXPECT_EQ(demo_task_score(sloppy[i].prompt, sloppy[i].chosen), 0.0) << "a doubled answer is wrong";
  }
  EXPECT_NEAR(static_cast<double>(doubled) / static_cast<double>(examples.size()), 0.60, 0.03);
  EXPECT_EQ(data::sloppy_demonstrations(examples, 1, 0), examples);
  for (const auto& example : data::sloppy_demonstrations(examples, 1, 100)) {
    EXPECT_EQ(demo_task_score(example.prompt, example.chosen), 0.0);
  }
  EXPECT_THROW_WITH(data::sloppy_demonstrations(examples, 1, 101), core::InvalidArgument, "sloppy_percent 101");
  // The preference pairs rank the clean answer above the doubled one, so a reward model can learn
  // what PPO must remove: "7 7" is one of the rejected forms.
  std::set<std::string> rejected;
  for (const auto& example : examples) rejected.insert(example.rejected);
  EXPECT_TRUE(rejected.count("7 7"));
  EXPECT_TRUE(rejected.count("water water"));
}

TEST(DemoTask, KindsCanBeRestrictedAndAreValidated) {
  auto examples = data::generate_demo_examples({7, 300, {"bigger"}, DemoPromptSet::kAll});
  for (const auto& example : examples) EXPECT_EQ(data::parse_demo_prompt(example.prompt).kind, "bigger");
  EXPECT_THROW_WITH(data::generate_demo_examples({7, 1, {"mul"}, DemoPromptSet::kAll}), core::InvalidArgument,
                    "unknown kind 'mul'");
  EXPECT_THROW_WITH(data::generate_demo_examples({7, 1, {}, DemoPromptSet::kAll}), core::InvalidArgument, "no kinds");
  EXPECT_THROW_WITH(data::generate_demo_examples({7, 1, {"add", "add"}, DemoPromptSet::kAll}), core::InvalidArgument,
                    "listed twice");
}

TEST(DemoTask, ScorerAcceptsOnlyTheExactAnswer) {
  const std::string add = "Human: What is 3 plus 4? Assistant:";
  for (const char* right : {"7", " 7", "7 ", "\n7\t", "7.", " 7.\n", "7</s>", "7 </s></s></s>", "7<|endoftext|>",
                            "7.<|endoftext|>", "7</s> Human: more text", "7<pad><pad>"}) {
    EXPECT_EQ(demo_task_score(add, right), 1.0) << '"' << right << '"';
  }
  for (const char* wrong : {"", " ", ".", "</s>", "</s>7", "77", "07", "7.0", "+7", "8", "6", "-7", "seven", "7 .",
                            "7..", "7 7", "7 plus", "The answer is 7", "7!", "7?", "3 plus 4 is 7"}) {
    EXPECT_EQ(demo_task_score(add, wrong), 0.0) << '"' << wrong << '"';
  }
  EXPECT_EQ(demo_task_score("Human: What is 9 plus 9? Assistant:", "18"), 1.0);
  EXPECT_EQ(demo_task_score("Human: What is 9 plus 9? Assistant:", "1"), 0.0);
  EXPECT_EQ(demo_task_score("Human: What is 0 plus 0? Assistant:", "0"), 1.0);
  EXPECT_EQ(demo_task_score("Human: What is 0 plus 0? Assistant:", "00"), 0.0);
  const std::string bigger = "Human: Which is bigger, 4 or 9? Assistant:";
  EXPECT_EQ(demo_task_score(bigger, "9"), 1.0);
  EXPECT_EQ(demo_task_score(bigger, "4"), 0.0);
  EXPECT_EQ(demo_task_score(bigger, "99"), 0.0);
  EXPECT_EQ(demo_task_score(bigger, "4 or 9"), 0.0);
  EXPECT_EQ(demo_task_score("Human: Which is bigger, 0 or 1? Assistant:", "1"), 1.0);
  const std::string copy = "Human: Repeat the word: apple. Assistant:";
  EXPECT_EQ(demo_task_score(copy, "apple"), 1.0);
  EXPECT_EQ(demo_task_score(copy, " apple.</s>"), 1.0);
  for (const char* wrong : {"Apple", "APPLE", "apples", "appl", "apple apple", "house", "apple!", "\"apple\""}) {
    EXPECT_EQ(demo_task_score(copy, wrong), 0.0) << '"' << wrong << '"';
  }
  // Any lowercase word parses, not only the generator's 40.
  EXPECT_EQ(demo_task_score("Human: Repeat the word: banana. Assistant:", "banana"), 1.0);
}

TEST(DemoTask, ScorerTakesTheLoadersAndDecodersPromptForms) {
  EXPECT_EQ(demo_task_score(" Human: What is 3 plus 4? Assistant:", "7"), 1.0);
  EXPECT_EQ(demo_task_score("</s></s> Human: What is 3 plus 4? Assistant:", "7"), 1.0);
  EXPECT_EQ(demo_task_score("<pad><pad></s> Human: What is 3 plus 4? Assistant: ", "7"), 1.0);
  EXPECT_EQ(data::parse_demo_prompt(" Human: Which is bigger, 7 or 4? Assistant:").kind, "bigger");
  EXPECT_EQ(data::parse_demo_prompt("Human: Repeat the word: cat. Assistant:").answer, "cat");
}

TEST(DemoTask, NonDemoPromptsThrowNamingThePrompt) {
  for (const char* prompt :
       {"", "Hello", "Human: What is 3 plus 4?", "What is 3 plus 4? Assistant:",
        "Human: What is 3 plus 4? Assistant: 7", "Human: What is 13 plus 4? Assistant:",
        "Human: What is 3 plus x? Assistant:", "Human: What is 3 plus ? Assistant:",
        "Human: What is 3 minus 4? Assistant:", "Human: Which is bigger, 4 or 4? Assistant:",
        "Human: Which is bigger, 10 or 4? Assistant:", "Human: Repeat the word: Apple. Assistant:",
        "Human: Repeat the word: two words. Assistant:", "Human: Repeat the word: . Assistant:",
        "human: what is 3 plus 4? assistant:", "\n\nHuman: What is 3 plus 4?\n\nAssistant:"}) {
    EXPECT_THROW_WITH(demo_task_score(prompt, "7"), core::InvalidArgument,
                      std::string("not a demo task prompt: \"") + prompt + "\"");
  }
  const std::string long_prompt(1000, 'x');
  EXPECT_THROW_WITH(demo_task_score(long_prompt, "7"), core::InvalidArgument, std::string(200, 'x') + "...\"");
}

TEST(DemoTask, EvalPromptsAreHeldOutOfTrain) {
  for (uint64_t seed : {1ull, 1234ull}) {
    auto train = prompts_of(data::generate_demo_examples({seed, 5000, data::demo_task_kinds(), DemoPromptSet::kTrain}));
    auto eval = prompts_of(data::generate_demo_examples({seed, 2000, data::demo_task_kinds(), DemoPromptSet::kEval}));
    auto all = prompts_of(data::generate_demo_examples({seed, 20000, data::demo_task_kinds(), DemoPromptSet::kAll}));
    for (const std::string& prompt : eval) EXPECT_FALSE(train.count(prompt)) << prompt;
    // 40 words + 100 sums + 90 comparisons, a fifth of each held out.
    EXPECT_EQ(all.size(), 230u);
    EXPECT_EQ(eval.size(), 8u + 20u + 18u);
    EXPECT_EQ(train.size(), 230u - eval.size());
    // The split does not depend on which kinds are mixed.
    auto add_eval = prompts_of(data::generate_demo_examples({seed, 2000, {"add"}, DemoPromptSet::kEval}));
    for (const std::string& prompt : add_eval) EXPECT_TRUE(eval.count(prompt)) << prompt;
  }
}

TEST(DemoTask, WritesJsonLinesAtomicallyAndNamesBadPaths) {
  testing::TempDir tmp;
  data::write_demo_dataset(tmp / "a" / "b", 5, 40, 10);
  auto train = read_jsonl(tmp / "a" / "b" / "train.json");
  auto eval = read_jsonl(tmp / "a" / "b" / "eval.json");
  EXPECT_EQ(train, data::generate_demo_examples({5, 40, data::demo_task_kinds(), DemoPromptSet::kTrain}));
  EXPECT_EQ(eval, data::generate_demo_examples({5, 10, data::demo_task_kinds(), DemoPromptSet::kEval}));
  EXPECT_EQ(read_file(tmp / "a" / "b" / "train.json").rfind("{\"prompt\":", 0), 0u);
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(tmp / "a" / "b")) files += entry.is_regular_file();
  EXPECT_EQ(files, 2u) << "no temp files left behind";
  std::ofstream(tmp / "file") << "x";
  EXPECT_THROW_WITH(data::write_demo_dataset(tmp / "file" / "sub", 5, 1, 1), core::IoError,
                    (tmp / "file" / "sub").string());
}

TEST(DemoTask, CommittedDataIsWhatTheReadmeCommandWrites) {
  const auto demo_dir = testing::source_dir() / "data" / "demo";
  EXPECT_NE(read_file(demo_dir / "README.md").find("dschat make-demo-data --out data/demo " + kReadmeArgs),
            std::string::npos)
      << "data/demo/README.md must state the command that made the files";
  testing::TempDir tmp;
  std::string out;
  ASSERT_EQ(testing::run_command(std::string(DSCHAT_CLI_PATH) + " make-demo-data --out " + (tmp / "demo").string() +
                                     " " + kReadmeArgs,
                                 &out),
            0)
      << out;
  EXPECT_NE(out.find("wrote 2000 train and 200 eval records"), std::string::npos) << out;
  EXPECT_NE(out.find((tmp / "demo" / "sft" / "train.json").string()), std::string::npos) << "it says it wrote sft/: " << out;
  for (const char* name : {"train.json", "eval.json", "sft/train.json", "sft/eval.json"}) {
    EXPECT_TRUE(read_file(tmp / "demo" / name) == read_file(demo_dir / name))
        << "data/demo/" << name << " drifted from the generator; regenerate it with the README's command";
  }
  auto train = read_jsonl(demo_dir / "train.json");
  auto eval = read_jsonl(demo_dir / "eval.json");
  EXPECT_EQ(train.size(), 2000u);
  EXPECT_EQ(eval.size(), 200u);
  auto train_prompts = prompts_of(train);
  for (const auto& example : eval) EXPECT_FALSE(train_prompts.count(example.prompt)) << example.prompt;
}

TEST(DemoTask, CliRejectsBadArguments) {
  testing::TempDir tmp;
  std::string out;
  const std::string cli = std::string(DSCHAT_CLI_PATH) + " make-demo-data --out " + (tmp / "d").string();
  EXPECT_EQ(testing::run_command(cli + " --kinds add,mul", &out), 1) << out;
  EXPECT_NE(out.find("dschat: error: demo task: unknown kind 'mul'"), std::string::npos) << out;
  EXPECT_NE(testing::run_command(std::string(DSCHAT_CLI_PATH) + " make-demo-data --seed 3", &out), 0);
  ASSERT_EQ(testing::run_command(cli + " --seed 9 --train 5 --eval 3 --kinds copy", &out), 0) << out;
  for (const auto& example : read_jsonl(tmp / "d" / "train.json")) {
    EXPECT_EQ(data::parse_demo_prompt(example.prompt).kind, "copy");
  }
  EXPECT_EQ(read_jsonl(tmp / "d" / "eval.json").size(), 3u);
}

}  // namespace
}  // namespace dschat
