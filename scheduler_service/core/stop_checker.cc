#include "scheduler_service/core/stop_checker.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "glog/logging.h"

namespace llm {

void StopChecker::Prepare(Request* req) const {
  const SamplingParams& params = req->params;
  req->min_num_tokens = req->num_prompt_tokens + params.min_tokens;
  // Admission (Scheduler::ValidateRequest) refuses prompt + max_tokens over max_model_len, so
  // max_tokens alone ends every sequence within the model's context.
  const int64_t max_num_tokens = int64_t{req->num_prompt_tokens} + params.max_tokens;
  CHECK_LE(max_num_tokens, max_model_len_)
      << "request " << req->id << ": prompt + max_tokens over max_model_len was admitted";
  req->max_num_tokens = static_cast<int>(max_num_tokens);
  req->eos_token_id = params.ignore_eos || eos_token_id_ < 0 ? -1 : eos_token_id_;
  req->has_stop_lists =
      !params.stop_token_ids.empty() || (!params.stop.empty() && detokenizers_ != nullptr);
}

bool StopChecker::CheckStopTokenIds(const Request& req, Sequence* seq) {
  const std::vector<TokenId>& ids = req.params.stop_token_ids;
  if (std::find(ids.begin(), ids.end(), seq->last_token) == ids.end()) return false;
  seq->stop_token = seq->last_token;
  return true;
}

bool StopChecker::AppendText(const Request& req, Sequence* seq, std::string* text) const {
  if (seq->detokenizer == nullptr) {
    const SamplingParams& params = req.params;
    const DetokenizeOptions options{.skip_special_tokens = params.skip_special_tokens,
                                    .stop = params.stop,
                                    .include_stop_str_in_output = params.include_stop_str_in_output,
                                    .min_tokens = params.min_tokens};
    seq->detokenizer = detokenizers_->Create(req.prompt(), options);
  }
  IncrementalDetokenizer::Delta delta = seq->detokenizer->Append({&seq->last_token, 1});
  text->append(delta.text);
  if (!delta.stopped) return false;
  // Text after a stop string is never released: nothing to flush.
  seq->stop_string = std::move(delta.stop_string);
  seq->detokenizer.reset();
  return true;
}

void StopChecker::Flush(Sequence* seq, std::string* text) const {
  if (seq->detokenizer == nullptr) return;
  text->append(seq->detokenizer->Flush());
  seq->detokenizer.reset();
}

}  // namespace llm
