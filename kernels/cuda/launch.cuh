// Kernel launches: Launch(kernel, grid, block, shared_bytes, stream, args...) is
// kernel<<<grid, block, shared_bytes, stream>>>(args...) under nvcc; under the CUDA emulation
// (LLM_CUDA_EMU, cuda_emu) it queues the kernel on the emulated stream, with the
// launch site for fault messages. Either way the launch's own error (a bad configuration) is
// then cudaGetLastError()'s, and the kernel runs when the stream gets to it.
#ifndef LLM_KERNELS_CUDA_LAUNCH_CUH_
#define LLM_KERNELS_CUDA_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace llm::cuda {

#ifdef LLM_CUDA_EMU
template <typename... Params, typename... Args>
void Launch(void (*kernel)(Params...), ::llm::cuda_emu::GridArg grid, dim3 block,
            size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "wrong number of kernel arguments");
  // Arguments are converted to the parameter types and copied at the launch, as CUDA does.
  std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  ::llm::cuda_emu::EnqueueKernel(reinterpret_cast<const void*>(kernel), grid, block, shared_bytes,
                                 stream, [kernel, params] { std::apply(kernel, params); });
}
#else
template <typename... Params, typename... Args>
void Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
            cudaStream_t stream, Args&&... args) {
  // clang-format formats a .cuh as C++ and would split the >>>.
  // clang-format off
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
  // clang-format on
}
#endif

}  // namespace llm::cuda

#endif  // LLM_KERNELS_CUDA_LAUNCH_CUH_
