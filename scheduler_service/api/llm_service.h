// LLMService: the public gRPC API of llm-scheduler (protos/llm/v1/llm_service.proto) on gRPC's
// callback API.
//
// Generate turns the request into the engine's types (INVALID_ARGUMENT only for what the wire form
// alone can get wrong; an unset max_tokens becomes max_model_len - prompt tokens, filling the
// context), tokenizes the prompt and adds it to the current EngineCore, whose admission
// (Scheduler::ValidateRequest) is the one check of the request's rules: INVALID_ARGUMENT with a
// message that says what to change. A request id held by a running call is ALREADY_EXISTS
// unless that call's client cancelled it (a cancellation is waited for up to 500 ms), a call
// beyond max_concurrent_requests RESOURCE_EXHAUSTED. Generate then streams the outputs: per step,
// per sequence, the new token ids and a UTF-8-complete text delta, with each token's logprobs
// (sampled and top N, with their text) when the request set logprobs and the workers supplied them;
// finish_reason / stop_reason when a sequence ends; usage on the last response (stream=false: one
// response at the end with everything). The text is the engine's (SequenceOutput::text, from the
// detokenizer its StopChecker runs per sequence, which also finds the stop strings), so the engine
// must be built with a DetokenizerFactory over the service's tokenizer; the service itself only
// encodes prompts and decodes the logprobs' tokens. The engine's callbacks run on its output thread
// and never block: responses are queued per call and written one at a time (each OnWriteDone starts
// the next). A client that cancels, or whose deadline passes, has its request aborted in the
// engine.
//
// A chat prompt (GenerateRequest.chat) is rendered by LLMServiceOptions::chat_template and the
// text tokenized without adding special tokens (the template writes them): FAILED_PRECONDITION
// "the model has no chat template" when there is none, INVALID_ARGUMENT with the template's
// message (e.g. its raise_exception) when it refuses the conversation.
//
// The engine comes from whoever manages the worker group (llm-scheduler's WorkerGroup, or
// a test): SetReady hands over a ServingEngine; SetNotReady takes it back, ending every call
// in flight with UNAVAILABLE "the worker group is not ready: <reason>", and the service then
// answers Generate / GetStats so until the next SetReady. Shutdown ends every call with
// UNAVAILABLE "server shutting down" and refuses new ones. Drain (SIGTERM) refuses new
// Generate calls with UNAVAILABLE "draining ..." and lets those in flight finish.
//
// Exposure (docs/operations/security.md): with options.api_key set, every call must carry
// "authorization: Bearer KEY" (else UNAUTHENTICATED "missing or invalid API key"). Generate
// is registered raw (ByteBuffer in and out) so that bytes that do not parse as a
// GenerateRequest get INVALID_ARGUMENT with a message instead of the callback API's empty
// UNIMPLEMENTED; the prompt's bytes, the stop strings' and the request id's lengths are
// checked against the options' limits.
//
// Thread-safety: every method is thread-safe. The service must outlive the gRPC server it is
// registered with (Shutdown the server first); a ServingEngine is destroyed by whoever holds
// the last reference, outside the engine's threads (its engine and output threads).
#ifndef LLM_SCHEDULER_SERVICE_API_LLM_SERVICE_H_
#define LLM_SCHEDULER_SERVICE_API_LLM_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/sampling_params.h"
#include "grpcpp/grpcpp.h"
#include "llm/v1/llm_service.grpc.pb.h"
#include "protocol/executor.h"
#include "scheduler_service/api/metrics.h"
#include "scheduler_service/chat/chat_template.h"
#include "scheduler_service/engine/engine_core.h"
#include "scheduler_service/engine/serving_engine.h"
#include "scheduler_service/tokenizer/tokenizer.h"
#include "structured/grammar_cache.h"

namespace llm {

struct LLMServiceOptions {
  std::string model_name;
  int max_model_len = 2048;
  int vocab_size = 0;  // GetModelInfo's (the engine checks prompt ids against its own)
  int tensor_parallel_size = 1;
  int block_size = 16;
  int max_concurrent_requests = 256;
  SamplingLimits sampling_limits;
  int max_stop_strings = 16;
  // Bearer token every call must present; empty: none required.
  std::string api_key;
  // Limits, each answered with INVALID_ARGUMENT naming its flag. The server's max receive
  // message size must be above max_prompt_bytes for the prompt's check to be reached.
  int64_t max_prompt_bytes = 8 << 20;
  int max_stop_bytes = 1024;
  int max_request_id_bytes = 256;
  // Renders GenerateRequest.chat; null: chat requests fail with FAILED_PRECONDITION.
  std::shared_ptr<const ChatTemplate> chat_template;
  // Per-request token counts and latencies are recorded here when set (metrics.h).
  std::shared_ptr<ServingMetrics> metrics;
};

class LLMService final
    : public v1::LLMService::WithRawCallbackMethod_Generate<v1::LLMService::CallbackService> {
 public:
  LLMService(LLMServiceOptions options, std::shared_ptr<const Tokenizer> tokenizer);
  ~LLMService() override;
  LLMService(const LLMService&) = delete;
  LLMService& operator=(const LLMService&) = delete;

  // Serves requests on `engine` from now on (replacing none: call SetNotReady first; or the
  // engine already held, to end SetRecovering).
  void SetReady(std::shared_ptr<ServingEngine> engine);
  // The worker group failed and the engine waits for a new one (EngineCore recovery): calls in
  // flight go on (they pause), new Generate and GetStats calls get UNAVAILABLE "the worker group
  // is recovering: <reason>" until SetReady.
  void SetRecovering(const std::string& reason);
  // Stops serving: every call in flight ends with UNAVAILABLE "the worker group is not ready:
  // <reason>". Returns the engine (null when none), for the caller to destroy.
  std::shared_ptr<ServingEngine> SetNotReady(const std::string& reason);
  // Every call in flight ends, and every later one is refused, with UNAVAILABLE "server
  // shutting down" (": <why>" after it when `why` is not empty). Returns the engine (null when
  // none).
  std::shared_ptr<ServingEngine> Shutdown(const std::string& why = "");
  // From now on new Generate calls get UNAVAILABLE "draining: ..."; calls in flight go on.
  void Drain();
  bool ready() const;
  // Generate calls in flight (registered, not yet finished).
  int num_calls() const;

  // Raw: parses the request itself (INVALID_ARGUMENT when the bytes are not a GenerateRequest).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::GetModelInfoResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::GetStatsResponse* response) override;

 private:
  class GenerateCall;
  friend class GenerateCall;

  // Turns the request's sampling params from their wire form, checking only what belongs to
  // the wire and this API: the request id, the prompt's form, the stop strings' count and bytes
  // (flags of this server), counts past the int range. The request's rules (ranges, lengths
  // against max_model_len, the vocabulary) are the engine's admission check
  // (Scheduler::ValidateRequest), run once by EngineCore::AddRequest. An unset max_tokens is
  // left at its default here; Generate sets it once the prompt is tokenized.
  absl::Status ParamsFromRequest(const v1::GenerateRequest& request, SamplingParams* params) const;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const v1::GenerateRequest& request);
  // Compiles a request's structured output (the workers compile the same grammar against the
  // same vocabulary, so what passes here compiles there; compiled grammars are cached):
  // INVALID_ARGUMENT naming the field and what the grammar engine refused.
  absl::Status CheckStructuredOutput(const StructuredOutputParams& structured) const;
  // The prompt text of a chat request (options_.chat_template is set).
  absl::StatusOr<std::string> RenderChat(const v1::ChatPrompt& chat) const;
  absl::Status NotServing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends every call in flight with `status` and detaches the engine.
  std::shared_ptr<ServingEngine> Detach(const grpc::Status& status);
  void Unregister(const std::string& request_id, const GenerateCall* call);
  // The call registered under `request_id`, or null.
  std::shared_ptr<GenerateCall> CallHolding(const std::string& request_id);

  const LLMServiceOptions options_;
  const std::shared_ptr<const Tokenizer> tokenizer_;
  const uint64_t id_prefix_;
  // The grammar cache of CheckStructuredOutput, made at the first request that needs it.
  mutable absl::Mutex grammars_mu_;
  mutable std::shared_ptr<structured::GrammarCache> grammars_ ABSL_GUARDED_BY(grammars_mu_);
  std::atomic<uint64_t> next_id_{0};

  mutable absl::Mutex mu_;
  std::shared_ptr<ServingEngine> engine_ ABSL_GUARDED_BY(mu_);
  std::string not_ready_reason_ ABSL_GUARDED_BY(mu_) = "starting";
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::string recovering_reason_ ABSL_GUARDED_BY(mu_);  // not empty: recovering
  absl::flat_hash_map<std::string, std::shared_ptr<GenerateCall>> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_API_LLM_SERVICE_H_
