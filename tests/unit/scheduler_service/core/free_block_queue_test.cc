#include "scheduler_service/core/free_block_queue.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace llm {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<KVCacheBlock> MakeBlocks(int n) {
  std::vector<KVCacheBlock> blocks;
  for (int i = 0; i < n; ++i) blocks.emplace_back(i);
  return blocks;
}

TEST(FreeBlockQueue, StartsInGivenOrderAndPopsFromTheFront) {
  std::vector<KVCacheBlock> blocks = MakeBlocks(4);
  FreeBlockQueue q(blocks);
  EXPECT_EQ(q.size(), 4);
  EXPECT_THAT(q.ToVector(), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(q.PopFront()->block_id, 0);
  EXPECT_EQ(q.PopFront()->block_id, 1);
  EXPECT_THAT(q.ToVector(), ElementsAre(2, 3));
  EXPECT_FALSE(FreeBlockQueue::IsLinked(blocks[0]));
  EXPECT_TRUE(FreeBlockQueue::IsLinked(blocks[2]));
}

TEST(FreeBlockQueue, AppendGoesToTheBackSoFreedBlocksAreReusedLast) {
  std::vector<KVCacheBlock> blocks = MakeBlocks(3);
  FreeBlockQueue q(blocks);
  KVCacheBlock* b0 = q.PopFront();
  q.Append(b0);
  EXPECT_THAT(q.ToVector(), ElementsAre(1, 2, 0));
}

TEST(FreeBlockQueue, PrependGoesToTheFrontSoTheBlockIsReusedNext) {
  std::vector<KVCacheBlock> blocks = MakeBlocks(3);
  FreeBlockQueue q(blocks);
  KVCacheBlock* b2 = &blocks[2];
  q.Remove(b2);
  q.Prepend(b2);
  EXPECT_THAT(q.ToVector(), ElementsAre(2, 0, 1));
  EXPECT_EQ(q.size(), 3);
  EXPECT_EQ(q.PopFront()->block_id, 2);
}

TEST(FreeBlockQueue, RemoveFromFrontMiddleAndBack) {
  std::vector<KVCacheBlock> blocks = MakeBlocks(5);
  FreeBlockQueue q(blocks);
  q.Remove(&blocks[2]);
  EXPECT_THAT(q.ToVector(), ElementsAre(0, 1, 3, 4));
  q.Remove(&blocks[0]);
  q.Remove(&blocks[4]);
  EXPECT_THAT(q.ToVector(), ElementsAre(1, 3));
  EXPECT_EQ(q.size(), 2);
  q.Append(&blocks[2]);
  EXPECT_THAT(q.ToVector(), ElementsAre(1, 3, 2));
}

TEST(FreeBlockQueue, PopFrontNTakesTheOldestAndCanEmptyTheQueue) {
  std::vector<KVCacheBlock> blocks = MakeBlocks(5);
  FreeBlockQueue q(blocks);
  std::vector<KVCacheBlock*> out;
  q.PopFrontN(3, &out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0]->block_id, 0);
  EXPECT_EQ(out[2]->block_id, 2);
  EXPECT_THAT(q.ToVector(), ElementsAre(3, 4));
  q.PopFrontN(2, &out);
  EXPECT_TRUE(q.empty());
  EXPECT_THAT(q.ToVector(), IsEmpty());
  q.Append(out[1]);  // the queue still works once emptied
  EXPECT_THAT(q.ToVector(), ElementsAre(1));
}

TEST(FreeBlockQueueDeathTest, MisuseFailsLoudlyNamingTheBlock) {
  std::vector<KVCacheBlock> blocks = MakeBlocks(2);
  FreeBlockQueue q(blocks);
  EXPECT_DEATH(q.Append(&blocks[1]), "block 1 is already in the free queue");
  KVCacheBlock* b = q.PopFront();
  EXPECT_DEATH(q.Remove(b), "block 0 is not in the free queue");
  std::vector<KVCacheBlock*> out;
  EXPECT_DEATH(q.PopFrontN(2, &out), "PopFrontN\\(2\\) with 1 free blocks");
}

}  // namespace
}  // namespace llm
