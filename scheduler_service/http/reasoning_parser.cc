#include "scheduler_service/http/reasoning_parser.h"

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "scheduler_service/http/partial_marker.h"

namespace llm::openai {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

}  // namespace

absl::StatusOr<ReasoningFormat> ReasoningFormatFromName(std::string_view name) {
  if (name.empty() || name == "none") return ReasoningFormat::kNone;
  if (name == "deepseek_r1") return ReasoningFormat::kDeepSeekR1;
  if (name == "qwen3") return ReasoningFormat::kQwen3;
  return absl::InvalidArgumentError(absl::StrCat("unknown reasoning parser \"", std::string(name),
                                                 "\": expected deepseek_r1, qwen3 or none"));
}

void ReasoningStreamParser::Drain(bool final, Delta* out) {
  if (state_ == State::kStart) {
    // Leading whitespace, then an opening marker or not.
    const size_t first =
        std::find_if_not(pending_.begin(), pending_.end(), IsAsciiSpace) - pending_.begin();
    const std::string_view rest = std::string_view(pending_).substr(first);
    if (rest.starts_with(kOpen)) {
      state_ = State::kReasoning;
      reasoned_ = true;
      pending_.erase(0, first + kOpen.size());
    } else if (!final && kOpen.starts_with(rest)) {
      return;  // whitespace only, or a part of "<think>": wait
    } else {
      state_ = starts_in_reasoning_ ? State::kReasoning : State::kContent;
      reasoned_ = reasoned_ || starts_in_reasoning_;
    }
  }
  if (state_ == State::kReasoning) {
    const size_t close = pending_.find(kClose);
    if (close == std::string::npos) {
      const size_t keep = final ? 0 : PartialMarker(pending_, kClose);
      out->reasoning.append(pending_, 0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return;
    }
    out->reasoning.append(pending_, 0, close);
    pending_.erase(0, close + kClose.size());
    state_ = State::kContent;
  }
  out->content += pending_;
  pending_.clear();
}

ReasoningStreamParser::Delta ReasoningStreamParser::Add(std::string_view text) {
  Delta out;
  pending_.append(text);
  Drain(/*final=*/false, &out);
  return out;
}

ReasoningStreamParser::Delta ReasoningStreamParser::Finish() {
  Delta out;
  Drain(/*final=*/true, &out);
  return out;
}

ReasoningSplit SplitReasoning(bool starts_in_reasoning, std::string_view text) {
  ReasoningStreamParser parser(starts_in_reasoning);
  ReasoningStreamParser::Delta d = parser.Add(text);
  ReasoningStreamParser::Delta rest = parser.Finish();
  ReasoningSplit out;
  if (parser.reasoned()) out.reasoning = d.reasoning + rest.reasoning;
  out.content = d.content + rest.content;
  return out;
}

}  // namespace llm::openai
