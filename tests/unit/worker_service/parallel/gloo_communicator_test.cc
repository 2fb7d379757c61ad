// GlooCommunicator with 2 and 4 ranks as threads of this process, and 3 ranks as processes,
// over loopback TCP: exact results of every collective for several sizes, and errors (not
// hangs) when a rank is missing.
#include "worker_service/parallel/gloo_communicator.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gloo/rendezvous/hash_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace llm {
namespace {

using ::testing::HasSubstr;

constexpr auto kTimeout = std::chrono::seconds(5);

// Runs fn(comm) on world_size threads, one rank each, after they meet through one HashStore.
void RunRanks(int world_size, const std::function<void(Communicator&)>& fn) {
  gloo::rendezvous::HashStore store;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      GlooOptions options;
      options.timeout = kTimeout;
      auto comm = GlooCommunicator::Create(store, rank, world_size, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      EXPECT_EQ((*comm)->rank(), rank);
      EXPECT_EQ((*comm)->world_size(), world_size);
      fn(**comm);
    });
  }
  for (std::thread& t : threads) t.join();
}

// Small integers, so that float sums are exact.
float Value(int rank, size_t i) { return static_cast<float>((rank + 1) * (i % 97) + rank); }

const std::vector<size_t> kSizes = {1, 3, 1001, 300007};

class GlooCollectives : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectives, AllReduceSumIsExact) {
  const int world = GetParam();
  RunRanks(world, [world](Communicator& comm) {
    for (size_t count : kSizes) {
      std::vector<float> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = Value(comm.rank(), i);
      ASSERT_TRUE(comm.AllReduceSum(data.data(), count).ok());
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < world; ++r) want += Value(r, i);
        ASSERT_EQ(data[i], want) << "element " << i << " of " << count << " on rank "
                                 << comm.rank();
      }
    }
  });
}

TEST_P(GlooCollectives, AllGatherIsRankMajor) {
  const int world = GetParam();
  RunRanks(world, [world](Communicator& comm) {
    for (size_t count : kSizes) {
      std::vector<float> in(count);
      for (size_t i = 0; i < count; ++i) in[i] = Value(comm.rank(), i);
      std::vector<float> out(count * world, std::numeric_limits<float>::quiet_NaN());
      ASSERT_TRUE(comm.AllGather(in.data(), count, out.data()).ok());
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[r * count + i], Value(r, i)) << "rank " << r << "'s element " << i << " of "
                                                     << count << " on rank " << comm.rank();
        }
      }
    }
  });
}

TEST_P(GlooCollectives, BroadcastFromEveryRoot) {
  const int world = GetParam();
  RunRanks(world, [world](Communicator& comm) {
    for (int root = 0; root < world; ++root) {
      for (size_t count : kSizes) {
        std::vector<float> data(count, std::numeric_limits<float>::quiet_NaN());
        if (comm.rank() == root) {
          for (size_t i = 0; i < count; ++i) data[i] = Value(root, i);
        }
        ASSERT_TRUE(comm.Broadcast(data.data(), count, root).ok());
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(data[i], Value(root, i)) << "root " << root << ", element " << i << " of "
                                             << count << " on rank " << comm.rank();
        }
      }
    }
  });
}

TEST_P(GlooCollectives, BarrierWaitsForEveryRank) {
  const int world = GetParam();
  std::atomic<int> arrived{0};
  RunRanks(world, [&](Communicator& comm) {
    // The last rank arrives late: nobody may leave the barrier before it.
    if (comm.rank() == world - 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    arrived.fetch_add(1);
    ASSERT_TRUE(comm.Barrier().ok());
    EXPECT_EQ(arrived.load(), world) << "rank " << comm.rank() << " left the barrier early";
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooCollectives, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(GlooCommunicator, ARankThatNeverJoinsTheCollectiveIsAnErrorNotAHang) {
  gloo::rendezvous::HashStore store;
  GlooOptions options;
  options.timeout = std::chrono::seconds(1);
  std::atomic<bool> rank0_done{false};
  absl::Status status;
  std::chrono::steady_clock::duration waited{};
  std::thread rank1([&] {
    auto comm = GlooCommunicator::Create(store, 1, 2, options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    // Joined the group, but never calls AllReduceSum; stays alive until rank 0 gave up.
    while (!rank0_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  {
    auto comm = GlooCommunicator::Create(store, 0, 2, options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<float> data(16, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    status = (*comm)->AllReduceSum(data.data(), data.size());
    waited = std::chrono::steady_clock::now() - start;
    rank0_done.store(true);
  }
  rank1.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("gloo all-reduce on rank 0"));
  EXPECT_LT(waited, std::chrono::seconds(5));
}

TEST(GlooCommunicator, ARankThatNeverArrivesFailsTheRendezvous) {
  gloo::rendezvous::HashStore store;
  GlooOptions options;
  options.timeout = std::chrono::seconds(1);
  const auto start = std::chrono::steady_clock::now();
  auto comm = GlooCommunicator::Create(store, 0, 2, options);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnavailable) << comm.status();
  EXPECT_THAT(comm.status().message(), HasSubstr("gloo rendezvous on rank 0"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(GlooCommunicator, BadArgumentsAreInvalidArgument) {
  gloo::rendezvous::HashStore store;
  EXPECT_EQ(GlooCommunicator::Create(store, 2, 2).status().message(),
            "rank 2 is not in a world of size 2");
  EXPECT_EQ(GlooCommunicator::Create(store, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  RunRanks(2, [](Communicator& comm) {
    float x = 1.0f;
    const absl::Status s = comm.Broadcast(&x, 1, 2);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), "broadcast root 2 is not in a world of size 2");
  });
}

TEST(GlooCommunicator, RanksMeetThroughAFileStore) {
  std::string dir = ::testing::TempDir() + "gloo_file_store_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      GlooOptions options;
      options.timeout = kTimeout;
      auto comm = GlooCommunicator::CreateWithFileStore(dir, rank, 2, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      std::vector<float> data = {float(rank + 1), 10.0f};
      ASSERT_TRUE((*comm)->AllReduceSum(data.data(), data.size()).ok());
      EXPECT_EQ(data, (std::vector<float>{3.0f, 20.0f}));
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(GlooCommunicator, SeparateProcessesMeetThroughAFileStore) {
  std::string dir = ::testing::TempDir() + "gloo_processes_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  constexpr int kWorld = 3;
  std::vector<pid_t> children;
  // Ranks 1 and 2 are child processes; each exits 0 only if its all-reduce was exact.
  for (int rank = 1; rank < kWorld; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      GlooOptions options;
      options.timeout = kTimeout;
      auto comm = GlooCommunicator::CreateWithFileStore(dir, rank, kWorld, options);
      if (!comm.ok()) _exit(2);
      std::vector<float> data = {float(rank), 1.0f};
      if (!(*comm)->AllReduceSum(data.data(), data.size()).ok()) _exit(3);
      _exit(data == std::vector<float>{3.0f, 3.0f} ? 0 : 4);
    }
    children.push_back(pid);
  }
  GlooOptions options;
  options.timeout = kTimeout;
  auto comm = GlooCommunicator::CreateWithFileStore(dir, 0, kWorld, options);
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> data = {0.0f, 1.0f};
  ASSERT_TRUE((*comm)->AllReduceSum(data.data(), data.size()).ok());
  EXPECT_EQ(data, (std::vector<float>{3.0f, 3.0f}));
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child rank exited with status " << status;
  }
}

}  // namespace
}  // namespace llm
