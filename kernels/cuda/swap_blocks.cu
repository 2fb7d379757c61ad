// Swap in / swap out of KV blocks between a CUDA cache and a host (or another CUDA) cache:
// one cudaMemcpyAsync per pair, direction from the pointers (cudaMemcpyDefault, unified
// addressing). The copy is asynchronous only when the host cache is pinned
// (cudaHostAlloc / cudaHostRegister); from pageable memory CUDA stages it and may block.
// The caller synchronizes `stream` before reading a swapped-out block on the host.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"

namespace llm::ops::cuda {

OpStatus SwapBlocks(void* stream, const TensorView& src, const TensorView& dst,
                    std::span<const BlockPair> pairs) {
  constexpr const char* kOp = "SwapBlocks";
  // The cuda side's device (src's when both are cuda; a copy to another device is a peer copy).
  const TensorDevice& device = src.device.is_cuda() ? src.device : dst.device;
  if (OpStatus st = cuda_internal::StartOp(kOp, device); !st.ok()) return st;
  const size_t block_bytes = static_cast<size_t>(src.shape[1] * src.shape[2] * src.shape[3]) *
                             cuda_internal::ElementSize(src.dtype);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const BlockPair& p = pairs[i];
    if (p.src < 0 || p.src >= src.shape[0]) {
      return cuda_internal::Error(kOp, "pairs[" + std::to_string(i) +
                                           "].src = " + std::to_string(p.src) + " is outside [0, " +
                                           std::to_string(src.shape[0]) + ")");
    }
    if (p.dst < 0 || p.dst >= dst.shape[0]) {
      return cuda_internal::Error(kOp, "pairs[" + std::to_string(i) +
                                           "].dst = " + std::to_string(p.dst) + " is outside [0, " +
                                           std::to_string(dst.shape[0]) + ")");
    }
  }
  const cudaStream_t s = cuda_internal::AsStream(stream);
  const char* src_base = static_cast<const char*>(src.data);
  char* dst_base = static_cast<char*>(dst.data);
  for (const BlockPair& p : pairs) {
    const char* from = src_base + p.src * block_bytes;
    char* to = dst_base + p.dst * block_bytes;
    if (from == to) continue;  // one cache, one block: nothing to move
    // dst[p.dst][:][:][:] = src[p.src][:][:][:]
    LLM_CUDA_OP_RETURN_IF_ERROR(kOp, cudaMemcpyAsync(to, from, block_bytes, cudaMemcpyDefault, s));
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
