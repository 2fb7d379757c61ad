// A reasoning model's thinking, separated from its answer: `<think>...</think>` at the start of
// the output becomes the OpenAI message's `reasoning_content` and the rest its `content`, as
// vLLM's reasoning parsers read it (`--reasoning-parser`):
//
//   deepseek_r1  DeepSeek-R1 and QwQ, Qwen3 thinking models (2507): their templates end the
//                prompt with `<think>`, so the output is reasoning from its first token (an
//                opening `<think>` is dropped) up to `</think>`; without one, all of it.
//   qwen3        Qwen3: reasoning only when the output opens with `<think>` (after whitespace),
//                up to `</think>`; `enable_thinking: false` (chat_template_kwargs) puts an empty
//                think block in the prompt, and the output is all content.
//
// An output constrained by a grammar from its first token (structured outputs, tool_choice
// "required" or a named function) cannot think first: it starts as content for both, and only
// an opening `<think>` the grammar allows starts reasoning.
//
// Thread-compatible.
#ifndef LLM_SCHEDULER_SERVICE_HTTP_REASONING_PARSER_H_
#define LLM_SCHEDULER_SERVICE_HTTP_REASONING_PARSER_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace llm::openai {

enum class ReasoningFormat { kNone, kDeepSeekR1, kQwen3 };

// "" or "none": kNone; "deepseek_r1"; "qwen3". Others: InvalidArgumentError listing these.
absl::StatusOr<ReasoningFormat> ReasoningFormatFromName(std::string_view name);

// Reads an output as it streams: Add returns the reasoning and the content that can be shown
// now (text that may be the start of a marker is held back until it is not); Finish the rest.
class ReasoningStreamParser {
 public:
  // starts_in_reasoning: the output is reasoning until `</think>` even without an opening
  // `<think>` (deepseek_r1, unconstrained).
  explicit ReasoningStreamParser(bool starts_in_reasoning)
      : starts_in_reasoning_(starts_in_reasoning) {}

  struct Delta {
    std::string reasoning;
    std::string content;
  };
  Delta Add(std::string_view text);
  Delta Finish();
  // Whether any of the output was reasoning (an empty `<think></think>` counts).
  bool reasoned() const { return reasoned_; }

 private:
  enum class State { kStart, kReasoning, kContent };
  void Drain(bool final, Delta* out);

  bool starts_in_reasoning_;
  State state_ = State::kStart;
  std::string pending_;  // text not yet emitted
  bool reasoned_ = false;
};

// The whole output at once: the reasoning (nullopt when there was none) and the content.
struct ReasoningSplit {
  std::optional<std::string> reasoning;
  std::string content;
};
ReasoningSplit SplitReasoning(bool starts_in_reasoning, std::string_view text);

}  // namespace llm::openai

#endif  // LLM_SCHEDULER_SERVICE_HTTP_REASONING_PARSER_H_
