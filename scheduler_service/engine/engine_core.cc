#include "scheduler_service/engine/engine_core.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace llm {

EngineCore::EngineCore(const SchedulerConfig& config, const BlockSpaceManagerConfig& cache_config,
                       Executor* executor, const DetokenizerFactory* detokenizers)
    : scheduler_(config, cache_config), detokenizers_(detokenizers), executor_(executor) {
  PublishStats();
}

EngineCore::~EngineCore() { Stop(); }

absl::Status EngineCore::AddRequest(EngineRequest request, StreamCallback on_update) {
  // Off the engine thread, once: Scheduler::AddRequest (DrainInbox) does not check again.
  RETURN_IF_ERROR(scheduler_.ValidateRequest(request.prompt_token_ids, request.sampling_params));
  if (!request.sampling_params.stop.empty() && detokenizers_ == nullptr) {
    return absl::InvalidArgumentError("stop strings need a detokenizer; this engine has none");
  }
  // The detokenizers are made here, off the engine thread.
  auto stream = std::make_shared<StreamState>(
      std::move(on_update),
      RequestText(detokenizers_, request.prompt_token_ids, request.sampling_params));
  stream->request_id = request.request_id;
  absl::MutexLock lock(&mu_);
  const uint64_t generation = ++next_generation_;
  if (!in_flight_.try_emplace(request.request_id, generation).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("request ", request.request_id, " is already in flight"));
  }
  stream->generation = generation;
  inbox_.push_back({.kind = Event::Kind::kAdd,
                    .generation = generation,
                    .request = std::move(request),
                    .stream = std::move(stream)});
  return absl::OkStatus();
}

absl::Status EngineCore::Abort(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = in_flight_.find(request_id);
  if (it == in_flight_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " is not in flight"));
  }
  Event e{.kind = Event::Kind::kAbort, .generation = it->second};
  e.request.request_id = request_id;
  in_flight_.erase(it);  // free for a new request now: its add is queued after this abort
  inbox_.push_back(std::move(e));
  return absl::OkStatus();
}

void EngineCore::DrainInbox() {
  std::vector<Event> events;
  {
    absl::MutexLock lock(&mu_);
    events.swap(inbox_);
  }
  Delivery ended;  // refused adds and aborts, in order
  for (Event& e : events) {
    EngineRequest& r = e.request;
    if (e.kind == Event::Kind::kAdd) {
      const absl::Status s =
          scheduler_.AddRequest(r.request_id, std::move(r.prompt_token_ids), r.sampling_params,
                                r.priority, /*arrival_time=*/0, std::move(r.cache_salt));
      if (!s.ok()) {
        Release(r.request_id, e.generation);
        ended.updates.push_back({.stream = std::move(e.stream), .status = s});
        continue;
      }
      streams_.emplace(r.request_id, Stream{std::move(e.stream), e.generation});
      continue;
    }
    auto it = streams_.find(r.request_id);
    // Finished meanwhile, or the id is a newer request's (the event was for an older one).
    if (it == streams_.end() || it->second.generation != e.generation) continue;
    if (e.kind == Event::Kind::kStop) {
      if (e.ended) {
        // Every sequence the scheduler still runs (the output thread ended them all).
        e.seqs.clear();
        for (int j = 0; j < r.sampling_params.n; ++j) e.seqs.push_back(j);
      }
      const absl::Status s = scheduler_.StopSequences(r.request_id, e.seqs);
      CHECK(s.ok()) << s;
      if (e.ended) streams_.erase(it);
      continue;
    }
    const absl::Status s = scheduler_.Abort(r.request_id);
    CHECK(s.ok()) << s;
    ended.updates.push_back(
        {.stream = std::move(it->second.state),
         .status = absl::CancelledError(absl::StrCat("request ", r.request_id, " aborted"))});
    streams_.erase(it);
  }
  if (!ended.updates.empty()) Deliver(std::move(ended));
}

void EngineCore::FailAll(const absl::Status& status) {
  auto streams = std::move(streams_);
  streams_.clear();
  Delivery ended;
  for (auto& [id, stream] : streams) {
    (void)scheduler_.Abort(id);
    Release(id, stream.generation);
    ended.updates.push_back({.stream = std::move(stream.state), .status = status});
  }
  if (!ended.updates.empty()) Deliver(std::move(ended));
}

void EngineCore::CopyOutputs(const StepOutputs& from, Delivery* d) {
  d->outputs = from;
  // The ids and stop strings view the scheduler's requests, which may be gone by delivery.
  for (RequestOutput& r : d->outputs.requests) r.request_id = d->strings.emplace_back(r.request_id);
  for (SequenceOutput& s : d->outputs.seqs) {
    if (!s.stop_string.empty()) s.stop_string = d->strings.emplace_back(s.stop_string);
  }
}

void EngineCore::Run(Delivery& d) {
  for (const Delivery::Update& u : d.updates) {
    StreamState& stream = *u.stream;
    // Its end was delivered (a stop string ended it): the engine thread had queued more.
    if (stream.ended) continue;
    if (u.output < 0) {
      stream.ended = true;
      stream.on_update({.status = u.status});
      continue;
    }
    RequestOutput& out = d.outputs.requests[u.output];
    const bool finished_by_scheduler = out.finished;
    RequestText::Applied applied = stream.text.Apply(&d.outputs, &out);
    stream.ended = applied.ended;
    // The id is free before the client hears of the end (the engine thread frees it for ends
    // the scheduler made).
    if (!applied.stopped.empty()) {
      TextStopped(stream, std::move(applied.stopped), applied.ended && !finished_by_scheduler);
    }
    stream.on_update({.output = &out, .outputs = &d.outputs});
  }
}

void EngineCore::TextStopped(const StreamState& stream, std::vector<int> seqs, bool ended) {
  absl::MutexLock lock(&mu_);
  if (ended) {
    auto it = in_flight_.find(stream.request_id);
    if (it != in_flight_.end() && it->second == stream.generation) in_flight_.erase(it);
  }
  Event e{.kind = Event::Kind::kStop, .generation = stream.generation};
  e.request.request_id = stream.request_id;
  e.request.sampling_params.n = stream.text.n();
  e.seqs = std::move(seqs);
  e.ended = ended;
  inbox_.push_back(std::move(e));
}

void EngineCore::Deliver(Delivery d) {
  absl::MutexLock lock(&out_mu_);
  if (!out_running_) {
    // No output thread: now, on this thread, after what is queued (nothing, unless Stop()
    // is draining).
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(out_mu_) {
      return out_queue_.empty() && !out_busy_;
    };
    out_mu_.Await(absl::Condition(&idle));
    out_mu_.Unlock();
    Run(d);
    out_mu_.Lock();
    return;
  }
  auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(out_mu_) {
    return out_queue_.size() < kMaxQueuedOutputs || !out_running_;
  };
  out_mu_.Await(absl::Condition(&room));
  out_queue_.push_back(std::move(d));
}

void EngineCore::OutputLoop() {
  absl::MutexLock lock(&out_mu_);
  while (true) {
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(out_mu_) {
      return !out_queue_.empty() || !out_running_;
    };
    out_mu_.Await(absl::Condition(&ready));
    if (out_queue_.empty()) return;  // stopped, and everything delivered
    Delivery d = std::move(out_queue_.front());
    out_queue_.pop_front();
    out_busy_ = true;
    out_mu_.Unlock();
    Run(d);
    out_mu_.Lock();
    out_busy_ = false;
  }
}

void EngineCore::Release(absl::string_view id, uint64_t generation) {
  absl::MutexLock lock(&mu_);
  auto it = in_flight_.find(id);
  if (it != in_flight_.end() && it->second == generation) in_flight_.erase(it);
}

EngineStats EngineCore::stats_snapshot() const {
  absl::MutexLock lock(&stats_mu_);
  return stats_;
}

void EngineCore::PublishStats() {
  EngineStats s;
  s.scheduler = scheduler_.stats();
  const BlockSpaceManagerStats b = scheduler_.block_manager().stats();
  s.num_free_gpu_blocks = b.num_free_gpu_blocks;
  s.num_free_cpu_blocks = b.num_free_cpu_blocks;
  absl::MutexLock lock(&stats_mu_);
  s.worker = model_output_.worker_stats.has_value() ? model_output_.worker_stats : stats_.worker;
  stats_ = s;
}

absl::StatusOr<bool> EngineCore::Step() {
  stats_published_ = false;
  absl::StatusOr<bool> busy = StepOnce();
  if (!stats_published_) PublishStats();  // a step that ran published before its streams
  return busy;
}

void EngineCore::ReplaceExecutor(Executor* executor, const BlockSpaceManagerConfig& cache) {
  CHECK(executor != nullptr);
  absl::MutexLock lock(&mu_);
  pending_executor_ = executor;
  pending_cache_ = cache;
  if (!running_thread_) return;
  auto adopted = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return pending_executor_ == nullptr || !running_thread_;
  };
  mu_.Await(absl::Condition(&adopted));
}

absl::Status EngineCore::paused_on() const {
  absl::MutexLock lock(&mu_);
  return paused_on_;
}

void EngineCore::AdoptExecutor() {
  Executor* executor;
  BlockSpaceManagerConfig cache;
  {
    absl::MutexLock lock(&mu_);
    if (pending_executor_ == nullptr) return;
    executor = pending_executor_;
    cache = pending_cache_;
  }
  // Whatever the previous workers held is gone, failed or not (steps in flight included).
  scheduler_.ResetForNewWorkers(cache);
  planned_at_.clear();
  executor_ = executor;
  absl::MutexLock lock(&mu_);
  pending_executor_ = nullptr;
  if (!paused_on_.ok()) {
    LOG(INFO) << "engine resumes on new workers after: " << paused_on_.message() << "; "
              << scheduler_.num_requests() << " request(s) recomputed";
  }
  paused_on_ = absl::OkStatus();
}

void EngineCore::OnExecutorFailure(const absl::Status& status) {
  executor_->DropSubmitted();
  planned_at_.clear();
  if (recovery_timeout_ <= absl::ZeroDuration()) {
    // The steps' results are unusable: end every stream with the error.
    scheduler_.AbandonStepsInFlight();
    FailAll(status);
    return;
  }
  // Nothing of the steps in flight is applied; every request waits, with its tokens, for new
  // workers.
  scheduler_.ResetForNewWorkers(scheduler_.block_manager().config());
  if (recovering_since_ == absl::InfiniteFuture()) recovering_since_ = absl::Now();
  LOG(WARNING) << "engine paused, " << scheduler_.num_requests()
               << " request(s) wait for the worker group: " << status;
  absl::MutexLock lock(&mu_);
  paused_on_ = status;
}

void EngineCore::ExpireRecovery() {
  absl::Status cause;
  {
    absl::MutexLock lock(&mu_);
    cause = paused_on_;
  }
  if (cause.ok() || absl::Now() < recovering_since_ + recovery_timeout_) return;
  if (!streams_.empty()) {
    FailAll(absl::UnavailableError(absl::StrCat("the worker group did not recover within ",
                                                absl::FormatDuration(recovery_timeout_), " after ",
                                                cause.message())));
  }
  recovering_since_ = absl::Now();  // requests that come later get a whole timeout
}

absl::StatusOr<bool> EngineCore::StepOnce() {
  AdoptExecutor();
  DrainInbox();
  if (!paused_on().ok()) {
    ExpireRecovery();
    return false;
  }
  const bool work = scheduler_.HasUnfinishedRequests() || scheduler_.has_finished_to_report();
  if (async_scheduling_) return AsyncStep(work);
  if (!work) return false;
  return SyncStep();
}

absl::StatusOr<bool> EngineCore::SyncStep() {
  const auto t0 = std::chrono::steady_clock::now();
  const SchedulerOutput& step = scheduler_.Schedule();
  const auto t1 = std::chrono::steady_clock::now();
  absl::Status s = executor_->Execute(step, &model_output_);
  if (!s.ok()) {
    OnExecutorFailure(s);
    return s;
  }
  RETURN_IF_ERROR(ApplyResult(t0, t1, std::chrono::steady_clock::now()));
  return true;
}

absl::StatusOr<bool> EngineCore::AsyncStep(bool work) {
  using Clock = std::chrono::steady_clock;
  bool submitted = false;
  if (work) {
    const Clock::time_point t0 = Clock::now();
    const SchedulerOutput& step = scheduler_.Schedule();
    if (!scheduler_.RetractEmptyStep()) {
      if (absl::Status s = executor_->Submit(step); !s.ok()) {
        OnExecutorFailure(s);
        return s;
      }
      submitted = true;
      planned_at_.push_back({t0, Clock::now()});
    }
  }
  const int in_flight = scheduler_.num_steps_in_flight();
  if (in_flight == 0) return false;
  // The only step in flight was just submitted: plan the next one before waiting for it.
  if (submitted && in_flight < Scheduler::kMaxStepsInFlight) return true;
  if (absl::Status s = executor_->Collect(&model_output_); !s.ok()) {
    OnExecutorFailure(s);
    return s;
  }
  const auto [start, planned] = planned_at_.front();
  planned_at_.pop_front();
  RETURN_IF_ERROR(ApplyResult(start, planned, Clock::now()));
  return true;
}

absl::Status EngineCore::ApplyResult(std::chrono::steady_clock::time_point t0,
                                     std::chrono::steady_clock::time_point t1,
                                     std::chrono::steady_clock::time_point t2) {
  recovering_since_ = absl::InfiniteFuture();
  absl::StatusOr<const StepOutputs*> outputs = scheduler_.UpdateFromOutput(model_output_);
  if (!outputs.ok()) {
    executor_->DropSubmitted();
    planned_at_.clear();
    scheduler_.AbandonStepsInFlight();
    FailAll(outputs.status());
    return outputs.status();
  }
  // Before any stream hears of this step: a client that sees its request end and then asks for
  // stats gets this step's (the worker's memory and counters included).
  PublishStats();
  stats_published_ = true;
  const auto t3 = std::chrono::steady_clock::now();
  Delivery d;
  CopyOutputs(**outputs, &d);
  for (size_t i = 0; i < d.outputs.requests.size(); ++i) {
    const RequestOutput& out = d.outputs.requests[i];
    const absl::string_view id(out.request_id.data(), out.request_id.size());
    auto it = streams_.find(id);
    if (it == streams_.end()) continue;
    if (!out.finished) {
      d.updates.push_back({.stream = it->second.state, .output = static_cast<int>(i)});
      continue;
    }
    // The id is free again before the stream's end is delivered: a client that sees the end
    // may reuse it at once.
    d.updates.push_back({.stream = std::move(it->second.state), .output = static_cast<int>(i)});
    const uint64_t generation = it->second.generation;
    streams_.erase(it);
    Release(id, generation);
  }
  Deliver(std::move(d));
  if (VLOG_IS_ON(1)) {
    const auto t4 = std::chrono::steady_clock::now();
    using Ms = std::chrono::duration<double, std::milli>;
    // Asynchronous: "execute" runs from the step's submission to its result, and overlaps
    // the planning and outputs of the steps around it.
    VLOG(1) << "engine step " << model_output_.step_id << ": schedule " << Ms(t1 - t0).count()
            << " ms, execute " << Ms(t2 - t1).count() << " ms, outputs " << Ms(t4 - t2).count()
            << " ms (update " << Ms(t3 - t2).count() << " ms: tokens and stop checks; streams "
            << Ms(t4 - t3).count()
            << " ms: copied and queued, or text made and delivered without Start())"
            << (async_scheduling_ ? " [async]" : "");
  }
  return absl::OkStatus();
}

absl::Status EngineCore::RunUntilIdle() {
  while (true) {
    ASSIGN_OR_RETURN(const bool busy, Step());
    if (!busy) {
      absl::MutexLock lock(&mu_);
      if (inbox_.empty()) return absl::OkStatus();
    }
  }
}

void EngineCore::Loop() {
  while (true) {
    absl::StatusOr<bool> busy = Step();
    if (!busy.ok()) LOG(ERROR) << "engine step failed: " << busy.status();
    absl::MutexLock lock(&mu_);
    if (stop_) break;
    if (busy.ok() && *busy) continue;
    if (paused_on_.ok()) {
      mu_.Await(absl::Condition(this, &EngineCore::HasWorkOrStop));
    } else {
      // Paused: wake up for the recovery deadline too.
      mu_.AwaitWithDeadline(
          absl::Condition(this, &EngineCore::HasWorkOrStop),
          std::min(recovering_since_ + recovery_timeout_, absl::Now() + absl::Seconds(1)));
    }
    if (stop_) break;
  }
  absl::MutexLock lock(&mu_);
  running_thread_ = false;  // a ReplaceExecutor waiting for adoption returns
}

bool EngineCore::HasWorkOrStop() const {
  return stop_ || !inbox_.empty() || pending_executor_ != nullptr;
}

void EngineCore::Start() {
  CHECK(!thread_.joinable()) << "engine already started";
  {
    absl::MutexLock lock(&out_mu_);
    out_running_ = true;
  }
  out_thread_ = std::thread([this] { OutputLoop(); });
  {
    absl::MutexLock lock(&mu_);
    stop_ = false;
    running_thread_ = true;
  }
  thread_ = std::thread([this] { Loop(); });
}

void EngineCore::Stop() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  {
    absl::MutexLock lock(&out_mu_);
    out_running_ = false;  // the output thread delivers what is queued, then ends
  }
  out_thread_.join();
}

}  // namespace llm
