#include "common/sampling_params.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace llm {
namespace {

absl::Status Bad(absl::string_view field, const absl::AlphaNum& value, absl::string_view range) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", value.Piece(), "; it must be ", range));
}

}  // namespace

const char* StructuredOutputParams::field_name() const {
  switch (kind) {
    case Kind::kJsonSchema:
      return "structured_output.json_schema";
    case Kind::kJsonObject:
      return "structured_output.json_object";
    case Kind::kRegex:
      return "structured_output.regex";
    case Kind::kGrammar:
      return "structured_output.grammar";
    case Kind::kChoice:
      return "structured_output.choice";
    case Kind::kNone:
      break;
  }
  return "structured_output";
}

absl::Status SamplingParams::Validate(const SamplingLimits& limits) const {
  if (n < 1 || n > limits.max_n) {
    return Bad("n", n, absl::StrCat("in [1, ", limits.max_n, "]"));
  }
  if (!std::isfinite(temperature) || temperature < 0) {
    return Bad("temperature", temperature, "finite and >= 0");
  }
  if (greedy() && n > 1) {
    return Bad("n", n, "1 when temperature is 0 (greedy sampling yields one sequence)");
  }
  if (!std::isfinite(top_p) || top_p <= 0 || top_p > 1) {
    return Bad("top_p", top_p, "in (0, 1]");
  }
  if (top_k != -1 && top_k < 1) return Bad("top_k", top_k, "-1 (disabled) or >= 1");
  if (!std::isfinite(min_p) || min_p < 0 || min_p > 1) return Bad("min_p", min_p, "in [0, 1]");
  if (max_tokens < 1) return Bad("max_tokens", max_tokens, ">= 1");
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return Bad("min_tokens", min_tokens, absl::StrCat("in [0, max_tokens = ", max_tokens, "]"));
  }
  for (const std::string& s : stop) {
    if (s.empty()) return Bad("stop", "an empty string", "non-empty");
  }
  for (TokenId id : stop_token_ids) {
    if (id < 0) return Bad("stop_token_ids", id, ">= 0");
  }
  if (logprobs.has_value() && (*logprobs < 0 || *logprobs > limits.max_logprobs)) {
    return Bad("logprobs", *logprobs, absl::StrCat("in [0, ", limits.max_logprobs, "]"));
  }
  if (!std::isfinite(presence_penalty) || presence_penalty < -2 || presence_penalty > 2) {
    return Bad("presence_penalty", presence_penalty, "in [-2, 2]");
  }
  if (!std::isfinite(frequency_penalty) || frequency_penalty < -2 || frequency_penalty > 2) {
    return Bad("frequency_penalty", frequency_penalty, "in [-2, 2]");
  }
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0) {
    return Bad("repetition_penalty", repetition_penalty, "finite and > 0");
  }
  if (!logit_bias.empty()) {
    const std::string vocab = limits.vocab_size > 0
                                  ? absl::StrCat("in [0, ", limits.vocab_size, ") (the vocabulary)")
                                  : std::string(">= 0");
    for (const auto& [token, bias] : logit_bias) {
      if (token < 0 || (limits.vocab_size > 0 && token >= limits.vocab_size)) {
        return Bad("logit_bias token id", token, vocab);
      }
      if (!std::isfinite(bias) || bias < -100 || bias > 100) {
        return Bad(absl::StrCat("logit_bias[", token, "]"), bias, "finite and in [-100, 100]");
      }
    }
    std::vector<TokenId> ids;
    ids.reserve(logit_bias.size());
    for (const auto& entry : logit_bias) ids.push_back(entry.first);
    std::sort(ids.begin(), ids.end());
    if (auto dup = std::adjacent_find(ids.begin(), ids.end()); dup != ids.end()) {
      return Bad("logit_bias token id", *dup, "listed once");
    }
  }
  using Kind = StructuredOutputParams::Kind;
  switch (structured.kind) {
    case Kind::kJsonSchema:
    case Kind::kRegex:
    case Kind::kGrammar:
      if (structured.text.empty()) {
        return Bad(structured.field_name(), "empty", "a non-empty text");
      }
      break;
    case Kind::kChoice:
      if (structured.choices.empty()) {
        return Bad(structured.field_name(), "an empty list", "at least one string");
      }
      break;
    case Kind::kNone:
    case Kind::kJsonObject:
      break;
  }
  return absl::OkStatus();
}

}  // namespace llm
