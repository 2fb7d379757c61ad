// ReshapeAndCache on CUDA against the CPU op: the whole caches, written and untouched slots
// alike, must be bit-equal (the caches start from the same random contents on both sides).
#include <algorithm>
#include <numeric>
#include <random>

#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using gpu_testing::BitEqual;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Indices;
using gpu_testing::Random;
using gpu_testing::RoundedThroughHalf;
using gpu_testing::ToHalf;

class CudaReshapeAndCache : public CudaTest {};

TEST_F(CudaReshapeAndCache, MatchesCpuWithPaddingForEveryShape) {
  std::mt19937 rng(501);
  for (const int64_t block_size : {16, 32}) {
    for (const int64_t head_size : {64, 128}) {
      for (const int64_t num_kv_heads : {1, 8}) {
        for (const int64_t num_tokens : gpu_testing::kTokenCounts) {
          const DType index_type = num_tokens % 2 == 0 ? DType::kI64 : DType::kI32;
          SCOPED_TRACE(::testing::Message()
                       << "block " << block_size << ", head " << head_size << ", kv heads "
                       << num_kv_heads << ", tokens " << num_tokens);
          const int64_t num_blocks = (num_tokens + block_size - 1) / block_size + 3;
          // Distinct random slots; every 7th token is padding (-1).
          std::vector<int64_t> slots(num_blocks * block_size);
          std::iota(slots.begin(), slots.end(), 0);
          std::shuffle(slots.begin(), slots.end(), rng);
          slots.resize(num_tokens);
          for (int64_t t = 3; t < num_tokens; t += 7) slots[t] = -1;
          HostTensor slot_mapping = Indices(slots, index_type);
          HostTensor key = Random({num_tokens, num_kv_heads, head_size}, rng);
          HostTensor value = Random({num_tokens, num_kv_heads, head_size}, rng);
          HostTensor key_cache = Random({num_blocks, block_size, num_kv_heads, head_size}, rng);
          HostTensor value_cache = Random({num_blocks, block_size, num_kv_heads, head_size}, rng);
          DeviceTensor d_key(key), d_value(value), d_slots(slot_mapping);
          DeviceTensor d_kc(key_cache), d_vc(value_cache);
          ASSERT_TRUE(ReshapeAndCache({}, key.view(), value.view(), key_cache.view(),
                                      value_cache.view(), slot_mapping.view())
                          .ok());
          const OpStatus s = ReshapeAndCache({}, d_key.view(), d_value.view(), d_kc.view(),
                                             d_vc.view(), d_slots.view());
          ASSERT_TRUE(s.ok()) << s.message;
          ASSERT_EQ(Sync(), "");
          EXPECT_TRUE(BitEqual(d_kc.Download(), key_cache));
          EXPECT_TRUE(BitEqual(d_vc.Download(), value_cache));
        }
      }
    }
  }
}

// f16 and bf16 caches: the f32 keys and values are rounded to nearest. Reference: the CPU op
// on f32 caches holding the same (half-representable) values, converted to half afterwards;
// bit-equal.
TEST_F(CudaReshapeAndCache, HalfCachesHoldTheKeysRoundedToNearest) {
  std::mt19937 rng(503);
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    for (const int64_t num_tokens : gpu_testing::kTokenCounts) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << ", tokens " << num_tokens);
      constexpr int64_t kBlockSize = 16, kKvHeads = 8, kHeadSize = 128;
      const int64_t num_blocks = (num_tokens + kBlockSize - 1) / kBlockSize + 2;
      std::vector<int64_t> slots(num_blocks * kBlockSize);
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(num_tokens);
      for (int64_t t = 5; t < num_tokens; t += 11) slots[t] = -1;
      HostTensor slot_mapping = Indices(slots, DType::kI64);
      HostTensor key = Random({num_tokens, kKvHeads, kHeadSize}, rng, -3.0f, 3.0f);
      HostTensor value = Random({num_tokens, kKvHeads, kHeadSize}, rng, -3.0f, 3.0f);
      HostTensor key_cache =
          RoundedThroughHalf(Random({num_blocks, kBlockSize, kKvHeads, kHeadSize}, rng), dtype);
      HostTensor value_cache =
          RoundedThroughHalf(Random({num_blocks, kBlockSize, kKvHeads, kHeadSize}, rng), dtype);
      DeviceTensor d_key(key), d_value(value), d_slots(slot_mapping);
      DeviceTensor d_kc(ToHalf(key_cache, dtype)), d_vc(ToHalf(value_cache, dtype));
      ASSERT_TRUE(ReshapeAndCache({}, key.view(), value.view(), key_cache.view(),
                                  value_cache.view(), slot_mapping.view())
                      .ok());
      const OpStatus s = ReshapeAndCache({}, d_key.view(), d_value.view(), d_kc.view(), d_vc.view(),
                                         d_slots.view());
      ASSERT_TRUE(s.ok()) << s.message;
      ASSERT_EQ(Sync(), "");
      EXPECT_TRUE(BitEqual(d_kc.Download(), ToHalf(key_cache, dtype)));
      EXPECT_TRUE(BitEqual(d_vc.Download(), ToHalf(value_cache, dtype)));
    }
  }
}

// A slot outside the cache is skipped like padding (the CPU op reports it as an error; the
// device cannot without a synchronization): nothing outside the cache is written.
TEST_F(CudaReshapeAndCache, OutOfRangeSlotIsSkipped) {
  std::mt19937 rng(502);
  HostTensor key = Random({2, 1, 64}, rng), value = Random({2, 1, 64}, rng);
  HostTensor key_cache = Random({2, 16, 1, 64}, rng), value_cache = Random({2, 16, 1, 64}, rng);
  HostTensor slots = Indices({32, 5}, DType::kI32);  // 32 is one past the end
  DeviceTensor d_key(key), d_value(value), d_slots(slots), d_kc(key_cache), d_vc(value_cache);
  ASSERT_TRUE(
      ReshapeAndCache({}, d_key.view(), d_value.view(), d_kc.view(), d_vc.view(), d_slots.view())
          .ok());
  ASSERT_EQ(Sync(), "");
  HostTensor good_slots = Indices({-1, 5}, DType::kI32);
  ASSERT_TRUE(ReshapeAndCache({}, key.view(), value.view(), key_cache.view(), value_cache.view(),
                              good_slots.view())
                  .ok());
  EXPECT_TRUE(BitEqual(d_kc.Download(), key_cache));
  EXPECT_TRUE(BitEqual(d_vc.Download(), value_cache));
}

}  // namespace
}  // namespace llm::ops
