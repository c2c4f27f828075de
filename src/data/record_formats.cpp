#include "data/record_formats.h"

#include "dschat/core/error.h"

namespace dschat {
namespace data {
namespace {

using nlohmann::json;
using Text = std::optional<std::string>;

// The string in `key`: missing -> FormatError, null -> nullopt, non-string -> FormatError.
Text text(const json& row, const std::string& key) {
  auto it = row.find(key);
  DSCHAT_CHECK(it != row.end(), FormatError, "field '", key, "' is missing");
  if (it->is_null()) return std::nullopt;
  DSCHAT_CHECK(it->is_string(), FormatError, "field '", key, "' is ", it->type_name(), ", expected a string");
  return it->get<std::string>();
}

double number(const json& row, const std::string& key) {
  auto it = row.find(key);
  DSCHAT_CHECK(it != row.end(), FormatError, "field '", key, "' is missing");
  if (it->is_number()) return it->get<double>();
  if (it->is_boolean()) return it->get<bool>() ? 1.0 : 0.0;
  if (it->is_string()) {  // Python's float()/int() accept numeric strings
    try {
      size_t used = 0;
      double value = std::stod(it->get<std::string>(), &used);
      if (used == it->get<std::string>().size()) return value;
    } catch (const std::exception&) {
    }
  }
  DSCHAT_THROW(FormatError, "field '", key, "' is ", it->dump(), ", expected a number");
}

Text concat(const Text& a, const std::string& middle, const Text& b) {
  if (!a || !b) return std::nullopt;
  return *a + middle + *b;
}
Text prefixed(const std::string& prefix, const Text& a, const std::string& suffix = "") {
  if (!a) return std::nullopt;
  return prefix + *a + suffix;
}

// " Human: " + p + " Assistant:" with " " + answer: DeepSpeed-Chat's standard form.
PromptRecord standard_form(const Text& prompt, const Text& chosen, const Text& rejected) {
  PromptRecord r;
  r.prompt = prefixed(" Human: ", prompt, " Assistant:");
  r.chosen = prefixed(" ", chosen);
  r.rejected = prefixed(" ", rejected);
  r.prompt_and_chosen = concat(r.prompt, " ", chosen);
  r.prompt_and_rejected = concat(r.prompt, " ", rejected);
  return r;
}

// Prompt already in "\n\nHuman: ...\n\nAssistant:" form; answers appended as they are.
PromptRecord raw_form(const Text& prompt, const Text& chosen, const Text& rejected) {
  PromptRecord r;
  r.prompt = prompt;
  r.chosen = chosen;
  r.rejected = rejected;
  r.prompt_and_chosen = concat(prompt, "", chosen);
  r.prompt_and_rejected = concat(prompt, "", rejected);
  return r;
}

PromptRecord hh_format(const json& row) { return raw_form(text(row, "prompt"), text(row, "chosen"), text(row, "rejected")); }

PromptRecord synthetic_instruct_format(const json& row) {
  return standard_form(text(row, "prompt"), text(row, "chosen"), text(row, "rejected"));
}

// Python's s.split("Assistant:")[-1].
Text after_last_assistant(const Text& s) {
  if (!s) return std::nullopt;
  static const std::string kMarker = "Assistant:";
  size_t at = s->rfind(kMarker);
  return at == std::string::npos ? *s : s->substr(at + kMarker.size());
}

PromptRecord yitingxie_format(const json& row) {
  Text prompt = text(row, "prompt"), chosen = text(row, "chosen"), rejected = text(row, "rejected");
  PromptRecord r;
  r.prompt = prefixed("", prompt, "Assistant:");
  r.chosen = after_last_assistant(chosen);
  r.rejected = after_last_assistant(rejected);
  r.prompt_and_chosen = concat(prompt, "", chosen);
  r.prompt_and_rejected = concat(prompt, "", rejected);
  return r;
}

PromptRecord webgpt_format(const json& row) {
  auto question = row.find("question");
  DSCHAT_CHECK(question != row.end(), FormatError, "field 'question' is missing");
  DSCHAT_CHECK(question->is_object(), FormatError, "field 'question' is ", question->type_name(),
               ", expected an object with 'full_text'");
  Text full_text = text(*question, "full_text");
  // Ties go to answer_0, as in DeepSpeed-Chat (>= for chosen, < for rejected).
  const bool first_wins = number(row, "score_0") >= number(row, "score_1");
  Text answer_0 = text(row, "answer_0"), answer_1 = text(row, "answer_1");
  Text chosen = first_wins ? answer_0 : answer_1, rejected = first_wins ? answer_1 : answer_0;
  if (chosen) chosen = remove_citations(*chosen);
  if (rejected) rejected = remove_citations(*rejected);
  return standard_form(full_text, chosen, rejected);
}

PromptRecord shp_format(const json& row) {
  // Python's int(): truncates; labels is 0/1 in the dataset.
  const bool a_preferred = static_cast<int64_t>(number(row, "labels")) == 1;
  Text a = text(row, "human_ref_A"), b = text(row, "human_ref_B");
  return standard_form(text(row, "history"), a_preferred ? a : b, a_preferred ? b : a);
}

Text non_empty(const Text& s) { return s && !s->empty() ? s : std::nullopt; }

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

PromptRecord sharegpt_format(const json& row) {
  Text prompt = non_empty(text(row, "prompt")), label = non_empty(text(row, "label"));
  if (prompt) prompt = replace_all(replace_all(*prompt, "USER", "Human"), "ASSISTANT", "Assistant");
  PromptRecord r;
  r.prompt = prompt;
  r.chosen = prefixed(" ", label);
  r.prompt_and_chosen = concat(prompt, " ", label);
  return r;  // this dataset has no rejected answers
}

PromptRecord jsonfile_format(const json& row) {
  Text prompt = text(row, "prompt"), chosen = text(row, "chosen");
  // DeepSpeed-Chat reads a missing 'rejected' as None through the datasets json loader.
  Text rejected = row.contains("rejected") ? text(row, "rejected") : std::nullopt;
  PromptRecord r;
  r.prompt = prefixed(" ", prompt);
  r.chosen = prefixed(" ", chosen);
  r.rejected = prefixed(" ", rejected);
  r.prompt_and_chosen = concat(r.prompt, " ", chosen);
  r.prompt_and_rejected = concat(r.prompt, " ", rejected);
  return r;
}

// One regex pass of remove_citations: `lead` is the optional leading space of the pattern.
std::string remove_bracketed(const std::string& s, bool with_leading_space) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t open = with_leading_space ? i + 1 : i;
    if ((!with_leading_space || s[i] == ' ') && open < s.size() && (s[open] == '(' || s[open] == '[')) {
      // '.' does not match a newline: the closer must come before the next '\n'.
      size_t close = s.find_first_of(")]\n", open + 1);
      if (close != std::string::npos && s[close] != '\n') {
        i = close + 1;
        continue;
      }
    }
    out.push_back(s[i++]);
  }
  return out;
}

}  // namespace

std::string remove_citations(const std::string& text) {
  return remove_bracketed(remove_bracketed(text, true), false);
}

const std::vector<NamedFormat>& named_formats() {
  // The order is DeepSpeed-Chat's get_raw_dataset order: a path matching two names takes the first.
  static const std::vector<NamedFormat> formats = {
      {"Dahoas/rm-static", "Dahoas_rm_static", "train", "test", hh_format},
      {"Dahoas/full-hh-rlhf", "Dahoas_full_hh_rlhf", "train", "test", hh_format},
      {"Dahoas/synthetic-instruct-gptj-pairwise", "Dahoas_synthetic_instruct_gptj_pairwise", "train", "",
       synthetic_instruct_format},
      {"yitingxie/rlhf-reward-datasets", "yitingxie_rlhf_reward_datasets", "train", "test", yitingxie_format},
      {"openai/webgpt_comparisons", "openai_webgpt_comparisons", "train", "", webgpt_format},
      {"stanfordnlp/SHP", "stanfordnlp_SHP", "train", "validation", shp_format},
      {"pvduy/sharegpt_alpaca_oa_vicuna_format", "pvduy_sharegpt_alpaca_oa_vicuna_format", "train", "test",
       sharegpt_format},
      {"wangrui6/Zhihu-KOL", "wangrui6_Zhihu_KOL", "train", "", nullptr},
      {"Cohere/miracl-zh-queries-22-12", "Cohere_miracl_zh_queries_22_12", "train", "dev", nullptr},
      {"Hello-SimpleAI/HC3-Chinese", "Hello_SimpleAI_HC3_Chinese", "train", "", nullptr},
      {"mkqa-Chinese", "mkqa", "train", "", nullptr},
      {"mkqa-Japanese", "mkqa", "train", "", nullptr},
      {"Cohere/miracl-ja-queries-22-12", "Cohere_miracl_ja_queries_22_12", "train", "dev", nullptr},
      {"lmqg/qg_jaquad", "lmqg_qg_jaquad", "train", "validation", nullptr},
      {"lmqg/qag_jaquad", "lmqg_qag_jaquad", "train", "validation", nullptr},
      {"local/jsonfile", "jsonfile", "train", "eval", jsonfile_format},
  };
  return formats;
}

const NamedFormat* match_named_format(const std::string& data_path) {
  for (const auto& format : named_formats()) {
    if (data_path.find(format.name) != std::string::npos) return &format;
  }
  return nullptr;
}

RecordFormatter generic_formatter(const GenericSchema& schema) {
  DSCHAT_CHECK(schema.format == "human_assistant" || schema.format == "raw", ConfigError,
               "dataset schema: format '", schema.format, "' is not one of human_assistant, raw");
  return [schema](const json& row) {
    Text prompt = text(row, schema.prompt_field), chosen = text(row, schema.chosen_field);
    Text rejected = schema.rejected_field.empty() ? std::nullopt : text(row, schema.rejected_field);
    return schema.format == "raw" ? raw_form(prompt, chosen, rejected) : standard_form(prompt, chosen, rejected);
  };
}

}  // namespace data
}  // namespace dschat
