// A worker's view of the running batch, kept from the step diffs alone
// (protocol/scheduler_output.h gives the protocol), and the batch each step runs.
//
// Per request (by slot) it holds the prompt, the sampling params, num_computed_tokens and, per
// live sequence, the token ids, the block table and the sampling state (SamplingState: the
// one copy every sampler reads). Apply(step):
//
//   1. checks the whole step against that state, changing nothing when a check fails;
//   2. forgets the finished requests, creates the new ones, applies each listed request's diff
//      (sequences, tokens, block tables) and advances its num_computed_tokens;
//   3. lays out the batch: every listed sequence with tokens scheduled, requests in output
//      order (new_requests, then cached_requests), sequences in list order.
//
// The sampling state follows the same diff: every sequence's state is made with its request
// (so the sequences a fork makes at the first sample draw that sample from their own), counts
// the tokens a sequence new to the workers brings and every token appended to it
// (AppendSampled), and goes with the sequence. The arithmetic that reads it is
// worker_service/sampler.h's.
//
// A request with a structured output (SamplingParams::structured) gets its grammar, compiled
// once per distinct constraint by config.grammars, and each of its sequences a matcher in its
// sampling state, advanced by every token the state records: the tokens a sequence new to the
// workers brings, then each one sampled. A worker without config.grammars refuses such a
// request (INVALID_ARGUMENT), as it does a constraint that does not compile.
//
// Swaps and copies move KV, not state: the caller applies them after Apply returns OK and
// before the forward pass.
//
// Both ends of the protocol run this code: every worker's ModelRunner and the FakeExecutor that
// the engine's tests and the simulator drive, so the fake tests the state machine that ships.
//
// Checks (INVALID_ARGUMENT, naming the step, the request and the field): a slot listed twice or
// negative; a new request that is already known, or comes without a prompt or sampling params;
// a cached request the worker does not hold (or holds under another id), or whose
// num_computed_tokens differs from the worker's without a resume from preemption; a sequence
// listed out of order, outside [0, n), or unknown without new_to_workers, or known with it; a
// range outside the step's arrays; a token id outside the vocabulary; a block id outside the
// cache; live sequences of different lengths; tokens scheduled past a sequence's tokens or
// blocks; samples that are neither none, one per listed sequence, nor n from one unforked
// sequence, or that come before the last token is computed; a swap or copy pair out of range.
// The step codec checks only what the wire form adds (protocol/step_codec.h).
//
// Buffers: the BatchInputs arrays are members, cleared and refilled each step (capacity kept),
// so a steady-state step allocates none of them; a GPU worker uploads them from here.
//
// Thread-safety: one thread.
#ifndef LLM_PROTOCOL_BATCH_STATE_H_
#define LLM_PROTOCOL_BATCH_STATE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/sampling_params.h"
#include "common/types.h"
#include "protocol/scheduler_output.h"
#include "structured/grammar_cache.h"
#include "structured/grammar_matcher.h"

namespace llm {

struct BatchStateConfig {
  int num_gpu_blocks = 0;  // the device cache's blocks: block ids and copy pairs index it
  int num_cpu_blocks = 0;  // the swap space's blocks
  int block_size = 16;
  int vocab_size = 0;  // token ids are in [0, vocab_size)
  // Compiles the requests' structured outputs; shared by the runners a worker makes.
  std::shared_ptr<structured::GrammarCache> grammars;
};

// The inputs of one step's forward pass and its sampling. T tokens, S batch sequences (listed
// sequences with tokens scheduled), R sampling rows.
struct BatchInputs {
  // A batch sequence: which request (slot) and which of its sequences.
  struct SeqRef {
    int32_t slot = 0;
    int32_t index = 0;
  };
  // One token to sample, in ModelOutput::sampled_token_ids' order.
  struct Sample {
    int32_t batch_seq = 0;   // the batch sequence whose last token's logits it samples from
    int32_t logits_row = 0;  // that sequence's row in logits_indices (and in the logits)
    int32_t seq_index = 0;   // the sequence the token is for (a fork: 0 .. n-1 from one row)
  };

  std::vector<int32_t> token_ids;     // [T]
  std::vector<int32_t> positions;     // [T]
  std::vector<int64_t> slot_mapping;  // [T]: block_table[p / block_size] * block_size + p % ...
  std::vector<int32_t> block_tables;  // [S, max_blocks] row-major, padded with block 0
  int max_blocks = 0;
  std::vector<int32_t> seq_lens;         // [S]: context including this step's tokens
  std::vector<int32_t> query_start_loc;  // [S + 1]: sequence s has tokens [qsl[s], qsl[s+1])
  std::vector<int32_t> logits_indices;   // [R]: rows of [T] whose logits are sampled
  std::vector<SeqRef> seqs;              // [S]
  std::vector<Sample> samples;           // one per token to sample

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_seqs() const { return static_cast<int>(seq_lens.size()); }
};

// A DeviceSampler's hold on one of its penalty slots (worker_service/device_sampler.h). The
// sampler may give the slot to another sequence (when all are held); the hold is good while
// the sampler's lease on the slot is still `lease`, so a stale one is never mistaken for it.
struct DeviceSlot {
  int slot = -1;  // none when negative
  uint64_t lease = 0;
};

// The sampling state of one sequence, beside the request's params, seed and prompt-token set.
struct SamplingState {
  // Tokens sampled for the sequence so far, its output length: the Philox counter of its next
  // draw, whichever workers drew the earlier ones.
  uint64_t num_samples = 0;
  // Output token -> occurrences, kept only when a penalty is on (the only reader).
  absl::flat_hash_map<TokenId, int> output_counts;
  DeviceSlot device_slot;
  // The sequence's progress through its request's structured output; null without one.
  std::unique_ptr<structured::GrammarMatcher> grammar;

  // Records one output token; `count`: a penalty of the request is on. A token the grammar
  // does not take (one sampled past its end, which the scheduler drops) leaves it as it was.
  void AddOutputToken(TokenId token, bool count) {
    ++num_samples;
    if (count) ++output_counts[token];
    if (grammar != nullptr) grammar->AcceptToken(token);
  }
  // Whether sampling is constrained now: a grammar that has not ended (once it has, the
  // sequence's further samples are past its stop, which the scheduler drops).
  bool constrained() const { return grammar != nullptr && !grammar->IsTerminated(); }
};

// The distinct tokens of `prompt`, ascending, when the repetition penalty is on; otherwise
// none (nothing else reads them).
std::vector<TokenId> RepetitionPenaltyTokens(const SamplingParams& params,
                                             std::span<const TokenId> prompt);

// OK, or INVALID_ARGUMENT naming `what` when a pair's source is outside [0, src_blocks) or its
// destination outside [0, dst_blocks): the check of every swap and copy list.
absl::Status CheckBlockPairs(std::span<const BlockPair> pairs, int src_blocks, int dst_blocks,
                             const char* what);

class BatchState {
 public:
  struct Sequence {
    bool live = false;               // listed in the last step that listed its request
    std::vector<TokenId> token_ids;  // prompt + output
    std::vector<BlockId> block_table;
    SamplingState sampling;
  };
  struct Request {
    std::string request_id;
    std::vector<TokenId> prompt;
    SamplingParams params;
    // params.seed, or for a request without one a seed drawn here at random (the API gives
    // every request a seed, so that every rank draws the same tokens).
    uint64_t seed = 0;
    std::vector<TokenId> prompt_token_set;  // RepetitionPenaltyTokens(params, prompt)
    std::shared_ptr<const structured::CompiledGrammar> grammar;  // params.structured's
    int num_computed_tokens = 0;
    std::vector<Sequence> seqs;  // by index, params.n of them
  };

  explicit BatchState(const BatchStateConfig& config);
  BatchState(const BatchState&) = delete;
  BatchState& operator=(const BatchState&) = delete;

  // Checks `step`, then applies it and lays out inputs(); on error nothing has changed. The
  // step's arrays need not outlive the call.
  absl::Status Apply(const SchedulerOutput& step);

  // Appends the step's sampled tokens (one per inputs().samples entry, in that order) to their
  // sequences and records them in the sequences' sampling state: a worker keeps its own
  // tokens, the scheduler does not send them back. At the first sample of a request with
  // n > 1, sequence j (j > 0) is made here from the prompt, its token and the parent's block
  // table, as the scheduler forks it. Call after the Apply that laid out those samples, before
  // the next Apply.
  void AppendSampled(std::span<const TokenId> sampled);

  // Forgets every request, as if all had finished; their device slots are listed in
  // released_device_slots().
  void Clear();

  // The batch of the last step applied (valid until the next Apply).
  const BatchInputs& inputs() const { return inputs_; }
  // The request in `slot`, or null.
  const Request* FindRequest(int32_t slot) const;
  // The sampling state of sequence `seq_index` of the request in `slot`, which must be held:
  // the samplers record their own state there (a DeviceSampler, its penalty slot).
  SamplingState* MutableSamplingState(int32_t slot, int seq_index);
  // The device slots held by the sequences that the last Apply (or Clear) dropped: their
  // holder releases them (DeviceSampler::Release) before the next Apply.
  std::span<const DeviceSlot> released_device_slots() const { return released_device_slots_; }
  int num_requests() const { return static_cast<int>(requests_.size()); }
  const BatchStateConfig& config() const { return config_; }

 private:
  absl::Status Validate(const SchedulerOutput& step);
  absl::Status ValidateRequest(const SchedulerOutput& step, const ScheduledRequest& r,
                               bool is_new) const;
  absl::Status ValidatePairs(const SchedulerOutput& step) const;
  void ApplyRequest(const SchedulerOutput& step, const ScheduledRequest& r, bool is_new);
  void AddToBatch(const SchedulerOutput& step, const ScheduledRequest& r);
  void FillBlockTables();
  // Resets a sequence that ended (or that starts anew), listing its device slot as released;
  // its grammar matcher starts again from `grammar` (null: none).
  void ResetSequence(Sequence* seq,
                     const std::shared_ptr<const structured::CompiledGrammar>& grammar = nullptr);

  const BatchStateConfig config_;
  absl::flat_hash_map<int32_t, Request> requests_;  // by slot
  BatchInputs inputs_;
  // Reused by Validate: the step's finished slots, sorted, and the slots it schedules.
  std::vector<int32_t> finished_slots_;
  std::vector<int32_t> scheduled_slots_;
  // Reused by AddToBatch: the block table of each batch sequence.
  std::vector<const std::vector<BlockId>*> tables_;
  std::vector<DeviceSlot> released_device_slots_;
  // Reused by Validate: the grammars of the step's new requests, in order (null: none).
  std::vector<std::shared_ptr<const structured::CompiledGrammar>> new_grammars_;
};

}  // namespace llm

#endif  // LLM_PROTOCOL_BATCH_STATE_H_
