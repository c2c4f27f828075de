#pragma once
// The parser's state and helpers, shared by the statement parser (parser.cpp) and the expression
// parser (expression_parser.cpp). Private to src/tokenizer/jinja.

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dschat/core/error.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace dschat {
namespace tokenizer {
namespace jinja {
namespace parser_detail {

std::shared_ptr<Expr> node(ExprKind kind, Pos pos, std::vector<ExprPtr> args = {}, std::string name = "");

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& origin) : tokens_(tokens), origin_(origin) {}

  Body parse_template() {
    std::string end;
    return parse_body({}, &end);
  }

 private:
  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(at_ + ahead, tokens_.size() - 1)]; }
  const Token& next() { return tokens_[std::min(at_++, tokens_.size() - 1)]; }
  bool is_op(const char* op, size_t ahead = 0) const { return peek(ahead).type == Tok::kOperator && peek(ahead).text == op; }
  bool is_name(const char* name, size_t ahead = 0) const { return peek(ahead).type == Tok::kName && peek(ahead).text == name; }

  [[noreturn]] void fail(const Token& token, const std::string& message) const {
    DSCHAT_THROW(FormatError, where(origin_, token.pos), ": template syntax error: ", message);
  }
  [[noreturn]] void refuse(const Token& token, const std::string& construct) const { refuse(token.pos, construct); }
  [[noreturn]] void refuse(Pos pos, const std::string& construct) const {
    DSCHAT_THROW(Unsupported, where(origin_, pos), ": ", construct, " is not supported by dschat's Jinja subset");
  }
  std::string describe(const Token& token) const {
    switch (token.type) {
      case Tok::kEof: return "the end of the template";
      case Tok::kBlockEnd: return "'%}'";
      case Tok::kVarEnd: return "'}}'";
      case Tok::kText: return "text";
      default: return "'" + token.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(peek(), std::string("expected '") + op + "', got " + describe(peek()));
    next();
  }
  std::string expect_name() {
    if (peek().type != Tok::kName) fail(peek(), "expected a name, got " + describe(peek()));
    return next().text;
  }
  void expect(Tok type, const char* what) {
    if (peek().type != type) fail(peek(), std::string("expected ") + what + ", got " + describe(peek()));
    next();
  }

  // ---- statements (parser.cpp)
  Body parse_body(const std::set<std::string>& ends, std::string* end);
  StmtPtr parse_statement();
  std::vector<std::string> parse_targets();

  // ---- expressions (expression_parser.cpp)
  ExprPtr parse_tuple(bool with_condition);
  ExprPtr parse_expression(bool with_condition = true);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr binary_chain(ExprPtr (Parser::*operand)(), const std::set<std::string>& ops);
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary_filtered();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr literal(Pos pos, Value value);
  ExprPtr parse_postfix(ExprPtr expr);
  ExprPtr parse_subscript(ExprPtr target);
  void parse_args(Expr& call);
  ExprPtr parse_call(ExprPtr callee);
  ExprPtr parse_filters(ExprPtr expr);

  const std::vector<Token>& tokens_;
  const std::string& origin_;
  size_t at_ = 0;
  int loop_depth_ = 0;
};

}  // namespace parser_detail
}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
