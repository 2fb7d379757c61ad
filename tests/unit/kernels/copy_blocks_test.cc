// CopyBlocks: every layer's destination blocks become copies of their sources, nothing else
// changes; bad pairs and mismatched layers are errors.
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops {
namespace {

using testing::Random;
using testing::ToVector;

constexpr int64_t kBlocks = 6, kBlockSize = 4, kKvHeads = 2, kHeadSize = 8;
constexpr int64_t kBlockNumel = kBlockSize * kKvHeads * kHeadSize;

TEST(CopyBlocks, CopiesEachPairInEveryLayer) {
  std::mt19937 rng(60);
  constexpr int kLayers = 3;
  std::vector<HostTensor> keys, values;
  std::vector<TensorView> key_views, value_views;
  for (int l = 0; l < kLayers; ++l) {
    keys.push_back(Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng));
    values.push_back(Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng));
    key_views.push_back(keys.back().view());
    value_views.push_back(values.back().view());
  }
  const std::vector<BlockPair> pairs = {{0, 3}, {5, 1}, {2, 2}};
  std::vector<std::vector<float>> want;
  for (int l = 0; l < kLayers; ++l) {
    for (const HostTensor* t : {&keys[l], &values[l]}) {
      std::vector<float> w = ToVector(*t);
      for (const BlockPair& p : pairs) {
        for (int64_t i = 0; i < kBlockNumel; ++i) {
          w[p.dst * kBlockNumel + i] = t->data<float>()[p.src * kBlockNumel + i];
        }
      }
      want.push_back(w);
    }
  }
  ASSERT_TRUE(CopyBlocks({}, key_views, value_views, pairs).ok());
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(ToVector(keys[l]), want[2 * l]) << "layer " << l;
    EXPECT_EQ(ToVector(values[l]), want[2 * l + 1]) << "layer " << l;
  }
}

TEST(CopyBlocks, ErrorsNameTheArgument) {
  std::mt19937 rng(61);
  HostTensor k0 = Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor v0 = Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor k1 = Random({kBlocks, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor v1 = Random({kBlocks + 1, kBlockSize, kKvHeads, kHeadSize}, rng);
  const std::vector<TensorView> ks = {k0.view(), k1.view()}, vs = {v0.view(), v1.view()};
  const std::vector<BlockPair> ok_pairs = {{0, 1}};
  EXPECT_EQ(CopyBlocks({}, ks, vs, ok_pairs).message,
            "CopyBlocks: value_caches[1]: expected f32 [6, 4, 2, 8], got f32 [7, 4, 2, 8] on cpu");
  const std::vector<TensorView> one_k = {k0.view()}, one_v = {v0.view()};
  const std::vector<BlockPair> bad_pairs = {{0, 1}, {2, 6}};
  const std::vector<float> before = ToVector(k0);
  EXPECT_EQ(CopyBlocks({}, one_k, one_v, bad_pairs).message,
            "CopyBlocks: pairs[1] = (2, 6) is outside [0, 6)");
  EXPECT_EQ(ToVector(k0), before);
  EXPECT_EQ(CopyBlocks({}, ks, one_v, ok_pairs).message,
            "CopyBlocks: key_caches has 2 layers but value_caches has 1");
}

}  // namespace
}  // namespace llm::ops
