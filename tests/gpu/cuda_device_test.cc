// The CUDA build runs on this machine's device: skips, with the reason, where none exists.
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

}  // namespace
}  // namespace llm::cuda
