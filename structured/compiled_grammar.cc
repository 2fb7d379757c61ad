#include "structured/compiled_grammar.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "structured/equivalent_positions.h"
#include "structured/pushdown_parser.h"

namespace llm::structured {

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::Compile(
    const Grammar& grammar, std::shared_ptr<const TokenizerInfo> tokenizer) {
  absl::StatusOr<GrammarAutomaton> automaton = GrammarAutomaton::Build(grammar);
  if (!automaton.ok()) return automaton.status();
  std::shared_ptr<CompiledGrammar> compiled(
      new CompiledGrammar(std::move(automaton).value(), std::move(tokenizer)));
  compiled->ComputeTokenSets();
  return std::shared_ptr<const CompiledGrammar>(std::move(compiled));
}

namespace {

void AddRange(std::vector<CompiledGrammar::IndexRange>* ranges, size_t begin, size_t end) {
  if (!ranges->empty() && ranges->back().end == begin) {
    ranges->back().end = static_cast<uint32_t>(end);
  } else {
    ranges->push_back({static_cast<uint32_t>(begin), static_cast<uint32_t>(end)});
  }
}

// The parse states the precomputation meets, interned, with their transitions cached. The same
// few states recur at every depth of the walk and from position to position (one character
// into a repetition's copy is the next copy's start), so most steps are one table lookup
// instead of a closure. Ids stay valid until Clear.
class ParseStateTable {
 public:
  // More states than this (a kilobyte of transitions each) and the table is cleared between
  // positions.
  static constexpr size_t kMaxStates = 16384;

  explicit ParseStateTable(const GrammarAutomaton* automaton)
      : automaton_(automaton), parser_(automaton, &pool_) {}

  // The state whose only stack is `pos` over the bottom (not closed: the position's byte edges
  // are all the first byte may take).
  int32_t Start(int32_t pos) {
    ParseState s;
    s.tops.push_back(pool_.Intern(pos, StackPool::kBottom));
    return Intern(std::move(s));
  }
  int32_t Next(int32_t state, uint8_t byte) {
    const size_t slot = static_cast<size_t>(state) * 256 + byte;
    if (next_[slot] < 0) {
      ParseState out;
      parser_.Advance(states_[state], byte, &out);
      const int32_t id = Intern(std::move(out));
      next_[slot] = id;
    }
    return next_[slot];
  }
  bool has_tops(int32_t state) const { return !states_[state].tops.empty(); }
  bool can_end(int32_t state) const { return states_[state].can_end; }
  bool alive(int32_t state) const { return states_[state].alive(); }
  size_t size() const { return states_.size(); }
  void Clear() {
    pool_ = StackPool();
    parser_ = PushdownParser(automaton_, &pool_);
    states_.clear();
    next_.clear();
    index_.clear();
  }

 private:
  int32_t Intern(ParseState s) {
    std::sort(s.tops.begin(), s.tops.end());
    std::vector<int32_t> key = s.tops;
    key.push_back(s.can_end ? 1 : 0);
    auto [it, inserted] = index_.try_emplace(std::move(key), static_cast<int32_t>(states_.size()));
    if (inserted) {
      states_.push_back(std::move(s));
      next_.resize(next_.size() + 256, -1);
    }
    return it->second;
  }

  const GrammarAutomaton* automaton_;
  StackPool pool_;
  PushdownParser parser_;
  std::vector<ParseState> states_;
  std::vector<int32_t> next_;  // [state][byte]: the next state, -1 not computed yet
  absl::flat_hash_map<std::vector<int32_t>, int32_t> index_;
};

}  // namespace

void CompiledGrammar::ComputeTokenSets() {
  const TokenizerInfo& tok = *tokenizer_;
  const std::vector<int32_t>& ids = tok.sorted_ids();
  const std::vector<int32_t>& lcp = tok.sorted_lcp();
  const std::vector<int32_t> classes = EquivalentPositions(automaton_, tok.max_token_length());
  std::vector<int32_t> set_of_class(automaton_.num_positions(), -1);
  sets_of_position_.assign(automaton_.num_positions(), 0);
  token_sets_.emplace_back();  // 0: the empty sets of positions never on top of a stack
  ParseStateTable table(&automaton_);
  // states[d]: after the first d bytes of the token being walked; returned[d]: some parse
  // returned from the position's rule within those d bytes.
  std::vector<int32_t> states(tok.max_token_length() + 1);
  std::vector<bool> returned(tok.max_token_length() + 1, false);
  std::vector<int32_t> accepted;
  for (int32_t pos = 0; pos < automaton_.num_positions(); ++pos) {
    if (!automaton_.reachable(pos) || automaton_.byte_edges(pos).empty()) continue;
    ++num_precomputed_;
    int32_t& shared = set_of_class[classes[pos]];
    if (shared >= 0) {
      sets_of_position_[pos] = shared;
      continue;
    }
    shared = sets_of_position_[pos] = static_cast<int32_t>(token_sets_.size());
    TokenSets& sets = token_sets_.emplace_back();
    accepted.clear();
    if (table.size() > ParseStateTable::kMaxStates) table.Clear();
    states[0] = table.Start(pos);
    size_t valid = 0;  // states[0..valid] hold the previous token's prefix
    for (size_t i = 0; i < ids.size();) {
      const std::string_view bytes = tok.sorted_bytes(i);
      size_t d = std::min(valid, static_cast<size_t>(lcp[i]));
      while (d < bytes.size() && table.has_tops(states[d])) {
        states[d + 1] = table.Next(states[d], static_cast<uint8_t>(bytes[d]));
        returned[d + 1] = returned[d] || table.can_end(states[d + 1]);
        ++d;
      }
      valid = d;
      if (d == bytes.size()) {
        if (table.alive(states[d])) {
          accepted.push_back(ids[i]);
        } else if (returned[d - 1]) {
          AddRange(&sets.uncertain, i, i + 1);
        }
        ++i;
        continue;
      }
      // The first d bytes leave no stack inside the position's rule: every token that starts
      // with them is decided alike, uncertain if a parse returned from the rule on the way.
      const size_t end = tok.SkipPrefix(i, static_cast<int32_t>(d));
      if (returned[d]) AddRange(&sets.uncertain, i, end);
      i = end;
    }
    for (const IndexRange& r : sets.uncertain) num_uncertain_ += r.end - r.begin;
    if (static_cast<int64_t>(accepted.size()) > tok.bitmask_words()) {
      sets.accepted_bitmask.assign(tok.bitmask_words(), 0);
      for (int32_t id : accepted) sets.accepted_bitmask[id >> 5] |= uint32_t{1} << (id & 31);
    } else {
      sets.accepted_ids = accepted;
      std::sort(sets.accepted_ids.begin(), sets.accepted_ids.end());
    }
  }
}

}  // namespace llm::structured
