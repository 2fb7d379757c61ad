// The parse of a byte string by a GrammarAutomaton: the set of stacks that are still alive.
//
// A stack is a chain of StackPool nodes, each (position, parent): the top node is where the
// innermost rule is, its parent is where the caller continues once that rule returns, down to
// the bottom (parent kBottom). Nodes are interned, so equal stacks are one node and a state is
// a set of node ids. A ParseState holds the *closed* set: calls entered and returns taken, so
// each top is a node whose position has byte edges; can_end says a stack returned past its
// bottom frame. For the matcher the bottom frame is the root rule (can_end: the text is
// complete); for the precomputation of compiled_grammar.h it is one position whose callers are
// unknown (can_end: the rest of the token depends on them).
//
// Left recursion is refused when the automaton is built, so closing a state terminates.
// Not thread-safe: one parser and one pool per thread (matchers own theirs).
#ifndef LLM_STRUCTURED_PUSHDOWN_PARSER_H_
#define LLM_STRUCTURED_PUSHDOWN_PARSER_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "structured/grammar_automaton.h"

namespace llm::structured {

class StackPool {
 public:
  static constexpr int32_t kBottom = -1;
  struct Node {
    int32_t pos;
    int32_t parent;  // a node id or kBottom
  };

  int32_t Intern(int32_t pos, int32_t parent) {
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
    auto [it, inserted] = index_.try_emplace(key, static_cast<int32_t>(nodes_.size()));
    if (inserted) nodes_.push_back({pos, parent});
    return it->second;
  }
  Node node(int32_t id) const { return nodes_[id]; }
  int32_t size() const { return static_cast<int32_t>(nodes_.size()); }
  // Forgets the nodes interned since size() was `size` (no state may still hold them).
  void Truncate(int32_t size);

 private:
  std::vector<Node> nodes_;
  absl::flat_hash_map<uint64_t, int32_t> index_;
};

struct ParseState {
  std::vector<int32_t> tops;  // node ids whose positions have byte edges; no duplicates
  bool can_end = false;       // a stack returned from its bottom frame
  bool alive() const { return !tops.empty() || can_end; }
};

class PushdownParser {
 public:
  PushdownParser(const GrammarAutomaton* automaton, StackPool* pool)
      : automaton_(automaton), pool_(pool) {}

  // The closed state of a stack whose top is at `pos` and whose rest is `parent`.
  void Start(int32_t pos, int32_t parent, ParseState* out);
  // The state after `byte` from `from` (out is overwritten; it must not be `from`). Dead (not
  // alive) when no stack can take the byte.
  void Advance(const ParseState& from, uint8_t byte, ParseState* out);

 private:
  void BeginStep(ParseState* out);
  // Adds to `out` the closure of `node`: the node if its position has byte edges, the rules it
  // calls (entered), and its parent when its position is accepting (the rule returns).
  void Close(int32_t node, ParseState* out);

  const GrammarAutomaton* automaton_;
  StackPool* pool_;
  std::vector<uint32_t> seen_;  // per node id: the step that last visited it
  uint32_t step_ = 0;
  std::vector<int32_t> work_;
};

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_PUSHDOWN_PARSER_H_
