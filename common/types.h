// Small vocabulary types shared by the scheduler and the workers.
#ifndef LLM_COMMON_TYPES_H_
#define LLM_COMMON_TYPES_H_

#include <cstdint>

namespace llm {

// A token id of the model's vocabulary.
using TokenId = int32_t;
// The index of a KV-cache block in one device's pool (GPU or CPU), 0 .. num_blocks-1.
using BlockId = int32_t;
// One sequence of a request (a request with n > 1 has n sequences). Unique per scheduler.
using SeqId = int64_t;

// Where a sequence's KV blocks live.
enum class Device { kGpu, kCpu };

inline const char* DeviceName(Device d) { return d == Device::kGpu ? "gpu" : "cpu"; }

// A block copy the workers perform: swap in (cpu -> gpu), swap out (gpu -> cpu) or
// copy-on-write (gpu -> gpu).
struct BlockPair {
  BlockId src = 0;
  BlockId dst = 0;
  friend bool operator==(const BlockPair&, const BlockPair&) = default;
};

}  // namespace llm

#endif  // LLM_COMMON_TYPES_H_
