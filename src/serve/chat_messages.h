#pragma once
// A chat request's conversation and tools, read from its body: "messages" (system/developer,
// user, assistant, tool; text content or text parts; an assistant turn's tool_calls, a tool
// turn's tool_call_id), "tools" (OpenAI's function definitions) and "tool_choice". Every bad value
// becomes a 400 ApiError naming its key path ("messages[2].tool_calls[0].function.arguments").

#include <nlohmann/json.hpp>

#include "serve/openai_protocol.h"

namespace dschat {
namespace serve {

/// `body`: the request as parsed with its keys in the client's order (tools and call arguments
/// are rendered into the prompt as sent, as transformers renders the dicts it is given).
void read_chat_messages(const nlohmann::ordered_json& body, ApiRequest& request);

}  // namespace serve
}  // namespace dschat
