#pragma once
// The parsed template: expressions and statements of dschat's Jinja subset. Private to
// src/tokenizer/jinja (parser.cpp builds it, evaluator.cpp runs it).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace dschat {
namespace tokenizer {
namespace jinja {

enum class ExprKind {
  kLiteral,   // literal
  kName,      // name
  kList,      // args: the items (kTuple too)
  kTuple,
  kDict,      // args: key, value, key, value, ...
  kGetAttr,   // args[0].name
  kGetItem,   // args[0][args[1]]
  kSlice,     // args[0][args[1]:args[2]:args[3]] (null: left out)
  kCall,      // args[0](args[1..], kwargs)
  kFilter,    // args[0] | name(args[1..], kwargs)
  kTest,      // args[0] is name(args[1..])
  kUnary,     // name ("-", "+", "not") args[0]
  kBinary,    // args[0] name args[1]: + - * / // % ** ~ and or
  kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
  kCondition  // args[1] if args[0] else args[2] (null: undefined)
};

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  Pos pos;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

enum class StmtKind {
  kText,      // text
  kOutput,    // {{ expr }}
  kIf,        // branches: (condition, body) ..., a null condition for else
  kFor,       // for targets in expr [if filter]: body [else: else_body]
  kSet,       // set targets = expr; or set targets[0].attribute = expr (namespace)
  kSetBlock,  // set targets[0] %} body {% endset
  kBreak,
  kContinue,
  kScope      // a body rendered in place ({% generation %})
};

struct Stmt;
using StmtPtr = std::shared_ptr<const Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind = StmtKind::kText;
  Pos pos;
  std::string text;
  ExprPtr expr, filter;
  std::vector<std::string> targets;
  std::string attribute;  // kSet on a namespace attribute
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
};

}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
