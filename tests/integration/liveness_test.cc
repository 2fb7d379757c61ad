// Liveness of the worker group: the scheduler notices a dead (SIGKILL) or stopped (SIGSTOP)
// worker through its channels' gRPC keepalive and its Health probes, not through the step
// deadline. Every cluster here runs with --worker-timeout=600 (the step deadline, and each
// probe's) and --keepalive-time=1 --keepalive-timeout=2, so a failure noticed within
// kNoticedWithin (far below 600 s) was noticed by keepalive or the probes. The partitioned
// worker (link down) is in netns_test.cc.
//
// kNoticedWithin is generous for a loaded 2-core machine (measured: 0.06-1 s for a killed
// worker, about 3 s for a stopped one: docs/performance/results.md); it is a bound, not a timing
// assertion: without keepalive the stopped worker would be noticed only after 600 s.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/cluster_harness.h"
#include "tools/health_check.h"

namespace llm::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kNoticedWithin = absl::Seconds(30);
constexpr int kMaxTokens = 16;
constexpr int kLongMaxTokens = 400;  // a stream still in flight when its worker is interrupted

const char kPrompt[] = "Once upon a time";

ClusterOptions LivenessCluster(bool restart_workers) {
  return {
      .tensor_parallel_size = 2,
      .restart_workers = restart_workers,
      .restart_delay_s = 5,
      .engine = {{"worker_timeout", "600"}, {"keepalive_time", "1"}, {"keepalive_timeout", "2"}}};
}

// SIGCONTs a stopped process when it goes out of scope, so that a failing test still lets the
// cluster stop.
class ContinueOnExit {
 public:
  explicit ContinueOnExit(pid_t pid) : pid_(pid) {}
  ~ContinueOnExit() { kill(pid_, SIGCONT); }
  ContinueOnExit(const ContinueOnExit&) = delete;
  ContinueOnExit& operator=(const ContinueOnExit&) = delete;

 private:
  pid_t pid_;
};

// A long greedy stream of kPrompt: once its first response is read, `interrupt` runs and
// returns how long the scheduler took to notice (health not SERVING); then `resume` runs and
// the stream is read to its end. Checks how it ended against `reference` (kLongMaxTokens).
absl::Duration InterruptAStream(LocalCluster& c, const std::vector<int32_t>& reference,
                                const std::function<absl::Duration()>& interrupt,
                                const std::function<void()>& resume) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(180));  // hang guard
  auto stream = c.stub().Generate(&ctx, GreedyRequest(kPrompt, kLongMaxTokens));
  v1::GenerateResponse resp;
  std::vector<int32_t> tokens;
  EXPECT_TRUE(stream->Read(&resp));
  for (const v1::SequenceOutput& o : resp.outputs()) {
    tokens.insert(tokens.end(), o.token_ids().begin(), o.token_ids().end());
  }
  const absl::Duration noticed = interrupt();
  resume();
  while (stream->Read(&resp)) {
    for (const v1::SequenceOutput& o : resp.outputs()) {
      tokens.insert(tokens.end(), o.token_ids().begin(), o.token_ids().end());
    }
  }
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(tokens, reference);
  return noticed;
}

std::vector<int32_t> GreedyOutput(LocalCluster& c) {
  GenerateResult r = Generate(c.stub(), GreedyRequest(kPrompt, kMaxTokens));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  return r.token_ids[0];
}

std::vector<int32_t> Prefix(const std::vector<int32_t>& v, size_t n) {
  return {v.begin(), v.begin() + std::min(n, v.size())};
}

// A stopped worker keeps its TCP connections open (the kernel still ACKs), so only a PING
// that goes unanswered, or the step deadline, can tell. Idle: the next Health probe hangs until
// keepalive closes the channel. In flight: the Step stream breaks the same way.
TEST(LivenessTest, AStoppedWorkerIsNoticedByKeepaliveNotTheStepDeadline) {
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(DefaultModel(), {kPrompt}, kLongMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<std::unique_ptr<LocalCluster>> started =
      LocalCluster::Start(LivenessCluster(/*restart_workers=*/false));
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& c = **started;
  const std::vector<pid_t> workers = c.WorkerPids();
  ASSERT_EQ(workers.size(), 2u);
  HealthChecker health(c.address());
  EXPECT_EQ(GreedyOutput(c), Prefix((*reference)[0], kMaxTokens));

  {  // Idle.
    ContinueOnExit cont(workers[1]);
    const absl::Time t0 = absl::Now();
    ASSERT_EQ(kill(workers[1], SIGSTOP), 0);
    const absl::Duration noticed = TimeUntilNotServing(health, t0, kNoticedWithin);
    std::printf("idle worker SIGSTOPped: NOT_SERVING after %s\n",
                absl::FormatDuration(noticed).c_str());
    EXPECT_LT(noticed, kNoticedWithin);
    GenerateResult refused = Generate(c.stub(), GreedyRequest(kPrompt, kMaxTokens));
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  // Continued: the group is rebuilt and serves the same output.
  ASSERT_TRUE(WaitUntilServing(health, absl::Seconds(60)));
  EXPECT_EQ(GreedyOutput(c), Prefix((*reference)[0], kMaxTokens));

  {  // In flight: noticed while the worker is still stopped; then continued.
    ContinueOnExit cont(workers[1]);
    const absl::Duration noticed = InterruptAStream(
        c, (*reference)[0],
        [&] {
          const absl::Time t0 = absl::Now();
          EXPECT_EQ(kill(workers[1], SIGSTOP), 0);
          return TimeUntilNotServing(health, t0, kNoticedWithin);
        },
        [&] { kill(workers[1], SIGCONT); });
    std::printf("worker SIGSTOPped in mid-stream: NOT_SERVING after %s\n",
                absl::FormatDuration(noticed).c_str());
    EXPECT_LT(noticed, kNoticedWithin);
  }
  ASSERT_TRUE(WaitUntilServing(health, absl::Seconds(60)));
  EXPECT_EQ(GreedyOutput(c), Prefix((*reference)[0], kMaxTokens));
  absl::StatusOr<int> stopped = c.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped.status();
}

// A killed worker's sockets are closed by its kernel: the stream in flight breaks at once and
// the next Health probe (each second) is refused. llm-cluster restarts it after 5 s.
TEST(LivenessTest, AKilledWorkerIsNoticedAtOnce) {
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(DefaultModel(), {kPrompt}, kLongMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<std::unique_ptr<LocalCluster>> started =
      LocalCluster::Start(LivenessCluster(/*restart_workers=*/true));
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& c = **started;
  HealthChecker health(c.address());

  {  // Idle.
    const std::vector<pid_t> workers = c.WorkerPids();
    ASSERT_EQ(workers.size(), 2u);
    const absl::Time t0 = absl::Now();
    ASSERT_EQ(kill(workers[1], SIGKILL), 0);
    const absl::Duration noticed = TimeUntilNotServing(health, t0, kNoticedWithin);
    std::printf("idle worker SIGKILLed: NOT_SERVING after %s\n",
                absl::FormatDuration(noticed).c_str());
    EXPECT_LT(noticed, kNoticedWithin);
  }
  ASSERT_TRUE(WaitUntilServing(health, absl::Seconds(60)));
  EXPECT_EQ(GreedyOutput(c), Prefix((*reference)[0], kMaxTokens));

  {  // In flight.
    const std::vector<pid_t> workers = c.WorkerPids();
    ASSERT_EQ(workers.size(), 2u);
    const absl::Duration noticed = InterruptAStream(
        c, (*reference)[0],
        [&] {
          const absl::Time t0 = absl::Now();
          EXPECT_EQ(kill(workers[1], SIGKILL), 0);
          return TimeUntilNotServing(health, t0, kNoticedWithin);
        },
        [] {});
    std::printf("worker SIGKILLed in mid-stream: NOT_SERVING after %s\n",
                absl::FormatDuration(noticed).c_str());
    EXPECT_LT(noticed, kNoticedWithin);
  }
  ASSERT_TRUE(WaitUntilServing(health, absl::Seconds(60)));
  EXPECT_EQ(GreedyOutput(c), Prefix((*reference)[0], kMaxTokens));
  absl::StatusOr<int> stopped = c.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped.status();
}

}  // namespace
}  // namespace llm::testing
