// The text of one request's output, and its stop strings: what turns a step's tokens into what
// a client reads. The engine runs one per stream on its output thread (engine_core.h), so that
// detokenization, which costs several times the rest of a decode step's work per request, does
// not lengthen the engine thread's step (vLLM's OutputProcessor).
//
// The scheduler ends sequences by their tokens (EOS, stop token ids, max_tokens) and by aborts;
// stop strings are found here, in the text. A sequence a stop string ends is ended here at the
// token that completes it: the outputs for it that the engine produced after that token (it
// planned and ran steps before the text was made) are dropped, so that no client sees a token
// past its stop, and Apply says which sequences the caller must have the scheduler stop
// (Scheduler::StopSequences) to free their blocks.
//
// Text: each sequence has an IncrementalDetokenizer from the start (made with the prompt as
// context, on the thread that makes the RequestText); Apply appends to the step's text what
// each new token made final and, when the sequence ends other than by a stop string, what the
// detokenizer held back. A stop string found on the token that is also EOS, a stop token id or
// the last of max_tokens is the reason reported, since it is where the text ends. Stop strings
// count only from the min_tokens-th output token on (DetokenizeOptions).
//
// Not thread-safe: one thread at a time (the output thread), outputs in step order.
#ifndef LLM_SCHEDULER_SERVICE_CORE_REQUEST_TEXT_H_
#define LLM_SCHEDULER_SERVICE_CORE_REQUEST_TEXT_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/sampling_params.h"
#include "common/types.h"
#include "scheduler_service/core/detokenizer.h"
#include "scheduler_service/core/request_output.h"

namespace llm {

class RequestText {
 public:
  // `detokenizers` may be null: no text, and no stop strings (the engine refuses requests with
  // stop strings then); Apply only tracks which sequences ended.
  RequestText(const DetokenizerFactory* detokenizers, std::span<const TokenId> prompt,
              const SamplingParams& params);

  struct Applied {
    std::vector<int> stopped;  // sequence indices a stop string ended now, still live in the
                               // scheduler: the caller has it stop them
    bool ended = false;        // every sequence has ended: this output is the stream's last
  };
  // Rewrites `out`, an output of `outputs` for this request, in place: fills each sequence's
  // text (into outputs->text), ends sequences at a stop string (status kFinishedStopped,
  // stop_string set, stop_token cleared), drops the sequence outputs of sequences that ended
  // before, and sets out->finished once every sequence has ended. Not to be called once
  // ended() (the caller delivers nothing more of the stream).
  Applied Apply(StepOutputs* outputs, RequestOutput* out);

  bool ended() const { return num_ended_ == n_; }
  int n() const { return n_; }

 private:
  struct Seq {
    std::unique_ptr<IncrementalDetokenizer> detokenizer;
    std::string stop_string;  // the one that ended it (SequenceOutput::stop_string views it)
    bool ended = false;
  };

  int n_;
  int num_ended_ = 0;
  std::vector<Seq> seqs_;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_REQUEST_TEXT_H_
