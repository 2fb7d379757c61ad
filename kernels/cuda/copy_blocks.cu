// Copy-on-write of whole KV blocks (any cache dtype) inside one device's caches, every layer: one
// cudaMemcpyAsync device to device per (layer, pair, K or V). Pairs are on the host, so their
// block ids are checked here like the CPU op checks them.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"

namespace llm::ops::cuda {

OpStatus CopyBlocks(void* stream, std::span<const TensorView> key_caches,
                    std::span<const TensorView> value_caches, std::span<const BlockPair> pairs) {
  constexpr const char* kOp = "CopyBlocks";
  const TensorView& first = key_caches[0];
  if (OpStatus st = cuda_internal::StartOp(kOp, first.device); !st.ok()) return st;
  const int64_t num_blocks = first.shape[0];
  const size_t block_bytes = static_cast<size_t>(first.shape[1] * first.shape[2] * first.shape[3]) *
                             cuda_internal::ElementSize(first.dtype);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const BlockPair& p = pairs[i];
    if (p.src < 0 || p.src >= num_blocks || p.dst < 0 || p.dst >= num_blocks) {
      return cuda_internal::Error(kOp, "pairs[" + std::to_string(i) + "] = (" +
                                           std::to_string(p.src) + ", " + std::to_string(p.dst) +
                                           ") is outside [0, " + std::to_string(num_blocks) + ")");
    }
  }
  const cudaStream_t s = cuda_internal::AsStream(stream);
  for (size_t l = 0; l < key_caches.size(); ++l) {
    for (const TensorView* cache : {&key_caches[l], &value_caches[l]}) {
      char* base = static_cast<char*>(cache->data);
      for (const BlockPair& p : pairs) {
        if (p.src == p.dst) continue;  // distinct blocks never overlap
        // cache[dst][:][:][:] = cache[src][:][:][:]
        LLM_CUDA_OP_RETURN_IF_ERROR(
            kOp, cudaMemcpyAsync(base + p.dst * block_bytes, base + p.src * block_bytes,
                                 block_bytes, cudaMemcpyDeviceToDevice, s));
      }
    }
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
