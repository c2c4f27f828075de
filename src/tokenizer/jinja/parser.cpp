#include "tokenizer/jinja/parser.h"

#include "tokenizer/jinja/parser_state.h"

namespace dschat {
namespace tokenizer {
namespace jinja {
namespace parser_detail {

// ---- statements

// Statements up to a "{% NAME" with NAME in `ends` (consumed up to and including NAME; *end = NAME).
Body Parser::parse_body(const std::set<std::string>& ends, std::string* end) {
  Body body;
  while (true) {
    const Token& token = peek();
    if (token.type == Tok::kEof) {
      if (!ends.empty()) {
        std::string closer;
        for (const auto& name : ends) {
          if (name.rfind("end", 0) == 0) closer = name;
        }
        fail(token, "unexpected end of template; expected '{% " + closer + " %}'");
      }
      return body;
    }
    if (token.type == Tok::kText) {
      auto s = std::make_shared<Stmt>();
      s->kind = StmtKind::kText;
      s->pos = token.pos;
      s->text = next().text;
      body.push_back(s);
    } else if (token.type == Tok::kVarBegin) {
      next();
      auto s = std::make_shared<Stmt>();
      s->kind = StmtKind::kOutput;
      s->pos = token.pos;
      s->expr = parse_tuple(true);
      expect(Tok::kVarEnd, "'}}'");
      body.push_back(s);
    } else if (token.type == Tok::kBlockBegin) {
      next();
      const Token& keyword = peek();
      if (keyword.type != Tok::kName) fail(keyword, "expected a statement name after '{%'");
      if (ends.count(keyword.text)) {
        *end = next().text;
        return body;
      }
      body.push_back(parse_statement());
    } else {
      fail(token, "unexpected " + describe(token));
    }
  }
}

StmtPtr Parser::parse_statement() {
  const Token& keyword = next();
  const std::string& name = keyword.text;
  auto s = std::make_shared<Stmt>();
  s->pos = keyword.pos;
  if (name == "if") {
    s->kind = StmtKind::kIf;
    ExprPtr condition = parse_tuple(false);
    while (true) {
      expect(Tok::kBlockEnd, "'%}'");
      std::string end;
      Body body = parse_body({"elif", "else", "endif"}, &end);
      s->branches.emplace_back(condition, std::move(body));
      if (end == "endif") break;
      if (end == "else") {
        expect(Tok::kBlockEnd, "'%}'");
        s->branches.emplace_back(nullptr, parse_body({"endif"}, &end));
        break;
      }
      condition = parse_tuple(false);
    }
  } else if (name == "for") {
    s->kind = StmtKind::kFor;
    s->targets = parse_targets();
    if (!is_name("in")) fail(peek(), "expected 'in' in the for statement, got " + describe(peek()));
    next();
    s->expr = parse_tuple(false);
    if (is_name("if")) {
      next();
      s->filter = parse_expression(false);
    }
    if (is_name("recursive")) refuse(peek(), "'recursive' for loops");
    expect(Tok::kBlockEnd, "'%}'");
    std::string end;
    ++loop_depth_;
    s->body = parse_body({"else", "endfor"}, &end);
    --loop_depth_;
    if (end == "else") {
      expect(Tok::kBlockEnd, "'%}'");
      s->else_body = parse_body({"endfor"}, &end);
    }
  } else if (name == "set") {
    s->targets = parse_targets();
    if (s->targets.size() == 1 && is_op(".")) {
      next();
      s->attribute = expect_name();
    }
    if (is_op("=")) {
      next();
      s->kind = StmtKind::kSet;
      s->expr = parse_tuple(true);
    } else {
      if (s->targets.size() != 1 || !s->attribute.empty()) fail(peek(), "expected '=' in the set statement");
      if (is_op("|")) refuse(peek(), "a filter on a '{% set %}' block");
      s->kind = StmtKind::kSetBlock;
      expect(Tok::kBlockEnd, "'%}'");
      std::string end;
      s->body = parse_body({"endset"}, &end);
    }
  } else if (name == "break" || name == "continue") {
    if (loop_depth_ == 0) fail(keyword, "'" + name + "' outside a for loop");
    s->kind = name == "break" ? StmtKind::kBreak : StmtKind::kContinue;
  } else if (name == "generation") {  // transformers' AssistantTracker: renders its body in place
    s->kind = StmtKind::kScope;
    expect(Tok::kBlockEnd, "'%}'");
    std::string end;
    s->body = parse_body({"endgeneration"}, &end);
  } else if (name == "macro" || name == "call" || name == "filter" || name == "block" || name == "extends" ||
             name == "include" || name == "import" || name == "from" || name == "with" || name == "autoescape" ||
             name == "do" || name == "trans") {
    refuse(keyword, "'{% " + name + " %}'");
  } else {
    fail(keyword, "unknown or misplaced statement '" + name + "'");
  }
  expect(Tok::kBlockEnd, "'%}'");
  return s;
}

std::vector<std::string> Parser::parse_targets() {
  std::vector<std::string> names;
  const bool parenthesized = is_op("(");
  if (parenthesized) next();
  names.push_back(expect_name());
  while (is_op(",")) {
    next();
    if (peek().type != Tok::kName) break;
    names.push_back(expect_name());
  }
  if (parenthesized) expect_op(")");
  return names;
}

}  // namespace parser_detail

Body parse(const std::vector<Token>& tokens, const std::string& origin) {
  return parser_detail::Parser(tokens, origin).parse_template();
}

}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
