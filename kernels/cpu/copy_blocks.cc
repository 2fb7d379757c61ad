// Copies whole KV blocks within a device's caches (copy-on-write), every layer, on the CPU.
#include <cstring>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/op_check.h"

namespace llm::ops::cpu {

OpStatus CopyBlocks(std::span<const TensorView> key_caches,
                    std::span<const TensorView> value_caches, std::span<const BlockPair> pairs) {
  const TensorView& first = key_caches[0];
  const int64_t num_blocks = first.shape[0];
  // Bytes of one block (f32 or bf16 caches).
  const int64_t block_bytes = first.shape[1] * first.shape[2] * first.shape[3] *
                              static_cast<int64_t>(DTypeSize(first.dtype));
  for (size_t i = 0; i < pairs.size(); ++i) {
    const BlockPair& p = pairs[i];
    if (p.src < 0 || p.src >= num_blocks || p.dst < 0 || p.dst >= num_blocks) {
      return internal::Error("CopyBlocks", "pairs[" + std::to_string(i) + "] = (" +
                                               std::to_string(p.src) + ", " +
                                               std::to_string(p.dst) + ") is outside [0, " +
                                               std::to_string(num_blocks) + ")");
    }
  }
  for (size_t l = 0; l < key_caches.size(); ++l) {
    for (const TensorView* cache : {&key_caches[l], &value_caches[l]}) {
      char* c = cache->data_as<char>();
      for (const BlockPair& p : pairs) {
        if (p.src == p.dst) continue;
        // cache[dst][:][:][:] = cache[src][:][:][:]
        std::memcpy(c + p.dst * block_bytes, c + p.src * block_bytes, block_bytes);
      }
    }
  }
  return OpStatus::Ok();
}

}  // namespace llm::ops::cpu
