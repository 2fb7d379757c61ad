// Device query and a one-kernel self test of the build's architecture list.
#include <cuda_runtime.h>

#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.cuh"

namespace llm::cuda {
namespace {

// out[i] = 3 * i + 1
__global__ void SelfTestKernel(int* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 3 * i + 1;
}

// Restores the calling thread's current device when it goes out of scope.
class CurrentDeviceGuard {
 public:
  CurrentDeviceGuard() {
    if (cudaGetDevice(&saved_) != cudaSuccess) {
      cudaGetLastError();
      saved_ = -1;
    }
  }
  CurrentDeviceGuard(const CurrentDeviceGuard&) = delete;
  CurrentDeviceGuard& operator=(const CurrentDeviceGuard&) = delete;
  ~CurrentDeviceGuard() {
    if (saved_ >= 0 && cudaSetDevice(saved_) != cudaSuccess) cudaGetLastError();
  }

 private:
  int saved_ = -1;
};

}  // namespace

int DeviceCount(std::string* why_none) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why_none != nullptr) *why_none = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  if (count == 0 && why_none != nullptr) *why_none = "no CUDA device";
  return count;
}

std::string GetDeviceInfo(int ordinal, DeviceInfo* info) {
  cudaDeviceProp prop{};
  LLM_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  info->name = prop.name;
  info->major = prop.major;
  info->minor = prop.minor;
  info->total_memory = prop.totalGlobalMem;
  return {};
}

std::string SelfTest(int ordinal) {
  const CurrentDeviceGuard guard;  // the self test runs on `ordinal`; the caller's stays current
  DeviceInfo info;
  if (std::string err = GetDeviceInfo(ordinal, &info); !err.empty()) return err;
  if (info.major < 8) {
    return "device " + std::to_string(ordinal) + " (" + info.name + ") has compute capability " +
           std::to_string(info.major) + "." + std::to_string(info.minor) +
           "; the kernels need 8.0 or newer";
  }
  LLM_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  constexpr int kN = 1000;
  int* d_out = nullptr;
  LLM_CUDA_RETURN_IF_ERROR(cudaMalloc(&d_out, kN * sizeof(int)));
  std::string err = ErrorMessage(cudaMemset(d_out, 0xFF, kN * sizeof(int)), "cudaMemset", __FILE__,
                                 __LINE__);  // poison: -1 everywhere
  // Clear an earlier call's error (already returned to its caller), so that the check after
  // the launch reports the launch's own.
  cudaGetLastError();
  if (err.empty()) {
    Launch(SelfTestKernel, (kN + 255) / 256, 256, 0, nullptr, d_out, kN);
    err = ErrorMessage(cudaGetLastError(), "SelfTestKernel launch", __FILE__, __LINE__);
  }
  std::vector<int> out(kN);
  if (err.empty()) {
    err = ErrorMessage(cudaMemcpy(out.data(), d_out, kN * sizeof(int), cudaMemcpyDeviceToHost),
                       "cudaMemcpy", __FILE__, __LINE__);
  }
  cudaFree(d_out);
  if (!err.empty()) return err;
  for (int i = 0; i < kN; ++i) {
    if (out[i] != 3 * i + 1) {
      return "self-test kernel wrote " + std::to_string(out[i]) + " at " + std::to_string(i) +
             ", expected " + std::to_string(3 * i + 1);
    }
  }
  return {};
}

}  // namespace llm::cuda
