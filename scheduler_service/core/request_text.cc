#include "scheduler_service/core/request_text.h"

#include <utility>

#include "glog/logging.h"

namespace llm {

RequestText::RequestText(const DetokenizerFactory* detokenizers, std::span<const TokenId> prompt,
                         const SamplingParams& params)
    : n_(params.n), seqs_(params.n) {
  if (detokenizers == nullptr) return;
  const DetokenizeOptions options{.skip_special_tokens = params.skip_special_tokens,
                                  .stop = params.stop,
                                  .include_stop_str_in_output = params.include_stop_str_in_output,
                                  .min_tokens = params.min_tokens};
  for (Seq& seq : seqs_) seq.detokenizer = detokenizers->Create(prompt, options);
}

RequestText::Applied RequestText::Apply(StepOutputs* outputs, RequestOutput* out) {
  DCHECK(!ended());
  Applied applied;
  SequenceOutput* seqs = outputs->seqs.data() + out->seqs.begin;
  uint32_t kept = 0;
  for (uint32_t k = 0; k < out->seqs.size; ++k) {
    SequenceOutput so = seqs[k];
    CHECK(so.index >= 0 && so.index < n_) << "sequence " << so.index << " of " << n_;
    Seq& seq = seqs_[so.index];
    // Ended at a stop string before: what the engine computed after it is dropped.
    if (seq.ended) continue;
    so.text.begin = static_cast<uint32_t>(outputs->text.size());
    if (seq.detokenizer != nullptr) {
      const std::span<const TokenId> ids = outputs->NewTokenIds(so);
      IncrementalDetokenizer::Delta delta;
      if (!ids.empty()) delta = seq.detokenizer->Append(ids);
      outputs->text += delta.text;
      if (delta.stopped) {
        // Ended by its text: the scheduler, which sees only tokens, still runs it.
        if (!IsFinished(so.status)) applied.stopped.push_back(so.index);
        seq.stop_string = std::move(delta.stop_string);
        so.status = SequenceStatus::kFinishedStopped;
        so.stop_string = seq.stop_string;
        so.stop_token = -1;
      } else if (IsFinished(so.status)) {
        outputs->text += seq.detokenizer->Flush();  // what it held back is final now
      }
      if (IsFinished(so.status)) seq.detokenizer.reset();
    }
    so.text.size = static_cast<uint32_t>(outputs->text.size()) - so.text.begin;
    if (IsFinished(so.status)) {
      seq.ended = true;
      ++num_ended_;
    }
    seqs[kept++] = so;
  }
  out->seqs.size = kept;
  // The scheduler ended the request: every sequence has ended, also those it never forked (a
  // request dropped before its first sample reports sequence 0 only).
  if (out->finished) num_ended_ = n_;
  applied.ended = ended();
  out->finished = applied.ended;
  return applied;
}

}  // namespace llm
