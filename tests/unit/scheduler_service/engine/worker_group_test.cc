// WorkerGroup: the backoff between failed attempts and the KV sizing decision as functions; the
// lifecycle against fake WorkerService ranks served in-process (tests/testing/fake_worker.h):
// what every rank's Init carries, the cache sized by the smallest rank, a rank that dies taking
// the group down and the group coming back (a fresh rendezvous prefix) once it returns, a failed
// attempt retried after the backoff, and Stop() ending every phase at once. Waits are hang
// guards only.
#include "scheduler_service/engine/worker_group.h"

#include <atomic>
#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_worker.h"

namespace llm {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int kVocab = 1000;

TEST(WorkerGroupRetryDelay, DoublesFromHalfASecondToTenSeconds) {
  EXPECT_EQ(WorkerGroup::RetryDelay(1), absl::Milliseconds(500));
  EXPECT_EQ(WorkerGroup::RetryDelay(2), absl::Seconds(1));
  EXPECT_EQ(WorkerGroup::RetryDelay(3), absl::Seconds(2));
  EXPECT_EQ(WorkerGroup::RetryDelay(4), absl::Seconds(4));
  EXPECT_EQ(WorkerGroup::RetryDelay(5), absl::Seconds(8));
  EXPECT_EQ(WorkerGroup::RetryDelay(6), absl::Seconds(10));
  EXPECT_EQ(WorkerGroup::RetryDelay(7), absl::Seconds(10));
  EXPECT_EQ(WorkerGroup::RetryDelay(INT_MAX), absl::Seconds(10));
}

BlockSpaceManagerConfig BaseCache() {
  return {.block_size = 16,
          .num_gpu_blocks = 1,
          .num_cpu_blocks = 0,
          .watermark = 0.01,
          .enable_prefix_caching = true};
}

v1::ProfileMemoryResponse Profile(uint32_t gpu, uint32_t cpu) {
  v1::ProfileMemoryResponse p;
  p.set_num_gpu_blocks(gpu);
  p.set_num_cpu_blocks(cpu);
  p.set_bytes_per_block(4096);
  return p;
}

TEST(WorkerGroupCacheFromProfile, TakesTheRanksFiguresAndKeepsTheRest) {
  absl::StatusOr<BlockSpaceManagerConfig> c =
      WorkerGroup::CacheFromProfile(BaseCache(), Profile(300, 40), /*num_gpu_blocks_override=*/0);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_gpu_blocks, 300);
  EXPECT_EQ(c->num_cpu_blocks, 40);
  EXPECT_EQ(c->block_size, 16);
  EXPECT_DOUBLE_EQ(c->watermark, 0.01);
  EXPECT_TRUE(c->enable_prefix_caching);
}

TEST(WorkerGroupCacheFromProfile, TheOverrideWinsForDeviceBlocksOnly) {
  absl::StatusOr<BlockSpaceManagerConfig> c =
      WorkerGroup::CacheFromProfile(BaseCache(), Profile(300, 40), 7);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_gpu_blocks, 7);
  EXPECT_EQ(c->num_cpu_blocks, 40);
  // Even when the ranks have no room: the user said how many.
  c = WorkerGroup::CacheFromProfile(BaseCache(), Profile(0, 0), 7);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_gpu_blocks, 7);
}

TEST(WorkerGroupCacheFromProfile, NoRoomForABlockSaysWhichFlagsToRaise) {
  absl::StatusOr<BlockSpaceManagerConfig> c =
      WorkerGroup::CacheFromProfile(BaseCache(), Profile(0, 40), 0);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("no room for a single KV cache block"));
  EXPECT_THAT(c.status().message(), HasSubstr("--gpu-memory-utilization"));
  EXPECT_THAT(c.status().message(), HasSubstr("--cpu-kv-cache-space"));
}

TEST(WorkerGroupCacheFromProfile, AnInvalidResultIsRefused) {
  BlockSpaceManagerConfig base = BaseCache();
  base.watermark = 1;
  EXPECT_EQ(WorkerGroup::CacheFromProfile(base, Profile(300, 0), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// What the group told the server, and the handle it was given to hold.
class Server {
 public:
  std::shared_ptr<ServingEngine> Serve(std::unique_ptr<ShardedWorkerClient> client,
                                       const BlockSpaceManagerConfig& cache) {
    absl::MutexLock lock(&mu_);
    EXPECT_TRUE(client != nullptr);
    world_sizes_.push_back(client->world_size());
    caches_.push_back(cache);
    auto engine = std::make_shared<ServingEngine>();  // no EngineCore: the client alone
    engine->executor = std::move(client);
    engine_ = engine;
    return engine;
  }
  void NotReady(const std::string& reason) {
    absl::MutexLock lock(&mu_);
    reasons_.push_back(reason);
  }

  int num_serves() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(caches_.size());
  }
  BlockSpaceManagerConfig cache(int i) {
    absl::MutexLock lock(&mu_);
    return caches_.at(i);
  }
  int world_size(int i) {
    absl::MutexLock lock(&mu_);
    return world_sizes_.at(i);
  }
  // Whether the group still holds the handle of the last serve.
  bool engine_held() {
    absl::MutexLock lock(&mu_);
    return !engine_.expired();
  }
  std::vector<std::string> reasons() {
    absl::MutexLock lock(&mu_);
    return reasons_;
  }
  bool HasReason(const std::string& part) {
    for (const std::string& r : reasons()) {
      if (r.find(part) != std::string::npos) return true;
    }
    return false;
  }

 private:
  absl::Mutex mu_;
  std::vector<BlockSpaceManagerConfig> caches_ ABSL_GUARDED_BY(mu_);
  std::vector<int> world_sizes_ ABSL_GUARDED_BY(mu_);
  std::weak_ptr<ServingEngine> engine_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> reasons_ ABSL_GUARDED_BY(mu_);
};

template <typename F>
bool Eventually(F done) {  // hang guard: 30 s
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

WorkerGroupOptions Options(const std::vector<std::string>& addresses, Server* server) {
  WorkerGroupOptions o;
  o.addresses = addresses;
  o.worker_timeout = absl::Seconds(5);
  o.model_path = "/models/tiny";
  o.dtype = "float32";
  o.device = "cpu";
  o.rendezvous_address = "127.0.0.1:29500";
  o.collective_timeout_ms = 1234;
  o.max_model_len = 256;
  o.max_num_batched_tokens = 512;
  o.max_num_seqs = 8;
  o.vocab_size = kVocab;
  o.cache = BaseCache();
  o.serve = [server](std::unique_ptr<ShardedWorkerClient> client,
                     const BlockSpaceManagerConfig& cache) {
    return server->Serve(std::move(client), cache);
  };
  o.not_ready = [server](const std::string& reason) { server->NotReady(reason); };
  return o;
}

TEST(WorkerGroup, FormsTheGroupSizedByTheSmallestRankAndServesOnIt) {
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 1, /*num_gpu_blocks=*/64);
  FakeWorkerServer r1 = FakeWorkerServer::Start(kVocab, 2, /*num_gpu_blocks=*/48);
  Server server;
  WorkerGroup group(Options({r0.address, r1.address}, &server));
  group.Start();
  ASSERT_TRUE(Eventually([&] { return server.num_serves() == 1; }));

  EXPECT_EQ(server.world_size(0), 2);
  const BlockSpaceManagerConfig cache = server.cache(0);
  EXPECT_EQ(cache.num_gpu_blocks, 48);  // the smallest over the ranks
  EXPECT_EQ(cache.num_cpu_blocks, 8);   // the fakes' figure
  EXPECT_EQ(cache.block_size, 16);
  EXPECT_TRUE(cache.enable_prefix_caching);
  for (int rank = 0; rank < 2; ++rank) {
    const v1::InitRequest init = (rank == 0 ? r0 : r1).service->init();
    EXPECT_EQ(init.rank(), static_cast<uint32_t>(rank));
    EXPECT_EQ(init.world_size(), 2u);
    EXPECT_EQ(init.model_path(), "/models/tiny");
    EXPECT_EQ(init.dtype(), "float32");
    EXPECT_EQ(init.device(), "cpu");
    EXPECT_EQ(init.rendezvous_address(), "127.0.0.1:29500");
    EXPECT_EQ(init.rendezvous_prefix(), "group-1");
    EXPECT_EQ(init.collective_timeout_ms(), 1234u);
    EXPECT_EQ(init.max_model_len(), 256u);
    EXPECT_EQ(init.max_num_batched_tokens(), 512u);
    EXPECT_EQ(init.max_num_seqs(), 8u);
  }
  ASSERT_FALSE(server.reasons().empty());
  EXPECT_EQ(server.reasons()[0], "connecting to the workers (attempt 1)");

  group.Stop();
  EXPECT_EQ(server.reasons().back(), "server shutting down");
  EXPECT_FALSE(server.engine_held());
  EXPECT_EQ(server.num_serves(), 1);
}

TEST(WorkerGroup, ADeadRankTakesTheGroupDownUntilItComesBack) {
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 1, 64);
  FakeWorkerServer r1 = FakeWorkerServer::Start(kVocab, 2, 64);
  const int port1 = r1.port;
  Server server;
  WorkerGroupOptions options = Options({r0.address, r1.address}, &server);
  absl::Mutex prefixes_mu;
  std::vector<std::string> prefixes;  // on_rendezvous's
  options.on_rendezvous = [&](const std::string& prefix) {
    absl::MutexLock lock(&prefixes_mu);
    prefixes.push_back(prefix);
  };
  WorkerGroup group(std::move(options));
  group.Start();
  ASSERT_TRUE(Eventually([&] { return server.num_serves() == 1; }));
  ASSERT_TRUE(server.engine_held());

  // No request is in flight: the Health probe finds the dead rank.
  r1.Kill();
  const std::string rank1 = absl::StrCat("worker rank 1 at 127.0.0.1:", port1);
  ASSERT_TRUE(Eventually([&] { return server.HasReason(rank1); }));
  ASSERT_TRUE(Eventually([&] { return !server.engine_held(); }));  // the engine is dropped
  // The next attempt waits for the rank, saying why the last one ended.
  ASSERT_TRUE(Eventually([&] {
    return server.HasReason("connecting to the workers (attempt 2); the last attempt failed: " +
                            rank1);
  }));
  EXPECT_EQ(server.num_serves(), 1);

  r1 = FakeWorkerServer::Start(kVocab, 2, 64, port1);
  ASSERT_TRUE(Eventually([&] { return server.num_serves() == 2; }));
  EXPECT_TRUE(server.engine_held());
  EXPECT_EQ(r0.service->init().rendezvous_prefix(), "group-2");
  EXPECT_EQ(r1.service->init().rendezvous_prefix(), "group-2");
  group.Stop();
  // Each attempt's prefix, as its ranks' keys begin, before its Init: the store may forget the
  // earlier attempts' keys then.
  absl::MutexLock lock(&prefixes_mu);
  EXPECT_THAT(prefixes, ::testing::ElementsAre("group-1/", "group-2/"));
}

TEST(WorkerGroup, AFailedAttemptIsRetriedAfterTheBackoff) {
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 1, 64);
  FakeWorkerServer r1 = FakeWorkerServer::Start(kVocab - 1, 2, 64);  // another model
  Server server;
  WorkerGroup group(Options({r0.address, r1.address}, &server));
  const absl::Time start = absl::Now();
  group.Start();
  ASSERT_TRUE(Eventually([&] { return r0.service->num_init_calls() >= 2; }));
  // Attempt 1 failed at once; attempt 2 waited RetryDelay(1) before its Init.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(450));
  EXPECT_EQ(r0.service->init().rendezvous_prefix(), "group-2");
  EXPECT_TRUE(server.HasReason(absl::StrCat("worker rank 1 at ", r1.address,
                                            " loaded a model of vocab size 999; the "
                                            "scheduler's model has 1000")));
  EXPECT_EQ(server.num_serves(), 0);

  // Stop() ends the backoff wait (up to 10 s by now) at once.
  const absl::Time stop = absl::Now();
  group.Stop();
  EXPECT_LT(absl::Now() - stop, absl::Seconds(3));
  EXPECT_EQ(server.num_serves(), 0);
}

TEST(WorkerGroup, NoRoomForABlockFailsTheAttemptUnlessOverridden) {
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 1, /*num_gpu_blocks=*/0);
  {
    Server server;
    WorkerGroup group(Options({r0.address}, &server));
    group.Start();
    ASSERT_TRUE(
        Eventually([&] { return server.HasReason("no room for a single KV cache block"); }));
    group.Stop();
    EXPECT_EQ(server.num_serves(), 0);
  }
  Server server;
  WorkerGroupOptions options = Options({r0.address}, &server);
  options.num_gpu_blocks_override = 5;
  WorkerGroup group(std::move(options));
  group.Start();
  ASSERT_TRUE(Eventually([&] { return server.num_serves() == 1; }));
  EXPECT_EQ(server.cache(0).num_gpu_blocks, 5);
}

TEST(WorkerGroup, StopWhileWaitingForWorkersReturnsAtOnce) {
  // A port nobody listens on.
  FakeWorkerServer gone = FakeWorkerServer::Start(kVocab, 1, 64);
  const std::string address = gone.address;
  gone.Kill();
  Server server;
  WorkerGroup group(Options({address}, &server));
  group.Start();
  ASSERT_TRUE(Eventually([&] { return !server.reasons().empty(); }));
  absl::SleepFor(absl::Milliseconds(300));  // into WaitUntilHealthy's retries
  const absl::Time stop = absl::Now();
  group.Stop();
  EXPECT_LT(absl::Now() - stop, absl::Seconds(3));
  EXPECT_THAT(server.reasons()[0], StartsWith("connecting to the workers (attempt 1)"));
  EXPECT_EQ(server.num_serves(), 0);
}

TEST(WorkerGroup, DestructionStopsAServingGroup) {
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 1, 64);
  Server server;
  {
    WorkerGroup group(Options({r0.address}, &server));
    group.Start();
    ASSERT_TRUE(Eventually([&] { return server.num_serves() == 1; }));
  }
  EXPECT_EQ(server.reasons().back(), "server shutting down");
  EXPECT_FALSE(server.engine_held());
}

}  // namespace
}  // namespace llm

namespace llm {
namespace {

TEST(WorkerGroup, ARefusalFromEveryRankEndsTheAttemptsForGood) {
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 1, 64);
  FakeWorkerServer r1 = FakeWorkerServer::Start(kVocab, 2, 64);
  const grpc::Status refusal(grpc::StatusCode::INVALID_ARGUMENT,
                             "num_attention_heads (3) is not divisible by the tensor-parallel "
                             "size (2)");
  r0.service->set_init_error(refusal);
  r1.service->set_init_error(refusal);
  Server server;
  absl::Notification fatal;
  absl::Status fatal_status;
  WorkerGroupOptions options = Options({r0.address, r1.address}, &server);
  options.on_permanent_failure = [&](const absl::Status& s) {
    fatal_status = s;
    fatal.Notify();
  };
  WorkerGroup group(std::move(options));
  group.Start();
  ASSERT_TRUE(fatal.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(fatal_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      fatal_status.message(),
      ::testing::HasSubstr("every rank refused Init (2 ranks); the first: worker rank 0 at " +
                           r0.address + ": Init: INVALID_ARGUMENT: num_attention_heads (3)"));
  EXPECT_TRUE(server.HasReason("num_attention_heads (3) is not divisible"));
  group.Stop();
  EXPECT_EQ(r0.service->num_init_calls(), 1);  // no second attempt
  EXPECT_EQ(server.num_serves(), 0);
}

TEST(WorkerGroup, ARefusalFromOneRankOnlyIsRetried) {
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 1, 64);
  FakeWorkerServer r1 = FakeWorkerServer::Start(kVocab, 2, 64);
  r1.service->set_init_error(
      grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "model_path is not a directory here"));
  Server server;
  std::atomic<int> fatal{0};
  WorkerGroupOptions options = Options({r0.address, r1.address}, &server);
  options.on_permanent_failure = [&](const absl::Status&) { ++fatal; };
  WorkerGroup group(std::move(options));
  group.Start();
  ASSERT_TRUE(Eventually([&] { return r1.service->num_init_calls() >= 2; }));
  r1.service->set_init_error(grpc::Status::OK);
  ASSERT_TRUE(Eventually([&] { return server.num_serves() == 1; }));
  group.Stop();
  EXPECT_EQ(fatal, 0);
}

TEST(WorkerGroup, NoRoomForABlockIsPermanentWhenAskedToFailFast) {
  FakeWorkerServer r0 = FakeWorkerServer::Start(kVocab, 1, /*num_gpu_blocks=*/0);
  Server server;
  absl::Notification fatal;
  absl::Status fatal_status;
  WorkerGroupOptions options = Options({r0.address}, &server);
  options.on_permanent_failure = [&](const absl::Status& s) {
    fatal_status = s;
    fatal.Notify();
  };
  WorkerGroup group(std::move(options));
  group.Start();
  ASSERT_TRUE(fatal.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(fatal_status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(fatal_status.message(), ::testing::HasSubstr("no room for a single KV cache block"));
  group.Stop();
}

}  // namespace
}  // namespace llm
