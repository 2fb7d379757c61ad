// The incremental detokenizer of a sequence's output: the one place output tokens become
// text. The scheduler's StopChecker runs one per sequence, from its first output token, when
// it has a DetokenizerFactory; the text it releases is the text the engine's outputs carry
// (SequenceOutput::text) and the API streams, and the stop strings it finds end the sequence.
// The core defines the interface and never links a tokenizer: the real implementation (a
// Hugging Face tokenizer.json) is scheduler_service/tokenizer's TokenizerDetokenizerFactory;
// tests may use a fake.
#ifndef LLM_SCHEDULER_SERVICE_CORE_DETOKENIZER_H_
#define LLM_SCHEDULER_SERVICE_CORE_DETOKENIZER_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/types.h"

namespace llm {

struct DetokenizeOptions {
  bool skip_special_tokens = true;
  // Generation stops at the first occurrence of any of these in the output text (which may
  // span token boundaries). The stop string itself is emitted only when
  // include_stop_str_in_output; text after it never is.
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  // Stop strings count only from the min_tokens-th output token on, as EOS and stop token
  // ids do (StopChecker): they are searched in the text released from that token on; text
  // released before it is emitted as is (0 and 1: from the first token).
  int min_tokens = 0;
};

// Turns one sequence's output tokens into text as they arrive. Not thread-safe.
class IncrementalDetokenizer {
 public:
  struct Delta {
    // New text that is final: complete UTF-8 characters only, and no text that could still
    // turn out to be the start of a stop string (it is held back until it cannot).
    std::string text;
    bool stopped = false;     // a stop string was found; generation must end
    std::string stop_string;  // which one, when stopped
  };

  virtual ~IncrementalDetokenizer() = default;

  // Feeds the tokens sampled in one step (usually one). After a stop, further calls return
  // an empty delta.
  virtual Delta Append(std::span<const TokenId> new_token_ids) = 0;
  // Everything held back that is final once the sequence ends for another reason (length,
  // EOS): incomplete characters become U+FFFD, as Hugging Face decoding does.
  virtual std::string Flush() = 0;
  // All text emitted so far (sum of the deltas and the flush).
  virtual const std::string& output_text() const = 0;
};

class DetokenizerFactory {
 public:
  virtual ~DetokenizerFactory() = default;
  // A detokenizer for the output of a sequence with this prompt (the prompt gives context,
  // e.g. for a Metaspace tokenizer's leading space), fed from the first output token on.
  virtual std::unique_ptr<IncrementalDetokenizer> Create(
      std::span<const TokenId> prompt_token_ids, const DetokenizeOptions& options) const = 0;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_DETOKENIZER_H_
