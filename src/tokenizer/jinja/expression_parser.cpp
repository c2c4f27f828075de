// Expressions, with jinja2's grammar and precedence (parser.h lists it).
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/parser_state.h"

namespace dschat {
namespace tokenizer {
namespace jinja {
namespace parser_detail {

std::shared_ptr<Expr> node(ExprKind kind, Pos pos, std::vector<ExprPtr> args, std::string name) {
  auto e = std::make_shared<Expr>();
  e->kind = kind;
  e->pos = pos;
  e->args = std::move(args);
  e->name = std::move(name);
  return e;
}

// ---- expressions

// An expression, or several separated by commas (a tuple).
ExprPtr Parser::parse_tuple(bool with_condition) {
  const Pos pos = peek().pos;
  ExprPtr first = parse_expression(with_condition);
  if (!is_op(",")) return first;
  std::vector<ExprPtr> items{first};
  while (is_op(",")) {
    next();
    if (peek().type == Tok::kVarEnd || peek().type == Tok::kBlockEnd || is_name("in") || is_op(")")) break;
    items.push_back(parse_expression(with_condition));
  }
  return node(ExprKind::kTuple, pos, std::move(items));
}

ExprPtr Parser::parse_expression(bool with_condition) {
  ExprPtr expr = parse_or();
  if (!with_condition) return expr;
  while (is_name("if")) {
    const Pos pos = next().pos;
    ExprPtr condition = parse_or();
    ExprPtr otherwise;
    if (is_name("else")) {
      next();
      otherwise = parse_expression(true);
    }
    expr = node(ExprKind::kCondition, pos, {condition, expr, otherwise});
  }
  return expr;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (is_name("or")) {
    const Pos pos = next().pos;
    left = node(ExprKind::kBinary, pos, {left, parse_and()}, "or");
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (is_name("and")) {
    const Pos pos = next().pos;
    left = node(ExprKind::kBinary, pos, {left, parse_not()}, "and");
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    const Pos pos = next().pos;
    return node(ExprKind::kUnary, pos, {parse_not()}, "not");
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  const Pos pos = peek().pos;
  ExprPtr first = parse_math1();
  auto compare = node(ExprKind::kCompare, pos, {first});
  while (true) {
    static const std::set<std::string> kOps = {"==", "!=", "<", "<=", ">", ">="};
    if (peek().type == Tok::kOperator && kOps.count(peek().text)) {
      compare->ops.push_back(next().text);
    } else if (is_name("in")) {
      next();
      compare->ops.push_back("in");
    } else if (is_name("not") && is_name("in", 1)) {
      next();
      next();
      compare->ops.push_back("notin");
    } else {
      break;
    }
    compare->args.push_back(parse_math1());
  }
  return compare->ops.empty() ? first : compare;
}

ExprPtr Parser::binary_chain(ExprPtr (Parser::*operand)(), const std::set<std::string>& ops) {
  ExprPtr left = (this->*operand)();
  while (peek().type == Tok::kOperator && ops.count(peek().text)) {
    const Token& op = next();
    left = node(ExprKind::kBinary, op.pos, {left, (this->*operand)()}, op.text);
  }
  return left;
}
ExprPtr Parser::parse_math1() { return binary_chain(&Parser::parse_concat, {"+", "-"}); }
ExprPtr Parser::parse_concat() { return binary_chain(&Parser::parse_math2, {"~"}); }
ExprPtr Parser::parse_math2() { return binary_chain(&Parser::parse_pow, {"*", "/", "//", "%"}); }
ExprPtr Parser::parse_pow() { return binary_chain(&Parser::parse_unary_filtered, {"**"}); }
ExprPtr Parser::parse_unary_filtered() { return parse_unary(true); }

ExprPtr Parser::parse_unary(bool with_filter) {
  ExprPtr expr;
  if (is_op("-") || is_op("+")) {
    const Token& op = next();
    expr = node(ExprKind::kUnary, op.pos, {parse_unary(false)}, op.text);
  } else {
    expr = parse_primary();
  }
  expr = parse_postfix(expr);
  return with_filter ? parse_filters(expr) : expr;
}

ExprPtr Parser::parse_primary() {
  const Token& token = next();
  switch (token.type) {
    case Tok::kName: {
      const std::string& n = token.text;
      if (n == "true" || n == "True") return literal(token.pos, Value::of(true));
      if (n == "false" || n == "False") return literal(token.pos, Value::of(false));
      if (n == "none" || n == "None") return literal(token.pos, Value::none());
      auto name = node(ExprKind::kName, token.pos);
      name->name = n;
      return name;
    }
    case Tok::kString: {
      std::string text = token.text;
      while (peek().type == Tok::kString) text += next().text;  // adjacent literals join
      return literal(token.pos, Value::of(text));
    }
    case Tok::kInteger: return literal(token.pos, Value::of(token.integer));
    case Tok::kFloat: return literal(token.pos, Value::of(token.number));
    case Tok::kOperator:
      if (token.text == "(") {
        if (is_op(")")) {
          next();
          return node(ExprKind::kTuple, token.pos);
        }
        ExprPtr inner = parse_expression(true);
        if (is_op(",")) {
          std::vector<ExprPtr> items{inner};
          while (is_op(",")) {
            next();
            if (is_op(")")) break;
            items.push_back(parse_expression(true));
          }
          inner = node(ExprKind::kTuple, token.pos, std::move(items));
        }
        expect_op(")");
        return inner;
      }
      if (token.text == "[") {
        std::vector<ExprPtr> items;
        while (!is_op("]")) {
          if (!items.empty()) expect_op(",");
          if (is_op("]")) break;
          items.push_back(parse_expression(true));
        }
        next();
        return node(ExprKind::kList, token.pos, std::move(items));
      }
      if (token.text == "{") {
        std::vector<ExprPtr> items;
        while (!is_op("}")) {
          if (!items.empty()) expect_op(",");
          if (is_op("}")) break;
          items.push_back(parse_expression(true));
          expect_op(":");
          items.push_back(parse_expression(true));
        }
        next();
        return node(ExprKind::kDict, token.pos, std::move(items));
      }
      break;
    default: break;
  }
  fail(token, "unexpected " + describe(token));
}

ExprPtr Parser::literal(Pos pos, Value value) {
  auto e = node(ExprKind::kLiteral, pos);
  e->literal = std::move(value);
  return e;
}

ExprPtr Parser::parse_postfix(ExprPtr expr) {
  while (true) {
    if (is_op(".")) {
      const Token& dot = next();
      if (peek().type == Tok::kInteger) {
        expr = node(ExprKind::kGetItem, dot.pos, {expr, literal(peek().pos, Value::of(next().integer))});
      } else {
        expr = node(ExprKind::kGetAttr, dot.pos, {expr}, expect_name());
      }
    } else if (is_op("[")) {
      expr = parse_subscript(expr);
    } else if (is_op("(")) {
      expr = parse_call(expr);
    } else {
      return expr;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr target) {
  const Token& open = next();
  std::vector<ExprPtr> parts(3);
  size_t part = 0;
  bool slice = false;
  while (!is_op("]")) {
    if (is_op(":")) {
      next();
      slice = true;
      if (++part > 2) fail(open, "a slice has at most three parts");
      continue;
    }
    if (is_op(",")) refuse(peek(), "a subscript with several indices");
    if (parts[part]) fail(peek(), "expected ':' or ']' in the subscript");
    parts[part] = parse_expression(true);
  }
  next();
  if (!slice) {
    if (!parts[0]) fail(open, "an empty subscript");
    return node(ExprKind::kGetItem, open.pos, {target, parts[0]});
  }
  return node(ExprKind::kSlice, open.pos, {target, parts[0], parts[1], parts[2]});
}

void Parser::parse_args(Expr& call) {
  expect_op("(");
  for (bool first = true; !is_op(")"); first = false) {
    if (!first) {
      expect_op(",");
      if (is_op(")")) break;
    }
    if (is_op("*") || is_op("**")) refuse(peek(), "'*args' and '**kwargs' in calls");
    if (peek().type == Tok::kName && is_op("=", 1)) {
      const std::string key = next().text;
      next();
      call.kwargs.emplace_back(key, parse_expression(true));
    } else {
      if (!call.kwargs.empty()) fail(peek(), "a positional argument after a keyword argument");
      call.args.push_back(parse_expression(true));
    }
  }
  next();
}

ExprPtr Parser::parse_call(ExprPtr callee) {
  auto call = node(ExprKind::kCall, peek().pos, {callee});
  if (callee->kind == ExprKind::kName) {
    if (!is_global_function(callee->name)) refuse(callee->pos, "calling '" + callee->name + "()'");
  } else if (callee->kind == ExprKind::kGetAttr) {
    if (!is_method(callee->name)) refuse(peek(), "the method '." + callee->name + "()'");
  } else {
    refuse(peek(), "calling the result of an expression");
  }
  parse_args(*call);
  return call;
}

ExprPtr Parser::parse_filters(ExprPtr expr) {
  while (true) {
    if (is_op("|")) {
      next();
      const Token& name = peek();
      auto filter = node(ExprKind::kFilter, name.pos, {expr}, expect_name());
      if (!is_filter(filter->name)) refuse(name, "the filter '" + filter->name + "'");
      if (is_op("(")) {
              parse_args(*filter);
      }
      expr = filter;
    } else if (is_name("is")) {
      next();
      bool negated = false;
      if (is_name("not")) {
        next();
        negated = true;
      }
      const Token& name = peek();
      auto test = node(ExprKind::kTest, name.pos, {expr}, expect_name());
      if (!is_test(test->name)) refuse(name, "the test '" + test->name + "'");
      if (is_op("(")) {
              parse_args(*test);
      } else if ((peek().type == Tok::kName && !is_name("else") && !is_name("or") && !is_name("and") &&
                  !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is")) ||
                 peek().type == Tok::kString || peek().type == Tok::kInteger || peek().type == Tok::kFloat ||
                 is_op("[") || is_op("{")) {
        test->args.push_back(parse_postfix(parse_primary()));
      }
      expr = negated ? node(ExprKind::kUnary, name.pos, {test}, "not") : test;
    } else if (is_op("(")) {
      expr = parse_call(expr);
    } else {
      return expr;
    }
  }
}

}  // namespace parser_detail
}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
