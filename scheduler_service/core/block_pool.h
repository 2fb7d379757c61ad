// All KV-cache blocks of one device (the GPU pool or the CPU swap pool): their reference
// counts, the free queue (LRU), and, when prefix caching is on, the map from block hash to
// the cached block holding those contents.
//
// A freed block keeps its contents and stays findable through the map until it is popped for
// reuse (evicted). Freeing a request's blocks tail first makes tails evict first.
//
// Not thread-safe: owned by the BlockSpaceManager, on the engine thread. Misuse that is a
// caller's bug (allocating more than is free, freeing a free block) CHECK-fails with the
// block id.
#ifndef LLM_SCHEDULER_SERVICE_CORE_BLOCK_POOL_H_
#define LLM_SCHEDULER_SERVICE_CORE_BLOCK_POOL_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "scheduler_service/core/free_block_queue.h"
#include "scheduler_service/core/kv_cache_block.h"

namespace llm {

class BlockPool {
 public:
  BlockPool(Device device, int num_blocks, int block_size, bool enable_caching);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  Device device() const { return device_; }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int block_size() const { return block_size_; }
  int num_free_blocks() const { return free_queue_.size(); }
  // Fraction of blocks held by some sequence, [0, 1].
  double usage() const;
  int num_cached_blocks() const { return static_cast<int>(cached_.size()); }
  int64_t num_evictions() const { return num_evictions_; }

  KVCacheBlock& block(BlockId id) { return blocks_[id]; }
  const KVCacheBlock& block(BlockId id) const { return blocks_[id]; }
  // The tokens a hashed block holds (block_size of them).
  std::span<const TokenId> tokens(BlockId id) const {
    return {tokens_.data() + static_cast<size_t>(id) * block_size_,
            static_cast<size_t>(block_size_)};
  }

  // Takes n blocks off the front of the free queue (least recently freed first), evicting
  // any cached contents, each with ref_cnt 1; appends their ids to `out`. CHECK-fails when
  // fewer than n are free.
  void Allocate(int n, std::vector<BlockId>* out);
  BlockId AllocateOne();

  // The cached block with these contents, or nullptr. `cache_salt` is compared only for the
  // first block of a chain (parent_prefix_id 0).
  KVCacheBlock* FindCached(uint64_t hash, uint64_t parent_prefix_id,
                           std::span<const TokenId> tokens, std::string_view cache_salt);

  // The indexed block holding exactly the contents of `other` (a block of another pool, same
  // prefix_id), or nullptr. Swapping in reuses it instead of copying.
  KVCacheBlock* FindSameContents(const KVCacheBlock& other);

  // A prefix hit: one more holder; a free block leaves the free queue (it is revived).
  void Touch(KVCacheBlock* block);

  // Drops one holder; at zero a block the prefix cache holds goes to the back of the free queue
  // (cached contents kept, evicted least recently freed first), any other to the front of a
  // gpu pool's (reused next: its memory is resident already) or the back of a cpu pool's.
  // CHECK-fails when the block is already free.
  void Free(KVCacheBlock* block);
  void Free(BlockId id) { Free(&blocks_[id]); }

  // Records that a full, held block holds these computed contents, and indexes it by hash
  // unless caching is off or another block already holds that hash.
  void SetHashed(KVCacheBlock* block, const BlockKey& key, std::span<const TokenId> tokens,
                 std::string_view cache_salt);
  // Copies the hashed contents of `src` (of another pool) into `dst`; used by swapping.
  void CopyHashedFrom(const BlockPool& src_pool, BlockId src, BlockId dst);

  // Internal consistency: free queue == blocks with ref_cnt 0; every map entry points to a
  // hashed block whose stored tokens hash to the key. O(num_blocks).
  absl::Status CheckInvariants() const;

 private:
  // Clears the block's cached contents and its map entry, if any.
  void Evict(KVCacheBlock* block);

  const Device device_;
  const int block_size_;
  const bool enable_caching_;
  std::vector<KVCacheBlock> blocks_;
  std::vector<TokenId> tokens_;  // block_size_ tokens per block, for hashed blocks
  // The cache salt of each hashed first block of a chain (parent_prefix_id 0); kept apart
  // from KVCacheBlock so that the free queue's hot path touches less memory.
  std::vector<std::string> salts_;
  FreeBlockQueue free_queue_;
  absl::flat_hash_map<uint64_t, BlockId> cached_;  // hash -> block holding those contents
  int64_t num_evictions_ = 0;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_BLOCK_POOL_H_
