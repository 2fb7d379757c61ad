// The emulated execution model (cuda_emu/block_runner.cc): barriers, warp collectives,
// faults that name the line, blocks on several OS threads.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/launch.cuh"

namespace llm::cuda_emu {
namespace {

// The device's error string after a synchronization (the fault message, for a fault).
std::string SyncError() {
  const cudaError_t err = cudaDeviceSynchronize();
  return err == cudaSuccess ? std::string() : cudaGetErrorString(err);
}

class EmuTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cudaSetDevice(0), cudaSuccess); }
  void TearDown() override { cudaDeviceReset(); }  // clears a fault's sticky error
};

// Threads below `half` leave before the barrier.
__global__ void PartialBarrierKernel(int* out, int half) {
  if (static_cast<int>(threadIdx.x) < half) return;
  __syncthreads();  // kPartialBarrierLine
  out[threadIdx.x] = 1;
}
constexpr int kPartialBarrierLine = __LINE__ - 3;

TEST_F(EmuTest, BarrierOnlyPartOfTheBlockReachesFailsNamingTheLine) {
  int* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 64 * sizeof(int)), cudaSuccess);
  cuda::Launch(PartialBarrierKernel, 1, 64, 0, nullptr, out, 32);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);  // the launch itself is fine
  const std::string err = SyncError();
  EXPECT_NE(err.find("block_runner_test.cc:" + std::to_string(kPartialBarrierLine)),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("reached by 32 of 64 threads (32 exited"), std::string::npos) << err;
  // Sticky, as a device fault: every later call fails until the reset.
  EXPECT_EQ(cudaMemset(out, 0, 4), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
}

TEST_F(EmuTest, BarrierEveryThreadReachesIsFine) {
  int* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 64 * sizeof(int)), cudaSuccess);
  cuda::Launch(PartialBarrierKernel, 1, 64, 0, nullptr, out, 0);
  EXPECT_EQ(SyncError(), "");
}

// Threads of different warps wait at different barriers.
__global__ void TwoBarriersKernel() {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
}

TEST_F(EmuTest, DifferentBarriersFail) {
  cuda::Launch(TwoBarriersKernel, 1, 64, 0, nullptr);
  EXPECT_NE(SyncError().find("while other threads wait at the one at"), std::string::npos);
}

// out[t] = shuffles of lane values 100 + lane: xor 1, down 3, up 2, broadcast of lane 7,
// ballot of odd lanes and a warp sum.
__global__ void ShuffleKernel(int* out) {
  const int lane = threadIdx.x % 32;
  const int v = 100 + lane;
  int* o = out + threadIdx.x * 6;
  o[0] = __shfl_xor_sync(0xffffffffu, v, 1);
  o[1] = __shfl_down_sync(0xffffffffu, v, 3);
  o[2] = __shfl_up_sync(0xffffffffu, v, 2);
  o[3] = __shfl_sync(0xffffffffu, v, 7);
  o[4] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 2));
  int sum = v;
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  o[5] = sum;
}

TEST_F(EmuTest, ShufflesGiveTheDevicesAnswer) {
  constexpr int kThreads = 64;
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, kThreads * 6 * sizeof(int)), cudaSuccess);
  cuda::Launch(ShuffleKernel, 1, kThreads, 0, nullptr, d);
  std::vector<int> out(kThreads * 6);
  ASSERT_EQ(cudaMemcpy(out.data(), d, out.size() * sizeof(int), cudaMemcpyDeviceToHost),
            cudaSuccess);
  int warp_sum = 0;
  for (int l = 0; l < 32; ++l) warp_sum += 100 + l;
  for (int t = 0; t < kThreads; ++t) {
    const int lane = t % 32;
    SCOPED_TRACE(t);
    EXPECT_EQ(out[t * 6 + 0], 100 + (lane ^ 1));
    EXPECT_EQ(out[t * 6 + 1], 100 + (lane + 3 < 32 ? lane + 3 : lane));  // own value past the end
    EXPECT_EQ(out[t * 6 + 2], 100 + (lane >= 2 ? lane - 2 : lane));
    EXPECT_EQ(out[t * 6 + 3], 107);
    EXPECT_EQ(static_cast<unsigned>(out[t * 6 + 4]), 0xaaaaaaaau);
    EXPECT_EQ(out[t * 6 + 5], warp_sum);
  }
}

// Lane 31 exits; the others shuffle with a full mask.
__global__ void ShuffleWithExitedLaneKernel(float* out) {
  if (threadIdx.x == 31) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);  // kExitedLaneLine
}
constexpr int kExitedLaneLine = __LINE__ - 2;

TEST_F(EmuTest, ShuffleMaskNamingAnExitedLaneFails) {
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 32 * sizeof(float)), cudaSuccess);
  cuda::Launch(ShuffleWithExitedLaneKernel, 1, 32, 0, nullptr, out);
  const std::string err = SyncError();
  EXPECT_NE(err.find("__shfl_xor_sync at block_runner_test.cc:" + std::to_string(kExitedLaneLine)),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("exited"), std::string::npos) << err;
}

// Every thread of every block adds 1 to a global counter and to a shared one.
__global__ void CountKernel(unsigned* global_count, unsigned* block_counts) {
  __shared__ unsigned shared_count;
  if (threadIdx.x == 0) shared_count = 0;
  __syncthreads();
  atomicAdd(&shared_count, 1u);
  atomicAdd(global_count, 1u);
  __syncthreads();
  if (threadIdx.x == 0) block_counts[blockIdx.x] = shared_count;
}

TEST_F(EmuTest, BlocksRunConcurrentlyAndAtomicsCount) {
  constexpr unsigned kBlocks = 200, kThreads = 96;
  unsigned* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, (1 + kBlocks) * sizeof(unsigned)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, sizeof(unsigned)), cudaSuccess);
  cuda::Launch(CountKernel, kBlocks, kThreads, 0, nullptr, d, d + 1);
  std::vector<unsigned> out(1 + kBlocks);
  ASSERT_EQ(cudaMemcpy(out.data(), d, out.size() * sizeof(unsigned), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(out[0], kBlocks * kThreads);
  for (unsigned b = 0; b < kBlocks; ++b) EXPECT_EQ(out[1 + b], kThreads) << b;
}

// 2D blocks and grids: out[y][x] = the linear thread id, from each thread's indices.
__global__ void IndexKernel(int* out) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  out[y * gridDim.x * blockDim.x + x] = y * 1000 + x;
}

TEST_F(EmuTest, ThreadAndBlockIndices) {
  const dim3 grid(3, 2), block(8, 4);
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 24 * 8 * sizeof(int)), cudaSuccess);
  cuda::Launch(IndexKernel, grid, block, 0, nullptr, d);
  std::vector<int> out(24 * 8);
  ASSERT_EQ(cudaMemcpy(out.data(), d, out.size() * sizeof(int), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int y = 0; y < 8; ++y) {
    for (int x = 0; x < 24; ++x) EXPECT_EQ(out[y * 24 + x], y * 1000 + x);
  }
}

TEST_F(EmuTest, BadLaunchConfigurationIsTheLaunchsError) {
  cuda::Launch(IndexKernel, 1, 2048, 0, nullptr, static_cast<int*>(nullptr));
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
}

}  // namespace
}  // namespace llm::cuda_emu
