// The free KV-cache blocks of one pool in the order they are allocated: BlockPool puts a freed
// block whose contents nobody can reuse at the front, one the prefix cache holds at the back
// (least recently freed first).
//
// An intrusive doubly linked list through KVCacheBlock::prev_free / next_free with a sentinel
// head and tail, so that PopFront, Append and Remove (a cached block revived by a prefix hit
// leaves the middle of the queue) are O(1) and allocate nothing:
//
//   head <-> b7 <-> b2 <-> ... <-> b5 <-> tail
//            ^ evicted first            ^ freed last
//
// Not thread-safe: owned by a BlockPool, which has a single owning thread.
#ifndef LLM_SCHEDULER_SERVICE_CORE_FREE_BLOCK_QUEUE_H_
#define LLM_SCHEDULER_SERVICE_CORE_FREE_BLOCK_QUEUE_H_

#include <span>
#include <vector>

#include "scheduler_service/core/kv_cache_block.h"

namespace llm {

class FreeBlockQueue {
 public:
  // Links `blocks` in order; each must have ref_cnt 0 and not be linked elsewhere.
  explicit FreeBlockQueue(std::span<KVCacheBlock> blocks);
  FreeBlockQueue(const FreeBlockQueue&) = delete;
  FreeBlockQueue& operator=(const FreeBlockQueue&) = delete;

  int size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Unlinks and returns the front block; CHECK-fails when empty.
  KVCacheBlock* PopFront();
  // Unlinks the first n blocks into `out` (appended); CHECK-fails when fewer than n.
  void PopFrontN(int n, std::vector<KVCacheBlock*>* out);
  // Links `block` at the back; CHECK-fails when it is already linked.
  void Append(KVCacheBlock* block);
  // Links `block` at the front (allocated next); CHECK-fails when it is already linked.
  void Prepend(KVCacheBlock* block);
  // Unlinks `block` from wherever it is; CHECK-fails when it is not linked.
  void Remove(KVCacheBlock* block);

  static bool IsLinked(const KVCacheBlock& block) { return block.next_free != nullptr; }

  // The block ids front to back. O(n); for tests and invariant checks.
  std::vector<BlockId> ToVector() const;

 private:
  KVCacheBlock head_{-1};
  KVCacheBlock tail_{-1};
  int size_ = 0;
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_FREE_BLOCK_QUEUE_H_
