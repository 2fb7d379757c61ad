#include "scheduler_service/core/block_pool.h"

#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler_service/core/block_hash.h"

namespace llm {
namespace {

using ::testing::ElementsAre;

constexpr int kBlockSize = 4;

std::vector<TokenId> Tokens(int first) {
  std::vector<TokenId> t(kBlockSize);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Marks `id` as holding `tokens` as the first block of a chain, with a chosen hash.
BlockKey HashAs(BlockPool& pool, BlockId id, const std::vector<TokenId>& tokens,
                uint64_t prefix_id) {
  BlockKey key;
  key.parent_hash = RootHash("");
  key.hash = HashBlockTokens(key.parent_hash, tokens);
  key.prefix_id = prefix_id;
  pool.SetHashed(&pool.block(id), key, tokens, "");
  return key;
}

// Blocks the prefix cache holds are evicted least recently freed first, after the blocks never
// used: a request's blocks are freed tail first, so its tail is evicted first.
TEST(BlockPool, EvictsCachedBlocksLeastRecentlyFreedFirst) {
  BlockPool pool(Device::kGpu, 6, kBlockSize, true);
  std::vector<BlockId> ids;
  pool.Allocate(4, &ids);
  EXPECT_THAT(ids, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(pool.num_free_blocks(), 2);
  for (int i = 0; i < 4; ++i) HashAs(pool, ids[i], Tokens(10 * i), i + 1);
  for (int i = 3; i >= 0; --i) pool.Free(ids[i]);
  std::vector<BlockId> again;
  pool.Allocate(6, &again);
  EXPECT_THAT(again, ElementsAre(4, 5, 3, 2, 1, 0));
  EXPECT_DOUBLE_EQ(pool.usage(), 1.0);
}

// A freed block whose contents nobody can reuse (not hashed, or caching off) is allocated next,
// before blocks never used, so that the KV cache's resident memory (reserved, touched when
// written, on cpu) follows the blocks in use at once.
TEST(BlockPool, ReusesUncachedFreedBlocksBeforeUntouchedOnes) {
  for (bool caching : {true, false}) {
    BlockPool pool(Device::kGpu, 6, kBlockSize, caching);
    std::vector<BlockId> ids;
    pool.Allocate(3, &ids);
    HashAs(pool, ids[0], Tokens(0), 1);  // caching: kept for prefix hits, at the back
    for (int i = 2; i >= 0; --i) pool.Free(ids[i]);
    std::vector<BlockId> again;
    pool.Allocate(6, &again);
    if (caching) {
      EXPECT_THAT(again, ElementsAre(1, 2, 3, 4, 5, 0));
    } else {
      EXPECT_THAT(again, ElementsAre(0, 1, 2, 3, 4, 5));
    }
    EXPECT_TRUE(pool.CheckInvariants().ok());
  }
}

TEST(BlockPool, FreedCachedBlockStaysFindableAndTouchRevivesIt) {
  BlockPool pool(Device::kGpu, 3, kBlockSize, true);
  const BlockId id = pool.AllocateOne();
  const BlockKey key = HashAs(pool, id, Tokens(10), 1);
  pool.Free(id);
  EXPECT_EQ(pool.num_free_blocks(), 3);
  KVCacheBlock* hit = pool.FindCached(key.hash, 0, Tokens(10), "");
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->block_id, id);
  pool.Touch(hit);
  EXPECT_EQ(hit->ref_cnt, 1);
  EXPECT_EQ(pool.num_free_blocks(), 2);  // revived: off the free queue
  pool.Touch(hit);                       // a second holder
  EXPECT_EQ(hit->ref_cnt, 2);
  EXPECT_EQ(pool.num_free_blocks(), 2);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPool, ReusingACachedBlockEvictsIt) {
  BlockPool pool(Device::kGpu, 1, kBlockSize, true);
  const BlockId id = pool.AllocateOne();
  const BlockKey key = HashAs(pool, id, Tokens(10), 1);
  pool.Free(id);
  EXPECT_EQ(pool.num_cached_blocks(), 1);
  EXPECT_EQ(pool.AllocateOne(), id);
  EXPECT_EQ(pool.num_cached_blocks(), 0);
  EXPECT_EQ(pool.num_evictions(), 1);
  EXPECT_FALSE(pool.block(id).is_hashed());
  EXPECT_EQ(pool.FindCached(key.hash, 0, Tokens(10), ""), nullptr);
}

TEST(BlockPool, AHashCollisionNeverServesOtherTokens) {
  BlockPool pool(Device::kGpu, 2, kBlockSize, true);
  const BlockId id = pool.AllocateOne();
  const BlockKey key = HashAs(pool, id, Tokens(10), 1);
  // Same hash, other tokens: what a 64-bit collision would look like.
  EXPECT_EQ(pool.FindCached(key.hash, 0, Tokens(11), ""), nullptr);
  // Same hash and tokens, but a different parent chain or cache salt.
  EXPECT_EQ(pool.FindCached(key.hash, 7, Tokens(10), ""), nullptr);
  EXPECT_EQ(pool.FindCached(key.hash, 0, Tokens(10), "tenant-b"), nullptr);
  EXPECT_NE(pool.FindCached(key.hash, 0, Tokens(10), ""), nullptr);
}

TEST(BlockPool, SecondBlockWithSameHashIsNotIndexedAndFreeingItKeepsTheFirst) {
  BlockPool pool(Device::kGpu, 2, kBlockSize, true);
  const BlockId a = pool.AllocateOne();
  const BlockId b = pool.AllocateOne();
  const BlockKey key = HashAs(pool, a, Tokens(10), 1);
  HashAs(pool, b, Tokens(10), 2);
  EXPECT_EQ(pool.num_cached_blocks(), 1);
  pool.Free(b);
  EXPECT_EQ(pool.AllocateOne(), b);  // evicts b's contents, not a's entry
  KVCacheBlock* hit = pool.FindCached(key.hash, 0, Tokens(10), "");
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->block_id, a);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPool, WithCachingOffNothingIsFindable) {
  BlockPool pool(Device::kCpu, 2, kBlockSize, false);
  const BlockId id = pool.AllocateOne();
  const BlockKey key = HashAs(pool, id, Tokens(10), 1);
  EXPECT_TRUE(pool.block(id).is_hashed());  // contents recorded (they travel with swaps)
  EXPECT_EQ(pool.FindCached(key.hash, 0, Tokens(10), ""), nullptr);
}

TEST(BlockPoolDeathTest, MisuseFailsLoudlyNamingTheBlock) {
  BlockPool pool(Device::kGpu, 2, kBlockSize, true);
  const BlockId id = pool.AllocateOne();
  pool.Free(id);
  EXPECT_DEATH(pool.Free(id), "gpu block 0 freed while already free");
  std::vector<BlockId> out;
  EXPECT_DEATH(pool.Allocate(3, &out), "allocating 3 blocks with 2 free");
}

}  // namespace
}  // namespace llm
