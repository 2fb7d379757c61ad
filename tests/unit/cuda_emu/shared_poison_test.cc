// __shared__ memory poisoning (cuda_emu/block_runner.cc, shared.ld): every block starts
// with its kernels' shared variables filled with 0x7f bytes, so a read before any thread wrote
// sees the poison, not zeros or an earlier block's values.
#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace llm::cuda_emu::testing {

void LaunchReadBeforeWrite(float* out, int blocks);
void LaunchReadBeforeWriteTemplate(float* out, unsigned short* out_half, int* out_int, int blocks);

namespace {

constexpr uint32_t kPoison = 0x7f7f7f7fu;

class SharedPoisonTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cudaSetDevice(0), cudaSuccess); }
  void TearDown() override { cudaDeviceReset(); }
};

template <typename T>
std::vector<T> Download(const T* device, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

TEST_F(SharedPoisonTest, ReadBeforeWriteSeesThePoisonInEveryBlock) {
  constexpr int kBlocks = 16, kThreads = 64;  // more blocks than OS threads: blocks reuse them
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, kBlocks * kThreads * sizeof(float)), cudaSuccess);
  for (int launch = 0; launch < 2; ++launch) {  // nor does a second launch see the first's
    LaunchReadBeforeWrite(out, kBlocks);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> host = Download(out, kBlocks * kThreads);
    for (int i = 0; i < kBlocks * kThreads; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(host[i]), kPoison) << "thread " << i;
    }
    // As a float the poison is huge but finite, so that fmaxf takes it (NaN it would ignore).
    EXPECT_TRUE(std::isfinite(host[0]));
    EXPECT_GT(host[0], 3e38f);
  }
  cudaFree(out);
}

TEST_F(SharedPoisonTest, TemplateKernelsHalfAndIntSeeThePoison) {
  constexpr int kBlocks = 8, kThreads = 32;
  float* out = nullptr;
  unsigned short* out_half = nullptr;
  int* out_int = nullptr;
  ASSERT_EQ(cudaMalloc(&out, kBlocks * kThreads * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out_half, kBlocks * kThreads * sizeof(unsigned short)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out_int, kBlocks * kThreads * sizeof(int)), cudaSuccess);
  LaunchReadBeforeWriteTemplate(out, out_half, out_int, kBlocks);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> f = Download(out, kBlocks * kThreads);
  const std::vector<unsigned short> h = Download(out_half, kBlocks * kThreads);
  const std::vector<int> n = Download(out_int, kBlocks * kThreads);
  for (int i = 0; i < kBlocks * kThreads; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(f[i]), kPoison) << "thread " << i;
    ASSERT_EQ(h[i], 0x7f7fu) << "thread " << i;  // a half NaN
    ASSERT_EQ(static_cast<uint32_t>(n[i]), kPoison) << "thread " << i;
  }
  cudaFree(out);
  cudaFree(out_half);
  cudaFree(out_int);
}

}  // namespace
}  // namespace llm::cuda_emu::testing
