#include "scheduler_service/core/block_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "scheduler_service/core/block_hash.h"

namespace llm {
namespace {

std::vector<KVCacheBlock> MakeBlocks(int num_blocks) {
  CHECK_GE(num_blocks, 0);
  std::vector<KVCacheBlock> blocks;
  blocks.reserve(num_blocks);
  for (int i = 0; i < num_blocks; ++i) blocks.emplace_back(i);
  return blocks;
}

}  // namespace

BlockPool::BlockPool(Device device, int num_blocks, int block_size, bool enable_caching)
    : device_(device),
      block_size_(block_size),
      enable_caching_(enable_caching),
      blocks_(MakeBlocks(num_blocks)),
      tokens_(static_cast<size_t>(num_blocks) * block_size),
      salts_(num_blocks),
      free_queue_(std::span<KVCacheBlock>(blocks_)) {
  CHECK_GT(block_size, 0);
}

double BlockPool::usage() const {
  if (blocks_.empty()) return 0.0;
  return 1.0 - static_cast<double>(num_free_blocks()) / num_blocks();
}

void BlockPool::Allocate(int n, std::vector<BlockId>* out) {
  CHECK_LE(n, num_free_blocks()) << DeviceName(device_) << " pool: allocating " << n
                                 << " blocks with " << num_free_blocks() << " free";
  for (int i = 0; i < n; ++i) out->push_back(AllocateOne());
}

BlockId BlockPool::AllocateOne() {
  KVCacheBlock* block = free_queue_.PopFront();
  DCHECK_EQ(block->ref_cnt, 0);
  if (block->is_hashed()) Evict(block);
  block->ref_cnt = 1;
  return block->block_id;
}

void BlockPool::Evict(KVCacheBlock* block) {
  auto it = cached_.find(block->key.hash);
  if (it != cached_.end() && it->second == block->block_id) cached_.erase(it);
  block->key = BlockKey{};
  salts_[block->block_id].clear();
  ++num_evictions_;
}

KVCacheBlock* BlockPool::FindCached(uint64_t hash, uint64_t parent_prefix_id,
                                    std::span<const TokenId> tokens, std::string_view cache_salt) {
  auto it = cached_.find(hash);
  if (it == cached_.end()) return nullptr;
  KVCacheBlock& block = blocks_[it->second];
  if (block.key.parent_prefix_id != parent_prefix_id) return nullptr;
  if (parent_prefix_id == 0 && salts_[block.block_id] != cache_salt) return nullptr;
  if (!std::equal(tokens.begin(), tokens.end(), this->tokens(block.block_id).begin())) {
    return nullptr;
  }
  return &block;
}

KVCacheBlock* BlockPool::FindSameContents(const KVCacheBlock& other) {
  if (!other.is_hashed()) return nullptr;
  auto it = cached_.find(other.key.hash);
  if (it == cached_.end()) return nullptr;
  KVCacheBlock& block = blocks_[it->second];
  return block.key.prefix_id == other.key.prefix_id ? &block : nullptr;
}

void BlockPool::Touch(KVCacheBlock* block) {
  if (block->ref_cnt == 0) free_queue_.Remove(block);
  ++block->ref_cnt;
}

void BlockPool::Free(KVCacheBlock* block) {
  CHECK_GT(block->ref_cnt, 0) << DeviceName(device_) << " block " << block->block_id
                              << " freed while already free";
  if (--block->ref_cnt != 0) return;
  // A block the prefix cache holds waits at the back, evicted last. One whose contents nobody
  // can reuse is allocated next: on cpu its pages are resident already, and the blocks never
  // written stay untouched (CacheEngine reserves them), so a worker's memory follows the blocks
  // in use at once, not every block ever handed out.
  if (device_ != Device::kGpu || (enable_caching_ && block->is_hashed())) {
    free_queue_.Append(block);
  } else {
    free_queue_.Prepend(block);
  }
}

void BlockPool::SetHashed(KVCacheBlock* block, const BlockKey& key, std::span<const TokenId> tokens,
                          std::string_view cache_salt) {
  DCHECK_GT(block->ref_cnt, 0);
  DCHECK_EQ(static_cast<int>(tokens.size()), block_size_);
  block->key = key;
  if (key.parent_prefix_id == 0) salts_[block->block_id].assign(cache_salt);
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<size_t>(block->block_id) * block_size_);
  if (enable_caching_) cached_.try_emplace(key.hash, block->block_id);
}

void BlockPool::CopyHashedFrom(const BlockPool& src_pool, BlockId src, BlockId dst) {
  const KVCacheBlock& from = src_pool.block(src);
  if (!from.is_hashed()) return;
  SetHashed(&blocks_[dst], from.key, src_pool.tokens(src), src_pool.salts_[src]);
}

absl::Status BlockPool::CheckInvariants() const {
  const char* dev = DeviceName(device_);
  int num_zero_ref = 0;
  for (const KVCacheBlock& b : blocks_) {
    if (b.ref_cnt < 0)
      return absl::InternalError(
          absl::StrCat(dev, " block ", b.block_id, " has ref_cnt ", b.ref_cnt));
    const bool linked = FreeBlockQueue::IsLinked(b);
    if ((b.ref_cnt == 0) != linked) {
      return absl::InternalError(absl::StrCat(dev, " block ", b.block_id, " has ref_cnt ",
                                              b.ref_cnt, " but is ", linked ? "" : "not ",
                                              "in the free queue"));
    }
    num_zero_ref += b.ref_cnt == 0;
  }
  const std::vector<BlockId> queue = free_queue_.ToVector();
  if (static_cast<int>(queue.size()) != num_zero_ref || num_zero_ref != num_free_blocks()) {
    return absl::InternalError(absl::StrCat(dev, " free queue holds ", queue.size(),
                                            " blocks, counts ", num_free_blocks(), ", but ",
                                            num_zero_ref, " blocks have ref_cnt 0"));
  }
  for (const auto& [hash, id] : cached_) {
    const KVCacheBlock& b = blocks_[id];
    if (!b.is_hashed() || b.key.hash != hash) {
      return absl::InternalError(absl::StrCat(dev, " cache map entry ", hash, " points to block ",
                                              id, " which holds hash ", b.key.hash,
                                              " (hashed: ", b.is_hashed(), ")"));
    }
    if (HashBlockTokens(b.key.parent_hash, tokens(id)) != hash) {
      return absl::InternalError(
          absl::StrCat(dev, " cached block ", id, " holds tokens that do not hash to ", hash));
    }
  }
  return absl::OkStatus();
}

}  // namespace llm
