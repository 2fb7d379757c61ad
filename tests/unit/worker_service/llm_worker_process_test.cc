// The llm-worker binary as a process: flags (unknown ones and cuda exit 2), --port=0 with
// --port-file, both health services and reflection, one step of the model through its gRPC server,
// and a clean exit (status 0) on SIGTERM and on the Shutdown rpc.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "llm/v1/worker_service.grpc.pb.h"
#include "tests/testing/grpc_probe.h"

extern char** environ;

namespace llm {
namespace {

// Hang guards only.
constexpr auto kStartLimit = std::chrono::seconds(60);
constexpr auto kExitLimit = std::chrono::seconds(60);

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(LLM_WORKER_BINARY));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, LLM_WORKER_BINARY, nullptr, nullptr, argv.data(), environ), 0);
  return pid;
}

// The exit status, or -1 when it was killed by a signal or did not exit in time (then killed).
int WaitExit(pid_t pid) {
  const auto limit = std::chrono::steady_clock::now() + kExitLimit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > limit) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class LlmWorkerProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("llm_worker_process_test." + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Starts a worker on a free port; returns its port (0 on failure).
  int Start(pid_t* pid) {
    const std::string port_file = (dir_ / "port").string();
    std::filesystem::remove(port_file);
    *pid = Spawn({"--host=127.0.0.1", "--port=0", "--port-file=" + port_file, "--threads=1"});
    const auto limit = std::chrono::steady_clock::now() + kStartLimit;
    while (!std::filesystem::exists(port_file) && std::chrono::steady_clock::now() < limit) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::ifstream in(port_file);
    int port = 0;
    in >> port;
    return port;
  }

  std::filesystem::path dir_;
};

TEST_F(LlmWorkerProcess, BadFlagsExit2) {
  EXPECT_EQ(WaitExit(Spawn({"--no-such-flag=1"})), 2);
  EXPECT_EQ(WaitExit(Spawn({"--device=tpu"})), 2);
  EXPECT_EQ(WaitExit(Spawn({"--device=cuda:x"})), 2);
  // No GPU here: exit 1 (no usable device) in a CUDA build, 2 (not built) in another. The
  // emulation build of the worker (llm-worker-emu) serves it: tests/integration.
  const int cuda = WaitExit(Spawn({"--device=cuda"}));
  EXPECT_TRUE(cuda == 1 || cuda == 2) << cuda;
  EXPECT_EQ(WaitExit(Spawn({"--help"})), 0);
}

TEST_F(LlmWorkerProcess, ServesAStepAndStopsOnSigterm) {
  pid_t pid = -1;
  const int port = Start(&pid);
  ASSERT_GT(port, 0);
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  EXPECT_EQ(GrpcHealthCheck(channel, ""), 1);
  EXPECT_EQ(GrpcHealthCheck(channel, "llm.v1.WorkerService"), 1);
  const std::string services = GrpcReflectionListServices(channel);
  EXPECT_NE(services.find("llm.v1.WorkerService"), std::string::npos) << services;
  EXPECT_NE(services.find("grpc.health.v1.Health"), std::string::npos) << services;
  auto stub = v1::WorkerService::NewStub(channel);
  auto call = [](auto fn) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return fn(&ctx);
  };
  v1::HealthResponse health;
  ASSERT_TRUE(call([&](auto* c) { return stub->Health(c, {}, &health); }).ok());
  EXPECT_TRUE(health.serving());
  EXPECT_EQ(health.detail(), "not initialized");

  v1::InitRequest init;
  init.set_model_path(std::string(LLM_TEST_DATA_DIR) + "/models/tiny-llama");
  init.set_dtype("float32");
  init.set_world_size(1);
  init.set_device("cpu");
  v1::InitResponse init_response;
  grpc::Status s = call([&](auto* c) { return stub->Init(c, init, &init_response); });
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_GT(init_response.vocab_size(), 0u);
  v1::InitCacheRequest cache;
  cache.set_block_size(16);
  cache.set_num_gpu_blocks(8);
  v1::InitCacheResponse cache_response;
  ASSERT_TRUE(call([&](auto* c) { return stub->InitCache(c, cache, &cache_response); }).ok());

  // One prefill of a 3-token prompt: one sampled token.
  v1::StepRequest step;
  step.set_step_id(1);
  v1::ScheduledRequest* r = step.add_new_requests();
  r->set_slot(0);
  r->set_request_id("r");
  for (int t : {5, 6, 7}) r->add_prompt_token_ids(t);
  r->mutable_sampling_params()->set_temperature(0);
  r->set_num_scheduled_tokens(3);
  r->set_num_samples(1);
  v1::ScheduledSequence* seq = r->add_seqs();
  seq->set_new_to_workers(true);
  seq->set_replace_block_table(true);
  seq->add_block_ids(0);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto stream = stub->Step(&ctx);
    v1::StepResult result;
    ASSERT_TRUE(stream->Write(step));
    ASSERT_TRUE(stream->Read(&result));
    EXPECT_EQ(result.error_code(), 0) << result.error_message();
    EXPECT_EQ(result.sampled_token_ids_size(), 1);
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_EQ(WaitExit(pid), 0);
}

TEST_F(LlmWorkerProcess, ShutdownRpcEndsTheProcess) {
  pid_t pid = -1;
  const int port = Start(&pid);
  ASSERT_GT(port, 0);
  auto stub = v1::WorkerService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::ShutdownResponse response;
  ASSERT_TRUE(stub->Shutdown(&ctx, {}, &response).ok());
  EXPECT_EQ(WaitExit(pid), 0);
}

}  // namespace
}  // namespace llm
