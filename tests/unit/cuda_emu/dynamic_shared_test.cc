// The emulation's dynamic shared memory (cuda_emu/block_runner.cc, runtime.cc): what a
// GPU leaves undefined made visible. The buffer is poisoned at every block start (a read before
// any thread wrote sees 0x7f bytes, not zeros or the previous block's words), 16-byte aligned,
// and ends at an inaccessible page; the emulated device reports an H100's limits.
// tests/gpu/shared_memory_test.cc checks the behaviour a device shares (sizes, launch limits).
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/shared_memory.cuh"

namespace llm::cuda_emu {
namespace {

constexpr uint32_t kPoison = 0x7f7f7f7fu;

class DynamicSharedTest : public ::testing::Test {
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

TEST_F(DynamicSharedTest, TheDeviceReportsAnH100sLimits) {
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(prop.sharedMemPerBlock, 49152u);
  EXPECT_EQ(prop.sharedMemPerBlockOptin, 232448u);
  int bytes = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlock, 0), cudaSuccess);
  EXPECT_EQ(bytes, 49152);
  ASSERT_EQ(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
            cudaSuccess);
  EXPECT_EQ(bytes, 232448);
}

// Every thread reads words of the buffer before any thread wrote, then overwrites them all.
__global__ void ReadBeforeWriteKernel(uint32_t* out, int words) {
  uint32_t* s = cuda::DynamicSharedMemory<uint32_t>();
  const size_t base = static_cast<size_t>(blockIdx.x) * words;
  for (int i = threadIdx.x; i < words; i += blockDim.x) out[base + i] = s[i];
  __syncthreads();
  for (int i = threadIdx.x; i < words; i += blockDim.x) s[i] = blockIdx.x;
  if (threadIdx.x == 0) out[base] = reinterpret_cast<uintptr_t>(s) % 16 == 0 ? kPoison : 0;
}

TEST_F(DynamicSharedTest, EveryBlockStartsPoisonedAndAligned) {
  ASSERT_EQ(cudaFuncSetAttribute(ReadBeforeWriteKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 227 * 1024),
            cudaSuccess);
  constexpr int kBlocks = 12;  // more than the OS threads: blocks reuse their buffers
  // A small launch after a large one, and sizes that are not multiples of 16.
  for (const int bytes : {227 * 1024, 1028, 64 * 1024 + 4, 4}) {
    SCOPED_TRACE(::testing::Message() << bytes << " bytes");
    const int words = bytes / 4;
    uint32_t* out = nullptr;
    ASSERT_EQ(cudaMalloc(&out, static_cast<size_t>(kBlocks) * words * 4), cudaSuccess);
    cuda::Launch(ReadBeforeWriteKernel, kBlocks, 128, bytes, nullptr, out, words);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint32_t> host = Download(out, static_cast<size_t>(kBlocks) * words);
    for (size_t i = 0; i < host.size(); ++i) ASSERT_EQ(host[i], kPoison) << "word " << i;
    cudaFree(out);
  }
}

__global__ void TouchKernel(uint32_t* out, int word) {
  out[0] = cuda::DynamicSharedMemory<uint32_t>()[word];
}

TEST_F(DynamicSharedTest, AccessPastTheEndDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  uint32_t* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 4), cudaSuccess);
  cuda::Launch(TouchKernel, 1, 1, 64, nullptr, out, 15);  // the last word: fine
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_DEATH(
      {
        cuda::Launch(TouchKernel, 1, 1, 64, nullptr, out, 16);
        cudaDeviceSynchronize();
      },
      "past the end of its dynamic shared memory");
  EXPECT_DEATH(
      {
        cuda::Launch(TouchKernel, 1, 1, 0, nullptr, out, 0);  // none asked for
        cudaDeviceSynchronize();
      },
      "past the end of its dynamic shared memory");
}

TEST_F(DynamicSharedTest, AttributesArePerKernelPerDeviceAndGoWithAReset) {
  uint32_t* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 4), cudaSuccess);
  ASSERT_EQ(
      cudaFuncSetAttribute(TouchKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024),
      cudaSuccess);
  cuda::Launch(TouchKernel, 1, 1, 100 * 1024, nullptr, out, 0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cuda::Launch(ReadBeforeWriteKernel, 1, 1, 100 * 1024, nullptr, out, 1);  // another kernel
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);  // another device
  uint32_t* out1 = nullptr;
  ASSERT_EQ(cudaMalloc(&out1, 4), cudaSuccess);
  cuda::Launch(TouchKernel, 1, 1, 100 * 1024, nullptr, out1, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  cudaFree(out1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, 4), cudaSuccess);
  cuda::Launch(TouchKernel, 1, 1, 100 * 1024, nullptr, out, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

TEST_F(DynamicSharedTest, BadAttributeCalls) {
  EXPECT_EQ(cudaFuncSetAttribute(static_cast<const void*>(nullptr),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, 1024),
            cudaErrorInvalidDeviceFunction);
  EXPECT_EQ(cudaFuncSetAttribute(TouchKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, -1),
            cudaErrorInvalidValue);
  EXPECT_EQ(
      cudaFuncSetAttribute(TouchKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448 + 1),
      cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFuncSetAttribute(TouchKernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100),
            cudaSuccess);
}

}  // namespace
}  // namespace llm::cuda_emu
