// Decides whether a sequence stops after a token was appended to it, by its tokens: EOS
// (unless ignore_eos), a stop token id or max_tokens (admission keeps prompt + max_tokens within
// max_model_len; Prepare CHECKs it). EOS and stop token ids count only once the sequence has
// min_tokens output tokens. Stop strings are not the scheduler's: the engine finds them in the
// text (request_text.h) and stops the sequence (Scheduler::StopSequences).
//
// Stateless; the engine thread.
#ifndef LLM_SCHEDULER_SERVICE_CORE_STOP_CHECKER_H_
#define LLM_SCHEDULER_SERVICE_CORE_STOP_CHECKER_H_

#include <optional>

#include "common/sampling_params.h"
#include "common/types.h"
#include "scheduler_service/core/request.h"

namespace llm {

class StopChecker {
 public:
  // eos_token_id < 0: the model has none.
  StopChecker(TokenId eos_token_id, int max_model_len)
      : eos_token_id_(eos_token_id), max_model_len_(max_model_len) {}

  // Sets the request's stop fields (min_num_tokens, max_num_tokens, eos_token_id,
  // has_stop_lists) from its params and prompt, so that Check reads the params only when a
  // stop token id may apply.
  void Prepare(Request* req) const;

  // The finished status the sequence (of `req`) takes after its last token was appended, or
  // nullopt when it goes on. Records a stop_token_ids entry that ended it in the sequence.
  std::optional<SequenceStatus> Check(const Request& req, Sequence* seq) const {
    const int num_tokens = static_cast<int>(seq->tokens.size());
    if (num_tokens >= req.min_num_tokens) {
      if (seq->last_token == req.eos_token_id && req.eos_token_id >= 0) {
        return SequenceStatus::kFinishedStopped;  // EOS: no stop token (OpenAI's null)
      }
      if (req.has_stop_lists && CheckStopTokenIds(req, seq)) {
        return SequenceStatus::kFinishedStopped;
      }
    }
    if (num_tokens >= req.max_num_tokens) return SequenceStatus::kFinishedLength;
    return std::nullopt;
  }

 private:
  static bool CheckStopTokenIds(const Request& req, Sequence* seq);

  TokenId eos_token_id_;
  int max_model_len_;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_STOP_CHECKER_H_
