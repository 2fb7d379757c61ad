// ShmCommunicator with 2, 3 and 4 ranks as threads of this process and 2 ranks as processes:
// exact results of every collective, in chunks (a small slot size), the same bits on every
// rank for inexact sums, a peer that sleeps (the futex path), errors (not hangs) for a rank
// that never comes, and FAILED_PRECONDITION on every rank when they cannot share a segment.
#include "worker_service/parallel/shm_communicator.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/hash_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace llm {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  std::string dir = ::testing::TempDir() + name + "_XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) std::abort();
  return dir;
}

int NumFiles(const std::string& dir) {
  int n = 0;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) n += std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

// 4 KiB slots: most sizes below take several chunks.
ShmOptions Options(const std::string& dir) {
  ShmOptions options;
  options.directory = dir;
  options.timeout = std::chrono::seconds(10);
  options.slot_bytes = 4096;
  return options;
}

// Runs fn(comm) on world_size threads, one rank each, after they meet through one HashStore.
void RunRanks(int world_size, const std::string& dir,
              const std::function<void(Communicator&)>& fn) {
  gloo::rendezvous::HashStore store;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      auto comm = ShmCommunicator::Create(store, rank, world_size, Options(dir));
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

const std::vector<size_t> kSizes = {1, 3, 1024, 1025, 300007};

class ShmCollectives : public ::testing::TestWithParam<int> {
 protected:
  const std::string dir_ = TempDir("shm_collectives");
};

TEST_P(ShmCollectives, AllReduceSumIsExact) {
  const int world = GetParam();
  RunRanks(world, dir_, [world](Communicator& comm) {
    for (size_t count : kSizes) {
      std::vector<float> data(count, -1.0f);
      for (size_t i = 0; i < count; ++i) data[i] = Value(comm.rank(), i);
      ASSERT_TRUE(comm.AllReduceSum(data.data(), count).ok());
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < world; ++r) want += Value(r, i);
        ASSERT_EQ(data[i], want) << "count " << count << " index " << i;
      }
    }
  });
  EXPECT_EQ(NumFiles(dir_), 0) << "the segment's file is unlinked once every rank mapped it";
}

TEST_P(ShmCollectives, AllGatherIsRankMajor) {
  const int world = GetParam();
  RunRanks(world, dir_, [world](Communicator& comm) {
    for (size_t count : kSizes) {
      std::vector<float> in(count);
      for (size_t i = 0; i < count; ++i) in[i] = Value(comm.rank(), i);
      std::vector<float> out(world * count, -1.0f);
      ASSERT_TRUE(comm.AllGather(in.data(), count, out.data()).ok());
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[r * count + i], Value(r, i)) << "rank " << r << " index " << i;
        }
      }
    }
  });
}

TEST_P(ShmCollectives, BroadcastFromEveryRoot) {
  const int world = GetParam();
  RunRanks(world, dir_, [world](Communicator& comm) {
    for (int root = 0; root < world; ++root) {
      for (size_t count : kSizes) {
        std::vector<float> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = Value(comm.rank(), i);
        ASSERT_TRUE(comm.Broadcast(data.data(), count, root).ok());
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], Value(root, i));
      }
    }
  });
}

TEST_P(ShmCollectives, BarrierWaitsForEveryRank) {
  const int world = GetParam();
  std::atomic<int> arrived{0};
  RunRanks(world, dir_, [&](Communicator& comm) {
    // The last rank is late; nobody may leave the barrier before it arrives.
    if (comm.rank() == world - 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    arrived.fetch_add(1);
    ASSERT_TRUE(comm.Barrier().ok());
    EXPECT_EQ(arrived.load(), world);
  });
}

// Inexact sums: every rank must get the same bits (greedy decoding on each rank depends on
// it), the sum in rank order; a rank that is late now and then makes the others sleep.
TEST_P(ShmCollectives, EveryRankGetsTheSameBitsWhileOneIsLate) {
  const int world = GetParam();
  constexpr int kRounds = 200;
  constexpr size_t kCount = 3000;
  auto input = [](int rank, int round) {
    std::mt19937 rng(rank * 1000 + round);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(kCount);
    for (float& x : v) x = u(rng);
    return v;
  };
  std::vector<std::vector<float>> last(world);
  RunRanks(world, dir_, [&](Communicator& comm) {
    for (int round = 0; round < kRounds; ++round) {
      if (comm.rank() == 1 && round % 50 == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin
      }
      std::vector<float> data = input(comm.rank(), round);
      ASSERT_TRUE(comm.AllReduceSum(data.data(), kCount).ok());
      std::vector<float> want = input(0, round);
      for (int r = 1; r < world; ++r) {
        const std::vector<float> v = input(r, round);
        for (size_t i = 0; i < kCount; ++i) want[i] += v[i];
      }
      ASSERT_EQ(std::memcmp(data.data(), want.data(), kCount * sizeof(float)), 0)
          << "round " << round;
      if (round == kRounds - 1) last[comm.rank()] = data;
    }
  });
  for (int r = 1; r < world; ++r) EXPECT_EQ(last[r], last[0]);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmCollectives, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(ShmCommunicator, ARankThatNeverJoinsTheCollectiveIsAnErrorNotAHang) {
  const std::string dir = TempDir("shm_missing_peer");
  gloo::rendezvous::HashStore store;
  ShmOptions options = Options(dir);
  options.timeout = std::chrono::seconds(1);
  std::atomic<bool> rank0_done{false};
  absl::Status status, again;
  std::chrono::steady_clock::duration waited{};
  std::thread rank1([&] {
    auto comm = ShmCommunicator::Create(store, 1, 2, options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    // Joined the group, but never calls AllReduceSum; stays alive until rank 0 gave up.
    while (!rank0_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  {
    auto comm = ShmCommunicator::Create(store, 0, 2, options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<float> data(16, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    status = (*comm)->AllReduceSum(data.data(), data.size());
    waited = std::chrono::steady_clock::now() - start;
    again = (*comm)->Barrier();
    rank0_done.store(true);
  }
  rank1.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("shm all-reduce on rank 0: rank 1 did not reach collective 1"));
  EXPECT_GE(waited, std::chrono::milliseconds(900));
  EXPECT_LT(waited, std::chrono::seconds(5));
  EXPECT_EQ(again, status) << "the group stays broken";
}

// A peer that dies is noticed by the lock it held, not after the (long) timeout.
TEST(ShmCommunicator, APeerProcessThatDiesFailsTheCollectiveWithoutWaitingForTheTimeout) {
  const std::string dir = TempDir("shm_dead_peer");
  const std::string store_dir = TempDir("shm_dead_peer_store");
  ShmOptions options = Options(dir);
  options.timeout = std::chrono::seconds(60);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    gloo::rendezvous::FileStore store(store_dir);
    auto comm = ShmCommunicator::Create(store, 1, 2, options);
    if (!comm.ok()) _exit(2);
    std::vector<float> data(8, 1.0f);
    if (!(*comm)->AllReduceSum(data.data(), data.size()).ok()) _exit(3);
    _exit(0);  // dies before the second collective
  }
  gloo::rendezvous::FileStore store(store_dir);
  auto comm = ShmCommunicator::Create(store, 0, 2, options);
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> data(8, 1.0f);
  ASSERT_TRUE((*comm)->AllReduceSum(data.data(), data.size()).ok());
  const auto start = std::chrono::steady_clock::now();
  const absl::Status s = (*comm)->AllReduceSum(data.data(), data.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("rank 1 did not reach collective 2 and has left the group"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(ShmCommunicator, ARankThatNeverArrivesFailsTheRendezvous) {
  const std::string dir = TempDir("shm_no_peer");
  gloo::rendezvous::HashStore store;
  ShmOptions options = Options(dir);
  options.timeout = std::chrono::seconds(1);
  auto comm = ShmCommunicator::Create(store, 0, 2, options);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnavailable) << comm.status();
  EXPECT_THAT(comm.status().message(), HasSubstr("shm rendezvous on rank 0"));
  EXPECT_EQ(NumFiles(dir), 0) << "rank 0 removes its segment when the group fails";
}

// A file in `dir` named `name`, its times set `age_s` seconds back; with `lock`, an open file
// description of it holding byte 0 (as a live rank 0 does) is returned, else -1.
int MakeSegmentFile(const std::string& dir, const std::string& name, int age_s, bool lock) {
  const std::string path = dir + "/" + name;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0 || ftruncate(fd, 4096) != 0) std::abort();
  const timespec t[2] = {{time(nullptr) - age_s, 0}, {time(nullptr) - age_s, 0}};
  if (futimens(fd, t) != 0) std::abort();
  if (!lock) {
    close(fd);
    return -1;
  }
  flock byte = {};
  byte.l_type = F_WRLCK;
  byte.l_whence = SEEK_SET;
  byte.l_len = 1;
  if (fcntl(fd, F_OFD_SETLK, &byte) != 0) std::abort();
  return fd;
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// A rank 0 killed in its rendezvous leaves its segment (tmpfs memory); the next rank 0 to make
// a segment there removes it, and nothing that a live group holds, that is young enough to be
// in a rendezvous, or that is not a segment.
TEST(ShmCommunicator, RankZeroRemovesTheSegmentsOfGroupsThatAreGone) {
  const std::string dir = TempDir("shm_abandoned");
  MakeSegmentFile(dir, "llm-shm-00000000000000aa", 3600, false);  // abandoned
  const int held = MakeSegmentFile(dir, "llm-shm-00000000000000bb", 3600, true);
  MakeSegmentFile(dir, "llm-shm-00000000000000cc", 0, false);  // in a rendezvous, maybe
  MakeSegmentFile(dir, "not-a-segment", 3600, false);
  RunRanks(2, dir, [](Communicator& comm) { ASSERT_TRUE(comm.Barrier().ok()); });
  EXPECT_FALSE(Exists(dir + "/llm-shm-00000000000000aa"));
  EXPECT_TRUE(Exists(dir + "/llm-shm-00000000000000bb"));
  EXPECT_TRUE(Exists(dir + "/llm-shm-00000000000000cc"));
  EXPECT_TRUE(Exists(dir + "/not-a-segment"));
  EXPECT_EQ(NumFiles(dir), 3);
  // Once no process holds it, and old enough, it goes too.
  close(held);
  EXPECT_EQ(ShmCommunicator::RemoveAbandonedSegments(dir, std::chrono::seconds(60)), 1);
  EXPECT_EQ(ShmCommunicator::RemoveAbandonedSegments(dir, std::chrono::seconds(0)), 1);
  EXPECT_EQ(NumFiles(dir), 1);
}

TEST(ShmCommunicator, RanksThatCannotShareTheSegmentAllGetFailedPrecondition) {
  // Rank 1 looks in another directory, as a rank on another host (or in another container)
  // would: it cannot open rank 0's segment.
  const std::string dir0 = TempDir("shm_host_a"), dir1 = TempDir("shm_host_b");
  gloo::rendezvous::HashStore store;
  absl::Status status[2];
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      status[rank] =
          ShmCommunicator::Create(store, rank, 2, Options(rank == 0 ? dir0 : dir1)).status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(status[rank].code(), absl::StatusCode::kFailedPrecondition) << status[rank];
    EXPECT_THAT(status[rank].message(), HasSubstr("rank 1: cannot open " + dir1 + "/llm-shm-"));
  }
  EXPECT_EQ(NumFiles(dir0), 0);
}

TEST(ShmCommunicator, ARankThatDeclinesMakesEveryRankDecline) {
  for (int declining : {0, 1}) {
    const std::string dir = TempDir("shm_declined");
    gloo::rendezvous::HashStore store;
    absl::Status status[2];
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 2; ++rank) {
      threads.emplace_back([&, rank] {
        ShmOptions options = Options(dir);
        options.enabled = rank != declining;
        status[rank] = ShmCommunicator::Create(store, rank, 2, options).status();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(status[rank].code(), absl::StatusCode::kFailedPrecondition) << status[rank];
      EXPECT_THAT(
          status[rank].message(),
          HasSubstr(absl::StrCat("rank ", declining, ": shared-memory collectives are disabled")));
    }
    EXPECT_EQ(NumFiles(dir), 0);
  }
}

TEST(ShmCommunicator, BadArgumentsAreInvalidArgument) {
  const std::string dir = TempDir("shm_bad_args");
  gloo::rendezvous::HashStore store;
  EXPECT_EQ(ShmCommunicator::Create(store, 2, 2).status().message(),
            "rank 2 is not in a world of size 2");
  ShmOptions odd = Options(dir);
  odd.slot_bytes = 100;
  EXPECT_EQ(ShmCommunicator::Create(store, 0, 1, odd).status().code(),
            absl::StatusCode::kInvalidArgument);
  RunRanks(2, dir, [](Communicator& comm) {
    float x = 1.0f;
    const absl::Status s = comm.Broadcast(&x, 1, 2);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), "broadcast root 2 is not in a world of size 2");
  });
}

// Across processes the futex must not be process-private: the child sleeps now and then, so
// that the parent waits on the futex, and the other way round.
TEST(ShmCommunicator, SeparateProcessesShareTheSegment) {
  const std::string dir = TempDir("shm_processes");
  const std::string store_dir = TempDir("shm_processes_store");
  constexpr int kRounds = 300;
  auto run = [&](int rank) -> int {
    gloo::rendezvous::FileStore store(store_dir);
    auto comm = ShmCommunicator::Create(store, rank, 2, Options(dir));
    if (!comm.ok()) return 2;
    for (int round = 0; round < kRounds; ++round) {
      if (round % 60 == rank * 30) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::vector<float> data(2000, static_cast<float>(rank + round));
      if (!(*comm)->AllReduceSum(data.data(), data.size()).ok()) return 3;
      if (data != std::vector<float>(2000, static_cast<float>(1 + 2 * round))) return 4;
    }
    return 0;
  };
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(run(1));
  EXPECT_EQ(run(0), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child rank exited with status " << status;
  EXPECT_EQ(NumFiles(dir), 0);
}

}  // namespace
}  // namespace llm
