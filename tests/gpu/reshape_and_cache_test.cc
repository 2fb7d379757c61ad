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
// The model's k and v: token-strided views of the k and v columns of fused qkv rows (the q
// columns and a pad poisoned), f32 and bf16 keys into f32 and bf16 caches: the same cache bytes
// as from contiguous tensors, and for f32 the same as the CPU op on the same views.
TEST_F(CudaReshapeAndCache, TokenStridedKeyAndValueWriteTheSameSlots) {
  std::mt19937 rng(506);
  const int64_t block_size = 16, num_kv_heads = 2, head_size = 64, num_tokens = 17;
  const int64_t q_cols = 8 * head_size, kv_cols = num_kv_heads * head_size;
  const int64_t row = q_cols + 2 * kv_cols + 8, num_blocks = 4;
  std::vector<int64_t> slots(num_blocks * block_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(num_tokens);
  slots[5] = -1;
  HostTensor slot_mapping = Indices(slots, DType::kI32);
  DeviceTensor d_slots(slot_mapping);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto in_dtype = [dtype](const HostTensor& t) {
      return dtype == DType::kF32 ? gpu_testing::Clone(t) : ToHalf(t, dtype);
    };
    HostTensor key = in_dtype(Random({num_tokens, num_kv_heads, head_size}, rng));
    HostTensor value = in_dtype(Random({num_tokens, num_kv_heads, head_size}, rng));
    HostTensor qkv = testing::PoisonedRows(dtype, num_tokens, row);
    testing::PutHeads(qkv, q_cols, key);
    testing::PutHeads(qkv, q_cols + kv_cols, value);
    const HostTensor cache =
        in_dtype(Random({num_blocks, block_size, num_kv_heads, head_size}, rng));
    DeviceTensor d_qkv(qkv), d_key(key), d_value(value);
    DeviceTensor want_k(cache), want_v(cache), got_k(cache), got_v(cache);
    ASSERT_TRUE(ReshapeAndCache({}, d_key.view(), d_value.view(), want_k.view(), want_v.view(),
                                d_slots.view())
                    .ok());
    const OpStatus s =
        ReshapeAndCache({}, testing::HeadsView(d_qkv.view(), q_cols, num_kv_heads, head_size),
                        testing::HeadsView(d_qkv.view(), q_cols + kv_cols, num_kv_heads, head_size),
                        got_k.view(), got_v.view(), d_slots.view());
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(Sync(), "");
    EXPECT_TRUE(BitEqual(got_k.Download(), want_k.Download()));
    EXPECT_TRUE(BitEqual(got_v.Download(), want_v.Download()));
    if (dtype != DType::kF32) continue;
    HostTensor cpu_k = gpu_testing::Clone(cache), cpu_v = gpu_testing::Clone(cache);
    ASSERT_TRUE(
        ReshapeAndCache({}, testing::HeadsView(qkv.view(), q_cols, num_kv_heads, head_size),
                        testing::HeadsView(qkv.view(), q_cols + kv_cols, num_kv_heads, head_size),
                        cpu_k.view(), cpu_v.view(), slot_mapping.view())
            .ok());
    EXPECT_TRUE(BitEqual(got_k.Download(), cpu_k));
    EXPECT_TRUE(BitEqual(got_v.Download(), cpu_v));
  }
}

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

// 16-bit keys and values into caches of every dtype: each element converted once (exactly, to an
// f32 cache; rounded to nearest even, to a 16-bit one), bit for bit the CPU op's f32 caches
// converted likewise; untouched slots keep their contents.
TEST_F(CudaReshapeAndCache, HalfKeysAndValuesIntoEveryCacheDtype) {
  std::mt19937 rng(504);
  constexpr int64_t kBlockSize = 16, kKvHeads = 2, kHeadSize = 64, kNumTokens = 17;
  for (const DType in : {DType::kBF16, DType::kF16}) {
    for (const DType cache : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(in) << " into " << DTypeName(cache));
      const int64_t num_blocks = 4;
      std::vector<int64_t> slots(num_blocks * kBlockSize);
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(kNumTokens);
      slots[3] = -1;
      HostTensor slot_mapping = Indices(slots, DType::kI32);
      HostTensor key =
          RoundedThroughHalf(Random({kNumTokens, kKvHeads, kHeadSize}, rng, -3, 3), in);
      HostTensor value =
          RoundedThroughHalf(Random({kNumTokens, kKvHeads, kHeadSize}, rng, -3, 3), in);
      HostTensor key_cache = Random({num_blocks, kBlockSize, kKvHeads, kHeadSize}, rng);
      HostTensor value_cache = Random({num_blocks, kBlockSize, kKvHeads, kHeadSize}, rng);
      if (cache != DType::kF32) {
        key_cache = RoundedThroughHalf(key_cache, cache);
        value_cache = RoundedThroughHalf(value_cache, cache);
      }
      auto as_cache = [&](const HostTensor& t) {
        return cache == DType::kF32 ? gpu_testing::Clone(t) : ToHalf(t, cache);
      };
      DeviceTensor d_key(ToHalf(key, in)), d_value(ToHalf(value, in)), d_slots(slot_mapping);
      DeviceTensor d_kc(as_cache(key_cache)), d_vc(as_cache(value_cache));
      ASSERT_TRUE(ReshapeAndCache({}, key.view(), value.view(), key_cache.view(),
                                  value_cache.view(), slot_mapping.view())
                      .ok());
      const OpStatus s = ReshapeAndCache({}, d_key.view(), d_value.view(), d_kc.view(), d_vc.view(),
                                         d_slots.view());
      ASSERT_TRUE(s.ok()) << s.message;
      ASSERT_EQ(Sync(), "");
      EXPECT_TRUE(BitEqual(d_kc.Download(), as_cache(key_cache)));
      EXPECT_TRUE(BitEqual(d_vc.Download(), as_cache(value_cache)));
    }
  }
}

TEST(CudaReshapeAndCacheArgs, KeyAndValueShareADtypeAndTheCpuBackendIsF32Only) {
  HostTensor key(DType::kBF16, {2, 1, 4}), value(DType::kF16, {2, 1, 4});
  HostTensor cache(DType::kF32, {1, 2, 1, 4}), cache2(DType::kF32, {1, 2, 1, 4});
  HostTensor slots = Indices({0, 1}, DType::kI32);
  EXPECT_EQ(ReshapeAndCache({}, key.view(), value.view(), cache.view(), cache2.view(), slots.view())
                .message,
            "ReshapeAndCache: value: expected bf16 [2, 1, 4], got f16 [2, 1, 4] on cpu");
  EXPECT_EQ(ReshapeAndCache({}, key.view(), key.view(), cache.view(), cache2.view(), slots.view())
                .message,
            "ReshapeAndCache: key: the CPU backend takes f32 only, got bf16 [2, 1, 4] on cpu");
}

}  // namespace
}  // namespace llm::ops
