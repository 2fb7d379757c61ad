// The CUDA PagedAttention launcher's host-side plan (kernels/cuda/paged_attention_plan.h): which
// kernels a batch needs, the prefill grid, v2's workspace. Runs without a device.
#include "kernels/cuda/paged_attention_plan.h"

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
             int max_seq_len = 100, size_t workspace = 0, int64_t num_heads = 8) {
  std::vector<int32_t> qsl = {0};
  for (const int32_t q : q_lens) qsl.push_back(qsl.back() + q);
  PagedAttentionPlanInput in;
  in.num_tokens = qsl.back();
  in.num_heads = num_heads;
  in.head_size = 128;
  in.num_seqs = static_cast<int64_t>(q_lens.size());
  in.max_seq_len = max_seq_len;
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

// The workspace a worker allocates once covers every batch kAuto would split.
TEST(PagedAttentionWorkspace, CoversEveryBatchAutoSplits) {
  constexpr int64_t kHeads = 32, kHeadSize = 128, kMaxModelLen = 8192;
  const size_t bytes =
      ops::PagedAttentionWorkspaceBytes(/*max_num_tokens=*/2048, kHeads, kHeadSize, kMaxModelLen);
  // kAuto splits only at T * Hq <= 512: 16 rows of 32 heads, 16 partitions of 130 floats.
  EXPECT_EQ(bytes, size_t{16 * 32 * 16 * 130 * 4});
  for (int64_t rows = 1; rows <= 2048; rows *= 2) {
    std::vector<int32_t> q_lens(rows, 1);
    const Planned p = Plan(q_lens, V::kAuto, true, kMaxModelLen, bytes, kHeads);
    ASSERT_EQ(p.error, "");
    EXPECT_EQ(p.plan.v2, rows * kHeads <= kMaxSplitKRowHeads) << rows << " rows";
    EXPECT_LE(p.plan.workspace_bytes, bytes);
  }
  // Fewer tokens than the cap: sized by them. Short max_model_len: kAuto never splits.
  EXPECT_EQ(ops::PagedAttentionWorkspaceBytes(4, kHeads, kHeadSize, kMaxModelLen),
            SplitKWorkspaceBytes(4, kHeads, kHeadSize, kMaxModelLen));
  EXPECT_EQ(ops::PagedAttentionWorkspaceBytes(2048, kHeads, kHeadSize, 512), 0u);
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
}

}  // namespace
}  // namespace llm::ops::cuda
