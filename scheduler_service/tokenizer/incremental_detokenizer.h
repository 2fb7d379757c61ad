// The IncrementalDetokenizer of scheduler_service/core/detokenizer.h over a Tokenizer, and
// its factory. As vLLM's detokenizer (and the Hugging Face library's DecodeStream): each new
// token is decoded together with a short window of the previous ones (starting with the
// last few prompt tokens, so a Metaspace tokenizer's word-initial space comes out right),
// and text is released only when the window's decode grew and does not end in U+FFFD (an
// incomplete UTF-8 character). Stop strings are applied to the released text by a
// StopStringMatcher, from the options' min_tokens-th token on. Flush releases held tokens as the
// decoder renders them (U+FFFD for incomplete characters). Not thread-safe: one per sequence.
// Shares ownership of the Tokenizer.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/types.h"
#include "scheduler_service/core/detokenizer.h"
#include "scheduler_service/tokenizer/stop_string_matcher.h"
#include "scheduler_service/tokenizer/tokenizer.h"

namespace llm {

class TokenizerIncrementalDetokenizer final : public IncrementalDetokenizer {
 public:
  TokenizerIncrementalDetokenizer(std::shared_ptr<const Tokenizer> tokenizer,
                                  std::span<const TokenId> prompt_token_ids,
                                  const DetokenizeOptions& options);

  Delta Append(std::span<const TokenId> new_token_ids) override;
  std::string Flush() override;
  const std::string& output_text() const override { return output_text_; }

 private:
  // Adds one token; returns the text it makes final (before stop strings).
  std::string Step(TokenId id);
  // The text of the held tokens ids_[read_index_, end), given the window's decode.
  std::string HeldText(const std::string& window_text) const;

  std::shared_ptr<const Tokenizer> tokenizer_;
  bool skip_special_tokens_;
  int min_tokens_;      // stop strings are searched from this many tokens appended on
  int num_tokens_ = 0;  // tokens appended
  // ids_[0, read_index_) decode to prefix_text_, which has been released; the rest are
  // tokens whose text is still incomplete.
  std::vector<TokenId> ids_;
  size_t read_index_ = 0;
  std::string prefix_text_;
  StopStringMatcher stops_;
  std::string output_text_;
  bool finished_ = false;
};

class TokenizerDetokenizerFactory final : public DetokenizerFactory {
 public:
  explicit TokenizerDetokenizerFactory(std::shared_ptr<const Tokenizer> tokenizer)
      : tokenizer_(std::move(tokenizer)) {}
  std::unique_ptr<IncrementalDetokenizer> Create(std::span<const TokenId> prompt_token_ids,
                                                 const DetokenizeOptions& options) const override;

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
