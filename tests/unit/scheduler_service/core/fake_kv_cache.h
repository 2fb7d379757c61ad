// A stand-in for the workers' KV memory in block-manager tests: each slot holds the token id
// whose "KV" was written there. Copies are applied as a worker applies the manager's
// (src, dst) pairs, so a test can check that every token's KV is where its table points.
#ifndef LLM_TESTS_UNIT_SCHEDULER_SERVICE_CORE_FAKE_KV_CACHE_H_
#define LLM_TESTS_UNIT_SCHEDULER_SERVICE_CORE_FAKE_KV_CACHE_H_

#include <algorithm>
#include <span>
#include <vector>

#include "common/types.h"
#include "scheduler_service/core/block_table.h"

namespace llm {

class FakeKvCache {
 public:
  static constexpr TokenId kPoison = -1;

  FakeKvCache(int num_gpu_blocks, int num_cpu_blocks, int block_size)
      : block_size_(block_size),
        gpu_(static_cast<size_t>(num_gpu_blocks) * block_size, kPoison),
        cpu_(static_cast<size_t>(num_cpu_blocks) * block_size, kPoison) {}

  // Computes tokens [begin, end) of a sequence: writes them into their slots.
  void Write(const BlockTable& table, std::span<const TokenId> tokens, int begin, int end) {
    std::vector<TokenId>& mem = memory(table.device());
    for (int i = begin; i < end; ++i) mem[table.Slot(i)] = tokens[i];
  }

  void Copy(std::span<const BlockPair> pairs, Device from, Device to) {
    for (const BlockPair& p : pairs) {
      const auto src = memory(from).begin() + static_cast<size_t>(p.src) * block_size_;
      std::copy(src, src + block_size_,
                memory(to).begin() + static_cast<size_t>(p.dst) * block_size_);
    }
  }

  // The first token index in [begin, end) whose slot does not hold that token; -1 when all do.
  int FirstMismatch(const BlockTable& table, std::span<const TokenId> tokens, int end,
                    int begin = 0) {
    const std::vector<TokenId>& mem = memory(table.device());
    for (int i = begin; i < end; ++i) {
      if (mem[table.Slot(i)] != tokens[i]) return i;
    }
    return -1;
  }

  std::span<const TokenId> Block(Device d, BlockId id) {
    return std::span<const TokenId>(memory(d)).subspan(static_cast<size_t>(id) * block_size_,
                                                       block_size_);
  }

 private:
  std::vector<TokenId>& memory(Device d) { return d == Device::kGpu ? gpu_ : cpu_; }

  int block_size_;
  std::vector<TokenId> gpu_;
  std::vector<TokenId> cpu_;
};

}  // namespace llm

#endif  // LLM_TESTS_UNIT_SCHEDULER_SERVICE_CORE_FAKE_KV_CACHE_H_
