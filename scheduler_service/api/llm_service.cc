#include "scheduler_service/api/llm_service.h"

#include <atomic>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_security.h"
#include "glog/logging.h"
#include "protocol/step_codec.h"
#include "scheduler_service/tokenizer/grammar_vocabulary.h"

namespace llm {
namespace {

constexpr char kDraining[] =
    "draining: the server is shutting down and takes no new requests; retry on another replica";

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
class ErrorWriter final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
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
class LLMService::GenerateCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
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

  // The engine's output thread.
  void OnEngineUpdate(const StreamUpdate& u) {
    if (!u.status.ok() || u.output->finished) {
      absl::MutexLock lock(&mu_);
      engine_done_ = true;  // the engine holds the request no more
    }
    if (!u.status.ok()) {
      if (ServingMetrics* m = service_->options_.metrics.get();
          m != nullptr && u.status.code() == absl::StatusCode::kCancelled) {
        m->request_success->Inc(1, {{"finished_reason", "abort"}});
      }
      End(ToGrpc(u.status));
      return;
    }
    const RequestOutput& out = *u.output;
    const int num_tokens_before = num_completion_tokens_;
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
        if (seq.index == 0) finish_reason_ = ToFinishReason(seq.status);
        o->set_finish_reason(ToFinishReason(seq.status));
        if (!seq.stop_string.empty()) {
          o->set_stop_reason(std::string(seq.stop_string));
        } else if (seq.stop_token >= 0) {
          o->set_stop_token_id(seq.stop_token);
        }
      }
    }
    RecordMetrics(num_completion_tokens_ - num_tokens_before, out);
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

  // Output thread: vLLM's per-request metrics (metrics.h) for one update.
  void RecordMetrics(int num_new_tokens, const RequestOutput& out) {
    ServingMetrics* m = service_->options_.metrics.get();
    if (m == nullptr) return;
    const absl::Time now = absl::Now();
    if (num_new_tokens > 0) {
      if (!first_token_seen_) {
        first_token_seen_ = true;
        m->time_to_first_token_seconds->Observe(absl::ToDoubleSeconds(now - arrival_));
        m->prompt_tokens->Inc(num_prompt_tokens_);
      } else {
        m->inter_token_latency_seconds->Observe(absl::ToDoubleSeconds(now - last_token_time_));
      }
      last_token_time_ = now;
      m->generation_tokens->Inc(num_new_tokens);
    }
    if (!out.finished) return;
    m->e2e_request_latency_seconds->Observe(absl::ToDoubleSeconds(now - arrival_));
    const char* reason = finish_reason_ == v1::FINISH_REASON_LENGTH  ? "length"
                         : finish_reason_ == v1::FINISH_REASON_ABORT ? "abort"
                                                                     : "stop";
    m->request_success->Inc(1, {{"finished_reason", reason}});
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
    StartWriteOrFinish(next);
  }

  void OnWriteDone(bool ok) override {
    // A failed write means the client is gone; the request must be aborted here, before the
    // Finish below, because OnCancel (which may come later) no longer aborts once Finish is
    // under way. Taken outside mu_, as in OnCancel.
    const std::shared_ptr<ServingEngine> e = ok ? nullptr : engine_.lock();
    Next next;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        queue_.clear();
        if (!final_.has_value()) {
          final_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
        }
        // Not once aborted: the id may be a new call's by now (AbortAndEnd).
        if (e != nullptr && !finish_called_ && !aborted_) {
          (void)e->engine->Abort(request_id_);  // NOT_FOUND when it finished meanwhile
        }
        aborted_ = true;
      }
      next = NextLocked();
    }
    StartWriteOrFinish(next);
  }

  void OnCancel() override { AbortAndEnd(); }

  // Under the service's mu_ (the call is registered, so Finish has not run and the context is
  // valid): whether the client cancelled the call, though OnCancel may not have run yet.
  bool cancelled_by_client() const { return context_->IsCancelled(); }
  // Any thread, registered or not: whether the call was cancelled (AbortAndEnd ran).
  bool cancelled() const { return cancelled_.load(); }

  // Aborts the request in the engine (once) and ends the call with CANCELLED.
  void AbortAndEnd() {
    cancelled_ = true;
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
    StartWriteOrFinish(next);
  }

  // Decides on the next write, or on the Finish once the queue drained and the end is known.
  Next NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finish_called_) return {};
    if (!queue_.empty()) {
      bool own_buffer = false;
      current_.Clear();  // the previous write is done; the serializer wants an empty buffer
      // Serializing a message the service built cannot fail.
      (void)grpc::SerializationTraits<v1::GenerateResponse>::Serialize(queue_.front(), &current_,
                                                                       &own_buffer);
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
  void StartWriteOrFinish(const Next& next) {
    if (next.what == Next::kWrite) {
      StartWrite(&current_);
    } else if (next.what == Next::kFinish) {
      if (next.abort) {
        // Before Unregister: the id is still this call's, so the abort reaches its request.
        // Not on the engine's threads (the engine ended those calls), so this may hold the
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

  // The engine's output thread only.
  std::vector<v1::SequenceOutput> accumulated_;  // per sequence index (stream=false)
  int num_completion_tokens_ = 0;
  int num_cached_prompt_tokens_ = 0;
  // Metrics (output thread).
  const absl::Time arrival_ = absl::Now();
  absl::Time last_token_time_;
  bool first_token_seen_ = false;
  v1::FinishReason finish_reason_ = v1::FINISH_REASON_UNSPECIFIED;  // sequence 0's

  absl::Mutex mu_;
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer current_;  // the write in flight (set under mu_ while none is)
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;      // the engine was told to abort
  std::atomic<bool> cancelled_{false};             // AbortAndEnd ran
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
    // End before the abort: an engine may report the abort at once (a paused one does), and
    // the client must read `status`, not "request ... aborted".
    call->End(status);
    if (engine != nullptr) (void)engine->engine->Abort(call->request_id());
  }
  return engine;
}

void LLMService::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
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

std::shared_ptr<LLMService::GenerateCall> LLMService::CallHolding(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(request_id);
  return it == calls_.end() ? nullptr : it->second;
}

void LLMService::Unregister(const std::string& request_id, const GenerateCall* call) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(request_id);
  if (it != calls_.end() && it->second.get() == call) calls_.erase(it);
}

absl::Status LLMService::ParamsFromRequest(const v1::GenerateRequest& request,
                                           SamplingParams* params) const {
  const std::string& id = request.request_id();
  if (static_cast<int>(id.size()) > options_.max_request_id_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the request id is ", id.size(),
                                                   " bytes; at most ",
                                                   options_.max_request_id_bytes, " are accepted"));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = id[i];
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrFormat("the request id has byte 0x%02x at position %d; only printable ASCII "
                          "without spaces (0x21-0x7e) is accepted",
                          c, i));
    }
  }
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText:
      if (request.text().empty()) {
        return absl::InvalidArgumentError("the prompt is empty: set a non-empty prompt text");
      }
      if (static_cast<int64_t>(request.text().size()) > options_.max_prompt_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("the prompt is ", request.text().size(), " bytes; at most ",
                         options_.max_prompt_bytes, " are accepted (--max-prompt-bytes)"));
      }
      break;
    case v1::GenerateRequest::kTokenIds:  // checked by admission with the tokenized prompts
      break;
    case v1::GenerateRequest::kChat:
      if (options_.chat_template == nullptr) {
        return absl::FailedPreconditionError(
            "the model has no chat template: send text or token_ids, or serve a model with "
            "chat_template.jinja or a chat_template in tokenizer_config.json");
      }
      if (request.chat().messages().empty()) {
        return absl::InvalidArgumentError("the chat has no messages: set at least one message");
      }
      break;
    default:
      return absl::InvalidArgumentError("the prompt is empty: set prompt text, token_ids or chat");
  }
  const v1::SamplingParams& sp = request.sampling_params();
  if (sp.stop_size() > options_.max_stop_strings) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", options_.max_stop_strings,
                                                   " stop strings are allowed; the request has ",
                                                   sp.stop_size()));
  }
  for (int i = 0; i < sp.stop_size(); ++i) {
    if (static_cast<int>(sp.stop(i).size()) > options_.max_stop_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("stop string ", i, " is ", sp.stop(i).size(),
                                                     " bytes; at most ", options_.max_stop_bytes,
                                                     " are accepted (--max-stop-bytes)"));
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
  if (params->structured.active()) return CheckStructuredOutput(params->structured);
  return absl::OkStatus();
}

absl::Status LLMService::CheckStructuredOutput(const StructuredOutputParams& structured) const {
  std::shared_ptr<structured::GrammarCache> grammars;
  {
    absl::MutexLock lock(&grammars_mu_);
    if (grammars_ == nullptr) {
      absl::StatusOr<std::shared_ptr<const structured::TokenizerInfo>> vocabulary =
          GrammarVocabulary(*tokenizer_, tokenizer_->vocab_size());
      if (!vocabulary.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("structured outputs are unavailable for this model's tokenizer: ",
                         vocabulary.status().message()));
      }
      grammars_ = std::make_shared<structured::GrammarCache>(*std::move(vocabulary));
    }
    grammars = grammars_;
  }
  absl::StatusOr<std::shared_ptr<const structured::CompiledGrammar>> compiled =
      grammars->Get(structured::SpecOf(structured));
  if (compiled.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(structured.field_name(), ": ", compiled.status().message()));
}

absl::StatusOr<std::string> LLMService::RenderChat(const v1::ChatPrompt& chat) const {
  std::vector<ChatMessage> messages;
  messages.reserve(chat.messages_size());
  for (const v1::ChatMessage& m : chat.messages()) {
    ChatMessage& msg = messages.emplace_back();
    msg.role = m.role();
    msg.content = m.content();
    msg.content_is_none = !m.has_content();
    for (const v1::ToolCall& c : m.tool_calls()) {
      msg.tool_calls.push_back({.id = c.id(),
                                .type = c.type().empty() ? "function" : c.type(),
                                .name = c.function().name(),
                                .arguments = c.function().arguments()});
    }
    msg.tool_call_id = m.tool_call_id();
    msg.name = m.name();
    if (m.has_reasoning_content()) msg.reasoning_content = m.reasoning_content();
  }
  const bool add_generation_prompt =
      chat.has_add_generation_prompt() ? chat.add_generation_prompt() : true;
  absl::StatusOr<jinja::Value> tools = ToolsValue(chat.tools_json());
  if (!tools.ok()) return tools.status();
  absl::StatusOr<jinja::Value> documents = DocumentsValue(chat.documents_json());
  if (!documents.ok()) return documents.status();
  absl::StatusOr<jinja::ValueDict> extra = TemplateKwargs(chat.template_kwargs_json());
  if (!extra.ok()) return extra.status();
  extra->Set("tools", *std::move(tools));
  extra->Set("documents", *std::move(documents));
  return options_.chat_template->Render(messages, add_generation_prompt, *extra);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* LLMService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  if (grpc::Status s = CheckApiKey(*context, options_.api_key); !s.ok()) {
    return new ErrorWriter(s);
  }
  v1::GenerateRequest request;
  grpc::ByteBuffer copy(*raw);  // Deserialize consumes its buffer; slices are shared
  if (grpc::Status s = grpc::SerializationTraits<v1::GenerateRequest>::Deserialize(&copy, &request);
      !s.ok()) {
    return new ErrorWriter(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("the request's ", raw->Length(),
                                  " bytes do not parse as an llm.v1.GenerateRequest (protobuf)")));
  }
  return Generate(context, request);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* LLMService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest& req) {
  const v1::GenerateRequest* request = &req;
  SamplingParams params;
  if (absl::Status s = ParamsFromRequest(*request, &params); !s.ok()) {
    return new ErrorWriter(ToGrpc(s));
  }
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = NotServing(); !s.ok()) return new ErrorWriter(ToGrpc(s));
    if (draining_) return new ErrorWriter(grpc::Status(grpc::StatusCode::UNAVAILABLE, kDraining));
  }
  std::vector<TokenId> prompt;
  if (request->prompt_case() == v1::GenerateRequest::kText) {
    prompt = tokenizer_->Encode(request->text(), request->add_special_tokens());
  } else if (request->prompt_case() == v1::GenerateRequest::kChat) {
    // The template writes the special tokens (bos, role markers) itself.
    absl::StatusOr<std::string> text = RenderChat(request->chat());
    if (!text.ok()) return new ErrorWriter(ToGrpc(text.status()));
    prompt = tokenizer_->Encode(*text, /*add_special_tokens=*/false);
  } else {
    prompt.assign(request->token_ids().ids().begin(), request->token_ids().ids().end());
  }
  if (!request->sampling_params().has_max_tokens()) {
    // Unset: generate until the context is full, as vLLM does. A prompt that leaves no room
    // keeps 1, so that admission names the prompt's length.
    params.max_tokens = std::max(1, options_.max_model_len - static_cast<int>(prompt.size()));
  }
  std::string request_id = request->request_id();
  if (request_id.empty()) {
    request_id = absl::StrFormat("req-%06x-%d", id_prefix_, next_id_.fetch_add(1));
  }

  // One rule for ids: a call whose id is held by a running call is refused ALREADY_EXISTS,
  // unless the holder's client cancelled it. A cancellation travels to the server apart from the
  // client's next call and may be seen just after it, so a call that finds its id held waits up
  // to kCancelGrace for the holder's cancellation, and nothing else: a holder that ends
  // otherwise in that time does not free the id for it. The answer depends on what the
  // holder's client did, not on how soon the holder ends. (The id is freed before a request's
  // end is sent, so a client that saw its request end finds the id free.)
  if (std::shared_ptr<GenerateCall> holder = CallHolding(request_id); holder != nullptr) {
    constexpr absl::Duration kCancelGrace = absl::Milliseconds(500);
    const absl::Time give_up = absl::Now() + kCancelGrace;
    bool cancelled = false;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        auto it = calls_.find(request_id);
        const bool registered = it != calls_.end() && it->second == holder;
        // The context is valid while the call is registered (Finish has not run).
        cancelled = holder->cancelled() || (registered && holder->cancelled_by_client());
        if (cancelled && registered) calls_.erase(it);
      }
      if (cancelled || absl::Now() >= give_up) break;
      absl::SleepFor(absl::Milliseconds(2));
    }
    if (!cancelled) {
      return new ErrorWriter(
          grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                       absl::StrCat("request id ", request_id, " is in use by a running request")));
    }
    holder->AbortAndEnd();  // once: a call ended already is left as it is
  }

  absl::MutexLock lock(&mu_);
  if (absl::Status s = NotServing(); !s.ok()) return new ErrorWriter(ToGrpc(s));
  if (draining_) return new ErrorWriter(grpc::Status(grpc::StatusCode::UNAVAILABLE, kDraining));
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
  // Every rank of a worker group samples and keeps its own tokens, so they must draw alike: a
  // request without a seed gets a random one here, as a worker would have drawn it.
  if (!params.seed.has_value()) {
    thread_local absl::BitGen bitgen;
    params.seed = absl::Uniform<uint64_t>(bitgen);
  }
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
  if (grpc::Status s = CheckApiKey(*context, options_.api_key); !s.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(s);
    return reactor;
  }
  response->set_model_name(options_.model_name);
  response->set_max_model_len(options_.max_model_len);
  response->set_vocab_size(options_.vocab_size);
  response->set_tensor_parallel_size(options_.tensor_parallel_size);
  response->set_block_size(options_.block_size);
  if (options_.chat_template != nullptr) {
    response->set_chat_template(options_.chat_template->source());
  }
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
  if (grpc::Status s = CheckApiKey(*context, options_.api_key); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
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
  response->set_num_steps(s.num_steps);
  response->set_num_steps_planned_ahead(s.num_steps_planned_ahead);
  response->set_num_samples_discarded(s.num_samples_discarded);
  response->set_prefix_cache_queries(s.prefix_cache_queries);
  response->set_prefix_cache_hits(s.prefix_cache_hits);
  response->set_num_window_released_blocks(s.num_window_released_blocks);
  response->set_num_free_gpu_blocks(stats.num_free_gpu_blocks);
  response->set_num_free_cpu_blocks(stats.num_free_cpu_blocks);
  if (stats.worker.has_value()) EncodeWorkerStats(*stats.worker, response->mutable_worker());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace llm
