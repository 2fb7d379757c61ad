// SwapBlocks: blocks move between two caches of different sizes (a device pool and a smaller
// host pool), out and back in; out-of-range pairs are errors.
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "tests/unit/kernels/test_util.h"

namespace llm::ops {
namespace {

using testing::Poisoned;
using testing::Random;
using testing::ToVector;

constexpr int64_t kBlockSize = 16, kKvHeads = 2, kHeadSize = 4;
constexpr int64_t kBlockNumel = kBlockSize * kKvHeads * kHeadSize;

std::vector<float> Block(const HostTensor& t, int64_t b) {
  return std::vector<float>(t.data<float>() + b * kBlockNumel,
                            t.data<float>() + (b + 1) * kBlockNumel);
}

TEST(SwapBlocks, SwapsOutAndBackIn) {
  std::mt19937 rng(70);
  HostTensor device_cache = Random({8, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor host_cache = Poisoned({3, kBlockSize, kKvHeads, kHeadSize});
  const std::vector<float> original = ToVector(device_cache);
  const std::vector<BlockPair> out_pairs = {{7, 0}, {2, 2}, {4, 1}};
  ASSERT_TRUE(SwapBlocks({}, device_cache.view(), host_cache.view(), out_pairs).ok());
  for (const BlockPair& p : out_pairs) {
    EXPECT_EQ(Block(host_cache, p.dst), Block(device_cache, p.src)) << p.src << "->" << p.dst;
  }
  EXPECT_EQ(ToVector(device_cache), original) << "the source changed";
  // Back in, to other device blocks.
  const std::vector<BlockPair> in_pairs = {{0, 5}, {1, 6}, {2, 0}};
  ASSERT_TRUE(SwapBlocks({}, host_cache.view(), device_cache.view(), in_pairs).ok());
  std::vector<float> want = original;
  for (auto [from, to] : {std::pair<int64_t, int64_t>{7, 5}, {4, 6}, {2, 0}}) {
    for (int64_t i = 0; i < kBlockNumel; ++i) {
      want[to * kBlockNumel + i] = original[from * kBlockNumel + i];
    }
  }
  EXPECT_EQ(ToVector(device_cache), want);
}

TEST(SwapBlocks, ErrorsNameTheArgument) {
  std::mt19937 rng(71);
  HostTensor src = Random({8, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor dst = Random({3, kBlockSize, kKvHeads, kHeadSize}, rng);
  const std::vector<BlockPair> bad_dst = {{0, 3}};
  EXPECT_EQ(SwapBlocks({}, src.view(), dst.view(), bad_dst).message,
            "SwapBlocks: pairs[0].dst = 3 is outside [0, 3)");
  const std::vector<BlockPair> bad_src = {{0, 0}, {8, 1}};
  EXPECT_EQ(SwapBlocks({}, src.view(), dst.view(), bad_src).message,
            "SwapBlocks: pairs[1].src = 8 is outside [0, 8)");
  HostTensor other = Random({3, kBlockSize, kKvHeads, kHeadSize + 1}, rng);
  EXPECT_EQ(SwapBlocks({}, src.view(), other.view(), bad_dst).message,
            "SwapBlocks: dst[0]: expected f32 [?, 16, 2, 4], got f32 [3, 16, 2, 5] on cpu");
#ifndef LLM_WITH_CUDA  // with the CUDA backend, tests/gpu/swap_blocks_test covers cuda tensors
  TensorView cuda_dst = dst.view();
  cuda_dst.device = TensorDevice::Cuda(1);
  EXPECT_EQ(SwapBlocks({}, src.view(), cuda_dst, {}).message,
            "SwapBlocks: no backend for tensors on cuda:1 in this build (built without the CUDA "
            "backend: no nvcc, or LLM_CUDA=OFF)");
#endif
}

// All caches at once: every src[i] -> dst[i] with the same pairs, the sources untouched.
TEST(SwapBlocks, EveryCacheOfTheSpans) {
  std::mt19937 rng(72);
  constexpr int kCaches = 6;  // 3 layers' K and V
  std::vector<HostTensor> device, host;
  std::vector<TensorView> dv, hv;
  for (int i = 0; i < kCaches; ++i) {
    device.push_back(Random({8, kBlockSize, kKvHeads, kHeadSize}, rng));
    host.push_back(Poisoned({4, kBlockSize, kKvHeads, kHeadSize}));
    dv.push_back(device.back().view());
    hv.push_back(host.back().view());
  }
  const std::vector<BlockPair> pairs = {{5, 0}, {6, 1}, {2, 3}};
  ASSERT_TRUE(SwapBlocks({}, dv, hv, pairs).ok());
  for (int i = 0; i < kCaches; ++i) {
    for (const BlockPair& p : pairs) {
      EXPECT_EQ(Block(host[i], p.dst), Block(device[i], p.src)) << i << ": " << p.src;
    }
  }
}

TEST(SwapBlocks, SpansAreChecked) {
  std::mt19937 rng(73);
  HostTensor a = Random({8, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor b = Random({8, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor small = Random({3, kBlockSize, kKvHeads, kHeadSize}, rng);
  HostTensor small2 = Random({4, kBlockSize, kKvHeads, kHeadSize}, rng);
  const std::vector<TensorView> two = {a.view(), b.view()}, one = {small.view()};
  EXPECT_EQ(SwapBlocks({}, two, one, {}).message, "SwapBlocks: src has 2 caches but dst has 1");
  const std::vector<TensorView> mixed = {small.view(), small2.view()};
  EXPECT_EQ(SwapBlocks({}, two, mixed, {}).message,
            "SwapBlocks: dst[1]: expected f32 [3, 16, 2, 4], got f32 [4, 16, 2, 4] on cpu");
  EXPECT_TRUE(
      SwapBlocks({}, std::span<const TensorView>(), std::span<const TensorView>(), {}).ok());
}

}  // namespace
}  // namespace llm::ops
