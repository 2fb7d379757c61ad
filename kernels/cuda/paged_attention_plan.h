// The host-side decisions of the CUDA PagedAttention launcher, as plain functions of sizes and
// host data, so that they are unit-tested without a device (tests/unit/kernels): which kernels
// a batch needs, the tiled prefill kernel's grid, and the split-K (v2) workspace.
//
// Kernels (kernels/cuda/paged_attention.cu):
//   rows     v1 or v2 over grid (T, Hq[, partitions]): one block per (query row, head[, part]).
//            With kAuto the rows of sequences with q_len > 1 exit at once (they are the tiled
//            kernel's), so the row kernels are needed only when some sequence has q_len == 1.
//   prefill  kAuto only: the tiled prefill kernel over grid (tiles, Hq), one block per
//            kPrefillTileRows rows of one sequence with q_len > 1.
// The host knows the q_lens when the caller passes AttentionMetadata::query_start_loc_host
// (the device tensor's contents): then each kernel is launched only when the batch has rows
// for it, and the prefill grid is exactly sum_s ceil(q_len_s / kPrefillTileRows) over q_len > 1.
// Without it both are launched, the prefill grid sized for any split of T rows:
// ceil(T / kPrefillTileRows) + S (surplus blocks exit).
//
// v2's workspace (tmp_out [T, Hq, P, D], then max_logits and exp_sums [T, Hq, P], f32;
// P = ceil(max_seq_len / kPartitionSize)) is the caller's: OpContext::workspace, allocated once
// with PagedAttentionWorkspaceBytes. The launcher never allocates.
//
// Host-only (no CUDA headers); pure functions, thread-safe.
#ifndef LLM_KERNELS_CUDA_PAGED_ATTENTION_PLAN_H_
#define LLM_KERNELS_CUDA_PAGED_ATTENTION_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace llm::ops::cuda {

// Which paged-attention kernels run. kV1: one thread block per (query head, query row) over
// the row's whole context. kV2: split-K, one thread block per (query head, query row,
// partition of kPartitionSize tokens), then a reduction kernel; needs metadata.max_seq_len
// (> 0) to size the grid and a workspace of SplitKWorkspaceBytes. kAuto: v2 when the context is
// long (max_seq_len > kPartitionSize), there are at most kMaxSplitKRowHeads (row, head) pairs
// (too few to fill the device) and the workspace holds it, else v1; plus the tiled prefill
// kernel for the rows of sequences with q_len > 1.
enum class PagedAttentionVersion { kAuto, kV1, kV2 };
inline constexpr int kPartitionSize = 512;
inline constexpr int kPrefillTileRows = 16;
inline constexpr int64_t kMaxSplitKRowHeads = 512;

// Bytes of v2's workspace for num_tokens rows of num_heads heads of head_size over contexts of
// at most max_seq_len keys; 0 when any is <= 0.
inline size_t SplitKWorkspaceBytes(int64_t num_tokens, int64_t num_heads, int64_t head_size,
                                   int64_t max_seq_len) {
  if (num_tokens <= 0 || num_heads <= 0 || head_size <= 0 || max_seq_len <= 0) return 0;
  const int64_t partitions = (max_seq_len + kPartitionSize - 1) / kPartitionSize;
  return static_cast<size_t>(num_tokens * num_heads * partitions * (head_size + 2)) * sizeof(float);
}

// The workspace that lets kAuto split every batch it would split, for batches of at most
// max_num_tokens tokens over contexts of at most max_model_len: kAuto splits only when
// T * Hq <= kMaxSplitKRowHeads, so it never needs more than that many (row, head) pairs.
// Allocate it once (a worker: beside the KV cache, counted by memory profiling).
inline size_t PagedAttentionWorkspaceBytes(int64_t max_num_tokens, int64_t num_heads,
                                           int64_t head_size, int64_t max_model_len) {
  if (max_model_len <= kPartitionSize || num_heads <= 0) return 0;  // kAuto never splits
  int64_t rows = max_num_tokens;
  if (rows * num_heads > kMaxSplitKRowHeads) rows = kMaxSplitKRowHeads / num_heads;
  return SplitKWorkspaceBytes(rows, num_heads, head_size, max_model_len);
}

struct PagedAttentionPlanInput {
  int64_t num_tokens = 0;  // T > 0
  int64_t num_heads = 0;   // Hq > 0
  int64_t head_size = 0;
  int64_t num_seqs = 0;  // S > 0
  int max_seq_len = 0;   // metadata.max_seq_len (0 = unknown)
  PagedAttentionVersion version = PagedAttentionVersion::kAuto;
  std::span<const int32_t> query_start_loc_host;  // [S + 1] or empty (unknown)
  size_t workspace_bytes = 0;                     // OpContext::workspace_bytes
};

struct PagedAttentionPlan {
  bool rows = false;           // launch v1 or v2 over (T, Hq)
  bool v2 = false;             // ... split into max_partitions, plus the reduction
  int64_t max_partitions = 0;  // v2: ceil(max_seq_len / kPartitionSize)
  bool prefill_tiled = false;  // the row kernels leave the rows of q_len > 1 to the tiled one
  int64_t prefill_tiles = 0;   // grid x of the tiled prefill kernel; 0 = not launched
  size_t workspace_bytes = 0;  // of OpContext::workspace that v2 uses
};

// The plan for one call; "" on success, else what is wrong (without the op's name):
// inconsistent host query_start_loc, kV2 without max_seq_len or without enough workspace.
inline std::string PlanPagedAttention(const PagedAttentionPlanInput& in, PagedAttentionPlan* plan) {
  *plan = {};
  const std::span<const int32_t> qsl = in.query_start_loc_host;
  int64_t decode_seqs = 0, prefill_tiles = 0;
  if (!qsl.empty()) {
    if (static_cast<int64_t>(qsl.size()) != in.num_seqs + 1) {
      return "query_start_loc_host has " + std::to_string(qsl.size()) + " entries, expected " +
             std::to_string(in.num_seqs + 1);
    }
    if (qsl.front() != 0 || qsl.back() != in.num_tokens) {
      return "query_start_loc_host must run from 0 to " + std::to_string(in.num_tokens) + ", got " +
             std::to_string(qsl.front()) + " .. " + std::to_string(qsl.back());
    }
    for (int64_t s = 0; s < in.num_seqs; ++s) {
      const int64_t q_len = static_cast<int64_t>(qsl[s + 1]) - qsl[s];
      if (q_len < 0) {
        return "query_start_loc_host decreases at sequence " + std::to_string(s) + " (" +
               std::to_string(qsl[s]) + " then " + std::to_string(qsl[s + 1]) + ")";
      }
      if (q_len == 1) ++decode_seqs;
      if (q_len > 1) prefill_tiles += (q_len + kPrefillTileRows - 1) / kPrefillTileRows;
    }
  }
  const bool known = !qsl.empty();
  bool want_v2 = false;
  switch (in.version) {
    case PagedAttentionVersion::kV1:
    case PagedAttentionVersion::kV2:
      // Every row through the row kernels, prefill chunks included.
      plan->rows = true;
      want_v2 = in.version == PagedAttentionVersion::kV2;
      if (want_v2 && in.max_seq_len <= 0)
        return "v2 needs metadata.max_seq_len > 0 to size its grid";
      break;
    case PagedAttentionVersion::kAuto:
      plan->prefill_tiled = true;
      plan->rows = !known || decode_seqs > 0;
      plan->prefill_tiles =
          known ? prefill_tiles
                : (in.num_tokens + kPrefillTileRows - 1) / kPrefillTileRows + in.num_seqs;
      // Split the context when there are too few (row, head) blocks to fill the device.
      want_v2 = plan->rows && in.max_seq_len > kPartitionSize &&
                in.num_tokens * in.num_heads <= kMaxSplitKRowHeads;
      break;
  }
  if (!want_v2) return {};
  const size_t need =
      SplitKWorkspaceBytes(in.num_tokens, in.num_heads, in.head_size, in.max_seq_len);
  if (need > in.workspace_bytes) {
    if (in.version == PagedAttentionVersion::kAuto) return {};  // v1: right, slower
    return "v2 needs a workspace of " + std::to_string(need) +
           " bytes (OpContext::workspace), got " + std::to_string(in.workspace_bytes);
  }
  plan->v2 = true;
  plan->max_partitions = (in.max_seq_len + kPartitionSize - 1) / kPartitionSize;
  plan->workspace_bytes = need;
  return {};
}

}  // namespace llm::ops::cuda

#endif  // LLM_KERNELS_CUDA_PAGED_ATTENTION_PLAN_H_
