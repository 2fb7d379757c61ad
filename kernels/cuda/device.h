// What CUDA devices this process can use, and whether our kernels run on them.
// Host-only header (no CUDA headers), so that callers need not be CUDA sources.
#ifndef LLM_KERNELS_CUDA_DEVICE_H_
#define LLM_KERNELS_CUDA_DEVICE_H_

#include <cstddef>
#include <string>

namespace llm::cuda {

struct DeviceInfo {
  std::string name;
  int major = 0;  // compute capability
  int minor = 0;
  size_t total_memory = 0;  // bytes
};

// Number of usable devices. 0 when there is no driver or no device, with the reason in
// *why_none ("CUDA driver version is insufficient ...", "no CUDA-capable device ...").
int DeviceCount(std::string* why_none);

// Properties of device `ordinal`; empty error string on success.
std::string GetDeviceInfo(int ordinal, DeviceInfo* info);

// Empty when device `ordinal` can run the kernels of this build: compute capability 8.0 or
// newer (the build targets sm_80 and sm_90) and a test kernel that runs and writes what it
// should into a poisoned buffer. Otherwise what went wrong, with file and line. The calling
// thread's current device is the same before and after.
std::string SelfTest(int ordinal);

}  // namespace llm::cuda

#endif  // LLM_KERNELS_CUDA_DEVICE_H_
