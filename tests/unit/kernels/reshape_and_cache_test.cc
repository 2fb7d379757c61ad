// ReshapeAndCache: each token's K and V land in exactly their slot, padding (-1) writes
// nothing, every other slot keeps its contents, and a bad slot writes nothing at all.
#include <cstring>
#include <random>
#include <vector>

#include "common/half.h"
#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops {
namespace {

using testing::Indices;
using testing::Random;
using testing::ToVector;

constexpr int64_t kBlocks = 5, kBlockSize = 4, kKvHeads = 2, kHeadSize = 3;
constexpr int64_t kRow = kKvHeads * kHeadSize;

TEST(ReshapeAndCache, WritesEachTokenIntoItsSlot) {
  std::mt19937 rng(50);
  const std::vector<int64_t> slots = {0, 19, -1, 5, 6, 7, 8, -1, 13};
  const int64_t tokens = static_cast<int64_t>(slots.size());
  for (DType dtype : {DType::kI32, DType::kI64}) {
    HostTensor key = Random({tokens, kKvHeads, kHeadSize}, rng);
    HostTensor value = Random({tokens, kKvHeads, kHeadSize}, rng);
    HostTensor key_cache = Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng);
    HostTensor value_cache = Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng);
    std::vector<float> want_k = ToVector(key_cache), want_v = ToVector(value_cache);
    for (int64_t t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      // cache[slot / bs][slot % bs][h][d] = key[t][h][d]
      for (int64_t i = 0; i < kRow; ++i) {
        const int64_t block = slots[t] / kBlockSize, offset = slots[t] % kBlockSize;
        want_k[((block * kBlockSize) + offset) * kRow + i] = key.data<float>()[t * kRow + i];
        want_v[((block * kBlockSize) + offset) * kRow + i] = value.data<float>()[t * kRow + i];
      }
    }
    HostTensor slot_mapping = Indices(slots, dtype);
    ASSERT_TRUE(ReshapeAndCache({}, key.view(), value.view(), key_cache.view(), value_cache.view(),
                                slot_mapping.view())
                    .ok());
    EXPECT_EQ(ToVector(key_cache), want_k) << DTypeName(dtype);
    EXPECT_EQ(ToVector(value_cache), want_v) << DTypeName(dtype);
  }
}

// The model's k and v: token-strided views of the k and v columns of fused qkv rows (the q
// columns and a pad NaN): the same cache contents as from contiguous tensors.
TEST(ReshapeAndCache, TokenStridedKeyAndValueWriteTheSameSlots) {
  std::mt19937 rng(51);
  const std::vector<int64_t> slots = {3, -1, 17, 0};
  const int64_t tokens = static_cast<int64_t>(slots.size()), q_cols = 4 * kHeadSize;
  HostTensor key = Random({tokens, kKvHeads, kHeadSize}, rng);
  HostTensor value = Random({tokens, kKvHeads, kHeadSize}, rng);
  HostTensor qkv = testing::PoisonedRows(DType::kF32, tokens, q_cols + 2 * kRow + 5);
  testing::PutHeads(qkv, q_cols, key);
  testing::PutHeads(qkv, q_cols + kRow, value);
  HostTensor slot_mapping = Indices(slots, DType::kI64);
  HostTensor want_k = Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor want_v = Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor got_k(DType::kF32, {kBlocks, kBlockSize, kKvHeads, kHeadSize});
  HostTensor got_v(DType::kF32, {kBlocks, kBlockSize, kKvHeads, kHeadSize});
  std::memcpy(got_k.data<float>(), want_k.data<float>(), want_k.view().nbytes());
  std::memcpy(got_v.data<float>(), want_v.data<float>(), want_v.view().nbytes());
  ASSERT_TRUE(ReshapeAndCache({}, key.view(), value.view(), want_k.view(), want_v.view(),
                              slot_mapping.view())
                  .ok());
  const OpStatus s =
      ReshapeAndCache({}, testing::HeadsView(qkv.view(), q_cols, kKvHeads, kHeadSize),
                      testing::HeadsView(qkv.view(), q_cols + kRow, kKvHeads, kHeadSize),
                      got_k.view(), got_v.view(), slot_mapping.view());
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_TRUE(testing::SameBytes(got_k, want_k));
  EXPECT_TRUE(testing::SameBytes(got_v, want_v));
}

TEST(ReshapeAndCache, ASlotOutsideTheCacheIsAnErrorAndWritesNothing) {
  std::mt19937 rng(51);
  HostTensor key = Random({3, kKvHeads, kHeadSize}, rng);
  HostTensor value = Random({3, kKvHeads, kHeadSize}, rng);
  HostTensor key_cache = Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor value_cache = Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng);
  const std::vector<float> before = ToVector(key_cache);
  for (int64_t bad : {20, -2}) {
    HostTensor slot_mapping = Indices({1, 2, bad}, DType::kI64);
    EXPECT_EQ(ReshapeAndCache({}, key.view(), value.view(), key_cache.view(), value_cache.view(),
                              slot_mapping.view())
                  .message,
              "ReshapeAndCache: slot_mapping[2] = " + std::to_string(bad) +
                  " is outside [0, 20) (num_blocks * block_size) and is not -1 (padding)");
    EXPECT_EQ(ToVector(key_cache), before);
  }
  HostTensor wrong_value = Random({3, kKvHeads, kHeadSize + 1}, rng);
  HostTensor slot_mapping = Indices({1, 2, 3}, DType::kI32);
  EXPECT_EQ(ReshapeAndCache({}, key.view(), wrong_value.view(), key_cache.view(),
                            value_cache.view(), slot_mapping.view())
                .message,
            "ReshapeAndCache: value: expected f32 [3, 2, 3], got f32 [3, 2, 4] on cpu");
}

}  // namespace
}  // namespace llm::ops

namespace llm::ops {
namespace {

// f16 KV caches are for the CUDA backend: the CPU ops reject them by name, and both caches must
// share one dtype on any device.
TEST(KvCacheDTypes, HalfCachesAreRejectedByTheCpuBackendAndMustMatch) {
  std::mt19937 rng(51);
  HostTensor key = Random({1, kKvHeads, kHeadSize}, rng);
  HostTensor value = Random({1, kKvHeads, kHeadSize}, rng);
  HostTensor slots = Indices({0}, DType::kI32);
  HostTensor f32_cache = Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor bf16_k(DType::kBF16, {kBlocks, kBlockSize, kKvHeads, kHeadSize});
  HostTensor bf16_v(DType::kBF16, {kBlocks, kBlockSize, kKvHeads, kHeadSize});
  HostTensor f16_k(DType::kF16, {kBlocks, kBlockSize, kKvHeads, kHeadSize});
  HostTensor f16_v(DType::kF16, {kBlocks, kBlockSize, kKvHeads, kHeadSize});
  EXPECT_EQ(ReshapeAndCache({}, key.view(), value.view(), f16_k.view(), f16_v.view(), slots.view())
                .message,
            "ReshapeAndCache: key_cache: the CPU backend takes f32 or bf16 caches, got f16 "
            "[5, 4, 2, 3] on cpu");
  EXPECT_EQ(
      ReshapeAndCache({}, key.view(), value.view(), bf16_k.view(), f32_cache.view(), slots.view())
          .message,
      "ReshapeAndCache: value_cache: expected bf16 [5, 4, 2, 3], got f32 [5, 4, 2, 3] on cpu");
  EXPECT_EQ(
      ReshapeAndCache({}, key.view(), value.view(), f16_k.view(), bf16_v.view(), slots.view())
          .message,
      "ReshapeAndCache: value_cache: expected f16 [5, 4, 2, 3], got bf16 [5, 4, 2, 3] on cpu");

  const std::vector<BlockPair> pairs = {{0, 1}};
  const std::vector<TensorView> ks = {f16_k.view()}, vs = {f16_v.view()};
  EXPECT_EQ(CopyBlocks({}, ks, vs, pairs).message,
            "CopyBlocks: key_caches[0]: the CPU backend takes f32 or bf16 caches, got f16 "
            "[5, 4, 2, 3] on cpu");
  EXPECT_EQ(SwapBlocks({}, f16_k.view(), f16_v.view(), pairs).message,
            "SwapBlocks: src[0]: the CPU backend takes f32 or bf16 caches, got f16 [5, 4, 2, 3] "
            "on cpu");
  EXPECT_EQ(SwapBlocks({}, bf16_k.view(), f32_cache.view(), pairs).message,
            "SwapBlocks: dst[0]: expected bf16 [?, 4, 2, 3], got f32 [5, 4, 2, 3] on cpu");

  HostTensor query = Random({1, 2, kHeadSize}, rng), out = Random({1, 2, kHeadSize}, rng);
  HostTensor tables = Indices({0}, DType::kI32, {1, 1});
  HostTensor seq_lens = Indices({1}, DType::kI32), qsl = Indices({0, 1}, DType::kI32);
  const AttentionMetadata md{tables.view(), seq_lens.view(), qsl.view(), 1};
  EXPECT_EQ(
      PagedAttention({}, out.view(), query.view(), f16_k.view(), f16_k.view(), md, 1.0f).message,
      "PagedAttention: key_cache: the CPU backend takes f32 or bf16 caches, got f16 "
      "[5, 4, 2, 3] on cpu");
}

// bf16 caches on the CPU (a bf16 model's): each token's K and V land in their slot rounded to
// nearest even, every other slot keeps its bits; CopyBlocks and SwapBlocks move whole bf16
// blocks.
TEST(KvCacheDTypes, Bf16CachesOnTheCpuHoldTheRoundedValuesAndMoveWhole) {
  std::mt19937 rng(52);
  const std::vector<int64_t> slots = {3, -1, 17, 8};
  HostTensor key = Random({4, kKvHeads, kHeadSize}, rng);
  HostTensor value = Random({4, kKvHeads, kHeadSize}, rng);
  HostTensor k(DType::kBF16, {kBlocks, kBlockSize, kKvHeads, kHeadSize});
  HostTensor v(DType::kBF16, {kBlocks, kBlockSize, kKvHeads, kHeadSize});
  for (int64_t i = 0; i < k.numel(); ++i) {
    k.data<uint16_t>()[i] = static_cast<uint16_t>(rng());
    v.data<uint16_t>()[i] = static_cast<uint16_t>(rng());
  }
  std::vector<uint16_t> want_k(k.data<uint16_t>(), k.data<uint16_t>() + k.numel());
  std::vector<uint16_t> want_v(v.data<uint16_t>(), v.data<uint16_t>() + v.numel());
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    for (int64_t i = 0; i < kRow; ++i) {
      want_k[slots[t] * kRow + i] = FloatToBf16(key.data<float>()[t * kRow + i]);
      want_v[slots[t] * kRow + i] = FloatToBf16(value.data<float>()[t * kRow + i]);
    }
  }
  HostTensor slot_mapping = Indices(slots, DType::kI64);
  ASSERT_TRUE(
      ReshapeAndCache({}, key.view(), value.view(), k.view(), v.view(), slot_mapping.view()).ok());
  EXPECT_EQ(std::vector<uint16_t>(k.data<uint16_t>(), k.data<uint16_t>() + k.numel()), want_k);
  EXPECT_EQ(std::vector<uint16_t>(v.data<uint16_t>(), v.data<uint16_t>() + v.numel()), want_v);

  const int64_t block = kBlockSize * kRow;  // elements
  const std::vector<BlockPair> copy = {{4, 1}};
  const std::vector<TensorView> ks = {k.view()}, vs = {v.view()};
  ASSERT_TRUE(CopyBlocks({}, ks, vs, copy).ok());
  EXPECT_EQ(std::memcmp(k.data<uint16_t>() + 1 * block, k.data<uint16_t>() + 4 * block,
                        block * sizeof(uint16_t)),
            0);
  EXPECT_EQ(std::memcmp(v.data<uint16_t>() + 1 * block, v.data<uint16_t>() + 4 * block,
                        block * sizeof(uint16_t)),
            0);
  HostTensor host(DType::kBF16, {2, kBlockSize, kKvHeads, kHeadSize});
  const std::vector<BlockPair> out = {{2, 1}};
  ASSERT_TRUE(SwapBlocks({}, k.view(), host.view(), out).ok());
  EXPECT_EQ(std::memcmp(host.data<uint16_t>() + block, k.data<uint16_t>() + 2 * block,
                        block * sizeof(uint16_t)),
            0);
}

}  // namespace
}  // namespace llm::ops
