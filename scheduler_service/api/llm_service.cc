#include "scheduler_service/api/llm_service.h"

#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "protocol/step_codec.h"

namespace llm {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

v1::FinishReason ToFinishReason(SequenceStatus s) {
  switch (s) {
    case SequenceStatus::kFinishedStopped:
      return v1::FINISH_REASON_STOP;
    case SequenceStatus::kFinishedLength:
      return v1::FINISH_REASON_LENGTH;
    case SequenceStatus::kFinishedAborted:
      return v1::FINISH_REASON_ABORT;
    default:
      return v1::FINISH_REASON_UNSPECIFIED;
  }
}

// Answers a call with a status and nothing else (validation errors, not ready).
class ErrorWriter final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit ErrorWriter(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

// One Generate call. Shared by the gRPC reactor role (kept alive by self_ until OnDone), the
// engine's stream callback and the service's table of calls in flight.
//
// Writing protocol (mu_): at most one write in flight (writing_); responses wait in queue_;
// once final_ is set nothing more is queued, and Finish is called exactly once (finish_called_)
// after the queue drained. gRPC methods are called without mu_ held. Until Finish is called
// OnDone cannot run, so the reactor is alive whenever StartWrite / Finish is called.
class LLMService::GenerateCall final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateCall(LLMService* service, grpc::CallbackServerContext* context,
               std::weak_ptr<ServingEngine> engine, std::string request_id, bool stream, int n,
               bool logprobs, int num_prompt_tokens)
      : service_(service),
        context_(context),
        engine_(std::move(engine)),
        request_id_(std::move(request_id)),
        stream_(stream),
        logprobs_(logprobs),
        num_prompt_tokens_(num_prompt_tokens) {
    accumulated_.resize(n);
    for (int i = 0; i < n; ++i) accumulated_[i].set_index(i);
  }

  void Start(std::shared_ptr<GenerateCall> self) { self_ = std::move(self); }
  const std::string& request_id() const { return request_id_; }

  // Engine thread.
  void OnEngineUpdate(const StreamUpdate& u) {
    if (!u.status.ok() || u.output->finished) {
      absl::MutexLock lock(&mu_);
      engine_done_ = true;  // the engine holds the request no more
    }
    if (!u.status.ok()) {
      End(ToGrpc(u.status));
      return;
    }
    const RequestOutput& out = *u.output;
    num_cached_prompt_tokens_ = std::max(num_cached_prompt_tokens_, out.num_cached_prompt_tokens);
    v1::GenerateResponse resp;
    resp.set_request_id(request_id_);
    for (const SequenceOutput& seq : u.outputs->Seqs(out)) {
      if (seq.index < 0 || seq.index >= static_cast<int>(accumulated_.size())) continue;
      const std::span<const TokenId> ids = u.outputs->NewTokenIds(seq);
      num_completion_tokens_ += static_cast<int>(ids.size());
      v1::SequenceOutput* o = stream_ ? resp.add_outputs() : &accumulated_[seq.index];
      o->set_index(seq.index);
      o->mutable_token_ids()->Add(ids.begin(), ids.end());
      o->mutable_text()->append(u.outputs->Text(seq));
      if (logprobs_ && u.outputs->logprobs.size() == u.outputs->token_ids.size()) {
        for (uint32_t i = 0; i < seq.new_token_ids.size; ++i) {
          AddLogprobs(u.outputs->logprobs[seq.new_token_ids.begin + i], ids[i], o);
        }
      }
      if (IsFinished(seq.status)) {
        o->set_finish_reason(ToFinishReason(seq.status));
        if (!seq.stop_string.empty()) {
          o->set_stop_reason(std::string(seq.stop_string));
        } else if (seq.stop_token >= 0) {
          o->set_stop_reason(absl::StrCat(seq.stop_token));
        }
      }
    }
    if (out.finished) {
      if (!stream_) {
        for (v1::SequenceOutput& o : accumulated_) *resp.add_outputs() = std::move(o);
      }
      v1::Usage* usage = resp.mutable_usage();
      usage->set_prompt_tokens(num_prompt_tokens_);
      usage->set_completion_tokens(num_completion_tokens_);
      usage->set_cached_prompt_tokens(num_cached_prompt_tokens_);
      Enqueue(std::move(resp), grpc::Status::OK);
    } else if (stream_ && resp.outputs_size() > 0) {
      Enqueue(std::move(resp), std::nullopt);
    }
  }

  void AddLogprobs(const SampleLogprobs& lp, TokenId id, v1::SequenceOutput* o) const {
    v1::Logprobs* l = o->add_logprobs();
    auto fill = [this](TokenId t, float logprob, v1::TokenLogprob* out) {
      out->set_token_id(t);
      out->set_logprob(logprob);
      out->set_text(service_->tokenizer_->Decode(std::span<const TokenId>(&t, 1),
                                                 /*skip_special_tokens=*/false));
    };
    fill(id, lp.logprob, l->mutable_sampled());
    for (const auto& [t, logprob] : lp.top) fill(t, logprob, l->add_top());
  }

  // Any thread: ends the call with `status` after what is queued. Idempotent.
  void End(const grpc::Status& status) {
    Next next;
    {
      absl::MutexLock lock(&mu_);
      if (final_.has_value()) return;
      final_ = status;
      next = NextLocked();
    }
    Do(next);
  }

  void OnWriteDone(bool ok) override {
    Next next;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        queue_.clear();
        if (!final_.has_value()) {
          final_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
        }
      }
      next = NextLocked();
    }
    Do(next);
  }

  void OnCancel() override { AbortAndEnd(); }

  // Under the service's mu_ (the call is registered, so Finish has not run and the context is
  // valid): whether the client cancelled the call, though OnCancel may not have run yet.
  bool cancelled_by_client() const { return context_->IsCancelled(); }

  // Aborts the request in the engine (once) and ends the call with CANCELLED.
  void AbortAndEnd() {
    // Taken outside mu_: were this the last reference, the engine would stop under it.
    const std::shared_ptr<ServingEngine> e = engine_.lock();
    {
      absl::MutexLock lock(&mu_);
      // Once Finish is under way, or once aborted, the id is no longer this call's (gRPC may
      // cancel after it): a new call may have taken it, and its request must not be aborted.
      if (e != nullptr && !finish_called_ && !aborted_) {
        (void)e->engine->Abort(request_id_);  // NOT_FOUND when it finished meanwhile
      }
      aborted_ = true;
    }
    End(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
  }

  void OnDone() override {
    service_->Unregister(request_id_, this);
    self_.reset();  // may delete this
  }

 private:
  // What to do once mu_ is released.
  struct Next {
    enum { kNothing, kWrite, kFinish } what = kNothing;
    grpc::Status status;
    bool abort = false;  // kFinish: abort the request in the engine first
  };

  void Enqueue(v1::GenerateResponse resp, std::optional<grpc::Status> final) {
    Next next;
    {
      absl::MutexLock lock(&mu_);
      if (final_.has_value()) return;  // ended meanwhile (cancelled, group failed)
      queue_.push_back(std::move(resp));
      if (final.has_value()) final_ = std::move(final);
      next = NextLocked();
    }
    Do(next);
  }

  // Decides on the next write, or on the Finish once the queue drained and the end is known.
  Next NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finish_called_) return {};
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      return {.what = Next::kWrite};
    }
    if (final_.has_value()) {
      finish_called_ = true;
      // Ended other than by the engine (the client went away): the request must not run on.
      const bool abort = !engine_done_ && !aborted_;
      aborted_ = true;
      return {.what = Next::kFinish, .status = *final_, .abort = abort};
    }
    return {};
  }

  // Without mu_: OnDone cannot run before Finish, and current_ is not touched while a write
  // is in flight, so both calls are safe; nothing is touched after Finish (it may delete us).
  void Do(const Next& next) {
    if (next.what == Next::kWrite) {
      StartWrite(&current_);
    } else if (next.what == Next::kFinish) {
      if (next.abort) {
        // Before Unregister: the id is still this call's, so the abort reaches its request.
        // Not on the engine thread (the engine ended those calls), so this may hold the
        // last reference to the engine.
        if (const std::shared_ptr<ServingEngine> e = engine_.lock(); e != nullptr) {
          (void)e->engine->Abort(request_id_);  // NOT_FOUND when it finished meanwhile
        }
      }
      service_->Unregister(request_id_, this);  // the id is free once the client sees the end
      Finish(next.status);
    }
  }

  LLMService* const service_;
  grpc::CallbackServerContext* const context_;  // valid until OnDone
  const std::weak_ptr<ServingEngine> engine_;
  const std::string request_id_;
  const bool stream_;
  const bool logprobs_;  // the request asked for them
  const int num_prompt_tokens_;
  std::shared_ptr<GenerateCall> self_;

  // Engine thread only.
  std::vector<v1::SequenceOutput> accumulated_;  // per sequence index (stream=false)
  int num_completion_tokens_ = 0;
  int num_cached_prompt_tokens_ = 0;

  absl::Mutex mu_;
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResponse current_;  // the write in flight (set under mu_ while none is)
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;      // the engine was told to abort
  bool engine_done_ ABSL_GUARDED_BY(mu_) = false;  // the engine ended the request
  std::optional<grpc::Status> final_ ABSL_GUARDED_BY(mu_);
};

LLMService::LLMService(LLMServiceOptions options, std::shared_ptr<const Tokenizer> tokenizer)
    : options_(std::move(options)),
      tokenizer_(std::move(tokenizer)),
      id_prefix_(std::random_device{}() & 0xffffff) {
  CHECK(tokenizer_ != nullptr);
}

LLMService::~LLMService() { (void)Shutdown(); }

void LLMService::SetReady(std::shared_ptr<ServingEngine> engine) {
  CHECK(engine != nullptr && engine->engine != nullptr);
  absl::MutexLock lock(&mu_);
  CHECK(engine_ == nullptr || engine_ == engine)
      << "SetReady while another engine is serving: SetNotReady first";
  recovering_reason_.clear();
  if (shutting_down_) return;
  engine_ = std::move(engine);
  not_ready_reason_.clear();
}

std::shared_ptr<ServingEngine> LLMService::SetNotReady(const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    not_ready_reason_ = reason;
  }
  return Detach(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                             absl::StrCat("the worker group is not ready: ", reason)));
}

void LLMService::SetRecovering(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  recovering_reason_ = reason.empty() ? "the worker group failed" : reason;
}

std::shared_ptr<ServingEngine> LLMService::Shutdown(const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  return Detach(grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      why.empty() ? "server shutting down" : absl::StrCat("server shutting down: ", why)));
}

std::shared_ptr<ServingEngine> LLMService::Detach(const grpc::Status& status) {
  std::shared_ptr<ServingEngine> engine;
  std::vector<std::shared_ptr<GenerateCall>> calls;
  {
    absl::MutexLock lock(&mu_);
    engine = std::move(engine_);  // leaves engine_ null
    for (auto& [id, call] : calls_) calls.push_back(call);
  }
  for (auto& call : calls) {
    if (engine != nullptr) (void)engine->engine->Abort(call->request_id());
    call->End(status);
  }
  return engine;
}

bool LLMService::ready() const {
  absl::MutexLock lock(&mu_);
  return engine_ != nullptr && !shutting_down_ && recovering_reason_.empty();
}

int LLMService::num_calls() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(calls_.size());
}

absl::Status LLMService::NotServing() const {
  if (shutting_down_) return absl::UnavailableError("server shutting down");
  if (engine_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("the worker group is not ready: ", not_ready_reason_));
  }
  if (!recovering_reason_.empty()) {
    return absl::UnavailableError(
        absl::StrCat("the worker group is recovering: ", recovering_reason_));
  }
  return absl::OkStatus();
}

void LLMService::Unregister(const std::string& request_id, const GenerateCall* call) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(request_id);
  if (it != calls_.end() && it->second.get() == call) calls_.erase(it);
}

absl::Status LLMService::ValidateParams(const v1::GenerateRequest& request,
                                        SamplingParams* params) const {
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText:
      if (request.text().empty()) {
        return absl::InvalidArgumentError("the prompt is empty: set a non-empty prompt text");
      }
      break;
    case v1::GenerateRequest::kTokenIds:
      if (request.token_ids().ids().empty()) {
        return absl::InvalidArgumentError("the prompt is empty: token_ids has no ids");
      }
      for (int i = 0; i < request.token_ids().ids_size(); ++i) {
        const int32_t id = request.token_ids().ids(i);
        if (id < 0 || id >= options_.vocab_size) {
          return absl::InvalidArgumentError(absl::StrCat("prompt token id ", id, " at position ", i,
                                                         " is outside the vocabulary [0, ",
                                                         options_.vocab_size, ")"));
        }
      }
      break;
    case v1::GenerateRequest::kChat:
      return absl::UnimplementedError("chat prompts are not served yet: send text or token_ids");
    default:
      return absl::InvalidArgumentError("the prompt is empty: set prompt text or token_ids");
  }
  const v1::SamplingParams& sp = request.sampling_params();
  if (sp.stop_size() > options_.max_stop_strings) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", options_.max_stop_strings,
                                                   " stop strings are allowed; the request has ",
                                                   sp.stop_size()));
  }
  for (int i = 0; i < sp.stop_size(); ++i) {
    if (sp.stop(i).empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stop string ", i, " is empty"));
    }
  }
  // Counts past INT32_MAX are refused as sent (SamplingParamsFromProto would clamp them).
  constexpr uint32_t kIntMax = std::numeric_limits<int32_t>::max();
  const SamplingLimits& limits = options_.sampling_limits;
  auto too_big = [](const char* field, uint32_t value, const std::string& range) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is ", value, "; it must be ", range));
  };
  if (sp.has_n() && sp.n() > kIntMax) {
    return too_big("n", sp.n(), absl::StrCat("in [1, ", limits.max_n, "]"));
  }
  if (sp.has_max_tokens() && sp.max_tokens() > kIntMax) {
    return too_big("max_tokens", sp.max_tokens(), absl::StrCat("in [1, ", kIntMax, "]"));
  }
  if (sp.min_tokens() > kIntMax) {
    return too_big("min_tokens", sp.min_tokens(), "in [0, max_tokens]");
  }
  if (sp.has_logprobs() && sp.logprobs() > kIntMax) {
    return too_big("logprobs", sp.logprobs(), absl::StrCat("in [0, ", limits.max_logprobs, "]"));
  }
  *params = SamplingParamsFromProto(sp);
  return params->Validate(options_.sampling_limits);
}

grpc::ServerWriteReactor<v1::GenerateResponse>* LLMService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  SamplingParams params;
  if (absl::Status s = ValidateParams(*request, &params); !s.ok()) {
    return new ErrorWriter(ToGrpc(s));
  }
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = NotServing(); !s.ok()) return new ErrorWriter(ToGrpc(s));
  }
  std::vector<TokenId> prompt;
  if (request->prompt_case() == v1::GenerateRequest::kText) {
    prompt = tokenizer_->Encode(request->text(), request->add_special_tokens());
    if (prompt.empty()) {
      return new ErrorWriter(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                          "the prompt is empty after tokenization"));
    }
  } else {
    prompt.assign(request->token_ids().ids().begin(), request->token_ids().ids().end());
  }
  if (static_cast<int64_t>(prompt.size()) + params.max_tokens > options_.max_model_len) {
    return new ErrorWriter(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("prompt has ", prompt.size(), " tokens and max_tokens is ", params.max_tokens,
                     "; max_model_len is ", options_.max_model_len)));
  }
  std::string request_id = request->request_id();
  if (request_id.empty()) {
    request_id = absl::StrFormat("req-%06x-%d", id_prefix_, next_id_.fetch_add(1));
  }

  // The id of a call its client cancelled is free at once, even before gRPC's OnCancel ran.
  // A cancellation may reach the server just after a new call with the id does: a call in the
  // way is given kIdReuseGrace to turn out cancelled (or to end) before ALREADY_EXISTS.
  std::shared_ptr<GenerateCall> cancelled;
  {
    absl::MutexLock lock(&mu_);
    auto free_or_cancelled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = calls_.find(request_id);
      return it == calls_.end() || it->second->cancelled_by_client();
    };
    if (calls_.contains(request_id)) {
      constexpr absl::Duration kIdReuseGrace = absl::Milliseconds(500);
      mu_.AwaitWithTimeout(absl::Condition(&free_or_cancelled), kIdReuseGrace);
    }
    auto it = calls_.find(request_id);
    if (it != calls_.end() && it->second->cancelled_by_client()) {
      cancelled = std::move(it->second);
      calls_.erase(it);
    }
  }
  if (cancelled != nullptr) cancelled->AbortAndEnd();

  absl::MutexLock lock(&mu_);
  if (absl::Status s = NotServing(); !s.ok()) return new ErrorWriter(ToGrpc(s));
  if (calls_.contains(request_id)) {
    return new ErrorWriter(
        grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                     absl::StrCat("request id ", request_id, " is in use by a running request")));
  }
  if (static_cast<int>(calls_.size()) >= options_.max_concurrent_requests) {
    return new ErrorWriter(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("the server is at its limit of ", options_.max_concurrent_requests,
                     " concurrent requests; retry later")));
  }
  auto call = std::make_shared<GenerateCall>(this, context, engine_, request_id, request->stream(),
                                             params.n, params.logprobs.has_value(),
                                             static_cast<int>(prompt.size()));
  EngineRequest er;
  er.request_id = request_id;
  er.prompt_token_ids = std::move(prompt);
  er.sampling_params = std::move(params);
  er.priority = request->priority();
  er.cache_salt = request->cache_salt();
  // Under mu_: a SetNotReady / Shutdown after this point sees the call and ends it.
  const absl::Status added = engine_->engine->AddRequest(
      std::move(er), [call](const StreamUpdate& u) { call->OnEngineUpdate(u); });
  if (!added.ok()) return new ErrorWriter(ToGrpc(added));
  call->Start(call);
  calls_.emplace(request_id, call);
  (void)context;
  return call.get();
}

grpc::ServerUnaryReactor* LLMService::GetModelInfo(grpc::CallbackServerContext* context,
                                                   const v1::GetModelInfoRequest* /*request*/,
                                                   v1::GetModelInfoResponse* response) {
  response->set_model_name(options_.model_name);
  response->set_max_model_len(options_.max_model_len);
  response->set_vocab_size(options_.vocab_size);
  response->set_tensor_parallel_size(options_.tensor_parallel_size);
  response->set_block_size(options_.block_size);
  {
    absl::MutexLock lock(&mu_);
    if (engine_ != nullptr) {
      response->set_num_gpu_blocks(engine_->num_gpu_blocks);
      response->set_num_cpu_blocks(engine_->num_cpu_blocks);
    }
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* LLMService::GetStats(grpc::CallbackServerContext* context,
                                               const v1::GetStatsRequest* /*request*/,
                                               v1::GetStatsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  EngineStats stats;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = NotServing(); !s.ok()) {
      reactor->Finish(ToGrpc(s));
      return reactor;
    }
    stats = engine_->engine->stats_snapshot();
  }
  const SchedulerStats& s = stats.scheduler;
  response->set_num_running(s.num_running);
  response->set_num_waiting(s.num_waiting);
  response->set_num_swapped(s.num_swapped);
  response->set_gpu_kv_usage(s.gpu_kv_usage);
  response->set_cpu_kv_usage(s.cpu_kv_usage);
  response->set_prefix_cache_hit_rate(s.prefix_cache_hit_rate);
  response->set_num_preemptions(s.num_preemptions);
  response->set_num_free_gpu_blocks(stats.num_free_gpu_blocks);
  response->set_num_free_cpu_blocks(stats.num_free_cpu_blocks);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace llm
