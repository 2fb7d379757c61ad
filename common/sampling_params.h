// How one request's output tokens are sampled and when its generation stops: the same knobs
// as vLLM's SamplingParams and TGI's parameters, with their ranges.
//
// Plain value type; Validate() is part of the engine's admission check
// (Scheduler::ValidateRequest), run once per request. Thread-compatible.
#ifndef LLM_COMMON_SAMPLING_PARAMS_H_
#define LLM_COMMON_SAMPLING_PARAMS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/types.h"

namespace llm {

// Limits the server sets (flags); Validate() checks a request against them.
struct SamplingLimits {
  int max_n = 16;         // sequences per request
  int max_logprobs = 20;  // top logprobs per token
  int vocab_size = 0;     // logit_bias token ids are below it; 0: not checked (>= 0 only)
};

// A constraint on the output's text (structured outputs, vLLM's structured_outputs and
// OpenAI's response_format): sampling allows only tokens that keep the text a prefix of the
// constraint's language, and the stop tokens only once the text is a whole sentence of it. The
// grammar engine (structured/) compiles it; Validate checks only its shape.
struct StructuredOutputParams {
  enum class Kind { kNone, kJsonSchema, kJsonObject, kRegex, kGrammar, kChoice };
  Kind kind = Kind::kNone;
  // kJsonSchema: the schema as JSON text; kRegex: the expression; kGrammar: GBNF.
  std::string text;
  std::vector<std::string> choices;  // kChoice: the output is one of these strings
  // The JSON kinds: any whitespace between tokens. Off by default: with it a small model can
  // spend its whole budget on blank lines that the grammar allows.
  bool any_whitespace = false;

  bool active() const { return kind != Kind::kNone; }
  // The proto field that sets this kind, for messages: "structured_output.regex", ...
  const char* field_name() const;
};

struct SamplingParams {
  int n = 1;                 // output sequences sharing the prompt; [1, max_n]
  double temperature = 1.0;  // finite, >= 0; 0 means greedy (then n must be 1)
  double top_p = 1.0;        // (0, 1]
  int top_k = -1;            // -1 (off) or >= 1
  double min_p = 0.0;        // [0, 1]
  std::optional<uint64_t> seed;
  int max_tokens = 16;  // output tokens at most; >= 1
  int min_tokens = 0;   // EOS and stop tokens are ignored before this many; [0, max_tokens]
  std::vector<std::string> stop;        // stop strings (non-empty each)
  std::vector<TokenId> stop_token_ids;  // >= 0 each
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  std::optional<int> logprobs;      // top logprobs per output token; [0, max_logprobs]
  double presence_penalty = 0.0;    // [-2, 2]
  double frequency_penalty = 0.0;   // [-2, 2]
  double repetition_penalty = 1.0;  // finite, > 0
  // Added to the token's logit before the penalties, temperature and filters (vLLM's order),
  // so greedy's argmax moves too; -100 all but bans a token. Distinct token ids in
  // [0, vocab_size), biases finite and in [-100, 100]; sorted by token id when from a proto.
  std::vector<std::pair<TokenId, float>> logit_bias;
  StructuredOutputParams structured;

  bool greedy() const { return temperature == 0.0; }
  // Whether any of the three penalties is on: only then does sampling read the output's
  // token counts (and, for the repetition penalty, the prompt's tokens).
  bool has_penalties() const {
    return repetition_penalty != 1.0 || frequency_penalty != 0.0 || presence_penalty != 0.0;
  }

  // OK, or INVALID_ARGUMENT naming the first bad field, its value and the allowed range,
  // e.g. "top_p is 1.5; it must be in (0, 1]".
  absl::Status Validate(const SamplingLimits& limits = {}) const;
};

}  // namespace llm

#endif  // LLM_COMMON_SAMPLING_PARAMS_H_
