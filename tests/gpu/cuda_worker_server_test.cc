// The GPU worker (WorkerServer with --device=cuda) over gRPC, on an emulated device of 24 MiB
// (LLM_CUDA_EMU_MEMORY_BYTES, set before the first CUDA call): memory profiling sizes the KV
// cache from what the model left, a budget the model does not fit gets the sizing message, and
// a cache that does not fit is RESOURCE_EXHAUSTED; none of them crashes the worker, which then
// serves a step. Built against the emulation only (a real device's memory cannot be shrunk).
#include <cstdlib>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "llm/v1/worker_service.grpc.pb.h"
#include "tests/testing/test_data.h"
#include "worker_service/worker_server.h"

namespace llm {
namespace {

using ::testing::HasSubstr;

constexpr size_t kDeviceBytes = 24u << 20;

class SmallDevice : public ::testing::Environment {
 public:
  void SetUp() override {
    setenv("LLM_CUDA_EMU_MEMORY_BYTES", std::to_string(kDeviceBytes).c_str(), 1);
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new SmallDevice);

grpc::ClientContext* WithDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  return ctx;
}

TEST(CudaWorkerServer, ProfilesTheSmallDeviceAndRefusesWhatDoesNotFit) {
  WorkerServerOptions options;
  options.host = "127.0.0.1";
  options.device = "cuda";
  WorkerServer server(options);
  ASSERT_TRUE(server.Start().ok());
  auto stub = v1::WorkerService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(server.port()), grpc::InsecureChannelCredentials()));

  v1::InitRequest init;
  init.set_model_path(::llm::testing::TestDataDir() + "/models/tiny-llama");
  init.set_dtype("bfloat16");
  init.set_device("cuda");
  init.set_world_size(1);
  init.set_max_model_len(512);
  init.set_max_num_batched_tokens(512);
  init.set_max_num_seqs(64);
  v1::InitResponse init_response;
  grpc::ClientContext c1;
  grpc::Status s = stub->Init(WithDeadline(&c1), init, &init_response);
  ASSERT_TRUE(s.ok()) << s.error_message();

  // 1% of 24 MiB is less than the weights and activations: the sizing message.
  v1::ProfileMemoryRequest profile;
  profile.set_block_size(16);
  profile.set_gpu_memory_utilization(0.01);
  profile.set_swap_space_gib(0.001);
  v1::ProfileMemoryResponse memory;
  grpc::ClientContext c2;
  s = stub->ProfileMemory(WithDeadline(&c2), profile, &memory);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("gpu_memory_utilization"));

  // 90%: the blocks that fit what the profiling pass left.
  profile.set_gpu_memory_utilization(0.9);
  grpc::ClientContext c3;
  s = stub->ProfileMemory(WithDeadline(&c3), profile, &memory);
  ASSERT_TRUE(s.ok()) << s.error_message();
  // tiny-llama: 2 layers, 2 KV heads of 16, bf16: 2 * 2 * 16 * 2 * 16 * 2 bytes a block.
  EXPECT_EQ(memory.bytes_per_block(), 2u * 2 * 16 * 2 * 16 * 2);
  EXPECT_GT(memory.num_gpu_blocks(), 32u);  // at least one 512-token sequence
  EXPECT_LT(memory.num_gpu_blocks() * memory.bytes_per_block(), kDeviceBytes);

  // Far more blocks than the device holds: RESOURCE_EXHAUSTED, and the worker lives on.
  v1::InitCacheRequest cache;
  cache.set_block_size(16);
  cache.set_num_gpu_blocks(static_cast<uint32_t>(kDeviceBytes / memory.bytes_per_block()) * 4);
  cache.set_num_cpu_blocks(1);
  v1::InitCacheResponse cache_response;
  grpc::ClientContext c4;
  s = stub->InitCache(WithDeadline(&c4), cache, &cache_response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();

  cache.set_num_gpu_blocks(memory.num_gpu_blocks());
  grpc::ClientContext c5;
  s = stub->InitCache(WithDeadline(&c5), cache, &cache_response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  v1::HealthResponse health;
  grpc::ClientContext c6;
  ASSERT_TRUE(stub->Health(WithDeadline(&c6), v1::HealthRequest(), &health).ok());
  EXPECT_EQ(health.detail(), "ready");
  // What it serves with, before any step: sampling on the device, and the decode graphs of
  // every padded batch size up to max_num_seqs (1, 2, 4, ..., 64) captured at InitCache.
  EXPECT_EQ(health.stats().sampler(), v1::WorkerStats::SAMPLER_KIND_DEVICE);
  EXPECT_TRUE(health.stats().cuda_graphs_enabled());
  EXPECT_EQ(health.stats().graphs_captured(), 7u);
  EXPECT_EQ(health.stats().steps(), 0u);

  // enforce_eager: a fresh Init captures nothing.
  init.set_enforce_eager(true);
  grpc::ClientContext c7;
  ASSERT_TRUE(stub->Init(WithDeadline(&c7), init, &init_response).ok());
  grpc::ClientContext c8;
  ASSERT_TRUE(stub->ProfileMemory(WithDeadline(&c8), profile, &memory).ok());
  grpc::ClientContext c9;
  ASSERT_TRUE(stub->InitCache(WithDeadline(&c9), cache, &cache_response).ok());
  grpc::ClientContext c10;
  ASSERT_TRUE(stub->Health(WithDeadline(&c10), v1::HealthRequest(), &health).ok());
  EXPECT_EQ(health.stats().sampler(), v1::WorkerStats::SAMPLER_KIND_DEVICE);
  EXPECT_FALSE(health.stats().cuda_graphs_enabled());
  EXPECT_EQ(health.stats().graphs_captured(), 0u);
  server.Stop();
}

}  // namespace
}  // namespace llm
