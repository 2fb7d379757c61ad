#include "scheduler_service/http/openai_server.h"

#include <signal.h>

#include <chrono>
#include <ctime>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "httplib.h"
#include "llm/v1/llm_service.grpc.pb.h"
#include "scheduler_service/http/openai_protocol.h"

namespace llm {
namespace {

using json = nlohmann::json;
using openai::Endpoint;
using openai::OpenAIError;

constexpr auto kInternalDeadline = std::chrono::seconds(10);

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void SendError(httplib::Response& res, const OpenAIError& e) {
  res.status = e.http_status;
  res.set_content(Dump(e.ToJson()), "application/json");
}

// Header values gRPC accepts as metadata: printable ASCII.
bool IsPrintableAscii(const std::string& s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The HTTP server's streaming Generate call to LLMService (it is a gRPC client of the
// service); cancelled and drained if dropped before its end.
struct UpstreamGenerate {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  bool finished = false;

  grpc::Status Finish() {
    finished = true;
    return reader->Finish();
  }
  // Cancels the call (the request is aborted in the engine) and ends it.
  void Cancel() {
    if (finished) return;
    context.TryCancel();
    v1::GenerateResponse ignored;
    while (reader->Read(&ignored)) {
    }
    (void)Finish();
  }
  ~UpstreamGenerate() {
    if (reader != nullptr) Cancel();
  }
};

}  // namespace

class OpenAIServer::Impl {
 public:
  Impl(OpenAIServerOptions options, openai::ReasoningFormat reasoning,
       std::shared_ptr<grpc::Channel> channel, std::shared_ptr<ServingMetrics> metrics,
       std::unique_ptr<httplib::Server> server)
      : options_(std::move(options)),
        reasoning_(reasoning),
        stub_(v1::LLMService::NewStub(channel)),
        metrics_(std::move(metrics)),
        server_(std::move(server)) {}

  ~Impl() { Stop(); }

  absl::StatusOr<int> Bind() {
    httplib::Server& s = *server_;
    const int threads = options_.num_threads;
    s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    s.set_payload_max_length(64 << 20);
    s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return Authorize(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                 : httplib::Server::HandlerResponse::Handled;
    });
    s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      HandleGenerate(Endpoint::kCompletions, req, res);
    });
    s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      HandleGenerate(Endpoint::kChatCompletions, req, res);
    });
    s.Get("/v1/models",
          [this](const httplib::Request& req, httplib::Response& res) { HandleModels(req, res); });
    s.Get("/health",
          [this](const httplib::Request& req, httplib::Response& res) { HandleHealth(req, res); });
    s.Get("/metrics",
          [this](const httplib::Request& req, httplib::Response& res) { HandleMetrics(req, res); });
    s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      SendError(res, {.http_status = res.status,
                      .message = res.status == 404
                                     ? absl::StrCat("no route for ", req.method, " ", req.path)
                                     : absl::StrCat("HTTP ", res.status, " for ", req.method, " ",
                                                    req.path),
                      .type = res.status == 404 ? "invalid_request_error" : "server_error"});
    });
    int port = options_.port;
    if (port == 0) {
      port = s.bind_to_any_port(options_.host);
      if (port <= 0) return absl::UnavailableError("cannot bind " + options_.host + ":0");
    } else if (!s.bind_to_port(options_.host, port)) {
      return absl::UnavailableError(absl::StrCat("cannot bind ", options_.host, ":", port));
    }
    thread_ = std::thread([this] { server_->listen_after_bind(); });
    return port;
  }

  void Stop() {
    server_->stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  // False when the request was answered with 401.
  bool Authorize(const httplib::Request& req, httplib::Response& res) const {
    if (options_.api_key.empty() || req.path == "/health" || req.path == "/metrics") return true;
    const std::string header = req.get_header_value("Authorization");
    if (ConstantTimeEquals(header, "Bearer " + options_.api_key)) return true;
    SendError(res, {.http_status = 401,
                    .message = header.empty() ? "missing Authorization: Bearer <api key> header"
                                              : "incorrect API key",
                    .type = "authentication_error",
                    .code = "invalid_api_key"});
    return false;
  }

  // The server's own calls carry the key (the gRPC API may require it too).
  void InternalContext(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() + kInternalDeadline);
    if (!options_.api_key.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.api_key);
  }

  void HandleGenerate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    openai::ParseResult parsed = endpoint == Endpoint::kCompletions
                                     ? openai::ParseCompletionRequest(req.body)
                                     : openai::ParseChatCompletionRequest(req.body);
    if (!parsed.ok()) return SendError(res, parsed.error);
    auto r = std::make_shared<openai::OpenAIRequest>(std::move(parsed.request));
    if (!r->model.empty() && r->model != options_.served_model_name) {
      return SendError(res, openai::ModelNotFound(r->model));
    }
    if (endpoint == Endpoint::kChatCompletions) r->reasoning = reasoning_;
    if (r->tool_choice == openai::ToolChoice::kAuto) {
      absl::StatusOr<openai::ToolCallFormat> format = ToolFormat();
      if (!format.ok()) {
        return SendError(res, openai::ErrorFromGrpc(grpc::Status(
                                  static_cast<grpc::StatusCode>(format.status().code()),
                                  std::string(format.status().message()))));
      }
      if (*format == openai::ToolCallFormat::kNone) {
        return SendError(
            res, {.http_status = 400,
                  .message = "'tool_choice' \"auto\" needs the model's chat template to teach a "
                             "tool-call format this server reads (Hermes/Qwen <tool_call>, Llama "
                             "3 JSON, Mistral [TOOL_CALLS]), and this model's does not; use "
                             "tool_choice \"required\" or a named function, which constrain the "
                             "output to calls",
                  .type = "invalid_request_error",
                  .param = "tool_choice"});
      }
      r->tool_format = *format;
      // Mistral's marker is a special token, which the output would otherwise skip.
      if (*format == openai::ToolCallFormat::kMistral &&
          !r->request.sampling_params().has_skip_special_tokens()) {
        r->request.mutable_sampling_params()->set_skip_special_tokens(false);
      }
    }
    auto call = std::make_shared<UpstreamGenerate>();
    const std::string auth = req.get_header_value("Authorization");
    if (!auth.empty() && IsPrintableAscii(auth)) call->context.AddMetadata("authorization", auth);
    call->reader = stub_->Generate(&call->context, r->request);
    // The first response decides the HTTP status: an error before any output is an error
    // response, not a stream.
    auto first = std::make_shared<v1::GenerateResponse>();
    if (!call->reader->Read(first.get())) {
      grpc::Status s = call->Finish();
      if (s.ok()) s = grpc::Status(grpc::StatusCode::INTERNAL, "the stream ended without output");
      return SendError(res, openai::ErrorFromGrpc(s));
    }
    const openai::ResponseContext ctx{.id = openai::ResponseId(endpoint, first->request_id()),
                                      .created = static_cast<int64_t>(std::time(nullptr)),
                                      .model = options_.served_model_name};
    if (!r->request.stream()) {
      v1::GenerateResponse extra;
      while (call->reader->Read(&extra)) first->MergeFrom(extra);  // one response is expected
      const grpc::Status s = call->Finish();
      if (!s.ok()) return SendError(res, openai::ErrorFromGrpc(s));
      res.set_content(Dump(openai::CompletionBody(*r, ctx, *first)), "application/json");
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [r, call, first, ctx](size_t /*offset*/, httplib::DataSink& sink) {
          auto write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
          openai::StreamState state;
          v1::GenerateResponse resp = std::move(*first);
          v1::Usage usage;
          do {
            for (const json& chunk : openai::StreamChunks(*r, ctx, resp, &state)) {
              if (!write(openai::SseEvent(chunk))) {
                call->Cancel();  // the client went away: abort the request
                return false;
              }
            }
            if (resp.has_usage()) usage = resp.usage();
          } while (call->reader->Read(&resp));
          const grpc::Status s = call->Finish();
          bool ok = true;
          if (!s.ok()) {
            ok = write(openai::SseEvent(openai::ErrorFromGrpc(s).ToJson()));
          } else if (r->include_usage) {
            ok = write(openai::SseEvent(openai::UsageChunk(*r, ctx, usage)));
          }
          if (ok && write(std::string(openai::kSseDone))) sink.done();
          return ok;
        });
  }

  // The tool-call format the model's chat template teaches, asked of the service once.
  absl::StatusOr<openai::ToolCallFormat> ToolFormat() {
    {
      absl::MutexLock lock(&mu_);
      if (tool_format_.has_value()) return *tool_format_;
    }
    grpc::ClientContext ctx;
    InternalContext(&ctx);
    v1::GetModelInfoResponse info;
    const grpc::Status s = stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    }
    const openai::ToolCallFormat format = openai::ToolCallFormatOfTemplate(info.chat_template());
    absl::MutexLock lock(&mu_);
    tool_format_ = format;
    return format;
  }

  void HandleModels(const httplib::Request& /*req*/, httplib::Response& res) {
    grpc::ClientContext ctx;
    InternalContext(&ctx);
    v1::GetModelInfoResponse info;
    const grpc::Status s = stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    if (!s.ok()) return SendError(res, openai::ErrorFromGrpc(s));
    const json model = {{"id", options_.served_model_name},
                        {"object", "model"},
                        {"created", static_cast<int64_t>(std::time(nullptr))},
                        {"owned_by", "llm-serving"},
                        {"root", info.model_name()},
                        {"max_model_len", info.max_model_len()}};
    res.set_content(Dump({{"object", "list"}, {"data", json::array({model})}}), "application/json");
  }

  void HandleHealth(const httplib::Request& /*req*/, httplib::Response& res) {
    grpc::ClientContext ctx;
    InternalContext(&ctx);
    v1::GetStatsResponse stats;
    const grpc::Status s = stub_->GetStats(&ctx, v1::GetStatsRequest(), &stats);
    if (s.ok()) {
      res.status = 200;
      return;
    }
    OpenAIError e = openai::ErrorFromGrpc(s);
    e.http_status = 503;  // anything but serving is "not healthy"
    SendError(res, e);
  }

  void HandleMetrics(const httplib::Request& /*req*/, httplib::Response& res) {
    if (metrics_ == nullptr) {
      res.status = 404;
      return;
    }
    grpc::ClientContext ctx;
    InternalContext(&ctx);
    v1::GetStatsResponse stats;
    if (stub_->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok()) {
      metrics_->UpdateFromStats(stats);
    } else {
      metrics_->UpdateFromStats(v1::GetStatsResponse());  // not serving: nothing runs
    }
    res.set_content(metrics_->registry.Render(), "text/plain; version=0.0.4; charset=utf-8");
  }

  const OpenAIServerOptions options_;
  const openai::ReasoningFormat reasoning_;
  const std::unique_ptr<v1::LLMService::Stub> stub_;
  const std::shared_ptr<ServingMetrics> metrics_;
  const std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  absl::Mutex mu_;
  std::optional<openai::ToolCallFormat> tool_format_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<OpenAIServer>> OpenAIServer::Start(
    OpenAIServerOptions options, std::shared_ptr<grpc::Channel> channel,
    std::shared_ptr<ServingMetrics> metrics) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP port must be in [0, 65535], got ", options.port));
  }
  if (options.ssl_certfile.empty() != options.ssl_keyfile.empty()) {
    return absl::InvalidArgumentError(
        "HTTPS needs both ssl_certfile and ssl_keyfile; only one is set");
  }
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads must be at least 1, got ", options.num_threads));
  }
  if (channel == nullptr) return absl::InvalidArgumentError("no gRPC channel");
  absl::StatusOr<openai::ReasoningFormat> reasoning =
      openai::ReasoningFormatFromName(options.reasoning_parser);
  if (!reasoning.ok()) return reasoning.status();
  // A write to a connection the peer closed must fail, not kill the process.
  signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<httplib::Server> server;
  if (!options.ssl_certfile.empty()) {
    auto ssl = std::make_unique<httplib::SSLServer>(options.ssl_certfile.c_str(),
                                                    options.ssl_keyfile.c_str());
    if (!ssl->is_valid()) {
      return absl::UnavailableError(absl::StrCat("cannot load the TLS certificate ",
                                                 options.ssl_certfile, " and key ",
                                                 options.ssl_keyfile));
    }
    server = std::move(ssl);
  } else {
    server = std::make_unique<httplib::Server>();
  }
  auto impl = std::make_unique<Impl>(std::move(options), *reasoning, std::move(channel),
                                     std::move(metrics), std::move(server));
  absl::StatusOr<int> port = impl->Bind();
  if (!port.ok()) return port.status();
  return std::unique_ptr<OpenAIServer>(new OpenAIServer(std::move(impl), *port));
}

OpenAIServer::OpenAIServer(std::unique_ptr<Impl> impl, int port)
    : impl_(std::move(impl)), port_(port) {}

OpenAIServer::~OpenAIServer() { Stop(); }

void OpenAIServer::Stop() {
  if (impl_ != nullptr) impl_->Stop();
}

}  // namespace llm
