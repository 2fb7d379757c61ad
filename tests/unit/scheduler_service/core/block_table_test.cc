#include "scheduler_service/core/block_table.h"

#include "gtest/gtest.h"
#include "scheduler_service/core/block_space_manager.h"

namespace llm {
namespace {

TEST(BlockTable, NumRequiredBlocks) {
  EXPECT_EQ(BlockTable::NumRequiredBlocks(0, 0, 16), 0);
  EXPECT_EQ(BlockTable::NumRequiredBlocks(1, 0, 16), 1);
  EXPECT_EQ(BlockTable::NumRequiredBlocks(16, 0, 16), 1);
  EXPECT_EQ(BlockTable::NumRequiredBlocks(17, 0, 16), 2);
  EXPECT_EQ(BlockTable::NumRequiredBlocks(16, 1, 16), 2);  // a lookahead slot spills over
}

// Table state comes from the manager; these check the arithmetic the scheduler relies on.
class BlockTableTest : public ::testing::Test {
 protected:
  BlockTableTest()
      : mgr_(BlockSpaceManagerConfig{
            .block_size = 16, .num_gpu_blocks = 64, .num_cpu_blocks = 0, .watermark = 0}) {}
  const BlockTable& Make(int num_tokens) {
    std::vector<TokenId> prompt(num_tokens, 7);
    EXPECT_TRUE(mgr_.Allocate(next_, prompt).ok());
    return *mgr_.GetBlockTable(next_++);
  }
  BlockSpaceManager mgr_;
  SeqId next_ = 1;
};

TEST_F(BlockTableTest, BlocksTouchedAndAllocatedByAnAppend) {
  const BlockTable& partial = Make(20);  // 2 blocks, 4 tokens in the last
  EXPECT_EQ(partial.NumBlocksTouchedByAppend(1, 0), 1);
  EXPECT_EQ(partial.NumNewBlocksForAppend(1, 0), 0);
  EXPECT_EQ(partial.NumBlocksTouchedByAppend(12, 0), 1);  // fills the last block exactly
  EXPECT_EQ(partial.NumBlocksTouchedByAppend(13, 0), 2);
  EXPECT_EQ(partial.NumNewBlocksForAppend(13, 0), 1);
  EXPECT_EQ(partial.NumNewBlocksForAppend(1, 28), 2);  // lookahead reaches a fourth block
  EXPECT_EQ(partial.NumBlocksTouchedByAppend(0, 0), 0);

  const BlockTable& full = Make(32);  // the next token starts a new block
  EXPECT_EQ(full.NumBlocksTouchedByAppend(1, 0), 1);
  EXPECT_EQ(full.NumNewBlocksForAppend(1, 0), 1);
  EXPECT_EQ(full.FirstWrittenBlock(), 2);
  EXPECT_EQ(full.LastWrittenBlock(1), 1);  // block 2 does not exist yet: nothing to copy
}

TEST_F(BlockTableTest, SlotMappingFollowsTheBlockIds) {
  const BlockTable& t = Make(40);
  ASSERT_EQ(t.num_blocks(), 3);
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(t.Slot(i), static_cast<int64_t>(t.block_ids()[i / 16]) * 16 + i % 16) << i;
  }
}

}  // namespace
}  // namespace llm
