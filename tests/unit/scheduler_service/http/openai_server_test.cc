// OpenAIServer in-process: LLMService (tiny-llama's tokenizer, an EngineCore over a
// FakeExecutor) behind a gRPC server, the HTTP server on its in-process channel, and
// cpp-httplib's client. What the Python integration test cannot reach: /health and the error
// mapping while the worker group is not ready, and the HTTP answers equal to the gRPC ones.
#include "scheduler_service/http/openai_server.h"

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "scheduler_service/api/llm_service.h"
#include "scheduler_service/engine/engine_core.h"
#include "scheduler_service/tokenizer/incremental_detokenizer.h"
#include "scheduler_service/tokenizer/tokenizer.h"
#include "tests/testing/fake_executor.h"

namespace llm {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

constexpr int kBlocks = 64;
constexpr char kKey[] = "sekret";

class OpenAIServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::FromDirectory(LLM_TEST_DATA_DIR "/models/tiny-llama");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
    detokenizers_ = std::make_unique<TokenizerDetokenizerFactory>(tokenizer_);
    LLMServiceOptions o;
    o.model_name = "tiny";
    o.max_model_len = 256;
    o.vocab_size = tokenizer_->vocab_size();
    o.metrics = metrics_;
    service_ = std::make_unique<LLMService>(o, tokenizer_);
    grpc::ServerBuilder b;
    b.RegisterService(service_.get());
    grpc_ = b.BuildAndStart();  // no port: the in-process channel only
    ASSERT_NE(grpc_, nullptr);
    stub_ = v1::LLMService::NewStub(grpc_->InProcessChannel(grpc::ChannelArguments()));
    absl::StatusOr<std::unique_ptr<OpenAIServer>> http = OpenAIServer::Start(
        {.host = "127.0.0.1", .port = 0, .served_model_name = "tiny", .api_key = kKey},
        grpc_->InProcessChannel(grpc::ChannelArguments()), metrics_);
    ASSERT_TRUE(http.ok()) << http.status();
    http_ = std::move(*http);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", http_->port());
    client_->set_read_timeout(60);  // hang guard
    client_->set_bearer_token_auth(kKey);
  }

  void TearDown() override {
    std::shared_ptr<ServingEngine> engine = service_->Shutdown();
    http_->Stop();
    grpc_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    engine.reset();
  }

  void Serve() {
    SchedulerConfig sc;
    sc.max_model_len = 256;
    sc.max_num_batched_tokens = 256;
    const BlockSpaceManagerConfig bc{.block_size = 16, .num_gpu_blocks = kBlocks};
    auto e = std::make_shared<ServingEngine>();
    e->num_gpu_blocks = kBlocks;
    e->executor = std::make_unique<FakeExecutor>(FakeExecutorConfig{
        .num_gpu_blocks = kBlocks, .vocab_size = tokenizer_->vocab_size(), .seed = 5});
    e->engine = std::make_unique<EngineCore>(sc, bc, e->executor.get(), detokenizers_.get());
    e->engine->Start();
    service_->SetReady(e);
  }

  httplib::Result Post(const std::string& path, const json& body) {
    return client_->Post(path.c_str(), body.dump(), "application/json");
  }

  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<TokenizerDetokenizerFactory> detokenizers_;
  std::shared_ptr<ServingMetrics> metrics_ = std::make_shared<ServingMetrics>("tiny");
  std::unique_ptr<LLMService> service_;
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<v1::LLMService::Stub> stub_;
  std::unique_ptr<OpenAIServer> http_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(OpenAIServerTest, NotReadyIs503UntilTheEngineServes) {
  httplib::Result health = client_->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  httplib::Result r = Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  const json err = json::parse(r->body)["error"];
  EXPECT_EQ(err["type"], "service_unavailable_error");
  EXPECT_THAT(err["message"].get<std::string>(), HasSubstr("not ready"));

  Serve();
  health = client_->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(OpenAIServerTest, CompletionEqualsTheGrpcAnswer) {
  Serve();
  const json body = {{"model", "tiny"},  {"prompt", "Hello world"}, {"max_tokens", 12},
                     {"temperature", 0}, {"ignore_eos", true},      {"seed", 3}};
  httplib::Result r = Post("/v1/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);

  v1::GenerateRequest req;
  req.set_text("Hello world");
  req.set_add_special_tokens(true);
  req.mutable_sampling_params()->set_max_tokens(12);
  req.mutable_sampling_params()->set_temperature(0);
  req.mutable_sampling_params()->set_ignore_eos(true);
  req.mutable_sampling_params()->set_seed(3);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  ASSERT_TRUE(reader->Finish().ok());

  EXPECT_EQ(j["choices"][0]["text"], resp.outputs(0).text());
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["usage"]["prompt_tokens"], resp.usage().prompt_tokens());
  EXPECT_EQ(metrics_->generation_tokens->Value(), 24);  // both calls count
}

TEST_F(OpenAIServerTest, AuthAndErrors) {
  Serve();
  httplib::Client anonymous("127.0.0.1", http_->port());
  httplib::Result r = anonymous.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "invalid_api_key");
  // /health and /metrics need no key.
  r = anonymous.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, HasSubstr("vllm:num_requests_running{model_name=\"tiny\"} 0\n"));
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");

  r = client_->Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["data"][0]["id"], "tiny");
  r = Post("/v1/completions", {{"model", "other"}, {"prompt", "x"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  r = Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1000}});  // over max_model_len
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(json::parse(r->body)["error"]["message"].get<std::string>(),
              HasSubstr("max_tokens is 1000"));
  r = client_->Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_THAT(json::parse(r->body)["error"]["message"].get<std::string>(),
              HasSubstr("/v1/nothing"));
}

TEST_F(OpenAIServerTest, StreamEndsWithUsageAndDone) {
  Serve();
  httplib::Result r = Post("/v1/completions", {{"prompt", "Hello"},
                                               {"max_tokens", 5},
                                               {"ignore_eos", true},
                                               {"stream", true},
                                               {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  // 5 token events, the usage event, [DONE].
  std::vector<std::string> events;
  for (size_t pos = 0; pos < r->body.size();) {
    const size_t end = r->body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos) << r->body;
    events.push_back(r->body.substr(pos, end - pos));
    pos = end + 2;
  }
  ASSERT_EQ(events.size(), 7u) << r->body;
  EXPECT_EQ(events.back(), "data: [DONE]");
  const json usage = json::parse(events[5].substr(6));
  EXPECT_EQ(usage["usage"]["completion_tokens"], 5);
  EXPECT_EQ(json::parse(events[4].substr(6))["choices"][0]["finish_reason"], "length");
}

// An explicit max_tokens that does not fit beside the prompt is refused, naming both numbers;
// a missing one fills the context (as vLLM does).
TEST_F(OpenAIServerTest, MaxTokensOverTheContextIsRefusedAndAMissingOneIs16) {
  Serve();
  httplib::Result r = Post("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const int prompt_tokens = json::parse(r->body)["usage"]["prompt_tokens"];
  const int room = 256 - prompt_tokens;

  r = Post("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", room + 1}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  const json err = json::parse(r->body)["error"];
  EXPECT_EQ(err["type"], "invalid_request_error");
  EXPECT_THAT(err["message"].get<std::string>(),
              HasSubstr(absl::StrCat("the prompt is ", prompt_tokens, " tokens and max_tokens is ",
                                     room + 1, ": ", prompt_tokens, " + ", room + 1,
                                     " = 257 tokens, over the model's maximum context length "
                                     "(max_model_len 256)")));

  // Without max_tokens a completion is 16 tokens (OpenAI's and vLLM's default); a max_tokens
  // that fills the context exactly is served.
  r = Post("/v1/completions", {{"prompt", "Hello"}, {"ignore_eos", true}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 16);
  r = Post("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", room}, {"ignore_eos", true}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["usage"]["completion_tokens"], room);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
}

}  // namespace
}  // namespace llm
