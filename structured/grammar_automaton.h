// GrammarAutomaton: a Grammar compiled to a pushdown automaton over bytes.
//
// Each rule becomes a nondeterministic automaton without epsilon edges whose states are the
// grammar's *positions*. A position has byte edges (consume one byte of a set, go to a target
// position of the same rule), rule edges (call a rule; when the call returns, continue at the
// target position) and may be accepting (the rule can return from it). A parse is a stack of
// positions: the top is where the innermost rule is, each one below is where its caller
// continues (grammar_parser.h).
//
//   rule r:   start ──[0-9]──▶ p1 ──"."──▶ p2 ...        positions, one id space for all rules
//                    ──call s──▶ p3 (accepting)
//
// Build checks what would make the parse loop or dead-end, and refuses it with
// INVALID_ARGUMENT: a rule reference out of range, left recursion (a rule that can call itself
// before consuming a byte), a root that matches no string, and an automaton over the size
// limit. Edges into parts that can never complete (a rule that matches nothing) are removed, so
// that every position the parser reaches can still be completed: a token is allowed exactly
// when the parse survives its bytes.
//
// Immutable once built; safe to share between threads.
#ifndef LLM_STRUCTURED_GRAMMAR_AUTOMATON_H_
#define LLM_STRUCTURED_GRAMMAR_AUTOMATON_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "structured/byte_set.h"
#include "structured/grammar.h"

namespace llm::structured {

class GrammarAutomaton {
 public:
  // The most positions one grammar may compile to (repetition counts multiply them).
  static constexpr int32_t kMaxPositions = 100000;

  struct ByteEdge {
    ByteSet bytes;
    int32_t target;
  };
  struct RuleEdge {
    int32_t rule;
    int32_t target;  // where the caller continues when `rule` returns
  };

  static absl::StatusOr<GrammarAutomaton> Build(const Grammar& grammar);

  int32_t num_positions() const { return static_cast<int32_t>(positions_.size()); }
  int32_t root_start() const { return rule_start_[root_]; }
  int32_t rule_start(int32_t rule) const { return rule_start_[rule]; }
  bool accepting(int32_t pos) const { return positions_[pos].accepting; }
  // Reachable from the root rule's start (the others never appear in a parse).
  bool reachable(int32_t pos) const { return positions_[pos].reachable; }
  int32_t rule_of(int32_t pos) const { return positions_[pos].rule; }
  const std::string& rule_name(int32_t rule) const { return rule_names_[rule]; }
  // The rule can match the empty string.
  bool nullable(int32_t rule) const { return nullable_[rule]; }

  std::span<const ByteEdge> byte_edges(int32_t pos) const {
    const Position& p = positions_[pos];
    return {byte_edges_.data() + p.byte_begin, byte_edges_.data() + p.byte_end};
  }
  std::span<const RuleEdge> rule_edges(int32_t pos) const {
    const Position& p = positions_[pos];
    return {rule_edges_.data() + p.rule_begin, rule_edges_.data() + p.rule_end};
  }

 private:
  struct Position {
    int32_t rule = 0;
    bool accepting = false;
    bool reachable = false;
    uint32_t byte_begin = 0, byte_end = 0;
    uint32_t rule_begin = 0, rule_end = 0;
  };
  friend class AutomatonBuilder;

  std::vector<Position> positions_;
  std::vector<ByteEdge> byte_edges_;
  std::vector<RuleEdge> rule_edges_;
  std::vector<int32_t> rule_start_;
  std::vector<std::string> rule_names_;
  std::vector<bool> nullable_;
  int32_t root_ = 0;
};

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_GRAMMAR_AUTOMATON_H_
