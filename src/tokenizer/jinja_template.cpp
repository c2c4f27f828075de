#include "dschat/tokenizer/jinja_template.h"

#include <fstream>
#include <sstream>

#include "dschat/core/error.h"
#include "tokenizer/jinja/evaluator.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/parser.h"

namespace dschat {
namespace tokenizer {

JinjaTemplate::JinjaTemplate(const std::string& source, std::string origin) : origin_(std::move(origin)) {
  body_ = std::make_shared<const jinja::Body>(jinja::parse(jinja::lex(source, origin_), origin_));
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& variables) const {
  DSCHAT_CHECK(variables.is_object(), InvalidArgument, origin_, ": the template's variables must be a JSON object");
  const jinja::Value values = jinja::from_json(variables);
  return jinja::render(*body_, *values.dict, origin_);
}

std::optional<ChatTemplateSource> find_chat_template(const std::filesystem::path& dir) {
  const std::filesystem::path jinja_file = dir / "chat_template.jinja";
  if (std::filesystem::is_regular_file(jinja_file)) {
    std::ifstream in(jinja_file, std::ios::binary);
    DSCHAT_CHECK(in, IoError, jinja_file.string(), ": cannot read the chat template");
    std::ostringstream text;
    text << in.rdbuf();
    return ChatTemplateSource{text.str(), jinja_file.string()};
  }
  const std::filesystem::path config_file = dir / "tokenizer_config.json";
  if (!std::filesystem::is_regular_file(config_file)) return std::nullopt;
  std::ifstream in(config_file, std::ios::binary);
  DSCHAT_CHECK(in, IoError, config_file.string(), ": cannot read");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    DSCHAT_THROW(FormatError, config_file.string(), ": not valid JSON: ", e.what());
  }
  if (!config.is_object() || !config.contains("chat_template") || config["chat_template"].is_null()) return std::nullopt;
  const nlohmann::json& entry = config["chat_template"];
  const std::string origin = config_file.string();
  if (entry.is_string()) return ChatTemplateSource{entry.get<std::string>(), origin};
  DSCHAT_CHECK(entry.is_array(), ConfigError, origin, ": \"chat_template\" must be a string or a list of {name, template}, got ",
               entry.type_name());
  std::vector<std::string> names;
  for (const auto& item : entry) {
    DSCHAT_CHECK(item.is_object() && item.contains("name") && item["name"].is_string() && item.contains("template") &&
                     item["template"].is_string(),
                 ConfigError, origin, ": every \"chat_template\" list entry must be {\"name\": ..., \"template\": ...}");
    if (item["name"] == "default") return ChatTemplateSource{item["template"].get<std::string>(), origin + " (default)"};
    names.push_back(item["name"].get<std::string>());
  }
  std::string listed;
  for (const auto& name : names) listed += (listed.empty() ? "" : ", ") + name;
  DSCHAT_THROW(ConfigError, origin, ": \"chat_template\" lists templates (", listed,
               ") but none named \"default\"; dschat uses the default one");
}

}  // namespace tokenizer
}  // namespace dschat
