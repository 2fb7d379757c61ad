// What one step produced for the requests' streams: per request that sampled or finished, the
// new tokens of each sequence, the text they made final and how sequences finished. Flat
// arrays reused between steps; a StepOutputs is valid until the next UpdateFromOutput() or
// Abort(). The scheduler fills the tokens and the ends it sees in them; the text (and the ends
// stop strings make) is added by the engine's RequestText on the way to the streams.
#ifndef LLM_SCHEDULER_SERVICE_CORE_REQUEST_OUTPUT_H_
#define LLM_SCHEDULER_SERVICE_CORE_REQUEST_OUTPUT_H_

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/types.h"
#include "protocol/scheduler_output.h"
#include "scheduler_service/core/request.h"

namespace llm {

struct SequenceOutput {
  int index = 0;
  IndexRange new_token_ids;  // into StepOutputs::token_ids; empty when only finishing
  // Bytes of StepOutputs::text: the UTF-8 text the sequence's detokenizer made final this step
  // (request_text.h); when the sequence ended now, also the text it held back, unless a stop
  // string ended it. Empty as the scheduler makes it, and without a DetokenizerFactory.
  IndexRange text;
  SequenceStatus status = SequenceStatus::kRunning;  // a finished status when it ended now
  std::string_view stop_string;                      // when a stop string ended it
  TokenId stop_token = -1;  // when a stop_token_ids entry ended it (not EOS)
};

struct RequestOutput {
  std::string_view request_id;
  IndexRange seqs;                   // into StepOutputs::seqs
  bool finished = false;             // every sequence has finished; the request is gone
  int num_cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
};

struct StepOutputs {
  std::vector<RequestOutput> requests;
  std::vector<SequenceOutput> seqs;
  std::vector<TokenId> token_ids;
  std::string text;
  // Parallel to token_ids when the step's ModelOutput carried logprobs; empty otherwise.
  std::vector<SampleLogprobs> logprobs;

  std::span<const SequenceOutput> Seqs(const RequestOutput& r) const {
    return std::span<const SequenceOutput>(seqs).subspan(r.seqs.begin, r.seqs.size);
  }
  std::span<const TokenId> NewTokenIds(const SequenceOutput& s) const {
    return std::span<const TokenId>(token_ids).subspan(s.new_token_ids.begin, s.new_token_ids.size);
  }
  std::string_view Text(const SequenceOutput& s) const {
    return std::string_view(text).substr(s.text.begin, s.text.size);
  }
  void Clear() {
    requests.clear();
    seqs.clear();
    token_ids.clear();
    text.clear();
    logprobs.clear();
  }
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_REQUEST_OUTPUT_H_
