// The OpenAI API's JSON <-> llm.v1 protos: what OpenAIServer (openai_server.h) translates.
//
//   POST /v1/completions       body -> ParseCompletionRequest -> v1::GenerateRequest (text or
//                              token_ids prompt)
//   POST /v1/chat/completions  body -> ParseChatCompletionRequest -> v1::GenerateRequest (chat)
//   v1::GenerateResponse(s)    -> CompletionBody (stream=false) or StreamChunks + UsageChunk
//                              (stream=true, one JSON object per SSE event)
//
// Parsing follows OpenAI: fields nobody defines are ignored and null means absent; fields whose
// meaning OpenAI or vLLM define but this server does not implement (audio, ...) are 400
// naming them, unless their value asks for nothing; a field of the
// wrong type or value is INVALID_ARGUMENT whose message names the field, what was expected and
// what was got, and OpenAIError::param carries the field. Ranges the gRPC service checks
// (temperature, top_p, n, logprobs, ...) are left to it, so both APIs refuse the same values.
//
// Pure functions; thread-compatible.
#ifndef LLM_SCHEDULER_SERVICE_HTTP_OPENAI_PROTOCOL_H_
#define LLM_SCHEDULER_SERVICE_HTTP_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grpcpp/support/status.h"
#include "llm/v1/llm_service.pb.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/http/reasoning_parser.h"
#include "scheduler_service/http/tool_call_parser.h"

namespace llm::openai {

enum class Endpoint { kCompletions, kChatCompletions };

// How the answer may call the request's tools. kNone also when no tools were given (the output
// is text). kRequired and kNamed constrain the output (a JSON schema) to the calls, as vLLM
// does, so that they need no model-specific parsing; kAuto parses the model's own format
// (tool_format, which the server sets from the model's chat template).
enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

// One parsed request.
struct OpenAIRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  v1::GenerateRequest request;  // stream set from the body
  std::string model;            // as the client named it; empty when absent
  bool include_usage = false;   // stream_options.include_usage
  // completions: logprobs (int) set; chat: logprobs true (top_logprobs in request's
  // sampling_params.logprobs).
  bool logprobs = false;
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string tool_name;                               // kNamed: the function
  bool parallel_tool_calls = true;                     // false: at most one call
  ToolCallFormat tool_format = ToolCallFormat::kNone;  // kAuto: the model's format
  // chat: how the output's reasoning is read (the server's --reasoning-parser), and whether it
  // is answered (vLLM's include_reasoning; false: dropped).
  ReasoningFormat reasoning = ReasoningFormat::kNone;
  bool include_reasoning = true;
};

// Whether `req`'s output is reasoning from its first token (reasoning_parser.h): deepseek_r1
// and not constrained by a grammar.
bool StartsInReasoning(const OpenAIRequest& req);

// An error as OpenAI's API answers it: HTTP status and {"error": {message, type, param, code}}.
struct OpenAIError {
  int http_status = 500;
  std::string message;
  std::string type;   // invalid_request_error, authentication_error, ...
  std::string param;  // the offending field; empty: null
  std::string code;   // e.g. model_not_found; empty: null

  nlohmann::json ToJson() const;
};

// Parse errors: http 400, type invalid_request_error, param the field.
struct ParseResult {
  bool ok() const { return error.http_status == 0; }
  OpenAIRequest request;
  OpenAIError error{.http_status = 0};
};
ParseResult ParseCompletionRequest(std::string_view body);
ParseResult ParseChatCompletionRequest(std::string_view body);

// The one gRPC status code -> HTTP status mapping: INVALID_ARGUMENT / OUT_OF_RANGE /
// FAILED_PRECONDITION / ALREADY_EXISTS 400, UNAUTHENTICATED 401, PERMISSION_DENIED 403,
// NOT_FOUND 404, RESOURCE_EXHAUSTED 429, UNIMPLEMENTED 501, UNAVAILABLE 503,
// DEADLINE_EXCEEDED 504, CANCELLED 499 (nginx's "client closed request"), others 500.
int HttpStatusFromGrpc(grpc::StatusCode code);
OpenAIError ErrorFromGrpc(const grpc::Status& status);
OpenAIError ModelNotFound(const std::string& model);

// "stop", "length", "abort", or null while unfinished.
nlohmann::json FinishReasonJson(v1::FinishReason reason);

// What every response of one request shares.
struct ResponseContext {
  std::string id;  // cmpl-... / chatcmpl-...
  int64_t created = 0;
  std::string model;  // the served name
};

// The id OpenAI's shape has for a request (cmpl-<id> or chatcmpl-<id>).
std::string ResponseId(Endpoint endpoint, const std::string& request_id);

// stream=false: the whole response from the one GenerateResponse (every sequence, usage).
nlohmann::json CompletionBody(const OpenAIRequest& req, const ResponseContext& ctx,
                              const v1::GenerateResponse& response);

// What a stream remembers between responses, per sequence index (grown as needed).
struct StreamState {
  std::vector<bool> role_sent;      // chat: the first chunk carries delta.role = "assistant"
  std::vector<size_t> text_offset;  // completions logprobs: text_offset of the next token
  // chat with tools, per sequence: the calls read so far.
  struct Tools {
    std::shared_ptr<ToolCallStreamParser> parser;  // kAuto
    std::string text;                              // kRequired: the output so far
    int calls = 0;                                 // calls sent
    std::string named_id;                          // kNamed: the call's id once sent
  };
  std::vector<Tools> tools;
  // chat with a reasoning parser, per sequence.
  std::vector<std::shared_ptr<ReasoningStreamParser>> reasoning;
};

// stream=true: the chunks of one streamed GenerateResponse, one per sequence output.
std::vector<nlohmann::json> StreamChunks(const OpenAIRequest& req, const ResponseContext& ctx,
                                         const v1::GenerateResponse& response, StreamState* state);
// The last chunk when stream_options.include_usage: no choices, the usage.
nlohmann::json UsageChunk(const OpenAIRequest& req, const ResponseContext& ctx,
                          const v1::Usage& usage);
nlohmann::json UsageJson(const v1::Usage& usage);

// "data: <json>\n\n" and "data: [DONE]\n\n".
std::string SseEvent(const nlohmann::json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace llm::openai

#endif  // LLM_SCHEDULER_SERVICE_HTTP_OPENAI_PROTOCOL_H_
