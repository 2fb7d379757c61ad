// Decides whether a sequence stops after a token was appended to it: EOS (unless
// ignore_eos), a stop token id, a stop string (through an IncrementalDetokenizer), max_tokens
// or max_model_len. EOS, stop token ids and stop strings count only once the sequence has
// min_tokens output tokens; stop strings are searched in the text generated from then on
// (the detokenizer is created at that point, with the earlier tokens as context).
//
// Stateless apart from the sequence's detokenizer; not thread-safe (the engine thread).
#ifndef LLM_SCHEDULER_SERVICE_CORE_STOP_CHECKER_H_
#define LLM_SCHEDULER_SERVICE_CORE_STOP_CHECKER_H_

#include <optional>

#include "common/sampling_params.h"
#include "common/types.h"
#include "scheduler_service/core/detokenizer.h"
#include "scheduler_service/core/request.h"

namespace llm {

class StopChecker {
 public:
  // eos_token_id < 0: the model has none. `detokenizers` may be null: stop strings are then
  // not checked (requests carrying them are rejected by the scheduler).
  StopChecker(TokenId eos_token_id, int max_model_len, const DetokenizerFactory* detokenizers)
      : eos_token_id_(eos_token_id), max_model_len_(max_model_len), detokenizers_(detokenizers) {}

  // Sets the request's stop fields (min_num_tokens, max_num_tokens, eos_token_id,
  // has_stop_lists) from its params and prompt, so that Check reads the params only when a
  // stop token id or stop string may apply.
  void Prepare(Request* req) const;

  // The finished status the sequence (of `req`) takes after its last token was appended, or
  // nullopt when it goes on. Records the stop string or token in the sequence.
  std::optional<SequenceStatus> Check(const Request& req, Sequence* seq) const {
    const int num_tokens = static_cast<int>(seq->tokens.size());
    if (num_tokens >= req.min_num_tokens) {
      if (seq->last_token == req.eos_token_id && req.eos_token_id >= 0) {
        seq->stop_token = req.eos_token_id;
        return SequenceStatus::kFinishedStopped;
      }
      if (req.has_stop_lists && CheckStopLists(req, seq)) return SequenceStatus::kFinishedStopped;
    }
    if (num_tokens >= req.max_num_tokens) return SequenceStatus::kFinishedLength;
    return std::nullopt;
  }

  bool can_check_stop_strings() const { return detokenizers_ != nullptr; }

 private:
  // Stop token ids and stop strings.
  bool CheckStopLists(const Request& req, Sequence* seq) const;

  TokenId eos_token_id_;
  int max_model_len_;
  const DetokenizerFactory* detokenizers_;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_STOP_CHECKER_H_
