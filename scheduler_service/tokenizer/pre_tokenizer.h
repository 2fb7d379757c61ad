// The `pre_tokenizer` of a tokenizer.json: splits normalized text into the words the BPE
// model sees. Supported types: ByteLevel (add_prefix_space, use_regex with GPT-2's
// pattern; maps bytes to GPT-2's byte-level alphabet), Split (String or Regex pattern,
// behaviors Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous; invert),
// Metaspace (replacement, prepend_scheme first/always/never, split), Digits and Sequence.
// Others (Whitespace, WhitespaceSplit, BertPreTokenizer, Punctuation, CharDelimiterSplit,
// UnicodeScripts) fail to load with an error naming them.
// Immutable after parsing; PreTokenize is thread-safe.
#ifndef LLM_SCHEDULER_SERVICE_TOKENIZER_PRE_TOKENIZER_H_
#define LLM_SCHEDULER_SERVICE_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace llm {

// One piece of the text being pre-tokenized.
struct PreToken {
  std::string text;
  // The piece starts at offset 0 of the original input (Metaspace's prepend_scheme
  // "first" adds the replacement character only there).
  bool at_start = false;
};

class PreTokenizer {
 public:
  using Sink = absl::FunctionRef<void(PreToken)>;
  virtual ~PreTokenizer() = default;
  // Calls `sink` with the sub-pieces of `piece`, in order, as they are found (no list of
  // all of them is built); empty pieces are dropped, as the Hugging Face library drops them.
  virtual void PreTokenize(PreToken piece, Sink sink) const = 0;
  // Replaces *pieces by all their sub-pieces.
  void PreTokenizeAll(std::vector<PreToken>* pieces) const;
};

// A null JSON value gives a null pre-tokenizer. Unsupported types fail with
// INVALID_ARGUMENT naming the type.
absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& spec);

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_TOKENIZER_PRE_TOKENIZER_H_
