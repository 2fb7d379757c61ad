#include "structured/grammar_automaton.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace llm::structured {

// Builds the automaton in three steps: a Thompson automaton (with epsilon edges) per rule, the
// epsilon edges removed (each kept state takes the edges of its epsilon closure), then the
// analyses over the whole grammar (nullable rules, completable positions, left recursion,
// reachability).
class AutomatonBuilder {
 public:
  absl::StatusOr<GrammarAutomaton> Build(const Grammar& grammar) {
    const int32_t num_rules = static_cast<int32_t>(grammar.rules().size());
    if (grammar.root() < 0 || grammar.root() >= num_rules) {
      return absl::InvalidArgumentError("the grammar has no root rule");
    }
    out_.root_ = grammar.root();
    for (const Grammar::Rule& rule : grammar.rules()) {
      if (absl::Status s = CheckReferences(rule.body, num_rules); !s.ok()) return s;
    }
    const std::vector<Expr> bodies = InlineSmallRules(grammar);
    // Local edges first: per rule, positions with targets in local ids.
    std::vector<std::vector<LocalPosition>> rules(num_rules);
    int32_t total = 0;
    for (int32_t r = 0; r < num_rules; ++r) {
      out_.rule_names_.push_back(grammar.rules()[r].name);
      states_.clear();
      NewState();  // 0: start
      NewState();  // 1: end
      if (absl::Status s = AddExpr(grammar, bodies[r], 0, 1); !s.ok()) return s;
      rules[r] = RemoveEpsilons();
      total += static_cast<int32_t>(rules[r].size());
      if (total > GrammarAutomaton::kMaxPositions) return TooLarge();
    }
    Flatten(rules);
    ComputeNullable();
    if (absl::Status s = PruneIncompletable(); !s.ok()) return s;
    if (absl::Status s = CheckLeftRecursion(); !s.ok()) return s;
    MarkReachable();
    out_.nullable_ = nullable_;
    return std::move(out_);
  }

 private:
  struct State {
    std::vector<GrammarAutomaton::ByteEdge> bytes;
    std::vector<GrammarAutomaton::RuleEdge> calls;
    std::vector<int32_t> eps;
  };
  struct LocalPosition {
    bool accepting = false;
    std::vector<GrammarAutomaton::ByteEdge> bytes;
    std::vector<GrammarAutomaton::RuleEdge> calls;
  };

  static absl::Status TooLarge() {
    return absl::InvalidArgumentError(
        absl::StrCat("the grammar is too large: over ", GrammarAutomaton::kMaxPositions,
                     " automaton states (a repetition count {m,n} or a length bound too large?)"));
  }

  // A rule that is not recursive and whose body (after its own inlining) has at most this many
  // Expr nodes is copied into the rules that reference it. Its positions then see past its
  // end, so the tokens that cross it are decided when compiling instead of checked each step
  // (a `ws` rule of a user grammar, say); larger rules stay shared, which keeps compiling cheap.
  static constexpr int64_t kInlineMaxNodes = 24;

  static absl::Status CheckReferences(const Expr& e, int32_t num_rules) {
    if (e.kind == Expr::Kind::kRule && (e.rule < 0 || e.rule >= num_rules)) {
      return absl::InvalidArgumentError(absl::StrCat("reference to an undefined rule #", e.rule));
    }
    for (const Expr& item : e.items) {
      if (absl::Status s = CheckReferences(item, num_rules); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  static void CollectReferences(const Expr& e, std::vector<int32_t>* out) {
    if (e.kind == Expr::Kind::kRule) out->push_back(e.rule);
    for (const Expr& item : e.items) CollectReferences(item, out);
  }

  static int64_t CountNodes(const Expr& e) {
    int64_t n = 1;
    for (const Expr& item : e.items) n += CountNodes(item);
    return n;
  }

  // The rule bodies with references to small non-recursive rules replaced by those bodies.
  static std::vector<Expr> InlineSmallRules(const Grammar& grammar) {
    const int32_t n = static_cast<int32_t>(grammar.rules().size());
    std::vector<std::vector<int32_t>> refs(n);
    for (int32_t r = 0; r < n; ++r) CollectReferences(grammar.rules()[r].body, &refs[r]);
    // recursive[r]: r reaches itself through references.
    std::vector<bool> recursive(n, false);
    for (int32_t r = 0; r < n; ++r) {
      std::vector<bool> seen(n, false);
      std::vector<int32_t> stack = refs[r];
      while (!stack.empty() && !recursive[r]) {
        const int32_t q = stack.back();
        stack.pop_back();
        if (q == r) recursive[r] = true;
        if (seen[q]) continue;
        seen[q] = true;
        stack.insert(stack.end(), refs[q].begin(), refs[q].end());
      }
    }
    // Callees before callers: a non-recursive rule's references are all to rules done before.
    std::vector<Expr> bodies(n);
    std::vector<int> state(n, 0);  // 0 to do, 1 in progress, 2 done
    std::vector<bool> inlinable(n, false);
    std::function<void(int32_t)> visit = [&](int32_t r) {
      if (state[r] != 0) return;
      state[r] = 1;
      for (int32_t q : refs[r]) {
        if (!recursive[q]) visit(q);
      }
      bodies[r] = grammar.rules()[r].body;
      Substitute(&bodies[r], bodies, inlinable, recursive);
      inlinable[r] = !recursive[r] && CountNodes(bodies[r]) <= kInlineMaxNodes;
      state[r] = 2;
    };
    for (int32_t r = 0; r < n; ++r) visit(r);
    return bodies;
  }

  static void Substitute(Expr* e, const std::vector<Expr>& bodies,
                         const std::vector<bool>& inlinable, const std::vector<bool>& recursive) {
    if (e->kind == Expr::Kind::kRule) {
      if (!recursive[e->rule] && inlinable[e->rule]) *e = bodies[e->rule];
      return;
    }
    for (Expr& item : e->items) Substitute(&item, bodies, inlinable, recursive);
  }

  int32_t NewState() {
    states_.emplace_back();
    return static_cast<int32_t>(states_.size()) - 1;
  }

  // Adds edges from `from` to `to` matching `e`. Loops always get a fresh state, so that a loop
  // never lets another path through `from` repeat.
  absl::Status AddExpr(const Grammar& g, const Expr& e, int32_t from, int32_t to) {
    if (states_.size() > static_cast<size_t>(GrammarAutomaton::kMaxPositions) * 4) {
      return TooLarge();
    }
    switch (e.kind) {
      case Expr::Kind::kEmpty:
        states_[from].eps.push_back(to);
        return absl::OkStatus();
      case Expr::Kind::kBytes:
        if (!e.bytes.Empty()) states_[from].bytes.push_back({e.bytes, to});
        return absl::OkStatus();
      case Expr::Kind::kRule:
        if (e.rule < 0 || e.rule >= static_cast<int32_t>(g.rules().size())) {
          return absl::InvalidArgumentError(
              absl::StrCat("reference to an undefined rule #", e.rule));
        }
        states_[from].calls.push_back({e.rule, to});
        return absl::OkStatus();
      case Expr::Kind::kSequence: {
        int32_t cur = from;
        for (size_t i = 0; i < e.items.size(); ++i) {
          const int32_t next = i + 1 == e.items.size() ? to : NewState();
          if (absl::Status s = AddExpr(g, e.items[i], cur, next); !s.ok()) return s;
          cur = next;
        }
        if (e.items.empty()) states_[from].eps.push_back(to);
        return absl::OkStatus();
      }
      case Expr::Kind::kChoice:
        for (const Expr& item : e.items) {
          if (absl::Status s = AddExpr(g, item, from, to); !s.ok()) return s;
        }
        return absl::OkStatus();
      case Expr::Kind::kRepeat:
        return AddRepeat(g, e, from, to);
    }
    return absl::OkStatus();
  }

  absl::Status AddRepeat(const Grammar& g, const Expr& e, int32_t from, int32_t to) {
    if (e.min < 0 || (e.max != Expr::kUnbounded && e.max < e.min)) {
      return absl::InvalidArgumentError(absl::StrCat("bad repetition {", e.min, ",", e.max, "}"));
    }
    const int64_t copies = e.max == Expr::kUnbounded ? e.min + 1 : e.max;
    if (copies > GrammarAutomaton::kMaxPositions) return TooLarge();
    int32_t cur = from;
    for (int32_t i = 0; i < e.min; ++i) {
      const int32_t next = NewState();
      if (absl::Status s = AddExpr(g, e.items[0], cur, next); !s.ok()) return s;
      cur = next;
    }
    if (e.max == Expr::kUnbounded) {
      const int32_t loop = NewState();
      states_[cur].eps.push_back(loop);
      if (absl::Status s = AddExpr(g, e.items[0], loop, loop); !s.ok()) return s;
      states_[loop].eps.push_back(to);
      return absl::OkStatus();
    }
    for (int32_t i = e.min; i < e.max; ++i) {
      states_[cur].eps.push_back(to);
      const int32_t next = NewState();
      if (absl::Status s = AddExpr(g, e.items[0], cur, next); !s.ok()) return s;
      cur = next;
    }
    states_[cur].eps.push_back(to);
    return absl::OkStatus();
  }

  // The rule's positions: its start and every target of a byte or rule edge, each with the
  // edges of the states its epsilon closure reaches, accepting when the closure holds the end.
  std::vector<LocalPosition> RemoveEpsilons() {
    const int32_t n = static_cast<int32_t>(states_.size());
    std::vector<int32_t> id(n, -1);
    std::vector<int32_t> order;
    auto keep = [&](int32_t s) {
      if (id[s] < 0) {
        id[s] = static_cast<int32_t>(order.size());
        order.push_back(s);
      }
    };
    keep(0);
    for (const State& s : states_) {
      for (const auto& e : s.bytes) keep(e.target);
      for (const auto& e : s.calls) keep(e.target);
    }
    std::vector<LocalPosition> out(order.size());
    std::vector<int32_t> seen(n, -1);
    std::vector<int32_t> stack;
    for (size_t i = 0; i < order.size(); ++i) {
      LocalPosition& p = out[i];
      stack.assign(1, order[i]);
      seen[order[i]] = static_cast<int32_t>(i);
      while (!stack.empty()) {
        const int32_t s = stack.back();
        stack.pop_back();
        if (s == 1) p.accepting = true;
        for (const auto& e : states_[s].bytes) AddByteEdge(&p, e.bytes, id[e.target]);
        for (const auto& e : states_[s].calls) {
          const GrammarAutomaton::RuleEdge edge{e.rule, id[e.target]};
          if (std::find_if(p.calls.begin(), p.calls.end(), [&](const auto& c) {
                return c.rule == edge.rule && c.target == edge.target;
              }) == p.calls.end()) {
            p.calls.push_back(edge);
          }
        }
        for (int32_t t : states_[s].eps) {
          if (seen[t] != static_cast<int32_t>(i)) {
            seen[t] = static_cast<int32_t>(i);
            stack.push_back(t);
          }
        }
      }
    }
    return out;
  }

  static void AddByteEdge(LocalPosition* p, const ByteSet& bytes, int32_t target) {
    for (auto& e : p->bytes) {
      if (e.target == target) {
        e.bytes.AddAll(bytes);
        return;
      }
    }
    p->bytes.push_back({bytes, target});
  }

  void Flatten(const std::vector<std::vector<LocalPosition>>& rules) {
    int32_t base = 0;
    for (size_t r = 0; r < rules.size(); ++r) {
      out_.rule_start_.push_back(base);
      base += static_cast<int32_t>(rules[r].size());
    }
    for (size_t r = 0; r < rules.size(); ++r) {
      const int32_t b = out_.rule_start_[r];
      for (const LocalPosition& lp : rules[r]) {
        GrammarAutomaton::Position p;
        p.rule = static_cast<int32_t>(r);
        p.accepting = lp.accepting;
        p.byte_begin = static_cast<uint32_t>(out_.byte_edges_.size());
        for (const auto& e : lp.bytes) out_.byte_edges_.push_back({e.bytes, b + e.target});
        p.byte_end = static_cast<uint32_t>(out_.byte_edges_.size());
        p.rule_begin = static_cast<uint32_t>(out_.rule_edges_.size());
        for (const auto& e : lp.calls) out_.rule_edges_.push_back({e.rule, b + e.target});
        p.rule_end = static_cast<uint32_t>(out_.rule_edges_.size());
        out_.positions_.push_back(p);
      }
    }
  }

  int32_t num_rules() const { return static_cast<int32_t>(out_.rule_start_.size()); }

  // Positions of `rule` reachable from its start without consuming a byte (through calls of
  // nullable rules); calls: every rule called from them.
  void EmptyReach(int32_t rule, std::vector<int32_t>* calls, bool* reaches_accept) const {
    std::vector<int32_t> stack = {out_.rule_start_[rule]};
    std::vector<int32_t> seen = stack;
    *reaches_accept = false;
    while (!stack.empty()) {
      const int32_t p = stack.back();
      stack.pop_back();
      if (out_.accepting(p)) *reaches_accept = true;
      for (const auto& e : out_.rule_edges(p)) {
        if (calls != nullptr) calls->push_back(e.rule);
        if (nullable_[e.rule] && std::find(seen.begin(), seen.end(), e.target) == seen.end()) {
          seen.push_back(e.target);
          stack.push_back(e.target);
        }
      }
    }
  }

  void ComputeNullable() {
    nullable_.assign(num_rules(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (int32_t r = 0; r < num_rules(); ++r) {
        if (nullable_[r]) continue;
        bool accept = false;
        EmptyReach(r, nullptr, &accept);
        if (accept) nullable_[r] = changed = true;
      }
    }
  }

  // Keeps only edges into positions from which the rule can still return.
  absl::Status PruneIncompletable() {
    const int32_t n = out_.num_positions();
    std::vector<bool> ok(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (int32_t p = 0; p < n; ++p) {
        if (ok[p]) continue;
        bool good = out_.accepting(p);
        for (const auto& e : out_.byte_edges(p)) good = good || ok[e.target];
        for (const auto& e : out_.rule_edges(p)) {
          good = good || (ok[e.target] && ok[out_.rule_start_[e.rule]]);
        }
        if (good) ok[p] = changed = true;
      }
    }
    if (!ok[out_.root_start()]) {
      return absl::InvalidArgumentError(absl::StrCat("the grammar matches no string (rule '",
                                                     out_.rule_names_[out_.root_], "')"));
    }
    std::vector<GrammarAutomaton::ByteEdge> bytes;
    std::vector<GrammarAutomaton::RuleEdge> calls;
    for (int32_t p = 0; p < n; ++p) {
      GrammarAutomaton::Position& pos = out_.positions_[p];
      const uint32_t b = static_cast<uint32_t>(bytes.size());
      for (const auto& e : out_.byte_edges(p)) {
        if (ok[e.target]) bytes.push_back(e);
      }
      const uint32_t c = static_cast<uint32_t>(calls.size());
      for (const auto& e : out_.rule_edges(p)) {
        if (ok[e.target] && ok[out_.rule_start_[e.rule]]) calls.push_back(e);
      }
      pos.byte_begin = b;
      pos.byte_end = static_cast<uint32_t>(bytes.size());
      pos.rule_begin = c;
      pos.rule_end = static_cast<uint32_t>(calls.size());
    }
    out_.byte_edges_ = std::move(bytes);
    out_.rule_edges_ = std::move(calls);
    return absl::OkStatus();
  }

  absl::Status CheckLeftRecursion() {
    std::vector<std::vector<int32_t>> left_calls(num_rules());
    for (int32_t r = 0; r < num_rules(); ++r) {
      bool accept = false;
      EmptyReach(r, &left_calls[r], &accept);
    }
    // Depth-first search for a cycle: 0 unvisited, 1 on the stack, 2 done.
    std::vector<int> mark(num_rules(), 0);
    for (int32_t r = 0; r < num_rules(); ++r) {
      if (mark[r] != 0) continue;
      std::vector<std::pair<int32_t, size_t>> stack = {{r, 0}};
      mark[r] = 1;
      while (!stack.empty()) {
        auto& [rule, next] = stack.back();
        if (next == left_calls[rule].size()) {
          mark[rule] = 2;
          stack.pop_back();
          continue;
        }
        const int32_t callee = left_calls[rule][next++];
        if (mark[callee] == 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "left recursion in rule '", out_.rule_names_[callee],
              "': it can call itself before matching a byte; write the repetition with * or +"));
        }
        if (mark[callee] == 0) {
          mark[callee] = 1;
          stack.push_back({callee, 0});
        }
      }
    }
    return absl::OkStatus();
  }

  void MarkReachable() {
    std::vector<int32_t> stack = {out_.root_start()};
    out_.positions_[out_.root_start()].reachable = true;
    auto visit = [&](int32_t p) {
      if (!out_.positions_[p].reachable) {
        out_.positions_[p].reachable = true;
        stack.push_back(p);
      }
    };
    while (!stack.empty()) {
      const int32_t p = stack.back();
      stack.pop_back();
      for (const auto& e : out_.byte_edges(p)) visit(e.target);
      for (const auto& e : out_.rule_edges(p)) {
        visit(e.target);
        visit(out_.rule_start_[e.rule]);
      }
    }
  }

  std::vector<State> states_;
  std::vector<bool> nullable_;
  GrammarAutomaton out_;
};

absl::StatusOr<GrammarAutomaton> GrammarAutomaton::Build(const Grammar& grammar) {
  return AutomatonBuilder().Build(grammar);
}

}  // namespace llm::structured
