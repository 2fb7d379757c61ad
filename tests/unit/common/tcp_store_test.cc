// TcpStore and TcpStoreServer on loopback: keys set by one client are seen by another, waits
// time out with an exception, a long-lived server keeps neither the connections that ended nor
// the keys of earlier attempts, and four Gloo ranks meet through it and all-reduce.
#include "common/tcp_store.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gloo/common/error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker_service/parallel/gloo_communicator.h"

namespace llm {
namespace {

constexpr auto kTimeout = std::chrono::seconds(5);

std::vector<char> Bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

TEST(TcpStore, ClientsShareKeys) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  auto a = TcpStore::Connect("127.0.0.1", (*server)->port(), kTimeout);
  auto b = TcpStore::Connect("127.0.0.1", (*server)->port(), kTimeout);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  (*a)->set("rank0", Bytes("addr-of-0"));
  (*a)->set("empty", {});
  (*b)->wait({"rank0", "empty"});
  EXPECT_EQ((*b)->get("rank0"), Bytes("addr-of-0"));
  EXPECT_EQ((*b)->get("empty"), std::vector<char>{});
  (*b)->set("rank0", Bytes("overwritten"));
  EXPECT_EQ((*a)->get("rank0"), Bytes("overwritten"));
}

// The open entries of /proc/self/<dir> (fd: file descriptors, task: threads).
int CountEntries(const char* dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e :
       std::filesystem::directory_iterator(std::string("/proc/self/") + dir)) {
    ++n;
  }
  return n;
}

// A long-lived server (the scheduler's, across group rebuilds) holds only the connections that
// are open: each ended one's socket is closed and its thread joined, not kept until the end.
TEST(TcpStore, AServerKeepsNoThreadOrSocketOfConnectionsThatEnded) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  auto connect_once = [&](int i) {
    auto c = TcpStore::Connect("127.0.0.1", (*server)->port(), kTimeout);
    ASSERT_TRUE(c.ok()) << c.status();
    (*c)->set(std::to_string(i), Bytes("x"));
  };
  connect_once(-1);
  const int fds = CountEntries("fd"), threads = CountEntries("task");
  for (int i = 0; i < 50; ++i) connect_once(i);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the last ones end
  connect_once(50);                                             // reaps the ended ones
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LE(CountEntries("fd"), fds + 2);
  EXPECT_LE(CountEntries("task"), threads + 2);
}

// llm-scheduler's store outlives its worker groups, each attempt's ranks meeting under a prefix
// of their own: retaining the current attempt's prefix as each begins keeps the store at one
// attempt's keys, however many attempts there were.
TEST(TcpStore, RetainingOneAttemptsPrefixDropsTheEarlierAttemptsKeys) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  auto c = TcpStore::Connect("127.0.0.1", (*server)->port(), kTimeout);
  ASSERT_TRUE(c.ok()) << c.status();
  for (int attempt = 1; attempt <= 50; ++attempt) {
    const std::string prefix = "group-" + std::to_string(attempt) + "/";
    EXPECT_EQ((*server)->RetainOnly(prefix), attempt == 1 ? 0 : 3);
    for (const char* key : {"shm/shm", "shm/shm/1", "shm/shm/decision"}) {
      (*c)->set(prefix + key, Bytes("x"));
    }
    EXPECT_EQ((*server)->num_keys(), 3u);
  }
  // "group-5/" is not a prefix of "group-50/...": only the 50th attempt's keys are left.
  EXPECT_EQ((*server)->RetainOnly("group-5/"), 3);
  EXPECT_EQ((*server)->num_keys(), 0u);
  EXPECT_THROW((*c)->wait({"group-50/shm/shm"}, std::chrono::milliseconds(50)), gloo::IoException);
}

TEST(TcpStore, GetWaitsForAKeySetLater) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  auto a = TcpStore::Connect("127.0.0.1", (*server)->port(), kTimeout);
  ASSERT_TRUE(a.ok()) << a.status();
  std::thread setter([port = (*server)->port()] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto b = TcpStore::Connect("127.0.0.1", port, kTimeout);
    ASSERT_TRUE(b.ok()) << b.status();
    (*b)->set("late", Bytes("here"));
  });
  EXPECT_EQ((*a)->get("late"), Bytes("here"));
  setter.join();
}

TEST(TcpStore, WaitForAMissingKeyThrowsAfterTheTimeout) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  auto a = TcpStore::Connect("127.0.0.1", (*server)->port(), std::chrono::milliseconds(300));
  ASSERT_TRUE(a.ok()) << a.status();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW((*a)->wait({"never"}, std::chrono::milliseconds(200)), gloo::IoException);
  EXPECT_THROW((*a)->get("never"), gloo::IoException);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST(TcpStore, ConnectingWhereNoServerListensFails) {
  // A port that was free a moment ago: bind one, note it, close it.
  int port = 0;
  {
    auto probe = TcpStoreServer::Start("127.0.0.1", 0);
    ASSERT_TRUE(probe.ok()) << probe.status();
    port = (*probe)->port();
  }
  auto c = TcpStore::Connect("127.0.0.1", port, std::chrono::milliseconds(200));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
}

TEST(TcpStore, ServerDropsAMalformedRequestAndKeepsServing) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  auto bad = TcpStore::Connect("127.0.0.1", (*server)->port(), kTimeout);
  ASSERT_TRUE(bad.ok());
  // A key longer than the server accepts (4096 bytes): it closes the connection at once.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW((*bad)->get(std::string(5000, 'k')), gloo::IoException);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  auto good = TcpStore::Connect("127.0.0.1", (*server)->port(), kTimeout);
  ASSERT_TRUE(good.ok());
  (*good)->set("k", Bytes("v"));
  EXPECT_EQ((*good)->get("k"), Bytes("v"));
}

TEST(TcpStore, WithASecretOnlyClientsPresentingItAreServed) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, "group-secret");
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  auto wrong = TcpStore::Connect("127.0.0.1", port, kTimeout, "not-the-secret");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated) << wrong.status();
  EXPECT_THAT(std::string(wrong.status().message()), ::testing::HasSubstr("cluster secret"));
  // No secret at all: its first request is refused, and nothing it sends is stored.
  auto none = TcpStore::Connect("127.0.0.1", port, kTimeout);
  ASSERT_TRUE(none.ok());
  try {
    (*none)->set("k", Bytes("stranger"));
    ADD_FAILURE() << "a client without the secret could set a key";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("requires the cluster secret"));
  }
  auto good = TcpStore::Connect("127.0.0.1", port, kTimeout, "group-secret");
  ASSERT_TRUE(good.ok()) << good.status();
  // The stranger's key was never stored.
  EXPECT_THROW((*good)->wait({"k"}, std::chrono::milliseconds(1)), gloo::IoException);
  (*good)->set("k", Bytes("v"));
  EXPECT_EQ((*good)->get("k"), Bytes("v"));
}

TEST(TcpStore, WithoutASecretEveryoneIsServedEvenWithAHandshake) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  auto a = TcpStore::Connect("127.0.0.1", (*server)->port(), kTimeout, "any");
  auto b = TcpStore::Connect("127.0.0.1", (*server)->port(), kTimeout);
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->set("k", Bytes("v"));
  EXPECT_EQ((*b)->get("k"), Bytes("v"));
}

TEST(TcpStore, GlooRanksMeetThroughIt) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  constexpr int kWorld = 4;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([port, rank] {
      auto store = TcpStore::Connect("127.0.0.1", port, kTimeout);
      ASSERT_TRUE(store.ok()) << store.status();
      GlooOptions options;
      options.timeout = kTimeout;
      auto comm = GlooCommunicator::Create(**store, rank, kWorld, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      std::vector<float> data = {float(rank), 1.0f, 2.0f};
      ASSERT_TRUE((*comm)->AllReduceSum(data.data(), data.size()).ok());
      EXPECT_EQ(data, (std::vector<float>{6.0f, 4.0f, 8.0f})) << "rank " << rank;
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace
}  // namespace llm
