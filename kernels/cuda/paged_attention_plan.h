// The host-side decisions of the CUDA PagedAttention launcher, as plain functions of sizes and
// host data, so that they are unit-tested without a device (tests/unit/kernels): which kernels
// a batch needs, the tiled prefill kernel's grid, and the split-K (v2) workspace of the f32
// path (f32 queries); the 16-bit path's decode split (PlanDecode, below).
//
// Kernels of the f32 path (kernels/cuda/paged_attention.cu):
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
// v2's workspace (tmp_out [T, Hq, P, D], then (max_logit, exp_sum) pairs [T, Hq, P, 2], f32;
// P = ceil(K / kPartitionSize), K = max_seq_len, or min(max_seq_len, W) with a sliding window
// W: v2's partitions cover each row's window only) is the caller's: OpContext::workspace,
// allocated once with PagedAttentionWorkspaceBytes. The launcher never allocates.
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

// ---------------------------------------------------------------------------------------------
// The 16-bit decode kernel (paged_attention_decode.cu): one CTA of kDecodeThreads threads per
// (sequence, KV head, chunk of at most kDecodeMaxGroup of its query heads, KV split), over the
// sequences with q_len == 1. A split covers split_keys consecutive positions (a multiple of
// kDecodeSplitAlign); with more than one split each CTA writes its (max, sum, unnormalized
// output) per query head to OpContext::workspace, laid out as
//   part_out [S, Hq, num_splits, D], then part_ml [S, Hq, num_splits, 2] (max, sum), f32,
// and a reduction kernel per (sequence, query head) merges them.
inline constexpr int kDecodeThreads = 128;
inline constexpr int kDecodeMaxGroup = 8;
// A split is at least this many keys (fewer would cost more in the reduction than they save).
inline constexpr int kDecodeMinSplitKeys = 256;
inline constexpr int kDecodeSplitAlign = 64;

// With a sliding window W > 0 the decode kernel reads a context of ctx keys from
// DecodeWindowStart: the window's first position ctx - W rounded down to a multiple of
// kDecodeSplitAlign (so that its tiles stay aligned to the pages; the positions before the
// window are masked, never loaded), and its splits cover the DecodeKeys positions from there.
inline int64_t DecodeWindowStart(int64_t ctx, int64_t window) {
  return window > 0 && ctx > window ? (ctx - window) / kDecodeSplitAlign * kDecodeSplitAlign : 0;
}
inline int64_t DecodeKeys(int64_t ctx, int64_t window) {
  return ctx - DecodeWindowStart(ctx, window);
}
// CTAs of kDecodeThreads resident per SM taken as one wave; the plan aims at two waves.
inline constexpr int kDecodeCtasPerSm = 4;
// The most (sequence, query head, split) partials a plan writes: bounds the workspace.
inline constexpr int64_t kDecodeMaxPartials = 16384;

// Bytes of workspace for `partials` (sequence, query head, split) triples of head_size.
inline size_t DecodePartialBytes(int64_t partials, int64_t head_size) {
  if (partials <= 0 || head_size <= 0) return 0;
  return static_cast<size_t>(partials * (head_size + 2)) * sizeof(float);
}

// The workspace that lets kAuto split every batch it would split, for batches of at most
// max_num_tokens tokens over contexts of at most max_model_len: the f32 path's v2 (which
// splits only when T * Hq <= kMaxSplitKRowHeads) and the 16-bit decode kernel's partials
// (at most kDecodeMaxPartials, and at most one per kDecodeMinSplitKeys keys of context per
// query head of each sequence). The two paths never run in one call, so the larger.
// Allocate it once (a worker: beside the KV cache, counted by memory profiling).
inline size_t PagedAttentionWorkspaceBytes(int64_t max_num_tokens, int64_t num_heads,
                                           int64_t head_size, int64_t max_model_len) {
  if (num_heads <= 0 || head_size <= 0 || max_num_tokens <= 0) return 0;
  size_t v2 = 0;
  if (max_model_len > kPartitionSize) {
    int64_t rows = max_num_tokens;
    if (rows * num_heads > kMaxSplitKRowHeads) rows = kMaxSplitKRowHeads / num_heads;
    v2 = SplitKWorkspaceBytes(rows, num_heads, head_size, max_model_len);
  }
  size_t decode = 0;
  if (max_model_len > kDecodeMinSplitKeys) {
    const int64_t splits = (max_model_len + kDecodeMinSplitKeys - 1) / kDecodeMinSplitKeys;
    int64_t partials = kDecodeMaxPartials;
    if (max_num_tokens <= kDecodeMaxPartials / num_heads / splits) {
      partials = max_num_tokens * num_heads * splits;
    }
    decode = DecodePartialBytes(partials, head_size);
  }
  return v2 > decode ? v2 : decode;
}

struct DecodePlanInput {
  int64_t num_seqs = 0;      // S > 0
  int64_t num_heads = 0;     // Hq > 0
  int64_t num_kv_heads = 0;  // Hkv > 0, divides Hq
  int64_t head_size = 0;
  int num_sms = 0;                                // the device's SM count (<= 0: unknown, no split)
  int max_seq_len = 0;                            // metadata.max_seq_len (0 = unknown)
  std::span<const int32_t> query_start_loc_host;  // [S + 1] or empty (unknown)
  std::span<const int32_t> seq_lens_host;         // [S] or empty (unknown)
  size_t workspace_bytes = 0;                     // OpContext::workspace_bytes
  int sliding_window = 0;  // AttentionOptions::sliding_window: the keys split are DecodeKeys
};

struct DecodePlan {
  bool launch = false;        // some sequence may have q_len == 1
  int64_t decode_seqs = 0;    // sequences with q_len == 1 (S when the q_lens are unknown)
  int64_t group = 0;          // Hq / Hkv
  int64_t head_chunks = 0;    // ceil(group / kDecodeMaxGroup): grid y = Hkv * head_chunks
  int64_t heads_per_cta = 0;  // min(group, kDecodeMaxGroup)
  int64_t num_splits = 1;     // grid z; > 1: the partials and the reduction
  int64_t split_keys = 0;     // positions per split (num_splits > 1)
  size_t workspace_bytes = 0;
};

// The decode kernel's plan: CTAs = decode_seqs x Hkv x head_chunks; when that is less than two
// waves (2 x num_sms x kDecodeCtasPerSm) and the context is long, each sequence's context is
// split so that all sequences' splits make about two waves, the splits no shorter than
// kDecodeMinSplitKeys; the keys counted are seq_lens_host's (of the decode sequences) when
// given, else max_seq_len per sequence; without either, no split. With a sliding window the
// keys of a context are DecodeKeys (at most W + kDecodeSplitAlign - 1; that bound with
// max_seq_len only). The splits are cut to fit
// the workspace and kDecodeMaxPartials. "" on success, else what is wrong with the host
// metadata (without the op's name).
inline std::string PlanDecode(const DecodePlanInput& in, DecodePlan* plan) {
  *plan = {};
  plan->group = in.num_kv_heads > 0 ? in.num_heads / in.num_kv_heads : 0;
  plan->heads_per_cta = plan->group < kDecodeMaxGroup ? plan->group : kDecodeMaxGroup;
  plan->head_chunks = (plan->group + kDecodeMaxGroup - 1) / kDecodeMaxGroup;
  const std::span<const int32_t> qsl = in.query_start_loc_host, lens = in.seq_lens_host;
  if (!qsl.empty() && static_cast<int64_t>(qsl.size()) != in.num_seqs + 1) {
    return "query_start_loc_host has " + std::to_string(qsl.size()) + " entries, expected " +
           std::to_string(in.num_seqs + 1);
  }
  if (!lens.empty() && static_cast<int64_t>(lens.size()) != in.num_seqs) {
    return "seq_lens_host has " + std::to_string(lens.size()) + " entries, expected " +
           std::to_string(in.num_seqs);
  }
  int64_t decode_seqs = 0, total_keys = 0, max_len = 0;
  for (int64_t s = 0; s < in.num_seqs; ++s) {
    if (!qsl.empty()) {
      if (qsl[s + 1] < qsl[s]) {
        return "query_start_loc_host decreases at sequence " + std::to_string(s) + " (" +
               std::to_string(qsl[s]) + " then " + std::to_string(qsl[s + 1]) + ")";
      }
      if (qsl[s + 1] - qsl[s] != 1) continue;
    }
    ++decode_seqs;
    int64_t len = lens.empty() ? in.max_seq_len : lens[s];
    if (len > 0 && in.sliding_window > 0) {
      const int64_t bound = static_cast<int64_t>(in.sliding_window) + kDecodeSplitAlign - 1;
      len = lens.empty() ? (len < bound ? len : bound) : DecodeKeys(len, in.sliding_window);
    }
    if (len > 0) {
      total_keys += len;
      if (len > max_len) max_len = len;
    }
  }
  plan->decode_seqs = decode_seqs;
  plan->launch = decode_seqs > 0;
  if (!plan->launch) return {};
  const int64_t ctas = decode_seqs * in.num_kv_heads * plan->head_chunks;
  const int64_t target = 2 * static_cast<int64_t>(in.num_sms) * kDecodeCtasPerSm;
  if (in.num_sms <= 0 || ctas >= target || max_len <= kDecodeMinSplitKeys) return {};
  // Keys per split so that sum_s ceil(len_s / split_keys) x Hkv x head_chunks ~ target.
  const int64_t kv_ctas = in.num_kv_heads * plan->head_chunks;
  int64_t split_keys = (total_keys * kv_ctas + target - 1) / target;
  if (split_keys < kDecodeMinSplitKeys) split_keys = kDecodeMinSplitKeys;
  split_keys = (split_keys + kDecodeSplitAlign - 1) / kDecodeSplitAlign * kDecodeSplitAlign;
  int64_t splits = (max_len + split_keys - 1) / split_keys;
  // Fit the workspace and the partials' bound (partials indexed by sequence, all S of them).
  const int64_t per_split = in.num_seqs * in.num_heads;
  int64_t max_splits = kDecodeMaxPartials / per_split;
  const size_t split_bytes = DecodePartialBytes(per_split, in.head_size);
  const int64_t fit = split_bytes == 0 ? 0 : static_cast<int64_t>(in.workspace_bytes / split_bytes);
  if (fit < max_splits) max_splits = fit;
  if (max_splits > 65535) max_splits = 65535;  // grid z
  if (splits > max_splits) {
    if (max_splits <= 1) return {};
    split_keys = (max_len + max_splits - 1) / max_splits;
    split_keys = (split_keys + kDecodeSplitAlign - 1) / kDecodeSplitAlign * kDecodeSplitAlign;
    splits = (max_len + split_keys - 1) / split_keys;
  }
  if (splits <= 1) return {};
  plan->num_splits = splits;
  plan->split_keys = split_keys;
  plan->workspace_bytes = DecodePartialBytes(per_split * splits, in.head_size);
  return {};
}

struct PagedAttentionPlanInput {
  int64_t num_tokens = 0;  // T > 0
  int64_t num_heads = 0;   // Hq > 0
  int64_t head_size = 0;
  int64_t num_seqs = 0;    // S > 0
  int max_seq_len = 0;     // metadata.max_seq_len (0 = unknown)
  int sliding_window = 0;  // AttentionOptions::sliding_window: v2 partitions min(max_seq_len, W)
  PagedAttentionVersion version = PagedAttentionVersion::kAuto;
  std::span<const int32_t> query_start_loc_host;  // [S + 1] or empty (unknown)
  size_t workspace_bytes = 0;                     // OpContext::workspace_bytes
};

struct PagedAttentionPlan {
  bool rows = false;           // launch v1 or v2 over (T, Hq)
  bool v2 = false;             // ... split into max_partitions, plus the reduction
  int64_t max_partitions = 0;  // v2: ceil(K / kPartitionSize), K: the keys a row sees at most
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
  // The keys a row sees at most: max_seq_len, or the window when shorter.
  const int64_t max_keys = in.sliding_window > 0 && in.sliding_window < in.max_seq_len
                               ? in.sliding_window
                               : in.max_seq_len;
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
      want_v2 = plan->rows && max_keys > kPartitionSize &&
                in.num_tokens * in.num_heads <= kMaxSplitKRowHeads;
      break;
  }
  if (!want_v2) return {};
  const size_t need = SplitKWorkspaceBytes(in.num_tokens, in.num_heads, in.head_size, max_keys);
  if (need > in.workspace_bytes) {
    if (in.version == PagedAttentionVersion::kAuto) return {};  // v1: right, slower
    return "v2 needs a workspace of " + std::to_string(need) +
           " bytes (OpContext::workspace), got " + std::to_string(in.workspace_bytes);
  }
  plan->v2 = true;
  plan->max_partitions = (max_keys + kPartitionSize - 1) / kPartitionSize;
  plan->workspace_bytes = need;
  return {};
}

}  // namespace llm::ops::cuda

#endif  // LLM_KERNELS_CUDA_PAGED_ATTENTION_PLAN_H_
