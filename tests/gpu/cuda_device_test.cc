// The CUDA build runs on this machine's device: skips, with the reason, where none exists.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cuda/device.h"

namespace llm::cuda {
namespace {

TEST(CudaDevice, KernelsOfThisBuildRunOnEveryDevice) {
  std::string why_none;
  const int count = DeviceCount(&why_none);
  if (count == 0) GTEST_SKIP() << "no usable CUDA device: " << why_none;
  for (int d = 0; d < count; ++d) {
    DeviceInfo info;
    ASSERT_EQ(GetDeviceInfo(d, &info), "");
    EXPECT_GT(info.total_memory, 0u) << info.name;
    EXPECT_EQ(SelfTest(d), "") << "device " << d << " (" << info.name << ", sm_" << info.major
                               << info.minor << ")";
  }
}

// SelfTest(d) runs on device d but leaves the caller's current device as it found it.
// Needs two devices (with one, every device is the current one).
TEST(CudaDevice, SelfTestKeepsTheCallersCurrentDevice) {
  std::string why_none;
  const int count = DeviceCount(&why_none);
  if (count < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << count << " " << why_none;
  for (int current = 0; current < 2; ++current) {
    ASSERT_EQ(cudaSetDevice(current), cudaSuccess);
    for (int d = 0; d < count; ++d) {
      EXPECT_EQ(SelfTest(d), "") << "device " << d;
      int after = -1;
      ASSERT_EQ(cudaGetDevice(&after), cudaSuccess);
      EXPECT_EQ(after, current) << "after SelfTest(" << d << ")";
    }
  }
}

// An earlier call's error left as the thread's last error (a failed cudaMalloc) does not fail
// the self test: its launch check reports the launch's own error only.
TEST(CudaDevice, SelfTestIgnoresAnEarlierCallsError) {
  std::string why_none;
  if (DeviceCount(&why_none) == 0) GTEST_SKIP() << "no usable CUDA device: " << why_none;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  void* p = nullptr;
  ASSERT_NE(cudaMalloc(&p, size_t{1} << 62), cudaSuccess);  // 4 EiB: out of memory
  EXPECT_EQ(SelfTest(0), "");
}

}  // namespace
}  // namespace llm::cuda
