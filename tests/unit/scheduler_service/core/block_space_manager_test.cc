#include "scheduler_service/core/block_space_manager.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/scheduler_service/core/fake_kv_cache.h"

namespace llm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr int kBs = 16;

std::vector<TokenId> Range(int n, int first = 100) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

BlockSpaceManagerConfig Config(int gpu, int cpu = 0, double watermark = 0, bool caching = false) {
  return {.block_size = kBs,
          .num_gpu_blocks = gpu,
          .num_cpu_blocks = cpu,
          .watermark = watermark,
          .enable_prefix_caching = caching};
}

std::vector<BlockId> Ids(const BlockSpaceManager& m, SeqId seq) {
  const BlockTable* t = m.GetBlockTable(seq);
  return t == nullptr ? std::vector<BlockId>{}
                      : std::vector<BlockId>(t->block_ids().begin(), t->block_ids().end());
}

void ExpectInvariants(const BlockSpaceManager& m) {
  const absl::Status s = m.CheckInvariants();
  EXPECT_TRUE(s.ok()) << s;
}

TEST(BlockSpaceManagerConfig, ValidateNamesFieldValueAndRange) {
  EXPECT_TRUE(Config(10).Validate().ok());
  absl::Status s = Config(0).Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("num_gpu_blocks is 0; it must be >= 1"));
  s = Config(10, 0, 1.5).Validate();
  EXPECT_THAT(s.message(), HasSubstr("watermark is 1.5; it must be in [0, 1)"));
  BlockSpaceManagerConfig c = Config(10);
  c.block_size = 0;
  EXPECT_THAT(c.Validate().message(), HasSubstr("block_size is 0"));
}

TEST(BlockSpaceManagerDeathTest, AnInvalidConfigFailsWithItsOwnMessage) {
  BlockSpaceManagerConfig c = Config(10);
  c.block_size = 0;
  EXPECT_DEATH(BlockSpaceManager{c}, "block_size is 0; it must be in \\[1, 1024\\]");
}

TEST(BlockSpaceManager, AllocateAndFreeReturnEveryBlock) {
  BlockSpaceManager m(Config(10));
  ASSERT_EQ(m.Allocate(1, Range(33)).value(), 0);  // 3 blocks, nothing cached
  EXPECT_EQ(m.GetBlockTable(1)->num_blocks(), 3);
  EXPECT_EQ(m.GetBlockTable(1)->num_tokens(), 33);
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 7);
  EXPECT_DOUBLE_EQ(m.stats().gpu_usage, 0.3);
  ExpectInvariants(m);
  ASSERT_TRUE(m.Free(1).ok());
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 10);
  EXPECT_EQ(m.GetBlockTable(1), nullptr);
  ExpectInvariants(m);
}

TEST(BlockSpaceManager, NeverForAPromptLargerThanThePool) {
  BlockSpaceManager m(Config(4));
  EXPECT_EQ(m.CanAllocate(Range(64)), AllocStatus::kOk);
  EXPECT_EQ(m.CanAllocate(Range(65)), AllocStatus::kNever);
}

TEST(BlockSpaceManager, WatermarkRefusesAnAllocationThatWouldCrossIt) {
  BlockSpaceManager m(Config(100, 0, /*watermark=*/0.1));  // 10 blocks held back
  EXPECT_EQ(m.watermark_blocks(), 10);
  EXPECT_EQ(m.CanAllocate(Range(91 * kBs)), AllocStatus::kNever);
  EXPECT_EQ(m.CanAllocate(Range(90 * kBs)), AllocStatus::kOk);
  ASSERT_TRUE(m.Allocate(1, Range(85 * kBs)).ok());               // 15 free
  EXPECT_EQ(m.CanAllocate(Range(5 * kBs)), AllocStatus::kOk);     // leaves exactly 10
  EXPECT_EQ(m.CanAllocate(Range(6 * kBs)), AllocStatus::kLater);  // would leave 9
  ASSERT_TRUE(m.Free(1).ok());
  EXPECT_EQ(m.CanAllocate(Range(6 * kBs)), AllocStatus::kOk);
}

TEST(BlockSpaceManager, AllocateBeyondTheFreeBlocksFailsAndChangesNothing) {
  BlockSpaceManager m(Config(4));
  ASSERT_TRUE(m.Allocate(1, Range(48)).ok());
  const absl::StatusOr<int> r = m.Allocate(2, Range(32));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("sequence 2 needs 2 free GPU blocks; 1 are free"));
  EXPECT_EQ(m.GetBlockTable(2), nullptr);
  ExpectInvariants(m);
}

TEST(BlockSpaceManager, CallerBugsAreReportedNamingTheSequence) {
  BlockSpaceManager m(Config(8, 8));
  ASSERT_TRUE(m.Allocate(1, Range(20)).ok());
  EXPECT_EQ(m.Allocate(1, Range(20)).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(m.Allocate(2, {}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status s = m.Free(9);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("sequence 9"));
  ASSERT_TRUE(m.Free(1).ok());
  EXPECT_EQ(m.Free(1).code(), absl::StatusCode::kNotFound);  // double free
  ASSERT_TRUE(m.Allocate(3, Range(20)).ok());
  const SeqId three[] = {3};
  s = m.SwapIn(three).status();  // not swapped out
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("sequence 3 is on the gpu, not the cpu"));
  ASSERT_TRUE(m.SwapOut(three).ok());
  EXPECT_EQ(m.SwapOut(three).status().code(), absl::StatusCode::kFailedPrecondition);
  std::vector<BlockPair> copies;
  EXPECT_EQ(m.AppendSlots(3, 1, 0, &copies).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.Fork(3, 4).code(), absl::StatusCode::kFailedPrecondition);
  const SeqId twice[] = {3, 3};
  EXPECT_EQ(m.SwapIn(twice).status().code(), absl::StatusCode::kInvalidArgument);
  ExpectInvariants(m);
}

TEST(BlockSpaceManager, AppendSlotsAddsABlockOnlyWhenTheLastIsFull) {
  BlockSpaceManager m(Config(8));
  ASSERT_TRUE(m.Allocate(1, Range(15)).ok());
  std::vector<BlockPair> copies;
  ASSERT_TRUE(m.AppendSlots(1, 1, 0, &copies).ok());  // token 16 fills block 0
  EXPECT_EQ(m.GetBlockTable(1)->num_blocks(), 1);
  ASSERT_TRUE(m.AppendSlots(1, 1, 0, &copies).ok());  // token 17 needs block 1
  EXPECT_EQ(m.GetBlockTable(1)->num_blocks(), 2);
  EXPECT_EQ(m.GetBlockTable(1)->num_tokens(), 17);
  ASSERT_TRUE(m.AppendSlots(1, 1, /*lookahead=*/16, &copies).ok());
  EXPECT_EQ(m.GetBlockTable(1)->num_blocks(), 3);  // 18 tokens + 16 lookahead slots
  EXPECT_EQ(m.GetBlockTable(1)->num_tokens(), 18);
  EXPECT_THAT(copies, IsEmpty());
  ExpectInvariants(m);
}

TEST(BlockSpaceManager, AppendWithoutRoomIsRefusedAndChangesNothing) {
  BlockSpaceManager m(Config(2));
  ASSERT_TRUE(m.Allocate(1, Range(32)).ok());
  const SeqId one[] = {1};
  EXPECT_FALSE(m.CanAppendSlots(one, 1));
  std::vector<BlockPair> copies;
  EXPECT_EQ(m.AppendSlots(1, 1, 0, &copies).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(m.GetBlockTable(1)->num_tokens(), 32);
  ExpectInvariants(m);
}

TEST(BlockSpaceManager, ForkSharesEveryBlockAndCopyOnWriteSplitsTheLast) {
  BlockSpaceManager m(Config(8));
  FakeKvCache kv(8, 0, kBs);
  std::vector<TokenId> a = Range(20);
  ASSERT_TRUE(m.Allocate(1, a).ok());
  kv.Write(*m.GetBlockTable(1), a, 0, 20);
  ASSERT_TRUE(m.Fork(1, 2).ok());
  EXPECT_EQ(Ids(m, 1), Ids(m, 2));
  EXPECT_EQ(m.gpu_pool().block(Ids(m, 1)[0]).ref_cnt, 2);
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 6);  // sharing costs nothing
  const SeqId both[] = {1, 2};
  EXPECT_TRUE(m.CanAppendSlots(both, 1));

  // Sequence 2 writes its own token 20 into the shared, partly filled block 1: copied first.
  std::vector<TokenId> b = a;
  b.push_back(777);
  std::vector<BlockPair> copies;
  ASSERT_TRUE(m.AppendSlots(2, 1, 0, &copies).ok());
  ASSERT_THAT(copies, SizeIs(1));
  EXPECT_EQ(copies[0].src, Ids(m, 1)[1]);
  EXPECT_EQ(copies[0].dst, Ids(m, 2)[1]);
  EXPECT_EQ(Ids(m, 2)[0], Ids(m, 1)[0]);  // the full block stays shared
  kv.Copy(copies, Device::kGpu, Device::kGpu);
  kv.Write(*m.GetBlockTable(2), b, 20, 21);

  // Sequence 1 now holds its last block alone: written in place.
  a.push_back(555);
  copies.clear();
  ASSERT_TRUE(m.AppendSlots(1, 1, 0, &copies).ok());
  EXPECT_THAT(copies, IsEmpty());
  kv.Write(*m.GetBlockTable(1), a, 20, 21);

  EXPECT_EQ(kv.FirstMismatch(*m.GetBlockTable(1), a, 21), -1);
  EXPECT_EQ(kv.FirstMismatch(*m.GetBlockTable(2), b, 21), -1);
  ExpectInvariants(m);
  ASSERT_TRUE(m.Free(1).ok());
  ASSERT_TRUE(m.Free(2).ok());
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 8);
}

TEST(BlockSpaceManager, ForkAtABlockBoundaryNeedsNoCopy) {
  BlockSpaceManager m(Config(8));
  ASSERT_TRUE(m.Allocate(1, Range(32)).ok());
  ASSERT_TRUE(m.Fork(1, 2).ok());
  std::vector<BlockPair> copies;
  ASSERT_TRUE(m.AppendSlots(1, 1, 0, &copies).ok());
  ASSERT_TRUE(m.AppendSlots(2, 1, 0, &copies).ok());
  EXPECT_THAT(copies, IsEmpty());
  EXPECT_NE(Ids(m, 1)[2], Ids(m, 2)[2]);
  ExpectInvariants(m);
}

TEST(BlockSpaceManager, PrefixHitReusesComputedFullBlocks) {
  BlockSpaceManager m(Config(16, 0, 0, /*caching=*/true));
  const std::vector<TokenId> prompt = Range(70);  // 4 full blocks + 6 tokens
  ASSERT_EQ(m.Allocate(1, prompt).value(), 0);
  // Not computed yet: nothing to share.
  ASSERT_EQ(m.Allocate(2, prompt).value(), 0);
  ASSERT_TRUE(m.Free(2).ok());
  ASSERT_TRUE(m.CacheComputedBlocks(1, prompt, 70).ok());
  EXPECT_EQ(m.stats().num_cached_gpu_blocks, 4);  // full blocks only

  EXPECT_EQ(m.CountCachedPrefixTokens(prompt), 64);
  EXPECT_EQ(m.stats().prefix_cache_queries, 2 * 70);  // counting is not a query
  ASSERT_EQ(m.Allocate(3, prompt).value(), 64);
  const std::vector<BlockId> a = Ids(m, 1), c = Ids(m, 3);
  EXPECT_EQ(std::vector<BlockId>(c.begin(), c.begin() + 4),
            std::vector<BlockId>(a.begin(), a.begin() + 4));
  EXPECT_NE(c[4], a[4]);  // the partial block is the sequence's own
  EXPECT_EQ(m.gpu_pool().block(a[0]).ref_cnt, 2);
  const BlockSpaceManagerStats s = m.stats();
  EXPECT_EQ(s.prefix_cache_queries, 3 * 70);
  EXPECT_EQ(s.prefix_cache_hits, 64);
  ExpectInvariants(m);
}

TEST(BlockSpaceManager, TheLastPromptTokenIsNeverServedFromTheCache) {
  BlockSpaceManager m(Config(16, 0, 0, true));
  const std::vector<TokenId> prompt = Range(64);  // exactly 4 full blocks
  ASSERT_TRUE(m.Allocate(1, prompt).ok());
  ASSERT_TRUE(m.CacheComputedBlocks(1, prompt, 64).ok());
  EXPECT_EQ(m.Allocate(2, prompt).value(), 48);  // block 3 holds the last token
  std::vector<TokenId> longer = prompt;
  longer.push_back(1);
  EXPECT_EQ(m.Allocate(3, longer).value(), 64);
}

TEST(BlockSpaceManager, OnlyTheCommonPrefixHits) {
  BlockSpaceManager m(Config(16, 0, 0, true));
  const std::vector<TokenId> a = Range(80);
  ASSERT_TRUE(m.Allocate(1, a).ok());
  ASSERT_TRUE(m.CacheComputedBlocks(1, a, 80).ok());
  std::vector<TokenId> b = a;
  b[40] = 9;  // differs in block 2
  EXPECT_EQ(m.Allocate(2, b).value(), 32);
  std::vector<TokenId> c = a;
  c[0] = 9;  // differs in block 0: later blocks must not match on their own
  EXPECT_EQ(m.Allocate(3, c).value(), 0);
}

TEST(BlockSpaceManager, CacheSaltIsolatesRequests) {
  BlockSpaceManager m(Config(16, 0, 0, true));
  const std::vector<TokenId> p = Range(40);
  ASSERT_TRUE(m.Allocate(1, p, "tenant-a").ok());
  ASSERT_TRUE(m.CacheComputedBlocks(1, p, 40).ok());
  EXPECT_EQ(m.Allocate(2, p, "tenant-b").value(), 0);
  EXPECT_EQ(m.Allocate(3, p).value(), 0);
  EXPECT_EQ(m.Allocate(4, p, "tenant-a").value(), 32);
}

TEST(BlockSpaceManager, FreedPrefixIsRevivedByAHitAndItsTailIsEvictedFirst) {
  BlockSpaceManager m(Config(5, 0, 0, true));
  const std::vector<TokenId> prompt = Range(65);  // 5 blocks, 4 of them full
  ASSERT_TRUE(m.Allocate(1, prompt).ok());
  ASSERT_TRUE(m.CacheComputedBlocks(1, prompt, 65).ok());
  const std::vector<BlockId> a = Ids(m, 1);
  ASSERT_TRUE(m.Free(1).ok());
  // Freed tail first: the queue is a4 a3 a2 a1 a0, all still cached but a4.
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 5);
  EXPECT_EQ(m.stats().num_cached_gpu_blocks, 4);

  ASSERT_TRUE(m.Allocate(2, Range(17, 5000)).ok());  // takes a4, then evicts a3
  EXPECT_THAT(Ids(m, 2), ElementsAre(a[4], a[3]));
  EXPECT_EQ(m.stats().num_cached_gpu_blocks, 3);

  // The head of the chain survived and is revived off the free queue.
  ASSERT_EQ(m.CanAllocate(prompt), AllocStatus::kLater);  // needs 5, 3 free + 0 held hits
  ASSERT_TRUE(m.Free(2).ok());
  ASSERT_EQ(m.Allocate(3, prompt).value(), 48);
  EXPECT_EQ(Ids(m, 3)[0], a[0]);
  EXPECT_EQ(Ids(m, 3)[2], a[2]);
  ExpectInvariants(m);
}

TEST(BlockSpaceManager, HitsOnBlocksOthersHoldNeedNoFreeBlocks) {
  BlockSpaceManager m(Config(6, 0, 0, true));
  const std::vector<TokenId> prompt = Range(65);  // 5 blocks
  ASSERT_TRUE(m.Allocate(1, prompt).ok());
  ASSERT_TRUE(m.CacheComputedBlocks(1, prompt, 65).ok());
  // One block free, but four of the five are held by sequence 1 and hit.
  EXPECT_EQ(m.CanAllocate(prompt), AllocStatus::kOk);
  ASSERT_EQ(m.Allocate(2, prompt).value(), 64);
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 0);
  ExpectInvariants(m);
}

TEST(BlockSpaceManager, SwapOutThenInKeepsEveryTokensKvMapped) {
  BlockSpaceManager m(Config(8, 8));
  FakeKvCache kv(8, 8, kBs);
  std::vector<TokenId> a = Range(40);
  ASSERT_TRUE(m.Allocate(1, a).ok());
  kv.Write(*m.GetBlockTable(1), a, 0, 40);
  ASSERT_TRUE(m.Fork(1, 2).ok());
  std::vector<TokenId> b = a;
  b.push_back(9);
  std::vector<BlockPair> copies;
  ASSERT_TRUE(m.AppendSlots(2, 1, 0, &copies).ok());
  kv.Copy(copies, Device::kGpu, Device::kGpu);
  kv.Write(*m.GetBlockTable(2), b, 40, 41);
  // Sequences 1 and 2 share blocks 0 and 1; block 2 is each one's own: 4 distinct blocks.

  const SeqId group[] = {1, 2};
  ASSERT_TRUE(m.CanSwapOut(group));
  const std::vector<BlockPair> out = m.SwapOut(group).value();
  EXPECT_THAT(out, SizeIs(4));  // shared blocks are copied once
  kv.Copy(out, Device::kGpu, Device::kCpu);
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 8);
  EXPECT_EQ(m.stats().num_free_cpu_blocks, 4);
  EXPECT_EQ(m.GetBlockTable(1)->device(), Device::kCpu);
  EXPECT_EQ(m.cpu_pool().block(Ids(m, 1)[0]).ref_cnt, 2);
  EXPECT_EQ(kv.FirstMismatch(*m.GetBlockTable(1), a, 40), -1);
  EXPECT_EQ(kv.FirstMismatch(*m.GetBlockTable(2), b, 41), -1);
  ExpectInvariants(m);

  // Something else takes GPU blocks meanwhile, so the sequences come back elsewhere.
  ASSERT_TRUE(m.Allocate(3, Range(30, 7000)).ok());
  EXPECT_EQ(m.CanSwapIn(group), AllocStatus::kOk);
  const std::vector<BlockPair> in = m.SwapIn(group).value();
  EXPECT_THAT(in, SizeIs(4));
  kv.Copy(in, Device::kCpu, Device::kGpu);
  EXPECT_EQ(m.GetBlockTable(1)->device(), Device::kGpu);
  EXPECT_EQ(m.stats().num_free_cpu_blocks, 8);
  EXPECT_EQ(kv.FirstMismatch(*m.GetBlockTable(1), a, 40), -1);
  EXPECT_EQ(kv.FirstMismatch(*m.GetBlockTable(2), b, 41), -1);
  EXPECT_EQ(Ids(m, 1)[0], Ids(m, 2)[0]);  // still shared after the round trip
  ExpectInvariants(m);
}

TEST(BlockSpaceManager, SwapInRespectsTheWatermarkAndSwapOutTheCpuPool) {
  BlockSpaceManager m(Config(10, 2, /*watermark=*/0.2));
  ASSERT_TRUE(m.Allocate(1, Range(48)).ok());  // 3 blocks
  const SeqId one[] = {1};
  EXPECT_FALSE(m.CanSwapOut(one));  // 3 blocks, 2 on the CPU
  EXPECT_EQ(m.SwapOut(one).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(m.Allocate(2, Range(32)).ok());
  const SeqId two[] = {2};
  ASSERT_TRUE(m.SwapOut(two).ok());
  ASSERT_TRUE(m.Allocate(3, Range(64)).ok());  // 3 free left; watermark 2
  EXPECT_EQ(m.CanSwapIn(two), AllocStatus::kLater);
  ASSERT_TRUE(m.Free(1).ok());
  EXPECT_EQ(m.CanSwapIn(two), AllocStatus::kOk);
  ExpectInvariants(m);
}

TEST(BlockSpaceManager, PrefixCacheStaysConsistentAcrossSwaps) {
  BlockSpaceManager m(Config(8, 8, 0, true));
  FakeKvCache kv(8, 8, kBs);
  const std::vector<TokenId> p = Range(40);
  ASSERT_TRUE(m.Allocate(1, p).ok());
  kv.Write(*m.GetBlockTable(1), p, 0, 40);
  ASSERT_TRUE(m.CacheComputedBlocks(1, p, 40).ok());
  const SeqId one[] = {1};
  kv.Copy(m.SwapOut(one).value(), Device::kGpu, Device::kCpu);
  // The GPU copies are free but their KV is intact: still a valid prefix hit.
  ASSERT_EQ(m.Allocate(2, p).value(), 32);
  EXPECT_EQ(kv.FirstMismatch(*m.GetBlockTable(2), p, 32), -1);
  // Swapping back in: the 2 full blocks are still cached (held by sequence 2), so they are
  // reused; only the partial block is copied.
  const std::vector<BlockPair> in = m.SwapIn(one).value();
  EXPECT_THAT(in, SizeIs(1));
  kv.Copy(in, Device::kCpu, Device::kGpu);
  EXPECT_EQ(Ids(m, 1)[0], Ids(m, 2)[0]);
  EXPECT_EQ(Ids(m, 1)[1], Ids(m, 2)[1]);
  EXPECT_EQ(kv.FirstMismatch(*m.GetBlockTable(1), p, 40), -1);
  EXPECT_EQ(m.GetBlockTable(1)->num_hashed_blocks(), 2);
  ExpectInvariants(m);
  // Once both are gone, a new request still finds exactly the cached prefix.
  ASSERT_TRUE(m.Free(1).ok());
  ASSERT_TRUE(m.Free(2).ok());
  ASSERT_EQ(m.Allocate(3, p).value(), 32);
  EXPECT_EQ(kv.FirstMismatch(*m.GetBlockTable(3), p, 32), -1);
  ExpectInvariants(m);
}

// ---- A sliding window (every layer attends to the last W positions) ----

BlockSpaceManagerConfig WindowConfig(int gpu, int window, int cpu = 0, bool caching = false) {
  BlockSpaceManagerConfig c = Config(gpu, cpu, 0, caching);
  c.sliding_window = window;
  return c;
}

TEST(BlockSpaceManagerConfig, ANegativeWindowIsRefused) {
  EXPECT_THAT(WindowConfig(10, -1).Validate().message(),
              HasSubstr("sliding_window is -1; it must be >= 0"));
}

TEST(BlockSpaceManager, NoWindowKeepsEveryBlock) {
  BlockSpaceManager m(Config(10));
  ASSERT_TRUE(m.Allocate(1, Range(100)).ok());
  EXPECT_EQ(m.ReleaseOutsideWindow(1, 99), 0);
  EXPECT_EQ(m.GetBlockTable(1)->num_released_blocks(), 0);
  EXPECT_EQ(m.ReleaseOutsideWindow(7, 99), 0);  // holds nothing
}

TEST(BlockSpaceManager, TheBlocksBeforeTheWindowGoBackAndTheTableKeepsItsPlaces) {
  BlockSpaceManager m(WindowConfig(10, /*window=*/20));
  FakeKvCache kv(10, 0, kBs);
  std::vector<TokenId> t = Range(40);  // blocks 0..2
  ASSERT_TRUE(m.Allocate(1, t).ok());
  // The first query (position 0) sees everything there is.
  EXPECT_EQ(m.ReleaseOutsideWindow(1, 0), 0);
  kv.Write(*m.GetBlockTable(1), t, 0, 40);
  const std::vector<BlockId> before = Ids(m, 1);
  // A query at 36 sees 17..36: block 0 (0..15) is before it, block 1 (16..31) is not.
  EXPECT_EQ(m.ReleaseOutsideWindow(1, 36), 1);
  EXPECT_THAT(Ids(m, 1), ElementsAre(kReleasedBlock, before[1], before[2]));
  EXPECT_EQ(m.GetBlockTable(1)->num_held_blocks(), 2);
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 8);
  EXPECT_EQ(m.stats().num_window_released_blocks, 1);
  EXPECT_EQ(kv.FirstMismatch(*m.GetBlockTable(1), t, 40, 17), -1);
  ExpectInvariants(m);
  // Idempotent, and never further than the window allows.
  EXPECT_EQ(m.ReleaseOutsideWindow(1, 36), 0);
  EXPECT_EQ(m.ReleaseOutsideWindow(1, 47), 0);  // sees 28..47: block 1 still
  // Growing: the table's entries stay where their tokens are.
  for (int i = 0; i < 60; ++i) {
    std::vector<BlockPair> copies;
    const int pos = static_cast<int>(t.size());
    m.ReleaseOutsideWindow(1, pos);  // this step computes position pos
    ASSERT_TRUE(m.AppendSlots(1, 1, 0, &copies).ok());
    EXPECT_THAT(copies, IsEmpty());
    t.push_back(500 + i);
    kv.Write(*m.GetBlockTable(1), t, pos, pos + 1);
    ASSERT_EQ(kv.FirstMismatch(*m.GetBlockTable(1), t, pos + 1, std::max(0, pos - 19)), -1) << i;
    // At most the window's blocks and the one being written.
    ASSERT_LE(m.GetBlockTable(1)->num_held_blocks(), 3) << i;
    ExpectInvariants(m);
  }
  EXPECT_EQ(m.GetBlockTable(1)->num_blocks(), 7);           // 100 tokens
  EXPECT_EQ(m.GetBlockTable(1)->num_released_blocks(), 5);  // the last query saw 80..99
  ASSERT_TRUE(m.Free(1).ok());
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 10);
  ExpectInvariants(m);
}

TEST(BlockSpaceManager, WindowReleaseSparesBlocksForkedSiblingsStillHold) {
  BlockSpaceManager m(WindowConfig(10, 16));
  ASSERT_TRUE(m.Allocate(1, Range(40)).ok());
  ASSERT_TRUE(m.Fork(1, 2).ok());
  const BlockId first = Ids(m, 1)[0];
  EXPECT_EQ(m.ReleaseOutsideWindow(1, 39), 1);      // sees 24..39: block 0 goes
  EXPECT_EQ(m.gpu_pool().block(first).ref_cnt, 1);  // sequence 2 still holds it
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 7);
  ExpectInvariants(m);
  EXPECT_EQ(m.ReleaseOutsideWindow(2, 39), 1);
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 8);
  // A fork of a table with released entries shares only what it holds.
  ASSERT_TRUE(m.Fork(2, 3).ok());
  EXPECT_EQ(m.GetBlockTable(3)->num_released_blocks(), 1);
  ExpectInvariants(m);
  for (SeqId s : {1, 2, 3}) ASSERT_TRUE(m.Free(s).ok());
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 10);
}

TEST(BlockSpaceManager, SwapMovesOnlyTheBlocksTheWindowStillShows) {
  BlockSpaceManager m(WindowConfig(8, 16, /*cpu=*/8));
  FakeKvCache kv(8, 8, kBs);
  const std::vector<TokenId> t = Range(60);  // 4 blocks
  ASSERT_TRUE(m.Allocate(1, t).ok());
  kv.Write(*m.GetBlockTable(1), t, 0, 60);
  EXPECT_EQ(m.ReleaseOutsideWindow(1, 59), 2);  // sees 44..59
  const SeqId one[] = {1};
  const std::vector<BlockPair> out = m.SwapOut(one).value();
  EXPECT_THAT(out, SizeIs(2));
  kv.Copy(out, Device::kGpu, Device::kCpu);
  EXPECT_EQ(m.stats().num_free_cpu_blocks, 6);
  EXPECT_EQ(m.ReleaseOutsideWindow(1, 60), 0);  // swapped out: nothing to give back
  ExpectInvariants(m);
  const std::vector<BlockPair> in = m.SwapIn(one).value();
  EXPECT_THAT(in, SizeIs(2));
  kv.Copy(in, Device::kCpu, Device::kGpu);
  EXPECT_EQ(m.GetBlockTable(1)->num_released_blocks(), 2);
  EXPECT_EQ(kv.FirstMismatch(*m.GetBlockTable(1), t, 60, 44), -1);
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 6);
  ExpectInvariants(m);
}

TEST(BlockSpaceManager, WithPrefixCachingOnlyRegisteredBlocksGoBackAndTheChainContinues) {
  BlockSpaceManager m(WindowConfig(16, 16, 0, /*caching=*/true));
  const std::vector<TokenId> prompt = Range(70);  // 4 full blocks + 6 tokens
  ASSERT_EQ(m.Allocate(1, prompt).value(), 0);
  // Computed up to 40 but nothing registered yet: nothing is given back.
  EXPECT_EQ(m.ReleaseOutsideWindow(1, 40), 0);
  ASSERT_TRUE(m.CacheComputedBlocks(1, prompt, 40).ok());  // blocks 0 and 1
  EXPECT_EQ(m.ReleaseOutsideWindow(1, 40), 1);             // sees 25..40: block 0
  // Block 1 given back too, then blocks 2 and 3 registered after their parent left the table.
  EXPECT_EQ(m.ReleaseOutsideWindow(1, 48), 1);
  ASSERT_TRUE(m.CacheComputedBlocks(1, prompt, 70).ok());
  ExpectInvariants(m);
  EXPECT_EQ(m.stats().num_cached_gpu_blocks, 4);  // the two given back are still findable
  // Another request with the same prompt finds all four, chained as one prefix.
  ASSERT_EQ(m.Allocate(2, prompt).value(), 64);
  ExpectInvariants(m);
  ASSERT_TRUE(m.Free(1).ok());
  ASSERT_TRUE(m.Free(2).ok());
  EXPECT_EQ(m.stats().num_free_gpu_blocks, 16);
}

}  // namespace
}  // namespace llm
