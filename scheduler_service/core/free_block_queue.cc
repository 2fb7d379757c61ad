#include "scheduler_service/core/free_block_queue.h"

#include "glog/logging.h"

namespace llm {

FreeBlockQueue::FreeBlockQueue(std::span<KVCacheBlock> blocks) {
  head_.next_free = &tail_;
  tail_.prev_free = &head_;
  for (KVCacheBlock& block : blocks) Append(&block);
}

KVCacheBlock* FreeBlockQueue::PopFront() {
  CHECK_GT(size_, 0) << "PopFront on an empty free block queue";
  KVCacheBlock* block = head_.next_free;
  head_.next_free = block->next_free;
  block->next_free->prev_free = &head_;
  block->prev_free = block->next_free = nullptr;
  --size_;
  return block;
}

void FreeBlockQueue::PopFrontN(int n, std::vector<KVCacheBlock*>* out) {
  CHECK_LE(n, size_) << "PopFrontN(" << n << ") with " << size_ << " free blocks";
  KVCacheBlock* block = head_.next_free;
  for (int i = 0; i < n; ++i) {
    KVCacheBlock* next = block->next_free;
    block->prev_free = block->next_free = nullptr;
    out->push_back(block);
    block = next;
  }
  head_.next_free = block;
  block->prev_free = &head_;
  size_ -= n;
}

void FreeBlockQueue::Append(KVCacheBlock* block) {
  CHECK(!IsLinked(*block)) << "block " << block->block_id << " is already in the free queue";
  KVCacheBlock* last = tail_.prev_free;
  last->next_free = block;
  block->prev_free = last;
  block->next_free = &tail_;
  tail_.prev_free = block;
  ++size_;
}

void FreeBlockQueue::Prepend(KVCacheBlock* block) {
  CHECK(!IsLinked(*block)) << "block " << block->block_id << " is already in the free queue";
  KVCacheBlock* first = head_.next_free;
  first->prev_free = block;
  block->next_free = first;
  block->prev_free = &head_;
  head_.next_free = block;
  ++size_;
}

void FreeBlockQueue::Remove(KVCacheBlock* block) {
  CHECK(IsLinked(*block)) << "block " << block->block_id << " is not in the free queue";
  block->prev_free->next_free = block->next_free;
  block->next_free->prev_free = block->prev_free;
  block->prev_free = block->next_free = nullptr;
  --size_;
}

std::vector<BlockId> FreeBlockQueue::ToVector() const {
  std::vector<BlockId> ids;
  ids.reserve(size_);
  for (const KVCacheBlock* b = head_.next_free; b != &tail_; b = b->next_free) {
    ids.push_back(b->block_id);
  }
  return ids;
}

}  // namespace llm
