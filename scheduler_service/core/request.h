// One generation request (vLLM's SequenceGroup) and its sequences, as the scheduler keeps
// them.
//
// A request holds n sequences sharing its prompt. It starts with one sequence; when its
// prompt's prefill completes and the first tokens are sampled, the scheduler forks the other
// n - 1 (sharing the prompt's blocks). Live sequences (not finished) advance in lockstep: each
// step that schedules the request computes the same number of tokens for each of them, and a
// sampling step gives each one token, so every live sequence has num_tokens() tokens.
//
//   tokens:  [ prompt ......................... | output ............ ]
//            0                          num_prompt_tokens        num_tokens
//   KV:      [ computed (num_computed_tokens) ......... | to compute ]
//
// The last sampled token of a running request is never computed yet: its KV is computed in
// the step after it was sampled. Plain state owned by the Scheduler; not thread-safe.
#ifndef LLM_SCHEDULER_SERVICE_CORE_REQUEST_H_
#define LLM_SCHEDULER_SERVICE_CORE_REQUEST_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "common/sampling_params.h"
#include "common/types.h"

namespace llm {

enum class SequenceStatus : uint8_t {
  kWaiting,
  kRunning,
  kSwapped,
  kFinishedStopped,  // EOS, a stop token id or a stop string
  kFinishedLength,   // max_tokens or max_model_len
  kFinishedAborted,
};

const char* SequenceStatusName(SequenceStatus s);
inline bool IsFinished(SequenceStatus s) { return s >= SequenceStatus::kFinishedStopped; }

struct Sequence {
  // Hot fields first: with the request's first cache line, a step reads only these.
  SeqId id = 0;
  std::vector<TokenId> tokens;  // prompt + output
  // Tokens with a KV slot in the sequence's block table (the last sampled one gets its slot
  // just before the step that computes it).
  int num_slots = 0;
  // What the workers know of this sequence (the step protocol is a diff). Its tokens they
  // have once it is known: they append what they sample.
  int num_blocks_sent = 0;  // leading block ids the workers have
  TokenId last_token = -1;  // tokens.back(), kept here so that a decode step need not read it
  int index = 0;            // within its request, 0 .. n-1
  SequenceStatus status = SequenceStatus::kWaiting;
  bool known_to_workers = false;
  bool resend_table = true;  // the table changed other than by appending (send it whole)
  TokenId stop_token = -1;   // the stop_token_ids entry that finished it, if one did (not EOS)
};

struct alignas(64) Request {
  enum class State : uint8_t { kWaiting, kRunning, kSwapped, kFinished };

  // Pinned (held by pointer): `id_view` views `id`. Aligned to a cache line, so that the hot
  // fields below and sequence 0's take two lines.
  Request() = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  // Hot fields first. A decode step of a one-sequence request reads this first cache line and
  // sequence 0's hot fields (the second), and of the rest only the tail of its tokens (to
  // append the sampled one); the params only when a stop token id may apply. The scheduler
  // prefetches these two lines ahead of use (request_prefetcher.h, whose test checks that the
  // fields stay in them).
  int32_t slot = 0;  // dense index in the scheduler; reused after the request is gone
  State state = State::kWaiting;
  bool known_to_workers = false;
  bool has_stop_lists = false;  // stop_token_ids to check (StopChecker)
  // Preempted by recompute while the workers held it: the next step that schedules it must
  // say resumed_from_preemption (its computed tokens went back to 0), even when that is not
  // the step that re-admitted it.
  bool resume_pending = false;
  // Asynchronous scheduling (scheduler.h): the steps planned and not applied yet sample this
  // many tokens of each live sequence (0, 1 or 2)...
  uint8_t num_inflight_samples = 0;
  // ... and the KV they compute belongs to this epoch, bumped when it becomes void (preemption
  // by recompute, new workers): a step's computed tokens count only in the epoch it planned.
  uint8_t epoch = 0;
  int16_t n = 1;                // params.n (below Scheduler::kSeqIdStride)
  int16_t num_live = 1;         // sequences not finished
  int num_tokens = 0;           // tokens of each live sequence, as sampled and applied
  int num_computed_tokens = 0;  // of those, whose KV is computed, as applied
  int num_inflight_tokens = 0;  // computed by the steps planned and not applied yet
  int num_prompt_tokens = 0;
  int num_cached_prompt_tokens = -1;  // prefix-cache hits at first admission (-1: not yet)
  // The stop rules as token counts of a sequence (StopChecker::Prepare): EOS and stop token
  // ids count from min_num_tokens (prompt + min_tokens); the sequence ends at max_num_tokens
  // (prompt + max_tokens, at most max_model_len).
  int min_num_tokens = 0;
  int max_num_tokens = 0;
  TokenId eos_token_id = -1;  // -1: the model has none, or params.ignore_eos
  std::string_view id_view;   // views `id`

  absl::InlinedVector<Sequence, 1> seqs;  // 1 until forked, then n; finished ones stay
  std::string id;
  SamplingParams params;
  int priority = 0;          // lower value is served first (vLLM's convention)
  uint64_t arrival_seq = 0;  // order of arrival (ties of arrival_time)
  double arrival_time = 0;
  std::string cache_salt;

  std::span<const TokenId> prompt() const {
    return std::span<const TokenId>(seqs[0].tokens).first(num_prompt_tokens);
  }
  bool forked() const { return static_cast<int>(seqs.size()) == n; }
  // The first sequence not finished (every request the scheduler holds has one).
  Sequence& FirstLiveSeq() {
    Sequence* seq = &seqs[0];
    while (IsFinished(seq->status)) ++seq;
    return *seq;
  }
  const Sequence& FirstLiveSeq() const {
    const Sequence* seq = &seqs[0];
    while (IsFinished(seq->status)) ++seq;
    return *seq;
  }
  int num_output_tokens() const { return num_tokens - num_prompt_tokens; }
  // What planning counts on: the tokens and computed tokens each live sequence has once the
  // steps in flight are applied (without a step in flight, num_tokens and
  // num_computed_tokens). A token sampled in flight is known by its place only.
  int num_planned_tokens() const { return num_tokens + num_inflight_samples; }
  int num_planned_computed() const { return num_computed_tokens + num_inflight_tokens; }
  // Tokens of each live sequence without a KV slot (the same for each: they advance in
  // lockstep); of a running or swapped request, at most the last sampled one.
  int num_unslotted_tokens() const { return num_planned_tokens() - FirstLiveSeq().num_slots; }
  // Whether scheduling the rest of the tokens samples: all tokens computed after the step.
  int num_uncomputed_tokens() const { return num_planned_tokens() - num_planned_computed(); }
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_REQUEST_H_
