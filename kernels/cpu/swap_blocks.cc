// Copies KV blocks between caches (swap in / swap out), every cache, host to host on the CPU.
#include <cstring>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/op_check.h"

namespace llm::ops::cpu {

OpStatus SwapBlocks(std::span<const TensorView> srcs, std::span<const TensorView> dsts,
                    std::span<const BlockPair> pairs) {
  const TensorView& src = srcs[0];
  const TensorView& dst = dsts[0];
  // Bytes of one block (f32 or bf16 caches).
  const int64_t block_bytes =
      src.shape[1] * src.shape[2] * src.shape[3] * static_cast<int64_t>(DTypeSize(src.dtype));
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
  for (size_t i = 0; i < srcs.size(); ++i) {
    for (const BlockPair& p : pairs) {
      // dst[p.dst][:][:][:] = src[p.src][:][:][:]; memmove: src and dst may be one cache.
      std::memmove(dsts[i].data_as<char>() + p.dst * block_bytes,
                   srcs[i].data_as<const char>() + p.src * block_bytes, block_bytes);
    }
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
