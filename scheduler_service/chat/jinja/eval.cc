#include "scheduler_service/chat/jinja/eval.h"

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "scheduler_service/chat/jinja/builtins.h"
#include "scheduler_service/chat/jinja/methods.h"
#include "scheduler_service/chat/jinja/operators.h"

namespace llm::jinja {

Value Ctx::Lookup(const std::string& name) const {
  for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
    auto hit = it->find(name);
    if (hit != it->end()) return hit->second;
  }
  if (const Value* v = context->Find(name)) return *v;
  Value g = Global(name);
  if (!g.is_undefined()) return g;
  return Value::MakeUndefined("'" + name + "' is undefined");
}

void ExecBody(const Body& body, Ctx& ctx) {
  for (const StmtPtr& s : body) {
    s->Exec(ctx);
    if (ctx.flow != Flow::kNormal) return;
  }
}

namespace {

constexpr char kLoopCall[] = "__call__";

// Runs `body` with ctx.out pointed at a string of its own; the string.
std::string Capture(const Body& body, Ctx& ctx) {
  std::string captured;
  std::string* saved = ctx.out;
  ctx.out = &captured;
  struct Restore {
    Ctx& ctx;
    std::string* out;
    ~Restore() { ctx.out = out; }
  } restore{ctx, saved};
  ExecBody(body, ctx);
  return captured;
}

CallArgs EvalArgs(const std::vector<Arg>& args, Ctx& ctx) {
  CallArgs out;
  for (const Arg& a : args) {
    if (a.name.empty()) {
      out.positional.push_back(a.value->Eval(ctx));
    } else {
      out.keyword.emplace_back(a.name, a.value->Eval(ctx));
    }
  }
  return out;
}

void Assign(const Node& at, Ctx& ctx, const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    ctx.Set(targets[0], v);
    return;
  }
  std::vector<Value> items;
  try {
    items = Iterate(v);
  } catch (CallError& e) {
    at.Error("cannot unpack: " + e.message);
  }
  if (items.size() != targets.size())
    at.Error(
        absl::StrCat("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
  for (size_t i = 0; i < targets.size(); ++i) ctx.Set(targets[i], items[i]);
}

}  // namespace

// Expressions.

Value Literal::Eval(Ctx&) const { return value; }

Value Name::Eval(Ctx& ctx) const { return ctx.Lookup(name); }

Value ListExpr::Eval(Ctx& ctx) const {
  ValueList out;
  for (const ExprPtr& e : items) out.push_back(e->Eval(ctx));
  return tuple ? Value::MakeTuple(std::move(out)) : Value(std::move(out));
}

Value DictExpr::Eval(Ctx& ctx) const {
  ValueDict out;
  for (const auto& [k, v] : items) {
    Value key = k->Eval(ctx);
    if (!key.Hashable()) k->Error("unhashable type: '" + key.TypeName() + "'");
    out.Set(std::move(key), v->Eval(ctx));
  }
  return out;
}

Value GetAttr::Eval(Ctx& ctx) const {
  Value o = obj->Eval(ctx);
  try {
    return GetAttrValue(o, name);
  } catch (CallError& e) {
    Error(e.message);
  }
}

Value GetItem::Eval(Ctx& ctx) const {
  Value o = obj->Eval(ctx);
  Value k = index->Eval(ctx);
  try {
    return GetItemValue(o, k);
  } catch (CallError& e) {
    Error(e.message);
  }
}

Value SliceExpr::Eval(Ctx& ctx) const {
  Value o = obj->Eval(ctx);
  Value a = start ? start->Eval(ctx) : Value();
  Value b = stop ? stop->Eval(ctx) : Value();
  Value c = step ? step->Eval(ctx) : Value();
  try {
    if (o.is_undefined()) UndefinedError(o);
    if (o.is_list()) {
      ValueList out;
      for (int64_t i : SliceIndices(static_cast<int64_t>(o.list().size()), a, b, c))
        out.push_back(o.list()[i]);
      return o.is_tuple() ? Value::MakeTuple(std::move(out)) : Value(std::move(out));
    }
    if (o.is_string()) {
      std::vector<std::string_view> cs = SplitUtf8Chars(o.as_string());
      std::string out;
      for (int64_t i : SliceIndices(static_cast<int64_t>(cs.size()), a, b, c)) out += cs[i];
      return out;
    }
    throw CallError{"'" + o.TypeName() + "' object is not subscriptable"};
  } catch (CallError& e) {
    Error(e.message);
  }
}

Value Call::Eval(Ctx& ctx) const { return EvalWith(ctx, {}); }

Value Call::EvalWith(Ctx& ctx, std::vector<std::pair<std::string, Value>> extra) const {
  Value fn;
  CallArgs call_args;
  auto eval_args = [&] {
    call_args = EvalArgs(args, ctx);
    for (auto& kv : extra) call_args.keyword.push_back(std::move(kv));
  };
  try {
    if (auto* attr = dynamic_cast<const GetAttr*>(callee.get())) {
      Value obj = attr->obj->Eval(ctx);
      if (obj.is_undefined()) UndefinedError(obj);
      if (HasMethod(obj, attr->name)) {
        eval_args();
        bool found = false;
        return CallMethod(obj, attr->name, call_args, &found);
      }
      fn = GetAttrValue(obj, attr->name);
    } else {
      fn = callee->Eval(ctx);
    }
    if (fn.is_undefined()) UndefinedError(fn);
    // The loop object of a recursive loop is a dict that is also callable.
    if (fn.is_dict() && !fn.dict().is_namespace) {
      if (const Value* call = fn.dict().Find(kLoopCall)) fn = *call;
    }
    if (!fn.is_callable()) throw CallError{"'" + fn.TypeName() + "' object is not callable"};
    eval_args();
    return fn.callable().fn(call_args);
  } catch (CallError& e) {
    Error(e.message);
  }
}

Value FilterExpr::Eval(Ctx& ctx) const {
  Value in = input->Eval(ctx);
  CallArgs a = EvalArgs(args, ctx);
  try {
    return ApplyFilter(name, in, a, ctx);
  } catch (CallError& e) {
    Error(e.message);
  }
}

Value TestExpr::Eval(Ctx& ctx) const {
  Value in = input->Eval(ctx);
  CallArgs a = EvalArgs(args, ctx);
  try {
    return ApplyTest(name, in, a, ctx) != negated;
  } catch (CallError& e) {
    Error(e.message);
  }
}

Value Unary::Eval(Ctx& ctx) const {
  Value v = operand->Eval(ctx);
  if (op == "not") return !v.Truthy();
  if (v.is_undefined()) Error(v.undefined_name());
  if (v.is_int()) {
    if (op == "-" && v.as_int() == std::numeric_limits<int64_t>::min())
      Error("integer overflow in unary '-' (integers are 64-bit here)");
    return op == "-" ? -v.as_int() : v.as_int();
  }
  if (v.is_float()) return op == "-" ? -v.as_float() : v.as_float();
  if (v.is_bool()) return int64_t{op == "-" ? -int64_t{v.as_bool()} : int64_t{v.as_bool()}};
  Error("bad operand type for unary " + op + ": '" + v.TypeName() + "'");
}

Value Binary::Eval(Ctx& ctx) const {
  if (op == "and") {
    Value l = left->Eval(ctx);
    return l.Truthy() ? right->Eval(ctx) : l;
  }
  if (op == "or") {
    Value l = left->Eval(ctx);
    return l.Truthy() ? l : right->Eval(ctx);
  }
  Value l = left->Eval(ctx);
  Value r = right->Eval(ctx);
  Value v;
  try {
    v = op == "~" ? Value(l.Str() + r.Str()) : Arith(op, l, r);
  } catch (CallError& e) {
    Error(e.message);
  }
  // Doubling a string or list in a loop must not exhaust memory before the output limit.
  const int64_t size = v.is_string() ? static_cast<int64_t>(v.as_string().size())
                       : v.is_list() ? static_cast<int64_t>(v.list().size())
                                     : 0;
  if (size > ctx.limits.max_output_bytes) {
    throw JinjaError{line, col,
                     absl::StrCat("a value of the template exceeds ", ctx.limits.max_output_bytes,
                                  " bytes or items"),
                     true};
  }
  return v;
}

Value CompareExpr::Eval(Ctx& ctx) const {
  Value l = first->Eval(ctx);
  for (const auto& [op, e] : rest) {
    Value r = e->Eval(ctx);
    bool ok;
    try {
      if (op == "==")
        ok = Equal(l, r);
      else if (op == "!=")
        ok = !Equal(l, r);
      else if (op == "in")
        ok = Contains(r, l);
      else if (op == "notin")
        ok = !Contains(r, l);
      else {
        int c = Compare(l, r, op.c_str());
        ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
      }
    } catch (CallError& err) {
      Error(err.message);
    }
    if (!ok) return false;
    l = std::move(r);
  }
  return true;
}

Value CondExpr::Eval(Ctx& ctx) const {
  if (cond->Eval(ctx).Truthy()) return then->Eval(ctx);
  if (otherwise) return otherwise->Eval(ctx);
  return Value::MakeUndefined("the inline if expression evaluated to false and no else was given");
}

// Statements.

void Output::Exec(Ctx& ctx) const { ctx.Write(*this, text); }

void Print::Exec(Ctx& ctx) const { ctx.Write(*this, expr->Eval(ctx).Str()); }

void If::Exec(Ctx& ctx) const {
  for (const auto& [cond, body] : branches) {
    if (cond->Eval(ctx).Truthy()) {
      ExecBody(body, ctx);
      return;
    }
  }
  ExecBody(otherwise, ctx);
}

void For::Exec(Ctx& ctx) const { Run(ctx, iter->Eval(ctx), 0); }

void For::Run(Ctx& ctx, const Value& seq, int depth) const {
  std::vector<Value> items;
  try {
    items = Iterate(seq);
  } catch (CallError& e) {
    iter->Error(e.message);
  }
  ctx.frames.emplace_back();
  if (filter) {
    std::vector<Value> kept;
    for (Value& item : items) {
      ctx.CountIteration(*this);
      Assign(*this, ctx, targets, item);
      if (filter->Eval(ctx).Truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  // loop.changed(x): true when x differs from the value of its last call in this loop.
  auto last_changed = std::make_shared<std::optional<Value>>();
  const Value changed = Value::MakeCallable("changed", [last_changed](CallArgs& args) -> Value {
    Value now = Value::MakeTuple(args.positional);
    if (last_changed->has_value() && Equal(**last_changed, now)) return false;
    *last_changed = std::move(now);
    return true;
  });
  for (int64_t i = 0; i < n; ++i) {
    ctx.CountIteration(*this);
    ctx.frames.back().clear();  // as jinja2: what the body sets lasts one iteration
    ValueDict loop;
    loop.Set("index", i + 1);
    loop.Set("index0", i);
    loop.Set("revindex", n - i);
    loop.Set("revindex0", n - i - 1);
    loop.Set("first", i == 0);
    loop.Set("last", i == n - 1);
    loop.Set("length", n);
    loop.Set("depth", depth + 1);
    loop.Set("depth0", depth);
    loop.Set("previtem", i > 0 ? items[i - 1] : Value::MakeUndefined("there is no previous item"));
    loop.Set("nextitem", i + 1 < n ? items[i + 1] : Value::MakeUndefined("there is no next item"));
    loop.Set("cycle", Value::MakeCallable("cycle", [i](CallArgs& args) -> Value {
               if (args.positional.empty()) throw CallError{"no items for cycling given"};
               return args.positional[i % args.positional.size()];
             }));
    loop.Set("changed", changed);
    if (recursive) {
      Ctx* c = &ctx;
      loop.Set(kLoopCall, Value::MakeCallable("loop", [c, this, depth](CallArgs& args) -> Value {
                 if (args.positional.size() != 1) throw CallError{"loop() takes one iterable"};
                 if (c->depth >= c->limits.max_call_depth) {
                   throw JinjaError{line, col,
                                    absl::StrCat("recursive loops nested deeper than ",
                                                 c->limits.max_call_depth),
                                    true};
                 }
                 std::string captured;
                 std::string* saved = c->out;
                 c->out = &captured;
                 ++c->depth;
                 struct Restore {
                   Ctx* c;
                   std::string* out;
                   ~Restore() {
                     c->out = out;
                     --c->depth;
                   }
                 } restore{c, saved};
                 Run(*c, args.positional[0], depth + 1);
                 return captured;
               }));
    }
    ctx.Set("loop", Value(std::move(loop)));
    Assign(*this, ctx, targets, items[i]);
    ExecBody(body, ctx);
    if (ctx.flow == Flow::kBreak) {
      ctx.flow = Flow::kNormal;
      break;
    }
    ctx.flow = Flow::kNormal;
  }
  ctx.frames.pop_back();
  if (n == 0) ExecBody(otherwise, ctx);
}

void LoopControl::Exec(Ctx& ctx) const { ctx.flow = flow; }

void Set::Exec(Ctx& ctx) const {
  Value v;
  if (value) {
    v = value->Eval(ctx);
  } else {
    v = Capture(body, ctx);
  }
  if (!attr.empty()) {
    Value ns = ctx.Lookup(targets[0]);
    if (!ns.is_dict() || !ns.dict().is_namespace)
      Error("cannot assign attribute on non-namespace object '" + targets[0] + "'");
    ns.dict().Set(attr, std::move(v));
    return;
  }
  Assign(*this, ctx, targets, v);
}

void Macro::Exec(Ctx& ctx) const {
  Ctx* c = &ctx;
  const Macro* self = this;
  ctx.Set(name, Value::MakeCallable(
                    name, [c, self](CallArgs& args) -> Value { return self->Invoke(*c, args); }));
}

Value Macro::Invoke(Ctx& ctx, CallArgs& args, const std::vector<Frame>* closure) const {
  if (ctx.depth >= ctx.limits.max_call_depth) {
    throw JinjaError{line, col,
                     absl::StrCat("macro calls nested deeper than ", ctx.limits.max_call_depth),
                     true};
  }
  if (args.positional.size() > params.size())
    throw CallError{
        absl::StrCat("macro '", name, "' takes not more than ", params.size(), " argument(s)")};
  absl::flat_hash_map<std::string, Value> frame;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [pname, dflt] = params[i];
    Value v = Value::MakeUndefined("'" + pname + "' is undefined");
    bool given = false;
    if (i < args.positional.size()) {
      v = args.positional[i];
      given = true;
    }
    for (auto& [k, kv] : args.keyword) {
      if (k == pname) {
        v = kv;
        given = true;
      }
    }
    if (!given && dflt) v = dflt->Eval(ctx);
    frame[pname] = std::move(v);
  }
  for (auto& [k, kv] : args.keyword) {
    bool known = false;
    for (const auto& p : params) known |= p.first == k;
    // A call block passes the macro its body as `caller`.
    if (k == "caller" && !known) {
      frame[k] = kv;
      continue;
    }
    if (!known) throw CallError{"macro '" + name + "' takes no keyword argument '" + k + "'"};
  }
  std::vector<Frame> saved_frames;
  saved_frames.swap(ctx.frames);
  if (closure != nullptr) {
    ctx.frames = *closure;
  } else {
    ctx.frames.push_back(saved_frames.front());
  }
  ctx.frames.push_back(std::move(frame));
  std::string captured;
  std::string* saved_out = ctx.out;
  ctx.out = &captured;
  ++ctx.depth;
  struct Restore {
    Ctx& ctx;
    std::vector<Frame>& frames;
    std::string* out;
    bool closure;
    ~Restore() {
      if (!closure) frames.front() = std::move(ctx.frames.front());
      ctx.frames.swap(frames);
      ctx.out = out;
      --ctx.depth;
      ctx.flow = Flow::kNormal;
    }
  } restore{ctx, saved_frames, saved_out, closure != nullptr};
  ExecBody(body, ctx);
  return captured;
}

void Block::Exec(Ctx& ctx) const { ExecBody(body, ctx); }

void CallBlock::Exec(Ctx& ctx) const {
  // The body sees the names of where the call block is, as a closure in jinja2 does.
  auto closure = std::make_shared<const std::vector<Frame>>(ctx.frames);
  Ctx* c = &ctx;
  const Macro* body = &caller;
  Value fn = Value::MakeCallable("caller", [c, body, closure](CallArgs& args) -> Value {
    return body->Invoke(*c, args, closure.get());
  });
  ctx.Write(*this, call->EvalWith(ctx, {{"caller", std::move(fn)}}).Str());
}

void FilterBlock::Exec(Ctx& ctx) const {
  Value v = Capture(body, ctx);
  for (const auto& [name, args] : filters) {
    CallArgs a = EvalArgs(args, ctx);
    try {
      v = ApplyFilter(name, v, a, ctx);
    } catch (CallError& e) {
      Error(e.message);
    }
  }
  ctx.Write(*this, v.Str());
}

void With::Exec(Ctx& ctx) const {
  Frame frame;
  for (const auto& [name, value] : assigns) frame[name] = value->Eval(ctx);
  ctx.frames.push_back(std::move(frame));
  struct Pop {
    Ctx& ctx;
    ~Pop() { ctx.frames.pop_back(); }
  } pop{ctx};
  ExecBody(body, ctx);
}

}  // namespace llm::jinja
