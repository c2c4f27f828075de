// Tool calling in `dschat serve`: Hermes-style <tool_call> blocks read from a reply as vLLM's
// "hermes" parser reads them (whole and streamed, split anywhere), forced calls (tool_choice
// "required" or named) read from a schema-shaped reply, and a chat request's tools, tool_choice,
// response_format, assistant tool_calls and tool messages read and checked, each error naming its key.
#include <gtest/gtest.h>

#include <random>

#include "dschat/core/error.h"
#include "serve/json_machine.h"
#include "serve/openai_protocol.h"
#include "serve/tool_call_parser.h"
#include "test_util.h"

namespace dschat {
namespace serve {
namespace {

using Json = nlohmann::ordered_json;

const std::string kTwoCalls =
    "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n"
    "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

void expect_call(const Json& call, const std::string& name, const std::string& arguments) {
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], name);
  EXPECT_EQ(call["function"]["arguments"], arguments);
  const std::string id = call["id"].get<std::string>();
  EXPECT_EQ(id.rfind("call_", 0), 0u) << id;
  EXPECT_EQ(id.size(), 29u) << id;
}

TEST(HermesToolCalls, ContentBeforeTheFirstBlockAndEachBlockACall) {
  const ParsedReply reply = parse_hermes_tool_calls(kTwoCalls);
  EXPECT_EQ(reply.content, "Let me check.\n");
  ASSERT_EQ(reply.tool_calls.size(), 2u);
  expect_call(reply.tool_calls[0], "get_weather", R"({"city":"Paris","days":2})");  // the model's key order
  expect_call(reply.tool_calls[1], "get_time", "{}");
  EXPECT_NE(reply.tool_calls[0]["id"], reply.tool_calls[1]["id"]);

  const ParsedReply only =
      parse_hermes_tool_calls("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1]}}\n</tool_call>");
  EXPECT_TRUE(only.content.is_null());  // no text before the call
  ASSERT_EQ(only.tool_calls.size(), 1u);
  expect_call(only.tool_calls[0], "f", R"({"x":[1]})");
  // A last block cut off by max_tokens after its JSON ended still counts; arguments given as text stay text.
  const ParsedReply unclosed =
      parse_hermes_tool_calls("<tool_call>{\"name\": \"g\", \"arguments\": \"{\\\"a\\\": 1}\"}");
  ASSERT_EQ(unclosed.tool_calls.size(), 1u);
  expect_call(unclosed.tool_calls[0], "g", "{\"a\": 1}");
}

TEST(HermesToolCalls, BlocksThatAreNotCallsLeaveAllTheTextAsContent) {
  for (const std::string text : {std::string("plain answer"), std::string("a <tool_call> {not json} </tool_call>"),
                                 std::string("<tool_call>{\"arguments\": {}}</tool_call>"),  // no name
                                 std::string("<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": 3}"),
                                 std::string("<tool_call>{\"name\": \"f\", \"arguments\": {\"cut\": ")}) {
    const ParsedReply reply = parse_hermes_tool_calls(text);
    EXPECT_TRUE(reply.tool_calls.empty()) << text;
    EXPECT_EQ(reply.content, text);
  }
}

// Streamed in pieces of every size, the content sent plus finish()'s equals the whole reply's
// content, and the calls are the same; no piece of the tag or the calls' JSON goes out as content.
void expect_any_split_gives_the_whole_reply(const std::vector<std::string>& replies, const ToolCallMode& mode,
                                            const std::string& tag) {
  std::mt19937 random(3);
  for (const std::string& text : replies) {
    const ParsedReply whole = parse_tool_calls(text, mode);
    const std::string want_content = whole.content.is_null() ? "" : whole.content.get<std::string>();
    for (int trial = 0; trial < 40; ++trial) {
      ToolCallStream stream(mode);
      std::string sent;
      for (size_t at = 0; at < text.size();) {
        const size_t piece = trial == 0 ? 1 : 1 + random() % 7;  // trial 0: character by character
        const std::string out = stream.push(text.substr(at, piece));
        sent += out;
        at += piece;
        if (!whole.tool_calls.empty()) {
          EXPECT_EQ(sent.find(tag.substr(0, tag.size() - 1)), std::string::npos) << text;  // the tag never leaks
        }
      }
      const ParsedReply last = stream.finish();
      if (last.content.is_string()) sent += last.content.get<std::string>();
      EXPECT_EQ(sent, want_content) << text << " (trial " << trial << ")";
      ASSERT_EQ(last.tool_calls.size(), whole.tool_calls.size()) << text;
      for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
        EXPECT_EQ(last.tool_calls[i]["function"], whole.tool_calls[i]["function"]);
      }
    }
  }
}

TEST(HermesToolCalls, StreamedInAnySplitGivesTheWholeReplysContentAndCalls) {
  expect_any_split_gives_the_whole_reply({kTwoCalls, "no calls, but <tool and <tool_ca and a trailing <tool_c",
                                          "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
                                          "text <tool_call> not json", "x<tool_call>"},
                                         ToolCallMode{}, "<tool_call>");
}

void expect_mistral_call(const Json& call, const std::string& name, const std::string& arguments) {
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], name);
  EXPECT_EQ(call["function"]["arguments"], arguments);
  const std::string id = call["id"].get<std::string>();  // Mistral's template takes 9 letters and digits
  EXPECT_EQ(id.size(), 9u) << id;
  EXPECT_EQ(id.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"), std::string::npos);
}

TEST(MistralToolCalls, ContentBeforeTheTagAndEachListItemACall) {
  ParsedReply reply = parse_mistral_tool_calls(
      R"(Checking.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time"}])");
  EXPECT_EQ(reply.content, "Checking.");
  ASSERT_EQ(reply.tool_calls.size(), 2u);
  expect_mistral_call(reply.tool_calls[0], "get_weather", R"({"city":"Paris"})");
  expect_mistral_call(reply.tool_calls[1], "get_time", "{}");
  reply = parse_mistral_tool_calls(R"([TOOL_CALLS]{"name": "f", "arguments": {"x": 1}})");  // one object
  EXPECT_TRUE(reply.content.is_null());
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  expect_mistral_call(reply.tool_calls[0], "f", R"({"x":1})");
  for (const std::string text : {std::string("plain"), std::string(R"([TOOL_CALLS] [{"name": "f", "argu)"),
                                 std::string("[TOOL_CALLS] []"), std::string(R"([TOOL_CALLS] [{"arguments": {}}])")}) {
    reply = parse_mistral_tool_calls(text);
    EXPECT_TRUE(reply.tool_calls.empty()) << text;
    EXPECT_EQ(reply.content, text);
  }
  expect_any_split_gives_the_whole_reply(
      {R"(Checking.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}])",
       "no calls, but [TOOL and [TOOL_CAL and a trailing [TOOL_CALLS", R"([TOOL_CALLS] [{"name": "f"}])"},
      ToolCallMode{ToolCallMode::Kind::kMistral, ""}, "[TOOL_CALLS]");
}

ApiRequest chat(const std::string& extra) {
  return parse_api_request(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}])" + extra + "}",
                           Endpoint::kChat, 16);
}

TEST(ChatToolRequest, ToolsCallsAndResultsAreReadForTheTemplate) {
  const std::string tools =
      R"(, "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";
  const ApiRequest request = parse_api_request(
      R"({"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"},
          {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"C\"}"}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}])" + tools + "}",
      Endpoint::kChat, 16);
  ASSERT_EQ(request.messages.size(), 3u);
  const ChatMessage& call = request.messages[1];
  EXPECT_TRUE(call.content_null);
  // The arguments reach the template as an object in the client's key order (vLLM's json.loads).
  EXPECT_EQ(call.tool_calls.dump(), R"([{"id":"call_1","type":"function","function":{"name":"get_weather",)"
                                    R"("arguments":{"city":"Paris","unit":"C"}}}])");
  EXPECT_EQ(request.messages[2].role, "tool");
  EXPECT_EQ(request.messages[2].tool_call_id, "call_1");
  ASSERT_TRUE(request.tools.is_array());
  // As sent, keys in the client's order (transformers renders the dicts it is given).
  EXPECT_EQ(request.tools[0]["function"]["parameters"].dump(),
            R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})");
  EXPECT_TRUE(chat(tools + R"(, "tool_choice": "none")").tools.is_null()) << "none: the tools are not offered";
  EXPECT_TRUE(chat(tools + R"(, "tool_choice": "auto")").tools.is_array());
  EXPECT_TRUE(chat("").tools.is_null());
}

TEST(ChatToolRequest, BadToolsAndTurnsNameTheirKey) {
  const std::vector<std::pair<std::string, std::string>> bad = {  // extra body, the param named
      {R"(, "tools": {"name": "f"})", "tools"},
      {R"(, "tools": [{"type": "retrieval"}])", "tools[0]"},
      {R"(, "tools": [{"type": "function", "function": {"name": "bad name"}}])", "tools[0].function.name"},
      {R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}])",
       "tools[0].function.parameters"},
      {R"(, "tool_choice": "required")", "tool_choice"},  // no tools to force
      {R"(, "tool_choice": {"type": "function", "function": {"name": "f"}})", "tool_choice"},
      {R"(, "tool_choice": "any")", "tool_choice"},
      {R"(, "tools": [{"type": "function", "function": {"name": "g"}}], "tool_choice": {"type": "function",
           "function": {"name": "f"}})", "tool_choice.function.name"},
      {R"(, "tools": [{"type": "function", "function": {"name": "g", "parameters": {"type": "object",
           "properties": {"host": {"type": "string", "format": "hostname"}}}}}], "tool_choice": "required")",
       "tools[0].function.parameters.properties.host.format"},
      {R"(, "tools": [{"type": "function", "function": {"name": "g"}}], "tool_choice": "required",
           "response_format": {"type": "json_object"})", "tool_choice"},
      {R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "w"}})",
       "response_format.json_schema.schema"},
      {R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object",
           "properties": {"n": {"type": "array", "uniqueItems": true}}}}})",
       "response_format.json_schema.schema.properties.n.uniqueItems"},
      {R"(, "functions": [{"name": "f"}])", "functions"},
  };
  for (const auto& [extra, param] : bad) {
    try {
      chat(extra);
      ADD_FAILURE() << extra << " accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, param) << e.what();
    }
  }
  const std::vector<std::pair<std::string, std::string>> turns = {  // messages, the param named
      {R"([{"role": "tool", "content": "22 C"}])", "messages[0].tool_call_id"},
      {R"([{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}])", "messages[0].tool_calls"},
      {R"([{"role": "assistant", "tool_calls": []}])", "messages[0].tool_calls"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}])",
       "messages[0].tool_calls[0].function.arguments"},
      {R"([{"role": "assistant", "content": null}])", "messages[0].content"},
      {R"([{"role": "robot", "content": "x"}])", "messages[0].role"},
  };
  for (const auto& [messages, param] : turns) {
    try {
      parse_api_request(R"({"model": "m", "messages": )" + messages + "}", Endpoint::kChat, 16);
      ADD_FAILURE() << messages << " accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, param) << e.what();
    }
  }
}

TEST(LlamaToolCalls, AReplyThatStartsAsAnObjectIsItsCallsAndNoContent) {
  ParsedReply reply = parse_llama3_json_tool_calls(
      R"({"name": "get_weather", "parameters": {"city": "Paris; {France}"}}; {"name": "get_time", "arguments": {}})");
  EXPECT_TRUE(reply.content.is_null());
  ASSERT_EQ(reply.tool_calls.size(), 2u);
  expect_call(reply.tool_calls[0], "get_weather", R"({"city":"Paris; {France}"})");
  expect_call(reply.tool_calls[1], "get_time", "{}");
  reply = parse_llama3_json_tool_calls(R"(<|python_tag|>{"name": "f", "parameters": {"x": 1}})");
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  expect_call(reply.tool_calls[0], "f", R"({"x":1})");
  for (const std::string text : {std::string("Sure: {\"name\": \"f\", \"parameters\": {}}"),  // not at the start
                                 std::string(R"({"name": "f", "parameters": {"x": )"),          // cut short
                                 std::string(R"({"parameters": {}})"),                          // no name
                                 std::string(R"({"name": "f"} and then prose)"), std::string("")}) {
    reply = parse_llama3_json_tool_calls(text);
    EXPECT_TRUE(reply.tool_calls.empty()) << text;
    EXPECT_EQ(reply.content, text);
  }
  expect_any_split_gives_the_whole_reply(
      {R"({"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "f", "parameters": {}})",
       R"(<|python_tag|>{"name": "f", "parameters": {}})", "<|pyt is no tag, and prose follows", "plain answer",
       R"({"name": "f", "parameters": {"cut": )"},
      ToolCallMode{ToolCallMode::Kind::kLlama3Json, ""}, "<|python_tag|>");
}

// A forced tool_choice shapes the reply with a schema (vLLM's): "required" a list of {"name",
// "parameters"} over the tools, a named function its parameters; response_format json_schema its
// schema, properties in the order the client wrote them.
TEST(ChatToolRequest, ForcedCallsAndResponseSchemasBecomeTheReplysSchema) {
  const std::string tools =
      R"(, "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
           "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time"}}])";
  const auto accepts = [](const ApiRequest& request, const std::string& text) {
    JsonMachine machine(*request.params.json_schema);
    return machine.feed(text) && machine.complete();
  };
  const ApiRequest required = chat(tools + R"(, "tool_choice": "required")");
  ASSERT_TRUE(required.tool_calls && required.params.json_schema);
  EXPECT_EQ(required.tool_calls->kind, ToolCallMode::Kind::kRequired);
  EXPECT_TRUE(required.tools.is_array()) << "the model is shown the tools";
  EXPECT_TRUE(accepts(required, R"([{"name": "get_weather", "parameters": {"city": "Paris"}}])"));
  EXPECT_TRUE(accepts(required, R"([{"name": "get_time", "parameters": {}}, {"name": "get_time", "parameters": {}}])"));
  EXPECT_FALSE(accepts(required, R"([])")) << "at least one call";
  EXPECT_FALSE(accepts(required, R"([{"name": "get_time", "parameters": {"city": "Paris"}}])"));
  EXPECT_FALSE(accepts(required, R"([{"name": "get_weather", "parameters": {}}])")) << "city is required";
  const ApiRequest named =
      chat(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})");
  ASSERT_TRUE(named.tool_calls && named.params.json_schema);
  EXPECT_EQ(named.tool_calls->kind, ToolCallMode::Kind::kNamed);
  EXPECT_EQ(named.tool_calls->function, "get_weather");
  EXPECT_TRUE(accepts(named, R"({"city": "Paris"})"));
  EXPECT_FALSE(accepts(named, R"({"name": "get_weather"})"));
  const ApiRequest automatic = chat(tools);
  ASSERT_TRUE(automatic.tool_calls);
  EXPECT_EQ(automatic.tool_calls->kind, ToolCallMode::Kind::kHermes);
  EXPECT_FALSE(automatic.params.json_schema) << "auto leaves the reply free";
  const ApiRequest schema = chat(R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "w",
      "strict": true, "schema": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}},
      "required": ["z", "a"], "additionalProperties": false}}})");
  ASSERT_TRUE(schema.params.json_schema);
  EXPECT_FALSE(schema.tool_calls);
  EXPECT_TRUE(accepts(schema, R"({"z": "x", "a": 1})"));
  EXPECT_FALSE(accepts(schema, R"({"a": 1, "z": "x"})")) << "the client's order, not nlohmann's sorted one";
}

TEST(ForcedToolCalls, ReadFromTheWholeReplyOrNoneWhenItWasCutShort) {
  const ToolCallMode required{ToolCallMode::Kind::kRequired, ""};
  ParsedReply reply = parse_tool_calls(
      R"([{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}])",
      required);
  EXPECT_TRUE(reply.content.is_null());
  ASSERT_EQ(reply.tool_calls.size(), 2u);
  expect_call(reply.tool_calls[0], "get_weather", R"({"city":"Paris"})");
  expect_call(reply.tool_calls[1], "get_time", "{}");
  const ToolCallMode named{ToolCallMode::Kind::kNamed, "get_weather"};
  reply = parse_tool_calls(R"( {"city": "Paris"})", named);
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  expect_call(reply.tool_calls[0], "get_weather", R"({"city":"Paris"})");
  for (const auto& [text, mode] : {std::make_pair(R"({"city": "Par)", named),
                                   std::make_pair(R"([{"name": "get_weather", "param)", required)}) {
    reply = parse_tool_calls(text, mode);  // max_tokens cut the JSON: no call, the text is content
    EXPECT_TRUE(reply.tool_calls.empty());
    EXPECT_EQ(reply.content, text);
  }
  EXPECT_EQ(tool_finish_reason(required, true, "stop"), "tool_calls");
  EXPECT_EQ(tool_finish_reason(named, true, "stop"), "stop") << "OpenAI's answer to a forced named call";
  EXPECT_EQ(tool_finish_reason(required, false, "length"), "length");
  ToolCallStream stream(named);  // a forced reply is held back whole, then read
  EXPECT_EQ(stream.push(R"({"city": )"), "");
  EXPECT_EQ(stream.push(R"("Paris"})"), "");
  reply = stream.finish();
  EXPECT_TRUE(reply.content.is_null());
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  expect_call(reply.tool_calls[0], "get_weather", R"({"city":"Paris"})");
}

// The role patterns (DeepSpeed-Chat's format) have no tool turns: a tool message or an assistant
// call is refused by name rather than dropped from the prompt.
TEST(ChatToolRequest, DeepSpeedChatsFormatRefusesToolTurns) {
  const ChatTemplate deepspeed;
  EXPECT_TRUE(deepspeed.tool_call_format.empty());
  ChatMessage call{"assistant", "", Json::parse(R"([{"function": {"name": "f", "arguments": {}}}])"), true, ""};
  EXPECT_THROW_WITH(deepspeed.render({{"user", "x"}, call}), core::InvalidArgument,
                    "messages[1].tool_calls: the chat template (DeepSpeed-Chat's Human:/Assistant: format) cannot "
                    "write tool calls");
  ChatMessage result{"tool", "22 C", nullptr, false, "call_1"};
  EXPECT_THROW_WITH(deepspeed.render({{"user", "x"}, result}), core::InvalidArgument, "has no tool turns), got 'tool'");
  EXPECT_THROW_WITH(deepspeed.render({{"user", "x"}}, true, Json::array({Json::object()})), core::InvalidArgument,
                    "tools: the chat template (DeepSpeed-Chat's Human:/Assistant: format) takes no tools");
}

}  // namespace
}  // namespace serve
}  // namespace dschat
