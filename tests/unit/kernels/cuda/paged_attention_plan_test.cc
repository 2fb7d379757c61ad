// The CUDA PagedAttention launcher's host-side plan (kernels/cuda/paged_attention_plan.h): which
// kernels a batch needs, the prefill grid, v2's workspace (the fp32 path), and the 16-bit decode
// kernel's split-KV plan. Runs without a device.
#include "kernels/cuda/paged_attention_plan.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops::cuda {
namespace {

using V = PagedAttentionVersion;

// A plan for a batch given by its q_lens (known on the host unless host_qsl is false).
struct Planned {
  std::string error;
  PagedAttentionPlan plan;
};
Planned Plan(const std::vector<int32_t>& q_lens, V version = V::kAuto, bool host_qsl = true,
             int max_seq_len = 100, size_t workspace = 0, int64_t num_heads = 8,
             int sliding_window = 0) {
  std::vector<int32_t> qsl = {0};
  for (const int32_t q : q_lens) qsl.push_back(qsl.back() + q);
  PagedAttentionPlanInput in;
  in.num_tokens = qsl.back();
  in.num_heads = num_heads;
  in.head_size = 128;
  in.num_seqs = static_cast<int64_t>(q_lens.size());
  in.max_seq_len = max_seq_len;
  in.sliding_window = sliding_window;
  in.version = version;
  if (host_qsl) in.query_start_loc_host = qsl;
  in.workspace_bytes = workspace;
  Planned p;
  p.error = PlanPagedAttention(in, &p.plan);
  return p;
}

TEST(PagedAttentionPlan, DecodeOnlyBatchLaunchesNoPrefillKernel) {
  const Planned p = Plan({1, 1, 1, 1});
  ASSERT_EQ(p.error, "");
  EXPECT_TRUE(p.plan.rows);
  EXPECT_TRUE(p.plan.prefill_tiled);
  EXPECT_EQ(p.plan.prefill_tiles, 0);
  EXPECT_FALSE(p.plan.v2);
}

TEST(PagedAttentionPlan, PrefillOnlyBatchLaunchesNoRowKernel) {
  // Tiles of 16 rows: 17 -> 2, 16 -> 1, 33 -> 3; a sequence with no rows adds none.
  const Planned p = Plan({17, 16, 0, 33});
  ASSERT_EQ(p.error, "");
  EXPECT_FALSE(p.plan.rows);
  EXPECT_FALSE(p.plan.v2);
  EXPECT_EQ(p.plan.prefill_tiles, 6);
}

TEST(PagedAttentionPlan, MixedBatchSizesThePrefillGridFromTheChunksOnly) {
  // 1000 decode rows would have added ceil(1000 / 16) + S tiles to the old bound.
  std::vector<int32_t> q_lens(1000, 1);
  q_lens.push_back(2);
  q_lens.push_back(15);
  const Planned p = Plan(q_lens);
  ASSERT_EQ(p.error, "");
  EXPECT_TRUE(p.plan.rows);
  EXPECT_EQ(p.plan.prefill_tiles, 2);
}

TEST(PagedAttentionPlan, WithoutHostQueryLengthsBothKernelsRunOverTheBound) {
  const Planned p = Plan({1, 17, 1}, V::kAuto, /*host_qsl=*/false);
  ASSERT_EQ(p.error, "");
  EXPECT_TRUE(p.plan.rows);
  EXPECT_EQ(p.plan.prefill_tiles, (19 + 15) / 16 + 3);
}

TEST(PagedAttentionPlan, ExplicitVersionsRunEveryRowThroughTheRowKernels) {
  for (const V v : {V::kV1, V::kV2}) {
    const Planned p = Plan({17, 1}, v, true, 100, /*workspace=*/size_t{1} << 30);
    ASSERT_EQ(p.error, "");
    EXPECT_TRUE(p.plan.rows);
    EXPECT_FALSE(p.plan.prefill_tiled);
    EXPECT_EQ(p.plan.prefill_tiles, 0);
    EXPECT_EQ(p.plan.v2, v == V::kV2);
  }
}

TEST(PagedAttentionPlan, AutoSplitsLongContextsOfSmallBatchesInTheWorkspace) {
  // 2 rows x 8 heads over 1300 keys: 3 partitions of (128 + 2) floats each.
  const size_t need = SplitKWorkspaceBytes(2, 8, 128, 1300);
  EXPECT_EQ(need, size_t{2 * 8 * 3 * 130 * 4});
  Planned p = Plan({1, 1}, V::kAuto, true, 1300, need);
  ASSERT_EQ(p.error, "");
  EXPECT_TRUE(p.plan.v2);
  EXPECT_EQ(p.plan.max_partitions, 3);
  EXPECT_EQ(p.plan.workspace_bytes, need);
  // Too little workspace: v1, never an error, never an allocation.
  p = Plan({1, 1}, V::kAuto, true, 1300, need - 1);
  ASSERT_EQ(p.error, "");
  EXPECT_FALSE(p.plan.v2);
  // Short contexts or many (row, head) pairs: v1.
  EXPECT_FALSE(Plan({1, 1}, V::kAuto, true, 512, need).plan.v2);
  EXPECT_FALSE(Plan(std::vector<int32_t>(65, 1), V::kAuto, true, 1300, size_t{1} << 30).plan.v2);
  // No decode rows: no row kernel, so no split either.
  EXPECT_FALSE(Plan({20}, V::kAuto, true, 1300, size_t{1} << 30).plan.v2);
}

// With a sliding window v2 partitions the window only: min(max_seq_len, W) keys; a window of
// at most one partition does not split in kAuto.
TEST(PagedAttentionPlan, V2PartitionsTheWindowOnly) {
  const size_t big = size_t{1} << 30;
  const Planned whole = Plan({1, 1}, V::kV2, true, 4096, big);
  ASSERT_EQ(whole.error, "");
  EXPECT_EQ(whole.plan.max_partitions, 8);
  const Planned windowed = Plan({1, 1}, V::kV2, true, 4096, big, 8, 1000);
  ASSERT_EQ(windowed.error, "");
  EXPECT_EQ(windowed.plan.max_partitions, 2);
  EXPECT_EQ(windowed.plan.workspace_bytes, SplitKWorkspaceBytes(2, 8, 128, 1000));
  EXPECT_EQ(Plan({1, 1}, V::kV2, true, 300, big, 8, 1000).plan.max_partitions, 1);
  EXPECT_TRUE(Plan({1, 1}, V::kAuto, true, 4096, big, 8, 1000).plan.v2);
  EXPECT_FALSE(Plan({1, 1}, V::kAuto, true, 4096, big, 8, 512).plan.v2);
}

TEST(PagedAttentionPlan, V2NeedsMaxSeqLenAndEnoughWorkspace) {
  EXPECT_EQ(Plan({1}, V::kV2, true, 0, size_t{1} << 30).error,
            "v2 needs metadata.max_seq_len > 0 to size its grid");
  const size_t need = SplitKWorkspaceBytes(1, 8, 128, 600);
  EXPECT_EQ(Plan({1}, V::kV2, true, 600, need - 4).error,
            "v2 needs a workspace of " + std::to_string(need) +
                " bytes (OpContext::workspace), got " + std::to_string(need - 4));
  EXPECT_EQ(Plan({1}, V::kV2, true, 600, need).error, "");
}

TEST(PagedAttentionPlan, InconsistentHostQueryStartLocIsAnError) {
  PagedAttentionPlanInput in;
  in.num_tokens = 4;
  in.num_heads = 8;
  in.head_size = 64;
  in.num_seqs = 2;
  PagedAttentionPlan plan;
  const std::vector<int32_t> wrong_size = {0, 4}, wrong_end = {0, 1, 3}, decreasing = {0, 5, 4};
  in.query_start_loc_host = wrong_size;
  EXPECT_EQ(PlanPagedAttention(in, &plan), "query_start_loc_host has 2 entries, expected 3");
  in.query_start_loc_host = wrong_end;
  EXPECT_EQ(PlanPagedAttention(in, &plan), "query_start_loc_host must run from 0 to 4, got 0 .. 3");
  in.query_start_loc_host = decreasing;
  EXPECT_EQ(PlanPagedAttention(in, &plan),
            "query_start_loc_host decreases at sequence 1 (5 then 4)");
}

// The workspace a worker allocates once covers every batch kAuto would split, on either path.
TEST(PagedAttentionWorkspace, CoversEveryBatchAutoSplits) {
  constexpr int64_t kHeads = 32, kHeadSize = 128, kMaxModelLen = 8192;
  const size_t bytes =
      ops::PagedAttentionWorkspaceBytes(/*max_num_tokens=*/2048, kHeads, kHeadSize, kMaxModelLen);
  // The fp32 path splits only at T * Hq <= 512: 16 rows of 32 heads, 16 partitions of 130
  // floats; the decode kernel writes at most kDecodeMaxPartials partials of 130 floats.
  EXPECT_EQ(bytes, size_t{kDecodeMaxPartials * 130 * 4});
  EXPECT_GE(bytes, size_t{16 * 32 * 16 * 130 * 4});
  for (int64_t rows = 1; rows <= 2048; rows *= 2) {
    std::vector<int32_t> q_lens(rows, 1);
    const Planned p = Plan(q_lens, V::kAuto, true, kMaxModelLen, bytes, kHeads);
    ASSERT_EQ(p.error, "");
    EXPECT_EQ(p.plan.v2, rows * kHeads <= kMaxSplitKRowHeads) << rows << " rows";
    EXPECT_LE(p.plan.workspace_bytes, bytes);
  }
  // Fewer tokens than the cap: sized by them (the decode kernel: up to one split per 256 keys
  // of each sequence and head). A max_model_len of 256 or less: neither path splits.
  EXPECT_EQ(ops::PagedAttentionWorkspaceBytes(4, kHeads, kHeadSize, kMaxModelLen),
            DecodePartialBytes(4 * kHeads * (kMaxModelLen / kDecodeMinSplitKeys), kHeadSize));
  EXPECT_EQ(ops::PagedAttentionWorkspaceBytes(2048, kHeads, kHeadSize, 256), 0u);
  // Long contexts of 16 rows: the fp32 path's 65536 partials are more than the decode cap.
  EXPECT_EQ(ops::PagedAttentionWorkspaceBytes(16, kHeads, kHeadSize, 65536),
            SplitKWorkspaceBytes(16, kHeads, kHeadSize, 65536));
}

// ---------------------------------------------------------------------------------------------
// The 16-bit decode kernel's plan.

struct Decode {
  std::vector<int32_t> lens;    // seq_lens
  std::vector<int32_t> q_lens;  // empty: all 1
  int64_t heads = 32, kv_heads = 8, head_size = 128;
  int num_sms = 132;
  int max_seq_len = 0;  // 0: the largest of lens
  bool host_lens = true, host_qsl = true;
  size_t workspace = size_t{1} << 40;
  int sliding_window = 0;
};

struct DecodePlanned {
  std::string error;
  DecodePlan plan;
};
DecodePlanned PlanOf(const Decode& d) {
  std::vector<int32_t> qsl = {0};
  for (size_t s = 0; s < d.lens.size(); ++s) {
    qsl.push_back(qsl.back() + (d.q_lens.empty() ? 1 : d.q_lens[s]));
  }
  DecodePlanInput in;
  in.num_seqs = static_cast<int64_t>(d.lens.size());
  in.num_heads = d.heads;
  in.num_kv_heads = d.kv_heads;
  in.head_size = d.head_size;
  in.num_sms = d.num_sms;
  int max_len = 0;
  for (const int32_t l : d.lens) max_len = std::max(max_len, l);
  in.max_seq_len = d.max_seq_len > 0 ? d.max_seq_len : max_len;
  if (d.host_qsl) in.query_start_loc_host = qsl;
  if (d.host_lens) in.seq_lens_host = d.lens;
  in.workspace_bytes = d.workspace;
  in.sliding_window = d.sliding_window;
  DecodePlanned p;
  p.error = PlanDecode(in, &p.plan);
  return p;
}

// Llama-3-8B (32 query heads over 8 KV heads) on 132 SMs: two waves are 1056 CTAs.
TEST(DecodePlan, OneLongSequenceIsSplitIntoAboutTwoWaves) {
  const DecodePlanned p = PlanOf({.lens = {32768}});
  ASSERT_EQ(p.error, "");
  EXPECT_TRUE(p.plan.launch);
  EXPECT_EQ(p.plan.group, 4);
  EXPECT_EQ(p.plan.heads_per_cta, 4);
  EXPECT_EQ(p.plan.head_chunks, 1);
  EXPECT_EQ(p.plan.split_keys, 256);  // ceil(32768 x 8 / 1056) = 249, to a multiple of 64
  EXPECT_EQ(p.plan.num_splits, 128);  // 8 x 128 = 1024 CTAs
  EXPECT_EQ(p.plan.workspace_bytes, DecodePartialBytes(32 * 128, 128));
}

TEST(DecodePlan, SplitsAreNeverShorterThanTheMinimum) {
  const DecodePlanned p = PlanOf({.lens = {1000, 15}});
  EXPECT_EQ(p.plan.split_keys, kDecodeMinSplitKeys);
  EXPECT_EQ(p.plan.num_splits, 4);  // ceil(1000 / 256)
  // A context of at most one minimum split: never split.
  EXPECT_EQ(PlanOf({.lens = {256, 3}}).plan.num_splits, 1);
  EXPECT_EQ(PlanOf({.lens = {257}}).plan.num_splits, 2);
}

TEST(DecodePlan, NoSplitWhenTheBatchFillsTheDevice) {
  Decode d;
  d.lens.assign(132, 4000);  // 132 x 8 = 1056 CTAs: two waves already
  EXPECT_EQ(PlanOf(d).plan.num_splits, 1);
  d.lens.assign(131, 4000);  // 1048 CTAs: a split of ceil(131 x 4000 x 8 / 1056) -> 4032
  EXPECT_EQ(PlanOf(d).plan.num_splits, 1);  // keys is all of 4000: no split either
  d.lens.assign(100, 4000);  // 800 CTAs: ceil(100 x 4000 x 8 / 1056) = 3031 -> 3072 keys
  const DecodePlanned p = PlanOf(d);
  EXPECT_EQ(p.plan.split_keys, 3072);
  EXPECT_EQ(p.plan.num_splits, 2);
  // A bigger device splits more; an unknown SM count never.
  d.num_sms = 264;
  EXPECT_GT(PlanOf(d).plan.num_splits, 2);
  d.num_sms = 0;
  EXPECT_EQ(PlanOf(d).plan.num_splits, 1);
}

// The keys counted are the host seq_lens' when given (a batch of one long and many short
// sequences splits its long one finer), else max_seq_len per sequence; neither: no split.
TEST(DecodePlan, HostSeqLensPlanFromTheTrueLengths) {
  Decode d;
  d.lens.assign(40, 20);
  d.lens.push_back(20000);
  const DecodePlanned known = PlanOf(d);
  d.host_lens = false;
  const DecodePlanned bound = PlanOf(d);
  EXPECT_LT(known.plan.split_keys, bound.plan.split_keys);
  EXPECT_GE(known.plan.num_splits * known.plan.split_keys, 20000);
  EXPECT_GE(bound.plan.num_splits * bound.plan.split_keys, 20000);
  DecodePlanInput in;
  in.num_seqs = 1;
  in.num_heads = 32;
  in.num_kv_heads = 8;
  in.head_size = 128;
  in.num_sms = 132;
  in.workspace_bytes = size_t{1} << 30;
  DecodePlan plan;
  EXPECT_EQ(PlanDecode(in, &plan), "");
  EXPECT_TRUE(plan.launch);
  EXPECT_EQ(plan.num_splits, 1);
}

// With a sliding window W the keys split are DecodeKeys: from the window's first position
// rounded down to a multiple of 64 (the host seq_lens'), or at most W + 63 (max_seq_len only).
TEST(DecodePlan, AWindowSplitsItsKeysOnly) {
  EXPECT_EQ(DecodeWindowStart(1000, 0), 0);
  EXPECT_EQ(DecodeWindowStart(1000, 1000), 0);
  EXPECT_EQ(DecodeWindowStart(1000, 700), 256);  // 300 rounded down
  EXPECT_EQ(DecodeWindowStart(1000, 1), 960);    // 999 rounded down
  EXPECT_EQ(DecodeKeys(1000, 700), 744);
  EXPECT_EQ(DecodeKeys(1000, 4096), 1000);
  // 4096 keys (32768 - 4096 is a multiple of 64) in splits of 256.
  EXPECT_EQ(PlanOf({.lens = {32768}, .sliding_window = 4096}).plan.num_splits, 16);
  EXPECT_EQ(PlanOf({.lens = {32768}, .sliding_window = 4000}).plan.num_splits,
            16);  // 4032 keys in splits of 256
  // A window of at most one split: no split, however long the context.
  EXPECT_EQ(PlanOf({.lens = {32768}, .sliding_window = 100}).plan.num_splits, 1);
  EXPECT_EQ(PlanOf({.lens = {1000, 15}, .sliding_window = 700}).plan.num_splits, 3);
  // max_seq_len only: the bound W + 63.
  const DecodePlanned bound = PlanOf({.lens = {32768}, .host_lens = false, .sliding_window = 4000});
  EXPECT_GE(bound.plan.num_splits * bound.plan.split_keys, 4000 + 63);
  EXPECT_LE(bound.plan.num_splits * bound.plan.split_keys, 4096 + 256);
}

// With the q_lens known, prefill chunks are not the decode kernel's: not counted, and a batch
// without decode rows launches nothing. Without them every sequence may be a decode row.
TEST(DecodePlan, OnlyDecodeRowsCount) {
  EXPECT_FALSE(PlanOf({.lens = {100, 40}, .q_lens = {100, 7}}).plan.launch);
  const DecodePlanned p = PlanOf({.lens = {100, 40, 9}, .q_lens = {100, 1, 0}});
  EXPECT_TRUE(p.plan.launch);
  EXPECT_EQ(p.plan.decode_seqs, 1);
  EXPECT_EQ(
      PlanOf({.lens = {100, 40, 9}, .q_lens = {100, 1, 0}, .host_qsl = false}).plan.decode_seqs, 3);
}

TEST(DecodePlan, LargeGroupsGoInChunksOfEight) {
  const DecodePlanned p = PlanOf({.lens = {10}, .heads = 64, .kv_heads = 2});
  EXPECT_EQ(p.plan.group, 32);
  EXPECT_EQ(p.plan.heads_per_cta, 8);
  EXPECT_EQ(p.plan.head_chunks, 4);
  const DecodePlanned mha = PlanOf({.lens = {10}, .heads = 8, .kv_heads = 8});
  EXPECT_EQ(mha.plan.heads_per_cta, 1);
  EXPECT_EQ(mha.plan.head_chunks, 1);
}

// Less workspace splits less (never more than fits); none: no split.
TEST(DecodePlan, SplitsFitTheWorkspace) {
  Decode d{.lens = {32768}};
  const size_t per_split = DecodePartialBytes(32, 128);
  d.workspace = per_split * 10;
  DecodePlanned p = PlanOf(d);
  EXPECT_LE(p.plan.num_splits, 10);
  EXPECT_GT(p.plan.num_splits, 1);
  EXPECT_LE(p.plan.workspace_bytes, d.workspace);
  EXPECT_GE(p.plan.num_splits * p.plan.split_keys, 32768);
  d.workspace = per_split;
  EXPECT_EQ(PlanOf(d).plan.num_splits, 1);
  d.workspace = 0;
  EXPECT_EQ(PlanOf(d).plan.num_splits, 1);
}

TEST(DecodePlan, InconsistentHostMetadataIsAnError) {
  DecodePlanInput in;
  in.num_seqs = 2;
  in.num_heads = 8;
  in.num_kv_heads = 2;
  in.head_size = 64;
  const std::vector<int32_t> lens1 = {5}, qsl2 = {0, 1}, decreasing = {0, 2, 1};
  DecodePlan plan;
  in.seq_lens_host = lens1;
  EXPECT_EQ(PlanDecode(in, &plan), "seq_lens_host has 1 entries, expected 2");
  in.seq_lens_host = {};
  in.query_start_loc_host = qsl2;
  EXPECT_EQ(PlanDecode(in, &plan), "query_start_loc_host has 2 entries, expected 3");
  in.query_start_loc_host = decreasing;
  EXPECT_EQ(PlanDecode(in, &plan), "query_start_loc_host decreases at sequence 1 (2 then 1)");
}

// Random batches with the workspace PagedAttentionWorkspaceBytes gives for them: the plan is
// never cut by it, covers every context, keeps the split rules and the grid's limits.
TEST(DecodePlan, RandomBatchesWithTheWorkerWorkspace) {
  std::mt19937 rng(17);
  for (int iter = 0; iter < 2000; ++iter) {
    Decode d;
    const int64_t kv_heads[] = {1, 2, 4, 8};
    d.kv_heads = kv_heads[rng() % 4];
    d.heads = d.kv_heads * (1 + static_cast<int64_t>(rng() % 16));
    d.head_size = rng() % 2 ? 64 : 128;
    d.num_sms = 1 + static_cast<int>(rng() % 200);
    const int max_model_len = 1 + static_cast<int>(rng() % 65536);
    const int num_seqs = 1 + static_cast<int>(rng() % 300);
    for (int s = 0; s < num_seqs; ++s)
      d.lens.push_back(1 + static_cast<int32_t>(rng() % max_model_len));
    d.host_lens = rng() % 2;
    d.workspace = ops::PagedAttentionWorkspaceBytes(num_seqs, d.heads, d.head_size, max_model_len);
    const DecodePlanned p = PlanOf(d);
    Decode unlimited = d;
    unlimited.workspace = size_t{1} << 50;
    const DecodePlanned q = PlanOf(unlimited);
    ASSERT_EQ(p.error, "");
    SCOPED_TRACE(::testing::Message() << "iteration " << iter);
    EXPECT_LE(p.plan.workspace_bytes, d.workspace);
    EXPECT_LE(p.plan.num_splits, 65535);
    int max_len = 0;
    for (const int32_t l : d.lens) max_len = std::max(max_len, l);
    if (p.plan.num_splits > 1) {
      EXPECT_GE(p.plan.num_splits * p.plan.split_keys, max_len);
      EXPECT_LT((p.plan.num_splits - 1) * p.plan.split_keys, max_len);
      EXPECT_EQ(p.plan.split_keys % kDecodeSplitAlign, 0);
      EXPECT_GE(p.plan.split_keys, kDecodeMinSplitKeys);
      EXPECT_LE(num_seqs * d.heads * p.plan.num_splits, kDecodeMaxPartials);
    }
    // Only the partials' cap can cut it, never a worker workspace.
    if (num_seqs * d.heads * q.plan.num_splits <= kDecodeMaxPartials) {
      EXPECT_EQ(p.plan.num_splits, q.plan.num_splits);
    }
  }
}

// The dispatcher checks the host q_lens' length on every backend (the CPU op ignores them).
TEST(PagedAttentionPlan, DispatcherChecksTheHostQueryStartLocLength) {
  std::mt19937 rng(1);
  HostTensor query = testing::Random({2, 2, 4}, rng), out = testing::Poisoned({2, 2, 4});
  HostTensor kc = testing::Random({2, 4, 1, 4}, rng), vc = testing::Random({2, 4, 1, 4}, rng);
  HostTensor tables = testing::Indices({0, 1}, DType::kI32, {2, 1});
  HostTensor lens = testing::Indices({1, 1}, DType::kI32);
  HostTensor qsl = testing::Indices({0, 1, 2}, DType::kI32);
  AttentionMetadata md{tables.view(), lens.view(), qsl.view(), 1};
  const std::vector<int32_t> host_qsl = {0, 1, 2}, short_qsl = {0, 2};
  md.query_start_loc_host = host_qsl;
  EXPECT_TRUE(PagedAttention({}, out.view(), query.view(), kc.view(), vc.view(), md, 0.5f).ok());
  md.query_start_loc_host = short_qsl;
  EXPECT_EQ(PagedAttention({}, out.view(), query.view(), kc.view(), vc.view(), md, 0.5f).message,
            "PagedAttention: metadata.query_start_loc_host: expected 3 entries (or none), got 2");
  // The host seq_lens too; and the 16-bit path is the CUDA backend's only.
  const std::vector<int32_t> short_lens = {1};
  md.query_start_loc_host = host_qsl;
  md.seq_lens_host = short_lens;
  EXPECT_EQ(PagedAttention({}, out.view(), query.view(), kc.view(), vc.view(), md, 0.5f).message,
            "PagedAttention: metadata.seq_lens_host: expected 2 entries (or none), got 1");
  md.seq_lens_host = {};
  HostTensor q16(DType::kBF16, {2, 2, 4}), out16(DType::kBF16, {2, 2, 4});
  HostTensor kc16(DType::kBF16, {2, 4, 1, 4}), vc16(DType::kBF16, {2, 4, 1, 4});
  EXPECT_EQ(
      PagedAttention({}, out16.view(), q16.view(), kc16.view(), vc16.view(), md, 0.5f).message,
      "PagedAttention: query: the CPU backend takes f32 queries, got bf16 [2, 2, 4] on cpu");
}

}  // namespace
}  // namespace llm::ops::cuda
