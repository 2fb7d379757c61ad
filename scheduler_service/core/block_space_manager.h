// The KV-cache memory of the whole system as the scheduler manages it: a block table per
// sequence over a GPU pool and a CPU (swap) pool, with prefix caching, fork and
// copy-on-write for n > 1, swapping, and the watermark.
//
// Each mutation is paired with its check, and the scheduler calls the check first:
//
//   CanAllocate  -> Allocate      a waiting sequence's whole prompt (prefix hits reused)
//   CanAppendSlots -> AppendSlots room for new tokens (+ lookahead); copy-on-write pairs out
//   CanSwapOut   -> SwapOut       a request's sequences to CPU; gpu -> cpu pairs out
//   CanSwapIn    -> SwapIn        back to GPU; cpu -> gpu pairs out
//   Fork, Free, CacheComputedBlocks (register full computed blocks with the prefix cache)
//   ReleaseOutsideWindow          with a sliding window: give back the blocks no query can
//                                 see any more
//
// Running out is a normal answer (AllocStatus, false). A mutation whose check would have said
// no returns RESOURCE_EXHAUSTED and changes nothing. Misuse that is a caller's bug (unknown or
// duplicate sequence, swapping a sequence that is not on that device) returns
// FAILED_PRECONDITION / NOT_FOUND / ALREADY_EXISTS naming the sequence, and changes nothing.
//
// Not thread-safe: owned by the engine thread.
#ifndef LLM_SCHEDULER_SERVICE_CORE_BLOCK_SPACE_MANAGER_H_
#define LLM_SCHEDULER_SERVICE_CORE_BLOCK_SPACE_MANAGER_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "scheduler_service/core/block_pool.h"
#include "scheduler_service/core/block_table.h"

namespace llm {

enum class AllocStatus {
  kOk,     // fits now
  kLater,  // does not fit now (or would cross the watermark); may after others finish
  kNever,  // larger than the whole pool less the watermark: can never fit
};

const char* AllocStatusName(AllocStatus s);

struct BlockSpaceManagerConfig {
  int block_size = 16;
  int num_gpu_blocks = 0;
  int num_cpu_blocks = 0;
  // Fraction of GPU blocks kept free when admitting or swapping in, so that running
  // sequences can grow without being preempted at once. In [0, 1).
  double watermark = 0.01;
  bool enable_prefix_caching = false;
  // Every layer of the model attends to the last `sliding_window` positions only (Mistral,
  // Phi-3 and the other models whose every layer has the window; the workers' InitResponse
  // says it): ReleaseOutsideWindow gives back the blocks before the window. 0: some layer sees
  // the whole context, and a sequence holds all its blocks until it ends.
  int sliding_window = 0;

  // INVALID_ARGUMENT naming the field, its value and the allowed range.
  absl::Status Validate() const;
};

struct BlockSpaceManagerStats {
  double gpu_usage = 0;  // fraction of GPU blocks held
  double cpu_usage = 0;
  int num_free_gpu_blocks = 0;
  int num_free_cpu_blocks = 0;
  int num_cached_gpu_blocks = 0;     // blocks findable by prefix lookups (free or held)
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up
  int64_t prefix_cache_hits = 0;     // of those, served from the cache
  int64_t num_evicted_gpu_blocks = 0;
  int64_t num_window_released_blocks = 0;  // given back by ReleaseOutsideWindow, cumulative
  double prefix_cache_hit_rate() const {
    return prefix_cache_queries == 0
               ? 0.0
               : static_cast<double>(prefix_cache_hits) / static_cast<double>(prefix_cache_queries);
  }
};

class BlockSpaceManager {
 public:
  // The config must be valid (Validate()); CHECK-fails otherwise.
  explicit BlockSpaceManager(const BlockSpaceManagerConfig& config);
  BlockSpaceManager(const BlockSpaceManager&) = delete;
  BlockSpaceManager& operator=(const BlockSpaceManager&) = delete;

  const BlockSpaceManagerConfig& config() const { return config_; }
  int block_size() const { return config_.block_size; }
  int watermark_blocks() const { return watermark_blocks_; }

  // Whether a prompt can be allocated on the GPU now, counting prefix hits on blocks that
  // are already held (they need no free block). NEVER when the prompt needs more blocks
  // than the pool has above the watermark.
  AllocStatus CanAllocate(std::span<const TokenId> prompt, std::string_view cache_salt = {});
  // Prompt tokens a new sequence would find in the prefix cache now (a multiple of
  // block_size, less than the prompt's length). Does not change the cache or its stats. For
  // budgeting how many tokens a prefill must compute.
  int CountCachedPrefixTokens(std::span<const TokenId> prompt, std::string_view cache_salt = {});
  // Allocates GPU blocks for the whole prompt of a new sequence, reusing the longest cached
  // prefix of full blocks (never the block holding the last prompt token: its logits must be
  // computed). Returns the number of prompt tokens whose KV is already cached.
  absl::StatusOr<int> Allocate(SeqId seq, std::span<const TokenId> prompt,
                               std::string_view cache_salt = {});

  // Whether every sequence in `seqs` can append n tokens plus lookahead slots at once.
  bool CanAppendSlots(std::span<const SeqId> seqs, int num_new_tokens,
                      int num_lookahead_slots = 0) const;
  // Makes room for n more tokens (and lookahead slots) and counts them in the table. A block
  // about to be written that other sequences share is copied first (copy-on-write): the
  // (src, dst) pairs the workers must copy are appended to `copies`.
  absl::Status AppendSlots(SeqId seq, int num_new_tokens, int num_lookahead_slots,
                           std::vector<BlockPair>* copies);

  // Registers the sequence's full blocks whose tokens are all computed
  // (num_computed_tokens of `tokens`, the sequence's whole token list) with the prefix
  // cache. No-op when prefix caching is off.
  absl::Status CacheComputedBlocks(SeqId seq, std::span<const TokenId> tokens,
                                   int num_computed_tokens);

  // With a sliding window W (config().sliding_window > 0): gives back the GPU blocks of the
  // sequence that hold only positions before first_position - W + 1, the first a query at
  // first_position or later sees, so that a long sequence holds about W / block_size blocks
  // instead of all of them. Their entries become kReleasedBlock; a released block keeps its
  // prefix-cache identity in the free list (other prompts can still hit it until it is
  // evicted). With prefix caching, only blocks already registered (CacheComputedBlocks) are
  // given back. The caller passes the first position this step computes for the sequence: the
  // kernels never read a block before its query's window (kernels/ops.h), and a step already
  // sent that still reads one runs on the workers before any step that could write it again.
  // Returns the number of blocks given back; 0 without a window, for a sequence that holds
  // no blocks or is swapped out.
  int ReleaseOutsideWindow(SeqId seq, int first_position);

  // The child shares every block of the parent (n > 1 after the prompt's prefill).
  absl::Status Fork(SeqId parent, SeqId child);

  // Whether the CPU pool can take every distinct block of these GPU sequences.
  bool CanSwapOut(std::span<const SeqId> seqs) const;
  // Moves the sequences (one request's) to the CPU pool; a block shared among them is
  // copied once. Returns the (gpu, cpu) pairs to copy.
  absl::StatusOr<std::vector<BlockPair>> SwapOut(std::span<const SeqId> seqs);
  // Whether the GPU pool can take them back, plus lookahead slots, above the watermark.
  AllocStatus CanSwapIn(std::span<const SeqId> seqs, int num_lookahead_slots = 0) const;
  // Moves them back to the GPU pool. Returns the (cpu, gpu) pairs to copy; a full block whose
  // exact contents the GPU still caches is reused instead of copied.
  absl::StatusOr<std::vector<BlockPair>> SwapIn(std::span<const SeqId> seqs);

  // Releases the sequence's blocks, tail first, wherever they are.
  absl::Status Free(SeqId seq);

  // nullptr when the sequence holds no blocks.
  const BlockTable* GetBlockTable(SeqId seq) const;

  // A performance hint for a caller walking many sequences (the scheduler's step): brings
  // the sequence's table entry into cache. Changes nothing.
  void Prefetch(SeqId seq) const;
  int num_sequences() const { return static_cast<int>(tables_.size()); }
  const BlockPool& gpu_pool() const { return gpu_; }
  const BlockPool& cpu_pool() const { return cpu_; }
  BlockSpaceManagerStats stats() const;

  // Every invariant across pools and tables: free + held = total on each device; each
  // block's ref_cnt equals the number of tables holding it; no block both free and held;
  // every cache entry holds tokens that hash to its key; each table's hashed blocks form an
  // unbroken chain. O(total blocks); for tests and debugging.
  absl::Status CheckInvariants() const;

 private:
  BlockPool& pool(Device d) { return d == Device::kGpu ? gpu_ : cpu_; }
  const BlockPool& pool(Device d) const { return d == Device::kGpu ? gpu_ : cpu_; }
  absl::StatusOr<BlockTable*> FindTable(SeqId seq);
  // Longest run of cached full blocks of the prompt, excluding the block of its last token.
  void MatchPrefix(std::span<const TokenId> prompt, std::string_view cache_salt,
                   std::vector<KVCacheBlock*>* hits);
  // The distinct blocks of these sequences, which must all be on `device`.
  absl::Status CollectDistinctBlocks(std::span<const SeqId> seqs, Device device,
                                     std::vector<BlockId>* blocks) const;
  // Moves sequences between pools; the common half of SwapOut and SwapIn.
  absl::StatusOr<std::vector<BlockPair>> Move(std::span<const SeqId> seqs, Device from, Device to);
  void ReleaseBlocks(const BlockTable& table);

  const BlockSpaceManagerConfig config_;
  const int watermark_blocks_;
  BlockPool gpu_;
  BlockPool cpu_;
  absl::flat_hash_map<SeqId, BlockTable> tables_;
  uint64_t next_prefix_id_ = 1;
  int64_t prefix_cache_queries_ = 0;
  int64_t prefix_cache_hits_ = 0;
  int64_t num_window_released_ = 0;
  std::vector<KVCacheBlock*> scratch_hits_;  // reused by CanAllocate / Allocate
};

}  // namespace llm

#endif  // LLM_SCHEDULER_SERVICE_CORE_BLOCK_SPACE_MANAGER_H_
