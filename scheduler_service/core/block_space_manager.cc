#include "scheduler_service/core/block_space_manager.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "scheduler_service/core/block_hash.h"

namespace llm {

const char* AllocStatusName(AllocStatus s) {
  switch (s) {
    case AllocStatus::kOk:
      return "OK";
    case AllocStatus::kLater:
      return "LATER";
    case AllocStatus::kNever:
      return "NEVER";
  }
  return "?";
}

absl::Status BlockSpaceManagerConfig::Validate() const {
  if (block_size < 1 || block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size is ", block_size, "; it must be in [1, 1024]"));
  }
  if (num_gpu_blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_gpu_blocks is ", num_gpu_blocks, "; it must be >= 1"));
  }
  if (num_cpu_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_cpu_blocks is ", num_cpu_blocks, "; it must be >= 0"));
  }
  if (!std::isfinite(watermark) || watermark < 0 || watermark >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("watermark is ", watermark, "; it must be in [0, 1)"));
  }
  if (sliding_window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sliding_window is ", sliding_window, "; it must be >= 0 (0: none)"));
  }
  return absl::OkStatus();
}

namespace {
// Checked before any member is built, so that a bad config fails with its own message.
const BlockSpaceManagerConfig& Validated(const BlockSpaceManagerConfig& config) {
  const absl::Status valid = config.Validate();
  CHECK(valid.ok()) << valid;
  return config;
}
}  // namespace

BlockSpaceManager::BlockSpaceManager(const BlockSpaceManagerConfig& config)
    : config_(Validated(config)),
      watermark_blocks_(static_cast<int>(config.watermark * config.num_gpu_blocks)),
      gpu_(Device::kGpu, config.num_gpu_blocks, config.block_size, config.enable_prefix_caching),
      cpu_(Device::kCpu, config.num_cpu_blocks, config.block_size, /*enable_caching=*/false) {}

absl::StatusOr<BlockTable*> BlockSpaceManager::FindTable(SeqId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence ", seq, " holds no blocks"));
  }
  return &it->second;
}

const BlockTable* BlockSpaceManager::GetBlockTable(SeqId seq) const {
  auto it = tables_.find(seq);
  return it == tables_.end() ? nullptr : &it->second;
}

void BlockSpaceManager::Prefetch(SeqId seq) const { tables_.prefetch(seq); }

void BlockSpaceManager::MatchPrefix(std::span<const TokenId> prompt, std::string_view cache_salt,
                                    std::vector<KVCacheBlock*>* hits) {
  hits->clear();
  if (!config_.enable_prefix_caching || prompt.empty()) return;
  const int bs = config_.block_size;
  // The block holding the last prompt token is always computed: its logits are needed.
  const int max_blocks = static_cast<int>((prompt.size() - 1) / bs);
  uint64_t parent_hash = RootHash(cache_salt);
  uint64_t parent_prefix_id = 0;
  for (int i = 0; i < max_blocks; ++i) {
    const std::span<const TokenId> tokens = prompt.subspan(static_cast<size_t>(i) * bs, bs);
    const uint64_t hash = HashBlockTokens(parent_hash, tokens);
    KVCacheBlock* block = gpu_.FindCached(hash, parent_prefix_id, tokens, cache_salt);
    if (block == nullptr) break;
    hits->push_back(block);
    parent_hash = hash;
    parent_prefix_id = block->key.prefix_id;
  }
}

int BlockSpaceManager::CountCachedPrefixTokens(std::span<const TokenId> prompt,
                                               std::string_view cache_salt) {
  MatchPrefix(prompt, cache_salt, &scratch_hits_);
  return static_cast<int>(scratch_hits_.size()) * config_.block_size;
}

AllocStatus BlockSpaceManager::CanAllocate(std::span<const TokenId> prompt,
                                           std::string_view cache_salt) {
  const int required =
      BlockTable::NumRequiredBlocks(static_cast<int>(prompt.size()), 0, config_.block_size);
  if (required > gpu_.num_blocks() - watermark_blocks_) return AllocStatus::kNever;
  const int free = gpu_.num_free_blocks();
  if (free - required >= watermark_blocks_) return AllocStatus::kOk;
  // Short of blocks: hits on blocks other sequences hold need no free block.
  MatchPrefix(prompt, cache_salt, &scratch_hits_);
  int held_hits = 0;
  for (const KVCacheBlock* b : scratch_hits_) held_hits += b->ref_cnt > 0;
  return free - (required - held_hits) >= watermark_blocks_ ? AllocStatus::kOk
                                                            : AllocStatus::kLater;
}

absl::StatusOr<int> BlockSpaceManager::Allocate(SeqId seq, std::span<const TokenId> prompt,
                                                std::string_view cache_salt) {
  if (prompt.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, " has an empty prompt"));
  }
  if (tables_.contains(seq)) {
    return absl::AlreadyExistsError(absl::StrCat("sequence ", seq, " already holds blocks"));
  }
  const int num_tokens = static_cast<int>(prompt.size());
  const int required = BlockTable::NumRequiredBlocks(num_tokens, 0, config_.block_size);
  MatchPrefix(prompt, cache_salt, &scratch_hits_);
  const int num_hits = static_cast<int>(scratch_hits_.size());
  int free_hits = 0;
  for (const KVCacheBlock* b : scratch_hits_) free_hits += b->ref_cnt == 0;
  const int needed_free = required - num_hits + free_hits;
  if (needed_free > gpu_.num_free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("sequence ", seq, " needs ", needed_free,
                                                     " free GPU blocks; ", gpu_.num_free_blocks(),
                                                     " are free"));
  }
  if (config_.enable_prefix_caching) {
    prefix_cache_queries_ += num_tokens;
    prefix_cache_hits_ += static_cast<int64_t>(num_hits) * config_.block_size;
  }

  BlockTable& table = tables_.try_emplace(seq, config_.block_size).first->second;
  table.block_ids_.reserve(required);
  // Revive the hits before allocating, so that allocation cannot evict them.
  for (KVCacheBlock* b : scratch_hits_) {
    gpu_.Touch(b);
    table.block_ids_.push_back(b->block_id);
  }
  gpu_.Allocate(required - num_hits, &table.block_ids_);
  table.num_tokens_ = num_tokens;
  table.num_hashed_blocks_ = num_hits;
  table.cache_salt_.assign(cache_salt);
  return num_hits * config_.block_size;
}

bool BlockSpaceManager::CanAppendSlots(std::span<const SeqId> seqs, int num_new_tokens,
                                       int num_lookahead_slots) const {
  int needed = 0;
  for (SeqId seq : seqs) {
    const BlockTable* table = GetBlockTable(seq);
    if (table == nullptr || table->device() != Device::kGpu) return false;
    needed += table->NumNewBlocksForAppend(num_new_tokens, num_lookahead_slots);
    // Copy-on-write of shared blocks about to be written (counted per sequence: a bound).
    if (num_new_tokens > 0) {
      const int last =
          std::min(table->LastWrittenBlock(num_new_tokens), table->num_forked_blocks_ - 1);
      for (int i = table->FirstWrittenBlock(); i <= last; ++i) {
        needed += gpu_.block(table->block_ids_[i]).ref_cnt > 1;
      }
    }
  }
  return needed <= gpu_.num_free_blocks();
}

absl::Status BlockSpaceManager::AppendSlots(SeqId seq, int num_new_tokens, int num_lookahead_slots,
                                            std::vector<BlockPair>* copies) {
  if (num_new_tokens < 0 || num_lookahead_slots < 0) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, ": appending ", num_new_tokens,
                                                   " tokens and ", num_lookahead_slots,
                                                   " lookahead slots"));
  }
  ASSIGN_OR_RETURN(BlockTable * table, FindTable(seq));
  if (table->device() != Device::kGpu) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, " is swapped out; swap it in before appending"));
  }
  // Only forked blocks can be shared and written: copy-on-write never reads the others.
  const int first = table->FirstWrittenBlock();
  const int last = num_new_tokens > 0 ? std::min(table->LastWrittenBlock(num_new_tokens),
                                                 table->num_forked_blocks_ - 1)
                                      : first - 1;
  int num_cow = 0;
  for (int i = first; i <= last; ++i) num_cow += gpu_.block(table->block_ids_[i]).ref_cnt > 1;
  const int num_new_blocks = table->NumNewBlocksForAppend(num_new_tokens, num_lookahead_slots);
  if (num_cow + num_new_blocks > gpu_.num_free_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("sequence ", seq, " needs ", num_cow + num_new_blocks,
                     " free GPU blocks to append; ", gpu_.num_free_blocks(), " are free"));
  }
  for (int i = first; i <= last && num_cow > 0; ++i) {
    BlockId& id = table->block_ids_[i];
    if (gpu_.block(id).ref_cnt == 1) continue;
    const BlockId copy = gpu_.AllocateOne();
    copies->push_back({id, copy});
    gpu_.Free(id);
    id = copy;
  }
  gpu_.Allocate(num_new_blocks, &table->block_ids_);
  table->num_tokens_ += num_new_tokens;
  return absl::OkStatus();
}

absl::Status BlockSpaceManager::CacheComputedBlocks(SeqId seq, std::span<const TokenId> tokens,
                                                    int num_computed_tokens) {
  if (!config_.enable_prefix_caching) return absl::OkStatus();
  ASSIGN_OR_RETURN(BlockTable * table, FindTable(seq));
  if (table->device() != Device::kGpu) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, " is swapped out; its blocks cannot be cached"));
  }
  const int bs = config_.block_size;
  const int num_full = std::min(num_computed_tokens, table->num_tokens()) / bs;
  if (static_cast<int64_t>(tokens.size()) < static_cast<int64_t>(num_full) * bs) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, ": ", tokens.size(),
                                                   " tokens given for ", num_full,
                                                   " computed blocks of ", bs));
  }
  for (int i = table->num_hashed_blocks_; i < num_full; ++i) {
    KVCacheBlock& block = gpu_.block(table->block_ids_[i]);
    if (block.is_hashed()) continue;  // a sibling sharing the block registered it
    BlockKey key;
    if (i == 0) {
      key.parent_hash = RootHash(table->cache_salt_);
    } else if (table->block_ids_[i - 1] == kReleasedBlock) {
      key.parent_hash = table->released_tail_hash_;
      key.parent_prefix_id = table->released_tail_prefix_id_;
    } else {
      const BlockKey& parent = gpu_.block(table->block_ids_[i - 1]).key;
      key.parent_hash = parent.hash;
      key.parent_prefix_id = parent.prefix_id;
    }
    const std::span<const TokenId> block_tokens = tokens.subspan(static_cast<size_t>(i) * bs, bs);
    key.hash = HashBlockTokens(key.parent_hash, block_tokens);
    key.prefix_id = next_prefix_id_++;
    gpu_.SetHashed(&block, key, block_tokens, table->cache_salt_);
  }
  table->num_hashed_blocks_ = std::max(table->num_hashed_blocks_, num_full);
  return absl::OkStatus();
}

int BlockSpaceManager::ReleaseOutsideWindow(SeqId seq, int first_position) {
  const int window = config_.sliding_window;
  if (window <= 0) return 0;
  auto it = tables_.find(seq);
  if (it == tables_.end() || it->second.device() != Device::kGpu) return 0;
  BlockTable& table = it->second;
  // Blocks wholly before the window's first position. That position is at most the first one
  // this step writes (window >= 1), so no block written from here on is given back.
  int limit = std::max(0, first_position - window + 1) / config_.block_size;
  limit = std::min(limit, table.num_blocks());
  // The next block to hash takes its parent's key from the last released one.
  if (config_.enable_prefix_caching) limit = std::min(limit, table.num_hashed_blocks_);
  if (limit <= table.num_released_blocks_) return 0;
  const KVCacheBlock& tail = gpu_.block(table.block_ids_[limit - 1]);
  table.released_tail_hash_ = tail.key.hash;
  table.released_tail_prefix_id_ = tail.key.prefix_id;
  // Later blocks first, as Free does: the free list evicts the earlier ones (the prefixes
  // other prompts share) last.
  for (int i = limit - 1; i >= table.num_released_blocks_; --i) {
    gpu_.Free(table.block_ids_[i]);
    table.block_ids_[i] = kReleasedBlock;
  }
  const int released = limit - table.num_released_blocks_;
  table.num_released_blocks_ = limit;
  num_window_released_ += released;
  return released;
}

absl::Status BlockSpaceManager::Fork(SeqId parent, SeqId child) {
  if (tables_.contains(child)) {
    return absl::AlreadyExistsError(
        absl::StrCat("fork: sequence ", child, " already holds blocks"));
  }
  ASSIGN_OR_RETURN(BlockTable * from, FindTable(parent));
  if (from->device() != Device::kGpu) {
    return absl::FailedPreconditionError(
        absl::StrCat("fork: parent sequence ", parent, " is swapped out"));
  }
  from->num_forked_blocks_ = from->num_blocks();
  BlockTable copy = *from;  // `from` may move when the map grows
  for (BlockId id : copy.block_ids_) {
    if (id != kReleasedBlock) gpu_.Touch(&gpu_.block(id));
  }
  tables_.emplace(child, std::move(copy));
  return absl::OkStatus();
}

absl::Status BlockSpaceManager::CollectDistinctBlocks(std::span<const SeqId> seqs, Device device,
                                                      std::vector<BlockId>* blocks) const {
  absl::flat_hash_set<SeqId> seen_seqs;
  absl::flat_hash_set<BlockId> seen_blocks;
  for (SeqId seq : seqs) {
    const BlockTable* table = GetBlockTable(seq);
    if (table == nullptr) {
      return absl::NotFoundError(absl::StrCat("sequence ", seq, " holds no blocks"));
    }
    if (table->device() != device) {
      return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, " is on the ",
                                                        DeviceName(table->device()), ", not the ",
                                                        DeviceName(device)));
    }
    if (!seen_seqs.insert(seq).second) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, " is listed twice"));
    }
    for (BlockId id : table->block_ids()) {
      if (id != kReleasedBlock && seen_blocks.insert(id).second) blocks->push_back(id);
    }
  }
  return absl::OkStatus();
}

bool BlockSpaceManager::CanSwapOut(std::span<const SeqId> seqs) const {
  std::vector<BlockId> blocks;
  if (!CollectDistinctBlocks(seqs, Device::kGpu, &blocks).ok()) return false;
  return static_cast<int>(blocks.size()) <= cpu_.num_free_blocks();
}

AllocStatus BlockSpaceManager::CanSwapIn(std::span<const SeqId> seqs,
                                         int num_lookahead_slots) const {
  std::vector<BlockId> blocks;
  if (!CollectDistinctBlocks(seqs, Device::kCpu, &blocks).ok()) return AllocStatus::kNever;
  int needed = static_cast<int>(blocks.size());
  for (SeqId seq : seqs) {
    needed += GetBlockTable(seq)->NumNewBlocksForAppend(0, num_lookahead_slots);
  }
  if (needed > gpu_.num_blocks()) return AllocStatus::kNever;
  return gpu_.num_free_blocks() - needed >= watermark_blocks_ ? AllocStatus::kOk
                                                              : AllocStatus::kLater;
}

absl::StatusOr<std::vector<BlockPair>> BlockSpaceManager::SwapOut(std::span<const SeqId> seqs) {
  return Move(seqs, Device::kGpu, Device::kCpu);
}

absl::StatusOr<std::vector<BlockPair>> BlockSpaceManager::SwapIn(std::span<const SeqId> seqs) {
  return Move(seqs, Device::kCpu, Device::kGpu);
}

absl::StatusOr<std::vector<BlockPair>> BlockSpaceManager::Move(std::span<const SeqId> seqs,
                                                               Device from, Device to) {
  std::vector<BlockId> distinct;
  RETURN_IF_ERROR(CollectDistinctBlocks(seqs, from, &distinct));
  BlockPool& src = pool(from);
  BlockPool& dst = pool(to);
  if (static_cast<int>(distinct.size()) > dst.num_free_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("moving ", seqs.size(), " sequences needs ", distinct.size(), " free ",
                     DeviceName(to), " blocks; ", dst.num_free_blocks(), " are free"));
  }
  // A block whose exact contents the destination still caches (swapping back in while its
  // prefix was kept or recomputed by another request) is reused, not copied. Those are
  // claimed first, so that allocating the others cannot evict them.
  absl::flat_hash_map<BlockId, BlockId> mapping;
  mapping.reserve(distinct.size());
  for (BlockId id : distinct) {
    if (KVCacheBlock* same = dst.FindSameContents(src.block(id))) {
      dst.Touch(same);
      mapping.emplace(id, same->block_id);
    }
  }
  // Every other distinct block is copied once; each copy gets one reference per table.
  std::vector<BlockPair> pairs;
  pairs.reserve(distinct.size() - mapping.size());
  for (BlockId id : distinct) {
    if (mapping.contains(id)) continue;
    const BlockId copy = dst.AllocateOne();
    dst.CopyHashedFrom(src, id, copy);
    mapping.emplace(id, copy);
    pairs.push_back({id, copy});
  }
  absl::flat_hash_set<BlockId> referenced;
  for (SeqId seq : seqs) {
    BlockTable& table = tables_.find(seq)->second;
    ReleaseBlocks(table);
    for (BlockId& id : table.block_ids_) {
      if (id == kReleasedBlock) continue;
      const BlockId copy = mapping.at(id);
      if (!referenced.insert(copy).second) dst.Touch(&dst.block(copy));
      id = copy;
    }
    table.device_ = to;
  }
  return pairs;
}

void BlockSpaceManager::ReleaseBlocks(const BlockTable& table) {
  BlockPool& p = pool(table.device());
  const std::span<const BlockId> ids = table.block_ids();
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    if (*it != kReleasedBlock) p.Free(*it);
  }
}

absl::Status BlockSpaceManager::Free(SeqId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    return absl::NotFoundError(
        absl::StrCat("free: sequence ", seq, " holds no blocks (unknown or already freed)"));
  }
  ReleaseBlocks(it->second);
  tables_.erase(it);
  return absl::OkStatus();
}

BlockSpaceManagerStats BlockSpaceManager::stats() const {
  BlockSpaceManagerStats s;
  s.gpu_usage = gpu_.usage();
  s.cpu_usage = cpu_.usage();
  s.num_free_gpu_blocks = gpu_.num_free_blocks();
  s.num_free_cpu_blocks = cpu_.num_free_blocks();
  s.num_cached_gpu_blocks = gpu_.num_cached_blocks();
  s.prefix_cache_queries = prefix_cache_queries_;
  s.prefix_cache_hits = prefix_cache_hits_;
  s.num_evicted_gpu_blocks = gpu_.num_evictions();
  s.num_window_released_blocks = num_window_released_;
  return s;
}

absl::Status BlockSpaceManager::CheckInvariants() const {
  RETURN_IF_ERROR(gpu_.CheckInvariants());
  RETURN_IF_ERROR(cpu_.CheckInvariants());
  std::vector<int> gpu_refs(gpu_.num_blocks()), cpu_refs(cpu_.num_blocks());
  for (const auto& [seq, table] : tables_) {
    std::vector<int>& refs = table.device() == Device::kGpu ? gpu_refs : cpu_refs;
    const BlockPool& p = pool(table.device());
    if (table.num_blocks() <
        BlockTable::NumRequiredBlocks(table.num_tokens(), 0, config_.block_size)) {
      return absl::InternalError(absl::StrCat("sequence ", seq, " has ", table.num_tokens(),
                                              " tokens in ", table.num_blocks(), " blocks"));
    }
    absl::flat_hash_set<BlockId> in_table;
    for (int i = 0; i < table.num_blocks(); ++i) {
      const BlockId id = table.block_ids()[i];
      if ((id == kReleasedBlock) != (i < table.num_released_blocks())) {
        return absl::InternalError(absl::StrCat("sequence ", seq, ": entry ", i, " is block ", id,
                                                " with ", table.num_released_blocks(),
                                                " leading entries released"));
      }
      if (id == kReleasedBlock) continue;
      if (id < 0 || id >= p.num_blocks() || !in_table.insert(id).second) {
        return absl::InternalError(
            absl::StrCat("sequence ", seq, " holds block ", id, " out of range or twice"));
      }
      ++refs[id];
    }
    for (int i = table.num_released_blocks(); i < table.num_hashed_blocks(); ++i) {
      const BlockKey& key = p.block(table.block_ids()[i]).key;
      const uint64_t want_parent = i == 0 ? 0
                                   : i == table.num_released_blocks()
                                       ? table.released_tail_prefix_id_
                                       : p.block(table.block_ids()[i - 1]).key.prefix_id;
      if (key.prefix_id == 0 || key.parent_prefix_id != want_parent) {
        return absl::InternalError(absl::StrCat("sequence ", seq, ": hashed block ", i, " (block ",
                                                table.block_ids()[i], ") breaks the prefix chain"));
      }
    }
  }
  // Copy-on-write looks only at forked blocks: every block an append can write past them
  // must belong to its table alone.
  for (const auto& [seq, table] : tables_) {
    const std::vector<int>& refs = table.device() == Device::kGpu ? gpu_refs : cpu_refs;
    const int first_written = std::max(table.num_forked_blocks(), table.FirstWrittenBlock());
    for (int i = first_written; i < table.num_blocks(); ++i) {
      if (refs[table.block_ids()[i]] != 1) {
        return absl::InternalError(
            absl::StrCat("sequence ", seq, ": block ", i, " (block ", table.block_ids()[i],
                         ") is held by ", refs[table.block_ids()[i]], " tables but is past the ",
                         table.num_forked_blocks(), " forked blocks"));
      }
    }
  }
  for (Device d : {Device::kGpu, Device::kCpu}) {
    const std::vector<int>& refs = d == Device::kGpu ? gpu_refs : cpu_refs;
    const BlockPool& p = pool(d);
    for (int id = 0; id < p.num_blocks(); ++id) {
      if (p.block(id).ref_cnt != refs[id]) {
        return absl::InternalError(absl::StrCat(DeviceName(d), " block ", id, " has ref_cnt ",
                                                p.block(id).ref_cnt, " but ", refs[id],
                                                " tables hold it"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace llm
