// Swap in / swap out of KV blocks between CUDA caches and host (or other CUDA) caches, all of a
// model's caches in one call: the pairs are coalesced into runs of consecutive (src, dst) block
// ids, and each run is one cudaMemcpyAsync per cache, direction from the pointers
// (cudaMemcpyDefault, unified addressing). A swap of n contiguous blocks over 2L caches is 2L
// copies instead of 2L n. The copies are asynchronous only when the host caches are pinned
// (cudaHostAlloc / cudaHostRegister); from pageable memory CUDA stages them and may block. The
// caller synchronizes `stream` before reading a swapped-out block on the host.
#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.cuh"

namespace llm::ops::cuda {

OpStatus SwapBlocks(void* stream, std::span<const TensorView> src, std::span<const TensorView> dst,
                    std::span<const BlockPair> pairs) {
  constexpr const char* kOp = "SwapBlocks";
  const TensorView& s0 = src[0];
  const TensorView& d0 = dst[0];
  // The cuda side's device (src's when both are cuda; a copy to another device is a peer copy).
  const TensorDevice& device = s0.device.is_cuda() ? s0.device : d0.device;
  if (OpStatus st = cuda_internal::StartOp(kOp, device); !st.ok()) return st;
  const size_t block_bytes = static_cast<size_t>(s0.shape[1] * s0.shape[2] * s0.shape[3]) *
                             cuda_internal::ElementSize(s0.dtype);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const BlockPair& p = pairs[i];
    if (p.src < 0 || p.src >= s0.shape[0]) {
      return cuda_internal::Error(kOp, "pairs[" + std::to_string(i) +
                                           "].src = " + std::to_string(p.src) + " is outside [0, " +
                                           std::to_string(s0.shape[0]) + ")");
    }
    if (p.dst < 0 || p.dst >= d0.shape[0]) {
      return cuda_internal::Error(kOp, "pairs[" + std::to_string(i) +
                                           "].dst = " + std::to_string(p.dst) + " is outside [0, " +
                                           std::to_string(d0.shape[0]) + ")");
    }
  }
  if (pairs.empty() || block_bytes == 0) return OpStatus::Ok();
  // Different devices: no pair reads what another writes, so the order is free; sorted by src,
  // consecutive runs coalesce. On one device (src and dst may be the same caches) keep the order.
  std::vector<BlockPair> sorted(pairs.begin(), pairs.end());
  if (!(s0.device == d0.device)) {
    std::sort(sorted.begin(), sorted.end(),
              [](const BlockPair& a, const BlockPair& b) { return a.src < b.src; });
  }
  struct Run {
    int64_t src, dst, length;
  };
  std::vector<Run> runs;
  for (const BlockPair& p : sorted) {
    if (!runs.empty() && runs.back().src + runs.back().length == p.src &&
        runs.back().dst + runs.back().length == p.dst) {
      ++runs.back().length;
    } else {
      runs.push_back({p.src, p.dst, 1});
    }
  }
  const cudaStream_t s = cuda_internal::AsStream(stream);
  for (size_t i = 0; i < src.size(); ++i) {
    const char* src_base = static_cast<const char*>(src[i].data);
    char* dst_base = static_cast<char*>(dst[i].data);
    for (const Run& r : runs) {
      const char* from = src_base + r.src * block_bytes;
      char* to = dst_base + r.dst * block_bytes;
      if (from == to) continue;  // the same blocks of the same cache: nothing to move
      // dst[r.dst .. r.dst + length)[:][:][:] = src[r.src .. r.src + length)[:][:][:]
      LLM_CUDA_OP_RETURN_IF_ERROR(
          kOp, cudaMemcpyAsync(to, from, r.length * block_bytes, cudaMemcpyDefault, s));
    }
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cuda
