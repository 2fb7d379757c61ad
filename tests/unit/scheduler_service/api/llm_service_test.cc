// LLMService in-process over an EngineCore with a FakeExecutor (no workers) and the real
// tokenizer of tests/data/models/tiny-llama, called through a real gRPC channel. Deadlines are
// hang guards only.
#include "scheduler_service/api/llm_service.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "scheduler_service/chat/chat_template.h"
#include "scheduler_service/engine/engine_core.h"
#include "scheduler_service/tokenizer/incremental_detokenizer.h"
#include "scheduler_service/tokenizer/tokenizer.h"
#include "tests/testing/fake_executor.h"
#include "tests/testing/grpc_probe.h"

namespace llm {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr int kBlocks = 256;
constexpr int kMaxModelLen = 512;
constexpr int kMaxConcurrent = 4;

// Runs steps through a FakeExecutor, each only once the test allows it (Allow / Open), or
// fails them (FailWith).
class GatedExecutor final : public Executor {
 public:
  explicit GatedExecutor(const FakeExecutorConfig& config) : inner_(config) {}

  absl::Status Execute(const SchedulerOutput& step, ModelOutput* out) override {
    {
      absl::MutexLock lock(&mu_);
      auto can_run = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return open_ || permits_ > 0; };
      mu_.Await(absl::Condition(&can_run));
      if (!open_) --permits_;
      if (!fail_.ok()) return fail_;
      for (const ScheduledRequest& r : step.new_requests) {
        prompts_[std::string(r.request_id)].assign(r.prompt_token_ids.begin(),
                                                   r.prompt_token_ids.end());
      }
    }
    if (absl::Status st = inner_.Execute(step, out); !st.ok()) return st;
    // Made-up logprobs for every sampled token (as a worker does when any request of the step
    // asked): the service must pass them on only to requests that asked.
    out->logprobs.clear();
    for (TokenId t : out->sampled_token_ids) out->logprobs.push_back(FakeLogprobs(t));
    return absl::OkStatus();
  }

  static SampleLogprobs FakeLogprobs(TokenId t) {
    return {.logprob = -0.5f - t % 7, .top = {{t, -0.5f - t % 7}, {(t + 1) % 100, -9.0f}}};
  }

  void Allow(int steps) {
    absl::MutexLock lock(&mu_);
    permits_ += steps;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void FailWith(absl::Status s) {
    absl::MutexLock lock(&mu_);
    fail_ = std::move(s);
  }
  // The prompt token ids the engine sent for `request_id` (empty: never scheduled).
  std::vector<TokenId> PromptOf(const std::string& request_id) {
    absl::MutexLock lock(&mu_);
    auto it = prompts_.find(request_id);
    return it == prompts_.end() ? std::vector<TokenId>() : it->second;
  }

 private:
  FakeExecutor inner_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  int permits_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status fail_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<TokenId>> prompts_ ABSL_GUARDED_BY(mu_);
};

struct CallResult {
  grpc::Status status;
  std::vector<v1::GenerateResponse> responses;
};

class LLMServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::FromDirectory(LLM_TEST_DATA_DIR "/models/tiny-llama");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
    detokenizers_ = std::make_unique<TokenizerDetokenizerFactory>(tokenizer_);
    StartServer(DefaultOptions());
  }

  LLMServiceOptions DefaultOptions() const {
    LLMServiceOptions o;
    o.model_name = "tiny-llama";
    o.max_model_len = kMaxModelLen;
    o.vocab_size = tokenizer_->vocab_size();
    o.block_size = 16;
    o.max_concurrent_requests = kMaxConcurrent;
    o.chat_template = chat_template_;
    o.metrics = metrics_;
    return o;
  }

  // A service with `o` (ready, over an open engine), behind a server that receives messages of
  // up to 16 MiB as llm-scheduler's default --max-request-bytes.
  void StartServer(const LLMServiceOptions& o) {
    service_ = std::make_unique<LLMService>(o, tokenizer_);
    service_->SetReady(MakeEngine());
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.SetMaxReceiveMessageSize(16 << 20);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    stub_ = v1::LLMService::NewStub(channel_);
  }

  void StopServer() {
    if (gate_ != nullptr) gate_->Open();
    std::shared_ptr<ServingEngine> engine = service_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    engine.reset();
    server_.reset();
    service_.reset();
    gate_ = nullptr;
  }

  void TearDown() override { StopServer(); }

  std::shared_ptr<ServingEngine> MakeEngine(bool open = true, bool prefix_caching = false) {
    SchedulerConfig sc;
    sc.max_model_len = kMaxModelLen;
    sc.max_num_batched_tokens = kMaxModelLen;
    sc.eos_token_id = 1;
    sc.vocab_size = tokenizer_->vocab_size();
    sc.sampling_limits = engine_limits_;
    const BlockSpaceManagerConfig bc{.block_size = 16,
                                     .num_gpu_blocks = kBlocks,
                                     .num_cpu_blocks = 0,
                                     .watermark = 0,
                                     .enable_prefix_caching = prefix_caching};
    auto gate = std::make_unique<GatedExecutor>(FakeExecutorConfig{
        .num_gpu_blocks = kBlocks, .vocab_size = tokenizer_->vocab_size(), .seed = 3});
    gate_ = gate.get();
    if (open) gate_->Open();
    auto e = std::make_shared<ServingEngine>();
    e->num_gpu_blocks = kBlocks;
    e->executor = std::move(gate);
    e->engine = std::make_unique<EngineCore>(sc, bc, e->executor.get(), detokenizers_.get());
    e->engine->Start();
    return e;
  }

  // Replaces the engine by a fresh one whose steps run only as the test allows (closed) or
  // freely (open).
  void SwapEngine(bool open, bool prefix_caching = false) {
    gate_->Open();
    service_->SetNotReady("swapping engines").reset();
    service_->SetReady(MakeEngine(open, prefix_caching));
  }

  CallResult Generate(const v1::GenerateRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    CallResult r;
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) r.responses.push_back(resp);
    r.status = reader->Finish();
    return r;
  }

  static v1::GenerateRequest Text(const std::string& text, int max_tokens = 8) {
    v1::GenerateRequest req;
    req.set_text(text);
    req.set_stream(true);
    req.mutable_sampling_params()->set_max_tokens(max_tokens);
    req.mutable_sampling_params()->set_seed(11);
    return req;
  }

  void ExpectInvalid(const v1::GenerateRequest& req, const std::string& message) {
    const CallResult r = Generate(req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << r.status.error_message();
    EXPECT_THAT(r.status.error_message(), HasSubstr(message));
    EXPECT_TRUE(r.responses.empty());
  }

  v1::GetStatsResponse Stats() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetStatsResponse resp;
    const grpc::Status s = stub_->GetStats(&ctx, v1::GetStatsRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  // Polls (hang guard: 30 s) until `done`.
  template <typename F>
  bool Eventually(F done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      if (done()) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return done();
  }

  // Serves with `chat_template` from now on (a fresh service, server and engine).
  void ServeWithChatTemplate(std::shared_ptr<const ChatTemplate> chat_template) {
    TearDown();
    chat_template_ = std::move(chat_template);
    SetUp();
  }

  std::shared_ptr<const ChatTemplate> chat_template_;  // none unless a test sets one
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<TokenizerDetokenizerFactory> detokenizers_;
  std::unique_ptr<LLMService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::LLMService::Stub> stub_;
  GatedExecutor* gate_ = nullptr;  // the current engine's
  SamplingLimits engine_limits_;   // the next engine's
  std::shared_ptr<ServingMetrics> metrics_ = std::make_shared<ServingMetrics>("tiny-llama");
};

std::string AllText(const CallResult& r, int index) {
  std::string text;
  for (const v1::GenerateResponse& resp : r.responses) {
    for (const v1::SequenceOutput& o : resp.outputs()) {
      if (static_cast<int>(o.index()) == index) text += o.text();
    }
  }
  return text;
}

std::vector<TokenId> AllTokens(const CallResult& r, int index) {
  std::vector<TokenId> ids;
  for (const v1::GenerateResponse& resp : r.responses) {
    for (const v1::SequenceOutput& o : resp.outputs()) {
      if (static_cast<int>(o.index()) == index)
        ids.insert(ids.end(), o.token_ids().begin(), o.token_ids().end());
    }
  }
  return ids;
}

TEST_F(LLMServiceTest, EmptyPromptsAreInvalid) {
  ExpectInvalid(v1::GenerateRequest(), "the prompt is empty");
  ExpectInvalid(Text(""), "the prompt is empty");
  v1::GenerateRequest ids;
  ids.mutable_token_ids();
  ExpectInvalid(ids, "the prompt is empty");
}

TEST_F(LLMServiceTest, PromptLongerThanTheModelAllowsIsInvalid) {
  v1::GenerateRequest req;
  for (int i = 0; i < 600; ++i) req.mutable_token_ids()->add_ids(5);
  ExpectInvalid(req,
                "the prompt is 600 tokens; at most 511 are accepted (max_model_len 512, less one "
                "token to generate)");
  v1::GenerateRequest text;  // the same limit after tokenization
  std::string long_text;
  for (int i = 0; i < 600; ++i) long_text += " hello";
  text.set_text(long_text);
  ExpectInvalid(text, "are accepted (max_model_len 512, less one token to generate)");
  v1::GenerateRequest fits;
  for (int i = 0; i < 500; ++i) fits.mutable_token_ids()->add_ids(5);
  fits.mutable_sampling_params()->set_max_tokens(13);
  ExpectInvalid(fits,
                "the prompt is 500 tokens and max_tokens is 13: 500 + 13 = 513 tokens, over the "
                "model's maximum context length (max_model_len 512); ask for at most 12 tokens");
}

TEST_F(LLMServiceTest, UnsetMaxTokensFillsTheContext) {
  v1::GenerateRequest req;
  for (int i = 0; i < 500; ++i) req.mutable_token_ids()->add_ids(5);
  req.mutable_sampling_params()->set_ignore_eos(true);
  const CallResult r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(AllTokens(r, 0), SizeIs(kMaxModelLen - 500));
  EXPECT_EQ(r.responses.back().outputs(0).finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(r.responses.back().usage().completion_tokens(), kMaxModelLen - 500);
}

// The request's rules are the engine's admission check alone: the service passes on what
// its own limits would have refused, and the engine's limits decide.
TEST_F(LLMServiceTest, TheEngineAloneChecksTheRequest) {
  StopServer();
  LLMServiceOptions o = DefaultOptions();
  o.sampling_limits.max_n = 1;
  engine_limits_.max_n = 2;
  StartServer(o);
  v1::GenerateRequest two = Text("Hello");
  two.mutable_sampling_params()->set_n(2);
  const CallResult r = Generate(two);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  two.mutable_sampling_params()->set_n(3);
  ExpectInvalid(two, "n is 3; it must be in [1, 2]");
}

TEST_F(LLMServiceTest, TokenIdsOutsideTheVocabularyAreInvalid) {
  v1::GenerateRequest req;
  req.mutable_token_ids()->add_ids(5);
  req.mutable_token_ids()->add_ids(5000);
  ExpectInvalid(req, "prompt token id 5000 at position 1 is outside the vocabulary [0, 2048)");
  req.mutable_token_ids()->set_ids(1, -1);
  ExpectInvalid(req, "prompt token id -1 at position 1 is outside the vocabulary");
}

TEST_F(LLMServiceTest, SamplingFieldsOutOfRangeAreInvalid) {
  struct Case {
    std::function<void(v1::SamplingParams*)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](auto* p) { p->set_n(17); }, "n is 17"},
      {[](auto* p) { p->set_n(0); }, "n is 0"},
      {[](auto* p) { p->set_temperature(-1); }, "temperature is -1"},
      {[](auto* p) { p->set_top_p(1.5); }, "top_p is 1.5"},
      {[](auto* p) { p->set_top_p(0); }, "top_p is 0"},
      {[](auto* p) { p->set_top_k(0); }, "top_k is 0"},
      {[](auto* p) { p->set_min_p(2); }, "min_p is 2"},
      {[](auto* p) { p->set_max_tokens(0); }, "max_tokens is 0"},
      {[](auto* p) { p->set_min_tokens(20); }, "min_tokens is 20"},
      {[](auto* p) { p->set_presence_penalty(3); }, "presence_penalty is 3"},
      {[](auto* p) { p->set_frequency_penalty(-3); }, "frequency_penalty is -3"},
      {[](auto* p) { p->set_repetition_penalty(0); }, "repetition_penalty is 0"},
      {[](auto* p) { p->add_stop_token_ids(-2); }, "stop_token_ids"},
      {[](auto* p) { p->add_stop(""); }, "stop is an empty string; it must be non-empty"},
      {[](auto* p) {
         for (int i = 0; i < 17; ++i) p->add_stop(absl::StrCat("s", i));
       },
       "at most 16 stop strings are allowed; the request has 17"},
      {[](auto* p) { p->set_logprobs(21); }, "logprobs is 21"},
      {[](auto* p) { (*p->mutable_logit_bias())[2048] = 1; },
       "logit_bias token id is 2048; it must be in [0, 2048) (the vocabulary)"},
      {[](auto* p) { (*p->mutable_logit_bias())[-1] = 1; }, "logit_bias token id is -1"},
      {[](auto* p) { (*p->mutable_logit_bias())[7] = 101; },
       "logit_bias[7] is 101; it must be finite and in [-100, 100]"},
      {[](auto* p) { (*p->mutable_logit_bias())[7] = std::nanf(""); }, "logit_bias[7] is nan"},
      // Past INT32_MAX: reported as sent, not clamped.
      {[](auto* p) { p->set_max_tokens(2147483648u); },
       "max_tokens is 2147483648; it must be in [1, 2147483647]"},
      {[](auto* p) { p->set_max_tokens(4294967295u); }, "max_tokens is 4294967295"},
      {[](auto* p) { p->set_n(2147483648u); }, "n is 2147483648; it must be in [1, 16]"},
      {[](auto* p) { p->set_min_tokens(3000000000u); }, "min_tokens is 3000000000"},
      {[](auto* p) { p->set_logprobs(2147483648u); }, "logprobs is 2147483648"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    v1::GenerateRequest req = Text("Hello");
    c.set(req.mutable_sampling_params());
    ExpectInvalid(req, c.message);
  }
}

TEST_F(LLMServiceTest, StreamedTextIsTheDetokenizationOfTheTokens) {
  const std::string prompt = "Hello world, this is a test";
  const CallResult r = Generate(Text(prompt, 40));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_GE(r.responses.size(), 2u);
  const std::vector<TokenId> tokens = AllTokens(r, 0);
  ASSERT_EQ(tokens.size(), 40u);
  EXPECT_EQ(AllText(r, 0), tokenizer_->Decode(tokens, /*skip_special_tokens=*/true));
  for (size_t i = 0; i < r.responses.size(); ++i) {
    const v1::GenerateResponse& resp = r.responses[i];
    EXPECT_FALSE(resp.request_id().empty());
    EXPECT_EQ(resp.request_id(), r.responses[0].request_id());
    EXPECT_EQ(resp.has_usage(), i + 1 == r.responses.size());
    for (const v1::SequenceOutput& o : resp.outputs()) {
      EXPECT_EQ(o.index(), 0u);
      EXPECT_EQ(o.finish_reason() != v1::FINISH_REASON_UNSPECIFIED, i + 1 == r.responses.size());
    }
  }
  const v1::GenerateResponse& last = r.responses.back();
  ASSERT_EQ(last.outputs_size(), 1);
  EXPECT_EQ(last.outputs(0).finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(last.usage().prompt_tokens(), tokenizer_->Encode(prompt, false).size());
  EXPECT_EQ(last.usage().completion_tokens(), 40u);
  EXPECT_EQ(last.usage().cached_prompt_tokens(), 0u);
}

TEST_F(LLMServiceTest, AddSpecialTokensCountsTheBos) {
  v1::GenerateRequest req = Text("Hello", 4);
  req.set_add_special_tokens(true);
  const CallResult r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.responses.back().usage().prompt_tokens(), tokenizer_->Encode("Hello", true).size());
}

TEST_F(LLMServiceTest, NTwoGivesTwoIndexedSequences) {
  v1::GenerateRequest req = Text("Once upon a time", 10);
  req.mutable_sampling_params()->set_n(2);
  const CallResult r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  for (int index : {0, 1}) {
    const std::vector<TokenId> tokens = AllTokens(r, index);
    EXPECT_EQ(tokens.size(), 10u) << index;
    EXPECT_EQ(AllText(r, index), tokenizer_->Decode(tokens, true)) << index;
  }
  EXPECT_NE(AllTokens(r, 0), AllTokens(r, 1));
  EXPECT_EQ(r.responses.back().usage().completion_tokens(), 20u);
}

TEST_F(LLMServiceTest, NonStreamingGivesOneResponseWithEverything) {
  v1::GenerateRequest req = Text("Once upon a time", 10);
  req.mutable_sampling_params()->set_n(2);
  const CallResult streamed = Generate(req);
  ASSERT_TRUE(streamed.status.ok());
  req.set_stream(false);
  const CallResult r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.responses.size(), 1u);
  const v1::GenerateResponse& resp = r.responses[0];
  ASSERT_EQ(resp.outputs_size(), 2);
  for (int index : {0, 1}) {
    EXPECT_EQ(resp.outputs(index).index(), static_cast<uint32_t>(index));
    EXPECT_EQ(AllTokens(r, index), AllTokens(streamed, index));  // same seed, same tokens
    EXPECT_EQ(resp.outputs(index).text(), AllText(streamed, index));
    EXPECT_EQ(resp.outputs(index).finish_reason(), v1::FINISH_REASON_LENGTH);
  }
  EXPECT_EQ(resp.usage().completion_tokens(), 20u);
}

TEST_F(LLMServiceTest, LogprobsComeWithEachTokenWhenAsked) {
  for (bool stream : {true, false}) {
    SCOPED_TRACE(stream);
    v1::GenerateRequest req = Text("Once upon a time", 6);
    req.set_stream(stream);
    req.mutable_sampling_params()->set_n(2);
    req.mutable_sampling_params()->set_logprobs(2);
    const CallResult r = Generate(req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    int num_tokens = 0;
    for (const v1::GenerateResponse& resp : r.responses) {
      for (const v1::SequenceOutput& o : resp.outputs()) {
        ASSERT_EQ(o.logprobs_size(), o.token_ids_size());
        for (int i = 0; i < o.token_ids_size(); ++i) {
          const TokenId t = o.token_ids(i);
          const SampleLogprobs want = GatedExecutor::FakeLogprobs(t);
          const v1::Logprobs& got = o.logprobs(i);
          EXPECT_EQ(got.sampled().token_id(), t);
          EXPECT_EQ(got.sampled().logprob(), want.logprob);
          EXPECT_EQ(got.sampled().text(), tokenizer_->Decode(std::vector<TokenId>{t}, false));
          ASSERT_EQ(got.top_size(), 2);
          EXPECT_EQ(got.top(1).token_id(), want.top[1].first);
          EXPECT_EQ(got.top(1).logprob(), want.top[1].second);
          EXPECT_EQ(got.top(1).text(),
                    tokenizer_->Decode(std::vector<TokenId>{want.top[1].first}, false));
          ++num_tokens;
        }
      }
    }
    EXPECT_EQ(num_tokens, 12);
  }
  // Not asked: none, although the executor supplied them.
  const CallResult plain = Generate(Text("Once upon a time", 6));
  ASSERT_TRUE(plain.status.ok());
  for (const v1::GenerateResponse& resp : plain.responses) {
    for (const v1::SequenceOutput& o : resp.outputs()) EXPECT_EQ(o.logprobs_size(), 0);
  }
}

TEST_F(LLMServiceTest, StopStringEndsTheSequenceWithoutItsText) {
  const CallResult first = Generate(Text("Hello world", 40));
  ASSERT_TRUE(first.status.ok());
  const std::string text = AllText(first, 0);
  // A stop string from the middle of what the same seed generates.
  const size_t at = text.size() / 2;
  const std::string stop = text.substr(at, 2);
  if (stop.size() < 2 || text.find(stop) < at) GTEST_SKIP() << "no unique stop string in text";
  v1::GenerateRequest req = Text("Hello world", 40);
  req.mutable_sampling_params()->add_stop(stop);
  const CallResult r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const v1::SequenceOutput& last = r.responses.back().outputs(0);
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(last.stop_reason(), stop);
  EXPECT_EQ(AllText(r, 0), text.substr(0, text.find(stop)));
}

TEST_F(LLMServiceTest, IncludeStopStrInOutputEndsTheTextWithTheStopString) {
  const CallResult first = Generate(Text("Hello world", 40));
  ASSERT_TRUE(first.status.ok());
  const std::string text = AllText(first, 0);
  const size_t at = text.size() / 2;
  const std::string stop = text.substr(at, 2);
  if (stop.size() < 2 || text.find(stop) < at) GTEST_SKIP() << "no unique stop string in text";
  for (bool stream : {true, false}) {
    SCOPED_TRACE(stream);
    v1::GenerateRequest req = Text("Hello world", 40);
    req.set_stream(stream);
    req.mutable_sampling_params()->add_stop(stop);
    req.mutable_sampling_params()->set_include_stop_str_in_output(true);
    const CallResult r = Generate(req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    const v1::SequenceOutput& last = r.responses.back().outputs(0);
    EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_STOP);
    EXPECT_EQ(last.stop_reason(), stop);
    EXPECT_EQ(AllText(r, 0), text.substr(0, at + stop.size()));
  }
}

// A stop_token_ids entry that ends a sequence is its stop_token_id, not a stop_reason (EOS is
// neither: StopChecker's test).
TEST_F(LLMServiceTest, StopTokenIdIsReportedAndEosIsNot) {
  const CallResult first = Generate(Text("Hello world", 40));
  ASSERT_TRUE(first.status.ok());
  const std::vector<TokenId> tokens = AllTokens(first, 0);
  ASSERT_GE(tokens.size(), 4u);
  v1::GenerateRequest req = Text("Hello world", 40);
  req.mutable_sampling_params()->add_stop_token_ids(tokens[3]);
  const CallResult r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const v1::SequenceOutput& last = r.responses.back().outputs(0);
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_STOP);
  ASSERT_TRUE(last.has_stop_token_id());
  EXPECT_EQ(last.stop_token_id(), tokens[3]);
  EXPECT_EQ(last.stop_reason(), "");
}

// A stop string in the text of the first min_tokens tokens neither ends the sequence nor
// cuts its text.
TEST_F(LLMServiceTest, StopStringsCountOnlyFromMinTokens) {
  const CallResult first = Generate(Text("Hello world", 40));
  ASSERT_TRUE(first.status.ok());
  const std::vector<TokenId> tokens = AllTokens(first, 0);
  if (tokens.size() < 40) GTEST_SKIP() << "the seed samples EOS";
  const std::string text = AllText(first, 0);
  const std::string early = tokenizer_->Decode(std::span<const TokenId>(tokens).first(4), true);
  ASSERT_TRUE(text.starts_with(early));
  // A stop string that occurs once, within the first four tokens' text.
  std::string stop;
  for (size_t i = 0; i + 2 <= early.size() && stop.empty(); ++i) {
    const std::string s = early.substr(i, 2);
    if (text.find(s) == i && text.find(s, i + 1) == std::string::npos) stop = s;
  }
  if (stop.empty()) GTEST_SKIP() << "no unique stop string early in the text";
  v1::GenerateRequest req = Text("Hello world", 40);
  req.mutable_sampling_params()->add_stop(stop);
  req.mutable_sampling_params()->set_min_tokens(8);
  const CallResult r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(AllTokens(r, 0), tokens);
  EXPECT_EQ(AllText(r, 0), text);
  const v1::SequenceOutput& last = r.responses.back().outputs(0);
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(last.stop_reason(), "");
}

TEST_F(LLMServiceTest, UsageCountsPrefixCachedPromptTokens) {
  SwapEngine(/*open=*/true, /*prefix_caching=*/true);
  v1::GenerateRequest req;
  for (int i = 0; i < 40; ++i) req.mutable_token_ids()->add_ids(100 + i);
  req.mutable_sampling_params()->set_max_tokens(4);
  // Unseeded, each call samples from its own random seed: without ignore_eos one in about 500
  // would sample tiny-llama's EOS (vocabulary 2048) within its four tokens.
  req.mutable_sampling_params()->set_ignore_eos(true);
  const CallResult first = Generate(req);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.responses.back().usage().cached_prompt_tokens(), 0u);
  const CallResult second = Generate(req);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  const v1::Usage& usage = second.responses.back().usage();
  EXPECT_EQ(usage.prompt_tokens(), 40u);
  EXPECT_EQ(usage.cached_prompt_tokens(), 32u);  // the two full blocks
  EXPECT_EQ(usage.completion_tokens(), 4u);
  EXPECT_TRUE(Eventually([&] { return Stats().prefix_cache_hit_rate() > 0; }));
}

TEST_F(LLMServiceTest, RequestIdInUseAndTooManyRequests) {
  SwapEngine(/*open=*/false);
  std::vector<std::thread> threads;
  std::vector<CallResult> results(kMaxConcurrent);
  for (int i = 0; i < kMaxConcurrent; ++i) {
    threads.emplace_back([this, i, &results] {
      v1::GenerateRequest req = Text("Hello", 4);
      req.set_request_id(absl::StrCat("held-", i));
      results[i] = Generate(req);
    });
    ASSERT_TRUE(Eventually([&] { return service_->num_calls() == i + 1; }));
  }
  v1::GenerateRequest dup = Text("Hello", 4);
  dup.set_request_id("held-0");
  CallResult r = Generate(dup);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(r.status.error_message(), HasSubstr("request id held-0 is in use"));
  r = Generate(Text("Hello", 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(r.status.error_message(), HasSubstr("limit of 4 concurrent requests"));
  gate_->Open();
  for (std::thread& t : threads) t.join();
  for (const CallResult& c : results) EXPECT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_TRUE(Eventually([&] { return service_->num_calls() == 0; }));
  EXPECT_TRUE(Generate(dup).status.ok());  // the id is free again
}

TEST_F(LLMServiceTest, CancellingMidStreamFreesEveryBlock) {
  SwapEngine(/*open=*/false);
  gate_->Allow(2);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub_->Generate(&ctx, Text("Hello world", 300));
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.outputs(0).token_ids_size(), 1);
  // Stats are published at the end of a step, after its outputs went out.
  EXPECT_TRUE(
      Eventually([&] { return Stats().num_free_gpu_blocks() < static_cast<uint32_t>(kBlocks); }));
  ctx.TryCancel();
  gate_->Open();
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(Eventually([&] {
    const v1::GetStatsResponse s = Stats();
    return s.num_running() == 0 && s.num_waiting() == 0 &&
           s.num_free_gpu_blocks() == static_cast<uint32_t>(kBlocks) && s.gpu_kv_usage() == 0;
  }));
  EXPECT_TRUE(Eventually([&] { return service_->num_calls() == 0; }));
}

// A client that cancels a request may reuse its id at once: the next call with it is served,
// not refused with ALREADY_EXISTS while the cancellation is still on its way through the server.
TEST_F(LLMServiceTest, ACancelledRequestIdIsReusableAtOnce) {
  for (int i = 0; i < 30; ++i) {
    SCOPED_TRACE(absl::StrCat("round ", i));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::GenerateRequest first = Text("Hello world", 300);
    first.set_request_id("again");
    auto reader = stub_->Generate(&ctx, first);
    v1::GenerateResponse resp;
    ASSERT_TRUE(reader->Read(&resp));  // running
    ctx.TryCancel();
    v1::GenerateRequest second = Text("Hello", 4);
    second.set_request_id("again");
    const CallResult r = Generate(second);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    while (reader->Read(&resp)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(Eventually([&] { return service_->num_calls() == 0; }));
}

// A request id in use is refused at once, not once the request holding it ends: the refusal
// does not depend on how soon that happens.
TEST_F(LLMServiceTest, AnIdInUseIsRefusedEvenIfItsRequestEndsMomentsLater) {
  SwapEngine(/*open=*/false);
  gate_->Allow(1);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::GenerateRequest first = Text("Hello world", 4);
  first.set_request_id("busy");
  auto reader = stub_->Generate(&ctx, first);
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));  // running, held at the gate
  std::thread opener([this] {
    absl::SleepFor(absl::Milliseconds(100));
    gate_->Open();
  });
  v1::GenerateRequest second = Text("Hello", 4);
  second.set_request_id("busy");
  const CallResult r = Generate(second);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << r.status.error_message();
  EXPECT_EQ(r.status.error_message(), "request id busy is in use by a running request");
  EXPECT_TRUE(r.responses.empty());
  opener.join();
  int tokens = resp.outputs(0).token_ids_size();
  while (reader->Read(&resp))
    tokens += resp.outputs_size() > 0 ? resp.outputs(0).token_ids_size() : 0;
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, 4);  // the first request ran undisturbed
}

// Two submissions with one id, the second raced against the end of the first: each is either
// refused ALREADY_EXISTS (only while the other may still run: before its client saw it end) or
// served in full, never both refused, never anything in between.
TEST_F(LLMServiceTest, SubmissionsRacedAgainstTheEndOfTheRequestHoldingTheirId) {
  struct Call {
    CallResult result;
    int64_t sent = 0;
    int64_t ended = 0;
  };
  auto run = [this](const std::string& text, Call* c) {
    v1::GenerateRequest req = Text(text, 6);
    req.set_request_id("race");
    c->sent = absl::ToUnixNanos(absl::Now());
    c->result = Generate(req);
    c->ended = absl::ToUnixNanos(absl::Now());
  };
  Call solo;
  run("Hello world", &solo);
  ASSERT_TRUE(solo.result.status.ok()) << solo.result.status.error_message();
  const absl::Duration lifetime = absl::Nanoseconds(solo.ended - solo.sent);
  absl::BitGen rng;
  int refused = 0, served = 0;
  for (int i = 0; i < 100; ++i) {
    SCOPED_TRACE(absl::StrCat("round ", i));
    Call calls[2];
    std::thread first([&] { run("Hello world", &calls[0]); });
    absl::SleepFor(lifetime * absl::Uniform(rng, 0.0, 1.0));
    run("Hello", &calls[1]);
    first.join();
    int num_refused = 0;
    for (int c = 0; c < 2; ++c) {
      const CallResult& r = calls[c].result;
      if (r.status.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
        ++num_refused;
        EXPECT_EQ(r.status.error_message(), "request id race is in use by a running request");
        EXPECT_LT(calls[c].sent, calls[1 - c].ended)
            << "refused after its client saw the other end";
        EXPECT_TRUE(r.responses.empty());
        continue;
      }
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
      EXPECT_EQ(r.responses.back().usage().completion_tokens(), 6u);
    }
    EXPECT_LE(num_refused, 1);
    (num_refused == 0 ? served : refused)++;
  }
  RecordProperty("rounds_with_a_refusal", refused);
  RecordProperty("rounds_both_served", served);
  // Both sides of the race were taken (else the test raced nothing).
  EXPECT_GT(refused, 0);
  EXPECT_GT(served, 0);
  EXPECT_TRUE(Eventually([&] { return service_->num_calls() == 0; }));
}

TEST_F(LLMServiceTest, NotReadyAnswersUnavailable) {
  service_->SetNotReady("rank 1 is down").reset();
  gate_ = nullptr;
  CallResult r = Generate(Text("Hello"));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(r.status.error_message(), "the worker group is not ready: rank 1 is down");
  grpc::ClientContext ctx;
  v1::GetStatsResponse stats;
  EXPECT_EQ(stub_->GetStats(&ctx, v1::GetStatsRequest(), &stats).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  service_->SetReady(MakeEngine());
  EXPECT_TRUE(Generate(Text("Hello")).status.ok());
}

TEST_F(LLMServiceTest, GroupFailureEndsStreamsWithItsStatus) {
  SwapEngine(/*open=*/false);
  gate_->Allow(1);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub_->Generate(&ctx, Text("Hello world", 100));
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  gate_->FailWith(absl::UnavailableError("worker rank 1 at 127.0.0.1:9: the stream broke"));
  gate_->Open();
  while (reader->Read(&resp)) {
  }
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(s.error_message(), "worker rank 1 at 127.0.0.1:9: the stream broke");
}

TEST_F(LLMServiceTest, ShutdownEndsStreamsWithUnavailable) {
  SwapEngine(/*open=*/false);
  CallResult result;
  std::thread t([&] { result = Generate(Text("Hello", 4)); });
  ASSERT_TRUE(Eventually([&] { return service_->num_calls() == 1; }));
  std::shared_ptr<ServingEngine> engine = service_->Shutdown();
  t.join();
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(result.status.error_message(), "server shutting down");
  const CallResult later = Generate(Text("Hello"));
  EXPECT_EQ(later.status.error_message(), "server shutting down");
  gate_->Open();
  engine.reset();
  gate_ = nullptr;
}

TEST_F(LLMServiceTest, ModelInfo) {
  grpc::ClientContext ctx;
  v1::GetModelInfoResponse info;
  ASSERT_TRUE(stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.model_name(), "tiny-llama");
  EXPECT_EQ(info.max_model_len(), static_cast<uint32_t>(kMaxModelLen));
  EXPECT_EQ(info.vocab_size(), 2048u);
  EXPECT_EQ(info.tensor_parallel_size(), 1u);
  EXPECT_EQ(info.block_size(), 16u);
  EXPECT_EQ(info.num_gpu_blocks(), static_cast<uint32_t>(kBlocks));
  EXPECT_EQ(Stats().num_free_gpu_blocks(), static_cast<uint32_t>(kBlocks));
}

// vLLM's per-request metrics are recorded by the service, for every client.
TEST_F(LLMServiceTest, MetricsCountTokensLatenciesAndOutcomes) {
  v1::GenerateRequest req = Text("Hello world", 9);
  req.mutable_sampling_params()->set_ignore_eos(true);
  const CallResult r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const v1::Usage& usage = r.responses.back().usage();
  ASSERT_EQ(usage.completion_tokens(), 9u);
  EXPECT_EQ(metrics_->generation_tokens->Value(), 9);
  EXPECT_EQ(metrics_->prompt_tokens->Value(), usage.prompt_tokens());
  EXPECT_EQ(metrics_->time_to_first_token_seconds->Count(), 1u);
  EXPECT_EQ(metrics_->e2e_request_latency_seconds->Count(), 1u);
  // One token per step: an inter-token observation per token after the first.
  EXPECT_EQ(metrics_->inter_token_latency_seconds->Count(), 8u);
  EXPECT_GE(metrics_->e2e_request_latency_seconds->Sum(),
            metrics_->time_to_first_token_seconds->Sum());
  EXPECT_EQ(metrics_->request_success->Value({{"finished_reason", "length"}}), 1);

  // A cancelled request counts as aborted, with only the tokens it got.
  SwapEngine(/*open=*/false);
  gate_->Allow(2);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub_->Generate(&ctx, Text("Hello world", 300));
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The call is gone once its abort is queued in the engine; only then may the steps run, so
  // the abort (at the next step's start) comes long before the 300 tokens.
  EXPECT_TRUE(Eventually([&] { return service_->num_calls() == 0; }));
  gate_->Open();
  EXPECT_TRUE(Eventually([&] {
    return metrics_->request_success->Value({{"finished_reason", "abort"}}) == 1;
  }));
  EXPECT_LT(metrics_->generation_tokens->Value(), 9 + 300);
  EXPECT_EQ(metrics_->request_success->Value({{"finished_reason", "length"}}), 1);
}

}  // namespace
}  // namespace llm

namespace llm {
namespace {

TEST_F(LLMServiceTest, OversizedPromptStopStringAndRequestIdAreInvalid) {
  // 10 MB: over the default --max-prompt-bytes (8 MiB), under the receive limit (16 MiB), so
  // the service answers rather than gRPC's "Received message larger than max".
  ExpectInvalid(Text(std::string(10'000'000, 'a')),
                "the prompt is 10000000 bytes; at most 8388608 are accepted (--max-prompt-bytes)");
  v1::GenerateRequest stop = Text("Hello");
  stop.mutable_sampling_params()->add_stop("ok");
  stop.mutable_sampling_params()->add_stop(std::string(100 * 1024, 'x'));
  ExpectInvalid(stop,
                "stop string 1 is 102400 bytes; at most 1024 are accepted (--max-stop-bytes)");
  stop.mutable_sampling_params()->set_stop(1, std::string(1024, 'x'));  // at the limit: served
  EXPECT_TRUE(Generate(stop).status.ok());

  v1::GenerateRequest id = Text("Hello");
  id.set_request_id(std::string(10 * 1024, 'r'));
  ExpectInvalid(id, "the request id is 10240 bytes; at most 256 are accepted");
  id.set_request_id("two\nlines");
  ExpectInvalid(id, "the request id has byte 0x0a at position 3");
  id.set_request_id(std::string(256, 'r'));  // at the limit: served
  const CallResult ok = Generate(id);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.responses.back().request_id(), std::string(256, 'r'));
}

TEST_F(LLMServiceTest, LimitsAreTheOptions) {
  StopServer();
  LLMServiceOptions o = DefaultOptions();
  o.max_prompt_bytes = 10;
  o.max_stop_bytes = 3;
  StartServer(o);
  ExpectInvalid(Text("Hello world"),
                "the prompt is 11 bytes; at most 10 are accepted (--max-prompt-bytes)");
  EXPECT_TRUE(Generate(Text("Hello")).status.ok());
  v1::GenerateRequest stop = Text("Hello");
  stop.mutable_sampling_params()->add_stop("abcd");
  ExpectInvalid(stop, "stop string 0 is 4 bytes; at most 3 are accepted (--max-stop-bytes)");
}

// Generate with `key` as the bearer token ("": no authorization metadata).
grpc::Status GenerateWithKey(v1::LLMService::Stub* stub, const std::string& key, int* num_tokens) {
  v1::GenerateRequest req;
  req.set_text("Hello");
  req.mutable_sampling_params()->set_max_tokens(4);
  req.mutable_sampling_params()->set_ignore_eos(true);  // four tokens, whatever the seed
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  *num_tokens = 0;
  while (reader->Read(&resp)) {
    for (const auto& o : resp.outputs()) *num_tokens += o.token_ids_size();
  }
  return reader->Finish();
}

TEST_F(LLMServiceTest, ApiKeyIsRequiredOnEveryCall) {
  StopServer();
  LLMServiceOptions o = DefaultOptions();
  o.api_key = "s3cret-key";
  StartServer(o);
  int tokens = 0;
  for (const std::string& key : {std::string(), std::string("wrong"), std::string("s3cret-ke"),
                                 std::string("s3cret-key2")}) {
    const grpc::Status s = GenerateWithKey(stub_.get(), key, &tokens);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << key;
    EXPECT_EQ(s.error_message(), "missing or invalid API key");
    EXPECT_EQ(tokens, 0);
  }
  const grpc::Status s = GenerateWithKey(stub_.get(), "s3cret-key", &tokens);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tokens, 4);

  for (bool with_key : {false, true}) {
    grpc::ClientContext info_ctx;
    grpc::ClientContext stats_ctx;
    if (with_key) {
      info_ctx.AddMetadata("authorization", "Bearer s3cret-key");
      stats_ctx.AddMetadata("authorization", "Bearer s3cret-key");
    }
    v1::GetModelInfoResponse info;
    v1::GetStatsResponse stats;
    const grpc::StatusCode want =
        with_key ? grpc::StatusCode::OK : grpc::StatusCode::UNAUTHENTICATED;
    EXPECT_EQ(stub_->GetModelInfo(&info_ctx, v1::GetModelInfoRequest(), &info).error_code(), want);
    EXPECT_EQ(stub_->GetStats(&stats_ctx, v1::GetStatsRequest(), &stats).error_code(), want);
    EXPECT_EQ(info.model_name(), with_key ? "tiny-llama" : "");
  }
}

// Sends `bytes` as the request of /llm.v1.LLMService/Generate over a generic stub.
grpc::Status SendRawGenerate(const std::shared_ptr<grpc::Channel>& channel,
                             const std::string& bytes) {
  return GrpcRawUnaryCall(channel, "/llm.v1.LLMService/Generate", bytes);
}

TEST_F(LLMServiceTest, UnparseableRequestIsInvalidWithAMessage) {
  // Field 1 (request_id, length-delimited) claiming 2^28 bytes that are not there.
  const grpc::Status s = SendRawGenerate(channel_, std::string("\x0a\x80\x80\x80\x80\x01xyz", 9));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(),
            "the request's 9 bytes do not parse as an llm.v1.GenerateRequest (protobuf)");
  // The same path serves a well-formed request sent as bytes (one response: stream=false).
  v1::GenerateRequest req = Text("Hello", 3);
  req.set_stream(false);
  EXPECT_TRUE(SendRawGenerate(channel_, req.SerializeAsString()).ok());
}

TEST_F(LLMServiceTest, DrainRefusesNewRequestsAndLetsThoseInFlightFinish) {
  SwapEngine(/*open=*/false);
  CallResult first;
  std::thread t([&] { first = Generate(Text("Hello world", 6)); });
  ASSERT_TRUE(Eventually([&] { return service_->num_calls() == 1; }));
  service_->Drain();
  const CallResult refused = Generate(Text("Hello"));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("draining"));
  EXPECT_EQ(service_->num_calls(), 1);
  gate_->Open();
  t.join();
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  int tokens = 0;
  for (const auto& r : first.responses) {
    for (const auto& o : r.outputs()) tokens += o.token_ids_size();
  }
  EXPECT_EQ(tokens, 6);
  EXPECT_EQ(first.responses.back().outputs(0).finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_TRUE(Eventually([&] { return service_->num_calls() == 0; }));
}

v1::GenerateRequest Chat(std::vector<std::pair<std::string, std::string>> messages,
                         std::optional<bool> add_generation_prompt, const std::string& id) {
  v1::GenerateRequest req;
  req.mutable_chat();  // set even without messages
  for (const auto& [role, content] : messages) {
    v1::ChatMessage* m = req.mutable_chat()->add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  if (add_generation_prompt.has_value())
    req.mutable_chat()->set_add_generation_prompt(*add_generation_prompt);
  req.set_request_id(id);
  req.set_stream(true);
  req.mutable_sampling_params()->set_max_tokens(4);
  req.mutable_sampling_params()->set_seed(5);
  return req;
}

TEST_F(LLMServiceTest, ChatWithoutATemplateIsAFailedPrecondition) {
  const CallResult r = Generate(Chat({{"user", "Hello"}}, std::nullopt, "chat-0"));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(r.status.error_message(), HasSubstr("the model has no chat template"));
  EXPECT_TRUE(r.responses.empty());
}

// fortune-llama's template (SmolLM2's ChatML): the engine receives the rendered conversation's
// tokens, encoded without a bos (the template writes every special token itself).
TEST_F(LLMServiceTest, ChatPromptIsTheTemplatesTextTokenized) {
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t =
      LoadChatTemplate(LLM_TEST_DATA_DIR "/../../models/fortune-llama");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE(*t, nullptr);
  ServeWithChatTemplate(*t);

  const CallResult with_system =
      Generate(Chat({{"system", "Be brief."}, {"user", "Hello"}}, std::nullopt, "chat-1"));
  ASSERT_TRUE(with_system.status.ok()) << with_system.status.error_message();
  const std::string expected1 =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
      "<|im_start|>assistant\n";
  EXPECT_EQ(gate_->PromptOf("chat-1"), tokenizer_->Encode(expected1, false));
  EXPECT_EQ(with_system.responses.back().usage().prompt_tokens(),
            tokenizer_->Encode(expected1, false).size());
  EXPECT_FALSE(AllTokens(with_system, 0).empty());

  // No system message: the template adds SmolLM's; add_generation_prompt=false: no open turn.
  const CallResult no_system = Generate(
      Chat({{"user", "Hi"}, {"assistant", "Hello!"}}, /*add_generation_prompt=*/false, "chat-2"));
  ASSERT_TRUE(no_system.status.ok()) << no_system.status.error_message();
  const std::string expected2 =
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n";
  EXPECT_EQ(gate_->PromptOf("chat-2"), tokenizer_->Encode(expected2, false));
}

// The proto's tool fields reach the template as transformers' variables: tools_json as
// `tools`, tool_calls with their JSON-text arguments parsed (as vLLM passes them), the tool
// message's tool_call_id and name, and unset content as none. (The published templates over
// these fields: chat_template_test's ToolConversationsRenderAsJinja2Does.)
TEST_F(LLMServiceTest, ChatToolFieldsReachTheTemplate) {
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t = ChatTemplate::Create(
      "{{ tools | tojson }}\n{% for m in messages %}{{ m.role }}: {{ m.content }}"
      "{% if m.tool_calls %} {{ m.tool_calls[0].id }} {{ m.tool_calls[0].function.name }}"
      "{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}"
      "{% if m.tool_call_id %} for {{ m.tool_call_id }} ({{ m.name }}){% endif %};{% endfor %}",
      "", "");
  ASSERT_TRUE(t.ok()) << t.status();
  ServeWithChatTemplate(*t);

  v1::GenerateRequest req = Chat({{"user", "Weather?"}}, std::nullopt, "chat-tools");
  v1::ChatMessage* call = req.mutable_chat()->add_messages();
  call->set_role("assistant");
  v1::ToolCall* tc = call->add_tool_calls();
  tc->set_id("call_1");
  tc->set_type("function");
  tc->mutable_function()->set_name("get_weather");
  tc->mutable_function()->set_arguments(R"({"city":"Paris"})");
  v1::ChatMessage* result = req.mutable_chat()->add_messages();
  result->set_role("tool");
  result->set_content("21 C");
  result->set_tool_call_id("call_1");
  result->set_name("get_weather");
  req.mutable_chat()->set_tools_json(R"([{"type":"function","function":{"name":"get_weather"}}])");
  const CallResult r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const std::string expected =
      "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}]\n"
      "user: Weather?;assistant: None call_1 get_weather{\"city\": \"Paris\"};"
      "tool: 21 C for call_1 (get_weather);";
  const std::vector<TokenId> prompt = gate_->PromptOf("chat-tools");
  EXPECT_EQ(tokenizer_->Decode(prompt), expected);
  EXPECT_EQ(prompt, tokenizer_->Encode(expected, false));

  req.set_request_id("chat-bad-tools");
  req.mutable_chat()->set_tools_json("{\"type\": \"function\"}");
  ExpectInvalid(req, "tools_json");
}

// documents_json is the template's `documents`, template_kwargs_json's keys are variables of
// their own (Qwen3's enable_thinking), a message's reasoning_content is its key; a kwarg that
// would replace a standard variable, and documents that are not a list of objects, are
// INVALID_ARGUMENT naming them.
TEST_F(LLMServiceTest, ChatDocumentsTemplateKwargsAndReasoningReachTheTemplate) {
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t = ChatTemplate::Create(
      "{% for d in documents %}[{{ d.title }}: {{ d.text }}]{% endfor %}"
      "{% if enable_thinking is defined %}thinking={{ enable_thinking }} {% endif %}"
      "{% for m in messages %}{{ m.role }}: "
      "{% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>{% endif %}"
      "{{ m.content }};{% endfor %}",
      "", "");
  ASSERT_TRUE(t.ok()) << t.status();
  ServeWithChatTemplate(*t);

  v1::GenerateRequest req = Chat({{"user", "Hi"}, {"assistant", "Hello"}}, std::nullopt, "chat-d");
  req.mutable_chat()->mutable_messages(1)->set_reasoning_content("greet back");
  req.mutable_chat()->set_documents_json(
      R"([{"title":"A","text":"one"},{"title":"B","text":"two"}])");
  req.mutable_chat()->set_template_kwargs_json(R"({"enable_thinking": false})");
  const CallResult r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const std::string expected =
      "[A: one][B: two]thinking=False user: Hi;assistant: <think>greet back</think>Hello;";
  EXPECT_EQ(tokenizer_->Decode(gate_->PromptOf("chat-d")), expected);

  req.set_request_id("chat-d-bad-kwargs");
  req.mutable_chat()->set_template_kwargs_json(R"({"messages": []})");
  ExpectInvalid(req, "'messages' is a variable the request sets by its own field");
  req.set_request_id("chat-d-bad-docs");
  req.mutable_chat()->clear_template_kwargs_json();
  req.mutable_chat()->set_documents_json(R"(["text"])");
  ExpectInvalid(req, "documents_json");
}

TEST_F(LLMServiceTest, ChatErrorsAreInvalidArguments) {
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t = ChatTemplate::Create(
      "{% if messages[0]['role'] != 'user' %}"
      "{{ raise_exception('Conversation must start with a user message') }}{% endif %}"
      "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
      "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.status();
  ServeWithChatTemplate(*t);
  ExpectInvalid(Chat({{"assistant", "Hi"}}, std::nullopt, "chat-3"),
                "Conversation must start with a user message");
  ExpectInvalid(Chat({}, std::nullopt, "chat-4"), "the chat has no messages");
  const CallResult ok = Generate(Chat({{"user", "Hi"}}, std::nullopt, "chat-5"));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(gate_->PromptOf("chat-5"), tokenizer_->Encode("user: Hi\n", false));
}

}  // namespace
}  // namespace llm
