// CompiledGrammar: a grammar's automaton together with, for each of its positions, the tokens
// of a vocabulary that position decides by itself. This is what makes a token bitmask cheap.
//
// For a position p with byte edges, every token falls in one of three sets, computed once by
// walking the vocabulary's prefix tree (TokenizerInfo::sorted_ids) from a stack holding only p:
//   accepted:  some parse consumes all of the token's bytes without returning from p's rule
//              (or returns exactly at its last byte): allowed whatever the stack below p is;
//   rejected:  every parse dies before the token ends without having returned from p's rule:
//              refused whatever the stack below p is;
//   uncertain: the rest; some parse returns from p's rule with bytes left, so the answer
//              depends on the callers (checked at run time against the real stack).
// The matcher's mask is then the union over its stack tops of `accepted`, plus the uncertain
// tokens that survive a parse of their bytes from that top (grammar_matcher.h). This is
// xgrammar's split into context-independent and context-dependent tokens, computed per position
// of our per-rule automata; rules that are inlined rather than referenced widen a position's
// view and shrink its uncertain set, which is why front ends inline what they can.
//
// Immutable after Compile; safe to share between threads and matchers.
#ifndef LLM_STRUCTURED_COMPILED_GRAMMAR_H_
#define LLM_STRUCTURED_COMPILED_GRAMMAR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "structured/grammar.h"
#include "structured/grammar_automaton.h"
#include "structured/tokenizer_info.h"

namespace llm::structured {

class CompiledGrammar {
 public:
  struct IndexRange {
    uint32_t begin;
    uint32_t end;
  };
  struct TokenSets {
    // Either a bitmask (bitmask_words() words) or a list of ids, whichever is smaller.
    std::vector<uint32_t> accepted_bitmask;
    std::vector<int32_t> accepted_ids;
    // Ranges [begin, end) of indices into TokenizerInfo::sorted_ids, ascending and disjoint:
    // tokens in byte order, so that a walk shares prefixes, and a whole subtree of tokens
    // that leave the rule after a common prefix is one range.
    std::vector<IndexRange> uncertain;
  };

  // INVALID_ARGUMENT from GrammarAutomaton::Build when the grammar cannot be compiled.
  static absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(
      const Grammar& grammar, std::shared_ptr<const TokenizerInfo> tokenizer);

  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;

  const GrammarAutomaton& automaton() const { return automaton_; }
  const TokenizerInfo& tokenizer() const { return *tokenizer_; }
  // For positions with byte edges that the root reaches; empty sets for the others.
  const TokenSets& token_sets(int32_t pos) const { return token_sets_[sets_of_position_[pos]]; }

  // What the precomputation found, for benchmarks and logs: the positions with byte edges the
  // root reaches, the distinct TokenSets computed for them (one more: the empty sets), and the
  // uncertain tokens of those sets summed.
  int32_t num_precomputed_positions() const { return num_precomputed_; }
  int32_t num_token_sets() const { return static_cast<int32_t>(token_sets_.size()); }
  int64_t num_uncertain_tokens() const { return num_uncertain_; }

 private:
  CompiledGrammar(GrammarAutomaton automaton, std::shared_ptr<const TokenizerInfo> tokenizer)
      : automaton_(std::move(automaton)), tokenizer_(std::move(tokenizer)) {}
  void ComputeTokenSets();

  GrammarAutomaton automaton_;
  std::shared_ptr<const TokenizerInfo> tokenizer_;
  // Positions whose automata agree for as many bytes as the longest token share one TokenSets
  // (equivalent_positions.h): the unrolled copies of a bounded repetition, mostly.
  std::vector<TokenSets> token_sets_;
  std::vector<int32_t> sets_of_position_;
  int64_t num_uncertain_ = 0;
  int32_t num_precomputed_ = 0;
};

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_COMPILED_GRAMMAR_H_
