// The syntax tree that the parser builds and Render walks: expressions (Eval gives a value) and
// statements (Exec writes output). Each node keeps its line and column for errors. The methods
// are defined in eval.cc.
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_AST_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "scheduler_service/chat/jinja/error.h"
#include "scheduler_service/chat/jinja/value.h"

namespace llm::jinja {

struct Ctx;

struct Node {
  int line = 0;
  int col = 0;
  virtual ~Node() = default;
  [[noreturn]] void Error(std::string message) const { Fail(line, col, std::move(message)); }
};

struct Expr : Node {
  virtual Value Eval(Ctx& ctx) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Stmt : Node {
  virtual void Exec(Ctx& ctx) const = 0;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// What the statements just run ask of the loop around them.
enum class Flow { kNormal, kBreak, kContinue };

struct Arg {
  std::string name;  // empty: positional
  ExprPtr value;
};

// Expressions.

struct Literal : Expr {
  Value value;
  Value Eval(Ctx& ctx) const override;
};

struct Name : Expr {
  std::string name;
  Value Eval(Ctx& ctx) const override;
};

struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  bool tuple = false;
  Value Eval(Ctx& ctx) const override;
};

struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value Eval(Ctx& ctx) const override;
};

struct GetAttr : Expr {
  ExprPtr obj;
  std::string name;
  Value Eval(Ctx& ctx) const override;
};

struct GetItem : Expr {
  ExprPtr obj;
  ExprPtr index;
  Value Eval(Ctx& ctx) const override;
};

struct SliceExpr : Expr {
  ExprPtr obj, start, stop, step;
  Value Eval(Ctx& ctx) const override;
};

struct Call : Expr {
  ExprPtr callee;
  std::vector<Arg> args;
  Value Eval(Ctx& ctx) const override;
  // The call with `extra` keyword arguments after those written (a call block's `caller`).
  Value EvalWith(Ctx& ctx, std::vector<std::pair<std::string, Value>> extra) const;
};

struct FilterExpr : Expr {
  ExprPtr input;
  std::string name;
  std::vector<Arg> args;
  Value Eval(Ctx& ctx) const override;
};

struct TestExpr : Expr {
  ExprPtr input;
  std::string name;
  std::vector<Arg> args;
  bool negated = false;
  Value Eval(Ctx& ctx) const override;
};

struct Unary : Expr {
  std::string op;
  ExprPtr operand;
  Value Eval(Ctx& ctx) const override;
};

struct Binary : Expr {
  std::string op;
  ExprPtr left, right;
  Value Eval(Ctx& ctx) const override;
};

struct CompareExpr : Expr {
  ExprPtr first;
  std::vector<std::pair<std::string, ExprPtr>> rest;
  Value Eval(Ctx& ctx) const override;
};

struct CondExpr : Expr {
  ExprPtr cond, then, otherwise;
  Value Eval(Ctx& ctx) const override;
};

// Statements.

struct Output : Stmt {
  std::string text;
  void Exec(Ctx& ctx) const override;
};

struct Print : Stmt {
  ExprPtr expr;
  void Exec(Ctx& ctx) const override;
};

struct If : Stmt {
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body otherwise;
  void Exec(Ctx& ctx) const override;
};

struct For : Stmt {
  std::vector<std::string> targets;
  ExprPtr iter;
  ExprPtr filter;
  Body body;
  Body otherwise;
  bool recursive = false;  // `loop(items)` runs the loop over items, one level deeper
  void Exec(Ctx& ctx) const override;
  void Run(Ctx& ctx, const Value& seq, int depth) const;
};

struct LoopControl : Stmt {
  Flow flow;
  void Exec(Ctx& ctx) const override;
};

struct Set : Stmt {
  std::vector<std::string> targets;
  std::string attr;  // set targets[0].attr = ...
  ExprPtr value;
  Body body;  // block set
  void Exec(Ctx& ctx) const override;
};

using Frame = absl::flat_hash_map<std::string, Value>;

struct Macro : Stmt {
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  Body body;
  void Exec(Ctx& ctx) const override;
  // Runs the body with the arguments bound over the template's top-level names, or over
  // `closure` (the scopes where a call block's caller was written) when given.
  Value Invoke(Ctx& ctx, CallArgs& args, const std::vector<Frame>* closure = nullptr) const;
};

// {% call(params) macro(args) %}body{% endcall %}: the macro, called with `caller`, a macro of
// `params` that renders the body.
struct CallBlock : Stmt {
  std::unique_ptr<Call> call;
  Macro caller;
  void Exec(Ctx& ctx) const override;
};

// {% filter f(args)|g %}body{% endfilter %}: the body's output through the filters.
struct FilterBlock : Stmt {
  std::vector<std::pair<std::string, std::vector<Arg>>> filters;
  Body body;
  void Exec(Ctx& ctx) const override;
};

// {% with a = x, b = y %}body{% endwith %}: the body in a scope of its own where the names are
// the values (computed in the scope outside).
struct With : Stmt {
  std::vector<std::pair<std::string, ExprPtr>> assigns;
  Body body;
  void Exec(Ctx& ctx) const override;
};

struct Block : Stmt {  // {% generation %}: its body
  Body body;
  void Exec(Ctx& ctx) const override;
};

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_AST_H_
