// vLLM's tokenizer endpoints, which evaluation harnesses use to count a context's tokens the way
// the server does (lm-eval's `tokenizer_backend=remote`):
//   GET  /tokenizer_info  {"eos_token", "bos_token", "pad_token", "model_max_length", "tokenizer_class"}
//   POST /tokenize        {"prompt", "add_special_tokens" (default true), "model"?} -> {"tokens", "count", "max_model_len"}
//   POST /detokenize      {"tokens", "model"?} -> {"prompt"}
// "model" picks a served model (default: the first); every other key is refused by name.
#include <set>

#include "serve/server_state.h"

namespace dschat {
namespace serve {
namespace {

using nlohmann::json;

json parse_body(const std::string& text, const std::set<std::string>& keys) {
  const json body = parse_request_object(text);
  for (const auto& item : body.items()) {
    if (!keys.count(item.key())) throw ApiError(400, "unrecognized request argument supplied: '" + item.key() + "'", item.key());
  }
  return body;
}

ModelSlot& model_of(Server::State& state, const json& body) {
  if (!body.contains("model") || body["model"].is_null()) return state.models.front();
  if (!body["model"].is_string()) throw ApiError(400, "'model' must be a string", "model");
  return state.require(body["model"].get<std::string>());
}

json token_text(const tokenizer::Tokenizer& tokenizer, std::optional<int64_t> id) {
  if (!id) return nullptr;
  return tokenizer.decode({*id}, /*skip_special_tokens=*/false);
}

void answer(httplib::Response& response, const std::function<json()>& build) {
  try {
    response.set_content(wire_json(build()), "application/json");
  } catch (const ApiError& e) {
    send_error(response, e);
  }
}

}  // namespace

void add_tokenizer_routes(Server::State& state) {
  Server::State* server = &state;
  state.http.Get("/tokenizer_info", [server](const httplib::Request& request, httplib::Response& response) {
    answer(response, [&] {
      const std::string name = request.get_param_value("model");
      ModelSlot& slot = name.empty() ? server->models.front() : model_of(*server, json{{"model", name}});
      const tokenizer::Tokenizer& tokenizer = slot.scheduler->tokenizer();
      return json{{"tokenizer_class", "dschat"},
                  {"eos_token", token_text(tokenizer, tokenizer.eos_token_id())},
                  {"bos_token", token_text(tokenizer, tokenizer.bos_token_id())},
                  {"pad_token", token_text(tokenizer, tokenizer.pad_token_id())},
                  {"model_max_length", slot.scheduler->context_tokens()}};
    });
  });
  state.http.Post("/tokenize", [server](const httplib::Request& request, httplib::Response& response) {
    server->http.request_read(request);
    answer(response, [&] {
      const json body = parse_body(request.body, {"model", "prompt", "add_special_tokens"});
      ModelSlot& slot = model_of(*server, body);
      if (!body.contains("prompt") || !body["prompt"].is_string()) throw ApiError(400, "'prompt' is required (a string)", "prompt");
      bool special = true;
      if (body.contains("add_special_tokens") && !body["add_special_tokens"].is_null()) {
        if (!body["add_special_tokens"].is_boolean()) {
          throw ApiError(400, "'add_special_tokens' must be true or false", "add_special_tokens");
        }
        special = body["add_special_tokens"].get<bool>();
      }
      const std::vector<int64_t> tokens = slot.scheduler->tokenizer().encode(body["prompt"].get<std::string>(), special);
      return json{{"tokens", tokens}, {"count", tokens.size()}, {"max_model_len", slot.scheduler->context_tokens()}};
    });
  });
  state.http.Post("/detokenize", [server](const httplib::Request& request, httplib::Response& response) {
    server->http.request_read(request);
    answer(response, [&] {
      const json body = parse_body(request.body, {"model", "tokens"});
      ModelSlot& slot = model_of(*server, body);
      if (!body.contains("tokens") || !body["tokens"].is_array()) throw ApiError(400, "'tokens' is required (a list of ids)", "tokens");
      std::vector<int64_t> ids;
      for (const json& id : body["tokens"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= slot.vocab_size) {
          throw ApiError(400, "'tokens' must hold ids in [0, " + std::to_string(slot.vocab_size) + "), got " + id.dump(),
                         "tokens");
        }
        ids.push_back(id.get<int64_t>());
      }
      return json{{"prompt", slot.scheduler->tokenizer().decode(ids, /*skip_special_tokens=*/false)}};
    });
  });
}

}  // namespace serve
}  // namespace dschat
