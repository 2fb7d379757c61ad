#include "scheduler_service/core/scheduler.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "scheduler_service/core/request_prefetcher.h"

namespace llm {

absl::Status SchedulerConfig::Validate() const {
  if (max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_batched_tokens is ", max_num_batched_tokens, "; it must be >= 1"));
  }
  if (max_num_seqs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_seqs is ", max_num_seqs, "; it must be >= 1"));
  }
  if (max_model_len < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_model_len is ", max_model_len, "; it must be >= 2"));
  }
  if (long_prefill_token_threshold < 0) {
    return absl::InvalidArgumentError(absl::StrCat("long_prefill_token_threshold is ",
                                                   long_prefill_token_threshold,
                                                   "; it must be >= 0 (0: no cap)"));
  }
  if (!enable_chunked_prefill && max_num_batched_tokens < max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_batched_tokens is ", max_num_batched_tokens,
                     "; without chunked prefill it must be >= max_model_len = ", max_model_len,
                     " (a whole prompt is computed in one step)"));
  }
  if (vocab_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size is ", vocab_size, "; it must be >= 0 (0: unknown)"));
  }
  if (sampling_limits.max_n < 1 || sampling_limits.max_n >= Scheduler::kSeqIdStride) {
    return absl::InvalidArgumentError(absl::StrCat("sampling_limits.max_n is ",
                                                   sampling_limits.max_n, "; it must be in [1, ",
                                                   Scheduler::kSeqIdStride - 1, "]"));
  }
  return absl::OkStatus();
}

Scheduler::Scheduler(const SchedulerConfig& config, const BlockSpaceManagerConfig& cache_config)
    : config_(config),
      by_priority_(config.policy == SchedulingPolicy::kPriority),
      blocks_(std::make_unique<BlockSpaceManager>(cache_config)),
      block_size_(cache_config.block_size),
      stop_checker_(config.eos_token_id, config.max_model_len),
      waiting_(RankLess{by_priority_}),
      swapped_(RankLess{by_priority_}) {
  const absl::Status valid = config.Validate();
  CHECK(valid.ok()) << valid;
  usable_gpu_blocks_ = blocks_->gpu_pool().num_blocks() - blocks_->watermark_blocks();
}

absl::Status Scheduler::ValidateRequest(std::span<const TokenId> prompt,
                                        const SamplingParams& params) const {
  SamplingLimits limits = config_.sampling_limits;
  if (limits.vocab_size == 0) limits.vocab_size = config_.vocab_size;  // for logit_bias
  RETURN_IF_ERROR(params.Validate(limits));
  if (params.n > config_.max_num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n is ", params.n, "; it must be at most max_num_seqs = ", config_.max_num_seqs));
  }
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty: it has no tokens");
  for (size_t i = 0; i < prompt.size(); ++i) {
    const TokenId t = prompt[i];
    if (t < 0 || (config_.vocab_size > 0 && t >= config_.vocab_size)) {
      const std::string vocab =
          config_.vocab_size > 0 ? absl::StrCat("[0, ", config_.vocab_size, ")") : "[0, ...)";
      return absl::InvalidArgumentError(absl::StrCat("prompt token id ", t, " at position ", i,
                                                     " is outside the vocabulary ", vocab));
    }
  }
  const int len = static_cast<int>(prompt.size());
  const int max_len = config_.max_model_len;
  if (len >= max_len) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt is ", len, " tokens; at most ",
                                                   max_len - 1, " are accepted (max_model_len ",
                                                   max_len, ", less one token to generate)"));
  }
  // Refused, not clamped: a client that asked for max_tokens learns it cannot have them (an
  // unset max_tokens is the API layer's to turn into max_model_len - prompt).
  if (int64_t{len} + params.max_tokens > max_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt is ", len, " tokens and max_tokens is ", params.max_tokens, ": ",
                     len, " + ", params.max_tokens, " = ", int64_t{len} + params.max_tokens,
                     " tokens, over the model's maximum context length (max_model_len ", max_len,
                     "); ask for at most ", max_len - len,
                     " tokens, or leave max_tokens unset to fill the context"));
  }
  const int needed = BlockTable::NumRequiredBlocks(len, 0, block_size_);
  const int usable = usable_gpu_blocks_.load(std::memory_order_relaxed);
  if (needed > usable) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt is ", len, " tokens and needs ",
                                                   needed, " KV-cache blocks; the cache has ",
                                                   usable, " above its watermark"));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::AddRequest(std::string request_id, std::vector<TokenId> prompt,
                                   const SamplingParams& params, int priority, double arrival_time,
                                   std::string cache_salt) {
  CHECK(!prompt.empty()) << "request " << request_id << ": AddRequest without ValidateRequest";
  const int len = static_cast<int>(prompt.size());
  if (requests_by_id_.contains(request_id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", request_id, " already exists"));
  }
  int32_t slot;
  if (free_slots_.empty()) {
    slot = static_cast<int32_t>(slots_.size());
    slots_.emplace_back();
  } else {
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  auto req = std::make_unique<Request>();
  req->id = std::move(request_id);
  req->id_view = req->id;
  req->slot = slot;
  req->arrival_seq = next_arrival_seq_++;
  req->arrival_time = arrival_time;
  req->priority = priority;
  req->params = params;
  req->cache_salt = std::move(cache_salt);
  req->num_prompt_tokens = len;
  req->num_tokens = len;
  req->n = static_cast<int16_t>(params.n);
  stop_checker_.Prepare(req.get());
  req->seqs.reserve(params.n);
  Sequence& seq = req->seqs.emplace_back();
  seq.id = MakeSeqId(slot, 0);
  seq.tokens = std::move(prompt);
  seq.last_token = seq.tokens.back();
  // Room for the whole output, so that decoding never reallocates.
  seq.tokens.reserve(req->max_num_tokens);
  requests_by_id_.emplace(req->id, slot);
  waiting_.insert(req.get());
  slots_[slot] = std::move(req);
  return absl::OkStatus();
}

absl::Status Scheduler::Abort(std::string_view request_id_view) {
  // This Abseil's string_view is its own type, not std::string_view.
  const absl::string_view request_id(request_id_view.data(), request_id_view.size());
  auto it = requests_by_id_.find(request_id);
  if (it == requests_by_id_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " is not active"));
  }
  Request* req = slots_[it->second].get();
  switch (req->state) {
    case Request::State::kWaiting:
      waiting_.erase(req);
      break;
    case Request::State::kSwapped:
      swapped_.erase(req);
      break;
    case Request::State::kRunning:
      running_.erase(std::find(running_.begin(), running_.end(), req));
      break;
    case Request::State::kFinished:
      LOG(FATAL) << "finished request " << req->id << " still registered";
  }
  for (Sequence& seq : req->seqs) {
    if (!IsFinished(seq.status)) FreeSequence(req, &seq, SequenceStatus::kFinishedAborted);
  }
  FinishRequest(req);
  return absl::OkStatus();
}

absl::Status Scheduler::StopSequences(std::string_view request_id_view,
                                      std::span<const int> indices) {
  const absl::string_view request_id(request_id_view.data(), request_id_view.size());
  auto it = requests_by_id_.find(request_id);
  if (it == requests_by_id_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " is not active"));
  }
  Request* req = slots_[it->second].get();
  for (const int index : indices) {
    // A stop string is found in output text, so the request has forked.
    CHECK(index >= 0 && index < static_cast<int>(req->seqs.size()))
        << "request " << req->id << " has no sequence " << index;
    Sequence& seq = req->seqs[index];
    if (!IsFinished(seq.status)) FreeSequence(req, &seq, SequenceStatus::kFinishedStopped);
  }
  if (req->num_live == 0) EndLiveRequest(req);
  return absl::OkStatus();
}

void Scheduler::ResetForNewWorkers(const BlockSpaceManagerConfig& cache_config) {
  CHECK_EQ(cache_config.block_size, block_size_) << "the block size cannot change";
  // The steps in flight (if any) are abandoned: nothing of them was applied but their planning,
  // which the reset below undoes.
  AbandonStepsInFlight();
  auto forget = [](Request* req) {
    req->known_to_workers = false;
    req->resume_pending = false;
    req->num_inflight_tokens = 0;
    req->num_inflight_samples = 0;
    ++req->epoch;
    for (Sequence& seq : req->seqs) {
      seq.known_to_workers = false;
      seq.num_blocks_sent = 0;
    }
  };
  auto requeue = [&](Request* req) {
    if (req->state == Request::State::kFinished) return;  // in finished_pending_
    for (Sequence& seq : req->seqs) {
      if (IsFinished(seq.status)) continue;
      seq.num_slots = 0;
      seq.resend_table = true;
      seq.status = SequenceStatus::kWaiting;
    }
    req->num_computed_tokens = 0;
    req->state = Request::State::kWaiting;
    waiting_.insert(req);  // by rank: its place among the waiting ones is kept
  };
  for (Request* req : running_) requeue(req);
  for (Request* req : swapped_) requeue(req);
  running_.clear();
  swapped_.clear();
  num_finished_in_running_ = 0;
  newly_running_.clear();
  for (const auto& [id, slot] : requests_by_id_) forget(slots_[slot].get());
  // Ended requests the old workers knew: the new ones never did, so they are not told.
  for (Request* req : finished_pending_) forget(req);
  for (Request* req : dropped_) forget(req);
  // Every block held KV of the old workers (the swapped ones too), and every cached prefix
  // names such a block: a fresh manager, sized for the new group.
  blocks_ = std::make_unique<BlockSpaceManager>(cache_config);
  usable_gpu_blocks_ = blocks_->gpu_pool().num_blocks() - blocks_->watermark_blocks();
  ++num_resets_;
}

const SchedulerOutput& Scheduler::Schedule() {
  CHECK_LT(num_steps_in_flight(), kMaxStepsInFlight) << "Schedule() with every step in flight";
  if (num_steps_in_flight() > 0) ++num_planned_ahead_;
  StartStep();
  PreemptForWaiting();                          // step 0 of scheduler.h's comment
  ScheduleRunning();                            // step 1
  if (!preempted_this_step_) ScheduleQueued();  // step 2
  for (Request* req : newly_running_) InsertRunning(req);

  last_step_tokens_ = plan_->output.total_num_scheduled_tokens;
  total_tokens_ += last_step_tokens_;
  return plan_->output;
}

bool Scheduler::RetractEmptyStep() {
  if (num_steps_in_flight() < 2 || !plan_->output.empty()) return false;
  // What planning it changed stands without the workers: requests admitted without a chunk,
  // ones dropped (reported in the next update), finished ones the workers never knew.
  --step_id_;
  --num_planned_ahead_;
  return true;
}

void Scheduler::PlannedStep::Clear() {
  output.Clear();
  new_reqs.clear();
  cached_reqs.clear();
  new_epochs.clear();
  cached_epochs.clear();
}

void Scheduler::StartStep() {
  const bool in_flight = num_steps_in_flight() > 0;
  ++step_id_;
  plan_ = &Planned(step_id_);
  plan_->Clear();
  newly_running_.clear();
  plan_->output.step_id = step_id_;
  CompactRunning();  // before the finished requests below are destroyed
  for (Request* req : finished_pending_) {
    if (req->known_to_workers) {
      plan_->output.finished_request_ids.push_back(req->id);
      plan_->output.finished_slots.push_back(req->slot);
    }
    // A step in flight may name it: it lives until that step is applied.
    if (in_flight) {
      retired_.emplace_back(step_id_ - 1, req);
    } else {
      Destroy(req);
    }
  }
  finished_pending_.clear();
  token_budget_ = config_.max_num_batched_tokens;
  seq_budget_ = config_.max_num_seqs;
  preempted_this_step_ = false;
}

void Scheduler::Destroy(Request* req) {
  const int32_t slot = req->slot;
  slots_[slot].reset();
  free_slots_.push_back(slot);
}

void Scheduler::DestroyRetired() {
  std::erase_if(retired_, [this](const std::pair<int64_t, Request*>& r) {
    if (r.first > applied_step_id_) return false;
    Destroy(r.second);
    return true;
  });
}

void Scheduler::AbandonStepsInFlight() {
  applied_step_id_ = step_id_;
  DestroyRetired();
}

void Scheduler::PreemptForWaiting() {
  if (!by_priority_ || waiting_.empty()) return;
  Request* head = *waiting_.begin();
  // A resumed multi-sequence request waits its turn; one with samples in flight cannot be
  // admitted yet.
  if (head->num_live != 1 || head->num_inflight_samples > 0) return;
  const Sequence& seq = head->FirstLiveSeq();
  while (!running_.empty() && RankBefore(head, running_.back()) &&
         running_.back()->priority > head->priority &&
         blocks_->CanAllocate(seq.tokens, head->cache_salt) != AllocStatus::kOk) {
    Request* victim = running_.back();
    running_.pop_back();
    Preempt(victim);
  }
}

void Scheduler::ScheduleRunning() {
  size_t end = running_.size();  // running_[end..] are preempted
  for (size_t i = 0; i < end; ++i) {
    Request* req = running_[i];
    if (WaitsForItsSamples(*req)) continue;
    const int chunk = ChunkSize(*req);
    if (chunk == 0) break;  // out of budget
    PrefetchForScheduling(running_, i, end, *blocks_);
    if (!MakeRoom(i, &end)) break;  // it preempted itself
    ScheduleChunk(req, chunk, /*resumed=*/false);
  }
  running_.resize(end);
}

bool Scheduler::MakeRoom(size_t i, size_t* end) {
  while (!TryGrow(running_[i])) {
    preempted_this_step_ = true;
    Preempt(running_[--*end]);  // lowest rank: newest (FCFS) or lowest priority
    if (*end == i) return false;
  }
  return true;
}

bool Scheduler::WaitsForItsSamples(const Request& req) {
  if (req.num_inflight_samples == 0) return false;
  return req.num_planned_tokens() >= req.max_num_tokens || !req.forked();
}

int Scheduler::MaxLiveSeqs(const Request& req) { return req.forked() ? req.num_live : req.n; }

void Scheduler::ScheduleQueued() {
  if (waiting_.empty() && swapped_.empty()) return;
  // max_num_seqs bounds the live sequences of the running requests, scheduled this step or
  // not, counting those of a request not forked yet as its n.
  live_seqs_ = 0;
  for (const Request* req : running_) live_seqs_ += MaxLiveSeqs(*req);
  for (const Request* req : newly_running_) live_seqs_ += MaxLiveSeqs(*req);
  while (Request* req = NextQueued()) {
    const bool go_on = req->state == Request::State::kSwapped ? TrySwapIn(req) : TryAdmit(req);
    if (!go_on) return;
  }
}

Request* Scheduler::NextQueued() const {
  Request* swapped = swapped_.empty() ? nullptr : *swapped_.begin();
  Request* waiting = waiting_.empty() ? nullptr : *waiting_.begin();
  if (swapped == nullptr) return waiting;
  return waiting == nullptr || RankBefore(swapped, waiting) ? swapped : waiting;
}

bool Scheduler::TrySwapIn(Request* req) {
  const int chunk = ChunkSize(*req);
  if (chunk == 0 || live_seqs_ + req->num_live > config_.max_num_seqs) return false;
  const AllocStatus can = blocks_->CanSwapIn(LiveSeqIds(*req), req->num_unslotted_tokens());
  if (can == AllocStatus::kLater) return false;
  swapped_.erase(req);
  if (can == AllocStatus::kNever) {
    AbortNeverFits(req);
    return true;
  }
  SwapIn(req);
  newly_running_.push_back(req);
  live_seqs_ += req->num_live;
  if (!TryGrow(req)) return false;  // back on the GPU; computes from the next step
  ScheduleChunk(req, chunk, /*resumed=*/true);
  return true;
}

bool Scheduler::TryAdmit(Request* req) {
  const int seqs = MaxLiveSeqs(*req);
  if (token_budget_ <= 0 || seq_budget_ < seqs || live_seqs_ + seqs > config_.max_num_seqs) {
    return false;
  }
  // Preempted by recompute with a sample in flight: the workers append it, so it is
  // re-admitted with it, once it is applied.
  if (req->num_inflight_samples > 0) return false;
  const AllocStatus can = CanAdmit(*req);
  if (can == AllocStatus::kLater) return false;
  waiting_.erase(req);
  if (can == AllocStatus::kNever) {
    AbortNeverFits(req);
    return true;
  }
  Allocate(req);
  newly_running_.push_back(req);
  live_seqs_ += seqs;
  const int chunk = ChunkSize(*req);
  if (chunk > 0) ScheduleChunk(req, chunk, /*resumed=*/req->known_to_workers);
  return chunk > 0;
}

AllocStatus Scheduler::CanAdmit(const Request& req) {
  if (req.num_live == 1) {
    const Sequence& seq = req.FirstLiveSeq();
    const AllocStatus can = blocks_->CanAllocate(seq.tokens, req.cache_salt);
    if (can != AllocStatus::kOk) return can;
    if (!config_.enable_chunked_prefill &&
        req.num_tokens - blocks_->CountCachedPrefixTokens(seq.tokens, req.cache_salt) >
            token_budget_) {
      return AllocStatus::kLater;  // the uncached prompt does not fit the step
    }
    return AllocStatus::kOk;
  }
  // n > 1 sequences resumed after preemption by recompute: no prefix hits counted.
  const int needed =
      req.num_live * BlockTable::NumRequiredBlocks(req.num_tokens, 0, blocks_->block_size());
  const int usable = blocks_->gpu_pool().num_blocks() - blocks_->watermark_blocks();
  if (needed > usable) return AllocStatus::kNever;
  if (needed > blocks_->gpu_pool().num_free_blocks() - blocks_->watermark_blocks()) {
    return AllocStatus::kLater;
  }
  if (!config_.enable_chunked_prefill && !MustChunk(req) &&
      req.num_tokens * req.num_live > token_budget_) {
    return AllocStatus::kLater;
  }
  return AllocStatus::kOk;
}

void Scheduler::Allocate(Request* req) {
  int computed = req->num_tokens - 1;
  for (Sequence& seq : req->seqs) {
    if (IsFinished(seq.status)) continue;
    absl::StatusOr<int> cached = blocks_->Allocate(seq.id, seq.tokens, req->cache_salt);
    CHECK(cached.ok()) << cached.status();
    computed = std::min(computed, *cached);
    seq.num_slots = req->num_tokens;
    seq.resend_table = true;
    seq.status = SequenceStatus::kRunning;
  }
  req->num_computed_tokens = computed;
  if (req->num_cached_prompt_tokens < 0) req->num_cached_prompt_tokens = computed;
  req->state = Request::State::kRunning;
}

static void SetLiveStatus(Request* req, SequenceStatus status) {
  for (Sequence& seq : req->seqs) {
    if (!IsFinished(seq.status)) seq.status = status;
  }
}

void Scheduler::SwapIn(Request* req) {
  absl::StatusOr<std::vector<BlockPair>> pairs = blocks_->SwapIn(LiveSeqIds(*req));
  CHECK(pairs.ok()) << pairs.status();
  SchedulerOutput& out = plan_->output;
  out.blocks_to_swap_in.insert(out.blocks_to_swap_in.end(), pairs->begin(), pairs->end());
  req->state = Request::State::kRunning;
  SetLiveStatus(req, SequenceStatus::kRunning);
}

int Scheduler::ChunkSize(const Request& req) const {
  if (seq_budget_ < req.num_live) return 0;
  const int per_seq_budget = token_budget_ / req.num_live;
  int n = req.num_uncomputed_tokens();
  if (!config_.enable_chunked_prefill && !MustChunk(req)) return n <= per_seq_budget ? n : 0;
  if (config_.long_prefill_token_threshold > 0) {
    n = std::min(n, config_.long_prefill_token_threshold);
  }
  return std::min(n, per_seq_budget);
}

bool Scheduler::MustChunk(const Request& req) const {
  return req.num_uncomputed_tokens() * req.num_live > config_.max_num_batched_tokens;
}

bool Scheduler::TryGrow(Request* req) {
  if (req->num_live > 1) {
    if (!CanGrow(*req)) return false;
    Grow(req);
    return true;
  }
  // One sequence: no CanGrow, as AppendSlots checks and changes nothing when the pool cannot.
  return TryAppendSlots(req->num_planned_tokens(), &req->FirstLiveSeq());
}

bool Scheduler::CanGrow(const Request& req) {
  const int need = req.num_unslotted_tokens();
  return need == 0 || blocks_->CanAppendSlots(LiveSeqIds(req), need);
}

void Scheduler::Grow(Request* req) {
  for (Sequence& seq : req->seqs) {
    if (IsFinished(seq.status)) continue;
    const bool ok = TryAppendSlots(req->num_planned_tokens(), &seq);
    CHECK(ok) << "CanGrow said the pool could serve sequence " << seq.id;
  }
}

// inline: every decode step of every running request runs it.
inline bool Scheduler::TryAppendSlots(int num_tokens, Sequence* seq) {
  const int need = num_tokens - seq->num_slots;
  if (need == 0) return true;
  std::vector<BlockPair>& copies = plan_->output.blocks_to_copy;
  const size_t num_copies = copies.size();
  const absl::Status s = blocks_->AppendSlots(seq->id, need, 0, &copies);
  if (absl::IsResourceExhausted(s)) return false;
  CHECK(s.ok()) << s;
  // Copy-on-write replaced a block: the workers need the whole table.
  if (copies.size() != num_copies) seq->resend_table = true;
  seq->num_slots += need;
  return true;
}

void Scheduler::Preempt(Request* req) {
  ++num_preemptions_;
  // A fork in flight is applied to blocks on the GPU or to none: such a request is recomputed.
  const bool fork_in_flight = !req->forked() && req->num_inflight_samples > 0;
  if (config_.preemption_mode == PreemptionMode::kSwap && !fork_in_flight && TrySwapOut(req)) {
    return;
  }
  PreemptByRecompute(req);
}

bool Scheduler::TrySwapOut(Request* req) {
  const std::span<const SeqId> seqs = LiveSeqIds(*req);
  if (!blocks_->CanSwapOut(seqs)) return false;
  absl::StatusOr<std::vector<BlockPair>> pairs = blocks_->SwapOut(seqs);
  CHECK(pairs.ok()) << pairs.status();
  SchedulerOutput& out = plan_->output;
  out.blocks_to_swap_out.insert(out.blocks_to_swap_out.end(), pairs->begin(), pairs->end());
  ++num_swap_outs_;
  req->state = Request::State::kSwapped;
  SetLiveStatus(req, SequenceStatus::kSwapped);
  for (Sequence& seq : req->seqs) seq.resend_table = true;
  swapped_.insert(req);
  return true;
}

void Scheduler::PreemptByRecompute(Request* req) {
  for (Sequence& seq : req->seqs) {
    if (IsFinished(seq.status)) continue;
    const absl::Status s = blocks_->Free(seq.id);
    CHECK(s.ok()) << s;
    seq.num_slots = 0;
    seq.resend_table = true;
    seq.status = SequenceStatus::kWaiting;
  }
  req->num_computed_tokens = 0;
  // What steps in flight compute for it is void; what they sample is not (the workers append
  // it): TryAdmit waits for it.
  req->num_inflight_tokens = 0;
  ++req->epoch;
  req->resume_pending = req->known_to_workers;
  req->state = Request::State::kWaiting;
  waiting_.insert(req);
}

void Scheduler::InsertRunning(Request* req) {
  running_.insert(std::upper_bound(running_.begin(), running_.end(), req, RankLess{by_priority_}),
                  req);
}

void Scheduler::AbortNeverFits(Request* req) {
  for (Sequence& seq : req->seqs) {
    if (!IsFinished(seq.status)) FreeSequence(req, &seq, SequenceStatus::kFinishedAborted);
  }
  FinishRequest(req);
  dropped_.push_back(req);
}

std::span<const SeqId> Scheduler::LiveSeqIds(const Request& req) {
  seq_ids_.clear();
  for (const Sequence& seq : req.seqs) {
    if (!IsFinished(seq.status)) seq_ids_.push_back(seq.id);
  }
  return seq_ids_;
}

void Scheduler::ScheduleChunk(Request* req, int num_tokens, bool resumed) {
  token_budget_ -= num_tokens * req->num_live;
  seq_budget_ -= req->num_live;
  AddToOutput(req, num_tokens, resumed);
}

namespace {

// The sequence's diff: the tokens and block ids the workers do not have yet (the whole table
// when it must be resent). Records them as sent.
void AddSequenceDiff(const Request& req, const BlockSpaceManager& blocks, Sequence* seq,
                     SchedulerOutput* out) {
  ScheduledSequence& s = out->seqs.emplace_back();
  s.index = seq->index;
  s.new_to_workers = !seq->known_to_workers;
  s.replace_block_table = seq->resend_table || s.new_to_workers;
  // A sequence new to the workers is its request's prompt plus these tokens (its output: a
  // request resumed on new workers). A known one brings none: the workers append the tokens
  // they sample.
  s.new_token_ids.begin = static_cast<uint32_t>(out->token_ids.size());
  if (s.new_to_workers) {
    out->token_ids.insert(out->token_ids.end(), seq->tokens.begin() + req.num_prompt_tokens,
                          seq->tokens.end());
  }
  s.new_token_ids.size = static_cast<uint32_t>(out->token_ids.size()) - s.new_token_ids.begin;
  seq->known_to_workers = true;
  s.block_ids.begin = static_cast<uint32_t>(out->block_ids.size());
  // The table holds exactly the blocks its slots need (no lookahead): when the workers have
  // that many, there is nothing to send, and the table is not read.
  const int bs = blocks.block_size();
  if (!s.replace_block_table && seq->num_blocks_sent == (seq->num_slots + bs - 1) / bs) return;
  const BlockTable* table = blocks.GetBlockTable(seq->id);
  const std::span<const BlockId> ids = table->block_ids();
  const size_t first_block = s.replace_block_table ? 0 : seq->num_blocks_sent;
  const size_t begin = out->block_ids.size();
  out->block_ids.insert(out->block_ids.end(), ids.begin() + first_block, ids.end());
  // Entries given back to the pool (a sliding window) go out as block 0: the workers check
  // every id against their cache, and no query reads a block before its window (ops.h).
  if (table->num_released_blocks() > 0) {
    std::replace(out->block_ids.begin() + static_cast<ptrdiff_t>(begin), out->block_ids.end(),
                 kReleasedBlock, BlockId{0});
  }
  s.block_ids.size = static_cast<uint32_t>(ids.size() - first_block);
  seq->num_blocks_sent = static_cast<int>(ids.size());
  seq->resend_table = false;
}

}  // namespace

void Scheduler::AddToOutput(Request* req, int num_tokens, bool resumed) {
  SchedulerOutput& output = plan_->output;
  const bool is_new = !req->known_to_workers;
  ScheduledRequest& r =
      is_new ? output.new_requests.emplace_back() : output.cached_requests.emplace_back();
  (is_new ? plan_->new_reqs : plan_->cached_reqs).push_back(req);
  (is_new ? plan_->new_epochs : plan_->cached_epochs).push_back(req->epoch);
  r.slot = req->slot;
  r.request_id = req->id_view;
  if (is_new) {
    r.prompt_token_ids = req->prompt();
    r.sampling_params = &req->params;
  }
  // A request re-admitted after preemption by recompute but scheduled only in a later step
  // (its first chunk did not fit the one that admitted it) is still resuming.
  r.resumed_from_preemption = resumed || req->resume_pending;
  req->resume_pending = false;
  const int first_position = req->num_planned_computed();
  r.num_computed_tokens = first_position;
  r.num_scheduled_tokens = num_tokens;
  if (req->num_planned_computed() + num_tokens == req->num_planned_tokens()) {
    r.num_samples = !req->forked() ? req->n : req->num_live;
    ++req->num_inflight_samples;
  }
  req->num_inflight_tokens += num_tokens;
  r.seqs.begin = static_cast<uint32_t>(output.seqs.size());
  r.seqs.size = static_cast<uint32_t>(req->num_live);
  for (Sequence& seq : req->seqs) {
    if (IsFinished(seq.status)) continue;
    // With a sliding window, the blocks this step's queries and every later one cannot see.
    blocks_->ReleaseOutsideWindow(seq.id, first_position);
    AddSequenceDiff(*req, *blocks_, &seq, &output);
  }
  req->known_to_workers = true;
  output.total_num_scheduled_tokens += num_tokens * req->num_live;
  output.total_num_samples += r.num_samples;
}

absl::StatusOr<const StepOutputs*> Scheduler::UpdateFromOutput(const ModelOutput& model_output) {
  RETURN_IF_ERROR(CheckModelOutput(model_output));
  PlannedStep& step = Planned(++applied_step_id_);
  step_outputs_.Clear();
  ReportDropped();
  const std::span<const TokenId> sampled = model_output.sampled_token_ids;
  const std::span<const SampleLogprobs> logprobs = model_output.logprobs;
  size_t pos = 0;  // of the samples of the next request to sample, in output order
  ApplyStep(step.output, step.output.new_requests, step.new_reqs, step.new_epochs, sampled,
            logprobs, &pos);
  ApplyStep(step.output, step.output.cached_requests, step.cached_reqs, step.cached_epochs, sampled,
            logprobs, &pos);
  DestroyRetired();
  return &step_outputs_;
}

absl::Status Scheduler::CheckModelOutput(const ModelOutput& model_output) const {
  if (num_steps_in_flight() == 0) {
    return absl::FailedPreconditionError("UpdateFromOutput() without a Schedule()");
  }
  const SchedulerOutput& output = planned_[(applied_step_id_ + 1) % kMaxStepsInFlight].output;
  if (model_output.step_id != output.step_id) {
    return absl::InvalidArgumentError(absl::StrCat("model output is for step ",
                                                   model_output.step_id, "; step ", output.step_id,
                                                   " is awaited"));
  }
  if (static_cast<int>(model_output.sampled_token_ids.size()) != output.total_num_samples) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", output.step_id, ": ", model_output.sampled_token_ids.size(),
                     " sampled tokens for ", output.total_num_samples, " samples"));
  }
  if (!model_output.logprobs.empty() &&
      model_output.logprobs.size() != model_output.sampled_token_ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", output.step_id, ": ", model_output.logprobs.size(), " logprobs for ",
                     model_output.sampled_token_ids.size(), " sampled tokens"));
  }
  return absl::OkStatus();
}

void Scheduler::ReportDropped() {
  for (Request* req : dropped_) {
    RequestOutput& out = step_outputs_.requests.emplace_back();
    out.request_id = req->id;
    out.finished = true;
    out.num_cached_prompt_tokens = std::max(0, req->num_cached_prompt_tokens);
    out.seqs.begin = static_cast<uint32_t>(step_outputs_.seqs.size());
    for (Sequence& seq : req->seqs) {
      if (seq.status != SequenceStatus::kFinishedAborted) continue;
      SequenceOutput& so = step_outputs_.seqs.emplace_back();
      so.index = seq.index;
      so.status = seq.status;
    }
    out.seqs.size = static_cast<uint32_t>(step_outputs_.seqs.size()) - out.seqs.begin;
  }
  dropped_.clear();
}

void Scheduler::ApplyStep(const SchedulerOutput& step, std::span<const ScheduledRequest> list,
                          std::span<Request* const> reqs, std::span<const uint8_t> epochs,
                          std::span<const TokenId> sampled,
                          std::span<const SampleLogprobs> logprobs, size_t* pos) {
  for (size_t k = 0; k < reqs.size(); ++k) {
    PrefetchForSampling(reqs, k);
    Request* req = reqs[k];
    const ScheduledRequest& r = list[k];
    const size_t first = *pos;
    *pos += r.num_samples;
    // Ended since it was planned (a step before this one stopped it, or an abort): what this
    // step computed and sampled for it is dropped.
    if (req->state == Request::State::kFinished) {
      num_discarded_ += r.num_samples;
      continue;
    }
    // Preempted by recompute since: the KV is void, the samples are not.
    if (epochs[k] == req->epoch) {
      req->num_inflight_tokens -= r.num_scheduled_tokens;
      AddComputedTokens(req, r.num_scheduled_tokens);
    }
    if (r.num_samples == 0) continue;  // a prompt chunk short of its last token
    --req->num_inflight_samples;
    ApplySamples(req, step.Seqs(r), sampled.subspan(first, r.num_samples),
                 logprobs.empty() ? logprobs : logprobs.subspan(first, r.num_samples));
  }
}

// inline: every request of every step runs it.
inline void Scheduler::AddComputedTokens(Request* req, int num_tokens) {
  const int before = req->num_computed_tokens;
  req->num_computed_tokens += num_tokens;
  // Only a step that fills a block gives the prefix cache something new; a swapped-out
  // request's blocks are registered once it is back.
  const int bs = blocks_->block_size();
  if (!blocks_->config().enable_prefix_caching || before / bs == req->num_computed_tokens / bs ||
      req->state != Request::State::kRunning) {
    return;
  }
  for (const Sequence& seq : req->seqs) {
    if (IsFinished(seq.status)) continue;
    const absl::Status s =
        blocks_->CacheComputedBlocks(seq.id, seq.tokens, req->num_computed_tokens);
    CHECK(s.ok()) << s;
  }
}

void Scheduler::ApplySamples(Request* req, std::span<const ScheduledSequence> listed,
                             std::span<const TokenId> sampled,
                             std::span<const SampleLogprobs> logprobs) {
  // At the fork, sample j is sequence j's; otherwise each listed sequence's in list order.
  const bool fork = !req->forked();
  if (fork) Fork(req);
  RequestOutput& out = step_outputs_.requests.emplace_back();
  out.request_id = req->id_view;
  out.num_cached_prompt_tokens = std::max(0, req->num_cached_prompt_tokens);
  out.seqs.begin = static_cast<uint32_t>(step_outputs_.seqs.size());
  for (size_t j = 0; j < sampled.size(); ++j) {
    Sequence& seq = req->seqs[fork ? j : listed[j].index];
    // Ended by the step before (its sample here came after its stop).
    if (IsFinished(seq.status)) {
      ++num_discarded_;
      continue;
    }
    const TokenId token = sampled[j];
    seq.tokens.push_back(token);
    seq.last_token = token;
    SequenceOutput& so = step_outputs_.seqs.emplace_back();
    so.index = seq.index;
    so.new_token_ids = {static_cast<uint32_t>(step_outputs_.token_ids.size()), 1};
    step_outputs_.token_ids.push_back(token);
    if (!logprobs.empty()) step_outputs_.logprobs.push_back(logprobs[j]);
    so.status = SequenceStatus::kRunning;
    if (std::optional<SequenceStatus> stop = stop_checker_.Check(*req, &seq)) {
      FreeSequence(req, &seq, *stop);
      so.status = *stop;
      so.stop_token = seq.stop_token;
    }
  }
  out.seqs.size = static_cast<uint32_t>(step_outputs_.seqs.size()) - out.seqs.begin;
  ++req->num_tokens;
  if (req->num_live == 0) {
    EndLiveRequest(req);
    out.finished = true;
  }
}

void Scheduler::EndLiveRequest(Request* req) {
  // A request preempted with a step in flight ends in its queue.
  if (req->state == Request::State::kRunning) ++num_finished_in_running_;
  if (req->state == Request::State::kWaiting) waiting_.erase(req);
  if (req->state == Request::State::kSwapped) swapped_.erase(req);
  FinishRequest(req);
}

void Scheduler::Fork(Request* req) {
  Sequence& parent = req->seqs[0];
  for (int j = 1; j < req->n; ++j) {
    Sequence& child = req->seqs.emplace_back();
    child.id = MakeSeqId(req->slot, j);
    child.index = j;
    child.status = parent.status;  // running, or waiting when preempted
    child.tokens.reserve(parent.tokens.capacity());
    child.tokens.assign(parent.tokens.begin(), parent.tokens.end());
    child.last_token = parent.last_token;
    child.num_slots = parent.num_slots;
    // The workers fork it too, at the sample (BatchState::AppendSampled): the prompt, its
    // token, and the parent's block table as they have it.
    child.known_to_workers = parent.known_to_workers;
    child.num_blocks_sent = parent.num_blocks_sent;
    child.resend_table = parent.resend_table;
    // A request preempted by recompute while its fork was in flight holds no blocks.
    if (req->state == Request::State::kWaiting) continue;
    CHECK(req->state == Request::State::kRunning) << "fork of a swapped-out request";
    const absl::Status s = blocks_->Fork(parent.id, child.id);
    CHECK(s.ok()) << s;
  }
  req->num_live = req->n;
}

void Scheduler::FreeSequence(Request* req, Sequence* seq, SequenceStatus status) {
  if (req->state == Request::State::kRunning || req->state == Request::State::kSwapped) {
    const absl::Status s = blocks_->Free(seq->id);
    CHECK(s.ok()) << s;
  }
  seq->status = status;
  --req->num_live;
}

void Scheduler::FinishRequest(Request* req) {
  req->state = Request::State::kFinished;
  requests_by_id_.erase(req->id);
  finished_pending_.push_back(req);
}

void Scheduler::CompactRunning() {
  if (num_finished_in_running_ == 0) return;
  std::erase_if(running_, [](const Request* r) { return r->state == Request::State::kFinished; });
  num_finished_in_running_ = 0;
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.num_running = static_cast<int>(running_.size()) - num_finished_in_running_;
  for (const Request* req : running_) {
    if (req->state == Request::State::kRunning) s.num_running_seqs += req->num_live;
  }
  s.num_waiting = static_cast<int>(waiting_.size());
  s.num_swapped = static_cast<int>(swapped_.size());
  const BlockSpaceManagerStats b = blocks_->stats();
  s.gpu_kv_usage = b.gpu_usage;
  s.cpu_kv_usage = b.cpu_usage;
  s.prefix_cache_hit_rate = b.prefix_cache_hit_rate();
  s.prefix_cache_queries = b.prefix_cache_queries;
  s.prefix_cache_hits = b.prefix_cache_hits;
  s.num_window_released_blocks = b.num_window_released_blocks;
  s.num_preemptions = num_preemptions_;
  s.num_swap_outs = num_swap_outs_;
  s.num_steps = step_id_;
  s.num_worker_resets = num_resets_;
  s.num_steps_planned_ahead = num_planned_ahead_;
  s.num_samples_discarded = num_discarded_;
  s.last_step_num_scheduled_tokens = last_step_tokens_;
  s.total_num_scheduled_tokens = total_tokens_;
  return s;
}

absl::Status Scheduler::CheckInvariants() const {
  RETURN_IF_ERROR(blocks_->CheckInvariants());
  int num_running = 0, num_tables = 0;
  for (size_t i = 0; i < running_.size(); ++i) {
    if (i > 0 && RankBefore(running_[i], running_[i - 1])) {
      return absl::InternalError(absl::StrCat("running queue out of order at ", i));
    }
    num_running += running_[i]->state == Request::State::kRunning;
  }
  int counted[3] = {0, 0, 0};
  for (const auto& [id, slot] : requests_by_id_) {
    const Request* req = slots_[slot].get();
    if (req == nullptr || req->id != id) {
      return absl::InternalError(absl::StrCat("request ", id, " maps to a wrong slot"));
    }
    if (req->state == Request::State::kFinished) {
      return absl::InternalError(absl::StrCat("finished request ", id, " is still registered"));
    }
    ++counted[static_cast<int>(req->state)];
    int live = 0;
    for (const Sequence& seq : req->seqs) {
      const BlockTable* table = blocks_->GetBlockTable(seq.id);
      if (IsFinished(seq.status)) {
        if (table != nullptr) {
          return absl::InternalError(absl::StrCat("finished sequence ", seq.id, " holds blocks"));
        }
        continue;
      }
      ++live;
      if (static_cast<int>(seq.tokens.size()) != req->num_tokens) {
        return absl::InternalError(absl::StrCat("sequence ", seq.id, " has ", seq.tokens.size(),
                                                " tokens; its request has ", req->num_tokens));
      }
      if (seq.last_token != seq.tokens.back()) {
        return absl::InternalError(absl::StrCat("sequence ", seq.id, " records last token ",
                                                seq.last_token, "; its last token is ",
                                                seq.tokens.back()));
      }
      const bool has_blocks =
          req->state == Request::State::kRunning || req->state == Request::State::kSwapped;
      if (has_blocks != (table != nullptr)) {
        return absl::InternalError(absl::StrCat("sequence ", seq.id, " of a ",
                                                has_blocks ? "running/swapped" : "waiting",
                                                " request holds blocks: ", table != nullptr));
      }
      if (seq.num_slots != req->FirstLiveSeq().num_slots) {
        return absl::InternalError(absl::StrCat("sequence ", seq.id, " has ", seq.num_slots,
                                                " KV slots; its first live sibling has ",
                                                req->FirstLiveSeq().num_slots));
      }
      if (table == nullptr) continue;
      ++num_tables;
      const Device want = req->state == Request::State::kRunning ? Device::kGpu : Device::kCpu;
      if (table->device() != want || table->num_tokens() != seq.num_slots ||
          table->num_blocks() != (seq.num_slots + table->block_size() - 1) / table->block_size() ||
          seq.num_slots < req->num_tokens - 1 || seq.num_slots > req->num_planned_tokens()) {
        return absl::InternalError(absl::StrCat("sequence ", seq.id, ": table on ",
                                                DeviceName(table->device()), " with ",
                                                table->num_tokens(), " slots; ", seq.num_slots,
                                                " expected for ", req->num_tokens, " tokens"));
      }
    }
    if (num_steps_in_flight() == 0 &&
        (req->num_inflight_tokens != 0 || req->num_inflight_samples != 0)) {
      return absl::InternalError(absl::StrCat("request ", id, " counts ", req->num_inflight_tokens,
                                              " tokens and ", req->num_inflight_samples,
                                              " samples in flight; no step is"));
    }
    if (live != req->num_live || live == 0) {
      return absl::InternalError(absl::StrCat("request ", id, " has ", live, " live sequences; ",
                                              req->num_live, " counted"));
    }
    if (req->num_computed_tokens >= req->num_tokens ||
        (req->state != Request::State::kRunning && req->state != Request::State::kSwapped &&
         req->num_computed_tokens != 0)) {
      return absl::InternalError(absl::StrCat("request ", id, " has ", req->num_computed_tokens,
                                              " of ", req->num_tokens, " tokens computed"));
    }
  }
  if (counted[0] != static_cast<int>(waiting_.size()) || counted[1] != num_running ||
      counted[2] != static_cast<int>(swapped_.size())) {
    return absl::InternalError(absl::StrCat("queues hold ", waiting_.size(), "/", num_running, "/",
                                            swapped_.size(), " waiting/running/swapped requests; ",
                                            counted[0], "/", counted[1], "/", counted[2],
                                            " registered"));
  }
  if (num_tables != blocks_->num_sequences()) {
    return absl::InternalError(absl::StrCat("the block manager holds ", blocks_->num_sequences(),
                                            " tables; live sequences hold ", num_tables));
  }
  return absl::OkStatus();
}

}  // namespace llm
