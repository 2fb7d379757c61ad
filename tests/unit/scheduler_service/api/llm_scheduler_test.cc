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

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "llm/v1/llm_service.grpc.pb.h"
#include "tests/testing/grpc_probe.h"
#include "tests/unit/scheduler_service/testing/fake_worker.h"

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

  std::shared_ptr<grpc::Channel> Connect() {
    int port = 0;
    EXPECT_TRUE(Eventually([&] {
      std::ifstream in(dir_ / "port");
      return static_cast<bool>(in >> port) && port > 0;
    }));
    auto channel =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    stub_ = v1::LLMService::NewStub(channel);
    return channel;
  }

  grpc::Status Generate(int max_tokens, std::vector<int>* tokens = nullptr) {
    v1::GenerateRequest req;
    req.set_text("Hello world");
    req.set_stream(true);
    req.mutable_sampling_params()->set_max_tokens(max_tokens);
    grpc::ClientContext ctx;
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
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 0, kBlocks);
  FakeWorkerServer r1 = FakeWorkerServer::Start(kVocab, 1, kBlocks + 5);
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
  r1 = FakeWorkerServer::Start(kVocab, 1, kBlocks + 5, port1);
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

TEST_F(LLMSchedulerTest, BadFlagsExitTwo) {
  EXPECT_EQ(StartScheduler({"127.0.0.1:1", "127.0.0.1:2"}, {"--tensor-parallel-size=3"})->Wait(),
            2);
  EXPECT_EQ(StartScheduler({"127.0.0.1:1"}, {"--no-such-flag=1"})->Wait(), 2);
  EXPECT_EQ(StartScheduler({"127.0.0.1:1"}, {"--preemption-mode=sometimes"})->Wait(), 2);
}

}  // namespace
}  // namespace llm
