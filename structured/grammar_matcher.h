// GrammarMatcher: one sequence's progress through a compiled grammar, and the tokens it allows
// next.
//
//   GrammarMatcher m(compiled);
//   loop: m.FillNextTokenBitmask(mask);   // allowed ids: bit (id % 32) of mask[id / 32]
//         sample a token from the logits masked by `mask`;
//         m.AcceptToken(token);           // true: the grammar took it
//   until m.IsTerminated() (a stop token was accepted)
//
// The state is the pushdown parse of the bytes accepted so far (pushdown_parser.h); a token is
// allowed exactly when the parse survives its bytes, so FillNextTokenBitmask agrees with
// AcceptToken for every id. Stop tokens (TokenizerInfo::stop_token_ids) are allowed only when the
// text so far is complete (CanTerminate); special tokens never are, nor ids without bytes.
//
// Rollback undoes the last accepted tokens (a preempted or replayed sequence, speculative
// tokens that were rejected), back to the start at most. AcceptString counts as one step.
//
// A matcher is owned by one thread at a time (FillNextTokenBitmask uses scratch space);
// several matchers may share one CompiledGrammar. Copying a matcher forks the sequence.
#ifndef LLM_STRUCTURED_GRAMMAR_MATCHER_H_
#define LLM_STRUCTURED_GRAMMAR_MATCHER_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "structured/compiled_grammar.h"
#include "structured/pushdown_parser.h"

namespace llm::structured {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  GrammarMatcher(const GrammarMatcher& other);
  GrammarMatcher& operator=(const GrammarMatcher&) = delete;

  // Advances by the token's bytes (or, for a stop token, terminates). False, with the state
  // unchanged, when the token is not allowed (the mask would not have it).
  bool AcceptToken(int32_t token_id);
  // Advances by `bytes` as one step (text the caller forces, e.g. a known continuation).
  bool AcceptString(std::string_view bytes);
  // Writes tokenizer().bitmask_words() words: the ids AcceptToken would accept now. All zero
  // once terminated.
  void FillNextTokenBitmask(uint32_t* bitmask);

  // Undoes the last `num_steps` accepted tokens or strings (fewer if fewer were accepted).
  void Rollback(int32_t num_steps);
  // Back to the start.
  void Reset() { Rollback(num_steps()); }

  // The text so far is a complete match: a stop token is allowed.
  bool CanTerminate() const { return !IsTerminated() && history_.back().state.can_end; }
  // A stop token was accepted: nothing more is.
  bool IsTerminated() const { return history_.back().terminated; }
  int32_t num_steps() const { return static_cast<int32_t>(history_.size()) - 1; }
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  struct Step {
    ParseState state;
    int32_t pool_size;  // StackPool size when the step was taken
    bool terminated = false;
  };
  bool AcceptBytes(std::string_view bytes);
  // Sets in `bitmask` the uncertain tokens of `top`'s position whose bytes the parse survives.
  void CheckUncertain(int32_t top, const CompiledGrammar::TokenSets& sets, uint32_t* bitmask);

  std::shared_ptr<const CompiledGrammar> grammar_;
  StackPool pool_;
  PushdownParser parser_;
  std::vector<Step> history_;  // history_[0]: the start; back(): now
  std::vector<ParseState> scratch_;
};

}  // namespace llm::structured

#endif  // LLM_STRUCTURED_GRAMMAR_MATCHER_H_
