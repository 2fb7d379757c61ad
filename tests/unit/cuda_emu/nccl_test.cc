// The emulated NCCL (cuda_emu/nccl.cc): ranks as threads of one process on the two
// emulated devices; collectives queued on streams behind gates (runtime.h EnqueueHostWork).
#include <cuda_runtime.h>
#include <nccl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace {

// Makes a two-rank communicator (rank r on cuda:r), non-blocking, each rank on its own thread.
struct TwoRanks {
  ncclComm_t comm[2] = {nullptr, nullptr};
  cudaStream_t stream[2] = {nullptr, nullptr};

  TwoRanks() {
    ncclUniqueId id;
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    auto join = [&](int r) {
      EXPECT_EQ(cudaSetDevice(r), cudaSuccess);
      EXPECT_EQ(cudaStreamCreateWithFlags(&stream[r], cudaStreamNonBlocking), cudaSuccess);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t res = ncclCommInitRankConfig(&comm[r], 2, id, r, &config);
      EXPECT_TRUE(res == ncclSuccess || res == ncclInProgress) << res;
    };
    join(0);
    ncclResult_t state = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(comm[0], &state), ncclSuccess);
    EXPECT_EQ(state, ncclInProgress);  // rank 1 has not joined yet
    std::thread(join, 1).join();
    EXPECT_EQ(ncclCommGetAsyncError(comm[0], &state), ncclSuccess);
    EXPECT_EQ(state, ncclSuccess);
  }
  ~TwoRanks() {
    for (int r = 0; r < 2; ++r) {
      cudaSetDevice(r);
      if (comm[r] != nullptr) ncclCommAbort(comm[r]);
      cudaStreamDestroy(stream[r]);
    }
  }
  // Runs fn(rank) on two threads, rank r with cuda:r current.
  static void OnBoth(const std::function<void(int)>& fn) {
    auto body = [&](int r) {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      fn(r);
    };
    std::thread t(body, 1);
    body(0);
    t.join();
  }
};

float* Upload(const std::vector<float>& v) {
  float* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, v.size() * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d;
}

std::vector<float> Download(const float* d, size_t n) {
  std::vector<float> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

TEST(EmuNccl, AllReduceGivesBothRanksTheSameBitsSummedInRankOrder) {
  TwoRanks ranks;
  constexpr size_t kCount = 1000;
  std::vector<float> in[2];
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1e4f, 1e4f);
  for (auto& v : in) {
    for (size_t i = 0; i < kCount; ++i) v.push_back(dist(rng) * std::pow(10.0f, i % 7 - 3.0f));
  }
  std::vector<float> out[2];
  TwoRanks::OnBoth([&](int r) {
    float* d = Upload(in[r]);
    ASSERT_EQ(ncclAllReduce(d, d, kCount, ncclFloat, ncclSum, ranks.comm[r], ranks.stream[r]),
              ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(ranks.stream[r]), cudaSuccess);  // waits for the peer
    out[r] = Download(d, kCount);
    cudaFree(d);
  });
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(out[0][i]), std::bit_cast<uint32_t>(out[1][i])) << i;
    ASSERT_EQ(out[0][i], in[0][i] + in[1][i]) << i;
  }
}

TEST(EmuNccl, AllGatherIsRankMajorAndBroadcastCopiesTheRoot) {
  TwoRanks ranks;
  constexpr size_t kCount = 5;
  std::vector<float> gathered[2], broadcast[2];
  TwoRanks::OnBoth([&](int r) {
    std::vector<float> mine(kCount);
    for (size_t i = 0; i < kCount; ++i) mine[i] = 10.0f * r + i;
    float* d = Upload(mine);
    float* all = Upload(std::vector<float>(2 * kCount, -1.0f));
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclAllGather(d, all, kCount, ncclFloat, ranks.comm[r], ranks.stream[r]),
              ncclSuccess);
    ASSERT_EQ(ncclBroadcast(d, d, kCount, ncclFloat, 1, ranks.comm[r], ranks.stream[r]),
              ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    // Polls as NcclCommunicator does: the stream is not ready until the peer has arrived.
    cudaError_t e;
    while ((e = cudaStreamQuery(ranks.stream[r])) == cudaErrorNotReady) std::this_thread::yield();
    ASSERT_EQ(e, cudaSuccess);
    gathered[r] = Download(all, 2 * kCount);
    broadcast[r] = Download(d, kCount);
    cudaFree(d);
    cudaFree(all);
  });
  const std::vector<float> want_gather = {0, 1, 2, 3, 4, 10, 11, 12, 13, 14};
  const std::vector<float> want_broadcast = {10, 11, 12, 13, 14};
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(gathered[r], want_gather) << "rank " << r;
    EXPECT_EQ(broadcast[r], want_broadcast) << "rank " << r;
  }
}

TEST(EmuNccl, AWaitingCollectiveDoesNotBlockQueriesAndAbortReleasesIt) {
  TwoRanks ranks;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  float* d = Upload({1.0f, 2.0f});
  ASSERT_EQ(ncclAllReduce(d, d, 2, ncclFloat, ncclSum, ranks.comm[0], ranks.stream[0]),
            ncclSuccess);
  EXPECT_EQ(cudaStreamQuery(ranks.stream[0]), cudaErrorNotReady);  // rank 1 never calls
  cudaEvent_t event;
  ASSERT_EQ(cudaEventCreate(&event), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event, ranks.stream[0]), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(event), cudaErrorNotReady);
  // A thread that synchronizes waits at the gate until the abort releases it.
  std::thread waiter([&] {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(ranks.stream[0]), cudaSuccess);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(ncclCommAbort(ranks.comm[0]), ncclSuccess);
  ranks.comm[0] = nullptr;
  waiter.join();
  EXPECT_EQ(cudaEventQuery(event), cudaSuccess);
  EXPECT_EQ(Download(d, 2), (std::vector<float>{1.0f, 2.0f}));  // not reduced
  // The peer learns of the abort.
  ncclResult_t state = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(ranks.comm[1], &state), ncclSuccess);
  EXPECT_EQ(state, ncclRemoteError);
  EXPECT_NE(std::string(ncclGetLastError(ranks.comm[1])).find("rank 0 aborted"), std::string::npos);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  float* d1 = Upload({3.0f});
  EXPECT_EQ(ncclAllReduce(d1, d1, 1, ncclFloat, ncclSum, ranks.comm[1], ranks.stream[1]),
            ncclRemoteError);
  cudaFree(d1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaEventDestroy(event);
  cudaFree(d);
}

TEST(EmuNccl, CollectivesRunInStreamOrderAfterTheWorkBeforeThem) {
  TwoRanks ranks;
  std::vector<float> out[2];
  TwoRanks::OnBoth([&](int r) {
    float* d = Upload({100.0f, 100.0f});
    // Queued before the collective on the same stream: must be what it reduces.
    ASSERT_EQ(cudaMemsetAsync(d, 0, 2 * sizeof(float), ranks.stream[r]), cudaSuccess);
    ASSERT_EQ(ncclAllReduce(d, d, 2, ncclFloat, ncclSum, ranks.comm[r], ranks.stream[r]),
              ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(ranks.stream[r]), cudaSuccess);
    out[r] = Download(d, 2);
    cudaFree(d);
  });
  EXPECT_EQ(out[0], (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(out[1], (std::vector<float>{0.0f, 0.0f}));
}

TEST(EmuNccl, RanksThatDisagreeGetInvalidUsage) {
  TwoRanks ranks;
  ncclResult_t res[2];
  TwoRanks::OnBoth([&](int r) {
    float* d = Upload({1.0f, 2.0f});
    // Rank 1 waits for rank 0's call so that rank 1's is the one that disagrees.
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    res[r] = ncclAllReduce(d, d, 1 + r, ncclFloat, ncclSum, ranks.comm[r], ranks.stream[r]);
    ASSERT_EQ(cudaStreamSynchronize(ranks.stream[r]), cudaSuccess);  // released, not hung
    cudaFree(d);
  });
  EXPECT_EQ(res[0], ncclSuccess);
  EXPECT_EQ(res[1], ncclInvalidUsage);
  ncclResult_t state = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(ranks.comm[0], &state), ncclSuccess);
  EXPECT_EQ(state, ncclInvalidUsage);
}

TEST(EmuNccl, InitRejectsForeignIdsDuplicateDevicesAndHostPointers) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclUniqueId foreign = id;
  foreign.internal[16] ^= 1;  // another process's id
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 1, foreign, 0), ncclSuccess);  // joins through shared memory
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  ncclUniqueId zeros{};
  EXPECT_EQ(ncclCommInitRank(&comm, 1, zeros, 0), ncclInvalidArgument);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t a = nullptr, b = nullptr;
  EXPECT_EQ(ncclCommInitRankConfig(&a, 2, id, 0, &config), ncclInProgress);
  EXPECT_EQ(ncclCommInitRankConfig(&b, 2, id, 1, &config), ncclInvalidUsage);  // cuda:0 again
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("duplicate GPU"), std::string::npos);
  ncclCommAbort(a);

  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);  // blocking, world size 1
  std::vector<float> host(4, 1.0f);
  EXPECT_EQ(ncclAllReduce(host.data(), host.data(), 4, ncclFloat, ncclSum, comm, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclCommFinalize(comm), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// ---- Ranks in separate processes: this binary runs itself as rank 1 (RunRank1, from main). ----

constexpr char kChildEnv[] = "LLM_EMU_NCCL_CHILD";  // "<mode>:<id as hex>"
constexpr size_t kBig = 300000;                     // floats: more than one 1 MiB round

std::string Hex(const ncclUniqueId& id) {
  std::string s;
  for (char c : id.internal) {
    s += "0123456789abcdef"[static_cast<unsigned char>(c) >> 4];
    s += "0123456789abcdef"[static_cast<unsigned char>(c) & 15];
  }
  return s;
}

pid_t SpawnRank1(const std::string& mode, const ncclUniqueId& id) {
  const std::string env = std::string(kChildEnv) + "=" + mode + ":" + Hex(id);
  char* argv[] = {const_cast<char*>("/proc/self/exe"), nullptr};
  char* envp[] = {const_cast<char*>(env.c_str()), nullptr};
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp), 0);
  return pid;
}

// The child's exit status (-1: not within `seconds`, then it is killed).
int Reap(pid_t pid, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Non-blocking init on cuda:0, polled to completion (or a failure) within a few seconds.
ncclResult_t JoinOnDevice0(ncclComm_t* comm, const ncclUniqueId& id, int rank) {
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t res = ncclCommInitRankConfig(comm, 2, id, rank, &config);
  if (res != ncclSuccess && res != ncclInProgress) return res;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress && std::chrono::steady_clock::now() < end) {
    EXPECT_EQ(ncclCommGetAsyncError(*comm, &state), ncclSuccess);
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return state;
}

// Both ranks run this: all-reduce, all-gather and broadcast (root 1) with rank-specific inputs;
// the expected values are the rank-order sums, so both ranks must see these exact bits.
void RunCollectives(ncclComm_t comm, int rank) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<float> in[2];
  for (int r = 0; r < 2; ++r) {
    in[r].resize(kBig);
    for (size_t i = 0; i < kBig; ++i) in[r][i] = 0.1f * static_cast<float>(i % 97) + 1.7f * r;
  }
  float* send = Upload(in[rank]);
  float* sum = nullptr;
  float* gathered = nullptr;
  float* bcast = nullptr;
  ASSERT_EQ(cudaMalloc(&sum, kBig * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&gathered, 2 * kBig * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&bcast, kBig * sizeof(float)), cudaSuccess);
  ASSERT_EQ(ncclAllReduce(send, sum, kBig, ncclFloat, ncclSum, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclAllGather(send, gathered, kBig, ncclFloat, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclBroadcast(send, bcast, kBig, ncclFloat, 1, comm, stream), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ncclResult_t state = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
  ASSERT_EQ(state, ncclSuccess);
  const std::vector<float> s = Download(sum, kBig);
  const std::vector<float> g = Download(gathered, 2 * kBig);
  const std::vector<float> b = Download(bcast, kBig);
  size_t bad = 0;
  for (size_t i = 0; i < kBig; ++i) {
    bad += std::bit_cast<uint32_t>(s[i]) != std::bit_cast<uint32_t>(in[0][i] + in[1][i]);
    bad += g[i] != in[0][i] || g[kBig + i] != in[1][i] || b[i] != in[1][i];
  }
  EXPECT_EQ(bad, 0u) << "rank " << rank;
  EXPECT_EQ(ncclCommFinalize(comm), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  cudaFree(send);
  cudaFree(sum);
  cudaFree(gathered);
  cudaFree(bcast);
  cudaStreamDestroy(stream);
}

// Rank 1 in the child process that SpawnRank1 started; `env` is kChildEnv's value. Not a test
// of its own: alone it has no peer, so main runs it only in a spawned child.
void RunRank1(const char* env) {
  const std::string arg(env);
  const std::string mode = arg.substr(0, arg.find(':'));
  const std::string hex = arg.substr(arg.find(':') + 1);
  ASSERT_EQ(hex.size(), 2 * sizeof(ncclUniqueId::internal));
  ncclUniqueId id;
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    id.internal[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  ncclComm_t comm = nullptr;
  ASSERT_EQ(JoinOnDevice0(&comm, id, 1), ncclSuccess);
  if (mode == "die") {  // leaves without a collective once the parent has seen the init done
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    _exit(0);
  }
  RunCollectives(comm, 1);
}

TEST(EmuNcclProcesses, TwoProcessesGetIdenticalAllReduceAllGatherAndBroadcast) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  const pid_t child = SpawnRank1("run", id);
  ASSERT_GT(child, 0);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(JoinOnDevice0(&comm, id, 0), ncclSuccess);
  RunCollectives(comm, 0);
  EXPECT_EQ(Reap(child, 20), 0) << "rank 1's process failed";
}

TEST(EmuNcclProcesses, ADeadPeerProcessFailsTheCollectiveInBoundedTime) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  const pid_t child = SpawnRank1("die", id);
  ASSERT_GT(child, 0);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(JoinOnDevice0(&comm, id, 0), ncclSuccess);
  EXPECT_EQ(Reap(child, 20), 0);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  float* buf = Upload(std::vector<float>(16, 1.0f));
  const auto start = std::chrono::steady_clock::now();
  const ncclResult_t res = ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, comm, stream);
  ncclResult_t state = res == ncclSuccess ? ncclInProgress : res;
  while (state == ncclSuccess || state == ncclInProgress) {  // NcclCommunicator's polling
    ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "hangs";
    EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady);
    ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(state, ncclRemoteError);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("exited"), std::string::npos);
  EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // the abort released the stream
  cudaFree(buf);
  cudaStreamDestroy(stream);
}

}  // namespace

// A child spawned by the EmuNcclProcesses tests (kChildEnv set) runs rank 1 and exits 0 only if
// none of its checks failed; otherwise this is the test binary.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (const char* child = std::getenv(kChildEnv); child != nullptr) {
    RunRank1(child);
    return ::testing::UnitTest::GetInstance()->Failed() ? 1 : 0;
  }
  return RUN_ALL_TESTS();
}
