#include "scheduler_service/core/stop_checker.h"

#include <algorithm>
#include <cstdint>

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
  req->has_stop_lists = !params.stop_token_ids.empty();
}

bool StopChecker::CheckStopTokenIds(const Request& req, Sequence* seq) {
  const std::vector<TokenId>& ids = req.params.stop_token_ids;
  if (std::find(ids.begin(), ids.end(), seq->last_token) == ids.end()) return false;
  seq->stop_token = seq->last_token;
  return true;
}

}  // namespace llm
