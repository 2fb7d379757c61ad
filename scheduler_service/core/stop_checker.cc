#include "scheduler_service/core/stop_checker.h"

#include <algorithm>

namespace llm {

std::optional<SequenceStatus> StopChecker::Check(const SamplingParams& params,
                                                 int num_prompt_tokens, Sequence* seq) const {
  const int num_tokens = static_cast<int>(seq->tokens.size());
  const int num_output = num_tokens - num_prompt_tokens;
  const TokenId token = seq->tokens.back();
  if (num_output >= params.min_tokens) {
    if (!params.ignore_eos && token == eos_token_id_ && eos_token_id_ >= 0) {
      seq->stop_token = token;
      return SequenceStatus::kFinishedStopped;
    }
    if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) !=
        params.stop_token_ids.end()) {
      seq->stop_token = token;
      return SequenceStatus::kFinishedStopped;
    }
    if (!params.stop.empty() && detokenizers_ != nullptr) {
      if (seq->detokenizer == nullptr) {
        DetokenizeOptions options{.skip_special_tokens = params.skip_special_tokens,
                                  .stop = params.stop,
                                  .include_stop_str_in_output = params.include_stop_str_in_output};
        seq->detokenizer = detokenizers_->Create(
            std::span<const TokenId>(seq->tokens).first(num_tokens - 1), options);
      }
      IncrementalDetokenizer::Delta delta = seq->detokenizer->Append({&seq->tokens.back(), 1});
      if (delta.stopped) {
        seq->stop_string = std::move(delta.stop_string);
        return SequenceStatus::kFinishedStopped;
      }
    }
  }
  if (num_output >= params.max_tokens || num_tokens >= max_model_len_) {
    return SequenceStatus::kFinishedLength;
  }
  return std::nullopt;
}

}  // namespace llm
