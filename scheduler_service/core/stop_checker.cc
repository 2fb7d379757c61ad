#include "scheduler_service/core/stop_checker.h"

#include <algorithm>
#include <cstdint>

namespace llm {

void StopChecker::Prepare(Request* req) const {
  const SamplingParams& params = req->params;
  req->min_num_tokens = req->num_prompt_tokens + params.min_tokens;
  req->max_num_tokens = static_cast<int>(std::min<int64_t>(
      static_cast<int64_t>(req->num_prompt_tokens) + params.max_tokens, max_model_len_));
  req->eos_token_id = params.ignore_eos || eos_token_id_ < 0 ? -1 : eos_token_id_;
  req->has_stop_lists =
      !params.stop_token_ids.empty() || (!params.stop.empty() && detokenizers_ != nullptr);
}

bool StopChecker::CheckStopLists(const Request& req, Sequence* seq) const {
  const SamplingParams& params = req.params;
  const TokenId token = seq->tokens.back();
  if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) !=
      params.stop_token_ids.end()) {
    seq->stop_token = token;
    return true;
  }
  if (params.stop.empty() || detokenizers_ == nullptr) return false;
  if (seq->detokenizer == nullptr) {
    const DetokenizeOptions options{
        .skip_special_tokens = params.skip_special_tokens,
        .stop = params.stop,
        .include_stop_str_in_output = params.include_stop_str_in_output};
    seq->detokenizer = detokenizers_->Create(
        std::span<const TokenId>(seq->tokens).first(seq->tokens.size() - 1), options);
  }
  IncrementalDetokenizer::Delta delta = seq->detokenizer->Append({&seq->tokens.back(), 1});
  if (!delta.stopped) return false;
  seq->stop_string = std::move(delta.stop_string);
  return true;
}

}  // namespace llm
