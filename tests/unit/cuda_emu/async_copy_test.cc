// The emulation's cp.async (kernels/cuda/async_copy.cuh, block_runner.cc's AsyncCopy): a copy
// is written to shared memory only by the wait that covers its group, so that a kernel missing
// a wait, or the barrier after it, reads stale bytes in a test instead of the right ones by
// luck. On a GPU these reads race with the copy; tests/gpu/shared_memory_test.cc checks what
// a device shares (a correct pipeline's result).
#include "kernels/cuda/async_copy.cuh"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/shared_memory.cuh"

namespace llm::cuda_emu {
namespace {

constexpr uint32_t kPoison = 0x7f7f7f7fu;

class AsyncCopyTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cudaSetDevice(0), cudaSuccess); }
  void TearDown() override { cudaDeviceReset(); }

  // src[i] = i + 1, and an output of `out_words` words.
  void Allocate(int src_words, int out_words) {
    std::vector<uint32_t> host(src_words);
    for (int i = 0; i < src_words; ++i) host[i] = i + 1;
    ASSERT_EQ(cudaMalloc(&src_, src_words * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(src_, host.data(), src_words * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&out_, out_words * 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(out_, 0, out_words * 4), cudaSuccess);
    out_words_ = out_words;
  }
  std::vector<uint32_t> Out() {
    std::vector<uint32_t> host(out_words_);
    EXPECT_EQ(cudaMemcpy(host.data(), out_, out_words_ * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  static std::string SyncError() {
    const cudaError_t err = cudaDeviceSynchronize();
    return err == cudaSuccess ? std::string() : cudaGetErrorString(err);
  }

  uint32_t* src_ = nullptr;
  uint32_t* out_ = nullptr;
  int out_words_ = 0;
};

// Each thread copies its 16 bytes, reads them before and after the wait: out[0][t] before,
// out[1][t] after (4 words each).
__global__ void ReadAroundTheWaitKernel(const uint32_t* src, uint32_t* out) {
  uint32_t* s = cuda::DynamicSharedMemory<uint32_t>();
  const int t = threadIdx.x, n = blockDim.x * 4;
  cuda::CpAsync16(s + 4 * t, src + 4 * t);
  cuda::CpAsyncCommitGroup();
  for (int j = 0; j < 4; ++j) out[4 * t + j] = s[4 * t + j];
  cuda::CpAsyncWaitGroup<0>();
  for (int j = 0; j < 4; ++j) out[n + 4 * t + j] = s[4 * t + j];
}

TEST_F(AsyncCopyTest, TheDestinationHoldsTheOldBytesUntilTheWait) {
  constexpr int kThreads = 64, kWords = kThreads * 4;
  Allocate(kWords, 2 * kWords);
  cuda::Launch(ReadAroundTheWaitKernel, 1, kThreads, kWords * 4, nullptr, src_, out_);
  ASSERT_EQ(SyncError(), "");
  const std::vector<uint32_t> out = Out();
  for (int i = 0; i < kWords; ++i) {
    EXPECT_EQ(out[i], kPoison) << "before the wait, word " << i;
    EXPECT_EQ(out[kWords + i], static_cast<uint32_t>(i + 1)) << "after the wait, word " << i;
  }
}

// One thread: copy A (group 1), copy B (group 2), copy C (not committed); out[k] after each of
// WaitGroup<1>, WaitGroup<0>, WaitAll: 3 words each, A's, B's and C's first word.
__global__ void GroupsKernel(const uint32_t* src, uint32_t* out) {
  uint32_t* s = cuda::DynamicSharedMemory<uint32_t>();
  cuda::CpAsync<4>(s + 0, src + 0);
  cuda::CpAsyncCommitGroup();
  cuda::CpAsync<8>(s + 2, src + 2);
  cuda::CpAsyncCommitGroup();
  cuda::CpAsync<16>(s + 4, src + 4);
  auto record = [&](int k) {
    out[3 * k] = s[0];
    out[3 * k + 1] = s[2];
    out[3 * k + 2] = s[4];
  };
  cuda::CpAsyncWaitGroup<2>();  // two groups in flight: nothing to wait for
  record(0);
  cuda::CpAsyncWaitGroup<1>();
  record(1);
  cuda::CpAsyncWaitGroup<0>();
  record(2);
  cuda::CpAsyncWaitAll();
  record(3);
}

TEST_F(AsyncCopyTest, WaitGroupLeavesTheNewestGroupsPending) {
  Allocate(8, 12);
  cuda::Launch(GroupsKernel, 1, 1, 32, nullptr, src_, out_);
  ASSERT_EQ(SyncError(), "");
  const std::vector<uint32_t> out = Out();
  const std::vector<uint32_t> want = {kPoison, kPoison, kPoison,  // WaitGroup<2>
                                      1,       kPoison, kPoison,  // <1>: the oldest group
                                      1,       3,       kPoison,  // <0>: not the uncommitted C
                                      1,       3,       5};       // WaitAll
  EXPECT_EQ(out, want);
}

// A 2-stage pipeline as tests/gpu/shared_memory_test.cc's, with the wait or the barrier after
// it left out: thread t stores the floats thread blockDim.x - 1 - t copied.
__global__ void PipelineKernel(const uint32_t* src, uint32_t* out, int num_tiles, bool wait,
                               bool barrier) {
  uint32_t* stages = cuda::DynamicSharedMemory<uint32_t>();
  const int t = threadIdx.x, tile_words = blockDim.x * 4;
  cuda::CpAsync16(stages + 4 * t, src + 4 * t);
  cuda::CpAsyncCommitGroup();
  for (int k = 0; k < num_tiles; ++k) {
    if (k + 1 < num_tiles) {
      cuda::CpAsync16(stages + ((k + 1) & 1) * tile_words + 4 * t,
                      src + (k + 1) * tile_words + 4 * t);
    }
    cuda::CpAsyncCommitGroup();
    if (wait) cuda::CpAsyncWaitGroup<1>();
    if (barrier) __syncthreads();
    const uint32_t* stage = stages + (k & 1) * tile_words;
    const int mirror = blockDim.x - 1 - t;
    for (int j = 0; j < 4; ++j) out[k * tile_words + 4 * mirror + j] = stage[4 * mirror + j];
    __syncthreads();
  }
}

TEST_F(AsyncCopyTest, AMissingWaitOrBarrierReadsStaleBytes) {
  constexpr int kThreads = 64, kTiles = 4, kWords = kThreads * 4 * kTiles;
  for (const bool wait : {true, false}) {
    for (const bool barrier : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "wait " << wait << ", barrier " << barrier);
      Allocate(kWords, kWords);
      cuda::Launch(PipelineKernel, 1, kThreads, 2 * kThreads * 16, nullptr, src_, out_, kTiles,
                   wait, barrier);
      ASSERT_EQ(SyncError(), "");
      const std::vector<uint32_t> out = Out();
      int wrong = 0;
      for (int i = 0; i < kWords; ++i) wrong += out[i] != static_cast<uint32_t>(i + 1);
      if (wait && barrier) {
        EXPECT_EQ(wrong, 0);
      } else {
        EXPECT_GT(wrong, 0);  // the bug shows, whatever the schedule seed
      }
      cudaFree(src_);
      cudaFree(out_);
    }
  }
}

__global__ void MisalignedKernel(const uint32_t* src) {
  uint32_t* s = cuda::DynamicSharedMemory<uint32_t>();
  cuda::CpAsync16(s + 1, src);  // kMisalignedLine
  cuda::CpAsyncWaitAll();
}
constexpr int kMisalignedLine = __LINE__ - 3;

TEST_F(AsyncCopyTest, AMisalignedCopyFaultsNamingTheLine) {
  Allocate(8, 1);
  cuda::Launch(MisalignedKernel, 1, 1, 64, nullptr, src_);
  const std::string err = SyncError();
  EXPECT_NE(err.find("cp.async of 16 bytes at async_copy_test.cc:" +
                     std::to_string(kMisalignedLine) + ": misaligned"),
            std::string::npos)
      << err;
}

}  // namespace
}  // namespace llm::cuda_emu
