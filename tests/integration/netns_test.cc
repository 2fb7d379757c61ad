// Tensor parallelism across "hosts": each llm-worker in a network namespace of its own, with its
// own address, so that the ranks' collectives go over Gloo/TCP through virtual links, as
// between machines. Needs root (`ip netns add`); skipped with the reason otherwise.
//
// The network (names unique per run: llm<pid>-*):
//
//   root namespace: the test, llm-scheduler (public API on 127.0.0.1, rendezvous store on
//     10.213.N.1), veth lv<pid> 10.213.N.1/24
//       |
//   namespace llm<pid>-hub: bridge br0 with ports s (to the root), p0, p1 (a fresh namespace:
//     no firewall rules of the machine apply to the bridged traffic)
//       |                         |
//   llm<pid>-r0: eth0 .10      llm<pid>-r1: eth0 .11     (llm-worker --host/--peer-host there)
//
// /dev/shm is still shared between network namespaces (the mount namespace is the same), so
// the workers run with --shm-collectives=false: the test asserts Gloo from the scheduler's log
// ("worker group collectives: gloo") and that rank 1 holds a TCP connection to rank 0's
// address (only the collectives connect worker to worker).
//
// Then rank 1's link is cut (`ip link set p1 down` in the hub) during a stream: the scheduler
// notices through keepalive (well before its step deadline), and once the link is up again the
// group is rebuilt and serves the same greedy output. Every namespace is deleted at the end,
// also when the test fails (NetworkGuard, netns_harness.h).
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/netns_harness.h"
#include "tools/child_process.h"
#include "tools/health_check.h"

namespace llm::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 2;
constexpr int kMaxTokens = 16;
constexpr int kLongMaxTokens = 400;
// Keepalive 1 s + 2 s; the step deadline 600 s and the collectives' 120 s, so that a cut link
// noticed within kNoticedWithin was noticed by keepalive (generous for a loaded 2-core host).
constexpr absl::Duration kNoticedWithin = absl::Seconds(30);

const std::vector<std::string>& Prompts() {
  static const auto* p = new std::vector<std::string>{
      "Once upon a time",
      "The best programmers write code that",
      "A fortune: you will travel far, and",
  };
  return *p;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The first line of `path` once `p` has written it ("" when `p` exits first or after `limit`).
std::string WaitForFile(const std::string& path, ChildProcess& p, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (absl::Now() < deadline) {
    const std::string text(absl::StripAsciiWhitespace(ReadFile(path)));
    if (!text.empty()) return text;
    if (p.Poll().has_value()) return "";
    absl::SleepFor(absl::Milliseconds(50));
  }
  return "";
}

// A process started through `sh -c 'exec ...'` (so its pid is the program's) with its output
// in `log`.
absl::StatusOr<std::unique_ptr<ChildProcess>> StartLogged(const std::string& command,
                                                          const std::string& log) {
  return ChildProcess::Start(
      {.argv = {"/bin/sh", "-c", absl::StrCat("exec ", command, " >", log, " 2>&1")}});
}

std::vector<std::vector<int32_t>> GreedyOutputs(v1::LLMService::Stub& stub, int max_tokens) {
  std::vector<std::vector<int32_t>> out;
  for (const std::string& p : Prompts()) {
    GenerateResult r = Generate(stub, GreedyRequest(p, max_tokens));
    EXPECT_TRUE(r.status.ok()) << p << ": " << r.status.error_message();
    out.push_back(r.token_ids[0]);
  }
  return out;
}

TEST(NetnsTest, TensorParallelAcrossNamespacesOverGlooSurvivesACutLink) {
  if (const std::string why = CannotUseNetns(); !why.empty()) GTEST_SKIP() << why;
  absl::StatusOr<std::vector<std::vector<int32_t>>> reference =
      ReferenceGreedy(DefaultModel(), Prompts(), kMaxTokens);
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<std::vector<std::vector<int32_t>>> long_reference =
      ReferenceGreedy(DefaultModel(), {Prompts()[0]}, kLongMaxTokens);
  ASSERT_TRUE(long_reference.ok()) << long_reference.status();

  NetworkGuard net;  // destroyed after the processes below
  const absl::Status built = net.Build(kWorld);
  ASSERT_TRUE(built.ok()) << built;
  const std::string dir = ::testing::TempDir() + "/netns_test." + std::to_string(getpid());
  std::filesystem::create_directories(dir);  // the processes' logs and port files
  const std::string bin = LLM_BIN_DIR;

  std::vector<std::unique_ptr<ChildProcess>> workers;
  std::vector<std::string> addresses;
  for (int r = 0; r < kWorld; ++r) {
    const std::string port_file = absl::StrCat(dir, "/worker-", r, ".port");
    absl::StatusOr<std::unique_ptr<ChildProcess>> w = StartLogged(
        absl::StrCat("ip netns exec ", net.Host(r), " ", bin,
                     "/llm-worker --host=", net.HostAddress(r), " --port=0 --port-file=", port_file,
                     " --peer-host=", net.HostAddress(r), " --shm-collectives=false --threads=1"),
        absl::StrCat(dir, "/worker-", r, ".log"));
    ASSERT_TRUE(w.ok()) << w.status();
    const std::string port = WaitForFile(port_file, **w, absl::Seconds(60));
    ASSERT_FALSE(port.empty()) << "rank " << r << " did not start: "
                               << ReadFile(absl::StrCat(dir, "/worker-", r, ".log"));
    addresses.push_back(absl::StrCat(net.HostAddress(r), ":", port));
    workers.push_back(std::move(*w));
  }
  const std::string scheduler_log = dir + "/scheduler.log";
  const std::string scheduler_port = dir + "/scheduler.port";
  absl::StatusOr<std::unique_ptr<ChildProcess>> scheduler =
      StartLogged(absl::StrCat(bin, "/llm-scheduler --model=", DefaultModel(),
                               " --host=127.0.0.1 --port=0 --port-file=", scheduler_port,
                               " --worker-addresses=", absl::StrJoin(addresses, ","),
                               " --tensor-parallel-size=", kWorld,
                               " --rendezvous-host=", net.SchedulerAddress(),
                               " --block-size=16 --max-model-len=512 --cpu-kv-cache-space=0.05 "
                               "--swap-space=0.05 --worker-timeout=600 --collective-timeout=120 "
                               "--keepalive-time=1 --keepalive-timeout=2 "
                               // float32: compared bit for bit with the TP=1 engine's tokens
                               "--dtype=float32"),
                  scheduler_log);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  const std::string port = WaitForFile(scheduler_port, **scheduler, absl::Seconds(120));
  ASSERT_FALSE(port.empty()) << "the scheduler did not serve: " << ReadFile(scheduler_log);
  const std::string address = "127.0.0.1:" + port;
  auto stub =
      v1::LLMService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  HealthChecker health(address);
  // The port file is written once the scheduler listens; the group serves after its Init.
  ASSERT_TRUE(WaitUntilServing(health, absl::Seconds(120)))
      << "the group did not come up: " << ReadFile(scheduler_log);

  // Gloo over the links: the ranks' own report, and rank 1's TCP connection to rank 0.
  EXPECT_THAT(ReadFile(scheduler_log), HasSubstr("worker group collectives: gloo"));
  auto [ss_rc, ss_out] = Sh(absl::StrCat("ip netns exec ", net.Host(1),
                                         " ss -Htn state established dst ", net.HostAddress(0)));
  EXPECT_EQ(ss_rc, 0);
  EXPECT_FALSE(ss_out.empty()) << "rank 1 has no TCP connection to rank 0";

  // Greedy output as TP=1 (the in-process engine).
  EXPECT_EQ(GreedyOutputs(*stub, kMaxTokens), *reference);

  // Rank 1's link cut during a stream.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));  // guard
    auto stream = stub->Generate(&ctx, GreedyRequest(Prompts()[0], kLongMaxTokens));
    v1::GenerateResponse resp;
    std::vector<int32_t> tokens;
    ASSERT_TRUE(stream->Read(&resp));
    for (const v1::SequenceOutput& o : resp.outputs()) {
      tokens.insert(tokens.end(), o.token_ids().begin(), o.token_ids().end());
    }
    const absl::Time cut = absl::Now();
    ASSERT_TRUE(net.SetHostLink(1, false).ok());
    const absl::Duration noticed = TimeUntilNotServing(health, cut, kNoticedWithin);
    std::printf("rank 1's link cut in mid-stream: NOT_SERVING after %s\n",
                absl::FormatDuration(noticed).c_str());
    EXPECT_LT(noticed, kNoticedWithin);
    absl::SleepFor(absl::Seconds(2));  // still cut a little after it was noticed
    ASSERT_TRUE(net.SetHostLink(1, true).ok());

    while (stream->Read(&resp)) {
      for (const v1::SequenceOutput& o : resp.outputs()) {
        tokens.insert(tokens.end(), o.token_ids().begin(), o.token_ids().end());
      }
    }
    const grpc::Status status = stream->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(tokens, (*long_reference)[0]);
  }

  // Restored: the group is rebuilt and serves the same output.
  const absl::Time restored = absl::Now();
  ASSERT_TRUE(WaitUntilServing(health, absl::Seconds(240)))
      << "not serving after the link came back: " << ReadFile(scheduler_log);
  std::printf("link restored: SERVING again after %s\n",
              absl::FormatDuration(absl::Now() - restored).c_str());
  EXPECT_EQ(GreedyOutputs(*stub, kMaxTokens), *reference);
  EXPECT_THAT(ReadFile(scheduler_log), HasSubstr("worker rank 1 at " + addresses[1]));

  // Stop: the scheduler first, then the workers, each exiting 0 on SIGTERM.
  const int scheduler_status = (*scheduler)->Stop(absl::Seconds(30));
  EXPECT_TRUE(WIFEXITED(scheduler_status) && WEXITSTATUS(scheduler_status) == 0)
      << ChildProcess::DescribeStatus(scheduler_status);
  for (auto& w : workers) {
    const int s = w->Stop(absl::Seconds(30));
    EXPECT_TRUE(WIFEXITED(s) && WEXITSTATUS(s) == 0) << ChildProcess::DescribeStatus(s);
  }
  // The logs are kept only when the test failed.
  if (!HasFailure()) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace llm::testing
