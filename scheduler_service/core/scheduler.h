// The central scheduler: continuous batching over a paged KV cache, with chunked prefill,
// prefix caching, preemption by recompute or by swap, FCFS or priority policy, and n > 1.
//
// There is no prefill or decode phase: each request's num_computed_tokens catches up with its
// token count under a per-step token budget. Each Schedule():
//
//   0. (priority policy) the first waiting request, when it cannot be allocated, preempts
//      running requests of lower priority, lowest first, until it can (this does not count
//      as preempting in step 2's sense);
//   1. running requests, in rank order: each gets min(uncomputed, chunk cap, budget) tokens
//      per live sequence; a decode first makes room for its new token (AppendSlots), and when
//      the pool cannot, preempts the running request of lowest rank (FCFS: newest; priority:
//      lowest priority, newest first), possibly itself;
//   2. unless step 1 preempted: swapped requests (swap in while CanSwapIn says OK) and
//      waiting requests (admit while CanAllocate says OK), both in rank order — the two queues
//      are merged by rank (policy: FCFS = arrival; priority = priority, then arrival), so a
//      swapped request goes before every waiting request that arrived after it; the first
//      that cannot be served stops both. Admission allocates the whole prompt (prefix hits
//      reused) and computes the rest in chunks.
//
// Without chunked prefill a prompt is computed in one step; only a request whose n > 1 live
// sequences were preempted by recompute, and together exceed max_num_batched_tokens, is then
// recomputed in chunks.
//
// Preemption by recompute frees the blocks and puts the request back in waiting (ahead of
// later arrivals) with num_computed_tokens = 0; by swap, moves its blocks to the CPU pool into
// the swapped queue, or recomputes when the CPU pool cannot take them.
//
// Schedule() fills a SchedulerOutput (scheduler_output.h documents the protocol); the workers
// run it; UpdateFromOutput() appends the sampled tokens, applies the stop rules
// (stop_checker.h), frees finished sequences at once and returns the per-request outputs.
// Their passes over the batch prefetch each request's memory some requests ahead
// (request_prefetcher.h): hints that no decision depends on.
//
// Asynchronous scheduling: Schedule() may plan step N + 1 while step N is in flight (planned,
// not applied; at most kMaxStepsInFlight steps are), and UpdateFromOutput() applies the oldest
// step in flight. Planning then counts on each running sequence gaining the token step N
// samples (Request::num_planned_tokens: its place is known, its value is not, and the workers
// have it when step N + 1 runs, as they run steps in order and append what they sample). What
// the result of step N may change is made safe so:
//   - a sequence that step N ends (EOS, stop token or string, abort) is in step N + 1 too: the
//     token sampled for it there is dropped, its blocks were freed when step N was applied, and
//     its request lives (ended, reported to the workers) until step N + 1 is applied;
//   - a request is not planned past what it is known to reach: not when the tokens in flight
//     reach max_tokens (or max_model_len), and not while its n > 1 fork is in flight;
//   - a request preempted by recompute with a step in flight keeps the tokens that step
//     samples (the workers append them too) and is re-admitted only once they are applied;
//     the KV that step computes is void (Request::epoch);
//   - prefix-cache blocks are registered from applied tokens only.
// Without a step in flight, planning is exactly the synchronous one.
//
// Not thread-safe: owned by the engine thread (EngineCore).
#ifndef LLM_SCHEDULER_SERVICE_CORE_SCHEDULER_H_
#define LLM_SCHEDULER_SERVICE_CORE_SCHEDULER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/sampling_params.h"
#include "common/types.h"
#include "protocol/scheduler_output.h"
#include "scheduler_service/core/block_space_manager.h"
#include "scheduler_service/core/request.h"
#include "scheduler_service/core/request_output.h"
#include "scheduler_service/core/stop_checker.h"

namespace llm {

enum class PreemptionMode { kRecompute, kSwap };
enum class SchedulingPolicy { kFcfs, kPriority };

struct SchedulerConfig {
  int max_num_batched_tokens = 2048;  // tokens computed per step, over all sequences
  // Live sequences scheduled per step, and live sequences of the running requests at any time
  // (a request not forked yet counts as n: its fork after the prefill stays within it).
  int max_num_seqs = 256;
  int max_model_len = 2048;  // prompt + output tokens of a sequence
  bool enable_chunked_prefill = false;
  // Chunk cap per request per step when chunked prefill is on; 0: only the budget caps it.
  int long_prefill_token_threshold = 0;
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  TokenId eos_token_id = -1;  // < 0: none
  int vocab_size = 0;         // prompt token ids must be below it; 0: unknown, only >= 0
  SamplingLimits sampling_limits;

  // INVALID_ARGUMENT naming the field, its value and the allowed range. Without chunked
  // prefill a whole prompt must fit one step: max_num_batched_tokens >= max_model_len.
  absl::Status Validate() const;
};

struct SchedulerStats {
  int num_running = 0;       // requests
  int num_running_seqs = 0;  // their live sequences (at most max_num_seqs)
  int num_waiting = 0;
  int num_swapped = 0;
  double gpu_kv_usage = 0;
  double cpu_kv_usage = 0;
  double prefix_cache_hit_rate = 0;
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up, cumulative
  int64_t prefix_cache_hits = 0;     // of those, cached
  int64_t num_preemptions = 0;       // total, both modes
  // KV blocks given back before their sequences ended, because no query could see them any
  // more (a model whose every layer has a sliding window), cumulative.
  int64_t num_window_released_blocks = 0;
  int64_t num_swap_outs = 0;
  int64_t num_steps = 0;
  int64_t num_worker_resets = 0;  // ResetForNewWorkers calls
  // Asynchronous scheduling: steps planned while another was in flight, and tokens sampled
  // for sequences that had ended by then (dropped: no client sees them).
  int64_t num_steps_planned_ahead = 0;
  int64_t num_samples_discarded = 0;
  int last_step_num_scheduled_tokens = 0;
  int64_t total_num_scheduled_tokens = 0;
};

class Scheduler {
 public:
  // Both configs must be valid (CHECK). The scheduler sees tokens only: stop strings and text
  // are the engine's (request_text.h), which ends sequences by their text with StopSequences.
  Scheduler(const SchedulerConfig& config, const BlockSpaceManagerConfig& cache_config);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request that passed ValidateRequest: it is not checked again (an empty prompt, or
  // prompt + max_tokens over max_model_len, is a CHECK failure). ALREADY_EXISTS for an id in
  // use.
  absl::Status AddRequest(std::string request_id, std::vector<TokenId> prompt,
                          const SamplingParams& params, int priority = 0, double arrival_time = 0,
                          std::string cache_salt = {});

  // The admission check of a request, the one place every request rule is checked (the API
  // layer only turns its wire form into these types; the workers check only what sizes their
  // buffers): EngineCore::AddRequest calls it once per request, on the caller's thread.
  // INVALID_ARGUMENT naming the field and its value for bad sampling params (against
  // sampling_limits), n over max_num_seqs, an empty prompt, a token id outside the vocabulary,
  // a prompt of max_model_len tokens or more, prompt + max_tokens over max_model_len, a prompt
  // that can never fit the KV cache. Thread-safe.
  absl::Status ValidateRequest(std::span<const TokenId> prompt, const SamplingParams& params) const;

  // Ends the request in whatever state it is, frees its blocks now, and tells the workers in
  // the next step (what steps in flight sample for it is dropped). NOT_FOUND for an unknown
  // (or finished) id.
  absl::Status Abort(std::string_view request_id);
  // Ends the request's live sequences of these indices as stopped (a stop string ended their
  // text), frees their blocks now, and ends the request, unreported (its stream has ended),
  // when none is left; what steps in flight sample for them is dropped. Indices of sequences
  // that ended meanwhile are skipped. NOT_FOUND for an unknown (or finished) id.
  absl::Status StopSequences(std::string_view request_id, std::span<const int> indices);

  // The workers were replaced (the old group failed): whatever they held is gone. Abandons the
  // steps in flight (none of their samples is applied), and puts every
  // running and swapped request back in waiting as preempted by recompute (every token kept,
  // prompt and output; no KV), in its place by rank. Every request becomes unknown to the
  // workers (it is sent whole, as a new request, when next scheduled), and the block manager is
  // replaced by a fresh one over `cache_config` (same block_size; the block counts may differ),
  // so every block is free and the prefix cache is empty. Requests that no longer fit the new
  // cache are dropped when next considered (reported as aborted).
  void ResetForNewWorkers(const BlockSpaceManagerConfig& cache_config);

  static constexpr int kMaxStepsInFlight = 2;

  // Plans one step, with fewer than kMaxStepsInFlight steps in flight (CHECK). The output is
  // valid until the Schedule() after the next.
  const SchedulerOutput& Schedule();
  // Takes back the step just planned when it is empty (SchedulerOutput::empty()) and another
  // step is in flight: there is nothing to send before that one's result is applied. False
  // (nothing changed) otherwise.
  bool RetractEmptyStep();

  // Applies the workers' answer to the oldest step in flight. INVALID_ARGUMENT when it does
  // not match (step id, token count) — nothing is applied then. The outputs are valid until
  // the next UpdateFromOutput() or Abort().
  absl::StatusOr<const StepOutputs*> UpdateFromOutput(const ModelOutput& model_output);
  // Steps planned and not applied.
  int num_steps_in_flight() const { return static_cast<int>(step_id_ - applied_step_id_); }
  // Forgets the steps in flight without applying them, for an engine that ends every request
  // after its workers failed (ResetForNewWorkers does this itself).
  void AbandonStepsInFlight();

  bool HasUnfinishedRequests() const { return !requests_by_id_.empty(); }
  // Requests ended since the last Schedule() that the workers must still be told about.
  bool has_finished_to_report() const { return !finished_pending_.empty(); }
  int num_requests() const { return static_cast<int>(requests_by_id_.size()); }
  SchedulerStats stats() const;
  const BlockSpaceManager& block_manager() const { return *blocks_; }
  const SchedulerConfig& config() const { return config_; }

  // Every invariant between the queues, the requests and the block manager (plus the block
  // manager's own). O(requests + blocks); for tests.
  absl::Status CheckInvariants() const;

  // The SeqId of sequence `index` of the request in dense slot `slot`.
  static constexpr SeqId kSeqIdStride = 1 << 10;
  static SeqId MakeSeqId(int32_t slot, int index) {
    return static_cast<SeqId>(slot) * kSeqIdStride + index;
  }

 private:
  // Orders waiting / swapped requests (and running ones): policy rank, then arrival.
  struct RankLess {
    bool by_priority;
    bool operator()(const Request* a, const Request* b) const {
      if (by_priority && a->priority != b->priority) return a->priority < b->priority;
      return a->arrival_seq < b->arrival_seq;
    }
  };

  bool RankBefore(const Request* a, const Request* b) const { return RankLess{by_priority_}(a, b); }

  // Schedule(), in the order of the header comment.
  // A cleared output that lists the requests finished since the last step; full budgets.
  void StartStep();
  // 0. (priority) The first waiting request preempts running ones of lower priority.
  void PreemptForWaiting();
  // 1. The running requests in rank order, while the budgets last.
  void ScheduleRunning();
  // Makes room for running_[i]'s new tokens; while the pool cannot, preempts the running
  // request of lowest rank (running_[*end - 1], then *end is one less). False when that was
  // running_[i] itself.
  bool MakeRoom(size_t i, size_t* end);
  // 2. Swapped and waiting requests in rank order; stops at the first that cannot be served.
  void ScheduleQueued();
  // The head of swapped_ or of waiting_, whichever ranks first; null when both are empty.
  Request* NextQueued() const;
  // The live sequences a request holds once running: n until it forked.
  static int MaxLiveSeqs(const Request& req);
  // Whether to go on with the queues (served or dropped: true; no room: false).
  bool TrySwapIn(Request* req);
  bool TryAdmit(Request* req);
  // Whether the waiting request's live sequences can be allocated now: their blocks above the
  // watermark and, without chunked prefill, their uncached tokens within the token budget.
  AllocStatus CanAdmit(const Request& req);
  // Allocates the live sequences' blocks (prefix hits reused, counted as computed).
  void Allocate(Request* req);
  // Moves the swapped request's blocks back to the GPU; it runs again.
  void SwapIn(Request* req);

  // The tokens to compute this step for each live sequence, or 0 when none fit.
  int ChunkSize(const Request& req) const;
  // Without chunked prefill, whether the request can never be computed in one step anyway:
  // n > 1 live sequences resumed after recompute. It is then computed in chunks.
  bool MustChunk(const Request& req) const;

  // Gives each live sequence's tokens without a KV slot one; false (and nothing changed) when
  // the pool cannot.
  bool TryGrow(Request* req);
  // TryGrow for a request with several live sequences, in two steps.
  bool CanGrow(const Request& req);
  void Grow(Request* req);
  // Gives the sequence's first num_tokens tokens KV slots; false (and nothing changed) when
  // the pool cannot.
  bool TryAppendSlots(int num_tokens, Sequence* seq);

  // Preempts a running request that the caller took off running_ (or past its end), in the
  // configured mode.
  void Preempt(Request* req);
  // Preemption by swap; false (and nothing changed) when the CPU pool cannot take the blocks.
  bool TrySwapOut(Request* req);
  void PreemptByRecompute(Request* req);
  void InsertRunning(Request* req);
  // Ends a request that can never fit the KV cache (reported as aborted).
  void AbortNeverFits(Request* req);
  // The ids of the request's live sequences, in seq_ids_ (valid until the next call).
  std::span<const SeqId> LiveSeqIds(const Request& req);

  // Schedules num_tokens of each live sequence of the request this step: spends the budgets
  // and adds the request to the output.
  void ScheduleChunk(Request* req, int num_tokens, bool resumed);
  // The request's entry in the output, and each live sequence's diff.
  void AddToOutput(Request* req, int num_tokens, bool resumed);

  // UpdateFromOutput(), in order.
  // FAILED_PRECONDITION without a Schedule(); INVALID_ARGUMENT for an answer that does not
  // match the step.
  absl::Status CheckModelOutput(const ModelOutput& model_output) const;
  // Outputs for the requests dropped since the last update (they can never fit the cache).
  void ReportDropped();
  // A step planned, kept until it is applied.
  struct PlannedStep {
    SchedulerOutput output;
    // Parallel to output.new_requests and output.cached_requests: each scheduled request and
    // its epoch when planned.
    std::vector<Request*> new_reqs, cached_reqs;
    std::vector<uint8_t> new_epochs, cached_epochs;
    void Clear();
  };
  PlannedStep& Planned(int64_t step_id) { return planned_[step_id % kMaxStepsInFlight]; }

  // Applies the step to the requests of one of its lists: their computed tokens, then their
  // samples, from `sampled[*pos]` on. Requests ended since it was planned are skipped.
  void ApplyStep(const SchedulerOutput& step, std::span<const ScheduledRequest> list,
                 std::span<Request* const> reqs, std::span<const uint8_t> epochs,
                 std::span<const TokenId> sampled, std::span<const SampleLogprobs> logprobs,
                 size_t* pos);
  // Counts the tokens computed; registers blocks they filled with the prefix cache.
  void AddComputedTokens(Request* req, int num_tokens);
  // Appends one sampled token to each sequence the step listed that is still live, and
  // applies the stop rules; the first sample of a request with n > 1 forks it first.
  // `logprobs` is empty or parallel to `sampled`.
  void ApplySamples(Request* req, std::span<const ScheduledSequence> listed,
                    std::span<const TokenId> sampled, std::span<const SampleLogprobs> logprobs);
  // Whether planning leaves the running request out this step: what the steps in flight
  // sample for it ends it by length, or forks it.
  static bool WaitsForItsSamples(const Request& req);
  // Destroys the ended requests that no step in flight names any more.
  void DestroyRetired();
  void Destroy(Request* req);
  // Sequences 1 .. n-1 as copies of sequence 0, sharing its blocks.
  void Fork(Request* req);

  void FreeSequence(Request* req, Sequence* seq, SequenceStatus status);
  void FinishRequest(Request* req);
  // Finishes a request whose last live sequence just ended, taking it out of its queue.
  void EndLiveRequest(Request* req);
  void CompactRunning();

  const SchedulerConfig config_;
  const bool by_priority_;
  std::unique_ptr<BlockSpaceManager> blocks_;  // replaced by ResetForNewWorkers
  const int block_size_;
  // What ValidateRequest reads from other threads: the device blocks above the watermark.
  std::atomic<int> usable_gpu_blocks_{0};
  StopChecker stop_checker_;

  std::vector<std::unique_ptr<Request>> slots_;  // by slot; null when free
  std::vector<int32_t> free_slots_;
  absl::flat_hash_map<std::string, int32_t> requests_by_id_;
  uint64_t next_arrival_seq_ = 0;

  std::vector<Request*> running_;  // in rank order; finished ones removed at the next step
  std::set<Request*, RankLess> waiting_;
  std::set<Request*, RankLess> swapped_;
  std::vector<Request*> finished_pending_;  // to report to the workers in the next step
  std::vector<Request*> dropped_;           // to report to their streams in the next update
  // Ended and reported, but named by a step in flight: destroyed once the step of that id is
  // applied (or abandoned).
  std::vector<std::pair<int64_t, Request*>> retired_;
  int num_finished_in_running_ = 0;

  // The steps in flight, and the one being planned (plan_, one of them).
  PlannedStep planned_[kMaxStepsInFlight];
  PlannedStep* plan_ = &planned_[0];
  std::vector<Request*> newly_running_;  // admitted / swapped in this step
  int64_t applied_step_id_ = 0;          // the last step applied (or abandoned)
  int token_budget_ = 0;
  int seq_budget_ = 0;
  int live_seqs_ = 0;  // ScheduleQueued: of the running requests and those it admits
  bool preempted_this_step_ = false;
  StepOutputs step_outputs_;
  std::vector<SeqId> seq_ids_;  // scratch
  int64_t step_id_ = 0;

  int64_t num_preemptions_ = 0;
  int64_t num_swap_outs_ = 0;
  int64_t num_resets_ = 0;
  int64_t num_planned_ahead_ = 0;
  int64_t num_discarded_ = 0;
  int last_step_tokens_ = 0;
  int64_t total_tokens_ = 0;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_SCHEDULER_H_
