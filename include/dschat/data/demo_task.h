#pragma once
// The synthetic preference data of the embedded demo job (`dschat train` with no arguments): tiny
// question/answer tasks whose correct answer a program can check, so the demo can show that SFT
// learns the answer format, the reward model ranks held-out pairs, and PPO raises a ground-truth
// score. Prompts follow DeepSpeed-Chat's local/jsonfile convention: stored raw, ending in
// "Assistant:", answers without a leading space (the loader joins them as " " + prompt + " " + answer).
//
// Kinds (answers are one GPT-2 token after the loader's leading space):
//   copy    "Human: Repeat the word: apple. Assistant:"       -> "apple"  (40 lowercase nouns)
//   add     "Human: What is 3 plus 4? Assistant:"             -> "7"      (digits 0-9)
//   bigger  "Human: Which is bigger, 7 or 4? Assistant:"      -> "7"      (two different digits)
//
// Everything is a pure function of the seed: std::mt19937_64 (whose output the standard fixes)
// with our own uniform-integer and shuffle helpers, so the same seed writes the same bytes with
// any standard library.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace dschat {
namespace data {

/// One preference record of local/jsonfile: `chosen` is correct, `rejected` is wrong.
struct PreferenceExample {
  std::string prompt, chosen, rejected;
};

bool operator==(const PreferenceExample& a, const PreferenceExample& b);

/// Which prompts a generation draws from. Every kind's prompts are split by the seed into a train
/// part (~80%) and a held-out eval part (~20%) that share no prompt; kAll draws from both.
enum class DemoPromptSet { kAll, kTrain, kEval };

struct DemoTaskOptions {
  uint64_t seed = 1234;
  size_t count = 1000;
  std::vector<std::string> kinds = {"copy", "add", "bigger"};
  DemoPromptSet prompt_set = DemoPromptSet::kAll;
};

/// The task kinds in their canonical order: {"copy", "add", "bigger"}.
std::vector<std::string> demo_task_kinds();

/// `count` records, each of a kind drawn uniformly from `options.kinds`. About a quarter of the
/// rejected answers have the wrong format (a rambling sentence, "?", "..."); the rest have the
/// right format but the wrong value (another word, a near-miss number, the smaller number, any
/// other value of the kind, the answer written twice such as "7 7" for "7"). Throws core::InvalidArgument for an unknown or
/// repeated kind, or an empty kind list.
std::vector<PreferenceExample> generate_demo_examples(const DemoTaskOptions& options);

/// A demo prompt, parsed: its kind and its one correct answer.
struct DemoTaskPrompt {
  std::string kind;
  std::string answer;
};

/// Parses a demo prompt. Surrounding whitespace and leading "</s>", "<|endoftext|>" or "<pad>"
/// markers are ignored (the loader's " " + prompt and a decoded, left-padded OPT prompt both
/// parse); the rest must match a template exactly: copy takes a word of lowercase ASCII letters,
/// add and bigger single digits, bigger two different ones. Throws core::InvalidArgument naming
/// the prompt otherwise.
DemoTaskPrompt parse_demo_prompt(std::string_view prompt);

/// The ground truth: 1 when `answer` is exactly the correct answer of `prompt`, else 0; there is
/// no partial credit. The answer ends at the first "</s>", "<|endoftext|>" or "<pad>" (what a
/// decoder emits after it is padding), then surrounding whitespace and one period directly after
/// the answer are ignored: "7", " 7\n", "7.", "7</s></s>" and "7.<|endoftext|>junk" score 1;
/// "77", "07", "7 .", "seven", "Apple" (for "apple"), "7 7" and "" score 0. Throws
/// core::InvalidArgument (from parse_demo_prompt) when `prompt` is not a demo prompt.
double demo_task_score(std::string_view prompt, std::string_view answer);

/// The step-1 demonstrations made from `examples`: the same records, but in `sloppy_percent` of
/// them (drawn from the seed's own stream) `chosen` is the answer written twice ("7 7", "water
/// water"), as a careless demonstrator would write it. SFT imitates that habit, and with more
/// than half of the demonstrations doubled the habit wins the argmax: the SFT model's greedy
/// answers are doubled, hence wrong. The preference pairs rank the clean answer above the doubled
/// one, and the task's checker scores the doubled one 0, which is what PPO and GRPO act on.
std::vector<PreferenceExample> sloppy_demonstrations(std::vector<PreferenceExample> examples, uint64_t seed,
                                                     int64_t sloppy_percent = 60);

/// Writes <dir>/train.json (`train_count` records from the train prompts) and <dir>/eval.json
/// (`eval_count` from the held-out prompts) as JSON Lines, one {"prompt","chosen","rejected"}
/// object per line, each file atomically; creates `dir`. Train and eval come from different random
/// streams of the same seed. <dir>/sft/{train,eval}.json hold the same records as step-1
/// demonstrations (sloppy_demonstrations). Throws core::IoError naming the path, core::InvalidArgument for bad kinds.
void write_demo_dataset(const std::filesystem::path& dir, uint64_t seed, size_t train_count, size_t eval_count,
                        const std::vector<std::string>& kinds = demo_task_kinds());

/// The JSON Lines text write_demo_dataset writes for `examples` (keys in the order prompt, chosen,
/// rejected; every line ends in "\n").
std::string demo_examples_to_jsonl(const std::vector<PreferenceExample>& examples);

}  // namespace data
}  // namespace dschat
