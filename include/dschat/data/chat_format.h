#pragma once
// The conversation format a model was trained in, recorded next to it so that `dschat chat` and
// `dschat serve` prompt it the same way. DeepSpeed-Chat's data sets differ in the spacing around
// "Human:" / "Assistant:" (" Human: q Assistant: a" for most, "\n\nHuman: q\n\nAssistant: a" for
// Anthropic HH, the demo's " Human: q? Assistant: a"), and a model answers nothing when prompted
// with another spacing than it learned (a lone space before its answer is a token it never saw).
//
//   auto format = infer_chat_format(tokenizer.decode(first_sft_sample));
//   if (format) write(dir / kChatFormatFile, format->dump(2));   // keys of a chat template file

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace dschat {
namespace data {

/// The file a trained model directory records its format in (serve::load_chat_template reads it).
constexpr const char* kChatFormatFile = "dschat_chat_template.json";

/// From one training sample's text (prompt and answer): the chat template that renders its last
/// "Human:" turn as the sample has it and ends in its "Assistant:" with the answer's separator
/// left to the model ({"system", "user", "assistant", "generation_prompt", "stop",
/// "trim_leading_space"}), or nullopt when the text has no "Human: ... Assistant:" turn.
std::optional<nlohmann::json> infer_chat_format(const std::string& sample_text);

}  // namespace data
}  // namespace dschat
