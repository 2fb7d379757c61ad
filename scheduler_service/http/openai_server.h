// OpenAIServer: the OpenAI-compatible HTTP API of llm-scheduler (cpp-httplib), as vLLM serves
// it, so that the official `openai` client, curl and `vllm bench serve` work against it.
//
//   POST /v1/completions        text or token-id prompt      stream (SSE) or one JSON body
//   POST /v1/chat/completions   messages (the chat template)  stream (SSE) or one JSON body
//   GET  /v1/models             the served model
//   GET  /health                200 while the worker group serves, 503 otherwise
//   GET  /metrics               Prometheus text format (metrics.h; vLLM's names)
//
// It is a client of the public gRPC API over the in-process channel of llm-scheduler's own
// gRPC server: a request becomes a v1::GenerateRequest (openai_protocol.h), so validation,
// limits, auth and cancellation are the gRPC path's, and a gRPC status becomes an OpenAI error
// (HttpStatusFromGrpc). Streams are Server-Sent Events: `data: {chunk}\n\n` ... `data:
// [DONE]\n\n`, with a usage chunk before [DONE] when stream_options.include_usage. A streaming
// client that disconnects is noticed at the next write: its gRPC call is cancelled
// (ClientContext::TryCancel), which aborts the request in the engine; its blocks are freed in
// the next step. (A non-streaming request runs to its end: nothing is written before it.)
//
// With api_key set, every endpoint but /health and /metrics requires `Authorization: Bearer
// <api_key>` (401 otherwise); the header is forwarded to the gRPC call as `authorization`
// metadata, and the server's own calls (GetStats, GetModelInfo) carry the key.
// With ssl_certfile and ssl_keyfile set, it serves HTTPS.
//
// Each connection is served by a thread of a pool of num_threads; a streaming request holds
// its thread until it ends.
//
// Thread-safety: Start / Stop / port are thread-safe; the gRPC server behind `channel` must
// outlive Stop.
#ifndef LLM_SCHEDULER_SERVICE_HTTP_OPENAI_SERVER_H_
#define LLM_SCHEDULER_SERVICE_HTTP_OPENAI_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "scheduler_service/api/metrics.h"

namespace llm {

struct OpenAIServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;  // 0: any free port
  // The name clients must send as `model` (else 404 model_not_found) and the one answered.
  std::string served_model_name;
  std::string api_key;       // empty: no authentication
  std::string ssl_certfile;  // both set: HTTPS
  std::string ssl_keyfile;
  int num_threads = 64;  // connections served at once
  // Chat answers' reasoning (reasoning_parser.h): "", "none", "deepseek_r1" or "qwen3".
  std::string reasoning_parser;
};

class OpenAIServer {
 public:
  // Binds and starts serving on a thread of its own. `metrics` may be null (then /metrics is
  // 404). Errors: INVALID_ARGUMENT for options, UNAVAILABLE when the address cannot be bound
  // or the certificate / key cannot be loaded.
  static absl::StatusOr<std::unique_ptr<OpenAIServer>> Start(
      OpenAIServerOptions options, std::shared_ptr<grpc::Channel> channel,
      std::shared_ptr<ServingMetrics> metrics);
  ~OpenAIServer();  // Stop()
  OpenAIServer(const OpenAIServer&) = delete;
  OpenAIServer& operator=(const OpenAIServer&) = delete;

  int port() const { return port_; }
  // Stops accepting, ends the connections and joins the thread. Idempotent.
  void Stop();

 private:
  class Impl;
  explicit OpenAIServer(std::unique_ptr<Impl> impl, int port);

  std::unique_ptr<Impl> impl_;
  const int port_;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_HTTP_OPENAI_SERVER_H_
