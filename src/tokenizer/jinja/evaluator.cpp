#include "tokenizer/jinja/evaluator.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>

#include "dschat/core/error.h"
#include "tokenizer/jinja/builtins.h"

namespace dschat {
namespace tokenizer {
namespace jinja {
namespace evaluator_detail {

enum class Flow { kNormal, kBreak, kContinue };

int64_t as_integer(const Value& v) { return v.kind == Kind::kBool ? v.boolean : v.integer; }
double as_double(const Value& v) { return v.kind == Kind::kFloat ? v.number : static_cast<double>(as_integer(v)); }

class Evaluator {
 public:
  Evaluator(const Dict& variables, const std::string& origin) : origin_(origin) {
    scopes_.emplace_back();
    for (const auto& [name, value] : variables) scopes_.back()[name] = value;
  }

  std::string run(const Body& body) {
    exec(body);
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(Pos pos, const std::string& message) const {
    DSCHAT_THROW(InvalidArgument, where(origin_, pos), ": ", message);
  }

  // Runs `f`, adding the position to a builtin's error (once).
  template <typename F>
  auto at(Pos pos, F&& f) -> decltype(f()) {
    const std::string prefix = origin_ + ":";
    try {
      return f();
    } catch (const core::InvalidArgument& e) {
      if (std::string(e.what()).rfind(prefix, 0) == 0) throw;
      fail(pos, e.what());
    } catch (const core::Unsupported& e) {
      if (std::string(e.what()).rfind(prefix, 0) == 0) throw;
      DSCHAT_THROW(Unsupported, where(origin_, pos), ": ", e.what());
    }
  }

  Value lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      auto found = scope->find(name);
      if (found != scope->end()) return found->second;
    }
    if (is_global_function(name)) return global_function(name);
    return Value::undefined("'" + name + "'");
  }

  void bind(const std::vector<std::string>& targets, const Value& value, Pos pos) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = value;
      return;
    }
    const List items = at(pos, [&] { return iterate(value); });
    if (items.size() != targets.size()) {
      fail(pos, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < items.size(); ++i) scopes_.back()[targets[i]] = items[i];
  }

  // ---- statements

  Flow exec(const Body& body) {
    for (const StmtPtr& stmt : body) {
      const Flow flow = exec(*stmt);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& s) {
    switch (s.kind) {
      case StmtKind::kText: out_ += s.text; return Flow::kNormal;
      case StmtKind::kOutput: {
        const Value value = eval(*s.expr);
        out_ += at(s.pos, [&] { return to_str(value); });
        return Flow::kNormal;
      }
      case StmtKind::kIf:
        for (const auto& [condition, body] : s.branches) {
          if (!condition || truthy(eval(*condition))) return exec(body);
        }
        return Flow::kNormal;
      case StmtKind::kFor: return exec_for(s);
      case StmtKind::kSet: {
        const Value value = eval(*s.expr);
        if (s.attribute.empty()) {
          bind(s.targets, value, s.pos);
          return Flow::kNormal;
        }
        const Value ns = lookup(s.targets[0]);
        if (ns.kind != Kind::kNamespace) fail(s.pos, "cannot assign attribute on non-namespace object '" + s.targets[0] + "'");
        for (auto& entry : *ns.dict) {
          if (entry.first == s.attribute) {
            entry.second = value;
            return Flow::kNormal;
          }
        }
        ns.dict->emplace_back(s.attribute, value);
        return Flow::kNormal;
      }
      case StmtKind::kSetBlock: {
        std::string saved;
        std::swap(saved, out_);
        exec(s.body);
        std::swap(saved, out_);
        scopes_.back()[s.targets[0]] = Value::of(std::move(saved));
        return Flow::kNormal;
      }
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
      case StmtKind::kScope: return exec(s.body);
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Stmt& s) {
    const Value iterable = eval(*s.expr);
    List items = at(s.pos, [&] { return iterate(iterable); });
    if (s.filter) {
      List kept;
      for (const Value& item : items) {
        scopes_.emplace_back();
        bind(s.targets, item, s.pos);
        const bool keep = truthy(eval(*s.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(s.else_body);  // not inside this loop: a break there ends an outer one
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      scopes_.emplace_back();
      bind(s.targets, items[static_cast<size_t>(i)], s.pos);
      Dict loop = {{"index", Value::of(i + 1)},        {"index0", Value::of(i)},
                   {"revindex", Value::of(n - i)},     {"revindex0", Value::of(n - i - 1)},
                   {"first", Value::of(i == 0)},       {"last", Value::of(i == n - 1)},
                   {"length", Value::of(n)},           {"depth", Value::of(int64_t{1})},
                   {"depth0", Value::of(int64_t{0})}};
      if (i > 0) loop.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < n) loop.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
      Value cycle;
      cycle.kind = Kind::kCallable;
      cycle.callable = std::make_shared<Callable>(Callable{"loop.cycle", [i](const Args& args) {
        DSCHAT_CHECK(!args.positional.empty(), InvalidArgument, "loop.cycle() needs at least one value");
        return args.positional[static_cast<size_t>(i) % args.positional.size()];
      }});
      loop.emplace_back("cycle", cycle);
      scopes_.back()["loop"] = Value::of_dict(std::move(loop));
      const Flow flow = exec(s.body);
      scopes_.pop_back();
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  // ---- expressions

  Args eval_args(const Expr& e, size_t skip) {
    Args args;
    for (size_t i = skip; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i]));
    for (const auto& [key, value] : e.kwargs) args.keyword.emplace_back(key, eval(*value));
    return args;
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kLiteral: return e.literal;
      case ExprKind::kName: return lookup(e.name);
      case ExprKind::kList:
      case ExprKind::kTuple: {
        List items;
        for (const auto& item : e.args) items.push_back(eval(*item));
        return Value::of_list(std::move(items), e.kind == ExprKind::kTuple);
      }
      case ExprKind::kDict: {
        Dict entries;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value key = eval(*e.args[i]);
          if (!key.is_string()) fail(e.args[i]->pos, std::string("dict keys must be strings here, got ") + type_name(key));
          Value item = eval(*e.args[i + 1]);
          auto same = std::find_if(entries.begin(), entries.end(), [&](const auto& x) { return x.first == key.text; });
          if (same != entries.end()) {
            same->second = std::move(item);
          } else {
            entries.emplace_back(key.text, std::move(item));
          }
        }
        return Value::of_dict(std::move(entries));
      }
      case ExprKind::kGetAttr: {
        const Value object = eval(*e.args[0]);
        return at(e.pos, [&] { return get_attribute(object, e.name); });
      }
      case ExprKind::kGetItem: {
        const Value object = eval(*e.args[0]);
        const Value key = eval(*e.args[1]);
        return at(e.pos, [&] { return get_item(object, key); });
      }
      case ExprKind::kSlice: return slice(e);
      case ExprKind::kCall: {
        const Value callee = eval(*e.args[0]);
        if (callee.kind != Kind::kCallable) {
          fail(e.pos, (callee.is_undefined() && !callee.text.empty() ? callee.text : std::string("the value")) +
                          " is not callable");
        }
        const Args args = eval_args(e, 1);
        return at(e.pos, [&] { return callee.callable->call(args); });
      }
      case ExprKind::kFilter: {
        const Value operand = eval(*e.args[0]);
        const Args args = eval_args(e, 1);
        return at(e.pos, [&] { return apply_filter(e.name, operand, args); });
      }
      case ExprKind::kTest: {
        const Value operand = eval(*e.args[0]);
        const Args args = eval_args(e, 1);
        return Value::of(at(e.pos, [&] { return apply_test(e.name, operand, args); }));
      }
      case ExprKind::kUnary: {
        const Value operand = eval(*e.args[0]);
        if (e.name == "not") return Value::of(!truthy(operand));
        if (!operand.is_number()) fail(e.pos, std::string("bad operand type for unary ") + e.name + ": '" + type_name(operand) + "'");
        if (e.name == "+") return operand.kind == Kind::kBool ? Value::of(as_integer(operand)) : operand;
        return operand.kind == Kind::kFloat ? Value::of(-operand.number) : Value::of(-as_integer(operand));
      }
      case ExprKind::kBinary: {
        if (e.name == "and" || e.name == "or") {
          Value left = eval(*e.args[0]);
          if (truthy(left) == (e.name == "or")) return left;
          return eval(*e.args[1]);
        }
        const Value left = eval(*e.args[0]);
        const Value right = eval(*e.args[1]);
        if (e.name == "~") return Value::of(at(e.pos, [&] { return to_str(left) + to_str(right); }));
        return arithmetic(e, left, right);
      }
      case ExprKind::kCompare: {
        Value left = eval(*e.args[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1]);
          const std::string& op = e.ops[i];
          const bool holds = at(e.pos, [&] {
            if (op == "==") return equal(left, right);
            if (op == "!=") return !equal(left, right);
            if (op == "in") return contains(right, left);
            if (op == "notin") return !contains(right, left);
            const int order = compare(left, right, op);
            return op == "<" ? order < 0 : op == "<=" ? order <= 0 : op == ">" ? order > 0 : order >= 0;
          });
          if (!holds) return Value::of(false);
          left = std::move(right);
        }
        return Value::of(true);
      }
      case ExprKind::kCondition:
        if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("the conditional expression's missing else");
    }
    fail(e.pos, "unknown expression");
  }

  Value arithmetic(const Expr& e, const Value& a, const Value& b) {
    const std::string& op = e.name;
    const auto unsupported = [&]() {
      if (a.is_undefined() || b.is_undefined()) {
        const Value& u = a.is_undefined() ? a : b;
        fail(e.pos, (u.text.empty() ? std::string("a value") : u.text) + " is undefined (operator '" + op + "')");
      }
      fail(e.pos, "unsupported operand types for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
    };
    if (a.is_number() && b.is_number()) {
      const bool floats = a.kind == Kind::kFloat || b.kind == Kind::kFloat;
      const int64_t x = as_integer(a), y = as_integer(b);
      const double fx = as_double(a), fy = as_double(b);
      if (op == "+") return floats ? Value::of(fx + fy) : Value::of(x + y);
      if (op == "-") return floats ? Value::of(fx - fy) : Value::of(x - y);
      if (op == "*") return floats ? Value::of(fx * fy) : Value::of(x * y);
      if ((op == "/" || op == "//" || op == "%") && (floats ? fy == 0.0 : y == 0)) fail(e.pos, "division by zero");
      if (op == "/") return Value::of(fx / fy);
      if (op == "//") {
        if (floats) return Value::of(std::floor(fx / fy));
        const int64_t q = x / y;
        return Value::of((x % y != 0 && ((x < 0) != (y < 0))) ? q - 1 : q);
      }
      if (op == "%") {
        if (floats) {
          const double r = std::fmod(fx, fy);
          return Value::of(r != 0.0 && ((r < 0) != (fy < 0)) ? r + fy : r);
        }
        const int64_t r = x % y;
        return Value::of(r != 0 && ((r < 0) != (y < 0)) ? r + y : r);
      }
      if (op == "**") {
        if (!floats && y >= 0) {
          int64_t result = 1;
          for (int64_t k = 0; k < y; ++k) result *= x;
          return Value::of(result);
        }
        return Value::of(std::pow(fx, fy));
      }
    }
    if (op == "+" && a.is_string() && b.is_string()) return Value::of(a.text + b.text);
    if (op == "+" && a.is_sequence() && a.kind == b.kind) {
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::of_list(std::move(items), a.kind == Kind::kTuple);
    }
    if (op == "*" && (b.is_string() || b.is_sequence()) && (a.kind == Kind::kInt || a.kind == Kind::kBool)) {
      return arithmetic(e, b, a);  // n * "ab" == "ab" * n
    }
    if (op == "*" && (a.is_string() || a.is_sequence()) && (b.kind == Kind::kInt || b.kind == Kind::kBool)) {
      const int64_t times = as_integer(b);
      if (times > 100000) fail(e.pos, "repetition of more than 100000 times");
      if (a.is_string()) {
        std::string out;
        for (int64_t k = 0; k < times; ++k) out += a.text;
        return Value::of(out);
      }
      List items;
      for (int64_t k = 0; k < times; ++k) items.insert(items.end(), a.list->begin(), a.list->end());
      return Value::of_list(std::move(items), a.kind == Kind::kTuple);
    }
    if (op == "%" && a.is_string()) {
      DSCHAT_THROW(Unsupported, where(origin_, e.pos), ": '%' string formatting is not supported by dschat's Jinja subset");
    }
    unsupported();
    return Value();
  }

  Value slice(const Expr& e) {
    const Value target = eval(*e.args[0]);
    std::optional<int64_t> bound[3];
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      const Value v = eval(*e.args[k + 1]);
      if (v.kind == Kind::kNone) continue;
      if (v.kind != Kind::kInt && v.kind != Kind::kBool) fail(e.pos, std::string("slice indices must be integers, got ") + type_name(v));
      bound[k] = as_integer(v);
    }
    const int64_t step = bound[2].value_or(1);
    if (step == 0) fail(e.pos, "slice step cannot be zero");
    std::vector<uint32_t> points;
    int64_t n = 0;
    if (target.is_string()) {
      points = code_points(target.text);
      n = static_cast<int64_t>(points.size());
    } else if (target.is_sequence()) {
      n = static_cast<int64_t>(target.list->size());
    } else {
      fail(e.pos, std::string("cannot slice a value of type '") + type_name(target) + "'");
    }
    const auto adjust = [&](std::optional<int64_t> index, int64_t fallback) {
      if (!index) return fallback;
      int64_t i = *index < 0 ? *index + n : *index;
      return step > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
    };
    const int64_t start = adjust(bound[0], step > 0 ? 0 : n - 1), stop = adjust(bound[1], step > 0 ? n : -1);
    std::vector<size_t> picked;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picked.push_back(static_cast<size_t>(i));
    if (target.is_string()) {
      std::vector<uint32_t> out;
      for (size_t i : picked) out.push_back(points[i]);
      return Value::of(utf8(out));
    }
    List out;
    for (size_t i : picked) out.push_back((*target.list)[i]);
    return Value::of_list(std::move(out), target.kind == Kind::kTuple);
  }

  const std::string& origin_;
  std::vector<std::unordered_map<std::string, Value>> scopes_;
  std::string out_;
};

}  // namespace evaluator_detail

std::string render(const Body& body, const Dict& variables, const std::string& origin) {
  return evaluator_detail::Evaluator(variables, origin).run(body);
}

}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
