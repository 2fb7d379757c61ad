// Dynamic shared memory: the shared_bytes of Launch(kernel, grid, block, shared_bytes, ...),
// one buffer per thread block that all its threads share, 16-byte aligned.
//
//   float* tile = llm::cuda::DynamicSharedMemory<float>();  // shared_bytes / 4 floats
//
// Under nvcc it is the kernel's `extern __shared__` array (every call in a kernel returns the
// same address). Under the CUDA emulation (LLM_CUDA_EMU) it is the emulated block's buffer,
// filled with 0x7f bytes at every block start like the static __shared__ variables and
// followed by an inaccessible page; there `extern __shared__` does not compile, so kernels use
// this function rather than declaring the array themselves.
//
// A launch may ask for at most 48 KB unless the kernel's limit was raised first on the device
// it runs on, up to cudaDevAttrMaxSharedMemoryPerBlockOptin (227 KB on an H100, 163 KB on an
// A100):
//   cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
// otherwise the launch fails with cudaErrorInvalidValue. On a GPU the kernel's static
// __shared__ bytes count against the same limit; the emulation checks the dynamic part only.
#ifndef LLM_KERNELS_CUDA_SHARED_MEMORY_CUH_
#define LLM_KERNELS_CUDA_SHARED_MEMORY_CUH_

#include <cuda_runtime.h>

namespace llm::cuda {

template <typename T>
__device__ __forceinline__ T* DynamicSharedMemory() {
  static_assert(alignof(T) <= 16, "dynamic shared memory is 16-byte aligned");
#ifdef LLM_CUDA_EMU
  return reinterpret_cast<T*>(::llm::cuda_emu::t_block.dynamic_shared);
#else
  extern __shared__ __align__(16) unsigned char llm_dynamic_shared_memory[];
  return reinterpret_cast<T*>(llm_dynamic_shared_memory);
#endif
}

}  // namespace llm::cuda

#endif  // LLM_KERNELS_CUDA_SHARED_MEMORY_CUH_
