// The llm-scheduler binary against fake worker ranks served in this process: the group comes
// up (health SERVING, Generate works), a killed rank fails the group (UNAVAILABLE naming it,
// health NOT_SERVING), the rank coming back gets Init again and the group serves again;
// SIGTERM exits 0 without shutting the workers down; bad flags exit 2. Every wait is a
// polling loop with a generous hang guard, never a timing assertion.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "llm/v1/llm_service.grpc.pb.h"
#include "tests/testing/fake_worker.h"
#include "tests/testing/grpc_probe.h"

extern char** environ;

namespace llm {
namespace {

using ::testing::HasSubstr;

constexpr int kVocab = 2048;  // tiny-llama's
constexpr int kBlocks = 128;

template <typename F>
bool Eventually(F done, absl::Duration limit = absl::Seconds(60)) {
  const absl::Time deadline = absl::Now() + limit;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return done();
}

class Process {
 public:
  explicit Process(std::vector<std::string> args, const std::string& log) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    EXPECT_EQ(posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Process() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      Wait();
    }
  }
  void Signal(int sig) { kill(pid_, sig); }
  // The exit code (or 128 + signal), or -1 when it did not exit within the hang guard.
  int Wait(absl::Duration limit = absl::Seconds(60)) {
    int code = -1;
    Eventually(
        [&] {
          int status = 0;
          if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
          exited_ = true;
          code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          return true;
        },
        limit);
    return code;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
};

class LLMSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("llm_scheduler_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (HasFailure() || std::getenv("LLM_TEST_SHOW_LOG") != nullptr) {
      std::ifstream log(dir_ / "scheduler.log");
      std::cerr << "--- llm-scheduler log ---\n" << log.rdbuf() << "\n";
    }
    std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<Process> StartScheduler(const std::vector<std::string>& workers,
                                          std::vector<std::string> extra = {}) {
    std::string addresses;
    for (const std::string& w : workers) addresses += (addresses.empty() ? "" : ",") + w;
    std::vector<std::string> args = {LLM_SCHEDULER_BIN,
                                     "--model=" LLM_TEST_DATA_DIR "/models/tiny-llama",
                                     "--worker-addresses=" + addresses,
                                     absl::StrCat("--tensor-parallel-size=", workers.size()),
                                     "--host=127.0.0.1",
                                     "--port=0",
                                     "--port-file=" + (dir_ / "port").string(),
                                     "--max-model-len=256",
                                     "--worker-timeout=10"};
    args.insert(args.end(), extra.begin(), extra.end());
    return std::make_unique<Process>(args, (dir_ / "scheduler.log").string());
  }

  int Port() {
    int port = 0;
    EXPECT_TRUE(Eventually([&] {
      std::ifstream in(dir_ / "port");
      return static_cast<bool>(in >> port) && port > 0;
    }));
    return port;
  }

  // Plaintext, or TLS trusting `tls_ca` (to "localhost", the test certificate's name).
  std::shared_ptr<grpc::Channel> Connect(const std::string& tls_ca = "") {
    const int port = Port();
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    std::string target = absl::StrCat("127.0.0.1:", port);
    if (!tls_ca.empty()) {
      std::ifstream in(tls_ca);
      std::stringstream pem;
      pem << in.rdbuf();
      grpc::SslCredentialsOptions options;
      options.pem_root_certs = pem.str();
      creds = grpc::SslCredentials(options);
      target = absl::StrCat("localhost:", port);
    }
    auto channel = grpc::CreateChannel(target, creds);
    stub_ = v1::LLMService::NewStub(channel);
    return channel;
  }

  grpc::Status Generate(int max_tokens, std::vector<int>* tokens = nullptr,
                        const std::string& api_key = "") {
    v1::GenerateRequest req;
    req.set_text("Hello world");
    req.set_stream(true);
    req.mutable_sampling_params()->set_max_tokens(max_tokens);
    grpc::ClientContext ctx;
    if (!api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      for (const auto& o : resp.outputs()) {
        if (tokens != nullptr)
          tokens->insert(tokens->end(), o.token_ids().begin(), o.token_ids().end());
      }
    }
    return reader->Finish();
  }

  std::filesystem::path dir_;
  std::unique_ptr<v1::LLMService::Stub> stub_;
};

TEST_F(LLMSchedulerTest, ServesFailsAndRecoversWhenARankComesBack) {
  // The same seed: the ranks of a group sample alike (each appends its own tokens; the
  // scheduler fails a step whose ranks disagree).
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 0, kBlocks);
  FakeWorkerServer r1 = FakeWorkerServer::Start(kVocab, 0, kBlocks + 5);
  // A short recovery timeout: a request in flight when rank 1 dies ends after it.
  auto scheduler = StartScheduler({r0.address, r1.address}, {"--recovery-timeout=2"});
  auto channel = Connect();
  ASSERT_TRUE(Eventually([&] { return GrpcHealthCheck(channel, "") == 1; }));
  EXPECT_EQ(GrpcHealthCheck(channel, "llm.v1.LLMService"), 1);
  EXPECT_THAT(GrpcReflectionListServices(channel), HasSubstr("llm.v1.LLMService"));

  std::vector<int> tokens;
  grpc::Status s = Generate(8, &tokens);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tokens.size(), 8u);
  {
    grpc::ClientContext ctx;
    v1::GetModelInfoResponse info;
    ASSERT_TRUE(stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.model_name(), "tiny-llama");
    EXPECT_EQ(info.tensor_parallel_size(), 2u);
    EXPECT_EQ(info.max_model_len(), 256u);
    EXPECT_EQ(info.num_gpu_blocks(), static_cast<uint32_t>(kBlocks));  // the smaller
    EXPECT_EQ(info.num_cpu_blocks(), 8u);
  }
  EXPECT_EQ(r0.service->init().rank(), 0u);
  EXPECT_EQ(r1.service->init().rank(), 1u);
  EXPECT_EQ(r1.service->init().world_size(), 2u);
  EXPECT_EQ(r0.service->init().rendezvous_prefix(), "group-1");

  // Rank 1 dies: the next step fails naming it (the request waits --recovery-timeout for the
  // group, then ends; or it is refused when the Health probe was first), and the group is no
  // longer served.
  const int port1 = r1.port;
  r1.Kill();
  s = Generate(8);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("worker rank 1 at 127.0.0.1:", port1)));
  ASSERT_TRUE(Eventually([&] { return GrpcHealthCheck(channel, "") == 2; }));
  s = Generate(8);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("the worker group is recovering"));

  // It comes back on the same port: both ranks are initialized again, under a new prefix.
  r1 = FakeWorkerServer::Start(kVocab, 0, kBlocks + 5, port1);
  ASSERT_EQ(r1.port, port1);
  ASSERT_TRUE(Eventually([&] { return GrpcHealthCheck(channel, "") == 1; }));
  // At least once more (a loaded machine may need more than one attempt: each is fine).
  EXPECT_GE(r0.service->num_inits(), 2);
  EXPECT_GE(r1.service->num_inits(), 1);
  EXPECT_NE(r0.service->init().rendezvous_prefix(), "group-1");
  std::vector<int> again;
  s = Generate(8, &again);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(again.size(), 8u);

  // A rank that dies while the group is idle is noticed without a request (Health probe).
  const std::string r0_address = r0.address;
  r0.Kill();
  ASSERT_TRUE(Eventually([&] { return GrpcHealthCheck(channel, "") == 2; }));
  s = Generate(8);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("the worker group is recovering"));
  EXPECT_THAT(s.error_message(), HasSubstr("worker rank 0 at " + r0_address));

  // SIGTERM: a clean exit; the workers are left running.
  scheduler->Signal(SIGTERM);
  EXPECT_EQ(scheduler->Wait(), 0);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::HealthResponse health;
  auto worker = v1::WorkerService::NewStub(
      grpc::CreateChannel(r1.address, grpc::InsecureChannelCredentials()));
  EXPECT_TRUE(worker->Health(&ctx, v1::HealthRequest(), &health).ok());
}

TEST_F(LLMSchedulerTest, NotServingUntilTheWorkersAnswer) {
  // Reserve a port for a worker that starts after the scheduler.
  FakeWorkerServer probe = FakeWorkerServer::Start(kVocab, 0, kBlocks);
  const int port = probe.port;
  probe.Kill();
  auto scheduler = StartScheduler({absl::StrCat("127.0.0.1:", port)});
  auto channel = Connect();
  ASSERT_TRUE(Eventually([&] { return GrpcHealthCheck(channel, "") == 2; }));
  grpc::Status s = Generate(4);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("the worker group is not ready"));
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 0, kBlocks, port);
  ASSERT_TRUE(Eventually([&] { return GrpcHealthCheck(channel, "") == 1; }));
  EXPECT_TRUE(Generate(4).ok());
  scheduler->Signal(SIGINT);
  EXPECT_EQ(scheduler->Wait(), 0);
}

// A streaming request whose tokens are counted as they come (a thread per request).
struct StreamingCall {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  std::atomic<int> tokens{0};
  grpc::Status status;
  std::thread thread;

  StreamingCall(v1::LLMService::Stub* stub, int max_tokens) {
    v1::GenerateRequest req;
    req.set_text("Hello world");
    req.set_stream(true);
    req.mutable_sampling_params()->set_max_tokens(max_tokens);
    req.mutable_sampling_params()->set_ignore_eos(true);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    reader = stub->Generate(&ctx, req);
    thread = std::thread([this] {
      v1::GenerateResponse resp;
      while (reader->Read(&resp)) {
        for (const auto& o : resp.outputs()) tokens += o.token_ids_size();
      }
      status = reader->Finish();
    });
  }
  void Join() { thread.join(); }
};

TEST_F(LLMSchedulerTest, SigtermDrainsTheStreamsInFlightThenExitsZero) {
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 0, kBlocks);
  auto scheduler = StartScheduler({r0.address}, {"--worker-timeout=120"});
  auto channel = Connect();
  ASSERT_TRUE(Eventually([&] { return GrpcHealthCheck(channel, "") == 1; }));
  constexpr int kCalls = 4;
  constexpr int kMaxTokens = 40;
  // The worker holds every step while the calls arrive (the engine waits on the first step, so
  // the others queue for the step after), then runs 10 more and holds again: every stream has
  // begun, none can have finished. Without the first hold, 10 steps of the first call could
  // run before the others arrived on a loaded machine, and those would never begin.
  r0.service->set_paused(true);
  std::vector<std::unique_ptr<StreamingCall>> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(std::make_unique<StreamingCall>(stub_.get(), kMaxTokens));
  }
  ASSERT_TRUE(Eventually([&] { return r0.service->num_steps() >= 1; }));
  absl::SleepFor(absl::Milliseconds(500));  // for the other calls to reach the engine's queue
  r0.service->pause_after(10);
  ASSERT_TRUE(Eventually([&] {
    for (auto& c : calls) {
      if (c->tokens == 0) return false;
    }
    return true;
  }));
  scheduler->Signal(SIGTERM);
  ASSERT_TRUE(Eventually([&] { return GrpcHealthCheck(channel, "") == 2; }));
  const grpc::Status refused = Generate(4);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr("draining"));
  for (auto& c : calls) EXPECT_LT(c->tokens, kMaxTokens);
  r0.service->set_paused(false);
  for (auto& c : calls) {
    c->Join();
    EXPECT_TRUE(c->status.ok()) << c->status.error_message();
    EXPECT_EQ(c->tokens, kMaxTokens);
  }
  EXPECT_EQ(scheduler->Wait(), 0);
}

TEST_F(LLMSchedulerTest, StreamsStillRunningAtTheDrainTimeoutEndUnavailable) {
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 0, kBlocks);
  auto scheduler = StartScheduler({r0.address}, {"--worker-timeout=120", "--drain-timeout=0.5"});
  auto channel = Connect();
  ASSERT_TRUE(Eventually([&] { return GrpcHealthCheck(channel, "") == 1; }));
  r0.service->pause_after(3);  // the stream begins, and can never finish
  StreamingCall call(stub_.get(), 40);
  ASSERT_TRUE(Eventually([&] { return call.tokens > 0; }));
  scheduler->Signal(SIGTERM);
  call.Join();
  EXPECT_EQ(call.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(call.status.error_message(), "server shutting down");
  EXPECT_EQ(scheduler->Wait(), 0);
  r0.service->set_paused(false);
}

// Runs `command` through the shell; its exit code.
int Shell(const std::string& command) { return std::system(command.c_str()); }

TEST_F(LLMSchedulerTest, TlsApiKeyAndClusterSecret) {
  if (Shell("command -v openssl > /dev/null") != 0) GTEST_SKIP() << "no openssl CLI";
  const std::string cert = (dir_ / "cert.pem").string();
  const std::string key = (dir_ / "key.pem").string();
  ASSERT_EQ(Shell("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
                  "-addext subjectAltName=DNS:localhost -keyout " +
                  key + " -out " + cert + " 2> /dev/null"),
            0);
  const std::string secret_file = (dir_ / "secret").string();
  std::ofstream(secret_file) << "cluster-secret-123\n";
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 0, kBlocks);
  // The key from the environment, as a deployment would set it (not on the command line).
  setenv("LLM_API_KEY", "api-key-456", 1);
  auto scheduler = StartScheduler({r0.address}, {"--ssl-certfile=" + cert, "--ssl-keyfile=" + key,
                                                 "--cluster-secret-file=" + secret_file});
  unsetenv("LLM_API_KEY");
  auto channel = Connect(cert);
  // Health needs no key.
  ASSERT_TRUE(Eventually([&] { return GrpcHealthCheck(channel, "") == 1; }));
  EXPECT_EQ(r0.service->init_secret(), "cluster-secret-123");

  std::vector<int> tokens;
  grpc::Status s = Generate(8, &tokens);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(s.error_message(), "missing or invalid API key");
  EXPECT_TRUE(tokens.empty());
  s = Generate(8, &tokens, "api-key-456");
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tokens.size(), 8u);

  // A plaintext client gets nowhere, key or not.
  auto plain = v1::LLMService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", Port()), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer api-key-456");
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetModelInfoResponse info;
  s = plain->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_EQ(info.model_name(), "");

  // The key never reaches the log.
  scheduler->Signal(SIGTERM);
  EXPECT_EQ(scheduler->Wait(), 0);
  std::ifstream log(dir_ / "scheduler.log");
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_THAT(text.str(), ::testing::Not(HasSubstr("api-key-456")));
  EXPECT_THAT(text.str(), ::testing::Not(HasSubstr("cluster-secret-123")));
  EXPECT_THAT(text.str(), HasSubstr("TLS on"));
}

// --ssl-ca-certs: a client must present a certificate that CA signed.
TEST_F(LLMSchedulerTest, SslCaCertsRequiresAClientCertificate) {
  if (Shell("command -v openssl > /dev/null") != 0) GTEST_SKIP() << "no openssl CLI";
  const std::string d = dir_.string() + "/";
  ASSERT_EQ(Shell("cd " + d +
                  " && openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
                  "-addext subjectAltName=DNS:localhost -keyout key.pem -out cert.pem "
                  "&& openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca "
                  "-keyout ca.key -out ca.pem "
                  "&& openssl req -newkey rsa:2048 -nodes -subj /CN=client -keyout client.key "
                  "-out client.csr "
                  "&& openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
                  "-days 1 -out client.pem 2> /dev/null > /dev/null"),
            0);
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 0, kBlocks);
  auto scheduler = StartScheduler(
      {r0.address}, {"--ssl-certfile=" + d + "cert.pem", "--ssl-keyfile=" + d + "key.pem",
                     "--ssl-ca-certs=" + d + "ca.pem"});
  const int port = Port();
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  auto model_info = [&](bool with_client_cert) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = read(d + "cert.pem");
    if (with_client_cert) {
      options.pem_private_key = read(d + "client.key");
      options.pem_cert_chain = read(d + "client.pem");
    }
    auto stub = v1::LLMService::NewStub(
        grpc::CreateChannel(absl::StrCat("localhost:", port), grpc::SslCredentials(options)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetModelInfoResponse info;
    const grpc::Status s = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    return std::make_pair(s, info.model_name());
  };
  const auto [with_cert, name] = model_info(true);
  EXPECT_TRUE(with_cert.ok()) << with_cert.error_message();
  EXPECT_EQ(name, "tiny-llama");
  const auto [without_cert, none] = model_info(false);
  EXPECT_EQ(without_cert.error_code(), grpc::StatusCode::UNAVAILABLE)
      << without_cert.error_message();
  EXPECT_EQ(none, "");
  scheduler->Signal(SIGTERM);
  EXPECT_EQ(scheduler->Wait(), 0);
}

// The receive limit is --max-request-bytes (16 MiB), above --max-prompt-bytes (8 MiB): a 10 MB
// prompt gets the service's message, not gRPC's "Received message larger than max"; beyond
// the receive limit gRPC's own RESOURCE_EXHAUSTED remains.
TEST_F(LLMSchedulerTest, AnOversizedPromptGetsTheServicesMessage) {
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 0, kBlocks);
  auto scheduler = StartScheduler({r0.address});
  auto channel = Connect();
  ASSERT_TRUE(Eventually([&] { return GrpcHealthCheck(channel, "") == 1; }));
  for (const size_t bytes : {size_t{10'000'000}, size_t{20'000'000}}) {
    v1::GenerateRequest req;
    req.set_text(std::string(bytes, 'a'));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse resp;
    EXPECT_FALSE(reader->Read(&resp));
    const grpc::Status s = reader->Finish();
    if (bytes == 10'000'000) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
      EXPECT_EQ(s.error_message(),
                "the prompt is 10000000 bytes; at most 8388608 are accepted (--max-prompt-bytes)");
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    }
  }
  EXPECT_TRUE(Generate(4).ok());
  scheduler->Signal(SIGTERM);
  EXPECT_EQ(scheduler->Wait(), 0);
}

TEST_F(LLMSchedulerTest, BadFlagsExitTwo) {
  EXPECT_EQ(StartScheduler({"127.0.0.1:1", "127.0.0.1:2"}, {"--tensor-parallel-size=3"})->Wait(),
            2);
  EXPECT_EQ(StartScheduler({"127.0.0.1:1"}, {"--no-such-flag=1"})->Wait(), 2);
  EXPECT_EQ(StartScheduler({"127.0.0.1:1"}, {"--preemption-mode=sometimes"})->Wait(), 2);
  EXPECT_EQ(StartScheduler({"127.0.0.1:1"}, {"--ssl-certfile=/no/such.pem"})->Wait(), 2);
  EXPECT_EQ(
      StartScheduler({"127.0.0.1:1"}, {"--ssl-certfile=/no/such.pem", "--ssl-keyfile=/no/k.pem"})
          ->Wait(),
      2);
  EXPECT_EQ(StartScheduler({"127.0.0.1:1"}, {"--max-request-bytes=1000"})->Wait(), 2);
  EXPECT_EQ(StartScheduler({"127.0.0.1:1"}, {"--cluster-secret-file=/no/such/file"})->Wait(), 2);
}

}  // namespace
}  // namespace llm
