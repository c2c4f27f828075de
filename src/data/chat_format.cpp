#include "dschat/data/chat_format.h"

namespace dschat {
namespace data {
namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

std::optional<nlohmann::json> infer_chat_format(const std::string& text) {
  const std::string human = "Human:", assistant = "Assistant:";
  const size_t answer_marker = text.rfind(assistant);
  if (answer_marker == std::string::npos || answer_marker == 0) return std::nullopt;
  const size_t question_marker = text.rfind(human, answer_marker - 1);
  if (question_marker == std::string::npos) return std::nullopt;
  // The turn's opening: the whitespace before "Human:" ("\n\n", " ", or none at the start).
  size_t open = question_marker;
  while (open > 0 && is_space(text[open - 1])) --open;
  size_t content = question_marker + human.size();
  if (content < text.size() && text[content] == ' ') ++content;  // "Human: q": the space is the format's
  // The question's closing: the whitespace between it and "Assistant:".
  size_t close = answer_marker;
  while (close > content && is_space(text[close - 1])) --close;
  const std::string opening = text.substr(open, content - open);          // " Human: "
  const std::string closing = text.substr(close, answer_marker - close);  // " " or "\n\n"
  // The answer's separator stays the model's to write: " 7" is one token, "Assistant: " + "7" two.
  const size_t answer = answer_marker + assistant.size();
  const bool spaced = answer < text.size() && text[answer] == ' ';
  const std::string turn_opening = opening.substr(0, opening.size() - (opening.back() == ' ' ? 1 : 0));  // " Human:"
  nlohmann::json stops = nlohmann::json::array({turn_opening});
  if (turn_opening != human) stops.push_back(human);
  return nlohmann::json{{"system", "{content}" + closing},
                        {"user", opening + "{content}" + closing},
                        {"assistant", assistant + (spaced ? " " : "") + "{content}"},
                        {"generation_prompt", assistant},
                        {"stop", stops},
                        {"trim_leading_space", spaced}};
}

}  // namespace data
}  // namespace dschat
