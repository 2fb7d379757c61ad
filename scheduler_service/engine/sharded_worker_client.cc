#include "scheduler_service/engine/sharded_worker_client.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_security.h"
#include "glog/logging.h"
#include "protocol/step_codec.h"

namespace llm {
namespace {

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

std::string Describe(const grpc::Status& s) {
  return absl::StrCat(CodeName(s.error_code()), ": ", s.error_message());
}

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMicroseconds(d);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardedWorkerClient>> ShardedWorkerClient::Create(
    ShardedWorkerClientOptions options) {
  if (options.addresses.empty()) {
    return absl::InvalidArgumentError("the worker group needs at least one worker address");
  }
  if (options.worker_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the worker timeout must be positive");
  }
  if (options.keepalive_time < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the keepalive time must be >= 0 (0: no keepalive), got ",
                     absl::FormatDuration(options.keepalive_time)));
  }
  if (options.keepalive_time > absl::ZeroDuration() &&
      options.keepalive_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the keepalive timeout must be positive, got ",
                     absl::FormatDuration(options.keepalive_timeout)));
  }
  return std::unique_ptr<ShardedWorkerClient>(new ShardedWorkerClient(std::move(options)));
}

ShardedWorkerClient::ShardedWorkerClient(ShardedWorkerClientOptions options)
    : options_(std::move(options)) {
  for (size_t i = 0; i < options_.addresses.size(); ++i) {
    auto r = std::make_unique<Rank>();
    r->rank = static_cast<int>(i);
    r->address = options_.addresses[i];
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    // A fresh client per group attempt: do not inherit another channel's reconnect backoff.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    if (options_.keepalive_time > absl::ZeroDuration()) {
      args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
                  static_cast<int>(absl::ToInt64Milliseconds(options_.keepalive_time)));
      args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                  static_cast<int>(absl::ToInt64Milliseconds(options_.keepalive_timeout)));
      // Between steps the streams are idle, and before the first one there are no calls at all.
      args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
      args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // no limit
    }
    r->stub = v1::WorkerService::NewStub(
        CreateInternalChannel(r->address, args, options_.cluster_secret));
    ranks_.push_back(std::move(r));
  }
}

ShardedWorkerClient::~ShardedWorkerClient() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (grpc::ClientContext* c : contexts_) c->TryCancel();
  }
  for (auto& r : ranks_) {
    if (r->writer.joinable()) r->writer.join();
    if (r->reader.joinable()) r->reader.join();
  }
  for (auto& r : ranks_) {
    if (r->stream == nullptr) continue;
    if (!r->finished) (void)r->stream->Finish();  // cancelled above: returns at once
    Unregister(r->stream_context.get());
  }
}

absl::Status ShardedWorkerClient::RankError(const Rank& r, const std::string& reason) const {
  return absl::UnavailableError(
      absl::StrCat("worker rank ", r.rank, " at ", r.address, ": ", reason));
}

bool ShardedWorkerClient::Register(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  if (cancelled_ || stopping_) return false;
  contexts_.push_back(context);
  return true;
}

void ShardedWorkerClient::Unregister(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  contexts_.erase(std::remove(contexts_.begin(), contexts_.end(), context), contexts_.end());
}

void ShardedWorkerClient::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (failure_.ok()) failure_ = absl::CancelledError("the worker group client was cancelled");
  for (grpc::ClientContext* c : contexts_) c->TryCancel();
}

absl::Status ShardedWorkerClient::failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

void ShardedWorkerClient::Fail(const absl::Status& status) {
  bool first = false;
  {
    absl::MutexLock lock(&mu_);
    if (failure_.ok()) {
      failure_ = status;
      first = !cancelled_;
    }
    for (auto& r : ranks_) {
      if (r->stream_context != nullptr) r->stream_context->TryCancel();
    }
  }
  if (first) {
    LOG(ERROR) << "worker group failed: " << status;
    if (options_.on_failure) options_.on_failure(status);
  }
}

absl::Status ShardedWorkerClient::HealthRound(absl::Duration deadline) {
  for (auto& r : ranks_) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(deadline));
    if (!Register(&ctx)) return absl::CancelledError("the worker group client was cancelled");
    v1::HealthRequest req;
    v1::HealthResponse resp;
    const grpc::Status s = r->stub->Health(&ctx, req, &resp);
    Unregister(&ctx);
    if (!s.ok()) return RankError(*r, absl::StrCat("Health: ", Describe(s)));
    if (!resp.serving()) return RankError(*r, absl::StrCat("not serving: ", resp.detail()));
  }
  return absl::OkStatus();
}

absl::Status ShardedWorkerClient::WaitUntilHealthy(std::string* last_reason) {
  const absl::Duration deadline = std::min(absl::Seconds(2), options_.worker_timeout);
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    const absl::Time start = absl::Now();
    const absl::Status s = HealthRound(deadline);
    if (s.ok() || s.code() == absl::StatusCode::kCancelled) return s;
    if (last_reason != nullptr) *last_reason = std::string(s.message());
    VLOG(1) << "waiting for the workers: " << s;
    // A round that waited out its deadline found a rank that does not answer (stopped, stalled):
    // the next call goes out at once, so that one is always waiting when the rank answers again.
    // A rank that refuses (not up yet, restarting) is asked again after a short backoff.
    if (absl::Now() - start >= deadline) continue;
    absl::MutexLock lock(&mu_);
    auto cancelled = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return cancelled_ || stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&cancelled), backoff)) {
      return absl::CancelledError("the worker group client was cancelled");
    }
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

absl::Status ShardedWorkerClient::CheckHealth() {
  const absl::Status s = HealthRound(options_.worker_timeout);
  if (!s.ok() && s.code() != absl::StatusCode::kCancelled) Fail(s);
  return failure();
}

bool ShardedWorkerClient::IsPermanent(absl::StatusCode code) {
  return code == absl::StatusCode::kInvalidArgument ||
         code == absl::StatusCode::kFailedPrecondition;
}

absl::Status ShardedWorkerClient::ForEachRank(
    const char* what, const std::function<grpc::Status(Rank&, grpc::ClientContext*)>& call) {
  // The contexts outlive every thread, so that the first failure can cancel the other calls
  // (a rank blocked in the rendezvous would otherwise hold the round for the whole timeout).
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(DeadlineAfter(options_.worker_timeout));
  }
  absl::Mutex first_mu;
  absl::Status first;  // the first failure in time: the cause, not a cancelled bystander
  std::vector<grpc::StatusCode> codes(ranks_.size(), grpc::StatusCode::OK);
  std::vector<absl::Status> statuses(ranks_.size());
  std::vector<std::thread> threads;
  threads.reserve(ranks_.size());
  for (size_t i = 0; i < ranks_.size(); ++i) {
    threads.emplace_back([&, i] {
      Rank& r = *ranks_[i];
      grpc::ClientContext* ctx = contexts[i].get();
      absl::Status status;
      grpc::StatusCode code = grpc::StatusCode::CANCELLED;
      if (!Register(ctx)) {
        status = absl::CancelledError("the worker group client was cancelled");
      } else {
        const grpc::Status s = call(r, ctx);
        Unregister(ctx);
        code = s.error_code();
        if (!s.ok()) status = RankError(r, absl::StrCat(what, ": ", Describe(s)));
      }
      absl::MutexLock lock(&first_mu);
      codes[i] = code;
      statuses[i] = status;
      if (status.ok()) return;
      // A refusal that retrying cannot fix (INVALID_ARGUMENT, FAILED_PRECONDITION) lets the
      // other ranks answer too: when every rank refuses, the attempt fails for good.
      const bool permanent = IsPermanent(static_cast<absl::StatusCode>(code));
      if (!first.ok()) {
        if (!permanent) {
          for (auto& c : contexts) c->TryCancel();
        }
        return;
      }
      first = status;
      if (!permanent) {
        for (auto& c : contexts) c->TryCancel();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (first.ok()) return first;
  for (grpc::StatusCode c : codes) {
    if (!IsPermanent(static_cast<absl::StatusCode>(c))) return first;
  }
  // Every rank refused: rank 0's answer, with its code, names what to change.
  return absl::Status(static_cast<absl::StatusCode>(codes[0]),
                      absl::StrCat("every rank refused ", what, " (", ranks_.size(),
                                   " ranks); the first: ", statuses[0].message()));
}

absl::StatusOr<std::vector<v1::InitResponse>> ShardedWorkerClient::Init(
    const v1::InitRequest& base) {
  std::vector<v1::InitResponse> responses(ranks_.size());
  const absl::Status s = ForEachRank("Init", [&](Rank& r, grpc::ClientContext* ctx) {
    v1::InitRequest req = base;
    req.set_rank(r.rank);
    req.set_world_size(world_size());
    return r.stub->Init(ctx, req, &responses[r.rank]);
  });
  if (!s.ok()) return s;
  return responses;
}

absl::StatusOr<v1::ProfileMemoryResponse> ShardedWorkerClient::ProfileMemory(
    const v1::ProfileMemoryRequest& req) {
  std::vector<v1::ProfileMemoryResponse> responses(ranks_.size());
  const absl::Status s = ForEachRank("ProfileMemory", [&](Rank& r, grpc::ClientContext* ctx) {
    return r.stub->ProfileMemory(ctx, req, &responses[r.rank]);
  });
  if (!s.ok()) return s;
  v1::ProfileMemoryResponse min = responses[0];
  for (const v1::ProfileMemoryResponse& p : responses) {
    min.set_num_gpu_blocks(std::min(min.num_gpu_blocks(), p.num_gpu_blocks()));
    min.set_num_cpu_blocks(std::min(min.num_cpu_blocks(), p.num_cpu_blocks()));
    min.set_bytes_per_block(std::max(min.bytes_per_block(), p.bytes_per_block()));
  }
  return min;
}

absl::Status ShardedWorkerClient::InitCache(const v1::InitCacheRequest& req) {
  return ForEachRank("InitCache", [&](Rank& r, grpc::ClientContext* ctx) {
    v1::InitCacheResponse resp;
    return r.stub->InitCache(ctx, req, &resp);
  });
}

absl::Status ShardedWorkerClient::OpenStreams() {
  for (auto& r : ranks_) {
    CHECK(r->stream == nullptr) << "streams already open";
    r->stream_context = std::make_unique<grpc::ClientContext>();
    if (!Register(r->stream_context.get())) {
      return absl::CancelledError("the worker group client was cancelled");
    }
    r->stream = r->stub->Step(r->stream_context.get());
  }
  for (auto& r : ranks_) {
    Rank* rank = r.get();
    r->writer = std::thread([this, rank] { WriterLoop(rank); });
    r->reader = std::thread([this, rank] { ReaderLoop(rank); });
  }
  return absl::OkStatus();
}

void ShardedWorkerClient::WriterLoop(Rank* r) {
  uint64_t job = 0;
  while (true) {
    bool skip;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || job_ > job; };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      ++job;
      // Once the stream broke, the reader reports it for every later job.
      skip = r->write_failed_job != 0 || r->closing;
      r->writing = !skip;
    }
    const bool ok = skip || r->stream->Write(requests_[job % kMaxStepsInFlight]);
    absl::MutexLock lock(&mu_);
    r->writing = false;
    if (!ok) r->write_failed_job = job;
    r->written = job;
  }
}

void ShardedWorkerClient::ReaderLoop(Rank* r) {
  uint64_t job = 0;
  while (true) {
    bool write_failed;
    {
      absl::MutexLock lock(&mu_);
      // A job is read once written: a worker answers only what it has received.
      auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || r->written > job; };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      ++job;
      write_failed = r->write_failed_job != 0 && r->write_failed_job <= job;
    }
    Answer answer;
    answer.job = job;
    if (r->broken.ok()) {
      const char* broke = nullptr;
      if (write_failed) {
        broke = "the step stream broke while sending: ";
      } else if (!r->stream->Read(&answer.result)) {
        broke = "the step stream broke: ";
      }
      if (broke != nullptr) {
        {
          // gRPC's sync stream allows a Read beside a Write, not a Finish. The stream is over,
          // so the writer's Write (if any) ends at once; it writes no more.
          absl::MutexLock lock(&mu_);
          r->closing = true;
          auto idle = [r]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !r->writing; };
          mu_.Await(absl::Condition(&idle));
        }
        r->finished = true;
        r->broken = absl::UnavailableError(absl::StrCat(broke, Describe(r->stream->Finish())));
      }
    }
    answer.status = r->broken;
    absl::MutexLock lock(&mu_);
    r->answers[job % kMaxStepsInFlight] = std::move(answer);
    r->read = job;
  }
}

bool ShardedWorkerClient::AllRead(uint64_t job) const {
  for (const auto& r : ranks_) {
    if (r->read < job) return false;
  }
  return true;
}

absl::Status ShardedWorkerClient::TimedOutRank(const std::vector<bool>& timed_out,
                                               int64_t step_id) {
  const std::string late = absl::StrCat("no answer to step ", step_id, " within ",
                                        absl::FormatDuration(options_.worker_timeout));
  std::vector<int> late_ranks;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (timed_out[i]) late_ranks.push_back(static_cast<int>(i));
  }
  if (late_ranks.size() == 1) return RankError(*ranks_[late_ranks[0]], late);
  // Several ranks are late: one that stalls (stopped, cut off) holds the others in a
  // collective. The stalled one does not answer Health either; the others do.
  for (int i : late_ranks) {
    Rank& r = *ranks_[i];
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(std::min(absl::Seconds(2), options_.worker_timeout)));
    v1::HealthRequest req;
    v1::HealthResponse resp;
    const grpc::Status s = r.stub->Health(&ctx, req, &resp);
    if (!s.ok()) {
      return RankError(r, absl::StrCat(late, ", nor to Health: ", Describe(s)));
    }
  }
  return RankError(*ranks_[late_ranks[0]], late);
}

absl::Status ShardedWorkerClient::Execute(const SchedulerOutput& step, ModelOutput* out) {
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    if (job_ != collected_) {
      return absl::FailedPreconditionError("Execute() while steps submitted are not collected");
    }
  }
  const absl::Status s = Submit(step);
  if (!s.ok()) return s;
  return Collect(out);
}

absl::Status ShardedWorkerClient::Submit(const SchedulerOutput& step) {
  uint64_t job;
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    CHECK(ranks_[0]->stream != nullptr) << "Submit before OpenStreams";
    if (job_ - collected_ >= kMaxStepsInFlight) {
      return absl::FailedPreconditionError(
          absl::StrCat("Submit() with ", kMaxStepsInFlight, " steps submitted and not collected"));
    }
    job = job_ + 1;
    // The buffer's last job was collected, so every rank has read its answer and written it.
    for (const auto& r : ranks_) CHECK_GE(r->written + kMaxStepsInFlight, job);
  }
  EncodeStepRequest(step, &requests_[job % kMaxStepsInFlight]);
  absl::MutexLock lock(&mu_);
  job_ = job;
  return absl::OkStatus();
}

absl::Status ShardedWorkerClient::Collect(ModelOutput* out) {
  uint64_t job;
  std::vector<Answer> answers(ranks_.size());
  std::vector<bool> timed_out(ranks_.size(), false);
  bool any_timed_out = false;
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    if (collected_ == job_) {
      return absl::FailedPreconditionError("Collect() without a step submitted");
    }
    job = collected_ + 1;
    auto all_read = [this, job]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return AllRead(job); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&all_read), options_.worker_timeout)) {
      for (size_t i = 0; i < ranks_.size(); ++i) timed_out[i] = ranks_[i]->read < job;
      any_timed_out = true;
      // Unblock the rank threads' Write / Read; they then report CANCELLED.
      for (auto& r : ranks_) r->stream_context->TryCancel();
      mu_.Await(absl::Condition(&all_read));
    }
    for (size_t i = 0; i < ranks_.size(); ++i) {
      Answer& a = ranks_[i]->answers[job % kMaxStepsInFlight];
      CHECK_EQ(a.job, job);
      answers[i] = std::move(a);
    }
    collected_ = job;
  }
  const int64_t step_id = static_cast<int64_t>(requests_[job % kMaxStepsInFlight].step_id());
  absl::Status error;
  if (any_timed_out) {
    error = TimedOutRank(timed_out, step_id);
  } else {
    // A rank whose stream broke is the cause; a rank that answered an error (a collective that
    // a dead peer never reached) is its bystander, named only when no stream broke.
    for (size_t i = 0; i < ranks_.size() && error.ok(); ++i) {
      const Answer& a = answers[i];
      if (!a.status.ok()) error = RankError(*ranks_[i], std::string(a.status.message()));
    }
    for (size_t i = 0; i < ranks_.size() && error.ok(); ++i) {
      const v1::StepResult& result = answers[i].result;
      if (result.step_id() != static_cast<uint64_t>(step_id)) {
        error = RankError(*ranks_[i],
                          absl::StrCat("answered step ", result.step_id(), " to step ", step_id));
      } else if (result.error_code() != 0) {
        error = RankError(*ranks_[i],
                          absl::StrCat("step ", step_id, " failed: ",
                                       CodeName(static_cast<grpc::StatusCode>(result.error_code())),
                                       ": ", result.error_message()));
      }
    }
  }
  if (error.ok()) {
    const absl::Status s = DecodeStepResult(answers[0].result, out);
    if (!s.ok()) error = RankError(*ranks_[0], absl::StrCat("bad step result: ", s.ToString()));
  }
  if (error.ok()) {
    // Each rank appended the tokens it sampled: one that sampled others than rank 0 holds
    // sequences (and soon KV) that are not the scheduler's.
    const uint64_t digest = SampledTokensDigest(out->sampled_token_ids);
    for (size_t i = 0; i < ranks_.size() && error.ok(); ++i) {
      const Rank& r = *ranks_[i];
      const uint64_t rank_digest = answers[i].result.sampled_digest();
      if (rank_digest == digest) continue;
      error = absl::InternalError(absl::StrCat(
          "worker rank ", r.rank, " at ", r.address, " sampled other tokens than rank 0 in step ",
          step_id, " (digest ", absl::Hex(rank_digest), ", rank 0's tokens give ",
          absl::Hex(digest), "): every rank must sample the same (same logits, same seed)"));
    }
  }
  if (!error.ok()) {
    Fail(error);
    absl::MutexLock lock(&mu_);
    return failure_;
  }
  return absl::OkStatus();
}

}  // namespace llm
