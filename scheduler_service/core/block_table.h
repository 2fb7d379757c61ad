// The block table of one sequence: which physical blocks hold its tokens, in order.
//
//   token index:  0 ......... B-1 | B ........ 2B-1 | 2B .. num_tokens-1 | (empty slots)
//   block_ids:    [  ids[0]       |   ids[1]         |   ids[2] ...                    ]
//   slot of token i = block_ids[i / B] * B + i % B
//
// num_tokens counts the slots in use: every token of the sequence, including the last
// sampled one whose KV is computed in the next step. Blocks past them are lookahead slots.
// The leading num_hashed_blocks blocks are registered with the prefix cache (full and
// computed). The leading num_forked_blocks blocks may be shared with sibling sequences (fork).
// With a sliding window (every layer of the model attends to the last W positions only), the
// leading num_released_blocks entries are kReleasedBlock: blocks no later query can see, given
// back to the pool (BlockSpaceManager::ReleaseOutsideWindow); the entries keep their places, so
// that token i is still in entry i / B.
// The table is plain state: the BlockSpaceManager allocates and frees its blocks.
#ifndef LLM_SCHEDULER_SERVICE_CORE_BLOCK_TABLE_H_
#define LLM_SCHEDULER_SERVICE_CORE_BLOCK_TABLE_H_

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/types.h"

namespace llm {

// A table entry whose block was given back because no query can see it any more.
inline constexpr BlockId kReleasedBlock = -1;

class BlockTable {
 public:
  explicit BlockTable(int block_size) : block_size_(block_size) {}

  // Blocks needed to hold num_tokens tokens plus lookahead slots.
  static int NumRequiredBlocks(int num_tokens, int num_lookahead_slots, int block_size) {
    return (num_tokens + num_lookahead_slots + block_size - 1) / block_size;
  }

  int block_size() const { return block_size_; }
  Device device() const { return device_; }
  // Entries below num_released_blocks() are kReleasedBlock.
  std::span<const BlockId> block_ids() const { return block_ids_; }
  // Entries, released ones included: the blocks needed to hold every token.
  int num_blocks() const { return static_cast<int>(block_ids_.size()); }
  int num_released_blocks() const { return num_released_blocks_; }
  // Blocks the table holds: num_blocks() - num_released_blocks().
  int num_held_blocks() const { return num_blocks() - num_released_blocks_; }
  int num_tokens() const { return num_tokens_; }
  int num_hashed_blocks() const { return num_hashed_blocks_; }
  int num_forked_blocks() const { return num_forked_blocks_; }
  const std::string& cache_salt() const { return cache_salt_; }

  // The KV slot of token `token_index` (< num_blocks * block_size) in its device's cache.
  int64_t Slot(int token_index) const {
    return static_cast<int64_t>(block_ids_[token_index / block_size_]) * block_size_ +
           token_index % block_size_;
  }

  // Blocks an append of n tokens plus lookahead slots writes to: the partially filled last
  // block, if any, and every block it adds. (vLLM's get_num_blocks_touched_by_append_slots.)
  int NumBlocksTouchedByAppend(int num_new_tokens, int num_lookahead_slots) const;
  // Blocks an append of n tokens plus lookahead slots must allocate.
  int NumNewBlocksForAppend(int num_new_tokens, int num_lookahead_slots) const {
    const int need =
        NumRequiredBlocks(num_tokens_ + num_new_tokens, num_lookahead_slots, block_size_);
    return need > num_blocks() ? need - num_blocks() : 0;
  }
  // Indices of the blocks that the next n tokens are written to and that already exist:
  // [first, last], empty when first > last.
  int FirstWrittenBlock() const { return num_tokens_ / block_size_; }
  int LastWrittenBlock(int num_new_tokens) const {
    return std::min(num_blocks(), (num_tokens_ + num_new_tokens - 1) / block_size_ + 1) - 1;
  }

 private:
  friend class BlockSpaceManager;

  int block_size_;
  Device device_ = Device::kGpu;
  std::vector<BlockId> block_ids_;
  int num_tokens_ = 0;
  int num_hashed_blocks_ = 0;
  // Leading blocks that a Fork shared with sibling tables: the only blocks an append may
  // have to copy first (copy-on-write). Every later block was allocated for this table alone,
  // and the other shared blocks (prefix-cache hits) are full, so never written.
  int num_forked_blocks_ = 0;
  int num_released_blocks_ = 0;
  // The prefix-cache key of the last released block when it was hashed: the parent of the
  // next block to hash, whose own entry is gone.
  uint64_t released_tail_hash_ = 0;
  uint64_t released_tail_prefix_id_ = 0;
  std::string cache_salt_;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_BLOCK_TABLE_H_
