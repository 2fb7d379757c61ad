#include "scheduler_service/chat/jinja/parser.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler_service/chat/jinja/error.h"
#include "scheduler_service/chat/jinja/python_string.h"

namespace llm::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  // Nesting (of blocks, parentheses, unary operators) deeper than this is a syntax error, not a
  // stack overflow.
  static constexpr int kMaxDepth = 200;
  struct DepthGuard {
    explicit DepthGuard(Parser* p) : parser(p) {
      if (++parser->depth_ > kMaxDepth) {
        Fail(parser->Peek().line, parser->Peek().col,
             absl::StrCat("the template nests deeper than ", kMaxDepth, " levels"));
      }
    }
    ~DepthGuard() { --parser->depth_; }
    Parser* parser;
  };

  Body ParseTemplate() {
    std::string end;
    Body body = ParseUntil({}, &end);
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& Next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::kName && Peek(ahead).text == name;
  }
  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case Tok::kEof:
        return "end of template";
      case Tok::kText:
        return "text";
      case Tok::kVarBegin:
        return "'{{'";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kBlockBegin:
        return "'{%'";
      case Tok::kBlockEnd:
        return "'%}'";
      case Tok::kString:
        return "string " + PyStrRepr(t.text);
      case Tok::kInt:
        return "integer " + std::to_string(t.ival);
      case Tok::kFloat:
        return "float";
      default:
        return "'" + t.text + "'";
    }
  }
  [[noreturn]] void Unexpected(const std::string& expected) const {
    Fail(Peek().line, Peek().col, "expected " + expected + ", got " + Describe(Peek()));
  }
  void ExpectOp(const char* op) {
    if (!IsOp(op)) Unexpected(std::string("'") + op + "'");
    Next();
  }
  void Expect(Tok kind, const char* what) {
    if (Peek().kind != kind) Unexpected(what);
    Next();
  }
  std::string ExpectName() {
    if (Peek().kind != Tok::kName) Unexpected("a name");
    return Next().text;
  }
  template <typename T>
  std::unique_ptr<T> Make(const Token& at) {
    auto n = std::make_unique<T>();
    n->line = at.line;
    n->col = at.col;
    return n;
  }

  Body ParseUntil(const std::vector<std::string>& ends, std::string* end) {
    DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& t = Peek();
      if (t.kind == Tok::kEof) {
        if (!ends.empty()) {
          std::string closing = ends[0];
          for (const std::string& e : ends)
            if (e.rfind("end", 0) == 0) closing = e;
          Fail(t.line, t.col, "unexpected end of template: expected '{% " + closing + " %}'");
        }
        return body;
      }
      if (t.kind == Tok::kText) {
        auto o = Make<Output>(t);
        o->text = t.text;
        Next();
        body.push_back(std::move(o));
      } else if (t.kind == Tok::kVarBegin) {
        auto p = Make<Print>(t);
        Next();
        p->expr = ParseTuple();
        Expect(Tok::kVarEnd, "'}}'");
        body.push_back(std::move(p));
      } else if (t.kind == Tok::kBlockBegin) {
        Next();
        const Token& name = Peek();
        if (name.kind != Tok::kName) Unexpected("a statement name");
        if (std::find(ends.begin(), ends.end(), name.text) != ends.end()) {
          *end = name.text;
          Next();
          return body;
        }
        body.push_back(ParseStatement());
      } else {
        Unexpected("text, '{{' or '{%'");
      }
    }
  }

  StmtPtr ParseStatement() {
    const Token& kw = Next();
    const std::string k = kw.text;
    if (k == "for") {
      auto f = Make<For>(kw);
      f->targets = ParseTargets();
      if (!IsName("in")) Unexpected("'in'");
      Next();
      f->iter = ParseTuple(/*with_cond=*/false);
      if (IsName("if")) {
        Next();
        f->filter = ParseExpression();
      }
      if (IsName("recursive")) {
        Next();
        f->recursive = true;
      }
      Expect(Tok::kBlockEnd, "'%}'");
      std::string end;
      f->body = ParseUntil({"endfor", "else"}, &end);
      Expect(Tok::kBlockEnd, "'%}'");
      if (end == "else") {
        f->otherwise = ParseUntil({"endfor"}, &end);
        Expect(Tok::kBlockEnd, "'%}'");
      }
      return f;
    }
    if (k == "if") {
      auto s = Make<If>(kw);
      ExprPtr cond = ParseTuple();
      Expect(Tok::kBlockEnd, "'%}'");
      while (true) {
        std::string end;
        Body body = ParseUntil({"elif", "else", "endif"}, &end);
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (end == "elif") {
          cond = ParseTuple();
          Expect(Tok::kBlockEnd, "'%}'");
          continue;
        }
        Expect(Tok::kBlockEnd, "'%}'");
        if (end == "else") {
          s->otherwise = ParseUntil({"endif"}, &end);
          Expect(Tok::kBlockEnd, "'%}'");
        }
        return s;
      }
    }
    if (k == "set") {
      auto s = Make<Set>(kw);
      s->targets.push_back(ExpectName());
      if (IsOp(".")) {
        Next();
        s->attr = ExpectName();
      } else {
        while (IsOp(",")) {
          Next();
          s->targets.push_back(ExpectName());
        }
      }
      if (IsOp("=")) {
        Next();
        s->value = ParseTuple();
        Expect(Tok::kBlockEnd, "'%}'");
        return s;
      }
      if (s->targets.size() != 1 || !s->attr.empty()) Unexpected("'='");
      Expect(Tok::kBlockEnd, "'%}'");
      std::string end;
      s->body = ParseUntil({"endset"}, &end);
      Expect(Tok::kBlockEnd, "'%}'");
      return s;
    }
    if (k == "macro") {
      auto m = Make<Macro>(kw);
      m->name = ExpectName();
      ExpectOp("(");
      m->params = ParseParams();
      Expect(Tok::kBlockEnd, "'%}'");
      std::string end;
      m->body = ParseUntil({"endmacro"}, &end);
      if (Peek().kind == Tok::kName) Next();  // {% endmacro name %}
      Expect(Tok::kBlockEnd, "'%}'");
      return m;
    }
    if (k == "call") {
      auto c = Make<CallBlock>(kw);
      c->caller.line = kw.line;
      c->caller.col = kw.col;
      c->caller.name = "caller";
      if (IsOp("(")) {
        Next();
        c->caller.params = ParseParams();
      }
      const Token& at = Peek();
      ExprPtr e = ParseExpression();
      c->call.reset(dynamic_cast<Call*>(e.get()));
      if (!c->call) Fail(at.line, at.col, "expected call");
      e.release();
      Expect(Tok::kBlockEnd, "'%}'");
      std::string end;
      c->caller.body = ParseUntil({"endcall"}, &end);
      Expect(Tok::kBlockEnd, "'%}'");
      return c;
    }
    if (k == "filter") {
      auto f = Make<FilterBlock>(kw);
      while (true) {
        std::string name = ExpectName();
        while (IsOp(".")) {
          Next();
          name += "." + ExpectName();
        }
        std::vector<Arg> args;
        if (IsOp("(")) {
          Next();
          args = ParseArgs();
        }
        f->filters.emplace_back(std::move(name), std::move(args));
        if (!IsOp("|")) break;
        Next();
      }
      Expect(Tok::kBlockEnd, "'%}'");
      std::string end;
      f->body = ParseUntil({"endfilter"}, &end);
      Expect(Tok::kBlockEnd, "'%}'");
      return f;
    }
    if (k == "with") {
      auto w = Make<With>(kw);
      while (Peek().kind != Tok::kBlockEnd) {
        std::string name = ExpectName();
        ExpectOp("=");
        w->assigns.emplace_back(std::move(name), ParseExpression());
        if (Peek().kind != Tok::kBlockEnd) ExpectOp(",");
      }
      Next();
      std::string end;
      w->body = ParseUntil({"endwith"}, &end);
      Expect(Tok::kBlockEnd, "'%}'");
      return w;
    }
    if (k == "break" || k == "continue") {
      auto s = Make<LoopControl>(kw);
      s->flow = k == "break" ? Flow::kBreak : Flow::kContinue;
      Expect(Tok::kBlockEnd, "'%}'");
      return s;
    }
    if (k == "generation") {
      auto b = Make<Block>(kw);
      Expect(Tok::kBlockEnd, "'%}'");
      std::string end;
      b->body = ParseUntil({"endgeneration"}, &end);
      Expect(Tok::kBlockEnd, "'%}'");
      return b;
    }
    Fail(kw.line, kw.col, "unknown or unexpected tag '" + k + "'");
  }

  // A macro's parameters, after '(' up to and including ')'.
  std::vector<std::pair<std::string, ExprPtr>> ParseParams() {
    std::vector<std::pair<std::string, ExprPtr>> params;
    while (!IsOp(")")) {
      std::string p = ExpectName();
      ExprPtr dflt;
      if (IsOp("=")) {
        Next();
        dflt = ParseExpression();
      }
      params.emplace_back(p, std::move(dflt));
      if (!IsOp(")")) ExpectOp(",");
    }
    Next();
    return params;
  }

  std::vector<std::string> ParseTargets() {
    std::vector<std::string> out;
    bool paren = IsOp("(");
    if (paren) Next();
    out.push_back(ExpectName());
    while (IsOp(",")) {
      Next();
      out.push_back(ExpectName());
    }
    if (paren) ExpectOp(")");
    return out;
  }

  // An expression, or a tuple of them ("a, b").
  ExprPtr ParseTuple(bool with_cond = true) {
    const Token& at = Peek();
    ExprPtr e = with_cond ? ParseExpression() : ParseOr();
    if (!IsOp(",")) return e;
    auto list = Make<ListExpr>(at);
    list->tuple = true;
    list->items.push_back(std::move(e));
    while (IsOp(",")) {
      Next();
      if (Peek().kind == Tok::kBlockEnd || Peek().kind == Tok::kVarEnd) break;
      list->items.push_back(with_cond ? ParseExpression() : ParseOr());
    }
    return list;
  }

  ExprPtr ParseExpression() {
    DepthGuard guard(this);
    const Token& at = Peek();
    ExprPtr e = ParseOr();
    if (!IsName("if")) return e;
    Next();
    auto c = Make<CondExpr>(at);
    c->then = std::move(e);
    c->cond = ParseOr();
    if (IsName("else")) {
      Next();
      c->otherwise = ParseExpression();
    }
    return c;
  }

  ExprPtr MakeBinary(const Token& at, std::string op, ExprPtr l, ExprPtr r) {
    auto b = Make<Binary>(at);
    b->op = std::move(op);
    b->left = std::move(l);
    b->right = std::move(r);
    return b;
  }

  ExprPtr ParseOr() {
    ExprPtr e = ParseAnd();
    while (IsName("or")) {
      const Token& at = Next();
      e = MakeBinary(at, "or", std::move(e), ParseAnd());
    }
    return e;
  }
  ExprPtr ParseAnd() {
    ExprPtr e = ParseNot();
    while (IsName("and")) {
      const Token& at = Next();
      e = MakeBinary(at, "and", std::move(e), ParseNot());
    }
    return e;
  }
  ExprPtr ParseNot() {
    DepthGuard guard(this);
    if (IsName("not")) {
      auto u = Make<Unary>(Next());
      u->op = "not";
      u->operand = ParseNot();
      return u;
    }
    return ParseCompare();
  }
  ExprPtr ParseCompare() {
    const Token& at = Peek();
    ExprPtr e = ParseMath1();
    std::unique_ptr<CompareExpr> c;
    while (true) {
      std::string op;
      if (Peek().kind == Tok::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
           Peek().text == "<=" || Peek().text == ">" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "notin";
      } else {
        break;
      }
      if (!c) {
        c = Make<CompareExpr>(at);
        c->first = std::move(e);
      }
      c->rest.emplace_back(op, ParseMath1());
    }
    if (c) return c;
    return e;
  }
  ExprPtr ParseMath1() {
    ExprPtr e = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token& at = Next();
      e = MakeBinary(at, at.text, std::move(e), ParseConcat());
    }
    return e;
  }
  ExprPtr ParseConcat() {
    ExprPtr e = ParseMath2();
    while (IsOp("~")) {
      const Token& at = Next();
      e = MakeBinary(at, "~", std::move(e), ParseMath2());
    }
    return e;
  }
  ExprPtr ParseMath2() {
    ExprPtr e = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& at = Next();
      e = MakeBinary(at, at.text, std::move(e), ParsePow());
    }
    return e;
  }
  ExprPtr ParsePow() {
    ExprPtr e = ParseUnary(true);
    while (IsOp("**")) {
      const Token& at = Next();
      e = MakeBinary(at, "**", std::move(e), ParseUnary(true));
    }
    return e;
  }
  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      auto u = Make<Unary>(Peek());
      u->op = Next().text;
      u->operand = ParseUnary(false);
      e = std::move(u);
    } else {
      e = ParsePrimary();
    }
    e = ParsePostfix(std::move(e));
    if (with_filter) e = ParseFilterExpr(std::move(e));
    return e;
  }

  ExprPtr ParsePrimary() {
    const Token& t = Peek();
    if (t.kind == Tok::kName) {
      Next();
      auto lit = Make<Literal>(t);
      if (t.text == "true" || t.text == "True") {
        lit->value = true;
      } else if (t.text == "false" || t.text == "False") {
        lit->value = false;
      } else if (t.text == "none" || t.text == "None") {
        lit->value = Value::MakeNone();
      } else {
        auto n = Make<Name>(t);
        n->name = t.text;
        return n;
      }
      return lit;
    }
    if (t.kind == Tok::kString) {
      auto lit = Make<Literal>(t);
      std::string s;
      while (Peek().kind == Tok::kString) s += Next().text;
      lit->value = s;
      return lit;
    }
    if (t.kind == Tok::kInt || t.kind == Tok::kFloat) {
      Next();
      auto lit = Make<Literal>(t);
      lit->value = t.kind == Tok::kInt ? Value(t.ival) : Value(t.fval);
      return lit;
    }
    if (IsOp("(")) {
      Next();
      if (IsOp(")")) {
        Next();
        auto empty = Make<ListExpr>(t);
        empty->tuple = true;
        return empty;
      }
      ExprPtr e = ParseExpression();
      if (IsOp(",")) {
        auto list = Make<ListExpr>(t);
        list->tuple = true;
        list->items.push_back(std::move(e));
        while (IsOp(",")) {
          Next();
          if (IsOp(")")) break;
          list->items.push_back(ParseExpression());
        }
        e = std::move(list);
      }
      ExpectOp(")");
      return e;
    }
    if (IsOp("[")) {
      Next();
      auto list = Make<ListExpr>(t);
      while (!IsOp("]")) {
        list->items.push_back(ParseExpression());
        if (!IsOp("]")) ExpectOp(",");
      }
      Next();
      return list;
    }
    if (IsOp("{")) {
      Next();
      auto dict = Make<DictExpr>(t);
      while (!IsOp("}")) {
        ExprPtr k = ParseExpression();
        ExpectOp(":");
        ExprPtr v = ParseExpression();
        dict->items.emplace_back(std::move(k), std::move(v));
        if (!IsOp("}")) ExpectOp(",");
      }
      Next();
      return dict;
    }
    Unexpected("an expression");
  }

  std::vector<Arg> ParseArgs() {  // after '('
    std::vector<Arg> args;
    while (!IsOp(")")) {
      Arg a;
      if (Peek().kind == Tok::kName && IsOp("=", 1)) {
        a.name = Next().text;
        Next();
      }
      a.value = ParseExpression();
      args.push_back(std::move(a));
      if (!IsOp(")")) ExpectOp(",");
    }
    Next();
    return args;
  }

  ExprPtr ParsePostfix(ExprPtr e) {
    while (true) {
      const Token& at = Peek();
      if (IsOp(".")) {
        Next();
        auto g = Make<GetAttr>(at);
        g->obj = std::move(e);
        if (Peek().kind == Tok::kInt) {
          auto item = Make<GetItem>(at);
          item->obj = std::move(g->obj);
          auto lit = Make<Literal>(Peek());
          lit->value = Next().ival;
          item->index = std::move(lit);
          e = std::move(item);
          continue;
        }
        g->name = ExpectName();
        e = std::move(g);
      } else if (IsOp("[")) {
        Next();
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) parts[k] = ParseExpression();
          if (k < 2 && IsOp(":")) {
            Next();
            slice = true;
          } else {
            break;
          }
        }
        ExpectOp("]");
        if (slice) {
          auto s = Make<SliceExpr>(at);
          s->obj = std::move(e);
          s->start = std::move(parts[0]);
          s->stop = std::move(parts[1]);
          s->step = std::move(parts[2]);
          e = std::move(s);
        } else {
          if (!parts[0]) Fail(at.line, at.col, "expected a subscript");
          auto g = Make<GetItem>(at);
          g->obj = std::move(e);
          g->index = std::move(parts[0]);
          e = std::move(g);
        }
      } else if (IsOp("(")) {
        Next();
        auto c = Make<Call>(at);
        c->line = e->line;  // errors point at the callee's name
        c->col = e->col;
        c->callee = std::move(e);
        c->args = ParseArgs();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr ParseFilterExpr(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        const Token& at = Next();
        auto f = Make<FilterExpr>(at);
        f->input = std::move(e);
        f->name = ExpectName();
        while (IsOp(".")) {
          Next();
          f->name += "." + ExpectName();
        }
        if (IsOp("(")) {
          Next();
          f->args = ParseArgs();
        }
        e = std::move(f);
      } else if (IsName("is")) {
        const Token& at = Next();
        auto t = Make<TestExpr>(at);
        t->input = std::move(e);
        if (IsName("not")) {
          Next();
          t->negated = true;
        }
        t->name = ExpectName();
        if (IsOp("(")) {
          Next();
          t->args = ParseArgs();
        } else {
          const Token& p = Peek();
          bool arg_start =
              p.kind == Tok::kString || p.kind == Tok::kInt || p.kind == Tok::kFloat || IsOp("[") ||
              IsOp("{") ||
              (p.kind == Tok::kName && p.text != "else" && p.text != "or" && p.text != "and" &&
               p.text != "if" && p.text != "in" && p.text != "not" && p.text != "is");
          if (arg_start) {
            Arg a;
            a.value = ParsePostfix(ParsePrimary());
            t->args.push_back(std::move(a));
          }
        }
        e = std::move(t);
      } else if (IsOp("(")) {
        // A call on a filtered value, e.g. (x|attr)(...): rare; as jinja2 does.
        const Token& at = Next();
        auto c = Make<Call>(at);
        c->callee = std::move(e);
        c->args = ParseArgs();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Body ParseTokens(std::vector<Token> tokens) { return Parser(std::move(tokens)).ParseTemplate(); }

}  // namespace llm::jinja
