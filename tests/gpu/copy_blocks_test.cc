// CopyBlocks on CUDA against the CPU op, two layers: bit-equal caches.
#include <random>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace llm::ops {
namespace {

using gpu_testing::BitEqual;
using gpu_testing::CudaTest;
using gpu_testing::DeviceTensor;
using gpu_testing::Random;
using gpu_testing::RoundedThroughHalf;
using gpu_testing::ToHalf;

class CudaCopyBlocks : public CudaTest {};

TEST_F(CudaCopyBlocks, MatchesCpuOnEveryLayer) {
  std::mt19937 rng(701);
  constexpr int kLayers = 2;
  for (const int64_t block_size : {16, 32}) {
    std::vector<HostTensor> host;
    std::vector<DeviceTensor> device;
    for (int i = 0; i < 2 * kLayers; ++i) {  // key 0, value 0, key 1, value 1
      host.push_back(Random({9, block_size, 8, 128}, rng));
      device.emplace_back(host.back());
    }
    std::vector<TensorView> hk, hv, dk, dv;
    for (int l = 0; l < kLayers; ++l) {
      hk.push_back(host[2 * l].view());
      hv.push_back(host[2 * l + 1].view());
      dk.push_back(device[2 * l].view());
      dv.push_back(device[2 * l + 1].view());
    }
    const std::vector<BlockPair> pairs = {{0, 8}, {3, 1}, {5, 5}, {8, 2}};
    ASSERT_TRUE(CopyBlocks({}, hk, hv, pairs).ok());
    const OpStatus s = CopyBlocks({}, dk, dv, pairs);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(Sync(), "");
    for (int i = 0; i < 2 * kLayers; ++i) EXPECT_TRUE(BitEqual(device[i].Download(), host[i])) << i;
  }
}

// f16 / bf16 caches copy whole blocks too: the CPU op on the f32 values, converted, is the
// reference.
TEST_F(CudaCopyBlocks, HalfCachesMatchCpu) {
  std::mt19937 rng(703);
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    HostTensor k = RoundedThroughHalf(Random({7, 16, 8, 64}, rng), dtype);
    HostTensor v = RoundedThroughHalf(Random({7, 16, 8, 64}, rng), dtype);
    DeviceTensor dk(ToHalf(k, dtype)), dv(ToHalf(v, dtype));
    const std::vector<BlockPair> pairs = {{6, 0}, {1, 3}};
    const std::vector<TensorView> hks = {k.view()}, hvs = {v.view()};
    const std::vector<TensorView> dks = {dk.view()}, dvs = {dv.view()};
    ASSERT_TRUE(CopyBlocks({}, hks, hvs, pairs).ok());
    const OpStatus s = CopyBlocks({}, dks, dvs, pairs);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(Sync(), "");
    EXPECT_TRUE(BitEqual(dk.Download(), ToHalf(k, dtype))) << DTypeName(dtype);
    EXPECT_TRUE(BitEqual(dv.Download(), ToHalf(v, dtype))) << DTypeName(dtype);
  }
}

TEST_F(CudaCopyBlocks, BlockOutsideTheCacheIsAnError) {
  std::mt19937 rng(702);
  DeviceTensor k(Random({4, 16, 1, 64}, rng)), v(Random({4, 16, 1, 64}, rng));
  const std::vector<TensorView> ks = {k.view()}, vs = {v.view()};
  const std::vector<BlockPair> pairs = {{0, 1}, {2, 4}};
  EXPECT_EQ(CopyBlocks({}, ks, vs, pairs).message,
            "CopyBlocks: pairs[1] = (2, 4) is outside [0, 4)");
}

}  // namespace
}  // namespace llm::ops
