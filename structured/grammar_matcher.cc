#include "structured/grammar_matcher.h"

#include <algorithm>
#include <utility>

namespace llm::structured {
namespace {

bool TestBit(const uint32_t* bitmask, int32_t id) { return (bitmask[id >> 5] >> (id & 31)) & 1; }
void SetBit(uint32_t* bitmask, int32_t id) { bitmask[id >> 5] |= uint32_t{1} << (id & 31); }

}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), parser_(&grammar_->automaton(), &pool_) {
  Step start;
  parser_.Start(grammar_->automaton().root_start(), StackPool::kBottom, &start.state);
  start.pool_size = pool_.size();
  history_.push_back(std::move(start));
  scratch_.resize(grammar_->tokenizer().max_token_length() + 1);
}

GrammarMatcher::GrammarMatcher(const GrammarMatcher& other)
    : grammar_(other.grammar_),
      pool_(other.pool_),
      parser_(&grammar_->automaton(), &pool_),
      history_(other.history_),
      scratch_(other.scratch_.size()) {}

bool GrammarMatcher::AcceptToken(int32_t token_id) {
  const TokenizerInfo& tok = grammar_->tokenizer();
  if (IsTerminated() || token_id < 0 || token_id >= tok.vocab_size()) return false;
  if (tok.is_stop(token_id)) {
    if (!CanTerminate()) return false;
    Step step = history_.back();
    step.terminated = true;
    history_.push_back(std::move(step));
    return true;
  }
  if (tok.is_special(token_id) || token_id >= tok.num_tokens()) return false;
  const std::string_view bytes = tok.token_bytes(token_id);
  return !bytes.empty() && AcceptBytes(bytes);
}

bool GrammarMatcher::AcceptString(std::string_view bytes) {
  return !IsTerminated() && AcceptBytes(bytes);
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  const int32_t mark = pool_.size();
  ParseState cur = history_.back().state;
  ParseState next;
  for (char c : bytes) {
    parser_.Advance(cur, static_cast<uint8_t>(c), &next);
    if (!next.alive()) {
      pool_.Truncate(mark);
      return false;
    }
    std::swap(cur, next);
  }
  history_.push_back({std::move(cur), pool_.size(), false});
  return true;
}

void GrammarMatcher::Rollback(int32_t num_steps) {
  num_steps = std::clamp(num_steps, 0, this->num_steps());
  history_.resize(history_.size() - num_steps);
  pool_.Truncate(history_.back().pool_size);
}

void GrammarMatcher::FillNextTokenBitmask(uint32_t* bitmask) {
  const TokenizerInfo& tok = grammar_->tokenizer();
  std::fill(bitmask, bitmask + tok.bitmask_words(), 0);
  if (IsTerminated()) return;
  const ParseState& state = history_.back().state;
  const int32_t mark = pool_.size();
  // Tops at the same position share their accepted set; their uncertain tokens are checked
  // against each one's own stack.
  std::vector<int32_t> done_positions;
  for (int32_t top : state.tops) {
    const int32_t pos = pool_.node(top).pos;
    const CompiledGrammar::TokenSets& sets = grammar_->token_sets(pos);
    if (std::find(done_positions.begin(), done_positions.end(), pos) == done_positions.end()) {
      done_positions.push_back(pos);
      if (!sets.accepted_bitmask.empty()) {
        for (int32_t w = 0; w < tok.bitmask_words(); ++w) bitmask[w] |= sets.accepted_bitmask[w];
      }
      for (int32_t id : sets.accepted_ids) SetBit(bitmask, id);
    }
    CheckUncertain(top, sets, bitmask);
  }
  if (state.can_end) {
    for (int32_t id : tok.stop_token_ids()) SetBit(bitmask, id);
  }
  pool_.Truncate(mark);
}

void GrammarMatcher::CheckUncertain(int32_t top, const CompiledGrammar::TokenSets& sets,
                                    uint32_t* bitmask) {
  const TokenizerInfo& tok = grammar_->tokenizer();
  const std::vector<int32_t>& sorted = tok.sorted_ids();
  const std::vector<int32_t>& lcp = tok.sorted_lcp();
  scratch_[0].tops.assign(1, top);
  scratch_[0].can_end = false;
  size_t valid = 0;         // scratch_[0..valid] hold the parse of a prefix of the next token
  std::string_view walked;  // the last token walked
  for (const CompiledGrammar::IndexRange& range : sets.uncertain) {
    size_t i = range.begin;
    const std::string_view first = tok.sorted_bytes(i);
    size_t common = 0;
    while (common < std::min({valid, walked.size(), first.size()}) &&
           walked[common] == first[common]) {
      ++common;
    }
    valid = common;
    while (i < range.end) {
      if (i > range.begin) valid = std::min(valid, static_cast<size_t>(lcp[i]));
      if (TestBit(bitmask, sorted[i])) {  // allowed already (another top's accepted set)
        ++i;
        continue;
      }
      const std::string_view bytes = tok.sorted_bytes(i);
      size_t d = valid;
      while (d < bytes.size() && !scratch_[d].tops.empty()) {
        parser_.Advance(scratch_[d], static_cast<uint8_t>(bytes[d]), &scratch_[d + 1]);
        ++d;
      }
      valid = d;
      walked = bytes;
      if (d == bytes.size()) {
        if (scratch_[d].alive()) SetBit(bitmask, sorted[i]);
        ++i;
      } else {  // the first d bytes are dead: so is every token that starts with them
        i = tok.SkipPrefix(i, static_cast<int32_t>(d));
      }
    }
  }
}

}  // namespace llm::structured
