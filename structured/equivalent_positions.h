// Positions of a GrammarAutomaton that no token can tell apart, found so that their token sets
// (compiled_grammar.h) are computed once.
//
// A bounded repetition unrolls into copies: [a-z]{0,200} is 200 positions that differ only in
// how many letters remain. A token of at most `horizon` bytes cannot see further than `horizon`
// letters, so the copies with more left than that decide every token alike. This is partition
// refinement (Moore's algorithm for automaton minimisation) stopped after as many rounds as a
// walk of `horizon` bytes can take edges of the position's rule: each round splits positions
// whose accepting flag or edges (byte set, target class; called rule, target class) differ.
// Calls of rules that may match nothing take an edge without a byte; when such calls can follow
// each other without end (a loop of them), nothing is merged.
#ifndef LLM_STRUCTURED_EQUIVALENT_POSITIONS_H_
#define LLM_STRUCTURED_EQUIVALENT_POSITIONS_H_

#include <cstdint>
#include <vector>

#include "structured/grammar_automaton.h"

namespace llm::structured {

// A class id per position: positions with one id give every byte string of at most `horizon`
// bytes the same outcome from a stack that has them on top, whatever is below.
std::vector<int32_t> EquivalentPositions(const GrammarAutomaton& automaton, int32_t horizon);

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_EQUIVALENT_POSITIONS_H_
