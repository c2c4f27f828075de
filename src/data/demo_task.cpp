#include "dschat/data/demo_task.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <random>
#include <system_error>

#include "dschat/core/error.h"
#include "io/atomic_file.h"

namespace dschat {
namespace data {
namespace {

// Lowercase nouns that GPT-2's BPE encodes as one token after a space (" apple" -> 17180), so
// every copy answer is a single token the tiny demo model can emit.
constexpr std::array<const char*, 40> kWords = {
    "apple", "house", "water", "river", "music", "paper", "stone", "bread", "chair", "table",
    "horse", "cloud", "money", "window", "garden", "school", "bird", "fish", "tree", "book",
    "door", "road", "ship", "star", "moon", "rain", "snow", "fire", "milk", "cake",
    "ring", "coin", "king", "dog", "cat", "boat", "hat", "box", "lamp", "bell"};

// Wrong-format answers: none of them normalises to a word or a number.
constexpr std::array<const char*, 6> kRambles = {"I don't know.",          "Let me think about that.",
                                                 "That is a good question.", "Sorry, I cannot answer that.",
                                                 "?",                        "..."};

// Markers a decoded sequence may carry: OPT's BOS/EOS/pad and GPT-2's end of text.
constexpr std::array<std::string_view, 3> kSpecialMarkers = {"</s>", "<|endoftext|>", "<pad>"};

enum Kind : int { kCopy = 0, kAdd = 1, kBigger = 2 };
constexpr std::array<const char*, 3> kKindNames = {"copy", "add", "bigger"};

// One prompt: its kind and its operands (copy: a = index into kWords).
struct Item {
  Kind kind;
  int a = 0, b = 0;
};

// Salts of the independent random streams derived from one seed.
constexpr uint64_t kPartitionSalt = 0x7061727469746f6eull;  // which prompts are held out
constexpr uint64_t kSampleSalts[3] = {0x616c6c0000000000ull, 0x747261696e000000ull, 0x6576616c00000000ull};
constexpr uint64_t kSloppySalt = 0x736c6f7070790000ull;  // "sloppy": the demonstrations' own stream

// SplitMix64's finaliser: decorrelates seeds that differ in few bits.
uint64_t mix_seed(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform integer in [0, n) by rejection, defined here because std::uniform_int_distribution's
// output differs between standard libraries.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  DSCHAT_INTERNAL_ASSERT(n > 0, "uniform_below(0)");
  const uint64_t reject_below = (0 - n) % n;  // 2^64 mod n: keeps the accepted range a multiple of n
  uint64_t value;
  do {
    value = rng();
  } while (value < reject_below);
  return value % n;
}

template <typename T>
void fisher_yates_shuffle(std::vector<T>& values, std::mt19937_64& rng) {
  for (size_t i = values.size(); i > 1; --i) std::swap(values[i - 1], values[uniform_below(rng, i)]);
}

std::vector<Item> all_items(Kind kind) {
  std::vector<Item> items;
  if (kind == kCopy) {
    for (int w = 0; w < static_cast<int>(kWords.size()); ++w) items.push_back({kind, w, 0});
    return items;
  }
  for (int a = 0; a <= 9; ++a) {
    for (int b = 0; b <= 9; ++b) {
      if (kind == kAdd || a != b) items.push_back({kind, a, b});
    }
  }
  return items;
}

// The prompts of `kind` in `set`: a seeded shuffle of all of them, the first fifth held out for
// eval. It depends only on the seed and the kind, so the split is the same whichever kinds are mixed.
std::vector<Item> items_of(Kind kind, DemoPromptSet set, uint64_t seed) {
  std::vector<Item> items = all_items(kind);
  if (set == DemoPromptSet::kAll) return items;
  std::mt19937_64 rng(mix_seed(seed ^ kPartitionSalt) + static_cast<uint64_t>(kind));
  fisher_yates_shuffle(items, rng);
  const size_t held_out = (items.size() + 4) / 5;
  if (set == DemoPromptSet::kEval) return {items.begin(), items.begin() + held_out};
  return {items.begin() + held_out, items.end()};
}

std::string prompt_text(const Item& item) {
  const std::string a = std::to_string(item.a), b = std::to_string(item.b);
  switch (item.kind) {
    case kCopy: return std::string("Human: Repeat the word: ") + kWords[item.a] + ". Assistant:";
    case kAdd: return "Human: What is " + a + " plus " + b + "? Assistant:";
    case kBigger: return "Human: Which is bigger, " + a + " or " + b + "? Assistant:";
  }
  DSCHAT_INTERNAL_ASSERT(false, "unknown demo kind ", static_cast<int>(item.kind));
  return {};
}

std::string answer_text(const Item& item) {
  switch (item.kind) {
    case kCopy: return kWords[item.a];
    case kAdd: return std::to_string(item.a + item.b);
    case kBigger: return std::to_string(std::max(item.a, item.b));
  }
  DSCHAT_INTERNAL_ASSERT(false, "unknown demo kind ", static_cast<int>(item.kind));
  return {};
}

// A right-format, wrong-value answer: the mistakes a weak model plausibly makes (near misses, an
// operand, a doubled answer) and, two times in five, any other value of the right kind. Without
// those the reward model only learns "the answer beats the usual mistakes" and rewards a value
// that is often right elsewhere (a 9 for every "bigger" prompt), which PPO then exploits.
std::string wrong_value(const Item& item, std::mt19937_64& rng) {
  const std::string answer = answer_text(item);
  const uint64_t pick = uniform_below(rng, 5);
  if (item.kind == kCopy) {
    if (pick == 0) return answer + " " + answer;
    const uint64_t other = (item.a + 1 + uniform_below(rng, kWords.size() - 1)) % kWords.size();
    return kWords[other];
  }
  if (pick == 0) return answer + " " + answer;  // "7 7": the answer twice
  const int right = item.kind == kBigger ? std::max(item.a, item.b) : item.a + item.b;
  if (pick >= 3) {
    const int values = item.kind == kBigger ? 10 : 19;  // digits, or sums of two digits
    return std::to_string((right + 1 + static_cast<int>(uniform_below(rng, values - 1))) % values);
  }
  if (item.kind == kBigger) {
    if (pick == 1) return std::to_string(item.a) + " or " + std::to_string(item.b);
    return std::to_string(std::min(item.a, item.b));
  }
  std::vector<int> near_misses;
  for (int candidate : {right - 2, right - 1, right + 1, right + 2, item.a, item.b}) {
    if (candidate >= 0 && candidate != right) near_misses.push_back(candidate);
  }
  return std::to_string(near_misses[uniform_below(rng, near_misses.size())]);
}

std::string wrong_answer(const Item& item, std::mt19937_64& rng) {
  if (uniform_below(rng, 4) == 0) return kRambles[uniform_below(rng, kRambles.size())];
  return wrong_value(item, rng);
}

std::vector<Kind> parse_kinds(const std::vector<std::string>& names) {
  DSCHAT_CHECK(!names.empty(), InvalidArgument, "demo task: no kinds given; expected some of copy, add, bigger");
  std::vector<Kind> kinds;
  for (const std::string& name : names) {
    auto found = std::find(kKindNames.begin(), kKindNames.end(), name);
    DSCHAT_CHECK(found != kKindNames.end(), InvalidArgument, "demo task: unknown kind '", name,
                 "'; expected copy, add or bigger");
    auto kind = static_cast<Kind>(found - kKindNames.begin());
    DSCHAT_CHECK(std::find(kinds.begin(), kinds.end(), kind) == kinds.end(), InvalidArgument,
                 "demo task: kind '", name, "' is listed twice");
    kinds.push_back(kind);
  }
  return kinds;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view text) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

// Drops leading special markers (left padding and BOS of a decoded prompt) and whitespace.
std::string_view strip_leading_markers(std::string_view text) {
  for (bool stripped = true; stripped;) {
    text = trim(text);
    stripped = false;
    for (std::string_view marker : kSpecialMarkers) {
      if (text.substr(0, marker.size()) == marker) {
        text.remove_prefix(marker.size());
        stripped = true;
      }
    }
  }
  return text;
}

// Matches `text` against literals[0] slot literals[1] slot ... literals[n]; each slot is non-empty
// and ends where the next literal first appears (slots are letters or digits, which no literal
// starts with, so the first occurrence is the only candidate).
bool match_template(std::string_view text, const std::vector<std::string_view>& literals,
                    std::vector<std::string_view>& slots) {
  slots.clear();
  if (text.substr(0, literals[0].size()) != literals[0]) return false;
  size_t position = literals[0].size();
  for (size_t i = 1; i < literals.size(); ++i) {
    size_t next = text.find(literals[i], position + 1);
    if (next == std::string_view::npos) return false;
    slots.push_back(text.substr(position, next - position));
    position = next + literals[i].size();
  }
  return position == text.size();
}

bool is_digit_slot(std::string_view slot) { return slot.size() == 1 && slot[0] >= '0' && slot[0] <= '9'; }

bool is_word_slot(std::string_view slot) {
  return !slot.empty() && std::all_of(slot.begin(), slot.end(), [](char c) { return c >= 'a' && c <= 'z'; });
}

std::string_view answer_before_end_marker(std::string_view answer) {
  for (std::string_view marker : kSpecialMarkers) answer = answer.substr(0, answer.find(marker));
  return answer;
}

}  // namespace

bool operator==(const PreferenceExample& a, const PreferenceExample& b) {
  return a.prompt == b.prompt && a.chosen == b.chosen && a.rejected == b.rejected;
}

std::vector<std::string> demo_task_kinds() { return {kKindNames.begin(), kKindNames.end()}; }

std::vector<PreferenceExample> generate_demo_examples(const DemoTaskOptions& options) {
  const std::vector<Kind> kinds = parse_kinds(options.kinds);
  std::vector<std::vector<Item>> pools;
  for (Kind kind : kinds) pools.push_back(items_of(kind, options.prompt_set, options.seed));
  std::mt19937_64 rng(mix_seed(options.seed ^ kSampleSalts[static_cast<int>(options.prompt_set)]));
  std::vector<PreferenceExample> examples;
  examples.reserve(options.count);
  for (size_t i = 0; i < options.count; ++i) {
    const std::vector<Item>& pool = pools[uniform_below(rng, pools.size())];
    const Item& item = pool[uniform_below(rng, pool.size())];
    examples.push_back({prompt_text(item), answer_text(item), wrong_answer(item, rng)});
  }
  return examples;
}

DemoTaskPrompt parse_demo_prompt(std::string_view prompt) {
  const std::string_view text = strip_leading_markers(prompt);
  std::vector<std::string_view> slots;
  if (match_template(text, {"Human: Repeat the word: ", ". Assistant:"}, slots) && is_word_slot(slots[0])) {
    return {"copy", std::string(slots[0])};
  }
  if (match_template(text, {"Human: What is ", " plus ", "? Assistant:"}, slots) && is_digit_slot(slots[0]) &&
      is_digit_slot(slots[1])) {
    return {"add", std::to_string((slots[0][0] - '0') + (slots[1][0] - '0'))};
  }
  if (match_template(text, {"Human: Which is bigger, ", " or ", "? Assistant:"}, slots) && is_digit_slot(slots[0]) &&
      is_digit_slot(slots[1]) && slots[0] != slots[1]) {
    return {"bigger", std::string(std::max(slots[0], slots[1]))};
  }
  constexpr size_t kShownChars = 200;
  DSCHAT_THROW(InvalidArgument, "not a demo task prompt: \"", prompt.substr(0, kShownChars),
               prompt.size() > kShownChars ? "...\"" : "\"",
               " (expected e.g. \"Human: What is 3 plus 4? Assistant:\"; see data/demo/README.md)");
}

double demo_task_score(std::string_view prompt, std::string_view answer) {
  const DemoTaskPrompt task = parse_demo_prompt(prompt);
  std::string_view given = trim(answer_before_end_marker(answer));
  if (!given.empty() && given.back() == '.') given.remove_suffix(1);
  return given == task.answer ? 1.0 : 0.0;
}

std::vector<PreferenceExample> sloppy_demonstrations(std::vector<PreferenceExample> examples, uint64_t seed,
                                                     int64_t sloppy_percent) {
  DSCHAT_CHECK(sloppy_percent >= 0 && sloppy_percent <= 100, InvalidArgument, "demo task: sloppy_percent ",
               sloppy_percent, " is not in [0, 100]");
  std::mt19937_64 rng(mix_seed(seed ^ kSloppySalt));
  for (PreferenceExample& example : examples) {
    if (static_cast<int64_t>(uniform_below(rng, 100)) < sloppy_percent) {
      example.chosen = example.chosen + " " + example.chosen;
    }
  }
  return examples;
}

std::string demo_examples_to_jsonl(const std::vector<PreferenceExample>& examples) {
  std::string text;
  for (const PreferenceExample& example : examples) {
    nlohmann::ordered_json line = nlohmann::ordered_json::object();
    line["prompt"] = example.prompt;
    line["chosen"] = example.chosen;
    line["rejected"] = example.rejected;
    text += line.dump() + "\n";
  }
  return text;
}

void write_demo_dataset(const std::filesystem::path& dir, uint64_t seed, size_t train_count, size_t eval_count,
                        const std::vector<std::string>& kinds) {
  const auto train = generate_demo_examples({seed, train_count, kinds, DemoPromptSet::kTrain});
  const auto eval = generate_demo_examples({seed, eval_count, kinds, DemoPromptSet::kEval});
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  DSCHAT_CHECK(!error, IoError, dir.string(), ": cannot create the directory: ", error.message());
  io::write_file_atomically(dir / "train.json", demo_examples_to_jsonl(train));
  io::write_file_atomically(dir / "eval.json", demo_examples_to_jsonl(eval));
  std::filesystem::create_directories(dir / "sft", error);
  DSCHAT_CHECK(!error, IoError, (dir / "sft").string(), ": cannot create the directory: ", error.message());
  io::write_file_atomically(dir / "sft" / "train.json", demo_examples_to_jsonl(sloppy_demonstrations(train, seed)));
  io::write_file_atomically(dir / "sft" / "eval.json",
                            demo_examples_to_jsonl(sloppy_demonstrations(eval, seed + 1)));
}

}  // namespace data
}  // namespace dschat
