// One block of the paged KV cache as the scheduler sees it: an id into a device's pool, a
// reference count, and the prefix-cache identity of its contents once they are full and
// computed. The KV tensors themselves live in the workers; this is bookkeeping only.
#ifndef LLM_SCHEDULER_SERVICE_CORE_KV_CACHE_BLOCK_H_
#define LLM_SCHEDULER_SERVICE_CORE_KV_CACHE_BLOCK_H_

#include <cstdint>

#include "common/types.h"

namespace llm {

// The prefix-cache identity of a full block (see block_hash.h for the chain).
//
//   hash             = HashBlockTokens(parent_hash, tokens of this block)
//   prefix_id        = a number given once, when these exact contents (cache salt, every
//                      token of every earlier block, this block's tokens) were first
//                      computed; never reused, copied along when the block is swapped
//   parent_prefix_id = the prefix_id of the previous block in the chain, 0 for the first
//
// A lookup accepts a block only when its tokens equal the request's and its
// parent_prefix_id is the prefix_id of the block accepted just before: by induction the
// whole prefix is equal token for token, so a hash collision can never serve another
// prompt's KV.
struct BlockKey {
  uint64_t hash = 0;
  uint64_t parent_hash = 0;
  uint64_t prefix_id = 0;  // 0: the block is not hashed (partial, or not yet computed)
  uint64_t parent_prefix_id = 0;
};

struct KVCacheBlock {
  explicit KVCacheBlock(BlockId id) : block_id(id) {}
  KVCacheBlock(const KVCacheBlock&) = delete;
  KVCacheBlock& operator=(const KVCacheBlock&) = delete;
  KVCacheBlock(KVCacheBlock&&) = default;

  bool is_hashed() const { return key.prefix_id != 0; }
  bool is_free() const { return ref_cnt == 0; }

  BlockId block_id;
  // Number of block tables that hold this block. 0: it is in the free queue.
  int32_t ref_cnt = 0;
  BlockKey key;
  // Links of the intrusive free queue; both null when the block is not in it.
  KVCacheBlock* prev_free = nullptr;
  KVCacheBlock* next_free = nullptr;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_KV_CACHE_BLOCK_H_
