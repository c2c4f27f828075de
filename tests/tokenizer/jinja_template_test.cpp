// The Jinja renderer of chat templates against transformers' own rendering (jinja2 with
// transformers' settings, tests/tokenizer/jinja_oracle.py): byte for byte on the chat templates
// of Qwen2, Qwen2.5, Qwen3, Mistral-7B-Instruct v0.1/v0.2/v0.3, LLaMA-2-chat, LLaMA-3-instruct,
// LLaMA-3.1-instruct (its tool branch too), Zephyr and ChatML (tests/fixtures/chat_templates, written after the published templates) over a
// set of conversations, and on a template of the remaining constructs; then the errors.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "dschat/core/error.h"
#include "dschat/tokenizer/jinja_template.h"
#include "test_util.h"

namespace dschat {
namespace tokenizer {
namespace {

using Json = nlohmann::ordered_json;

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string template_text(const std::string& name) {
  return read(testing::fixture("chat_templates") / (name + ".jinja"));
}

// name -> messages: system or not, multi-turn, empty and whitespace-only content, unicode and
// Jinja-looking text, ending on an assistant turn, roles that do not alternate, Qwen3 thinking.
const Json& conversations() {
  static const Json all = Json::parse(R"({
    "single": [{"role": "user", "content": "Hello!"}],
    "system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}],
    "multi": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
              {"role": "user", "content": "And 3+3?"}],
    "system_multi": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "a"},
                     {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
                     {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}],
    "empty": [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
    "unicode": [{"role": "user", "content": "Héllo 東京 🙂 — “quotes” \\ backslash\nnewline\ttab {{ not jinja }} {% raw %}"},
                {"role": "assistant", "content": "Ça va ✓"}, {"role": "user", "content": "Ещё"}],
    "ends_assistant": [{"role": "user", "content": "ping"}, {"role": "assistant", "content": "pong"}],
    "whitespace": [{"role": "user", "content": "  padded  \n"}, {"role": "assistant", "content": "\n reply with spaces \n"},
                   {"role": "user", "content": "\t"}],
    "not_alternating": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
    "think": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "<think>\nreasoning\n</think>\n\nanswer 1"},
              {"role": "user", "content": "q2"}, {"role": "assistant", "content": "<think>more</think>answer 2"}]
  })");
  return all;
}

// A conversation with tools, a tool call and a tool answer (the templates' tool branches).
const Json& tool_variables() {
  static const Json variables = Json::parse(R"({
    "messages": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "abc123def", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "metric": true, "ratio": 0.5}}}]},
      {"role": "tool", "tool_call_id": "abc123def", "content": "22 C, sunny"},
      {"role": "assistant", "content": "It is 22 C."}, {"role": "user", "content": "Thanks"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
      "required": ["city"]}, "return": {"type": "string"}}}],
    "documents": null, "bos_token": "<s>", "eos_token": "</s>"
  })");
  return variables;
}

// Small templates for whitespace control, scoping and expressions, rendered with no variables
// but `x` = {"a": 1}.
const std::vector<std::string>& snippets() {
  static const std::vector<std::string> all = {
      "  {% if true %}\n  x\n  {% endif %}\n{# c #}\n  {#- d #}  y {{ 'v' }}\n  {% if true +%}\nq{%+ if true %}w{% endif %}{% endif %}",
      "a  {%- if true -%}  b  {%- endif -%}  c\n",
      "line\r\nwindows\r\n{% if true %}\r\nx{% endif %}\n\n",
      "{{ 'x' }}\n",
      "{% for i in range(3) %}\n  {{ i }}\n{% endfor %}\n",
      "\t{% if true %}tab{% endif %}\n\t{{ 'var' }}",
      "{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}",
      "{% for v in [1, 2] %}{% if loop.first %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}[{{ y }}]",
      "{% set c = 7 %}{% for m in [1, 2] %}[{{ c }}]{% set c = m %}[{{ c }}]{% endfor %}{{ c }}",
      "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }}{% endfor %}{{ loop.index }}{% endfor %}",
      "{% for v in [] %}a{% else %}empty{% endfor %}{% for v in none|default([]) %}{% endfor %}",
      "{{ x.y }}|{{ x['a'] }}|{{ x.a }}|{{ x.items()|list }}|{{ x }}",
      "{{ x.y.z }}",
      "{{ 'a' + 1 }}",
      "{{ [1, 2][5] }}|{{ (1, 2)[0] }}|{{ 'abc'[1] }}",
      "{%- for k, v in x|items -%}\n  {{ k }}: {{ v }}\n{%- endfor %}\nend",
      "{% if x.a is defined and x.a > 0 %}pos{% elif x.a == 0 %}zero{% else %}neg{% endif %}",
      "{{ 10 / 4 }} {{ 10 // 4 }} {{ 2 ** -1 }} {{ 1 / 3 }} {{ 2.0 ** 0.5 }} {{ 1e100 }} {{ -0.0 }} {{ 5e-324 }}",
      // An undefined value: printed as "", iterated as empty, an error when computed with.
      "{{ 'a' in u }}|{{ u in ['a'] }}|{{ u|length }}|{{ u|join(',') }}|{{ u|first }}|{{ u|list }}|{{ u is string }}|"
      "{{ u|trim }}|{{ u ~ 'a' }}|{{ u == none }}|{% for v in u %}v{% endfor %}|{{ u|items|list }}|{{ u|upper }}|"
      "{{ none.x }}|{{ 2 * 'ab' }}|{{ u is iterable }}|{{ x.a is defined }}|{{ x.b is defined }}",
      "{{ u < 1 }}",
      "{{ u.x }}",
      "{{ u|tojson }}",
      "{{ u|int }}",
      "{{ 1 in 'abc' }}",
      "{{ 'a' < 1 }}",
  };
  return all;
}

struct Case {
  std::string label;
  std::string template_text;
  Json variables;
};

std::vector<Case> all_cases() {
  struct Model {
    const char* name;
    const char* bos;  // nullptr: the tokenizer has none
    const char* eos;
  };
  const Model models[] = {{"qwen2", nullptr, "<|im_end|>"},  {"qwen2.5", nullptr, "<|im_end|>"},
                          {"qwen3", nullptr, "<|im_end|>"},  {"mistral-v0.1", "<s>", "</s>"},
                          {"mistral-v0.2", "<s>", "</s>"},   {"mistral-v0.3", "<s>", "</s>"},
                          {"llama2-chat", "<s>", "</s>"},    {"llama3-instruct", "<|begin_of_text|>", "<|eot_id|>"},
                          {"llama3.1-instruct", "<|begin_of_text|>", "<|eot_id|>"},
                          {"zephyr", "<s>", "</s>"},         {"chatml", nullptr, "<|im_end|>"}};
  std::vector<Case> cases;
  for (const Model& model : models) {
    const std::string text = template_text(model.name);
    for (const auto& [name, messages] : conversations().items()) {
      for (bool generation_prompt : {true, false}) {
        Json variables = {{"messages", messages}, {"tools", nullptr}, {"documents", nullptr},
                          {"add_generation_prompt", generation_prompt}, {"eos_token", model.eos}};
        if (model.bos) variables["bos_token"] = model.bos;
        cases.push_back({std::string(model.name) + "/" + name + (generation_prompt ? "/prompt" : ""), text, variables});
      }
    }
  }
  for (const char* name : {"qwen2.5", "qwen3", "mistral-v0.3", "llama3.1-instruct"}) {
    for (bool generation_prompt : {true, false}) {
      Json variables = tool_variables();
      variables["add_generation_prompt"] = generation_prompt;
      cases.push_back({std::string(name) + "/tools" + (generation_prompt ? "/prompt" : ""), template_text(name), variables});
    }
  }
  for (const auto& [name, messages] : conversations().items()) {
    cases.push_back({"constructs/" + name, template_text("constructs"), Json{{"messages", messages}}});
  }
  for (size_t i = 0; i < snippets().size(); ++i) {
    cases.push_back({"snippet/" + std::to_string(i), snippets()[i], Json{{"x", Json{{"a", 1}}}}});
  }
  return cases;
}

// label -> transformers' result ({"text": ...} or {"error": ...}), computed once.
const std::map<std::string, Json>& oracle() {
  static const std::map<std::string, Json> results = [] {
    const std::vector<Case> cases = all_cases();
    Json input = Json::array();
    for (const Case& c : cases) input.push_back({{"template", c.template_text}, {"variables", c.variables}});
    testing::TempDir tmp;
    std::ofstream(tmp / "cases.json") << input.dump();
    std::string output;
    const int status = testing::run_command(std::string(DSCHAT_PYTHON) + " " +
                                                (testing::source_dir() / "tests" / "tokenizer" / "jinja_oracle.py").string() +
                                                " " + (tmp / "cases.json").string() + " " + (tmp / "out.json").string(),
                                            &output);
    std::map<std::string, Json> by_label;
    EXPECT_EQ(status, 0) << output;
    if (status != 0) return by_label;
    const Json rendered = Json::parse(read(tmp / "out.json"));
    for (size_t i = 0; i < cases.size(); ++i) by_label[cases[i].label] = rendered[i];
    return by_label;
  }();
  return results;
}

// Renders every case whose label starts with `prefix` and compares with transformers.
void expect_parity(const std::string& prefix) {
  int compared = 0;
  for (const Case& c : all_cases()) {
    if (c.label.rfind(prefix, 0) != 0) continue;
    ++compared;
    const auto found = oracle().find(c.label);
    ASSERT_NE(found, oracle().end()) << c.label;
    const Json& expected = found->second;
    std::string text, error;
    try {
      text = JinjaTemplate(c.template_text, c.label).render(c.variables);
    } catch (const core::Error& e) {
      error = e.what();
    }
    if (expected.contains("text")) {
      EXPECT_EQ(error, "") << c.label;
      EXPECT_EQ(text, expected["text"].get<std::string>()) << c.label;
    } else {
      EXPECT_NE(error, "") << c.label << ": transformers failed (" << expected["error"] << ") but dschat rendered "
                           << text;
      const std::string python = expected["error"].get<std::string>();
      const std::string raised = "TemplateError: ";
      if (python.rfind(raised, 0) == 0) {  // raise_exception: the same message
        EXPECT_NE(error.find("raise_exception: " + python.substr(raised.size())), std::string::npos)
            << c.label << ": " << error;
      }
    }
  }
  EXPECT_GT(compared, 0) << prefix;
}

TEST(JinjaParity, Qwen) {
  expect_parity("qwen2/");
  expect_parity("qwen2.5/");
  expect_parity("qwen3/");
}
TEST(JinjaParity, Mistral) { expect_parity("mistral-"); }
TEST(JinjaParity, Llama) { expect_parity("llama"); }
TEST(JinjaParity, ZephyrAndChatMl) {
  expect_parity("zephyr/");
  expect_parity("chatml/");
}
TEST(JinjaParity, Constructs) { expect_parity("constructs/"); }
TEST(JinjaParity, WhitespaceScopingAndExpressions) { expect_parity("snippet/"); }

TEST(JinjaTemplate, AlternationErrorIsRaiseExceptionsMessageWithPosition) {
  const JinjaTemplate mistral(template_text("mistral-v0.1"), "mistral/tokenizer_config.json");
  const Json variables = {{"messages", conversations()["not_alternating"]}, {"bos_token", "<s>"}, {"eos_token", "</s>"}};
  EXPECT_THROW_WITH(mistral.render(variables), core::InvalidArgument,
                    "mistral/tokenizer_config.json:1:125: raise_exception: Conversation roles must alternate");
}

// Constructs outside the subset are refused at parse time, naming the file, line:column and construct.
TEST(JinjaTemplate, RefusesUnsupportedConstructsNamingFilePositionAndConstruct) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"{% macro m(x) %}{{ x }}{% endmacro %}", "t.jinja:1:4: '{% macro %}'"},
      {"ok\n{% call m() %}x{% endcall %}", "t.jinja:2:4: '{% call %}'"},
      {"{% include 'other.jinja' %}", "'{% include %}'"},
      {"{% extends 'base' %}", "'{% extends %}'"},
      {"{% import 'x' as y %}", "'{% import %}'"},
      {"{% filter upper %}x{% endfilter %}", "'{% filter %}'"},
      {"  {% raw %}{{ x }}{% endraw %}", "t.jinja:1:6: '{% raw %}' blocks"},
      {"{{ x | wordcount }}", "t.jinja:1:8: the filter 'wordcount'"},
      {"{{ x is escaped }}", "t.jinja:1:9: the test 'escaped'"},
      {"{{ cycler(1, 2) }}", "t.jinja:1:4: calling 'cycler()'"},
      {"{{ messages.append(1) }}", "the method '.append()'"},
      {"{{ 'a {}'.format(1) }}", "the method '.format()'"},
      {"{{ f(*args) }}", "calling 'f()'"},
      {"{{ range(*args) }}", "'*args' and '**kwargs'"},
      {"{% for x in y recursive %}{% endfor %}", "'recursive' for loops"},
      {"{% set x | upper %}a{% endset %}", "a filter on a '{% set %}' block"},
      {"{{ x[1, 2] }}", "a subscript with several indices"},
  };
  for (const auto& [source, fragment] : refused) {
    EXPECT_THROW_WITH(JinjaTemplate(source, "t.jinja"), core::Unsupported, fragment);
  }
}

TEST(JinjaTemplate, SyntaxErrorsNameFileAndPosition) {
  const std::vector<std::pair<std::string, std::string>> broken = {
      {"text {{ 'unclosed' ", "t.jinja:1:6: template syntax error: the tag is never closed with }}"},
      {"{% if x %}no end", "expected '{% endif %}'"},
      {"a\n  {% endfor %}", "t.jinja:2:6: template syntax error: unknown or misplaced statement 'endfor'"},
      {"{{ 'open }}", "the string is never closed"},
      {"{# comment", "the comment is never closed"},
      {"{{ 1 + }}", "t.jinja:1:8: template syntax error: unexpected '}}'"},
      {"{% break %}", "'break' outside a for loop"},
      {"{{ a ? b }}", "unexpected character '?'"},
      {"{{ (1, 2 }}", "t.jinja:1:10: template syntax error: unexpected '}'"},
  };
  for (const auto& [source, fragment] : broken) {
    EXPECT_THROW_WITH(JinjaTemplate(source, "t.jinja"), core::FormatError, fragment);
  }
}

TEST(JinjaTemplate, RuntimeErrorsNameFileAndPosition) {
  const Json variables = {{"x", Json::object()}, {"n", 1}};
  EXPECT_THROW_WITH(JinjaTemplate("{{ x.y.z }}", "t.jinja").render(variables), core::InvalidArgument,
                    "t.jinja:1:7: 'dict object' has no attribute 'y' (is undefined; accessing .z)");
  EXPECT_THROW_WITH(JinjaTemplate("\n {{ 'a' + n }}", "t.jinja").render(variables), core::InvalidArgument,
                    "t.jinja:2:9: unsupported operand types for +: 'str' and 'int'");
  EXPECT_THROW_WITH(JinjaTemplate("{{ n / 0 }}", "t.jinja").render(variables), core::InvalidArgument, "division by zero");
  EXPECT_THROW_WITH(JinjaTemplate("{% set n.a = 1 %}", "t.jinja").render(variables), core::InvalidArgument,
                    "t.jinja:1:4: cannot assign attribute on non-namespace object 'n'");
  EXPECT_THROW_WITH(JinjaTemplate("{{ raise_exception('no ' ~ n) }}", "t.jinja").render(variables), core::InvalidArgument,
                    "t.jinja:1:19: raise_exception: no 1");
  EXPECT_THROW_WITH(JinjaTemplate("{{ 'é'|upper }}", "t.jinja").render(variables), core::Unsupported,
                    "t.jinja:1:9: str.upper() of non-ASCII text");
  EXPECT_THROW_WITH(JinjaTemplate("{{ '%d' % n }}", "t.jinja").render(variables), core::Unsupported,
                    "'%' string formatting");
}

TEST(FindChatTemplate, ReadsTheJinjaFileThenTokenizerConfigLikeTransformers) {
  testing::TempDir dir;
  EXPECT_FALSE(find_chat_template(dir.path()).has_value());  // no files
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "</s>"})";
  EXPECT_FALSE(find_chat_template(dir.path()).has_value());  // no template
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "{{ messages[0].content }}"})";
  auto found = find_chat_template(dir.path());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->text, "{{ messages[0].content }}");
  EXPECT_EQ(found->origin, (dir / "tokenizer_config.json").string());
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})";
  EXPECT_EQ(find_chat_template(dir.path())->text, "D");
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": [{"name": "tool_use", "template": "T"}]})";
  EXPECT_THROW_WITH(find_chat_template(dir.path()), core::ConfigError, "none named \"default\"");
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": 3})";
  EXPECT_THROW_WITH(find_chat_template(dir.path()), core::ConfigError, "must be a string or a list");
  std::ofstream(dir / "chat_template.jinja") << "from the file\n";  // takes priority, as in transformers
  found = find_chat_template(dir.path());
  EXPECT_EQ(found->text, "from the file\n");
  EXPECT_EQ(found->origin, (dir / "chat_template.jinja").string());
}

}  // namespace
}  // namespace tokenizer
}  // namespace dschat
