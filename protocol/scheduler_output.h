// The step protocol, in process: what the scheduler tells the workers each step
// (SchedulerOutput, a diff against what they already know) and what they answer
// (ModelOutput). The proto messages StepRequest / StepResult mirror these field for field.
//
// A worker keeps, per request (keyed by `slot`, a dense id; `request_id` names it), the prompt,
// the sampling params, the num_computed_tokens, and per sequence its token ids and GPU block
// table. Applying one SchedulerOutput, in this order:
//
//   1. finished_request_ids: forget those requests (their slots may be reused below).
//   2. blocks_to_swap_out (gpu -> cpu), then blocks_to_swap_in (cpu -> gpu), then
//      blocks_to_copy (gpu -> gpu, copy-on-write): all before the forward pass.
//   3. new_requests: create the request (prompt, params); cached_requests: update it. For both,
//      num_computed_tokens replaces the worker's count (it drops to the prefix-cache hits when
//      the request is resumed after preemption by recompute), and `seqs` lists every live
//      sequence of the request in index order; a sequence the worker has that is not listed has
//      finished: forget it. Per listed sequence:
//        - new_to_workers: the sequence's tokens are the request's prompt + new_token_ids
//          (its output so far: empty for a new request, the tokens generated before when the
//          request is resumed on workers that never held it); a known sequence brings no
//          tokens (new_token_ids empty): the worker has them, it appended them itself (6.);
//        - replace_block_table: block_ids is the whole table (new sequence, resumed after
//          preemption, swapped in, or a block replaced by copy-on-write); otherwise append
//          block_ids to the table.
//   4. Compute, for each listed sequence, tokens [num_computed_tokens, num_computed_tokens +
//      num_scheduled_tokens) into the slots of its table. Then num_computed_tokens +=
//      num_scheduled_tokens.
//   5. Sample num_samples tokens per request into ModelOutput::sampled_token_ids, requests in
//      order (new_requests, then cached_requests). num_samples is 0 when the request still has
//      tokens to compute (a partial prefill chunk); when the step computes its last token it
//      is the number of listed sequences, one token for each in list order, except at the
//      first sample of a request with n > 1 that has not forked (one sequence listed): then it
//      is n, token j for sequence j (the scheduler forks sequences 1 .. n-1 from sequence 0,
//      sharing its blocks).
//   6. Append each sampled token to its sequence; at a fork, sequence j becomes the prompt
//      plus token j with sequence 0's block table (the scheduler forks the same way and lists
//      them as known from the next step on).
//
// So a decode step carries what only the scheduler knows (admissions, block ids, preemptions,
// swaps, copies, finishes, which rows sample) and no token ids: every rank appends what it
// sampled, and every rank samples the same tokens (the same logits, and the seed every request
// carries: the API draws one for a request without; every rank's StepResult.sampled_digest
// lets the scheduler check that the ranks agree).
//
// BatchState (protocol/batch_state.h) is that worker side, run by every worker and by the tests'
// FakeExecutor. Ranges
// index the output's flat arrays (token_ids, block_ids, seqs), which are reused between steps:
// a SchedulerOutput is valid until the next Schedule().
#ifndef LLM_PROTOCOL_SCHEDULER_OUTPUT_H_
#define LLM_PROTOCOL_SCHEDULER_OUTPUT_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/sampling_params.h"
#include "common/types.h"

namespace llm {

// [begin, begin + size) of one of the output's flat arrays.
struct IndexRange {
  uint32_t begin = 0;
  uint32_t size = 0;
};

struct ScheduledSequence {
  int index = 0;
  bool new_to_workers = false;
  bool replace_block_table = false;
  IndexRange new_token_ids;  // into SchedulerOutput::token_ids
  IndexRange block_ids;      // into SchedulerOutput::block_ids
};

struct ScheduledRequest {
  int32_t slot = 0;
  std::string_view request_id;
  // new_requests only: the prompt and params (valid until the next Schedule()).
  std::span<const TokenId> prompt_token_ids;
  const SamplingParams* sampling_params = nullptr;
  // cached_requests only: resumed after preemption by recompute (whole tables follow).
  bool resumed_from_preemption = false;
  int num_computed_tokens = 0;   // per listed sequence, before this step
  int num_scheduled_tokens = 0;  // per listed sequence, this step
  int num_samples = 0;           // tokens the workers sample for this request this step
  IndexRange seqs;               // into SchedulerOutput::seqs
};

struct SchedulerOutput {
  int64_t step_id = 0;
  std::vector<ScheduledRequest> new_requests;
  std::vector<ScheduledRequest> cached_requests;
  std::vector<std::string> finished_request_ids;
  std::vector<int32_t> finished_slots;  // the same requests' slots
  std::vector<BlockPair> blocks_to_swap_in;
  std::vector<BlockPair> blocks_to_swap_out;
  std::vector<BlockPair> blocks_to_copy;
  int total_num_scheduled_tokens = 0;  // sum over sequences of tokens computed this step
  int total_num_samples = 0;

  std::vector<ScheduledSequence> seqs;
  std::vector<TokenId> token_ids;
  std::vector<BlockId> block_ids;

  std::span<const ScheduledSequence> Seqs(const ScheduledRequest& r) const {
    return std::span<const ScheduledSequence>(seqs).subspan(r.seqs.begin, r.seqs.size);
  }
  std::span<const TokenId> NewTokenIds(const ScheduledSequence& s) const {
    return std::span<const TokenId>(token_ids).subspan(s.new_token_ids.begin, s.new_token_ids.size);
  }
  std::span<const BlockId> BlockIds(const ScheduledSequence& s) const {
    return std::span<const BlockId>(block_ids).subspan(s.block_ids.begin, s.block_ids.size);
  }
  bool empty() const {
    return new_requests.empty() && cached_requests.empty() && finished_request_ids.empty() &&
           blocks_to_swap_in.empty() && blocks_to_swap_out.empty() && blocks_to_copy.empty();
  }
  void Clear() {
    new_requests.clear();
    cached_requests.clear();
    finished_request_ids.clear();
    finished_slots.clear();
    blocks_to_swap_in.clear();
    blocks_to_swap_out.clear();
    blocks_to_copy.clear();
    total_num_scheduled_tokens = 0;
    total_num_samples = 0;
    seqs.clear();
    token_ids.clear();
    block_ids.clear();
  }
};

// The log-probabilities of one sampled token under the model's raw distribution (the
// log_softmax of its logits before penalties and temperature), for requests that ask.
struct SampleLogprobs {
  float logprob = 0;                           // of the sampled token
  std::vector<std::pair<TokenId, float>> top;  // the request's top N, most likely first
};

// What a worker runs with, and cumulative counts since its runner was created (a worker's
// InitCache); mirrors llm.v1.WorkerStats. The linear_plan counts are the process's (cuBLASLt,
// kernels/cuda/cuda_ops.h).
struct WorkerStats {
  enum class Sampler { kHost, kDevice };
  Sampler sampler = Sampler::kHost;
  bool cuda_graphs_enabled = false;
  int64_t steps = 0;        // steps that ran the model
  int64_t graph_steps = 0;  // of those, replayed from a captured CUDA graph
  int64_t graphs_captured = 0;
  int64_t device_sampled_steps = 0;
  int64_t host_sampled_steps = 0;
  int64_t linear_plans = 0;
  int64_t linear_plan_hits = 0;
  int64_t linear_plan_misses = 0;
  int64_t constrained_samples = 0;  // samples drawn under a structured output's token mask
  int64_t grammar_mask_micros = 0;  // host time filling those masks
  // The worker's memory, in bytes, sampled at most once a second (mirrors
  // llm.v1.WorkerStats.memory).
  struct Memory {
    int64_t resident = 0;       // the process's resident set (host)
    int64_t weights = 0;        // the model's weights in their serving form (on its device)
    int64_t coded_weights = 0;  // of those, the 12-bit coded copies of bf16 weights (cpu)
    int64_t kv_reserved = 0;    // the KV cache's arena
    int64_t kv_resident = 0;    // of it, resident in host memory (cpu: the blocks written)
    int64_t swap_reserved = 0;  // the swap space (host)
    int64_t swap_resident = 0;  // of it, resident
    int64_t activations = 0;    // the model's activation and input buffers (cpu: resident)
  };
  Memory memory;
};

// The workers' answer to one step.
struct ModelOutput {
  int64_t step_id = 0;
  // total_num_samples tokens: per request in output order, num_samples each (see above).
  std::vector<TokenId> sampled_token_ids;
  // Empty when no request of the step asked for logprobs; otherwise parallel to
  // sampled_token_ids (entries of requests that did not ask are left empty).
  std::vector<SampleLogprobs> logprobs;
  // Rank 0's counters after this step; absent from a rank that did not report them.
  std::optional<WorkerStats> worker_stats;
};

}  // namespace llm

#endif  // LLM_PROTOCOL_SCHEDULER_OUTPUT_H_
