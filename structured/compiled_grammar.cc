#include "structured/compiled_grammar.h"

#include <algorithm>
#include <utility>

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

}  // namespace

void CompiledGrammar::ComputeTokenSets() {
  const TokenizerInfo& tok = *tokenizer_;
  const std::vector<int32_t>& ids = tok.sorted_ids();
  const std::vector<int32_t>& lcp = tok.sorted_lcp();
  const std::vector<int32_t> classes = EquivalentPositions(automaton_, tok.max_token_length());
  std::vector<int32_t> set_of_class(automaton_.num_positions(), -1);
  sets_of_position_.assign(automaton_.num_positions(), 0);
  token_sets_.emplace_back();  // 0: the empty sets of positions never on top of a stack
  StackPool pool;
  PushdownParser parser(&automaton_, &pool);
  // states[d]: after the first d bytes of the token being walked; returned[d]: some parse
  // returned from the position's rule within those d bytes.
  std::vector<ParseState> states(tok.max_token_length() + 1);
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
    const int32_t mark = pool.size();
    states[0].tops.assign(1, pool.Intern(pos, StackPool::kBottom));
    states[0].can_end = false;
    size_t valid = 0;  // states[0..valid] hold the previous token's prefix
    for (size_t i = 0; i < ids.size();) {
      const std::string_view bytes = tok.sorted_bytes(i);
      size_t d = std::min(valid, static_cast<size_t>(lcp[i]));
      while (d < bytes.size() && !states[d].tops.empty()) {
        parser.Advance(states[d], static_cast<uint8_t>(bytes[d]), &states[d + 1]);
        returned[d + 1] = returned[d] || states[d + 1].can_end;
        ++d;
      }
      valid = d;
      if (d == bytes.size()) {
        if (states[d].alive()) {
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
    pool.Truncate(mark);
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
