// Copies KV blocks from one cache to another (swap in / swap out), host to host on the CPU.
#include <cstring>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/op_check.h"

namespace llm::ops::cpu {

OpStatus SwapBlocks(const TensorView& src, const TensorView& dst,
                    std::span<const BlockPair> pairs) {
  const int64_t block_numel = src.shape[1] * src.shape[2] * src.shape[3];
  for (size_t i = 0; i < pairs.size(); ++i) {
    const BlockPair& p = pairs[i];
    if (p.src < 0 || p.src >= src.shape[0]) {
      return internal::Error("SwapBlocks",
                             "pairs[" + std::to_string(i) + "].src = " + std::to_string(p.src) +
                                 " is outside [0, " + std::to_string(src.shape[0]) + ")");
    }
    if (p.dst < 0 || p.dst >= dst.shape[0]) {
      return internal::Error("SwapBlocks",
                             "pairs[" + std::to_string(i) + "].dst = " + std::to_string(p.dst) +
                                 " is outside [0, " + std::to_string(dst.shape[0]) + ")");
    }
  }
  for (const BlockPair& p : pairs) {
    // dst[p.dst][:][:][:] = src[p.src][:][:][:]; memmove: src and dst may be one cache.
    std::memmove(dst.data_as<float>() + p.dst * block_numel,
                 src.data_as<const float>() + p.src * block_numel, block_numel * sizeof(float));
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
