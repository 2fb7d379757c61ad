// Decides whether a sequence stops after a token was appended to it, and turns its output into
// text. It stops on a stop string, EOS (unless ignore_eos), a stop token id or max_tokens
// (admission keeps prompt + max_tokens within max_model_len; Prepare CHECKs it). EOS, stop token
// ids and stop strings count only once the sequence has min_tokens output tokens (stop strings are
// searched in the text released from then on). A stop string found on the token that is also EOS or
// a stop token id is the reason reported, since it is where the text ends.
//
// Text: with a DetokenizerFactory, each sequence gets an IncrementalDetokenizer at its first
// output token (the prompt as context) and feeds it every token. Check appends to `text` what
// the token made final and, when the sequence ends other than by a stop string, the text the
// detokenizer held back. This is the only detokenization of the output: the engine's outputs
// carry this text (SequenceOutput::text) and the API streams it as is.
//
// Stateless apart from the sequences' detokenizers; not thread-safe (the engine thread).
#ifndef LLM_SCHEDULER_SERVICE_CORE_STOP_CHECKER_H_
#define LLM_SCHEDULER_SERVICE_CORE_STOP_CHECKER_H_

#include <optional>
#include <string>

#include "common/sampling_params.h"
#include "common/types.h"
#include "scheduler_service/core/detokenizer.h"
#include "scheduler_service/core/request.h"

namespace llm {

class StopChecker {
 public:
  // eos_token_id < 0: the model has none. `detokenizers` may be null: there is then no text,
  // and stop strings are not checked (requests carrying them are rejected by the scheduler).
  StopChecker(TokenId eos_token_id, int max_model_len, const DetokenizerFactory* detokenizers)
      : eos_token_id_(eos_token_id), max_model_len_(max_model_len), detokenizers_(detokenizers) {}

  // Sets the request's stop fields (min_num_tokens, max_num_tokens, eos_token_id,
  // has_stop_lists) from its params and prompt, so that Check reads the params only when a
  // stop token id or stop string may apply, or a detokenizer is made.
  void Prepare(Request* req) const;

  // The finished status the sequence (of `req`) takes after its last token was appended, or
  // nullopt when it goes on. Records the stop string or token in the sequence, and appends
  // the sequence's new text to `text` (see above).
  std::optional<SequenceStatus> Check(const Request& req, Sequence* seq, std::string* text) const {
    if (detokenizers_ != nullptr && AppendText(req, seq, text)) {
      return SequenceStatus::kFinishedStopped;
    }
    std::optional<SequenceStatus> stop = CheckTokens(req, seq);
    if (stop.has_value()) Flush(seq, text);
    return stop;
  }

  // For a sequence that ended without Check saying so (aborted): appends the text its
  // detokenizer held back, and releases the detokenizer. Nothing when it has none.
  void Flush(Sequence* seq, std::string* text) const;

  bool can_check_stop_strings() const { return detokenizers_ != nullptr; }

 private:
  // EOS, stop token ids and max_tokens.
  std::optional<SequenceStatus> CheckTokens(const Request& req, Sequence* seq) const {
    const int num_tokens = static_cast<int>(seq->tokens.size());
    if (num_tokens >= req.min_num_tokens) {
      if (seq->last_token == req.eos_token_id && req.eos_token_id >= 0) {
        seq->stop_token = req.eos_token_id;
        return SequenceStatus::kFinishedStopped;
      }
      if (req.has_stop_lists && CheckStopTokenIds(req, seq)) {
        return SequenceStatus::kFinishedStopped;
      }
    }
    if (num_tokens >= req.max_num_tokens) return SequenceStatus::kFinishedLength;
    return std::nullopt;
  }
  static bool CheckStopTokenIds(const Request& req, Sequence* seq);
  // Feeds the last token to the sequence's detokenizer (made at its first output token);
  // whether a stop string ended the sequence.
  bool AppendText(const Request& req, Sequence* seq, std::string* text) const;

  TokenId eos_token_id_;
  int max_model_len_;
  const DetokenizerFactory* detokenizers_;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_STOP_CHECKER_H_
