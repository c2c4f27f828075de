#pragma once
// Hugging Face chat templates: the Jinja text a tokenizer directory carries, and a renderer for
// it that gives, byte for byte, what transformers' apply_chat_template gives (jinja2's sandboxed
// environment with trim_blocks and lstrip_blocks, loop controls, raise_exception and
// transformers' tojson). docs/serve.md lists the subset of Jinja it implements:
//
//   statements  if/elif/else, for (unpacking, "if" filter, else, loop.index/index0/revindex/
//               revindex0/first/last/length/previtem/nextitem/cycle), set (names, tuples,
//               namespace attributes, blocks), break/continue, {% generation %}, comments,
//               whitespace control ({%- -%} {{- -}} {#- -#} {%+ +%})
//   expressions literals, lists, tuples, dicts, x.attr, x[i], x[a:b:c], and/or/not, comparisons
//               (chained), in/not in, + - * / // % **, ~, x if c else y, filters, tests
//   functions   raise_exception, namespace, range, dict, strftime_now; str methods
//               (startswith, endswith, split, rsplit, strip, lstrip, rstrip, upper, lower,
//               replace, title, capitalize, find, count) and dict methods (items, keys, values, get)
//
// Anything else (macros, call/filter blocks, include/import/extends, raw blocks, unknown filters,
// tests, functions or methods) is refused when the template is parsed, with core::Unsupported
// naming the template, line:column and the construct; nothing half-renders.
//
//   tokenizer::JinjaTemplate chat(source, "qwen/tokenizer_config.json");
//   std::string prompt = chat.render({{"messages", messages}, {"add_generation_prompt", true}});

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace dschat {
namespace tokenizer {

namespace jinja {
struct Stmt;
}

class JinjaTemplate {
 public:
  /// Parses `source`; `origin` names it in every message ("DIR/chat_template.jinja"). Throws
  /// core::FormatError (a syntax error) or core::Unsupported, naming origin:line:column.
  JinjaTemplate(const std::string& source, std::string origin);

  /// Renders with `variables` (a JSON object: messages, add_generation_prompt, bos_token, ...).
  /// Throws core::InvalidArgument naming origin:line:column when the template fails on these
  /// variables (an undefined value used, a type error) or calls raise_exception(message) (the
  /// message then follows "raise_exception: ").
  std::string render(const nlohmann::ordered_json& variables) const;

  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
  std::shared_ptr<const std::vector<std::shared_ptr<const jinja::Stmt>>> body_;
};

/// A chat template found in a tokenizer directory.
struct ChatTemplateSource {
  std::string text;    // the Jinja source
  std::string origin;  // where it came from: "DIR/chat_template.jinja" or "DIR/tokenizer_config.json"
};

/// The chat template of `dir` as transformers finds it: chat_template.jinja (written by
/// transformers 4.43 and later), else tokenizer_config.json's "chat_template" (a string, or a list
/// of {"name", "template"} objects of which "default" is used). None when there is no template.
/// Throws core::ConfigError for a malformed "chat_template" entry or a list without "default".
std::optional<ChatTemplateSource> find_chat_template(const std::filesystem::path& dir);

}  // namespace tokenizer
}  // namespace dschat
